"""The hand-shake before the ring (fastq/_workers/_handshake.py), both ends in one
process over a real duplex Pipe: every message survives pickling as what
it is, the worker attempts a first item exactly when one is due and ends
with the ring's descriptor, and each answer becomes the consumer's right
outcome (a spec, the next worker, or the error that names the cause)."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastq._core import _report
from fastq._core._plan import Plan, PlanLayout
from fastq._faces._first_batch import receive_map_spec
from fastq._layout._packing import PackedSpec
from fastq._layout._spec import BatchSpec
from fastq._make._worker_info import WorkerInfo
from fastq._workers._config import WorkerConfig
from fastq._workers._handshake import (
    REPORT_LIMIT,
    FirstItemFailed,
    ProbeStream,
    ProbeTask,
    RingReady,
    SpecFound,
    StreamEmpty,
    WorkerEnd,
    WorkerInitFailed,
    hand_over,
    probe,
    receive_answer,
    stream_spec,
)
from fastq._workers._pool import WorkerPool
from fastq._workers._worker_setup import NOTHING, await_ring
from fastq.errors import ConfigError, EmptySource, RingError, SpecError, WorkerError

WAIT = 10.0  # seconds any step may take before the test fails
PLAN = Plan(task=7, epoch=1, batch=3, indices=[40, 41, 42])
SPEC = PackedSpec(4096, 1000, 200)  # a spec that compares by value

MESSAGES = [
    SpecFound(SPEC),
    FirstItemFailed(b"report", 2),
    StreamEmpty(),
    WorkerInitFailed(b"report"),
    ProbeTask(PLAN),
    ProbeStream(fresh=True),
    ProbeStream(fresh=False),
    RingReady(4096, SPEC, PlanLayout(64, 8, 128), (3, 4)),
    RingReady(4096, SPEC, None, ()),
]


def report_of(exc: BaseException) -> bytes:
    try:
        raise exc
    except BaseException as raised:
        return _report.encode(raised, REPORT_LIMIT)


@pytest.fixture
def pipe() -> Iterator[tuple[Any, Any]]:
    """(consumer's end, worker's end), both closed afterwards."""
    consumer, worker = mp.Pipe(duplex=True)
    yield consumer, worker
    consumer.close()
    worker.close()


class Worker:
    """WorkerEnd.await_ring in a thread, recording its attempts; each
    attempt answers with the spec (or with what ``answers`` holds next)."""

    def __init__(
        self,
        conn: Any,
        plan: Plan | None,
        fresh: bool,
        init_error: Exception | None = None,
    ) -> None:
        self.end = WorkerEnd(conn)
        self.attempts: list[tuple[Plan | None, bool]] = []
        self.result: Any = NOTHING
        self._thread = threading.Thread(
            target=self._run, args=(plan, fresh, init_error), daemon=True
        )
        self._thread.start()

    def _attempt(self, plan: Plan | None, fresh: bool) -> None:
        self.attempts.append((plan, fresh))
        self.end.found(SPEC)

    def _run(self, plan: Plan | None, fresh: bool, init_error: Any) -> None:
        self.result = self.end.await_ring(plan, fresh, init_error, self._attempt)

    def finished(self) -> Any:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the worker's end is still waiting"
        return self.result


def answer(conn: Any) -> Any:
    assert conn.poll(WAIT), "no answer came"
    return receive_answer(conn)


# ---------------------------------------------------------------- messages


@pytest.mark.parametrize("message", MESSAGES, ids=repr)
def test_every_message_survives_pickling_as_itself(message: Any) -> None:
    back = pickle.loads(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
    assert type(back) is type(message)
    assert back == message
    assert not hasattr(back, "__dict__")  # slots: nothing else travels
    fields = dataclasses.fields(back)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(back, fields[0].name, None)


def test_messages_of_one_kind_differ_by_their_fields() -> None:
    assert ProbeStream(fresh=True) != ProbeStream(fresh=False)
    assert FirstItemFailed(b"r", 1) != FirstItemFailed(b"r", 2)
    assert SpecFound(SPEC) != WorkerInitFailed(b"r")
    assert StreamEmpty() == StreamEmpty()


# ------------------------------------------------------------ worker's end


def test_worker_0_attempts_at_once_and_at_each_probe_then_takes_the_ring(
    pipe: tuple[Any, Any], tmp_path: Path
) -> None:
    consumer, conn = pipe
    worker = Worker(conn, None, True)
    assert answer(consumer) == SpecFound(SPEC)
    for order in (ProbeStream(fresh=False), ProbeStream(fresh=True), ProbeTask(PLAN)):
        probe(consumer, order)
        assert answer(consumer) == SpecFound(SPEC)
    assert worker.attempts == [(None, True), (None, False), (None, True), (PLAN, False)]

    path = tmp_path / "region"
    path.write_bytes(b"\0" * 8)
    fd = os.open(path, os.O_RDWR)
    try:
        ready = RingReady(8, SPEC, PlanLayout(0, 1, 8), (PLAN.task,))
        hand_over(consumer, os.getpid(), fd, ready)
        given = worker.finished()
        assert given is not None
        got, received, plan = given
        assert got == ready
        assert plan == PLAN  # the task whose batch the worker keeps
        try:
            assert received != fd
            os.pwrite(received, b"ring", 0)  # the same file, another descriptor
            assert os.pread(fd, 4, 0) == b"ring"
        finally:
            os.close(received)
    finally:
        os.close(fd)
    assert conn.closed


def test_another_worker_attempts_nothing_until_probed(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe
    worker = Worker(conn, None, False)
    assert not consumer.poll(0.2)
    assert worker.attempts == []
    probe(consumer, ProbeStream(fresh=True))
    assert answer(consumer) == SpecFound(SPEC)
    assert worker.attempts == [(None, True)]
    consumer.close()
    assert worker.finished() is None


def test_a_planned_first_task_is_attempted_at_once(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe
    worker = Worker(conn, PLAN, False)
    assert answer(consumer) == SpecFound(SPEC)
    assert worker.attempts == [(PLAN, False)]
    consumer.close()
    assert worker.finished() is None


@pytest.mark.parametrize("fresh", [True, False])
def test_a_failed_worker_init_is_the_answer_due_instead_of_an_attempt(
    pipe: tuple[Any, Any], fresh: bool
) -> None:
    """The worker then waits for the ring like the others (to report it in
    the slot of the task claimed for it), or leaves when the consumer
    closes."""
    consumer, conn = pipe
    worker = Worker(conn, None, fresh, init_error=KeyError("no shard"))
    if not fresh:
        assert not consumer.poll(0.2)  # nothing is due before a probe
        probe(consumer, ProbeStream(fresh=False))
    got = answer(consumer)
    assert isinstance(got, WorkerInitFailed)
    report = _report.decode(got.report)
    assert (report.type_name, report.message) == ("builtins.KeyError", "'no shard'")
    assert not consumer.poll(0.2)
    consumer.close()
    assert worker.finished() is None
    assert worker.attempts == []
    assert conn.closed


def test_the_worker_leaves_when_the_consumer_closes(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe
    worker = Worker(conn, None, False)
    consumer.close()
    assert worker.finished() is None
    assert conn.closed


def test_the_answers_of_a_worker_end(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe
    end = WorkerEnd(conn)
    end.found(SPEC)
    end.empty()
    end.failed(ValueError("sample 2 is bad"), 2)
    assert answer(consumer) == SpecFound(SPEC)
    assert answer(consumer) == StreamEmpty()
    failed = answer(consumer)
    assert isinstance(failed, FirstItemFailed) and failed.position == 2
    assert _report.decode(failed.report).message == "sample 2 is bad"


# ------------------------------------------- a worker's first items


def stream_config(conn: Any, source: Any, rows: int = 0) -> Any:
    """A WorkerConfig for a stream source in worker 0 of 1, a thread of
    this process, with no region yet: what await_ring is given."""
    return WorkerConfig(
        worker_id=0,
        num_workers=1,
        source=source,
        is_map=False,
        spec=None,
        sampler=None,
        seed=0,
        rank=0,
        world_size=1,
        worker_init=None,
        region=None,
        region_size=0,
        consumer_pid=os.getpid(),
        threads=None,
        death_signal=False,
        channel=conn,
        stream_rows=rows,
        in_thread=True,
    )


def in_thread(cfg: Any) -> tuple[threading.Thread, list[Any]]:
    info = WorkerInfo(0, 1, 0, 0, 1, cfg.source)
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(await_ring(cfg, info, None)), daemon=True
    )
    thread.start()
    return thread, out


def test_a_streams_first_batch_answers_its_spec_and_is_kept(
    pipe: tuple[Any, Any],
) -> None:
    consumer, conn = pipe
    batches = [np.zeros((rows, 3), np.int32) for rows in (2, 5)]
    cfg = stream_config(conn, lambda: iter(batches))
    thread, out = in_thread(cfg)

    def rows_answered() -> int:
        got = answer(consumer)
        assert isinstance(got, SpecFound)
        want = BatchSpec.from_batch(batches[0])
        assert got.spec.fields[0].dtype == want.fields[0].dtype
        return int(got.spec.rows)

    assert rows_answered() == 2
    probe(consumer, ProbeStream(fresh=False))  # its iterator's next batch
    assert rows_answered() == 5
    probe(consumer, ProbeStream(fresh=True))  # a new iterator's first
    assert rows_answered() == 2
    consumer.close()
    thread.join(WAIT)
    assert out == [None]  # closed before the ring came


def test_a_streams_failed_and_empty_first_items(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe

    def source() -> Iterator[Any]:
        raise OSError("shard missing")
        yield

    cfg = stream_config(conn, source, rows=4)
    thread, _ = in_thread(cfg)
    failed = answer(consumer)
    assert isinstance(failed, FirstItemFailed)
    assert failed.position == -1
    assert _report.decode(failed.report).type_name == "builtins.OSError"
    probe(consumer, ProbeStream(fresh=False))  # the same stream: it ended
    assert answer(consumer) == StreamEmpty()
    assert cfg.first_turn == 1  # the failure used its turn before the ring
    consumer.close()
    thread.join(WAIT)
    assert not thread.is_alive()


# ---------------------------------------------------------- consumer's end


def test_receive_answer_refuses_what_is_not_an_answer(pipe: tuple[Any, Any]) -> None:
    consumer, conn = pipe
    conn.send(("spec", SPEC))
    with pytest.raises(RingError, match="answer about its first item"):
        answer(consumer)
    conn.send(ProbeStream(fresh=True))  # the consumer's own kind
    with pytest.raises(RingError):
        answer(consumer)


def test_a_stream_spec_from_each_answer() -> None:
    where = dict(worker=1, pid=123, where="its first sample")
    assert stream_spec(SpecFound(SPEC), **where) == SPEC
    assert stream_spec(StreamEmpty(), **where) is None
    first_sample = "raised builtins.KeyError while producing its first sample"
    with pytest.raises(WorkerError, match=first_sample):
        stream_spec(FirstItemFailed(report_of(KeyError("k")), -1), **where)
    in_init = r"worker 1 \(pid 123\) raised builtins.ZeroDivisionError"
    with pytest.raises(WorkerError, match=in_init):
        stream_spec(WorkerInitFailed(report_of(ZeroDivisionError())), **where)
    with pytest.raises(SpecError, match="worker 1, its first sample"):
        stream_spec(FirstItemFailed(report_of(SpecError("x: shape")), -1), **where)


class StubPool:
    """What receive_map_spec asks of a pool: answers, whose, and the pids."""

    def __init__(self, *answers: tuple[int, Any]) -> None:
        self.answers = list(answers)
        self.pids = [4321, 4322, 4323]
        self.asked: list[list[int]] = []

    def receive_any(
        self, workers: list[int], timeout: float | None, deadline: Any = None
    ) -> Any:
        assert timeout == 5.0
        self.asked.append(list(workers))
        return self.answers.pop(0)


PLAN_2 = Plan(8, 0, 8, [80, 81, 82, 83])


def test_a_map_spec_from_each_answer() -> None:
    assert receive_map_spec(StubPool((0, SpecFound(SPEC))), [PLAN], 5.0) == SPEC
    failed = FirstItemFailed(report_of(IndexError("gone")), 1)
    with pytest.raises(WorkerError) as caught:
        receive_map_spec(StubPool((0, failed)), [PLAN], 5.0)
    assert caught.value.task == PLAN.task
    assert caught.value.sample == PLAN.indices[1]  # the sample at position 1
    init = WorkerInitFailed(report_of(RuntimeError("no GPU")))
    with pytest.raises(WorkerError, match="its first batch, in worker_init"):
        receive_map_spec(StubPool((0, init)), [PLAN], 5.0)


def test_the_first_spec_any_worker_finds_is_the_map_spec() -> None:
    """Every worker begins at once: a later task's spec sizes the ring while
    an earlier task's first sample failed (its worker keeps the error)."""
    failed = FirstItemFailed(report_of(IndexError("gone")), 1)
    pool = StubPool((0, failed), (1, SpecFound(SPEC)))
    assert receive_map_spec(pool, [PLAN, PLAN_2], 5.0) == SPEC
    assert pool.asked == [[0, 1], [1]]


