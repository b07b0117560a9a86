"""A Prefetcher's place (in a map-style source's task stream, or in each
worker's stream of a stream source), as a small JSON-serialisable dict, and
the checks that a saved one fits the Prefetcher it is loaded into.

The order of batches and every batch's randomness are functions of (seed,
epoch, batch), never of the worker, so a place is enough to resume: the
epoch, and the batches of it already delivered (a prefix in ordered mode;
a set in unordered mode). The number of workers does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ._sampler import EpochSampler, Reshard, shard_sizes

FORMAT = "fastq.Prefetcher/1"

# What must match between the saved state and the Prefetcher loading it, and
# how to make it match.
_MUST_MATCH = {
    "samples": "the dataset's len(); this state is of another dataset",
    "batch_size": "pass the batch_size the state was saved with",
    "shuffle": "pass the shuffle the state was saved with",
    "drop_last": "pass the drop_last the state was saved with",
}


# A place as a state spells it: (epoch, batches_done, delivered).
Place = tuple[int, int, "tuple[int, ...] | None"]


@dataclass(frozen=True)
class Resume:
    """Where a loaded state resumes: batch ``first`` of ``epoch`` (its
    number in the epoch), dropping the batches in ``skip`` (delivered
    before, out of order), with the epoch resharded if the state was saved
    on another number of ranks. ``saved``: the place as the state spelled
    it (None for a set_epoch, or a state of another world size), which a
    state saved before the next batch repeats."""

    epoch: int
    first: int
    skip: frozenset[int]
    reshard: Reshard | None
    saved: Place | None = None


def make_state(
    sampler: EpochSampler,
    *,
    epoch: int,
    done: int,
    delivered: list[int] | None,
) -> dict[str, Any]:
    """The state of a stream at batch ``done`` of ``epoch`` (ordered), or
    with the batches ``delivered`` of it handed out (unordered)."""
    reshard = sampler.reshard
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
        "reshard": (
            [list(step) for step in reshard.steps]
            if reshard is not None and reshard.epoch == epoch
            else None
        ),
    }


def check_state(state: Any, sampler: EpochSampler) -> Resume:
    """Where a saved state resumes in ``sampler``'s stream, after checking
    it was saved by a Prefetcher over the same stream. A state saved on
    another world size reshards the rest of its epoch across this one's."""
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
    saved = EpochSampler(
        sampler.n,
        sampler.batch_size,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
        drop_last=sampler.drop_last,
        rank=_rank(state),
        world_size=_world_size(state),
    )
    epoch, done = state.get("epoch"), state.get("batches_done")
    if not isinstance(epoch, int) or epoch < 0:
        raise ConfigError(f"state['epoch']={epoch!r}: expected an int >= 0")
    saved.reshard = _reshard(state, epoch)
    first, per_epoch = saved.first_batch(epoch), saved.batches_per_epoch
    if not isinstance(done, int) or not first <= done <= per_epoch:
        raise ConfigError(
            f"state['batches_done']={done!r}: expected an int from {first} to "
            f"{per_epoch} (the batches of an epoch)"
        )
    delivered = state.get("delivered")
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
    # Spelled as this Prefetcher's own place only on the same world size.
    place = (
        (epoch, done, None if delivered is None else tuple(delivered))
        if saved.world_size == sampler.world_size
        else None
    )
    if done == per_epoch:  # saved at an epoch's end: the next one, whole
        return Resume(epoch + 1, 0, frozenset(), None, place)
    if saved.world_size == sampler.world_size:
        if saved.rank != sampler.rank:
            raise ConfigError(
                f"state['rank']={saved.rank}, but this Prefetcher has "
                f"rank={sampler.rank}: load each rank's own state"
            )
        return Resume(epoch, done, skip, saved.reshard, place)
    return _resharded(saved, epoch, done, skip, sampler)


