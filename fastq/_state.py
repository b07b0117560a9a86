"""A map-style Prefetcher's place in its task stream, as a small
JSON-serialisable dict, and the checks that a saved one fits the
Prefetcher it is loaded into.

The order of batches and every batch's randomness are functions of (seed,
epoch, batch), never of the worker, so a place is enough to resume: the
epoch, and the batches of it already delivered (a prefix in ordered mode;
a set in unordered mode). The number of workers does not matter.
"""

from __future__ import annotations

from typing import Any

from ._sampler import EpochSampler
from .errors import ConfigError

FORMAT = "fastq.Prefetcher/1"

# What must match between the saved state and the Prefetcher loading it, and
# how to make it match.
_MUST_MATCH = {
    "samples": "the dataset's len(); this state is of another dataset",
    "batch_size": "pass the batch_size the state was saved with",
    "shuffle": "pass the shuffle the state was saved with",
    "drop_last": "pass the drop_last the state was saved with",
    "world_size": "resume with the world size the state was saved with",
    "rank": "load each rank's own state",
}


def make_state(
    sampler: EpochSampler,
    *,
    epoch: int,
    done: int,
    delivered: list[int] | None,
) -> dict[str, Any]:
    """The state of a stream at batch ``done`` of ``epoch`` (ordered), or
    with the batches ``delivered`` of it handed out (unordered)."""
    return {
        "format": FORMAT,
        "seed": sampler.seed,
        "epoch": epoch,
        "batches_done": done,
        "delivered": delivered,
        "samples": sampler.n,
        "batch_size": sampler.batch_size,
        "shuffle": sampler.shuffle,
        "drop_last": sampler.drop_last,
        "world_size": sampler.world_size,
        "rank": sampler.rank,
    }


def check_state(state: Any, sampler: EpochSampler) -> tuple[int, int, frozenset[int]]:
    """(epoch, first batch, batches to drop) from a saved state, after
    checking it was saved by a Prefetcher over the same stream."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(
            f"state: expected a dict from Prefetcher.state_dict() (format "
            f"{FORMAT!r}), got {got!r}; pass what state_dict() returned"
        )
    mine = make_state(sampler, epoch=0, done=0, delivered=None)
    if state.get("seed") != mine["seed"]:
        raise ConfigError(
            f"state['seed']={state.get('seed')!r}, but this Prefetcher has "
            f"seed={mine['seed']!r}: the order and randomness come from the "
            "seed. Create the Prefetcher with state=... (it takes the seed "
            "from the state) or with seed=state['seed']"
        )
    for key, fix in _MUST_MATCH.items():
        if state.get(key) != mine[key]:
            raise ConfigError(
                f"state[{key!r}]={state.get(key)!r}, but this Prefetcher has "
                f"{key}={mine[key]!r}: {fix}"
            )
    epoch, done = state.get("epoch"), state.get("batches_done")
    delivered = state.get("delivered")
    per_epoch = sampler.batches_per_epoch
    if not isinstance(epoch, int) or epoch < 0:
        raise ConfigError(f"state['epoch']={epoch!r}: expected an int >= 0")
    if not isinstance(done, int) or not 0 <= done <= per_epoch:
        raise ConfigError(
            f"state['batches_done']={done!r}: expected an int from 0 to "
            f"{per_epoch} (the batches of an epoch)"
        )
    skip: frozenset[int] = frozenset()
    if delivered is not None:
        if not isinstance(delivered, list) or not all(
            isinstance(b, int) and done <= b < per_epoch for b in delivered
        ):
            raise ConfigError(
                f"state['delivered']: expected a list of batch numbers from "
                f"{done} to {per_epoch - 1}, or None"
            )
        skip = frozenset(delivered)
    if done == per_epoch:  # saved at an epoch's end: the next one, whole
        return epoch + 1, 0, frozenset()
    return epoch, done, skip


__all__ = ["FORMAT", "check_state", "make_state"]
