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
# benchmarks/even_batches.py), on a gloo group (the CPU's, whatever the
# training's backend), so the loop never waits for the GPU to read a flag;
# even_batches=None leaves it out, for shards of equal length or a loop
# that joins its ranks itself (torch.distributed.algorithms.Join).
# DistributedSampler's other way, padding the short ranks by wrapping to
# their epoch's start, would read their streams a second time: not
# offered.
EVEN_BATCHES = ("drop", None)


def check_even_batches(value: Any) -> str | None:
    if value not in EVEN_BATCHES:
        raise ConfigError(
            f"even_batches={value!r}: expected 'drop' (every rank ends an "
            "IterableDataset's epoch at the batch the shortest rank ends at) "
            "or None (each rank runs its own stream to its end)"
        )
    return value  # type: ignore[no-any-return]


_gloo_groups: dict[Any, Any] = {}  # the default group's gloo twin, once made


def ranks_group() -> Any:
    """A gloo group of torch.distributed's ranks when it runs more than
    one (the default group itself where it is gloo's); None otherwise.
    The ranks agree on the CPU: a flag on the GPU (NCCL's) would make the
    loop's thread wait for the step's kernels to read it. Made once, by
    every rank at the same point (each one's first iter())."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2:
        return None
    world = dist.group.WORLD
    if dist.get_backend(world) == "gloo":
        return world
    group = _gloo_groups.get(world)
    if group is None:
        group = _gloo_groups[world] = dist.new_group(backend="gloo")
    return group


class EvenBatches:
    """An epoch's iterator of a stream on one of several ranks, ended on
    every rank at the first batch some rank does not have (NOTE [ Even
    batches across ranks ])."""

    __slots__ = ("_flag", "_group", "_it")

    def __init__(self, it: Iterator[Any], group: Any) -> None:
        import torch

        self._it = it
        self._group = group  # gloo's: the flag stays on the CPU
        self._flag = torch.zeros((), dtype=torch.int32)

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
