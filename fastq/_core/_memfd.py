"""Anonymous shared files and the memory they take: a nameless memfd sized
only where the memory is there (MemAvailable, capped by the cgroup's
headroom), its pages reserved so that a shortage is an error rather than a
writer's SIGBUS, and its descriptor handed to workers (`SharedFd`).

The ring's region (fastq/_core/_shm.py) and the workers' shared arrays
(fastq/_workers/_shared_arrays.py) are both made of such files."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from multiprocessing import reduction
from typing import Any

from ..errors import SharedMemoryError


def meminfo() -> dict[str, int]:
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


def available_memory() -> int | None:
    """Bytes that can still be allocated: MemAvailable, capped by the
    cgroup's memory limit; None where neither can be read."""
    candidates = []
    available = meminfo().get("MemAvailable")
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


def reserve(
    fd: int, size: int, name: str, start: int = 0, length: int | None = None
) -> None:
    """Allocates the file's pages from `start` (`length` bytes, to its end
    if None) now: a tmpfs page that cannot be allocated later would kill
    the writer with SIGBUS instead of an error."""
    if not hasattr(os, "posix_fallocate"):
        return
    length = size - start if length is None else min(length, size - start)
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        raise SharedMemoryError(
            not_enough_memory(size, available_memory(), exc, what=name)
        ) from exc


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