def test_when_every_first_sample_fails_the_first_task_s_error_is_raised() -> None:
    first = FirstItemFailed(report_of(IndexError("first")), 1)
    second = FirstItemFailed(report_of(KeyError("second")), 0)
    with pytest.raises(WorkerError) as caught:
        receive_map_spec(StubPool((1, second), (0, first)), [PLAN, PLAN_2], 5.0)
    assert caught.value.task == PLAN.task
    assert "first" in str(caught.value)


def test_sending_to_a_worker_that_is_gone_is_silent(
    pipe: tuple[Any, Any], tmp_path: Path
) -> None:
    consumer, conn = pipe
    conn.close()  # the worker died: its death is read from its sentinel
    probe(consumer, ProbeStream(fresh=True))
    path = tmp_path / "region"
    path.write_bytes(b"\0")
    fd = os.open(path, os.O_RDONLY)
    try:
        hand_over(consumer, os.getpid(), fd, RingReady(1, SPEC, None, ()))
    finally:
        os.close(fd)


def test_an_empty_source_is_a_config_error_of_its_own() -> None:
    error = WorkerPool.empty_error()
    assert isinstance(error, EmptySource)
    assert isinstance(error, ConfigError) and isinstance(error, ValueError)
    assert "pass spec=" in str(error)
