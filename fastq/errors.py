"""Every exception fastq raises; each also inherits the matching builtin."""

from __future__ import annotations


class FastqError(Exception):
    """Base of every fastq exception."""


class ConfigError(FastqError, ValueError):
    """A Prefetcher argument is invalid; the message names it and the fix."""


class EmptySource(ConfigError):
    """No worker's source yielded an item, so the spec cannot be inferred.

    A DataLoader over an empty iterable dataset catches it and has no
    batches; elsewhere it is a ConfigError whose fix is ``spec=``.
    """


class SpecError(FastqError, ValueError):
    """A sample or batch does not match the batch spec (field, expected, got)."""


class WorkerError(FastqError, RuntimeError):
    """User code raised in a worker; carries the remote traceback text."""

    def __init__(
        self,
        message: str,
        *,
        worker: int = -1,
        task: int = -1,
        sample: int | None = None,
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.task = task
        self.sample = sample
        self.remote_traceback = remote_traceback


class WorkerDied(FastqError, RuntimeError):
    """A worker process exited unexpectedly (killed, crashed, exited)."""

    def __init__(
        self,
        message: str,
        *,
        worker: int = -1,
        pid: int = -1,
        exitcode: int | None = None,
        task: int | None = None,
        claiming: bool = False,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.exitcode = exitcode
        self.task = task
        # Died between claiming a batch and recording it: the consumer,
        # which knows what it waits for, names the batch.
        self.claiming = claiming


class FetchTimeout(FastqError, TimeoutError):
    """A batch did not arrive within the Prefetcher's timeout."""

    def __init__(
        self, message: str, *, worker: int | None = None, task: int = -1
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.task = task


class SlotsExhausted(FastqError, RuntimeError):
    """The consumer holds every slot, so no batch can ever arrive."""


class SharedMemoryError(FastqError, MemoryError):
    """The ring's shared memory cannot be allocated."""


class RingError(FastqError, RuntimeError):
    """The shared ring is inconsistent (a broken protocol or region)."""


class PrefetcherClosed(FastqError, RuntimeError):
    """The Prefetcher was used after close()."""


class ImageError(FastqError, OSError):
    """An image file cannot be read: it is no image, or it is truncated or
    corrupt. The message names its path and dataset index where known (an
    OSError, as Pillow's own errors for such files are)."""

    def __init__(
        self, message: str, *, path: str | None = None, index: int | None = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.index = index


class CopiedDataWarning(RuntimeWarning):
    """The source holds a large list or dict of Python objects that every
    worker copies; the message names it and the line that shares it."""
