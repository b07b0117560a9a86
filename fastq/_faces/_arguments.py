"""A Prefetcher's arguments: each checked (an error names the argument,
the value, what was expected and the fix), defaults filled in, and what
they imply worked out once (the sampler, the resume point, the start
method), before any worker starts."""

from __future__ import annotations

import operator
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._core._ring import MAX_SLOTS, MAX_WORKERS
from .._layout._spec import BatchSpec
from .._make._sampler import EpochSampler
from .._make._state import (
    Lanes,
    Resume,
    StreamResume,
    check_state,
    check_stream_state,
)
from .._make._streams import (
    check_stream_source,
    check_thread_sharding,
    source_name,
    warn_fewer_shards,
)
from .._workers._start_method import get_context
from .._workers._thread_workers import ThreadContext
from ..errors import ConfigError


@dataclass
class Settings:
    """What a Prefetcher runs with, resolved from its arguments."""

    source: Any
    is_map: bool
    auto: bool  # workers="auto"
    workers: int
    slots: int
    timeout: float | None
    seed: int
    rank: int
    world_size: int
    ordered: bool
    copy: bool
    drop_last: bool
    ctx: Any  # how workers start: a multiprocessing context, or threads
    worker_init: Callable[[int], Any] | None
    worker_threads: int | None
    # None: a worker infers it from its first item.
    spec: BatchSpec | None
    # A map-style source's epochs, and where a state resumes them.
    sampler: EpochSampler | None
    resume: Resume | None
    # A stream: batch_size samples to a batch (0: its items are batches),
    # its shuffle buffer (0: none), and each worker's items to pass over.
    stream_rows: int
    shuffle_buffer: int
    stream_resume: StreamResume | None
    # A stream's lanes: the workers its iterators see (NOTE [ A stream's
    # lanes ] in fastq/_workers/_lanes.py); a state's, else one per worker.
    streams: int
    lanes: Lanes


