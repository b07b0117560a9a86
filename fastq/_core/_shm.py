"""The ring's shared region: an anonymous memfd, sized, reserved and mapped.

No name ever exists (memfd on Linux, an unlinked temporary file elsewhere), so
nothing can leak even when every process is killed with SIGKILL.

Large regions are backed by huge pages where the system offers them, so that
a batch's copy does not stop at every 4 KiB page boundary (a TLB miss, and
the hardware prefetchers stop there): hugetlb pages when enough are free
(``MFD_HUGETLB``), else transparent huge pages for shared memory: at once
where ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` says ``always``,
asked for with ``MADV_HUGEPAGE`` where it says ``advise`` or
``within_size``, and made from the allocated pages with ``MADV_COLLAPSE``
(Linux 6.1 and later) where it says ``never``, the default of most
systems. Every process maps a large region at an address aligned to a huge
page (`AlignedMapping`), which the kernel needs to map a huge page whole.
Nothing is an error where a feature is missing: ordinary pages then. The
region says which it got (``Region.pages``, in ``Prefetcher.stats()``).

NOTE [ The ring is handed over before it is settled ]

A region's memory is reserved before it is handed over: every page of the
file is allocated (fallocate; hugetlb pages at mmap), so a shortage is a
SharedMemoryError naming the bytes needed and available, and no writer
ever dies of SIGBUS. What is not needed for that is left for later: making
the pages huge (MADV_COLLAPSE) and mapping them into the page tables
(MADV_POPULATE_WRITE) cost a large ring a second or more on a busy machine,
longer than a batch. A thread does both, in steps of `_SETTLE_STEP`, after
the ring is handed over (`Region.settled` is set when it is done); until
then a process touching a page first faults it in. Each worker maps the
region without populating it and settles its own mapping the same way, on
a thread of its own, so that its mapping is huge where the file is.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import tempfile
import threading
from multiprocessing import reduction
from typing import Any

from ..errors import SharedMemoryError
from ._mapping import AlignedMapping

PAGE_SIZE = mmap.PAGESIZE
# MAP_POPULATE pre-faults the whole mapping in each process at mmap time, so
# no batch pays a page fault (Linux only; elsewhere pages fault in lazily).
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
_THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
# Linux's madvise(2) values, where this Python's mmap module lacks them.
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_MADV_COLLAPSE = getattr(mmap, "MADV_COLLAPSE", 25)
_MFD_HUGETLB = getattr(os, "MFD_HUGETLB", 4)
# FASTQ_HUGE_PAGES=0 keeps rings in base pages (to compare, or where the
# kernel's compaction for huge pages stalls construction).
_HUGE_PAGES = os.environ.get("FASTQ_HUGE_PAGES", "1") != "0"
# What backs a region (Region.pages).
PAGES_HUGETLB = "hugetlb"
PAGES_THP = "transparent huge pages"
PAGES_BASE = "base pages"
# A settling thread collapses and populates this much at a time, so that a
# closed region stops it soon.
_SETTLE_STEP = 64 << 20
# A worker settles its mapping again while part of it is still in base
# pages (the creator has not collapsed them yet): this many times, this
# many seconds apart.
_RESETTLE_TRIES = 5
_RESETTLE_WAIT_S = 0.5


def huge_page_size() -> int:
    """The system's default huge page size (2 MiB on x86-64)."""
    return _meminfo().get("Hugepagesize", 2048) * 1024


def _meminfo() -> dict[str, int]:
    """/proc/meminfo's numbers (kB, or counts), by name; {} if unreadable."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                with contextlib.suppress(ValueError, IndexError):
                    out[name] = int(rest.split()[0])
    except OSError:
        pass
    return out


def shmem_thp_mode() -> str:
    """The selected word of shmem_enabled (always, within_size, advise,
    never, deny, force); "never" where it cannot be read."""
    try:
        with open(_THP_SHMEM) as f:
            text = f.read()
    except OSError:
        return "never"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "never"


def available_memory() -> int | None:
    """Bytes that can still be allocated: MemAvailable, capped by the
    cgroup's memory limit; None where neither can be read."""
    candidates = []
    available = _meminfo().get("MemAvailable")
    if available is not None:
        candidates.append(available * 1024)
    limit = _cgroup_headroom()
    if limit is not None:
        candidates.append(limit)
    return min(candidates) if candidates else None