def _resharded(
    saved: EpochSampler,
    epoch: int,
    done: int,
    skip: frozenset[int],
    sampler: EpochSampler,
) -> Resume:
    """The rest of ``epoch``, saved at batch ``done`` on ``saved``'s ranks,
    sharded across ``sampler``'s."""
    if skip:
        raise ConfigError(
            f"state['delivered']={sorted(skip)}: batches delivered out of order "
            f"differ from rank to rank, so the rest of the epoch cannot be "
            f"resharded from world_size={saved.world_size} to "
            f"world_size={sampler.world_size}; resume with "
            f"world_size={saved.world_size} until the epoch ends, or save "
            "states in ordered mode"
        )
    steps = () if saved.reshard is None else saved.reshard.steps
    batches = done - saved.first_batch(epoch)
    if batches:
        steps += ((saved.world_size, batches),)
    if not steps:
        return Resume(epoch, 0, frozenset(), None)
    reshard = Reshard(epoch, steps)
    left = reshard.remaining(sampler.n, sampler.batch_size)
    _, mine = shard_sizes(
        left, sampler.batch_size, sampler.world_size, sampler.drop_last
    )
    if mine == 0:  # nothing left for a batch: the next epoch, whole
        return Resume(epoch + 1, 0, frozenset(), None)
    return Resume(epoch, sampler.batches_per_epoch - mine, frozenset(), reshard)


def _world_size(state: dict[str, Any]) -> int:
    world_size = state.get("world_size")
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"state['world_size']={world_size!r}: expected an int >= 1")
    return world_size


def _rank(state: dict[str, Any]) -> int:
    rank, world_size = state.get("rank"), _world_size(state)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(
            f"state['rank']={rank!r}: expected an int from 0 to {world_size - 1}"
        )
    return rank


def _reshard(state: dict[str, Any], epoch: int) -> Reshard | None:
    steps = state.get("reshard")
    if steps is None:
        return None
    if not isinstance(steps, list) or not all(
        isinstance(s, list)
        and len(s) == 2
        and all(isinstance(x, int) and x > 0 for x in s)
        for s in steps
    ):
        raise ConfigError(
            f"state['reshard']={steps!r}: expected None or a list of "
            "[world_size, batches] pairs, as state_dict() writes it"
        )
    return Reshard(epoch, tuple((w, b) for w, b in steps))


# A stream's state: which process makes a batch, and when, is decided at
# run time, so its place is per lane (NOTE [ A stream's lanes ] in
# fastq/_workers/_lanes.py): the items (a sample stream's: samples) of
# each lane's own stream delivered in the current pass. "workers" is the
# number of lanes, which get_worker_info() gives the iterators as
# num_workers: the state fixes it, and any number of processes runs them.
# States saved before sample streams lack "pass", "unit" and
# "shuffle_buffer" (pass 0 of a stream of whole batches with no shuffle
# buffer); those saved before lanes lack "source", and were resumed only
# on as many processes as lanes, which they still are.
STREAM_FORMAT = "fastq.Prefetcher.stream/1"


@dataclass(frozen=True)
class StreamResume:
    """Where a stream resumes: in pass ``pass_`` (which seeds a shuffle
    buffer), after ``items[v]`` items of lane v's stream."""

    pass_: int
    items: list[int]
    # A stateful source's own state at each lane's place (None where it
    # has none; fastq.torch's IterableDataset of a Stateful dataset).
    states: list[Any] | None = None
    # Each lane as its iterator sees it, (rank, id) of `world` ranks of
    # `workers` each (NOTE [ A stream's lanes ] in
    # fastq/_workers/_lanes.py): None, lane k is (this rank, k) of this
    # world size's ranks of len(items) workers.
    ids: list[tuple[int, int]] | None = None
    workers: int = 0
    world: int = 0

    @property
    def lanes(self) -> int:
        return len(self.items)


def _unit(sample_stream: bool) -> str:
    return "samples" if sample_stream else "batches"


