"""A Prefetcher's processes from birth to exit: what workers inherit, how
the interpreter's exit, another thread's close() and a fork end it, and
the errors for what cannot work (no __main__ guard, a source a worker
cannot unpickle, pickling the Prefetcher, a daemonic parent). The autouse
clean_world fixture checks that nothing is left after each test."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import (
    BrokenState,
    BrokenStateBatches,
    CountingBatches,
    FailsAtSecondBatch,
    MixedByteOrder,
    PatternDataset,
    SignalState,
    StuckDataset,
    Texts,
    alive,
    prefetcher_in_this_process,
)

import fastq

pytestmark = pytest.mark.timeout(60)

HERE = Path(__file__).resolve().parent


def script_file(tmp_path: Path, body: str, name: str = "script.py") -> Path:
    """`body` as a script of its own (its __main__ is a file, as spawn
    workers need), with the tests' helpers and this checkout's fastq
    importable."""
    path = tmp_path / name
    paths = [str(HERE), str(HERE.parent)]
    path.write_text(f"import sys\nsys.path[:0] = {paths!r}\n{body}")
    return path


def run_script(
    tmp_path: Path, body: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """Runs `body` as a script of its own (script_file)."""
    return subprocess.run(
        [sys.executable, str(script_file(tmp_path, body)), *args],
        capture_output=True,
        text=True,
        timeout=40,
    )


def kill_left(pids: list[int]) -> list[int]:
    """Waits a second for pids to be gone; kills (and returns) the rest."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    left = [p for p in pids if alive(p)]
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    return left


# ------------------------------------------------------------- signals


def test_workers_start_with_default_signal_handlers_and_nothing_blocked(
    start_method: str,
) -> None:
    """Under fork a worker inherits the parent's handlers (a trainer's
    SIGTERM handler) and, under every start method, its blocked mask."""
    handled: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, frame: handled.append(signum))
        for s in (signal.SIGTERM, signal.SIGUSR2)
    }
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGHUP])
    try:
        with fastq.Prefetcher(
            SignalState(8), batch_size=2, workers=2, start_method=start_method
        ) as pf:
            rows = np.concatenate(list(pf))
            # SIGTERM now ends a worker, as it ends a fresh process.
            victim = pf._pool.pids[0]
            os.kill(victim, signal.SIGTERM)
            with pytest.raises(fastq.WorkerDied, match=f"pid {victim}.*SIGTERM"):
                time.sleep(1.0)
                list(pf)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for s, handler in previous.items():
            signal.signal(s, handler)
    # SIGTERM, SIGUSR2 default; SIGINT and SIGPIPE ignored; nothing blocked.
    assert rows.tolist() == [[1, 1, 1, 1, 0]] * 8
    assert handled == []


# ---------------------------------------------------------------- exit

EXIT_WITHOUT_CLOSE = """
import json
import fastq
from helpers import PatternDataset, ignore_sigterm

if __name__ == "__main__":
    pf = fastq.Prefetcher(PatternDataset(1000), batch_size=4, workers=2,
                          start_method=sys.argv[1], worker_init=ignore_sigterm)
    it = iter(pf)
    next(it)
    print(json.dumps(pf._pool.pids), flush=True)
    # No close(): the interpreter exits with the Prefetcher open.
"""


def test_exit_without_close_is_prompt_and_leaves_no_worker(
    tmp_path: Path, start_method: str
) -> None:
    """multiprocessing's exit handler SIGTERMs daemonic children and joins
    them without a timeout: workers that ignore SIGTERM used to hang the
    exit. fastq closes its pools first, bounded."""
    t0 = time.monotonic()
    try:
        proc = run_script(tmp_path, EXIT_WITHOUT_CLOSE, start_method)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not exit: {exc.stdout!r} {exc.stderr!r}")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    pids = json.loads(proc.stdout.splitlines()[0])
    assert kill_left(pids) == [], "workers outlived the script"
    assert elapsed < 10, f"the exit took {elapsed:.1f} s"