def _cgroup_headroom() -> int | None:
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_file) as f:
                raw = f.read().strip()
            if raw == "max":
                return None
            with open(usage_file) as f:
                usage = int(f.read().strip())
            limit = int(raw)
        except (OSError, ValueError):
            continue
        # cgroup v1 reports "no limit" as a huge number.
        if limit >= 1 << 60:
            return None
        return max(0, limit - usage)
    return None


def anonymous_file(name: str, flags: int = 0) -> int:
    """A descriptor of a nameless file in memory, to share with workers
    (``flags``: more memfd_create flags, MFD_HUGETLB)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create(name, os.MFD_CLOEXEC | flags)
    # Fallback where memfd does not exist: a file that is unlinked before it
    # is ever used, so it has no name to leak; workers get its descriptor.
    f = tempfile.TemporaryFile(prefix=f"{name}-")  # noqa: SIM115 (closed below)
    fd = os.dup(f.fileno())
    f.close()
    return fd


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def sized_memfd(name: str, size: int) -> int:
    """anonymous_file of `size` bytes (its pages not yet allocated), or
    SharedMemoryError if that much memory is not available."""
    available = available_memory()
    if available is not None and size > available:
        raise SharedMemoryError(not_enough_memory(size, available, what=name))
    fd = anonymous_file(name)
    try:
        os.ftruncate(fd, size)
    except OSError as exc:  # a limit on file sizes, say (RLIMIT_FSIZE)
        os.close(fd)
        raise SharedMemoryError(
            not_enough_memory(size, available, exc, what=name)
        ) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


class SharedFd:
    """A descriptor that crosses process creation: inherited under fork,
    passed by the start method's own descriptor passing under spawn and
    forkserver (multiprocessing.reduction.DupFd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_shared_fd, (reduction.DupFd(self.fd),))


def _rebuild_shared_fd(dup: Any) -> SharedFd:
    return SharedFd(dup.detach())


