"""A fastq.torch.DataLoader's place in an IterableDataset, for a checkpoint:
each lane's batches delivered in the epoch (NOTE [ A stream's lanes ] in
fastq/_workers/_lanes.py), or, with num_workers=0, the batches of the one
iterator in this process; what state_dict() saves of one and what
load_state_dict() checks and loads."""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from .._make._state import StreamResume
from .._make._streams import source_name
from ..errors import ConfigError
from ._loader_engine import rank_and_world_size
from ._user_state import is_stateful
from ._worker_side import lane_states

STREAM_STATE_FORMAT = "fastq.torch.DataLoader.stream/1"


@dataclass(frozen=True)
class LoadedStream:
    """A checked state: the epoch it resumes, each lane's batches of it
    delivered (None: the epoch whole) and the pass of its workers that
    seeds them, its lanes (0: num_workers=0), the base seed of its workers
    (None: drawn as the epoch starts) and the generator's state."""

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
    pass_: int = 0,
    iterator_state: Any = None,
) -> dict[str, Any]:
    """The record of ``epoch`` with ``items[v]`` batches of lane v
    delivered (None: not begun), with the base seed its workers had and the
    generator's state after it was drawn (or, without a seed, as the epoch
    begins). ``pass_``: the pass of the workers that runs the epoch (with
    persistent workers, the epochs they served before it), which seeds
    the lanes' generators. ``lanes`` 0: num_workers=0, whose one iterator,
    where it keeps its own place, gave ``iterator_state``."""
    rank, world_size = rank_and_world_size()
    return {
        "format": STREAM_STATE_FORMAT,
        "epoch": epoch,
        "items": None if items is None else list(items),
        "workers": lanes,
        "pass": pass_,
        "iterator_state": iterator_state,
        # A Stateful dataset's own state_dict() in each worker, after its
        # last batch delivered (None where it delivered none).
        "dataset_states": dataset_states,
        "seed": seed,
        "rng_state": base64.b64encode(rng.numpy().tobytes()).decode(),
        "source": source_name(loader.dataset),
        "rank": rank,
        "world_size": world_size,
    }