EXIT_WITH_FACES_LEFT_OPEN = """
import importlib
import json

# The trainers' packages, where installed, change what the interpreter's
# exit finds alive, and in which order: a finalizer that reads a module
# global found it None there.
for name in ("accelerate", "lightning", "transformers", "datasets"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass

import fastq
import fastq.torch
from helpers import PatternDataset

if __name__ == "__main__":
    loader = fastq.torch.DataLoader(PatternDataset(40), batch_size=8,
                                    num_workers=2, persistent_workers=True)
    prefetcher = fastq.Prefetcher(PatternDataset(40), batch_size=8, workers=2)
    tensors = fastq.torch.TorchPrefetcher(PatternDataset(40), batch_size=8,
                                          workers=2)
    partly = []
    for face in (loader, prefetcher, tensors):
        for batch in face:  # a loop fully consumed; its last batch kept
            pass
        partly.append(iter(face))  # and one partly consumed
        next(partly[-1])
    pids = loader._engine._pool.pids + prefetcher._pool.pids + tensors._pool.pids
    print(json.dumps(pids), flush=True)
    # No close(): the interpreter exits with all three open.
"""


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_faces_left_open_at_exit_say_nothing_and_leave_no_worker(
    tmp_path: Path,
) -> None:
    """A script that never closes its DataLoader (persistent workers), its
    Prefetcher or its TorchPrefetcher, with a loop of each still open and
    a batch of each still held, exits printing nothing, and its workers are
    gone: each face is closed by its finalizer among the exit handlers,
    and nothing runs at the interpreter's teardown, when module globals
    are None (NOTE [ A face left open is closed by its finalizer ]). Three
    runs at once: where the teardown's order let the traceback through,
    it did so in each."""
    pytest.importorskip("torch")
    script = script_file(tmp_path, EXIT_WITH_FACES_LEFT_OPEN)
    runs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = []
    try:
        for run in runs:
            outputs.append(run.communicate(timeout=200))
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    for run, (out, err) in zip(runs, outputs):
        assert run.returncode == 0, err
        assert err == "", f"printed at exit:\n{err}"
        pids = json.loads(out.splitlines()[0])
        assert len(pids) == 6
        assert kill_left(pids) == [], "workers outlived the script"


EXIT_WHILE_THE_RING_SETTLES = """
import time
import numpy as np
import torch.utils.data
from fastq.torch import DataLoader


class Photos(torch.utils.data.Dataset):
    # ImageNet-sized samples whose making keeps a core busy, so that the
    # ring's settling (170 MB of huge pages) is still under way at exit.
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        end = time.thread_time() + 0.003
        while time.thread_time() < end:
            pass
        return np.full((3, 224, 224), i % 251, np.uint8)


if __name__ == "__main__":
    loader = DataLoader(Photos(), batch_size=128, shuffle=True, num_workers=4,
                        persistent_workers=True)
    batches = iter(loader)
    next(batches)
    print("first batch", flush=True)
    # No close: the interpreter exits while the ring's thread settles it.
"""


@pytest.mark.torch
def test_exit_while_the_ring_is_settled_is_prompt(tmp_path: Path) -> None:
    """A large ring is reserved and settled by a daemon thread after it is
    handed over; a DataLoader script that exits meanwhile has its loader
    closed by a finalizer after that thread has stopped for good (NOTE [ A
    region closed at interpreter exit ]): the exit must not wait for it."""
    pytest.importorskip("torch")
    t0 = time.monotonic()
    try:
        proc = run_script(tmp_path, EXIT_WHILE_THE_RING_SETTLES)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script did not exit: {exc.stdout!r} {exc.stderr!r}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "first batch"
    assert time.monotonic() - t0 < 20


# ------------------------------------------------- an error in flight