class Region:
    """One shared mapping of `size` bytes, created here or attached to;
    `pages` says what backs it."""

    def __init__(
        self, fd: int, size: int, mapping: Any, pages: str = PAGES_BASE
    ) -> None:
        self.fd = fd
        self.size = size
        self.mapping = mapping
        self.pages = pages
        self._pid = os.getpid()
        self._huge_bytes: int | None = None
        # Set once its pages are collapsed and mapped here (NOTE [ The
        # ring is handed over before it is settled ]).
        self.settled = threading.Event()
        self.settled.set()
        self._closing = threading.Event()

    def huge_bytes(self) -> int:
        """Bytes of it this process maps with huge pages. Read once settled
        (/proc/self/smaps costs milliseconds in a large process), afresh
        until then."""
        if not self.settled.is_set():
            return huge_bytes_mapped(self.mapping)
        if self._huge_bytes is None:
            self._huge_bytes = huge_bytes_mapped(self.mapping)
        return self._huge_bytes

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Waits until the region's pages are collapsed and mapped here;
        False if `timeout` passed first."""
        return self.settled.wait(timeout)

    def _settle(self, collapse: bool, until_huge: bool = False) -> Region:
        """Collapses (with `collapse`) and populates the mapping on a
        thread; with `until_huge`, again while part of it maps in base
        pages and part in huge ones (a worker's mapping, before the
        creator's collapse has reached it)."""
        if not isinstance(self.mapping, AlignedMapping):
            return self
        self.settled.clear()
        thread = threading.Thread(
            target=self._settle_pages,
            args=(collapse, until_huge),
            name="fastq-settle",
            daemon=True,
        )
        thread.start()
        return self

    def _settle_pages(self, collapse: bool, until_huge: bool) -> None:
        try:
            for attempt in range(_RESETTLE_TRIES if until_huge else 1):
                if attempt and self._closing.wait(_RESETTLE_WAIT_S):
                    return
                for start in range(0, self.size, _SETTLE_STEP):
                    if self._closing.is_set():
                        return
                    length = min(_SETTLE_STEP, self.size - start)
                    if collapse:
                        with contextlib.suppress(OSError):
                            self.mapping.madvise(_MADV_COLLAPSE, start, length)
                    with contextlib.suppress(OSError):  # before Linux 5.14: on use
                        self.mapping.madvise(_MADV_POPULATE_WRITE, start, length)
                huge = huge_bytes_mapped(self.mapping)
                if collapse and self.pages == PAGES_THP and not huge:
                    self.pages = PAGES_BASE  # the kernel could collapse none
                if not collapse or huge in (0, self.size):
                    break
        finally:
            self.settled.set()

    @classmethod
    def create(
        cls, size: int, name: str = "fastq-ring", huge: bool | None = None
    ) -> Region:
        """Allocates and pre-faults at least `size` bytes (with ``huge``, in
        huge pages where the system has them: the size is then rounded up
        to whole huge pages) or raises SharedMemoryError naming the bytes
        needed and available. ``huge`` defaults to FASTQ_HUGE_PAGES (on)."""
        if huge is None:
            huge = _HUGE_PAGES
        if huge and sys.platform == "linux":
            step = huge_page_size()
            if size >= step:
                whole = -(-size // step) * step
                region = cls._create_hugetlb(whole, name)
                mode = shmem_thp_mode()
                if region is None and mode in ("always", "force"):
                    region = cls._create_base(whole, name)
                    region.pages = PAGES_THP
                elif region is None and mode in ("advise", "within_size"):
                    region = cls._create_advised(whole, name)
                elif region is None and mode != "deny":
                    region = cls._create_collapsed(whole, name)
                if region is not None:
                    return region
        return cls._create_base(size, name)

    @classmethod
    def _create_hugetlb(cls, size: int, name: str) -> Region | None:
        """In hugetlb pages, when enough are free (the reservation happens at
        mmap, so a shortage is an error here, never a SIGBUS later); None
        where they cannot be had."""
        free = _meminfo().get("HugePages_Free", 0) * huge_page_size()
        if free < size or not hasattr(os, "memfd_create"):
            return None
        try:
            fd = anonymous_file(name, _MFD_HUGETLB)
        except OSError:
            return None
        try:
            os.ftruncate(fd, size)
            mapping = _map(fd, size, populate=False)
        except (OSError, ValueError):
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mapping, PAGES_HUGETLB)._settle(collapse=False)

    @classmethod
    def _create_advised(cls, size: int, name: str) -> Region:
        """In transparent huge pages asked for with MADV_HUGEPAGE: the
        mapping is advised before any page exists, then every page is
        allocated through it (MADV_POPULATE_WRITE reports a shortage as an
        error). Where populating that way is not supported, the pages are
        reserved as ordinary ones are."""
        fd = sized_memfd(name, size)
        try:
            mapping = _map(fd, size, populate=False)
            pages = PAGES_THP
            try:
                mapping.madvise(_MADV_HUGEPAGE)
                mapping.madvise(_MADV_POPULATE_WRITE)
            except OSError as exc:
                if exc.errno == errno.ENOMEM:
                    mapping.close()
                    raise SharedMemoryError(
                        not_enough_memory(size, available_memory(), exc, what=name)
                    ) from exc
                pages = PAGES_BASE
                _reserve(fd, size, name)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mapping, pages)

    @classmethod
    def _create_collapsed(cls, size: int, name: str) -> Region:
        """In ordinary pages, reserved at once, then made huge where the
        kernel can, after the region is handed over (MADV_COLLAPSE works
        whatever shmem_enabled says, but deny): the file's pages become
        huge pages, which every aligned mapping of it then maps whole. A
        kernel without it, or no free huge page (memory too fragmented),
        leaves ordinary pages, or some of each; `pages` says base pages
        once settled if none could be made huge."""
        fd = sized_memfd(name, size)
        try:
            _reserve(fd, size, name)
            mapping = _map(fd, size, populate=False)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mapping, PAGES_THP)._settle(collapse=True, until_huge=True)

    @classmethod
    def _create_base(cls, size: int, name: str) -> Region:
        fd = sized_memfd(name, size)
        try:
            _reserve(fd, size, name)
            mapping = _map(fd, size, populate=not _settles(size))
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mapping)._settle(collapse=False)

    @classmethod
    def attach(cls, shared: SharedFd, size: int) -> Region:
        """Maps a region created in another process (in a worker). Its
        pages are reserved, huge where the creator made them huge; an
        aligned mapping maps those whole here too, settled on a thread
        (NOTE [ The ring is handed over before it is settled ])."""
        fd = shared.fd
        try:
            mapping = _map(fd, size, populate=not _settles(size))
        finally:
            # The mapping keeps the memory; the descriptor is not needed.
            os.close(fd)
        collapse = _HUGE_PAGES and shmem_thp_mode() != "deny"
        return cls(-1, size, mapping)._settle(collapse, until_huge=collapse)

    def share(self) -> SharedFd:
        return SharedFd(self.fd)

    def close(self) -> None:
        """Stops settling (within one step) and closes the descriptor. The
        mapping lives on while anything still references it (batches
        handed out), and goes with its last user."""
        self._closing.set()
        self.settled.wait()
        if self.fd >= 0 and os.getpid() == self._pid:
            os.close(self.fd)
        self.fd = -1