def checked_stream_state(loader: DataLoader[Any], state: Any) -> LoadedStream:
    """What ``state`` resumes, once it is checked to be a state of an
    iterable dataset like ``loader``'s, on this rank."""
    rank, world_size = rank_and_world_size()
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
    if not isinstance(lanes, int) or isinstance(lanes, bool) or lanes < 0:
        raise ConfigError(f"state['workers']={lanes!r}: expected an int >= 0")
    if (lanes == 0) != (loader.num_workers == 0):
        raise ConfigError(
            f"state['workers']={lanes!r}, but this loader has "
            f"num_workers={loader.num_workers}: with num_workers=0 the "
            "dataset is iterated once in this process, where "
            "get_worker_info() is None, and with workers each iterates its "
            "own share, so the two are different streams; load it into a "
            "loader with num_workers="
            + ("0" if lanes == 0 else "1 or more (any number)")
        )
    pass_ = state.get("pass", 0)
    if not isinstance(pass_, int) or isinstance(pass_, bool) or pass_ < 0:
        raise ConfigError(f"state['pass']={pass_!r}: expected an int >= 0")
    if items is not None and (
        not isinstance(items, list)
        or len(items) != max(lanes, 1)
        or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in items
        )
    ):
        raise ConfigError(
            f"state['items']={items!r}: expected None or {max(lanes, 1)} "
            "counts >= 0, one per worker, as state_dict() writes them"
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
    if states is not None and (
        not isinstance(states, list) or len(states) != max(lanes, 1)
    ):
        raise ConfigError(
            f"state['dataset_states']: expected None or {max(lanes, 1)} "
            "states, one per worker, as state_dict() writes them"
        )
    if states is not None and not is_stateful(loader.dataset):
        raise ConfigError(
            "state['dataset_states']: the state holds the dataset's own "
            f"states, but this loader's {type(loader.dataset).__name__} has no "
            "load_state_dict(); load it into a loader over the dataset it "
            "was saved from"
        )
    place = None
    if items is not None:
        place = StreamResume(pass_, list(items), states)
    elif pass_ or states is not None:
        # The next epoch of persistent workers: its pass seeds them, and
        # their copies of a Stateful dataset start it from their states.
        place = StreamResume(pass_, [0] * lanes, states)
    return LoadedStream(epoch, place, lanes, seed, rng_state)


def stream_state_of_loop(loader: Any, live: Any) -> dict[str, Any]:
    """state_dict() of an IterableDataset at its loop ``live`` (a
    LoaderIterator): each lane's batches of the epoch delivered and, for a
    dataset that keeps its own place, its state in each lane after them
    (NOTE [ A stream's lanes ] in fastq/_workers/_lanes.py); with
    num_workers=0, the batches of torch's iterator in this process and the
    states of the dataset and its iterator, asked here, where they live."""
    loaded = live.as_loaded()
    if loaded is not None:
        return copy.deepcopy(loaded)
    if live.inline:
        dataset = loader.dataset
        dataset_iter = live.stream_iter._dataset_fetcher.dataset_iter
        own = {"dataset": None, "iterator": None}
        if is_stateful(dataset):
            own = lane_states(dataset, dataset_iter)
        elif is_stateful(dataset_iter):
            own["iterator"] = dataset_iter.state_dict()
        return saved_stream_state(
            loader,
            epoch=live.epoch,
            items=[live.done],
            lanes=0,
            dataset_states=[own["dataset"]] if is_stateful(dataset) else None,
            seed=None,
            rng=live.rng,
            iterator_state=own["iterator"],
        )
    engine = loader._engine
    lanes = loader._streams or loader.num_workers
    items, states, pass_ = [0] * lanes, None, 0
    if engine is not None:
        lanes = engine.streams
        feed = engine._feed
        items = [0] * lanes
        if feed is not None:
            place = feed.stream_place()
            items, pass_ = place.items, place.pass_
        states = engine.lane_states()
    return saved_stream_state(
        loader,
        epoch=live.epoch,
        items=items,
        lanes=lanes,
        dataset_states=states,
        seed=live.seed,
        rng=live.rng,
        pass_=pass_,
    )


def stream_state_between_epochs(loader: Any) -> dict[str, Any]:
    """state_dict() of an IterableDataset between epochs: the next starts
    as the uninterrupted run's (persistent workers keep their seed, and
    their next pass)."""
    rng = (loader.generator or torch.default_generator).get_state()
    if loader.num_workers == 0:
        return saved_stream_state(
            loader,
            epoch=loader._epoch,
            items=None,
            lanes=0,
            dataset_states=_own_state(loader.dataset),
            seed=None,
            rng=rng,
        )
    engine = loader._engine
    persistent = loader.persistent_workers and engine is not None
    pass_, states = 0, None
    if persistent and engine._feed is not None:
        pass_ = engine._feed.stream_place().pass_
        # A Stateful dataset's copies start the next pass from their state
        # as each lane's iterator ended (which a dataset may change then).
        states = engine.lane_states()
    return saved_stream_state(
        loader,
        epoch=loader._epoch,
        items=None,
        lanes=(loader._streams or loader.num_workers)
        if engine is None
        else engine.streams,
        dataset_states=states,
        seed=loader._seed if persistent else None,
        rng=rng,
        pass_=pass_,
    )


def load_stream_state(loader: Any, state: dict[str, Any]) -> None:
    """load_state_dict() of an IterableDataset: the next iter() starts its
    workers on the state's lanes, each past its batches (with
    num_workers=0, its iterator in this process, fastq/torch/_in_process.py)."""
    loaded = checked_stream_state(loader, state)
    live = loader._current_loop()
    if live is not None:
        live.superseded = True
    loader._dropped = None
    loader.close()  # workers restart on the state's lanes and seed
    loader._streams = loaded.lanes or None
    loader._stream_resume = loaded.place
    loader._seed = loaded.seed
    loader._seed_from_state = loaded.seed is not None
    loader._resume = dict(state)
    loader.set_epoch(loaded.epoch)
    # Until a batch comes from it, the place is the state as loaded.
    loader._loaded = copy.deepcopy(state)


def _own_state(dataset: Any) -> list[Any] | None:
    """With num_workers=0, a Stateful dataset's state, as lane 0's."""
    return [dataset.state_dict()] if is_stateful(dataset) else None


__all__ = [
    "STREAM_STATE_FORMAT",
    "LoadedStream",
    "checked_stream_state",
    "load_stream_state",
    "saved_stream_state",
    "stream_state_between_epochs",
    "stream_state_of_loop",
]
