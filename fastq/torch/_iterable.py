"""fastq.torch.IterableDataset: a TorchPrefetcher's batches as a torch
IterableDataset, for code that takes a dataset rather than a loader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from .._faces._arguments import resolve_ranks
from ..errors import ConfigError
from ._prefetcher import TorchPrefetcher, _bind_prefetcher_args, _resolve_device

__all__ = ["IterableDataset"]


def _refuse_dataloader_worker() -> None:
    if torch.utils.data.get_worker_info() is not None:
        raise ConfigError(
            "fastq.torch.IterableDataset is being iterated inside a DataLoader "
            "worker process; fastq runs its own workers, so load it in the "
            "main process: DataLoader(dataset, batch_size=None, num_workers=0), "
            "or dataset.loader()"
        )


def _keep(batch: Any) -> Any:
    return batch


class _AdapterLoader(torch.utils.data.DataLoader[Any]):
    """What ``IterableDataset.loader()`` returns: torch's DataLoader, which
    refuses to be sharded again by accelerate."""

    # accelerate's Accelerator.prepare() reads this attribute of a DataLoader
    # before it re-wraps it (its guard against wrapping one twice), so the
    # read is where a second sharding can be refused, with the fix; any
    # other reader gets what was set, False by default.
    @property
    def _is_accelerate_prepared(self) -> bool:
        dataset = self.dataset
        if isinstance(dataset, IterableDataset):
            dataset._refuse_resharding()
        return bool(self.__dict__.get("_accelerate_prepared", False))

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_accelerate_prepared"] = value


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """A ``torch.utils.data.IterableDataset`` whose items are whole batches
    from a ``TorchPrefetcher``, for code that expects a DataLoader
    (Lightning's ``train_dataloader``, a trainer's ``DataLoader`` argument).

    Takes the arguments of ``TorchPrefetcher``. The prefetcher (its
    workers, its ring, and its rank and world size) is created on first
    use (``iter`` or ``len``), in the process that uses it, and persists:
    each ``iter()`` is the next epoch. Until then the adapter pickles like
    its arguments (e.g. for ``ddp_spawn``); once started it refuses to be
    pickled.

    Give it to a DataLoader with ``batch_size=None`` and ``num_workers=0``
    (or use ``loader()``): items already are batches, and fastq's own
    workers do the loading. Leave the DataLoader's ``pin_memory`` False and
    use fastq's: DataLoader would copy every batch again.
    """

    def __init__(
        self, source: Any, batch_size: int | None = None, *args: Any, **kwargs: Any
    ) -> None:
        pin_memory = kwargs.pop("pin_memory", None)
        device = kwargs.pop("device", None)
        bound = _bind_prefetcher_args((source, batch_size, *args), kwargs)
        _resolve_device(device, pin_memory)
        # As given: the prefetcher resolves them when it starts, in the
        # process that uses it.
        self._ranks = (bound.get("rank"), bound.get("world_size"))
        self._args = (source, batch_size, *args)
        self._kwargs = dict(kwargs, pin_memory=pin_memory, device=device)
        self._prefetcher: TorchPrefetcher | None = None

    @property
    def prefetcher(self) -> TorchPrefetcher:
        """The TorchPrefetcher behind the adapter, created on first use."""
        if self._prefetcher is None:
            _refuse_dataloader_worker()
            self._prefetcher = TorchPrefetcher(*self._args, **self._kwargs)
        return self._prefetcher

    def __iter__(self) -> Iterator[Any]:
        _refuse_dataloader_worker()
        return iter(self.prefetcher)

    def __len__(self) -> int:
        """Batches per epoch on this rank (map-style sources only)."""
        return len(self.prefetcher)

    def loader(self, **kwargs: Any) -> torch.utils.data.DataLoader[Any]:
        """A DataLoader over this adapter that passes batches through as
        they are (tuples stay tuples); keyword arguments go to DataLoader.

        It shards itself across ranks: under accelerate with several
        processes, ``accelerator.prepare()`` refuses it (a ConfigError
        naming the fix: prepare only the model and optimizer)."""
        opts: dict[str, Any] = {
            "batch_size": None,
            "num_workers": 0,
            "collate_fn": _keep,
        }
        opts.update(kwargs)
        return _AdapterLoader(self, **opts)

    def _refuse_resharding(self) -> None:
        """ConfigError, naming the fix, if this adapter shards itself
        across ranks (accelerate would shard its loader again)."""
        if self._prefetcher is not None:
            world = self._prefetcher.world_size
        else:
            world = resolve_ranks(*self._ranks)[1]
        if world <= 1:
            return
        raise ConfigError(
            f"accelerator.prepare() was given fastq.torch.IterableDataset"
            f"(...).loader(), which shards itself across the world_size={world} "
            "processes already (each one's workers make its share of every "
            "epoch); accelerate would shard it again and train on 1/"
            f"{world} of each epoch. Prepare only the model and optimizer "
            "(model, optimizer = accelerator.prepare(model, optimizer)) and "
            "iterate the loader as it is; pass device=accelerator.device to "
            "fastq.torch.IterableDataset for batches on the GPU"
        )

    def state_dict(self) -> dict[str, Any]:
        """The prefetcher's ``state_dict()``, for a trainer that
        checkpoints its data like StatefulDataLoader's."""
        return self.prefetcher.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state``: before the prefetcher starts, its workers
        start there (``state=``); after, the next ``iter()`` does."""
        if self._prefetcher is None:
            self._kwargs["state"] = state
            self._kwargs.pop("seed", None)  # the state's seed
        else:
            self._prefetcher.load_state_dict(state)

    def close(self) -> None:
        """Closes the prefetcher, if it was started."""
        if self._prefetcher is not None:
            self._prefetcher.close()

    def __enter__(self) -> IterableDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        if self._prefetcher is not None:
            raise ConfigError(
                "this fastq.torch.IterableDataset has started its workers and "
                "cannot be pickled (a DataLoader with num_workers > 0, or a "
                "spawned process, would copy it); pickle it before its first "
                "iter()/len(), or use DataLoader(..., num_workers=0)"
            )
        return self.__dict__.copy()