@pytest.mark.parametrize("recurring", [False, True])
def test_a_pass_broken_off_with_an_error_in_flight_leaves_the_next_pass_whole(
    recurring: bool,
) -> None:
    """Worker 1 raises at its second batch; the loop breaks before that
    error's turn. The next pass gets every batch of both workers, or the
    error again if it recurs: never a FetchTimeout waiting for a worker
    that sat out."""
    with fastq.Prefetcher(
        FailsAtSecondBatch(3, recurring=recurring),
        workers=2,
        slots=12,
        timeout=5.0,
        start_method="fork",
    ) as pf:
        for _ in pf:
            time.sleep(0.5)  # worker 1 reports its error meanwhile
            break
        if recurring:
            with pytest.raises(fastq.WorkerError, match="shard of worker 1"):
                list(pf)
            return
        seen = sorted((int(ids[0]), int(nums[0])) for ids, nums in pf)
    assert seen == [(w, 4 * k) for w in (0, 1) for k in range(3)]


def test_worker_init_failure_is_reported_again_in_a_later_pass() -> None:
    with fastq.Prefetcher(
        CountingBatches(3),
        spec=(((4,), "int64"), ((4,), "int64")),
        workers=2,
        timeout=5.0,
        start_method="fork",
        worker_init=_init_fails_in_worker_1,
    ) as pf:
        for _ in pf:
            time.sleep(0.8)  # worker 1 reports its failure meanwhile
            break
        with pytest.raises(fastq.WorkerError, match="no shard for worker 1"):
            list(pf)


def _init_fails_in_worker_1(worker_id: int) -> None:
    if worker_id == 1:
        time.sleep(0.3)  # after worker 0's first batch
        raise OSError("no shard for worker 1")


# ------------------------------------------------------ close and loops


def test_close_from_another_thread_ends_the_loop_with_an_error() -> None:
    pf = fastq.Prefetcher(
        PatternDataset(400), batch_size=4, workers=2, start_method="fork"
    )
    got = 0
    with pytest.raises(fastq.PrefetcherClosed, match="closed while this loop"):
        for _ in pf:
            got += 1
            if got == 30:
                closer = threading.Thread(target=pf.close)
                closer.start()
                closer.join()
    assert got == 30


def test_close_from_another_thread_of_a_callable_source_pass() -> None:
    pf = fastq.Prefetcher(CountingBatches(100), workers=2, start_method="fork")
    got = 0
    with pytest.raises(fastq.PrefetcherClosed):
        for _ in pf:
            got += 1
            if got == 10:
                closer = threading.Thread(target=pf.close)
                closer.start()
                closer.join()
    assert got == 10


def test_close_from_another_thread_while_the_loop_waits() -> None:
    pf = fastq.Prefetcher(
        StuckDataset(100, stuck=1), batch_size=4, workers=1, start_method="fork"
    )
    timer = threading.Timer(0.3, pf.close)
    timer.start()
    try:
        with pytest.raises(fastq.PrefetcherClosed):
            for _ in pf:
                pass
    finally:
        timer.join()


