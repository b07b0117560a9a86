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

A large region is handed over before its pages exist: reserving them
(fallocate), making them huge (MADV_COLLAPSE) and mapping them into the
page tables (MADV_POPULATE_WRITE) cost a ring of hundreds of megabytes a
second or more on a busy machine, longer than a batch, and DataLoader's
first batch pays none of it. A thread does all three, in steps of
`_SETTLE_STEP`, while the workers make their first batches
(`Region.settled` is set when it is done); until then a process touching a
page first allocates it.

A shortage must still be an error, never a writer killed by SIGBUS.
Before anything is made, the constructor compares the bytes needed with
the memory available (MemAvailable, capped by the cgroup's headroom:
`sized_memfd`), and raises SharedMemoryError where they do not fit. What
that cannot see, memory taken by another process in the moment between,
the settling thread finds as a failed fallocate: the region keeps it as
`failure` and hands it to `on_failure`'s callback, which ends the run at
its next batch with that SharedMemoryError (a worker that faulted on a
page that could not be had is reported as the same shortage). Small
regions, and hugetlb pages (reserved at mmap), are reserved at once.

Each worker maps the region without populating it and settles its own
mapping the same way, on a thread of its own, so that its mapping is huge
where the file is.

NOTE [ A region closed at interpreter exit ]

A loader the script never closed is closed by its finalizer, which can run
after the interpreter has begun to exit: daemon threads, the settling one
among them, never run again then. `Region.close` waits for the settling
thread (it stops within a step) except then, and the thread works on a
descriptor and a mapping reference of its own, so closing the region's
descriptor under it harms nothing.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import SharedMemoryError
from ._mapping import AlignedMapping
from ._memfd import (
    SharedFd,
    anonymous_file,
    available_memory,
    meminfo,
    not_enough_memory,
    reserve,
    sized_memfd,
)

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
    return meminfo().get("Hugepagesize", 2048) * 1024


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
        # A reservation the settling thread could not make, and who is told.
        self.failure: SharedMemoryError | None = None
        self._failure_lock = threading.Lock()
        self._on_failure: Callable[[SharedMemoryError], None] | None = None

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

    def on_failure(self, callback: Callable[[SharedMemoryError], None]) -> None:
        """Calls `callback` with the reservation's failure once the settling
        thread finds one; at once if it already has."""
        with self._failure_lock:
            self._on_failure = callback
            failure = self.failure
        if failure is not None:
            callback(failure)

    def _settle(
        self,
        collapse: bool,
        until_huge: bool = False,
        reserve_as: str | None = None,
        through_mapping: bool = False,
    ) -> Region:
        """Reserves the file's pages (with `reserve_as`, the name a
        shortage reports; `through_mapping`: by populating the advised
        mapping, so that they are made huge), collapses them (with
        `collapse`) and populates the mapping, on a thread; with
        `until_huge`, again while part of it maps in base pages and part
        in huge ones (a worker's mapping, before the creator's collapse has
        reached it)."""
        if not isinstance(self.mapping, AlignedMapping):
            return self
        self.settled.clear()
        # The thread reserves through a descriptor of its own: close() need
        # not wait for it to close the region's (NOTE [ A region closed at
        # interpreter exit ]).
        fd = os.dup(self.fd) if reserve_as is not None else -1
        thread = threading.Thread(
            target=self._settle_pages,
            args=(fd, collapse, until_huge, reserve_as, through_mapping),
            name="fastq-settle",
            daemon=True,
        )
        thread.start()
        return self

    def _reserve_pages(self, fd: int, name: str, through_mapping: bool) -> bool:
        """Allocates every page of the file, a step at a time (a closed
        region stops it soon); False, with `failure` kept and reported, if
        the memory is not there."""
        for start in range(0, self.size, _SETTLE_STEP):
            if self._closing.is_set():
                return False
            length = min(_SETTLE_STEP, self.size - start)
            try:
                if through_mapping:
                    through_mapping = self._populate_step(name, start, length)
                if not through_mapping:
                    reserve(fd, self.size, name, start, length)
            except SharedMemoryError as failure:
                with self._failure_lock:
                    self.failure = failure
                    callback = self._on_failure
                if callback is not None:
                    callback(failure)
                return False
        return True

    def _populate_step(self, name: str, start: int, length: int) -> bool:
        """Allocates a step's pages through the mapping; False where the
        kernel cannot (before Linux 5.14): the file is reserved instead, in
        base pages."""
        try:
            self.mapping.madvise(_MADV_POPULATE_WRITE, start, length)
        except OSError as exc:
            if exc.errno == errno.ENOMEM:
                raise SharedMemoryError(
                    not_enough_memory(self.size, available_memory(), exc, what=name)
                ) from exc
            self.pages = PAGES_BASE
            return False
        return True

    def _settle_pages(
        self,
        fd: int,
        collapse: bool,
        until_huge: bool,
        reserve_as: str | None,
        through_mapping: bool,
    ) -> None:
        try:
            if reserve_as is not None and not self._reserve_pages(
                fd, reserve_as, through_mapping
            ):
                return
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
            if fd >= 0:
                os.close(fd)
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
        free = meminfo().get("HugePages_Free", 0) * huge_page_size()
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
        allocated through it by the settling thread (MADV_POPULATE_WRITE
        reports a shortage as an error). Where populating that way is not
        supported, the pages are reserved as ordinary ones are."""
        fd = sized_memfd(name, size)
        try:
            mapping = _map(fd, size, populate=False)
        except BaseException:
            os.close(fd)
            raise
        region = cls(fd, size, mapping, PAGES_THP)
        try:
            mapping.madvise(_MADV_HUGEPAGE)
        except OSError:
            region.pages = PAGES_BASE
        advised = region.pages == PAGES_THP
        # A page a worker wrote before the thread reached it may be a base
        # page: collapsed after, as where shmem_enabled says never.
        return region._settle(
            collapse=advised,
            until_huge=advised,
            reserve_as=name,
            through_mapping=advised,
        )

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
            mapping = _map(fd, size, populate=False)
        except BaseException:
            os.close(fd)
            raise
        region = cls(fd, size, mapping, PAGES_THP)
        return region._settle(collapse=True, until_huge=True, reserve_as=name)

    @classmethod
    def _create_base(cls, size: int, name: str) -> Region:
        fd = sized_memfd(name, size)
        settles = _settles(size)
        try:
            if not settles:
                reserve(fd, size, name)
            mapping = _map(fd, size, populate=not settles)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size, mapping)._settle(
            collapse=False, reserve_as=name if settles else None
        )

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
        mode = shmem_thp_mode()
        if _HUGE_PAGES and mode in ("advise", "within_size"):
            # Pages this worker writes before the creator's thread has
            # allocated them are then huge ones too.
            with contextlib.suppress(OSError):
                mapping.madvise(_MADV_HUGEPAGE)
        collapse = _HUGE_PAGES and mode != "deny"
        return cls(-1, size, mapping)._settle(collapse, until_huge=collapse)

    def share(self) -> SharedFd:
        return SharedFd(self.fd)

    def close(self) -> None:
        """Stops settling (within one step) and closes the descriptor. The
        mapping lives on while anything still references it (batches
        handed out), and goes with its last user."""
        self._closing.set()
        # NOTE [ A region closed at interpreter exit ]
        if not sys.is_finalizing():
            self.settled.wait()
        if self.fd >= 0 and os.getpid() == self._pid:
            os.close(self.fd)
        self.fd = -1
        with self._failure_lock:
            # Nothing left to tell, and no reference back to the owner: a
            # closed owner is freed without waiting for a collector pass.
            self._on_failure = None


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
