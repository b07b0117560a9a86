"""fastq: feed a training loop from worker processes through a lock-free
ring of preallocated shared-memory batch slots."""

from ._faces._prefetcher import Prefetcher
from ._layout._jagged import Jagged, JaggedArray
from ._layout._spec import BatchSpec
from ._make._parquet import ParquetRows
from ._make._worker_info import WorkerInfo, get_worker_info
from ._workers._shared_arrays import shared_array
from ._workers._shared_records import SharedRecords, shared_records
from .errors import (
    ConfigError,
    CopiedDataWarning,
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


def __getattr__(name: str) -> object:
    # `fastq.torch` on first use, so `import fastq` never imports torch;
    # `fastq.vision` too, as it needs no import until images are read.
    if name in ("torch", "vision"):
        import importlib

        return importlib.import_module(f"fastq.{name}")
    raise AttributeError(f"module 'fastq' has no attribute {name!r}")


__all__ = [
    "BatchSpec",
    "ConfigError",
    "CopiedDataWarning",
    "FastqError",
    "FetchTimeout",
    "Jagged",
    "JaggedArray",
    "ParquetRows",
    "Prefetcher",
    "PrefetcherClosed",
    "RingError",
    "SharedMemoryError",
    "SharedRecords",
    "SlotsExhausted",
    "SpecError",
    "WorkerDied",
    "WorkerError",
    "WorkerInfo",
    "get_worker_info",
    "shared_array",
    "shared_records",
]
