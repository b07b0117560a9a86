"""Prefetcher: the public object. Arguments, lifecycle and stats; the
consumer's loop lives in _consumer."""

from __future__ import annotations

import contextlib
import operator
import os
import secrets
import sys
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, Callable, NoReturn, TypeVar

import numpy as np

from ._autotune import AUTO_START, Autotuner, cpu_budget
from ._consumer import Feed
from ._first_batch import claim_kept, first_plan, receive_map_spec
from ._pool import WorkerPool, get_context
from ._ring import MAX_SLOTS, MAX_WORKERS, BatchViews, Ring, SlotLease, region_size
from ._sampler import EpochSampler
from ._shm import PAGE_SIZE, Region
from ._spec import BatchSpec
from ._state import (
    Resume,
    StreamResume,
    check_state,
    check_stream_state,
    make_state,
    make_stream_state,
)
from ._streams import check_stream_source, check_thread_sharding
from ._thread_workers import ThreadContext
from ._worker import WorkerConfig
from .errors import ConfigError, PrefetcherClosed, RingError

# Room in every slot for an error report, however small the batch.
_MIN_SLOT_BYTES = 64 * 1024
# How long a waiter spins before it sleeps: longer than a small batch takes
# to produce, far shorter than a scheduler tick.
_SPIN_NS = int(os.environ.get("FASTQ_SPIN_US", "50")) * 1000


_P = TypeVar("_P", bound="Prefetcher")


def _cpus_per_rank() -> int:
    """Usable CPUs (affinity, within a container's quota) shared among
    the ranks on this node (torchrun's LOCAL_WORLD_SIZE), at least 1."""
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, cpu_budget() // local)


def default_workers() -> int:
    """This rank's CPUs less one for the training loop, at least 1."""
    return max(1, _cpus_per_rank() - 1)


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


def _positive_int(name: str, value: Any, fix: str, upper: int | None = None) -> int:
    # Any integer type (numpy's included: anything with __index__), not bool.
    number = _as_int(value)
    if number is None or number < 1:
        raise ConfigError(f"{name}={value!r}: expected a positive integer; {fix}")
    if upper is not None and number > upper:
        raise ConfigError(f"{name}={value!r}: at most {upper} are supported; {fix}")
    return number


def _as_int(value: Any) -> int | None:
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


def _resolve_ranks(rank: int | None, world_size: int | None) -> tuple[int, int]:
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
    world_size = _positive_int(
        "world_size", world_size, "give the number of ranks (>= 1)"
    )
    number = _as_int(rank)
    if number is None or not 0 <= number < world_size:
        raise ConfigError(
            f"rank={rank!r}: expected 0 <= rank < world_size={world_size}; pass "
            "the process's rank among world_size ranks (without arguments both "
            "come from torch.distributed or the RANK and WORLD_SIZE environment "
            "variables)"
        )
    return number, world_size


