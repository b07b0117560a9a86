"""The hand-shake before the ring exists, both ends of it: a worker's
answers about its first item, the consumer's probes for another, and the
ring's hand-over, as typed messages over the worker's channel."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Callable, ClassVar, Union

from .._core import _report
from .._core._plan import Plan, PlanLayout
from ..errors import RingError

# NOTE [ The hand-shake before the ring ]
#
# A source without spec= has no ring until a worker has made a first item
# (a batch, or a sample of a sample stream) to size the slots from: the
# consumer never runs user code. Until then each worker holds one end of a
# duplex Connection and the consumer (fastq._workers._pool.WorkerPool) the other.
#
#   worker -> consumer: one answer per attempt at a first item
#     SpecFound         the spec it inferred; the worker keeps the item and
#                       delivers it once the ring exists (NOTE [ The kept
#                       first batch ] in fastq/_faces/_first_batch.py)
#     FirstItemFailed   the source raised: its report, and the position of
#                       the sample that failed (-1: none in particular)
#     StreamEmpty       an iterable's stream ended before any item
#     WorkerInitFailed  worker_init raised; sent instead of an attempt, and
#                       the worker leaves (its report)
#   consumer -> worker
#     ProbeTask         make a planned task's batch (the next after a
#                       failed one)
#     ProbeStream       make an iterable's next item (fresh: from a new
#                       iterator, its first)
#     RingReady         the ring exists; the region's descriptor follows
#                       on the socket, and the hand-shake ends. It names
#                       the tasks claimed for the workers that made them
#                       (`kept`): a worker delivers its first batch only if
#                       its task is there (the consumer raised the others)
#
# Every worker given a task attempts at once (a map-style or planned
# source's first tasks, one per worker, as DataLoader's workers all begin
# at once), and an iterable's worker 0; every other attempt answers a
# probe, so exactly one answer is due per attempt and the consumer always
# knows whose. The first spec any worker finds sizes the ring; a worker
# still making its first item then answers into a channel nobody reads
# any more, which its socket's buffer holds (an answer is small: a
# report's bound, REPORT_LIMIT, is below a socket's buffer). A worker whose
# worker_init failed answers that in place of every attempt, and waits for
# the ring like the others, to report it in its kept slot. A channel
# that closes (the consumer closed, or the worker died) ends the hand-shake
# on either side: the worker leaves, the consumer reads the death from the
# worker's sentinel. Every message is pickled: reports are bytes bounded by
# REPORT_LIMIT, specs and plans are small.

# Bound of an error report sent before the ring (and its slots) exists:
# below a Unix socket's send buffer (about 200 KiB on Linux), so that a late
# answer, never read, cannot block its worker.
REPORT_LIMIT = 48 * 1024


class _Message:
    """Base of the hand-shake's messages: frozen dataclasses with slots,
    declared by hand (``dataclass(slots=True)`` needs Python 3.10), which
    pickle as their class and fields in order (pickle's default restores
    slots with ``setattr``, which a frozen instance refuses)."""

    __slots__: tuple[str, ...] = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def __reduce__(self) -> tuple[type[_Message], tuple[Any, ...]]:
        return type(self), tuple(getattr(self, n) for n in self.__dataclass_fields__)


# ------------------------------------------------- worker -> consumer


@dataclass(frozen=True)
class SpecFound(_Message):
    """The spec inferred from a worker's first item, which it keeps."""

    __slots__ = ("spec",)
    spec: Any  # a BatchSpec, or a PackedSpec


@dataclass(frozen=True)
class FirstItemFailed(_Message):
    """The source raised while making a first item."""

    __slots__ = ("position", "report")
    report: bytes  # fastq._core._report.encode's
    position: int  # the failing sample's place in the batch, or -1


@dataclass(frozen=True)
class StreamEmpty(_Message):
    """An iterable's stream (of this worker) ended before any item."""

    __slots__ = ()


@dataclass(frozen=True)
class WorkerInitFailed(_Message):
    """worker_init raised, so the worker makes nothing."""

    __slots__ = ("report",)
    report: bytes  # fastq._core._report.encode's


Answer = Union[SpecFound, FirstItemFailed, StreamEmpty, WorkerInitFailed]
_ANSWERS = (SpecFound, FirstItemFailed, StreamEmpty, WorkerInitFailed)