def resolve(
    source: Any,
    batch_size: Any,
    workers: Any,
    slots: Any,
    spec: Any,
    ordered: Any,
    shuffle: Any,
    seed: Any,
    drop_last: Any,
    start_method: Any,
    worker_init: Any,
    timeout: Any,
    copy: Any,
    rank: Any,
    world_size: Any,
    worker_threads: Any,
    state: Any,
    worker_method: Any,
    shuffle_buffer: Any,
    cpus: int,
) -> Settings:
    """Prefetcher's arguments, as its docstring describes them; ``cpus``:
    this rank's usable CPUs."""
    is_map = is_map_style(source)
    if not is_map:
        check_stream_source(source)
    auto = _is_auto(workers, is_map)
    if auto:
        workers = min(cpus, MAX_WORKERS)
    workers = positive_int(
        "workers",
        spare_one(cpus) if workers is None else workers,
        'use workers=1 or more, or workers="auto"',
        MAX_WORKERS,
    )
    slots = positive_int(
        "slots",
        max(2, 2 * workers) if slots is None else slots,
        "use slots=1 or more (two per worker keeps every worker busy)",
        MAX_SLOTS - 1,
    )
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or timeout <= 0
    ):
        raise ConfigError(f"timeout={timeout!r}: expected seconds > 0, or None")
    if worker_init is not None and not callable(worker_init):
        raise ConfigError(
            f"worker_init={worker_init!r}: expected a callable taking the worker id"
        )
    if worker_threads is not None:
        worker_threads = positive_int(
            "worker_threads", worker_threads, "or None to leave them"
        )
    rank, world_size = resolve_ranks(rank, world_size)
    saved = state[0] if isinstance(state, list) and state else state
    if seed is None and isinstance(saved, dict):
        seed = saved.get("seed")  # checked with the rest of the state
    if seed is None:
        seed = 0 if world_size > 1 else secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed={seed!r}: expected an int or None")
    ctx = _worker_context(worker_method, start_method)

    sampler: EpochSampler | None = None
    resume: Resume | None = None
    # A callable source's state: each worker's items to pass over.
    stream_resume: StreamResume | None = None
    # A sample stream: batch_size samples to a batch (0: whole batches).
    stream_rows = 0
    known: BatchSpec | None  # None: a worker infers it
    if is_map:
        if shuffle_buffer is not None:
            raise ConfigError(
                f"shuffle_buffer={shuffle_buffer!r}: a map-style source is "
                "shuffled whole each epoch; use shuffle=True (shuffle_buffer "
                "is for streams of samples)"
            )
        rows = _map_rows(batch_size)
        # Without spec=, the workers infer it from the run's first batches
        # (NOTE [ The kept first batch ] in fastq/_faces/_first_batch.py);
        # only len() runs here.
        known = None if spec is None else BatchSpec.from_user(spec, rows)
        if known is None and not hasattr(source, "__getitem__"):
            raise ConfigError(
                f"spec=None: {type(source).__name__} has fill_batch but no "
                "__getitem__, so there is no sample to learn the batch's "
                "fields from, and fill_batch writes into arrays that must "
                "exist first; pass spec={name: (shape, dtype)} for one "
                "sample (e.g. spec={'image': ((3, 224, 224), 'uint8'), "
                "'label': ((), 'int64')}), or give the dataset a __getitem__"
            )
        sampler = EpochSampler(
            len(source),
            rows,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
        )
        if sampler.batches_per_epoch == 0:
            raise _no_batch_error(sampler)
        if state is not None:
            resume = check_state(state, sampler)
            sampler.reshard = resume.reshard
    else:
        stream_rows, shuffle_buffer = _stream_batching(
            batch_size, shuffle, drop_last, shuffle_buffer
        )
        if worker_method == "thread":
            check_thread_sharding(source, workers)
        if state is not None:
            stream_resume = check_stream_state(
                state,
                rank=rank,
                world_size=world_size,
                sample_stream=bool(stream_rows),
                shuffle_buffer=shuffle_buffer or 0,
                seed=seed,
                source=source_name(source),
            )
        warn_fewer_shards(
            source, workers if stream_resume is None else stream_resume.lanes
        )
        known = None  # a worker infers it; the source never runs here
        if spec is not None:
            known = BatchSpec.from_user(spec, stream_rows or None)

    return Settings(
        source=source,
        is_map=is_map,
        auto=auto,
        workers=workers,
        slots=slots,
        timeout=None if timeout is None else float(timeout),
        seed=seed,
        rank=rank,
        world_size=world_size,
        ordered=bool(ordered),
        copy=bool(copy),
        drop_last=bool(drop_last),
        ctx=ctx,
        worker_init=worker_init,
        worker_threads=worker_threads,
        spec=known,
        sampler=sampler,
        resume=resume,
        stream_rows=stream_rows,
        shuffle_buffer=shuffle_buffer or 0,
        stream_resume=stream_resume,
        streams=workers if stream_resume is None else stream_resume.lanes,
        lanes=Lanes.of(stream_resume, rank, world_size, workers),
    )


def spare_one(cpus: int) -> int:
    """Workers for ``cpus`` CPUs: one is left for the training loop."""
    return max(1, cpus - 1)


def _is_auto(workers: Any, is_map: bool) -> bool:
    """workers="auto", refused where workers cannot be parked."""
    if not isinstance(workers, str):
        return False
    if workers != "auto":
        raise ConfigError(
            f'workers={workers!r}: expected a positive integer or "auto"; '
            'use workers=4, say, or workers="auto"'
        )
    if not is_map:
        raise ConfigError(
            "workers=\"auto\": a stream source's pass needs every worker's "
            "stream to its end, so none can be parked; choose workers=N, or "
            "use a map-style dataset (__getitem__ and __len__)"
        )
    return True


def positive_int(name: str, value: Any, fix: str, upper: int | None = None) -> int:
    # Any integer type (numpy's included: anything with __index__), not bool.
    number = as_int(value)
    if number is None or number < 1:
        raise ConfigError(f"{name}={value!r}: expected a positive integer; {fix}")
    if upper is not None and number > upper:
        raise ConfigError(f"{name}={value!r}: at most {upper} are supported; {fix}")
    return number


