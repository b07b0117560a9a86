"""Prefetcher: the public object. Its arguments (checked in _arguments),
its state and its epochs; the machinery is its engine (_engine, _launch)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

from .._core._ring import Ring
from .._core._shm import Region
from .._layout._spec import BatchSpec
from .._loop._autotune import cpu_budget
from .._loop._consumer import Feed
from .._loop._engine import Engine, PlainBatches, SlotPinning
from .._make._state import (
    Lanes,
    Resume,
    check_state,
    check_stream_state,
    make_state,
    make_stream_state,
)
from .._make._streams import source_name
from .._workers._pool import WorkerPool
from ..errors import ConfigError
from ._arguments import Settings, as_int, resolve, spare_one
from ._face import Face
from ._launch import launch

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
    return spare_one(_cpus_per_rank())


class _Setting:
    """A Prefetcher's attribute, as its arguments resolved it (read-only:
    the engine runs with it)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, face: Any, owner: type | None = None) -> Any:
        if face is None:
            return self
        return getattr(face._settings, self.name)


class Prefetcher(Face):
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
        Worker processes; default: usable CPUs - 1 (within a container's
        CPU quota), at least 1. ``"auto"`` (map-style sources): one worker
        per usable CPU is started, and as many run as keep the loop from
        waiting while CPUs are idle; the others are parked
        (``stats()["autotune"]`` says how many, and why).
    slots : int, optional
        Batches prefetched ahead of the consumer; default: two per worker. The
        ring holds one slot more, for the batch the loop body is using.
    spec : dict or tuple or (shape, dtype), optional
        One item's fields: ``{name: (shape, dtype)}``, a tuple of
        ``(shape, dtype)``, or one ``(shape, dtype)``; a variable-length
        field is a ``fastq.Jagged``. An item is a sample for map-style
        sources and sample streams, a whole batch for streams without
        ``batch_size``. If omitted, a worker infers it and the source never
        runs in this process (only ``len()`` is read here): every worker
        starts on a batch of its own at once, as DataLoader's do (the
        run's first batches, or a resumed state's next ones), seeded as
        always; the spec comes from the first sample any of them finishes,
        and those batches are delivered, not made again; for a stream,
        from the first item any worker makes. A batch whose first sample
        fails raises at its turn, as with ``spec``; only when every
        worker's first sample fails is there nothing to lay the slots out
        from, and the constructor raises the lowest batch's error (see
        Raises). A ``fill_batch`` dataset has no sample to give: its first
        sample is read once with ``__getitem__`` in a worker to lay out
        the slots (``spec`` skips that), and one without ``__getitem__``
        needs ``spec``.
    ordered : bool
        Yield batches in sampler order (True) or as soon as they are ready.
    shuffle : bool
        A new permutation of a map-style source each epoch, from
        ``SeedSequence(seed, epoch)``. A stream has no index to permute
        (use ``shuffle_buffer``).
    seed : int, optional
        Seeds every epoch's permutation and every batch's randomness;
        random if None, 0 when world_size > 1 so that ranks agree.
    drop_last : bool
        Drop the tail that does not divide evenly across ranks and the last
        partial batch (of a sample stream: each worker's short last batch).
    start_method : str, optional
        ``"fork"``, ``"forkserver"`` or ``"spawn"``. By default workers
        fork from this process, as DataLoader's do on Linux, on every
        Python version and also once CUDA is initialised (workers never
        touch CUDA). Under spawn and forkserver the source and
        ``worker_init`` are pickled with cloudpickle: lambdas, closures and
        classes of a notebook or ``python -c`` travel by value, a script's
        top-level classes by name (workers run the script again, as
        DataLoader's do), multiprocessing objects must come from that start
        method's context (``multiprocessing.get_context("spawn").Value(...)``),
        and open files and sockets are refused.
    worker_init : callable, optional
        Called as ``worker_init(worker_id)`` in each worker before it starts.
    timeout : float, optional
        Seconds to wait for one batch before FetchTimeout.
    copy : bool
        Hand out owned copies and free the slot at once.
    rank, world_size : int, optional
        Shard map-style epochs across ranks like DistributedSampler; default
        from torch.distributed when initialised, else RANK / WORLD_SIZE.
        ``len()`` is batches per epoch on this rank.
    worker_threads : int or None
        BLAS/OpenMP/torch threads per worker (default 1); None leaves them.
    state : dict, optional
        A ``state_dict()`` saved earlier: start where it was saved. Map-style
        sources: with its seed, the skipped batches never made; a state
        saved on another world size (any of its ranks') shards the rest of
        its epoch across this one's ranks. Streams: each of the state's
        workers (lanes, which any number of worker processes runs, in the
        same order) passes over the items it delivered (its iterator's
        ``skip(n)`` if it has one); a sample stream's state counts
        samples, and resumes with any batch size. On another number of
        ranks, each new rank passes the list of the states every old rank
        saved at one step: their workers' streams (each told the rank and
        worker it was saved as) are dealt out to the new ranks.
    worker_method : str
        ``"process"`` (the default) or ``"thread"``: workers are processes
        or threads of this process. Threads need no pickling and no process
        start, for producers that release the GIL (decoding, numpy, I/O)
        or a free-threaded Python. Thread workers share the source object,
        leave this process's signals, thread pools (``worker_threads``) and
        global random state alone (use ``get_worker_info().rng``), and
        cannot be killed: ``close()`` stops waiting for one stuck in user
        code, which ends on its own.
    shuffle_buffer : int, optional
        A sample stream's shuffle (tf.data's ``shuffle(buffer_size)``): each
        worker draws every sample at random from a buffer of this many of
        its own, refilled from its stream; from ``seed``, the same for the
        same seed and number of workers, another each pass.

    Raises
    ------
    ConfigError
        An argument is invalid; the message names it and the fix. Without
        ``spec``: also a stream that yields no item in any worker.
    SpecError
        The first item cannot be described as fixed-shape numeric fields.
    WorkerError
        Without ``spec``: every worker's first item failed (the source or
        ``worker_init`` raised), so no layout could be learnt; the lowest
        batch's error (of a ``worker_init``: the lowest worker's) is
        raised, whichever came first, with the worker's traceback as its
        ``remote_traceback``.
    FetchTimeout
        Without ``spec``: no first item within ``timeout``.
    WorkerDied
        Without ``spec``: the workers died before any first item was
        made.
    SharedMemoryError
        The ring does not fit in memory.
    """

    _spec: BatchSpec
    _settings: Settings
    # Said of one dropped or left open at exit (NOTE [ A face left open is
    # closed before the interpreter's teardown ] in fastq/_faces/_face.py),
    # unless its last loop held it.
    _unclosed_warning = (
        "fastq.Prefetcher was not closed; use it as a context manager or call close()"
    )

    # The arguments as resolved (defaults filled in), one place for each.
    ordered = _Setting()
    copy = _Setting()
    timeout = _Setting()
    workers = _Setting()
    slots = _Setting()
    seed = _Setting()
    rank = _Setting()
    world_size = _Setting()
    drop_last = _Setting()
    shuffle_buffer = _Setting()

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
        state: dict[str, Any] | list[dict[str, Any]] | None = None,
        worker_method: str = "process",
        shuffle_buffer: int | None = None,
    ) -> None:
        self._pid = os.getpid()
        self._closed = True  # until construction completes
        self._engine = Engine()

        settings = self._settings = resolve(
            source,
            batch_size,
            workers,
            slots,
            spec,
            ordered,
            shuffle,
            seed,
            drop_last,
            start_method,
            worker_init,
            timeout,
            copy,
            rank,
            world_size,
            worker_threads,
            state,
            worker_method,
            shuffle_buffer,
            _cpus_per_rank(),
        )
        self._stream_resume = settings.stream_resume  # a loaded state replaces it
        self._start_engine(settings.resume)
        self._opened()

    def _start_engine(self, resume: Resume | None) -> None:
        self._engine, self._spec = launch(
            self._settings,
            resume,
            self._stream_resume,
            pid=self._pid,
            batches=self._batches,
            pinning=self._pinning(),
        )
        if resume is not None:
            self._resume_at(resume)

    def _restart_engine(self, resume: Resume | None) -> None:
        """A new engine, for a state the running workers cannot resume (a
        resharded epoch: they shard it otherwise; a callable's streams:
        each worker passes over what it delivered). Batches handed out
        before stay valid while referenced."""
        self._engine.close()
        self._settings.spec = self._spec  # known now: no first item to wait for
        try:
            self._start_engine(resume)
        except BaseException:
            self.close()
            raise

    def _pinning(self) -> Callable[[], SlotPinning] | None:
        """What page-locks the ring for a face that hands out batches to a
        device (fastq.torch); plain numpy batches need none."""
        return None

    # The engine's parts, as the consumer's code and the tests reach them.

    @property
    def _pool(self) -> WorkerPool | None:
        return self._engine.pool

    @property
    def _region(self) -> Region | None:
        return self._engine.region

    @property
    def _ring(self) -> Ring:
        assert self._engine.ring is not None
        return self._engine.ring

    @property
    def _feed(self) -> Feed:
        assert self._engine.feed is not None
        return self._engine.feed

    # ------------------------------------------------------------ spec

    # ------------------------------------------------------- iteration

    def __len__(self) -> int:
        if self._settings.sampler is None:
            raise TypeError("a Prefetcher over a callable source has no len()")
        return self._settings.sampler.batches_per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the current (or last) ``for`` loop iterates."""
        return self._feed.epochs.epoch

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` loop iterates epoch ``epoch`` (a resumed run:
        its order and randomness are those of that epoch). Epochs only move
        forward: going back needs a new Prefetcher."""
        sampler = self._settings.sampler
        if sampler is None:
            raise TypeError("a Prefetcher over a callable source has no epochs")
        e = as_int(epoch)
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
        per worker its iterators see (a lane), the items (a sample
        stream's: samples) of its stream delivered in the current pass; it
        resumes on any number of worker processes (NOTE [ A stream's
        lanes ] in fastq/_workers/_lanes.py)."""
        self._check_open()
        feed = self._feed
        if self._settings.sampler is None:
            return make_stream_state(
                feed.stream_place(),
                rank=self.rank,
                world_size=self.world_size,
                sample_stream=bool(self._settings.stream_rows),
                shuffle_buffer=self.shuffle_buffer,
                seed=self.seed,
                source=source_name(self._settings.source),
                lanes=self._settings.lanes,
            )
        epoch, done, above = self._epoch_place()
        return make_state(
            self._settings.sampler, epoch=epoch, done=done, delivered=above
        )

    def _epoch_place(self) -> tuple[int, int, list[int] | None]:
        """Where a map-style source's state saved now resumes: what the
        loop was handed (fastq.torch's decode stage takes a batch ahead)."""
        return self._feed.epoch_place()

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """The next ``for`` loop resumes where ``state`` (from
        ``state_dict()``) was saved. A loop begun before this call ends with
        a ConfigError at its next batch (it would otherwise silently
        restart). The stream only moves forward: to go back, create a new
        Prefetcher with ``state=``."""
        self._check_open()
        feed = self._feed
        if self._settings.sampler is None:
            self._stream_resume = resume_stream = check_stream_state(
                state,
                rank=self.rank,
                world_size=self.world_size,
                sample_stream=bool(self._settings.stream_rows),
                shuffle_buffer=self.shuffle_buffer,
                seed=self.seed,
                source=source_name(self._settings.source),
            )
            self._settings.streams = resume_stream.lanes
            self._settings.lanes = Lanes.of(
                resume_stream, self.rank, self.world_size, self.workers
            )
            feed.end_loops(ConfigError, _LOADED_MID_LOOP)
            self._restart_engine(None)  # each lane passes over its items
            return
        sampler = self._settings.sampler
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
        return self._settings.source

    @property
    def spec(self) -> BatchSpec:
        return self._spec

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        # Each loop holds this face (NOTE [ A loop holds its face ] in
        # fastq/_loop/_consumer.py): `for b in Prefetcher(...)` names none.
        if self._settings.is_map:
            return self._feed.begin_epoch(self)
        return self._feed.begin_pass(self)

    def _batches(self, spec: BatchSpec, engine: Engine) -> PlainBatches:
        """What this face hands out for each batch (fastq.torch: tensors)."""
        return PlainBatches(spec)

    # ------------------------------------------------------- lifecycle

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
            its ``bytes``, the ``huge_bytes`` this process maps with huge
            pages, and ``settled``: False while a thread still makes the
            pages huge and maps them, after the ring is handed over),
            ``workers``: a list of dicts with ``pid``, ``batches``,
            ``busy_s``, ``wait_s`` and ``task``, ``copied_batches``
            (fastq.torch.DataLoader: batches copied out of the ring because
            the loop kept more than the slots, as ``list(loader)`` does),
            ``autotune`` (None
            unless ``workers="auto"``): ``workers`` running, ``pool``
            started, ``why``, and ``decisions``, each with ``at_s``,
            ``workers`` and ``why``; and ``pinned`` (None unless the ring
            is page-locked): ``registered`` (all of the ring; it is
            page-locked slot by slot, first slot first),
            ``registered_bytes`` (so far), ``loop_synchronizes`` (the
            times the loop's thread waited for the GPU on the ring's
            account: only ``close()`` does), ``device_held`` and
            ``peak_device_held`` (slots the loop released that wait for
            the GPU to read them, now and at most), ``copied_batches``
            (copied because the loop kept too many) and
            ``workers_slot_wait_s`` (the workers' time waiting for a free
            slot).
        """
        return self._engine.stats(self.slots)


_LOADED_MID_LOOP = (
    "load_state_dict() was called after this loop began; call iter() again "
    "(a new for loop) to resume from the state"
)