def _settles(size: int) -> bool:
    """Whether a region of `size` bytes is mapped as AlignedMapping, and so
    populated by a settling thread rather than at mmap."""
    step = huge_page_size()
    return sys.platform == "linux" and size >= step and size % step == 0


def _map(fd: int, size: int, populate: bool = True) -> Any:
    """A shared mapping of the file's first `size` bytes, pre-faulted with
    `populate`: at an address aligned to a huge page where the region is
    whole huge pages (Linux), else wherever Python's mmap puts it."""
    step = huge_page_size()
    if sys.platform == "linux" and size >= step and size % step == 0:
        return AlignedMapping(fd, size, step, populate)
    flags = _MAP_FLAGS if populate else mmap.MAP_SHARED
    return mmap.mmap(fd, size, flags=flags)


def _reserve(fd: int, size: int, name: str) -> None:
    """Allocates every page of the file now: a tmpfs page that cannot be
    allocated later would kill the writer with SIGBUS instead of an error."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        raise SharedMemoryError(
            not_enough_memory(size, available_memory(), exc, what=name)
        ) from exc


def huge_bytes_mapped(mapping: Any) -> int:
    """Bytes of `mapping` this process maps with huge pages (PMD-mapped
    shared-memory THP, or hugetlb), from /proc/self/smaps; 0 if unknown."""
    import ctypes

    try:
        view = ctypes.c_char.from_buffer(mapping)
    except (TypeError, ValueError):
        return 0
    start = ctypes.addressof(view)
    del view  # the mapping can be closed again
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    # Only this mapping's block is parsed: a process with torch (and more
    # with CUDA) has thousands of smaps lines, read at every ring's creation.
    header = f"{start:x}-"
    at = 0 if text.startswith(header) else text.find("\n" + header) + 1
    if at == 0 and not text.startswith(header):
        return 0
    # A block ends with its VmFlags line (Linux 3.8 on), or the next header.
    end = text.find("\nVmFlags:", at)
    total = 0
    for line in text[at : len(text) if end < 0 else end].splitlines()[1:]:
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            break  # the next mapping's header
        if line.startswith(
            ("ShmemPmdMapped:", "FilePmdMapped:", "Shared_Hugetlb:", "Private_Hugetlb:")
        ):
            total += int(line.split()[1]) * 1024
    return total


def not_enough_memory(
    size: int,
    available: int | None,
    exc: OSError | None = None,
    what: str = "fastq-ring",
) -> str:
    need = f"{_format_bytes(size)} ({size} bytes) of shared memory"
    if exc is not None and exc.errno == errno.EFBIG:
        return (
            f"no room for {what}: it needs {need}, more than this process's "
            "file-size limit allows (File too large; shared memory is a file "
            "to the kernel). Raise the limit (ulimit -f) or use less."
        )
    have = "unknown" if available is None else _format_bytes(available)
    why = f" ({exc.strerror})" if exc is not None else ""
    fix = (
        "Lower slots= or batch_size=, or free memory."
        if what == "fastq-ring"
        else "Free memory, or keep the data in a file the workers open."
    )
    return (
        f"not enough memory for {what}: it needs {need} and {have} is "
        f"available{why}. {fix}"
    )