def as_int(value: Any) -> int | None:
    """value as an int if it is an integer (int, numpy integers: anything
    with __index__) and not a bool; else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


_EMPTY_SOURCE = (
    "source has no samples (len(source) == 0), so an epoch has no batch; "
    "check what built the dataset (a path, a filter) and give it samples"
)


def _no_batch_error(sampler: EpochSampler) -> ConfigError:
    """Why an epoch of a map-style source has no batch, and the fix."""
    if sampler.n == 0:
        return ConfigError(_EMPTY_SOURCE)
    # A non-empty source gives every rank at least one sample unless
    # drop_last cuts them, and then a batch at least unless drop_last drops it.
    have = f"len(source)={sampler.n} samples"
    if sampler.world_size > 1:
        have += (
            f" split across world_size={sampler.world_size} ranks leave each "
            f"rank {sampler.per_rank}"
        )
    return ConfigError(
        f"batch_size={sampler.batch_size} with drop_last=True leaves no batch: "
        f"{have}, fewer than one batch; lower batch_size or set drop_last=False"
    )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={raw!r}: expected an integer (as torchrun "
            f"sets it); fix or unset it, or pass {name.lower()}= explicitly"
        ) from None


def resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None or world_size is None:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            if (
                rank is None
                and "RANK" not in os.environ
                and _env_int("WORLD_SIZE", 1) > 1
            ):
                # A launcher (Lightning's, a cluster's) that set only
                # WORLD_SIZE: taking rank 0 would make every rank read rank
                # 0's shard, silently.
                raise ConfigError(
                    f"WORLD_SIZE={os.environ['WORLD_SIZE']} is set but RANK is "
                    "not, so this process's rank is unknown. Create the "
                    "Prefetcher after torch.distributed.init_process_group() "
                    "(its rank is used then), set RANK, or pass rank= and "
                    "world_size="
                )
            rank = _env_int("RANK", 0) if rank is None else rank
            world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
    world_size = positive_int(
        "world_size", world_size, "give the number of ranks (>= 1)"
    )
    number = as_int(rank)
    if number is None or not 0 <= number < world_size:
        raise ConfigError(
            f"rank={rank!r}: expected 0 <= rank < world_size={world_size}; pass "
            "the process's rank among world_size ranks (without arguments both "
            "come from torch.distributed or the RANK and WORLD_SIZE environment "
            "variables)"
        )
    return number, world_size


def _stream_batching(
    batch_size: Any, shuffle: bool, drop_last: bool, shuffle_buffer: Any
) -> tuple[int, int]:
    """A stream's (samples per batch, 0 for whole batches; shuffle buffer
    size, 0 for none), checked."""
    if shuffle:
        raise ConfigError(
            "shuffle=True: a stream has no index to permute; pass "
            "shuffle_buffer=N (with batch_size) to mix each worker's samples "
            "through a buffer of N"
        )
    if batch_size is None:
        if drop_last or shuffle_buffer is not None:
            what = f"shuffle_buffer={shuffle_buffer!r}"
            if drop_last:
                what = "drop_last=True"
            raise ConfigError(
                f"{what}: without batch_size a stream's items are whole batches; "
                "pass batch_size=B for a stream of samples, B to a batch"
            )
        return 0, 0
    rows = positive_int("batch_size", batch_size, "or None for whole batches")
    if shuffle_buffer is None:
        return rows, 0
    return rows, positive_int("shuffle_buffer", shuffle_buffer, "or None for none")


def is_map_style(source: Any) -> bool:
    """Indexed (``__len__`` and ``__getitem__`` or ``fill_batch``) rather
    than iterated. A torch IterableDataset has both (from Dataset, and
    often a length) but is a stream."""
    data = sys.modules.get("torch.utils.data")
    if data is not None and isinstance(source, data.IterableDataset):
        return False
    return hasattr(source, "__len__") and (
        hasattr(source, "__getitem__") or hasattr(source, "fill_batch")
    )


def _map_rows(batch_size: Any) -> int:
    """A map-style source's batch_size, checked."""
    if batch_size is None:
        raise ConfigError(
            "batch_size=None: a map-style source needs batch_size, the "
            "number of samples per batch (e.g. batch_size=128)"
        )
    return positive_int("batch_size", batch_size, "e.g. batch_size=128")


def _worker_context(worker_method: Any, start_method: str | None) -> Any:
    """How workers start: processes (by ``start_method``) or threads."""
    if worker_method == "process":
        return get_context(start_method)
    if worker_method != "thread":
        raise ConfigError(
            f"worker_method={worker_method!r}: expected 'process' (the default) "
            "or 'thread'"
        )
    if start_method is not None:
        raise ConfigError(
            f"start_method={start_method!r} with worker_method='thread': thread "
            "workers start no process; drop start_method"
        )
    return ThreadContext()