class Prefetcher:
    """Feeds fixed-shape numpy batches produced by worker processes through
    a ring of preallocated shared-memory slots.

    Parameters
    ----------
    source : map-style dataset, callable or iterable
        A dataset with ``__len__`` and ``__getitem__`` returning one sample
        (array, scalar, or tuple/dict of them); or a stream: a zero-argument
        callable returning an iterator (a generator function), or an
        iterable object (a torch ``IterableDataset``), of which each worker
        iterates its own, sharding itself with ``get_worker_info()``.
    batch_size : int, optional
        Samples per batch; required for map-style sources. For a stream:
        its items are samples, written straight into a batch's rows (each
        worker's last batch may be short); without it, its items are whole
        batches.
    workers : int or "auto", optional
        Worker processes; default: usable CPUs - 1, at least 1. ``"auto"``
        (map-style sources): one worker per usable CPU is started, and as
        many run as keep the loop from waiting while CPUs are idle; the
        others are parked (``stats()["autotune"]`` says how many, and why).
    slots : int, optional
        Batches prefetched ahead of the consumer; default: two per worker. The
        ring holds one slot more, for the batch the loop body is using.
    spec : dict or tuple or (shape, dtype), optional
        Fields as ``{name: (shape, dtype)}`` for one item (a sample, or a
        callable's whole batch). If omitted, worker 0 infers it from its
        first item: a map-style source's first sample of the run's first
        batch, which it then delivers (the source never runs in this
        process; a ``fill_batch`` dataset's first sample is read once with
        ``__getitem__`` for it, and one without ``__getitem__`` needs it).
    ordered : bool
        Yield batches in sampler order (True) or as soon as they are ready.
    shuffle, seed, drop_last : bool, int, bool
        Per-epoch permutation from ``seed`` (random if None; 0 when
        world_size > 1 so ranks agree); ``drop_last`` drops the tail that does
        not divide evenly across ranks and the last partial batch (of a
        sample stream: each worker's short last batch).
    shuffle_buffer : int, optional
        A sample stream's shuffle (tf.data's ``shuffle(buffer_size)``): each
        worker draws every sample at random from a buffer of this many of
        its own, refilled from its stream; from ``seed``, the same for the
        same seed and number of workers, another each pass.
    start_method : {"forkserver", "spawn", "fork"}, optional
        Default: "forkserver" where available, else "spawn".
    worker_init : callable, optional
        Called as ``worker_init(worker_id)`` in each worker before it starts.
    timeout : float, optional
        Seconds to wait for one batch before FetchTimeout.
    copy : bool
        Hand out owned copies and free the slot at once.
    rank, world_size : int, optional
        Shard map-style epochs across ranks like DistributedSampler; default
        from torch.distributed when initialised, else RANK / WORLD_SIZE.
    worker_threads : int or None
        BLAS/OpenMP/torch threads per worker (default 1); None leaves them.
    worker_method : {"process", "thread"}
        Workers are processes (the default) or threads of this process:
        no pickling and no process start, for producers that release the
        GIL (decoding, numpy, I/O) or a free-threaded Python. Thread
        workers share the source object, leave this process's signals,
        thread pools (``worker_threads``) and global random state alone
        (use ``get_worker_info().rng``), and cannot be killed: ``close()``
        stops waiting for one stuck in user code, which ends on its own.
    state : dict, optional
        A ``state_dict()`` saved earlier: start where it was saved. Map-style
        sources: with its seed, the skipped batches never made; a state
        saved on another world size (any of its ranks') shards the rest of
        its epoch across this one's ranks. Callables: each worker's stream
        passes over the items it delivered (its iterator's ``skip(n)`` if
        it has one), with the same number of workers; a sample stream's
        state counts samples, and resumes with any batch size.

    Raises
    ------
    ConfigError
        An argument is invalid; the message names it and the fix.
    SpecError
        The first item cannot be described as fixed-shape numeric fields.
    WorkerError
        Without ``spec``: the source (or worker 0's ``worker_init``)
        raised before the first item was made; the worker's traceback is
        its ``remote_traceback``.
    FetchTimeout
        Without ``spec``: no first item within ``timeout``.
    WorkerDied
        Without ``spec``: the worker making the first item died.
    SharedMemoryError
        The ring does not fit in memory.
    """

    _spec: BatchSpec
    _feed: Feed
    _ring: Ring
    # workers="auto"'s controller, per engine (subclasses that build their
    # own engine have none).
    _tuner: Autotuner | None = None

    def __init__(
        self,
        source: Any,
        batch_size: int | None = None,
        workers: int | str | None = None,
        slots: int | None = None,
        spec: Any = None,
        ordered: bool = True,
        shuffle: bool = False,
        seed: int | None = None,
        drop_last: bool = False,
        start_method: str | None = None,
        worker_init: Callable[[int], Any] | None = None,
        timeout: float | None = None,
        copy: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        worker_threads: int | None = 1,
        state: dict[str, Any] | None = None,
        worker_method: str = "process",
        shuffle_buffer: int | None = None,
    ) -> None:
        self._pid = os.getpid()
        self._closed = True  # until construction completes
        self._pool: WorkerPool | None = None
        self._region: Region | None = None

        self._source = source
        self._is_map = _is_map_style(source)
        if not self._is_map:
            check_stream_source(source)
        self._auto = _is_auto(workers, self._is_map)
        if self._auto:
            workers = min(_cpus_per_rank(), MAX_WORKERS)
        workers = _positive_int(
            "workers",
            default_workers() if workers is None else workers,
            'use workers=1 or more, or workers="auto"',
            MAX_WORKERS,
        )
        slots = _positive_int(
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
            worker_threads = _positive_int(
                "worker_threads", worker_threads, "or None to leave them"
            )
        rank, world_size = _resolve_ranks(rank, world_size)
        if seed is None and isinstance(state, dict):
            seed = state.get("seed")  # checked with the rest of the state
        if seed is None:
            seed = 0 if world_size > 1 else secrets.randbits(63)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed={seed!r}: expected an int or None")
        ctx = _worker_context(worker_method, start_method)

        self._sampler: EpochSampler | None = None
        resume: Resume | None = None
        # A callable source's state: each worker's items to pass over.
        self._stream_resume: StreamResume | None = None
        # A sample stream: batch_size samples to a batch (0: whole batches).
        stream_rows = 0
        known: BatchSpec | None  # None: a worker infers it
        if self._is_map:
            if shuffle_buffer is not None:
                raise ConfigError(
                    f"shuffle_buffer={shuffle_buffer!r}: a map-style source is "
                    "shuffled whole each epoch; use shuffle=True (shuffle_buffer "
                    "is for streams of samples)"
                )
            rows = _map_rows(batch_size)
            # Without spec=, worker 0 infers it from the run's first batch
            # (NOTE [ The kept first batch ] in fastq/_first_batch.py);
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
            self._sampler = EpochSampler(
                len(source),
                rows,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                rank=rank,
                world_size=world_size,
            )
            if self._sampler.batches_per_epoch == 0:
                raise _no_batch_error(self._sampler)
            if state is not None:
                resume = check_state(state, self._sampler)
                self._sampler.reshard = resume.reshard
        else:
            stream_rows, shuffle_buffer = _stream_batching(
                batch_size, shuffle, drop_last, shuffle_buffer
            )
            if worker_method == "thread":
                check_thread_sharding(source, workers)
            if state is not None:
                self._stream_resume = check_stream_state(
                    state,
                    workers=workers,
                    rank=rank,
                    world_size=world_size,
                    sample_stream=bool(stream_rows),
                    shuffle_buffer=shuffle_buffer,
                    seed=seed,
                )
            known = None  # a worker infers it; the source never runs here
            if spec is not None:
                known = BatchSpec.from_user(spec, stream_rows or None)

        self.ordered = bool(ordered)
        self.copy = bool(copy)
        self.timeout = None if timeout is None else float(timeout)
        self.workers = workers
        self.slots = slots
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = bool(drop_last)
        self.shuffle_buffer = shuffle_buffer or 0
        self._stream_rows = stream_rows
        self._engine_args = (ctx, known, worker_init, worker_threads)
        try:
            self._start_engine(resume)
        except BaseException:
            self._teardown()
            raise
        self._closed = False

    def _start_engine(self, resume: Resume | None) -> None:
        """Starts the workers, the ring and the feed; with ``resume``, the
        workers begin at its first batch (the skipped ones are never made)."""
        ctx, known, worker_init, worker_threads = self._engine_args
        workers = self.workers

        def config(w: int, region: Any, size: int) -> WorkerConfig:
            return WorkerConfig(
                worker_id=w,
                num_workers=workers,
                source=self._source,
                is_map=self._is_map,
                spec=known,
                sampler=self._sampler,
                seed=self.seed,
                rank=self.rank,
                world_size=self.world_size,
                worker_init=worker_init,
                region=region,
                region_size=size,
                consumer_pid=self._pid,
                threads=worker_threads,
                death_signal=_in_main_thread(),
                stream_rows=self._stream_rows,
                drop_last=self.drop_last,
                shuffle_buffer=self.shuffle_buffer,
                resume_items=0 if stream is None else stream.items[w],
                first_pass=0 if stream is None else stream.pass_,
            )

        stream = self._stream_resume
        if known is None:
            # No spec=: worker 0 infers it from its first item (a map-style
            # source's: its first batch); the ring is made once it is known.
            first = None
            if self._is_map:
                assert self._sampler is not None
                first = first_plan(self._sampler, resume)
            configs = [config(w, None, 0) for w in range(workers)]
            configs[0].first_plan = first
            self._pool = WorkerPool(ctx, configs, None)
            if first is not None:
                self._spec = receive_map_spec(self._pool, first, self.timeout)
            else:
                self._spec = self._pool.receive_spec(
                    self.timeout, "sample" if self._stream_rows else "batch"
                )
            size = self._make_ring(self.slots, workers)
            assert self._region is not None
            if first is not None:
                claim_kept(self._ring, 0, first.task)
            if self._auto:  # before any worker can take a slot
                self._ring.set_active(AUTO_START)
            self._pool.send_region(self._region, size, self._spec, self._ring)
        else:
            self._spec = known
            size = self._make_ring(self.slots, workers)
            assert self._region is not None
            if resume is not None:
                assert self._sampler is not None
                self._ring.skip_tasks_to(
                    resume.epoch * self._sampler.batches_per_epoch + resume.first
                )
            if self._auto:  # before any worker can take a slot
                self._ring.set_active(AUTO_START)
            share = self._region.share()
            self._pool = WorkerPool(
                ctx, [config(w, share, size) for w in range(workers)], self._ring
            )
        self._feed = Feed(
            self._ring,
            self._pool,
            self._spec,
            self._sampler,
            ordered=self.ordered,
            timeout=self.timeout,
            copy=self.copy,
            spin_s=_SPIN_NS / 1e9,
            owner=self,
            sample_stream=bool(self._stream_rows),
            views=self._batch_views(),
        )
        if resume is not None:
            self._resume_at(resume)
        if stream is not None:
            self._feed.passes.resume_at(stream)
        if self._auto:
            feed = self._feed
            self._tuner = Autotuner(
                self._ring, workers, lambda: (feed.consumer.delivered, feed.wait_ns)
            )

    def _restart_engine(self, resume: Resume | None) -> None:
        """New workers, ring and feed, for a state the running workers
        cannot resume (a resharded epoch: they shard it otherwise; a
        callable's streams: each worker passes over what it delivered).
        Batches handed out before stay valid while referenced."""
        self._stop_engine()
        self._teardown()
        self._pool, self._region = None, None
        ctx, _, worker_init, worker_threads = self._engine_args
        self._engine_args = (ctx, self._spec, worker_init, worker_threads)
        try:
            self._start_engine(resume)
            self._engine_started()
        except BaseException:
            self.close()
            raise

    def _stop_engine(self) -> None:
        """Called before the engine is replaced: a subclass that holds the
        ring (pinned for GPU copies) lets go of it."""

    def _engine_started(self) -> None:
        """Called after the engine was replaced: a subclass takes hold of
        the new ring."""

    def _make_ring(self, slots: int, workers: int) -> int:
        slot_bytes = max(self._spec.slot_bytes, _MIN_SLOT_BYTES)
        # One slot more than asked for: the batch a `for` loop's body still
        # holds while the next one is fetched must not starve the workers.
        ring_slots = slots + 1
        size = region_size(ring_slots, workers, slot_bytes, PAGE_SIZE)
        self._region = Region.create(size)
        self._ring = Ring.create(
            self._region.mapping, ring_slots, workers, slot_bytes, PAGE_SIZE, _SPIN_NS
        )
        return self._region.size  # whole huge pages, where it has them

    # ------------------------------------------------------------ spec

    # ------------------------------------------------------- iteration

    def __len__(self) -> int:
        if self._sampler is None:
            raise TypeError("a Prefetcher over a callable source has no len()")
        return self._sampler.batches_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the current (or last) ``for`` loop iterates."""
        return self._feed.epochs.epoch

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` loop iterates epoch ``epoch`` (a resumed run:
        its order and randomness are those of that epoch). Epochs only move
        forward: going back needs a new Prefetcher."""
        sampler = self._sampler
        if sampler is None:
            raise TypeError("a Prefetcher over a callable source has no epochs")
        e = _as_int(epoch)
        if e is None or e < 0:
            raise ConfigError(f"epoch={epoch!r}: expected an int >= 0")
        feed = self._feed
        at = feed.epochs.epoch
        if e * sampler.batches_per_epoch < feed.consumer.next_task and e <= at:
            raise ConfigError(
                f"epoch={e}: this Prefetcher is already at epoch {at}, "
                "and its task stream only moves forward; call set_epoch before "
                "iterating, or create a new Prefetcher to go back"
            )
        self._resume_at(Resume(e, 0, frozenset(), None))

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Where this Prefetcher is, as a small JSON-serialisable dict: the
        epoch, and the batches of it delivered so far (a prefix in ordered
        mode, the batch numbers in unordered mode), with what the stream
        depends on (seed, dataset length, batch size, ranks). Load it with
        ``load_state_dict`` or ``Prefetcher(..., state=...)``: the rest of
        the epoch and every later one are then bit-identical to a run that
        never stopped, with any number of workers. A state saved after an
        epoch's last batch resumes at the next epoch; one saved after a
        ``break`` resumes with the rest of that epoch. A stream's state is,
        per worker, the items (a sample stream's: samples) of its stream
        delivered in the current pass."""
        self._check_open()
        feed = self._feed
        if self._sampler is None:
            return make_stream_state(
                feed.stream_place(),
                rank=self.rank,
                world_size=self.world_size,
                sample_stream=bool(self._stream_rows),
                shuffle_buffer=self.shuffle_buffer,
                seed=self.seed,
            )
        epoch, done, above = feed.epochs.place(feed.consumer.handed)
        return make_state(self._sampler, epoch=epoch, done=done, delivered=above)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``for`` loop resumes where ``state`` (from
        ``state_dict()``) was saved. A loop begun before this call ends with
        a ConfigError at its next batch (it would otherwise silently
        restart). The stream only moves forward: to go back, create a new
        Prefetcher with ``state=``."""
        self._check_open()
        feed = self._feed
        if self._sampler is None:
            self._stream_resume = check_stream_state(
                state,
                workers=self.workers,
                rank=self.rank,
                world_size=self.world_size,
                sample_stream=bool(self._stream_rows),
                shuffle_buffer=self.shuffle_buffer,
                seed=self.seed,
            )
            feed.end_loops(ConfigError, _LOADED_MID_LOOP)
            self._restart_engine(None)  # each worker passes over its items
            return
        sampler = self._sampler
        resume = check_state(state, sampler)
        epoch, first = resume.epoch, resume.first
        if epoch * sampler.batches_per_epoch + first < feed.consumer.next_task:
            raise ConfigError(
                f"state: epoch {epoch}, batch {first} is behind this "
                f"Prefetcher (at epoch {feed.epochs.epoch}), and its task stream only "
                "moves forward; create a new Prefetcher with state=..."
            )
        feed.end_loops(ConfigError, _LOADED_MID_LOOP)
        if resume.reshard is not None and resume.reshard != sampler.reshard:
            # The workers shard that epoch otherwise: they start afresh.
            sampler.reshard = resume.reshard
            self._restart_engine(resume)
            return
        self._resume_at(resume)

    def _resume_at(self, resume: Resume) -> None:
        self._feed.epochs.resume_at(resume)

    @property
    def dataset(self) -> Any:
        """The source, as given (DataLoader's ``dataset``)."""
        return self._source

    @property
    def spec(self) -> BatchSpec:
        return self._spec

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        if self._is_map:
            return self._feed.begin_epoch()
        return self._feed.begin_pass()

    def _batch_views(self) -> BatchViews | None:
        """How the consumer makes a plain batch in compiled code; None where
        each batch takes the full path (copied out, jagged or packed)."""
        spec = self._spec
        if self.copy or not isinstance(spec, BatchSpec) or spec.jagged:
            return None
        if type(self).make_batch is not Prefetcher.make_batch:
            host = weakref.proxy(self)  # the views must not keep self alive
            return spec.batch_views(lambda arrays: host.make_batch(arrays))
        return spec.batch_views(None)

    # ------------------------------------------------- what its Feed calls
    # (the FeedOwner protocol in fastq/_consumer.py; not for users)

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        """Turns one batch's leaf arrays (slot views, or copies) into what
        the iteration yields. Subclasses convert them (fastq.torch)."""
        return self._spec.unflatten(arrays)

    def unpack(self, lease: SlotLease) -> Any:
        """A packed slot's batch: only a DataLoader's engine packs them."""
        raise RingError(
            f"slot {lease.slot} holds a packed batch, but this "
            f"{type(self).__name__}'s slots hold fixed fields"
        )

    def reclaim_slots(self) -> None:
        """Called before the consumer sleeps waiting for a batch: a subclass
        that holds slots for pending work (a GPU copy) returns what it can."""

    def fail(self, exc: BaseException) -> NoReturn:
        """Closes this Prefetcher, then raises ``exc``."""
        self.close()
        raise exc

    # ------------------------------------------------------- lifecycle

    def _check_open(self) -> None:
        if self._closed:
            raise PrefetcherClosed("this Prefetcher is closed; create a new one")
        if os.getpid() != self._pid:
            raise PrefetcherClosed(
                f"this Prefetcher belongs to process {self._pid}; a forked "
                f"child (pid {os.getpid()}) cannot iterate it (its batches "
                "and slots are the parent's). Create a Prefetcher in the child"
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stops and reaps every worker (bounded: about a second). Batches
        already handed out stay valid while referenced."""
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        feed = getattr(self, "_feed", None)
        if feed is not None:
            # Every open `for` loop ends; the current one with an error, so
            # that a close() from another thread cannot pass for an end.
            feed.close_loops(
                "the Prefetcher was closed while this loop was running (by "
                "another thread, or by close() in the loop); create a new one "
                "to go on"
            )
        self._teardown()

    def _teardown(self) -> None:
        tuner, self._tuner = self._tuner, None
        if tuner is not None:
            tuner.stop()  # no thread of this Prefetcher outlives close()
        try:
            if self._pool is not None:
                self._pool.close()
            elif getattr(self, "_ring", None) is not None:
                self._ring.close()
        finally:
            # Also after a Ctrl+C that cut the workers' grace short.
            if self._region is not None:
                self._region.close()

    def __enter__(self: _P) -> _P:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        # Its workers, ring and batches belong to this process: a copy
        # elsewhere could only take that process's batches or leak them.
        raise TypeError(
            f"a {type(self).__name__} cannot be pickled or sent to another "
            "process (its workers, shared ring and batches belong to the "
            "process that created it). Send the dataset (and the arguments) "
            "instead and create the Prefetcher in the process that iterates it"
        )

    def __del__(self) -> None:
        if getattr(self, "_closed", True) or os.getpid() != getattr(self, "_pid", -1):
            return
        warnings.warn(
            "fastq.Prefetcher was not closed; use it as a context manager or "
            "call close()",
            ResourceWarning,
            stacklevel=2,
        )
        with contextlib.suppress(Exception):  # never raise from __del__
            self.close()

    # ------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        """Throughput, the consumer's wait share, ring occupancy, per worker.

        Returns
        -------
        dict
            ``batches``, ``bytes``, ``seconds`` (since the first batch),
            ``batches_per_s``, ``gb_per_s``, ``wait_share`` (fraction of that
            time the consumer spent waiting), ``mean_ready`` (batches ready
            when one was taken), ``slots``, ``pages`` (what backs the ring:
            ``kind`` "hugetlb", "transparent huge pages" or "base pages",
            its ``bytes``, and the ``huge_bytes`` this process maps with huge
            pages), ``workers``: a list of dicts with ``pid``, ``batches``,
            ``busy_s``, ``wait_s`` and ``task``, and ``autotune`` (None
            unless ``workers="auto"``): ``workers`` running, ``pool``
            started, ``why``, and ``decisions``, each with ``at_s``,
            ``workers`` and ``why``.
        """
        feed = self._feed
        c = feed.consumer
        n = c.delivered
        elapsed = (time.monotonic_ns() - c.t_first_ns) / 1e9 if n else 0.0
        per_worker = []
        if self._pool is not None:
            held = dict(self._pool.holders())
            for w, pid in enumerate(self._pool.pids):
                batches, busy, wait, _ = self._ring.worker_stats(w)
                per_worker.append(
                    {
                        "pid": pid,
                        "batches": batches,
                        "busy_s": busy / 1e9,
                        "wait_s": wait / 1e9,
                        "task": held.get(w, -1),
                    }
                )
        return {
            "batches": n,
            "bytes": c.delivered_bytes,
            "seconds": elapsed,
            "batches_per_s": n / elapsed if elapsed > 0 else 0.0,
            "gb_per_s": c.delivered_bytes / elapsed / 1e9 if elapsed > 0 else 0.0,
            "wait_share": min(1.0, feed.wait_ns / 1e9 / elapsed)
            if elapsed > 0
            else 0.0,
            "mean_ready": c.occupancy / n if n else 0.0,
            "slots": self.slots,
            "pages": self._pages(),
            "workers": per_worker,
            "autotune": None if self._tuner is None else self._tuner.report(),
        }

    def _pages(self) -> dict[str, Any]:
        """What backs the ring: its kind, and the bytes of it this process
        maps with huge pages (from /proc/self/smaps)."""
        region = self._region
        if region is None:
            return {"kind": None, "bytes": 0, "huge_bytes": 0}
        return {
            "kind": region.pages,
            "bytes": region.size,
            "huge_bytes": region.huge_bytes(),
        }


_LOADED_MID_LOOP = (
    "load_state_dict() was called after this loop began; call iter() again "
    "(a new for loop) to resume from the state"
)


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
    rows = _positive_int("batch_size", batch_size, "or None for whole batches")
    if shuffle_buffer is None:
        return rows, 0
    return rows, _positive_int("shuffle_buffer", shuffle_buffer, "or None for none")


def _is_map_style(source: Any) -> bool:
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
    return _positive_int("batch_size", batch_size, "e.g. batch_size=128")


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


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
