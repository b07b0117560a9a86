"""A stream's lanes: the workers a stream source's iterators see, whose
number a state fixes, run by however many worker processes there are."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from .._make._seeding import mix_seed
from .._make._state import resume_turn
from .._make._worker_info import WorkerInfo, _set_worker_info
from ._worker_setup import NOTHING, TORCH_SEED_MASK, keeps_place, seed_globals

if TYPE_CHECKING:
    from ._config import WorkerConfig

# NOTE [ A stream's lanes ]
# The order of a stream is a function of its lanes, never of the worker
# processes. Lane v of S is an iterator that get_worker_info() (fastq's,
# and torch's for a torch IterableDataset) tells id v of S workers, so it
# reads the shard DataLoader's worker v of S would read. Process p of P
# runs lanes p, p + P, p + 2P, ... (none if p >= S). In order, lane v's
# k-th item is task k * S + v of its pass (fastq/_core/_turns.py): what
# DataLoader's in_order gives with S workers. A process makes its lanes'
# tasks in increasing order, so the task the consumer waits for is always
# made or on its way, as with one lane per process. A state counts each
# lane's items; loaded on any number of processes, each lane passes over
# its own, and the rest of the pass comes in the same order, every later
# pass too (S stays the state's). A lane's global generators (random,
# numpy, torch) are its own: seeded from (seed, lane) as a process's are
# from (seed, worker), and swapped in when its process turns to it, so an
# iterator that draws from them draws what it would alone; each pass
# seeds them again, from (seed, pass, lane), so that a pass resumed alone
# draws what it drew after the passes before. S defaults to
# the number of processes: then a process runs one lane, swaps nothing,
# and is the worker it always was.


class Lane:
    """One lane of a process: its iterator in the current pass and where
    it is in it."""

    __slots__ = (
        "drawn",
        "ended",
        "held",
        "id",
        "info",
        "it",
        "live",
        "pass_source",
        "reported",
        "rng",
        "skip",
        "source",
        "state",
        "torch_info",
        "turn",
    )

    def __init__(
        self, lane: int, info: WorkerInfo, torch_info: Any, source: Any
    ) -> None:
        self.id = lane
        # Its source: the worker's, or a copy of its own where the source
        # keeps its place itself (a Stateful dataset), and this pass's (a
        # copy with a saved state loaded, in a resumed pass).
        self.source = self.pass_source = source
        self.state: Any = None  # a saved state to load, in a resumed pass
        self.info = info
        self.torch_info = torch_info
        self.rng: tuple[Any, Any, Any] | None = None  # its generators, swapped out
        self.it: Iterator[Any] | None = None
        self.held: Any = NOTHING  # an item made before the ring existed
        self.skip = 0  # items of a resumed pass to pass over first
        self.turn = 0  # with turns: its next one
        self.live = True  # its stream has not ended in this pass
        self.drawn = 0  # a sample stream's samples taken before this batch
        self.ended = False  # a sample stream ended inside its last batch
        self.reported = False  # a worker_init error was reported for it


class Lanes:
    """The lanes a worker process runs, and the one whose turn it is:
    ``enter`` makes a lane's worker info (and generators) current."""

    def __init__(self, cfg: WorkerConfig, info: WorkerInfo) -> None:
        self.cfg = cfg
        self.count = cfg.streams or cfg.num_workers
        self.in_thread = cfg.in_thread
        ids = range(cfg.worker_id, self.count, cfg.num_workers)
        # Swapped only where a process runs several lanes: a thread leaves
        # the process's generators alone.
        self.own_globals = not cfg.in_thread and len(ids) > 1
        self._torch = None if cfg.in_thread else _torch_worker_module()
        mine = None if self._torch is None else self._torch._worker_info
        self.lanes = []
        for v in ids:
            source = cfg.source
            if v != cfg.worker_id and keeps_place(source):
                source = source.for_lane()
            own, torch_info = self._lane_infos(v, info, mine, source)
            self.lanes.append(Lane(v, own, torch_info, source))
        self.current = self.lanes[0] if self.lanes else None
        self._next = 0  # round robin without turns
        self.pass_ = cfg.first_pass  # the pass number that seeds the lanes

    def _lane_infos(
        self, lane: int, info: WorkerInfo, torch_info: Any, source: Any
    ) -> tuple[WorkerInfo, Any]:
        if lane == self.cfg.worker_id:
            return info, torch_info
        rank, ident, workers, world = self.cfg.lane_view(lane)
        own = dataclasses.replace(
            info, id=ident, num_workers=workers, rank=rank, world_size=world, _rng=None
        )
        if torch_info is not None:
            dataset = torch_info.dataset
            if source is not self.cfg.source:
                dataset = getattr(source, "dataset", dataset)
            torch_info = type(torch_info)(
                id=ident,
                num_workers=workers,
                seed=mix_seed(self.cfg.seed, 1 << 33, ident) & TORCH_SEED_MASK,
                dataset=dataset,
            )
        return own, torch_info

    def begin_pass(self, ring_pass: int) -> None:
        """A pass begins: every lane opens its stream afresh, with its
        generators seeded for the pass. The ring's first pass is the one a
        state resumes (its generators seeded as the process started), and
        the one whose first turns a worker used before the ring existed."""
        cfg = self.cfg
        ring_pass_0 = ring_pass == 0
        if not ring_pass_0:
            self.pass_ = cfg.first_pass + ring_pass
            for lane in self.lanes:
                lane.rng = None
            current = self.current
            if current is not None and not self.in_thread:
                seed_globals(cfg.seed, current.info.id, self.pass_)
        resume = cfg.resume_items if ring_pass_0 else None
        states = cfg.resume_states if ring_pass_0 else None
        rows = cfg.stream_rows
        for k, lane in enumerate(self.lanes):
            lane.it, lane.held = None, NOTHING
            lane.pass_source = lane.source
            lane.state = None if states is None else states[lane.id]
            lane.live, lane.drawn, lane.ended, lane.reported = True, 0, False, False
            lane.skip = 0 if resume is None else resume[lane.id]
            lane.turn = resume_turn(lane.skip, rows)
            if ring_pass_0 and k == 0:
                lane.turn += cfg.first_turn
                if cfg.first_resumed:  # its first item came after its state
                    lane.skip, lane.state = 0, None
                    # from the copy it was loaded into: the lane's from now on
                    lane.source = lane.pass_source = cfg.first_source
        self._next = 0

    def next_lane(self, turns: bool) -> Lane | None:
        """The live lane to make the next item: in turns, the one whose
        task is lowest; else the next in round robin. None: none is live."""
        lanes = self.lanes
        n = len(lanes)
        if n == 1:  # one lane a process, the default: no list per batch
            return lanes[0] if lanes[0].live else None
        if turns:
            live = [lane for lane in lanes if lane.live]
            return min(live, key=lambda lane: (lane.turn, lane.id)) if live else None
        for k in range(n):
            lane = lanes[(self._next + k) % n]
            if lane.live:
                self._next = (self._next + k + 1) % n
                return lane
        return None

    def enter(self, lane: Lane) -> None:
        """Makes ``lane`` the one get_worker_info() (and the generators)
        answer for."""
        current = self.current
        if lane is current:
            return
        if self.own_globals:
            assert current is not None
            current.rng = _save_globals()
            if lane.rng is None:
                seed_globals(self.cfg.seed, lane.info.id, self.pass_)
            else:
                _restore_globals(lane.rng)
        _set_worker_info(lane.info, self.in_thread)
        if self._torch is not None:
            self._torch._worker_info = lane.torch_info
        self.current = lane


