"""PyTorch interop. ``from fastq.torch import DataLoader`` is the one-line
migration from torch's DataLoader (StatefulDataLoader, from torchdata's);
TorchPrefetcher is the fastq-first
spelling (tensors over the ring's slots, a page-locked ring, copies to the
GPU on a side stream); IterableDataset wraps a TorchPrefetcher for code that
takes a dataset; ``install()`` puts fastq's workers behind the DataLoaders
libraries build. Importing this package imports torch; ``import fastq``
alone never does."""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without torch only
    raise ImportError(
        "fastq.torch needs PyTorch, which is not installed; install it with "
        "pip install torch==2.13.0, or reinstall fastq with its torch extra: "
        "pip install -e '.[torch]' from a checkout, or pip install "
        "'fastq-ring[torch]' once fastq-ring is published"
    ) from exc

from ._dataloader import DataLoader
from ._install import install, is_installed, uninstall
from ._iterable import IterableDataset
from ._loader_iterator import DataLoaderTimeout
from ._prefetcher import TorchPrefetcher
from ._stateful_loader import StatefulDataLoader

__all__ = [
    "DataLoader",
    "DataLoaderTimeout",
    "IterableDataset",
    "StatefulDataLoader",
    "TorchPrefetcher",
    "install",
    "is_installed",
    "uninstall",
]