def test_superseded_and_finished_loops_still_end_quietly() -> None:
    with fastq.Prefetcher(
        PatternDataset(16), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        old = iter(pf)
        next(old)
        current = iter(pf)  # a new epoch ends the old loop, as in DataLoader
        assert next(old, None) is None
        finished = iter(pf)
        assert len(list(finished)) == 4
        current = iter(pf)
        next(current)
    assert next(old, None) is None
    assert next(finished, None) is None
    with pytest.raises(fastq.PrefetcherClosed):
        next(current)


# ----------------------------------------------------------------- fork


def test_a_forked_child_takes_no_batch_and_the_parent_sees_every_sample() -> None:
    with fastq.Prefetcher(
        PatternDataset(200), batch_size=4, workers=2, timeout=10.0, start_method="fork"
    ) as pf:
        it = iter(pf)
        seen = [int(i) for _ in range(3) for i in next(it)[1]]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: both ways of iterating must refuse
            outcome = []
            for attempt in (lambda: next(it), lambda: next(iter(pf))):
                try:
                    attempt()
                    outcome.append("took a batch")
                except fastq.PrefetcherClosed:
                    outcome.append("closed")
                except BaseException as exc:
                    outcome.append(type(exc).__name__)
            os.write(w, json.dumps(outcome).encode())
            os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        with os.fdopen(r) as f:
            assert json.load(f) == ["closed", "closed"]
        seen += [int(i) for batch in it for i in batch[1]]
    assert seen == list(range(200))


# ------------------------------------------------ what cannot work


NO_MAIN_GUARD = """
import json
import fastq
from helpers import PatternDataset

# No `if __name__ == "__main__":`: spawn and forkserver workers run this again.
try:
    with fastq.Prefetcher(PatternDataset(16), batch_size=4, workers=2,
                          start_method=sys.argv[1]) as pf:
        print(json.dumps({"batches": sum(1 for _ in pf)}))
except fastq.FastqError as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_main_guard_is_told_the_fix(
    tmp_path: Path, method: str
) -> None:
    proc = run_script(tmp_path, NO_MAIN_GUARD, method)
    outcome = json.loads(proc.stdout.splitlines()[-1])
    message = outcome["message"]
    assert outcome["type"] == "WorkerDied", proc.stderr
    assert "could not start" in message and "at import time" in message
    assert 'if __name__ == "__main__":' in message and "script.py" in message


def _unimportable_dataset() -> Any:
    """A dataset whose class lives in a module only this process has (made
    at run time): it pickles here, and a fresh interpreter cannot import it."""
    module = types.ModuleType("fastq_tests_made_at_run_time")
    cls = type("RunTimeDataset", (PatternDataset,), {"__module__": module.__name__})
    module.RunTimeDataset = cls  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    return cls(16)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize(
    "make,cause",
    [
        (lambda: BrokenState(16), "RuntimeError: cannot reopen the database"),
        (_unimportable_dataset, "No module named 'fastq_tests_made_at_run_time'"),
        (lambda: BrokenStateBatches(2), "RuntimeError: cannot reopen the database"),
    ],
    ids=["setstate-raises", "class-not-importable", "callable-setstate-raises"],
)
def test_a_source_a_worker_cannot_unpickle_is_named_with_the_fix(
    method: str, make: Any, cause: str, capfd: pytest.CaptureFixture[str]
) -> None:
    source = make()
    map_style = not callable(source)
    try:
        with pytest.raises(fastq.WorkerDied) as info:
            with fastq.Prefetcher(
                source,
                batch_size=4 if map_style else None,
                workers=2,
                start_method=method,
            ) as pf:
                list(pf)
    finally:
        sys.modules.pop("fastq_tests_made_at_run_time", None)
    message = str(info.value)
    assert "could not unpickle the source" in message
    assert cause in message and "start_method='fork'" in message
    capfd.readouterr()  # the workers' tracebacks


def test_pickling_a_prefetcher_says_what_to_do_instead() -> None:
    with fastq.Prefetcher(
        PatternDataset(8), batch_size=4, workers=1, start_method="fork"
    ) as pf:
        for dumps in (pickle.dumps, mp.reduction.ForkingPickler.dumps):
            with pytest.raises(TypeError, match="cannot be pickled or sent to another"):
                dumps(pf)


def test_a_prefetcher_in_a_daemonic_process_is_a_config_error() -> None:
    ctx = mp.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=prefetcher_in_this_process, args=(theirs,), daemon=True)
    proc.start()
    theirs.close()
    try:
        assert mine.poll(20), "the daemonic process answered nothing"
        kind, message = mine.recv()
    finally:
        proc.join(10)
        mine.close()
    assert kind == "ConfigError", message
    assert "daemonic" in message and "daemon=False" in message


# ------------------------------------------------------------ arguments


def test_numpy_integers_are_accepted_where_ints_are() -> None:
    with fastq.Prefetcher(
        PatternDataset(20),
        batch_size=np.int64(4),
        workers=np.int32(2),
        slots=np.uint8(3),
        worker_threads=np.int64(1),
        rank=np.int64(0),
        world_size=np.int64(1),
        start_method="fork",
    ) as pf:
        assert type(pf.workers) is int and type(pf.slots) is int
        assert [b[1].tolist() for b in pf][-1] == [16, 17, 18, 19]
    for bad in (True, np.bool_(True), 4.0, "4"):
        with pytest.raises(fastq.ConfigError, match="batch_size="):
            fastq.Prefetcher(PatternDataset(20), batch_size=bad, start_method="fork")


@pytest.mark.parametrize("spec", [None, {"x": ((2,), "float32")}])
def test_an_empty_dataset_is_named_as_such(spec: Any) -> None:
    with pytest.raises(
        fastq.ConfigError, match=r"no samples \(len\(source\) == 0\)"
    ) as info:
        fastq.Prefetcher(
            PatternDataset(0), batch_size=4, spec=spec, start_method="fork"
        )
    assert "drop_last" not in str(info.value)


def test_drop_last_leaving_no_batch_names_the_numbers() -> None:
    with pytest.raises(
        fastq.ConfigError, match=r"batch_size=8 with drop_last=True.*len\(source\)=5"
    ):
        fastq.Prefetcher(PatternDataset(5), batch_size=8, drop_last=True)
    with pytest.raises(
        fastq.ConfigError,
        match=r"world_size=4 ranks leave each rank 0.*drop_last=False",
    ):
        fastq.Prefetcher(
            PatternDataset(3), batch_size=1, drop_last=True, rank=0, world_size=4
        )


# ---------------------------------------------------------------- leaves


def test_string_leaves_are_refused_with_the_field_and_the_fix() -> None:
    with pytest.raises(fastq.SpecError, match=r"field '\[1\]': str values.*DataLoader"):
        fastq.Prefetcher(Texts(10), batch_size=4, start_method="fork")

    def names() -> Any:
        yield np.zeros((2, 3)), np.array([b"a", b"bc"])

    with pytest.raises(fastq.SpecError, match=r"field '\[1\]': bytes values"):
        fastq.Prefetcher(names, workers=1, start_method="fork")


def test_big_endian_leaves_arrive_in_native_order() -> None:
    with fastq.Prefetcher(
        MixedByteOrder(10), batch_size=4, workers=2, copy=True, start_method="fork"
    ) as pf:
        assert all(f.dtype.isnative for f in pf.spec.fields)
        batches = list(pf)
    ints = np.concatenate([b[0] for b in batches])
    halves = np.concatenate([b[1] for b in batches])
    assert ints.dtype == np.int32 and halves.dtype == np.float64
    np.testing.assert_array_equal(ints, np.arange(10)[:, None] + np.arange(3))
    np.testing.assert_array_equal(halves, np.arange(10) / 2)

    def big_endian_batches() -> Any:
        for k in range(3):
            yield np.arange(4, dtype=">u2") + k

    with fastq.Prefetcher(
        big_endian_batches, workers=1, copy=True, start_method="fork"
    ) as pf:
        got = list(pf)
    assert [b.dtype for b in got] == [np.dtype(np.uint16)] * 3
    assert [b.tolist() for b in got] == [[k, k + 1, k + 2, k + 3] for k in range(3)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pressed", ["first worker", "second worker"])
def test_ctrl_c_while_a_worker_starts_is_raised_once_it_has(
    pressed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl+C that lands while a worker is being forked is held, not
    dropped: it is raised once the worker has started, and every worker
    started so far is reaped (the session's leak check)."""
    from fastq._workers import _pool

    starts = []
    window = _pool._no_missing_main_file

    @contextlib.contextmanager
    def press_ctrl_c_inside() -> Any:
        starts.append(1)
        with window():
            if len(starts) == (1 if pressed == "first worker" else 2):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler runs here, inside the window
            yield

    monkeypatch.setattr(_pool, "_no_missing_main_file", press_ctrl_c_inside)
    with pytest.raises(KeyboardInterrupt):
        fastq.Prefetcher(
            PatternDataset(40), batch_size=4, workers=2, start_method="fork"
        )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
