"""fastq: feed a training loop from worker processes through a lock-free
ring of preallocated shared-memory batch slots."""

from ._prefetcher import Prefetcher
from ._spec import BatchSpec
from ._worker_info import WorkerInfo, get_worker_info
from .errors import (
    ConfigError,
    FastqError,
    FetchTimeout,
    PrefetcherClosed,
    RingError,
    SharedMemoryError,
    SlotsExhausted,
    SpecError,
    WorkerDied,
    WorkerError,
)

__version__ = "0.1.0"

__all__ = [
    "BatchSpec",
    "ConfigError",
    "FastqError",
    "FetchTimeout",
    "Prefetcher",
    "PrefetcherClosed",
    "RingError",
    "SharedMemoryError",
    "SlotsExhausted",
    "SpecError",
    "WorkerDied",
    "WorkerError",
    "WorkerInfo",
    "get_worker_info",
]