def resume_turn(items: int, rows: int) -> int:
    """The turn (fastq/_core/_turns.py) of a lane's next batch once
    ``items`` of its stream were delivered: its batches so far, ``rows``
    samples to a batch in a sample stream (0: items are batches)."""
    return items if not rows else -(-items // rows)


def make_stream_state(
    place: StreamResume,
    *,
    rank: int,
    world_size: int,
    sample_stream: bool,
    shuffle_buffer: int,
    seed: int,
    source: str,
    lanes: Lanes,
) -> dict[str, Any]:
    """The state of a stream at ``place``, run on ``lanes``; ``source``
    names the source (fastq._make._streams.source_name)."""
    return {
        "format": STREAM_FORMAT,
        "items": list(place.items),
        "unit": _unit(sample_stream),
        "pass": place.pass_,
        "workers": lanes.workers,
        "lanes": [list(lane) for lane in lanes.ids],
        "lane_world_size": lanes.world,
        "shuffle_buffer": shuffle_buffer,
        "seed": seed,
        "world_size": world_size,
        "rank": rank,
        "source": source,
    }


@dataclass(frozen=True)
class Lanes:
    """The lanes a rank runs: each as its iterator sees it, (rank, id) of
    ``world`` ranks of ``workers`` workers."""

    ids: list[tuple[int, int]]
    workers: int
    world: int

    @staticmethod
    def of(resume: StreamResume | None, rank: int, world: int, workers: int) -> Lanes:
        """A resumed state's lanes, else this rank's ``workers`` lanes."""
        if resume is None or resume.ids is None:
            count = workers if resume is None else resume.lanes
            return Lanes([(rank, k) for k in range(count)], count, world)
        return Lanes(list(resume.ids), resume.workers, resume.world)


def check_stream_state(
    state: Any,
    *,
    rank: int,
    world_size: int,
    sample_stream: bool,
    shuffle_buffer: int,
    seed: int,
    source: str,
) -> StreamResume:
    """Where a saved stream state resumes, once it fits this stream: its
    lanes are the state's, run by any number of processes. A list of the
    states every rank saved at one step resumes on another number of
    ranks: their lanes are dealt out to this world's ranks."""
    kw = {
        "sample_stream": sample_stream,
        "shuffle_buffer": shuffle_buffer,
        "seed": seed,
        "source": source,
    }
    if isinstance(state, list) and state:
        places = [_checked_stream_state(s, **kw) for s in state]
        return _dealt(places, [s["rank"] for s in state], rank, world_size)
    place = _checked_stream_state(state, **kw)
    if state.get("world_size") != world_size:
        raise ConfigError(
            f"state['world_size']={state.get('world_size')!r}, but this "
            f"Prefetcher has world_size={world_size!r}: on another number of "
            "ranks, pass the list of the states every rank saved at the same "
            "step (state=[state of rank 0, state of rank 1, ...]); their "
            "workers' streams are then dealt out to these ranks"
        )
    if state.get("rank") != rank:
        raise ConfigError(
            f"state['rank']={state.get('rank')!r}, but this Prefetcher has "
            f"rank={rank!r}: each rank resumes the state it saved (or pass "
            "the list of every rank's states)"
        )
    return place


def _dealt(
    places: list[StreamResume], ranks: list[int], rank: int, world_size: int
) -> StreamResume:
    """The lanes of every old rank's state, dealt out to this world's ranks
    (lane g of the ordered whole to rank g % world_size): this rank's."""
    first = places[0]
    for place in places[1:]:
        if (place.pass_, place.workers, place.world) != (
            first.pass_,
            first.workers,
            first.world,
        ):
            raise ConfigError(
                f"state: the ranks' states differ (pass {place.pass_} of "
                f"{place.world} ranks of {place.workers} workers, against "
                f"pass {first.pass_} of {first.world} of {first.workers}): "
                "pass the states every rank saved at the same step"
            )
    whole: dict[tuple[int, int], int] = {}
    for place in places:
        assert place.ids is not None
        for lane, n in zip(place.ids, place.items):
            if lane in whole:
                raise ConfigError(
                    f"state: lane {list(lane)} is in two of the states "
                    f"(ranks {ranks}): pass each rank's state once"
                )
            whole[lane] = n
    expected = {(r, k) for r in range(first.world) for k in range(first.workers)}
    if set(whole) != expected:
        missing = sorted(expected - set(whole))
        raise ConfigError(
            f"state: the states of ranks {sorted(ranks)} lack lanes "
            f"{[list(m) for m in missing]} of {first.world} ranks of "
            f"{first.workers} workers: pass the states every rank saved at "
            "the same step"
        )
    order = sorted(whole)
    if len(order) < world_size:
        raise ConfigError(
            f"state: {len(order)} workers' streams (of {first.world} ranks of "
            f"{first.workers} workers) cannot be dealt out to world_size="
            f"{world_size} ranks: every rank needs one; resume on at most "
            f"{len(order)} ranks, or save with more workers"
        )
    mine = order[rank::world_size]
    return StreamResume(
        first.pass_,
        [whole[lane] for lane in mine],
        None,
        mine,
        first.workers,
        first.world,
    )


def _checked_stream_state(
    state: Any,
    *,
    sample_stream: bool,
    shuffle_buffer: int,
    seed: int,
    source: str,
) -> StreamResume:
    """A saved stream state's place, once it fits this stream."""
    if not isinstance(state, dict) or state.get("format") != STREAM_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ConfigError(
            f"state: expected a dict from the state_dict() of a Prefetcher over "
            f"a stream (format {STREAM_FORMAT!r}), got {got!r}; pass what "
            "state_dict() returned"
        )
    unit = _unit(sample_stream)
    if state.get("unit", "batches") != unit:
        raise ConfigError(
            f"state['unit']={state.get('unit')!r}, but this Prefetcher's stream "
            f"delivers {unit}: a state counts what its stream's items were, so "
            "pass batch_size as it was when the state was saved (set, for a "
            "stream of samples; None, for whole batches)"
        )
    saved_source = state.get("source", source)
    if saved_source != source:
        raise ConfigError(
            f"state['source']={saved_source!r}, but this stream's source is "
            f"{source!r}: a state counts the items of its own source's "
            "streams; load it into a loader over the source it was saved "
            "from (or start this one without the state)"
        )
    saved_seed = state.get("seed")
    if saved_seed != seed:
        raise ConfigError(
            f"state['seed']={saved_seed!r}, but this stream has seed={seed!r}: "
            "each lane's randomness (its shuffle buffer, its generators, "
            "get_worker_info().rng) comes from the seed; pass "
            "seed=state['seed'] (a Prefetcher given state= and seed=None "
            "takes the state's seed)"
        )
    saved_buffer = state.get("shuffle_buffer", 0)
    if saved_buffer != shuffle_buffer:
        raise ConfigError(
            f"state['shuffle_buffer']={saved_buffer!r}, but this Prefetcher "
            f"has shuffle_buffer={shuffle_buffer or None!r}: the samples a "
            "lane delivered are those its shuffle buffer drew, so pass the "
            f"shuffle_buffer the state was saved with ({saved_buffer or None!r})"
        )
    saved_rank, saved_world = state.get("rank"), state.get("world_size")
    if not _count(saved_world, 1) or not _count(saved_rank, 0):
        raise ConfigError(
            f"state['rank']={saved_rank!r}, state['world_size']={saved_world!r}: "
            "expected ints, as state_dict() writes them"
        )
    workers, items = state.get("workers"), state.get("items")
    if not isinstance(items, list) or not all(_count(n, 0) for n in items):
        raise ConfigError(
            f"state['items']={items!r}: expected one count >= 0 per worker, "
            "as state_dict() writes them"
        )
    # States saved before lanes moved between ranks: lane k of the rank's own.
    lanes = state.get("lanes", [[saved_rank, k] for k in range(len(items))])
    world = state.get("lane_world_size", saved_world)
    if (
        not _count(workers, 1)
        or not _count(world, 1)
        or not isinstance(lanes, list)
        or len(lanes) != len(items)
        or not all(
            isinstance(lane, list)
            and len(lane) == 2
            and _count(lane[0], 0)
            and _count(lane[1], 0)
            and lane[0] < world
            and lane[1] < workers
            for lane in lanes
        )
    ):
        raise ConfigError(
            f"state['lanes']={lanes!r} of state['workers']={workers!r} and "
            f"state['lane_world_size']={world!r}: expected one [rank, worker] "
            "per count of state['items'], as state_dict() writes them"
        )
    pass_ = state.get("pass", 0)
    if not _count(pass_, 0):
        raise ConfigError(
            f"state['pass']={pass_!r}: expected an int >= 0, as state_dict() writes it"
        )
    ids = [(int(r), int(k)) for r, k in lanes]
    return StreamResume(pass_, list(items), None, ids, workers, world)


def _count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


__all__ = [
    "FORMAT",
    "STREAM_FORMAT",
    "Lanes",
    "Place",
    "Resume",
    "StreamResume",
    "check_state",
    "check_stream_state",
    "make_state",
    "make_stream_state",
    "resume_turn",
]
