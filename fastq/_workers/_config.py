"""A worker's configuration: everything a worker needs, pickled once per
worker where workers do not fork, with the user's objects apart from the
rest (a worker that cannot rebuild them says why where the consumer reads
it)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any, Callable

from .._core._memfd import SharedFd
from .._core._plan import Plan, PlanLayout
from .._layout._spec import BatchSpec
from .._make._sampler import EpochSampler
from ._handoff import handoff_for_workers
from ._shared_arrays import Handoff, load_for_worker, read_beside

# WorkerConfig fields that hold user objects.
_USER_FIELDS = ("source", "worker_init")
# Starts what a worker that cannot start writes into its stack file.
STARTUP_NOTE = b"fastq: cannot start\n"


@dataclass
class WorkerConfig:
    """Everything a worker needs; pickled once per worker under spawn."""

    worker_id: int
    num_workers: int
    source: Any
    is_map: bool
    spec: BatchSpec | None  # None: worker 0 infers it, the consumer sends it
    sampler: EpochSampler | None
    seed: int
    rank: int
    world_size: int
    worker_init: Callable[[int], Any] | None
    region: SharedFd | None  # None: sent over `channel` once the spec is known
    region_size: int
    consumer_pid: int
    threads: int | None
    death_signal: bool  # the consumer's main thread started us: PDEATHSIG is exact
    stack_file: SharedFd | None = None  # where SIGUSR1 dumps the Python stack
    channel: Any = None  # without a region: a Connection to the consumer
    # Planned sources (the consumer runs the sampler): where the plans lie
    # (sent with the region), and the most indices a plan holds (to size
    # slots from batch 0). Planned and map-style sources without a spec:
    # the task whose batch worker 0 makes first, to infer the spec from.
    plan: PlanLayout | None = None
    first_plan: Plan | None = None
    max_rows: int = 0
    # Packed slots (fastq._layout._packing): the source is a PackedSource.
    packed: bool = False
    # A stream source (fastq._make._streams): with stream_rows, its items are
    # samples, that many to a batch (0: whole batches); each worker's short
    # last batch dropped with drop_last; mixed through a shuffle buffer of
    # that many samples (0: none).
    stream_rows: int = 0
    drop_last: bool = False
    shuffle_buffer: int = 0
    # A stream source's workers as its iterators see them (NOTE [ A
    # stream's lanes ] in fastq/_workers/_lanes.py): `streams` of them
    # (0: one per worker process), this process running those whose id is
    # its own modulo num_workers.
    streams: int = 0
    # Each lane as its iterator sees it, (rank, id) of lane_world ranks of
    # lane_workers workers (a state resumed on another number of ranks);
    # None: lane k is (rank, k) of world_size ranks of `streams`.
    lane_ids: list[tuple[int, int]] | None = None
    lane_workers: int = 0
    lane_world: int = 0
    # A stream source resumed from a state: the items of each lane's stream
    # delivered before it (one count per lane; None: none), which its first
    # pass passes over, and the pass number the ring's first pass stands for.
    resume_items: list[int] | None = None
    # A stateful source's own state at each lane's place (None where it
    # has none): loaded into the lane's copy instead of passing over items.
    resume_states: list[Any] | None = None
    # The first lane's first item, made before the ring, came from its
    # loaded state (loaded into `first_source`, a copy of the source): the
    # lane starts there, passing over nothing.
    first_resumed: bool = False
    first_source: Any = None
    first_pass: int = 0
    # A packed stream delivered in order: the workers' items come in turn
    # (fastq/_core/_turns.py), this worker's from `first_turn` in the ring's
    # first pass (its first batches that failed before the ring existed
    # used the turns before it).
    turns: bool = False
    first_turn: int = 0
    # A thread of the consumer's process (fastq/_workers/_thread_workers.py): the
    # process, its signals, thread pools and global random state are the
    # training loop's, and stay as they are.
    in_thread: bool = False
    # The source and worker_init as pickled for spawn and forkserver workers,
    # shared by the configs of a pool (fastq._workers._shared_arrays.Handoff).
    handoff: Handoff | None = None

    def lane_view(self, lane: int) -> tuple[int, int, int, int]:
        """(rank, id, workers, world size) that lane ``lane``'s iterator
        sees (fastq.get_worker_info(), torch's)."""
        workers = self.streams or self.num_workers
        if self.lane_ids is None or lane >= len(self.lane_ids):
            # (A process with no lane sees no iterator: its own id.)
            return self.rank, lane, workers, self.world_size
        rank, ident = self.lane_ids[lane]
        return rank, ident, self.lane_workers, self.lane_world

    # The user's objects travel pickled apart, inside this config's pickle
    # (spawn, forkserver): a worker that cannot rebuild them leaves the
    # reason where the consumer reads it, instead of dying with it on
    # stderr only.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # In one pickle, so objects they share stay shared (a worker_init
        # that is a method of the dataset runs on the worker's dataset);
        # made once for all the pool's workers, with large arrays in shared
        # memory. Descriptors inside them still reach the worker (_handoff).
        user = tuple(state.pop(n) for n in _USER_FIELDS)
        # (Without a pool's handoff, no one would close a memfd of the
        # pickle: it travels inline.)
        handoff = state.pop("handoff") or handoff_for_workers(user, beside=False)
        state["_user"] = handoff.payload()
        if not handoff.spills:
            return state
        # The rest beside the start pipe too (the first batch's indices
        # grow with batch_size): NOTE [ The pickle beside the pipe ] in
        # fastq/_workers/_shared_arrays.py. Pickled here, while multiprocessing
        # starts the worker, so that its descriptors reach it as they would.
        config = reduction.ForkingPickler.dumps(state)
        return {"_beside": handoff.beside(config, "fastq-worker-config")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "_beside" in state:
            state = read_beside(state["_beside"])
        data, fds, descriptors = state.pop("_user")
        state["handoff"] = None
        self.__dict__.update(state)
        try:
            values = load_for_worker(data, fds, descriptors)
        except Exception as exc:
            _leave_startup_note(self.stack_file, "source", exc)
            raise
        for name, value in zip(_USER_FIELDS, values):
            setattr(self, name, value)


def _leave_startup_note(
    stack_file: SharedFd | None, name: str, exc: BaseException
) -> None:
    """Tells the consumer, through the worker's stack file, that it could
    not rebuild the user object in field `name`, and why."""
    if stack_file is None:
        return
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a __str__ that fails too
        text = type(exc).__name__
    what = "the source" if name == "source" else name
    note = (
        f"it could not unpickle {what} ({text}). Spawn and forkserver workers "
        "rebuild it in a fresh interpreter: every module it uses must be "
        "importable there (on sys.path, not only added to the consumer's), and "
        "its __setstate__ must work there; or let workers fork: leave "
        "start_method unset (or pass start_method='fork')"
    )
    with contextlib.suppress(OSError):
        os.pwrite(stack_file.fd, STARTUP_NOTE + note.encode(errors="replace"), 0)
