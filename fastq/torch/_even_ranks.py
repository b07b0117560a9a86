"""Every rank ends a stream's epoch with the same number of batches: an
IterableDataset's shards differ in length from rank to rank, and a DDP
step that waits on a rank with no batch left never returns."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError

# NOTE [ Even batches across ranks ]
# A map-style epoch is cut to the same number of batches on every rank
# before it starts (DistributedSampler pads or drops). A stream's length
# is known only at its end, so the ranks agree batch by batch: before a
# batch is handed out, one all_reduce of one int says whether every rank
# has one; the first time one has none, every rank ends the epoch there,
# dropping what it had left ("drop", DistributedSampler's drop_last). That
# costs one collective per batch on the training thread (measured in
# benchmarks/even_batches.py); even_batches=None leaves it out, for
# shards of equal length or a loop that joins its ranks itself
# (torch.distributed.algorithms.Join).
EVEN_BATCHES = ("drop", None)


def check_even_batches(value: Any) -> str | None:
    if value not in EVEN_BATCHES:
        raise ConfigError(
            f"even_batches={value!r}: expected 'drop' (every rank ends an "
            "IterableDataset's epoch at the batch the shortest rank ends at) "
            "or None (each rank runs its own stream to its end)"
        )
    return value  # type: ignore[no-any-return]


def ranks_group() -> Any:
    """torch.distributed's default group when it runs more than one rank;
    None otherwise."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2:
        return None
    return dist.group.WORLD


class EvenBatches:
    """An epoch's iterator of a stream on one of several ranks, ended on
    every rank at the first batch some rank does not have (NOTE [ Even
    batches across ranks ])."""

    __slots__ = ("_device", "_flag", "_group", "_it")

    def __init__(self, it: Iterator[Any], group: Any) -> None:
        import torch
        import torch.distributed as dist

        self._it = it
        self._group = group
        # NCCL reduces device tensors only; gloo and the others CPU ones.
        device = "cpu"
        if dist.get_backend(group) == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        self._flag = torch.zeros((), dtype=torch.int32, device=device)
        self._device = device

    def __iter__(self) -> EvenBatches:
        return self

    def __next__(self) -> Any:
        import torch.distributed as dist

        try:
            batch = next(self._it)
            have = 1
        except StopIteration:
            batch, have = None, 0
        flag = self._flag
        flag.fill_(have)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
        if int(flag.item()) == 0:
            raise StopIteration  # some rank has none: each drops its excess
        return batch


__all__ = ["EVEN_BATCHES", "EvenBatches", "check_even_batches", "ranks_group"]
