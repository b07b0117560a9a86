"""A fastq.torch.DataLoader's place, for a checkpoint: the record
state_dict() gives, and what load_state_dict() checks and replays of one."""

from __future__ import annotations

import base64
import copy
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from ._stream_state import STREAM_STATE_FORMAT
from ._user_state import is_stateful, sampler_owners

MAP_STYLE = 0  # torch's _DatasetKind.Map
STATE_FORMAT = "fastq.torch.DataLoader/1"


def is_fastq_state(state: Any) -> bool:
    """A state from a fastq.torch.DataLoader's state_dict() (map-style or
    an IterableDataset's)."""
    return isinstance(state, dict) and state.get("format") in (
        STATE_FORMAT,
        STREAM_STATE_FORMAT,
    )


def saved_state(
    loader: DataLoader[Any],
    epoch: int,
    done: int,
    seed: int | None,
    rng: torch.Tensor,
    samplers: dict[str, Any] | None,
    datasets: dict[str, Any] | None,
    delivered: list[int] | None = None,
) -> dict[str, Any]:
    """The record of an epoch with `done` batches delivered, its base seed
    and the sampler generator's state as it began, with what the loader
    that loads it must match, and the states of the user's objects that
    keep their own (fastq/torch/_user_state.py), by where they live."""
    return {
        "format": STATE_FORMAT,
        "epoch": epoch,
        "batches_done": done,
        # Out of order: the batches past the first `done` delivered too.
        "delivered": delivered,
        "seed": seed,
        "rng_state": base64.b64encode(rng.numpy().tobytes()).decode(),
        "samples": len(loader.dataset),  # type: ignore[arg-type]
        "batches": len(loader),
        "world_size": _world_size(loader),
        "user_states": {
            "samplers": samplers,
            "datasets": None if datasets is None else dict(datasets),
        },
    }


def state_of_loop(loader: Any, live: Any) -> dict[str, Any]:
    """The state of `loader` at its loop `live` (a LoaderIterator): the
    state it was begun from until its first batch, else its place."""
    loaded = live.as_loaded()
    if loaded is not None:
        return copy.deepcopy(loaded)
    done = live.place
    samplers = None if live.samplers is None else live.samplers.at(done)
    delivered = None if live.numbered is None else sorted(live.delivered)
    datasets = own_dataset_state(loader) if live.inline else live.copies
    return saved_state(
        loader, live.epoch, done, live.seed, live.rng, samplers, datasets, delivered
    )


def state_between_epochs(loader: Any) -> dict[str, Any]:
    """The state of `loader` between epochs: the next starts as the
    uninterrupted run's, with the base seed persistent workers keep (also
    once closed: the next iter() starts them with it), and the samplers'
    and the workers' copies' states as they are now."""
    persistent = loader.persistent_workers
    seed = loader._seed if persistent else None
    rng = (loader.generator or torch.default_generator).get_state()
    owners = sampler_owners(loader)
    samplers = {n: o.state_dict() for n, o in owners.items()} or None
    if loader.num_workers == 0:
        datasets = own_dataset_state(loader)
    else:
        datasets = loader._copies if persistent else None
    return saved_state(loader, loader._epoch, 0, seed, rng, samplers, datasets)


def own_dataset_state(loader: Any) -> dict[str, Any] | None:
    """With num_workers=0, the dataset's state, as worker 0's."""
    if not is_stateful(loader.dataset):
        return None
    return {"0": loader.dataset.state_dict()}


def user_states(state: dict[str, Any]) -> tuple[Any, Any]:
    """A saved state's (samplers, datasets) states, None where it has none
    (also a state from before they were saved)."""
    saved = state.get("user_states") or {}
    if not isinstance(saved, dict):
        raise ConfigError(
            f"state['user_states']={saved!r}: expected a dict, as state_dict() "
            "writes it"
        )
    return saved.get("samplers"), saved.get("datasets")


def checked_batches_done(loader: DataLoader[Any], state: Any) -> int:
    """The batches of its epoch `state` says were delivered, once it is
    checked to be a state of `loader` (its dataset, world size and
    batches)."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        got = state.get("format") if isinstance(state, dict) else state
        raise ConfigError(
            f"state: expected a dict from fastq.torch.DataLoader.state_dict() "
            f"(format {STATE_FORMAT!r}), got {got!r}"
        )
    for key, mine, fix in (
        ("samples", len(loader.dataset), "this state is of another dataset"),  # type: ignore[arg-type]
        (
            "world_size",
            _world_size(loader),
            "a DataLoader's sampler is yours, so it resumes on the world "
            "size it was saved with; fastq.torch.TorchPrefetcher(rank=, "
            "world_size=) shards itself, and its state reshards the rest "
            "of the epoch across another world size",
        ),
        (
            "batches",
            len(loader),
            "pass the batch_size, drop_last and sampler the state was saved with",
        ),
    ):
        # (A state from before world sizes were saved has none.)
        if state.get(key, mine if key == "world_size" else None) != mine:
            raise ConfigError(
                f"state[{key!r}]={state.get(key)!r}, but this loader has "
                f"{key}={mine!r}: {fix}"
            )
    done = state.get("batches_done")
    if not isinstance(done, int) or not 0 <= done <= len(loader):
        raise ConfigError(
            f"state['batches_done']={done!r}: expected 0 to {len(loader)}"
        )
    delivered = state.get("delivered")
    if delivered is not None and not (
        isinstance(delivered, list)
        and all(isinstance(b, int) and done < b < len(loader) for b in delivered)
    ):
        raise ConfigError(
            f"state['delivered']={delivered!r}: expected None or a list of "
            f"batch numbers from {done + 1} to {len(loader) - 1}, as "
            "state_dict() writes it"
        )
    return done


def delivered_past(state: dict[str, Any]) -> frozenset[int]:
    """The batches of a saved state's epoch delivered past its first
    batches_done (out of order)."""
    return frozenset(state.get("delivered") or ())


def decode_rng(text: str) -> torch.Tensor:
    data = bytearray(base64.b64decode(text))
    return torch.frombuffer(data, dtype=torch.uint8).clone()


def _world_size(loader: DataLoader[Any]) -> int:
    """The ranks a DistributedSampler (or any sampler with its
    ``num_replicas``) shards the dataset across; 1 without one."""
    replicas = getattr(loader.sampler, "num_replicas", 1)
    return replicas if isinstance(replicas, int) else 1


def load_map_state(loader: Any, state: dict[str, Any]) -> None:
    """load_state_dict() of a map-style dataset, once `state` is checked:
    the next iter() resumes its epoch (fastq/torch/_workers_epoch.py, or
    fastq/torch/_in_process.py with num_workers=0)."""
    checked_batches_done(loader, state)
    user_states(state)
    live = loader._current_loop()
    if live is not None:
        live.superseded = True
    loader._dropped = None
    loader.close()  # workers restart with the state's seed
    loader._seed = state.get("seed")
    loader._seed_from_state = loader._seed is not None
    loader.set_epoch(state["epoch"])
    # Until a batch comes from it, the place is the state as loaded: a
    # checkpoint saved at the first step (a preemption handler right
    # after a restart) must not lose it, nor respell an epoch's end.
    loader._loaded = dict(state)
    loader._resume = state
