"""A fastq.torch.DataLoader's place in an IterableDataset, for a checkpoint:
each lane's batches delivered in the epoch (NOTE [ A stream's lanes ] in
fastq/_workers/_lanes.py), and what load_state_dict() checks of one."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._make._state import StreamResume
from .._make._streams import source_name
from ..errors import ConfigError

STREAM_STATE_FORMAT = "fastq.torch.DataLoader.stream/1"


@dataclass(frozen=True)
class LoadedStream:
    """A checked state: the epoch it resumes, each lane's batches of it
    delivered (None: the epoch whole), its lanes, the base seed of its
    workers (None: drawn as the epoch starts) and the generator's state."""

    epoch: int
    place: StreamResume | None
    lanes: int
    seed: int | None
    rng_state: str


def saved_stream_state(
    loader: DataLoader[Any],
    *,
    epoch: int,
    items: list[int] | None,
    lanes: int,
    dataset_states: list[Any] | None,
    seed: int | None,
    rng: torch.Tensor,
    rank: int,
    world_size: int,
) -> dict[str, Any]:
    """The record of ``epoch`` with ``items[v]`` batches of lane v
    delivered (None: not begun), with the base seed its workers had and the
    generator's state after it was drawn (or, without a seed, as the epoch
    begins)."""
    return {
        "format": STREAM_STATE_FORMAT,
        "epoch": epoch,
        "items": None if items is None else list(items),
        "workers": lanes,
        # A Stateful dataset's own state_dict() in each worker, after its
        # last batch delivered (None where it delivered none).
        "dataset_states": dataset_states,
        "seed": seed,
        "rng_state": base64.b64encode(rng.numpy().tobytes()).decode(),
        "source": source_name(loader.dataset),
        "rank": rank,
        "world_size": world_size,
    }


def checked_stream_state(
    loader: DataLoader[Any], state: Any, *, rank: int, world_size: int
) -> LoadedStream:
    """What ``state`` resumes, once it is checked to be a state of an
    iterable dataset like ``loader``'s, on this rank."""
    if not isinstance(state, dict) or state.get("format") != STREAM_STATE_FORMAT:
        got = state.get("format") if isinstance(state, dict) else state
        raise ConfigError(
            f"state: expected a dict from the state_dict() of a "
            f"fastq.torch.DataLoader over an IterableDataset (format "
            f"{STREAM_STATE_FORMAT!r}), got {got!r}; pass what state_dict() "
            "returned"
        )
    mine = source_name(loader.dataset)
    if state.get("source") != mine:
        raise ConfigError(
            f"state['source']={state.get('source')!r}, but this loader's dataset "
            f"is {mine!r}: a state counts the batches of its own dataset's "
            "iterators; load it into a loader over the dataset it was saved from"
        )
    for key, value in (("world_size", world_size), ("rank", rank)):
        if state.get(key) != value:
            raise ConfigError(
                f"state[{key!r}]={state.get(key)!r}, but this process has "
                f"{key}={value!r}: an IterableDataset shards itself by rank, "
                "so each rank resumes the state it saved, on the world size "
                f"it was saved with; pass that {key} (RANK / WORLD_SIZE, or "
                "torch.distributed's)"
            )
    epoch, lanes, items = state.get("epoch"), state.get("workers"), state.get("items")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ConfigError(f"state['epoch']={epoch!r}: expected an int >= 0")
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 1:
        raise ConfigError(f"state['workers']={lanes!r}: expected an int >= 1")
    if items is not None and (
        not isinstance(items, list)
        or len(items) != lanes
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in items
        )
    ):
        raise ConfigError(
            f"state['items']={items!r}: expected None or {lanes} counts >= 0, "
            "one per worker, as state_dict() writes them"
        )
    seed = state.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ConfigError(f"state['seed']={seed!r}: expected an int or None")
    rng_state = state.get("rng_state")
    if not isinstance(rng_state, str):
        raise ConfigError(
            f"state['rng_state']={rng_state!r}: expected the text state_dict() writes"
        )
    states = state.get("dataset_states")
    if states is not None and (not isinstance(states, list) or len(states) != lanes):
        raise ConfigError(
            f"state['dataset_states']: expected None or {lanes} states, one "
            "per worker, as state_dict() writes them"
        )
    if states is not None and not _stateful(loader.dataset):
        raise ConfigError(
            "state['dataset_states']: the state holds the dataset's own "
            f"states, but this loader's {type(loader.dataset).__name__} has no "
            "load_state_dict(); load it into a loader over the dataset it "
            "was saved from"
        )
    place = None if items is None else StreamResume(0, list(items), states)
    return LoadedStream(epoch, place, lanes, seed, rng_state)


def _stateful(dataset: Any) -> bool:
    return callable(getattr(dataset, "load_state_dict", None))


__all__ = [
    "STREAM_STATE_FORMAT",
    "LoadedStream",
    "checked_stream_state",
    "saved_stream_state",
]