def resume_source(lane: Lane) -> None:
    """Before a resumed lane opens its stream: a stateful source loads the
    lane's saved state into a copy, instead of the lane's passing over its
    items. The copy is the lane's from then on, as a DataLoader worker's
    dataset keeps a loaded state: its next passes go on from where this
    one leaves it (an epoch it counts, say)."""
    if lane.state is None or not keeps_place(lane.source):
        return
    source = lane.source.for_lane()
    source.load_lane_state(lane.state)
    lane.source = lane.pass_source = source
    lane.state = None
    lane.it, lane.held, lane.skip = None, NOTHING, 0


def _torch_worker_module() -> Any:
    return sys.modules.get("torch.utils.data._utils.worker")


def _save_globals() -> tuple[Any, Any, Any]:
    torch = sys.modules.get("torch")
    return (
        random.getstate(),
        np.random.get_state(),
        None if torch is None else torch.get_rng_state(),
    )


def _restore_globals(saved: tuple[Any, Any, Any]) -> None:
    python, numpy, torch_state = saved
    random.setstate(python)
    np.random.set_state(numpy)
    torch = sys.modules.get("torch")
    if torch is not None and torch_state is not None:
        torch.set_rng_state(torch_state)


__all__ = ["Lane", "Lanes", "resume_source"]