# ------------------------------------------------- consumer -> worker


@dataclass(frozen=True)
class ProbeTask(_Message):
    """Make this planned task's batch as a first batch."""

    __slots__ = ("plan",)
    plan: Plan


@dataclass(frozen=True)
class ProbeStream(_Message):
    """Make an iterable's next item as a first item; ``fresh``: from a new
    iterator (the worker's stream starts now, or starts again)."""

    __slots__ = ("fresh",)
    fresh: bool


@dataclass(frozen=True)
class RingReady(_Message):
    """The ring exists: its region's size, the batch spec, a planned
    source's plan table, and the tasks claimed for the workers that made
    them before it; the region's descriptor follows."""

    __slots__ = ("kept", "layout", "size", "spec")
    size: int
    spec: Any  # a BatchSpec, or a PackedSpec
    layout: PlanLayout | None
    kept: tuple[int, ...]


Probe = Union[ProbeTask, ProbeStream]


# ------------------------------------------------------- worker's end


class WorkerEnd:
    """A worker's end of its channel, until the ring exists."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def found(self, spec: Any) -> None:
        self._conn.send(SpecFound(spec))

    def failed(self, exc: BaseException, position: int) -> None:
        self._conn.send(FirstItemFailed(_report.encode(exc, REPORT_LIMIT), position))

    def empty(self) -> None:
        self._conn.send(StreamEmpty())

    def await_ring(
        self,
        plan: Plan | None,
        fresh: bool,
        init_error: Exception | None,
        attempt: Callable[[Plan | None, bool], None],
    ) -> tuple[RingReady, int, Plan | None] | None:
        """Attempts first items until the ring arrives: at once if
        ``fresh`` (an iterable's worker 0) or given a ``plan`` (a task),
        then at each probe. ``attempt(plan, fresh)`` makes one (a task's,
        or an iterable's next item, from a new iterator if fresh) and
        answers through this end. A worker whose worker_init failed
        answers that instead of every attempt. Returns the
        ring's message, its region's descriptor and the plan of the last
        attempt (the task whose batch the worker keeps, if it made one);
        None if the hand-shake ended without a ring. Closes the channel."""
        conn = self._conn
        due = fresh or plan is not None
        try:
            while True:
                if due:
                    if init_error is not None:
                        report = _report.encode(init_error, REPORT_LIMIT)
                        conn.send(WorkerInitFailed(report))
                    else:
                        attempt(plan, fresh)
                order = conn.recv()
                if isinstance(order, ProbeTask):
                    plan, fresh = order.plan, False
                elif isinstance(order, ProbeStream):
                    plan, fresh = None, order.fresh
                else:
                    break
                due = True
            if not isinstance(order, RingReady):
                return None
            fd = reduction.recv_handle(conn)
        except (EOFError, OSError):
            return None
        finally:
            conn.close()
        return order, fd, plan


# ----------------------------------------------------- consumer's end


def probe(conn: Connection, order: Probe) -> None:
    """Asks a worker for another first item."""
    with contextlib.suppress(OSError):  # it died: the wait for its answer says so
        conn.send(order)


def receive_answer(conn: Connection) -> Answer:
    """A worker's answer, once ``conn`` is readable; EOFError if it is gone."""
    answer = conn.recv()
    if not isinstance(answer, _ANSWERS):
        raise RingError(
            f"a worker sent {answer!r} before the ring existed, where an answer "
            "about its first item was due"
        )
    return answer


def stream_spec(answer: Answer, *, worker: int, pid: int, where: str) -> Any:
    """What an iterable's first item answered: its spec, or None if the
    worker's stream is empty. Raises the source's exception, or
    worker_init's, as the error for ``where`` (a WorkerError or SpecError)."""
    if isinstance(answer, SpecFound):
        return answer.spec
    if isinstance(answer, StreamEmpty):
        return None
    raise _report.decode(answer.report).error(worker=worker, pid=pid, where=where)


def hand_over(conn: Connection, pid: int, fd: int, ready: RingReady) -> None:
    """Hands a worker the ring: the message, then the region's descriptor
    over the worker's socket, as multiprocessing passes descriptors."""
    try:
        conn.send(ready)
        reduction.send_handle(conn, fd, pid)
    except OSError:
        pass  # it died meanwhile: the death watch reports it
