"""fastq.torch.DataLoader when things go wrong: a worker's exception as
its own type, first batches that fail, a killed worker, Ctrl+C, a forked
helper; each as DataLoader behaves, or better where it hangs or loses."""

from __future__ import annotations

import gc
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers.dataloader_port_data import (  # noqa: E402
    WorkerSpecificIterableDataset,
)
from torch_helpers.loader_data import (  # noqa: E402
    FailsAt,
    FailsBelow,
    FirstItemFails,
    MarksFirst,
    Mixed,
    Turns,
)

import fastq  # noqa: E402
from fastq.torch import DataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]


def test_a_workers_exception_keeps_its_type_and_the_epoch_goes_on() -> None:
    loader = DataLoader(FailsAt(12, bad=5), batch_size=2, num_workers=2)
    it = iter(loader)
    got = [next(it), next(it)]
    with pytest.raises(KeyError, match="no sample 5") as info:
        next(it)
    assert info.value.fastq_sample == 5 and info.value.fastq_task == 2
    assert "Remote traceback" in "".join(getattr(info.value, "__notes__", []))
    remote = info.value.remote_traceback  # as docs/dataloader.md promises
    assert "KeyError" in remote and "__getitem__" in remote
    assert info.value.fastq_remote_traceback == remote
    got += list(it)  # DataLoader goes on past a failed batch
    assert sorted(x for b in got for x in b.tolist()) == [0, 1, 2, 3, *range(6, 12)]


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_first_batches_that_fail_are_raised_in_turn_and_the_epoch_goes_on(
    persistent_workers: bool,
) -> None:
    """No batch has sized the slots yet: each failure is still raised at its
    turn, with its own type and sample, and the epoch goes on; so does the
    next one."""
    loader = DataLoader(
        FailsBelow(12, bad_below=5),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent_workers,
    )
    for _ in range(2):
        it = iter(loader)
        tasks = []
        for sample in [0, 2, 4]:
            with pytest.raises(KeyError, match=f"no sample {sample}") as info:
                next(it)
            assert info.value.fastq_sample == sample
            tasks.append(info.value.fastq_task)
        assert tasks == list(range(tasks[0], tasks[0] + 3))
        assert [b.tolist() for b in it] == [[6, 7], [8, 9], [10, 11]]


def test_an_epoch_of_failing_batches_raises_each_then_ends() -> None:
    loader = DataLoader(FailsBelow(6, bad_below=6), batch_size=2, num_workers=2)
    it = iter(loader)
    for sample in (0, 2, 4):
        with pytest.raises(KeyError, match=f"no sample {sample}"):
            next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert loader.stats() == {}


def test_an_error_caught_in_the_loop_holds_no_slot() -> None:
    """A worker's exception, caught and dropped, returns its slot at once:
    no reference cycle through the error waits for a garbage-collector
    pass (with the collector off, 19 errors go through two slots)."""
    bad = tuple((0, k) for k in range(1, 20))
    loader = DataLoader(Turns([20], bad=bad), batch_size=None, num_workers=1, slots=1)
    it = iter(loader)
    good: list[list[int]] = []
    errors = 0
    gc.disable()
    try:
        for _ in range(25):
            try:
                item = next(it)
            except StopIteration:
                break
            except ValueError:
                errors += 1
            else:
                good.append([int(x) for x in item])
                del item
    finally:
        gc.enable()
    assert good == [[0, 0]]
    assert errors == 19


def test_a_loop_left_at_a_first_batch_error_starts_whole_next_time() -> None:
    """A notebook cell that stops at the first batch's error, run again."""
    loader = DataLoader(
        FailsBelow(8, bad_below=1), batch_size=2, num_workers=2, persistent_workers=True
    )
    with pytest.raises(KeyError):
        for _ in loader:
            pass
    with pytest.raises(KeyError, match="no sample 0"):
        next(iter(loader))
    it = iter(loader)
    with pytest.raises(KeyError):
        next(it)
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7]]


def test_an_iterable_whose_first_item_fails_goes_on() -> None:
    loader = DataLoader(FirstItemFails(12), batch_size=2, num_workers=2)
    it = iter(loader)
    with pytest.raises(ValueError, match="the first item is bad"):
        next(it)
    got = sorted(x for b in it for x in b.tolist())
    assert got == list(range(12))


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_an_iterable_with_nothing_in_its_first_workers_sizes_from_another(
    persistent_workers: bool,
) -> None:
    loader = DataLoader(
        WorkerSpecificIterableDataset([0, 0, 5]),
        batch_size=2,
        num_workers=3,
        persistent_workers=persistent_workers,
    )
    for _ in range(2):
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    nothing = DataLoader(WorkerSpecificIterableDataset([0, 0]), num_workers=2)
    assert list(nothing) == []


def test_a_killed_worker_is_workerdied_and_the_next_epoch_starts_afresh() -> None:
    import signal

    loader = DataLoader(Mixed(400), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    engine = loader._engine
    assert engine is not None and engine._pool is not None
    os.kill(engine._pool.pids[1], signal.SIGKILL)
    with pytest.raises(fastq.WorkerDied, match="SIGKILL"):
        for _ in it:
            pass
    del it
    assert len(list(loader)) == 200  # new workers, every batch


def test_the_worker_that_sized_the_slots_may_start_last(tmp_path: Any) -> None:
    """Worker 0 makes the first batch before the ring exists. Stopped right
    after it, it finds every slot taken by the other worker's later batches
    when it resumes: the first batch must not wait for it (it did, forever,
    when worker 0 kept that batch's task outside the ring's claim order)."""
    import signal
    import threading
    import time

    mark = tmp_path / "first"

    def stop_the_first_maker() -> None:
        while not mark.exists():
            time.sleep(0.0005)
        pid = int(mark.read_text())
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.0)  # worker 1 fills the slots meanwhile
        os.kill(pid, signal.SIGCONT)

    stopper = threading.Thread(target=stop_the_first_maker)
    stopper.start()
    try:
        loader = DataLoader(
            MarksFirst(40, str(mark)), batch_size=2, num_workers=2, timeout=20
        )
        got = sorted(int(i) for b in loader for i in b)
    finally:
        stopper.join()
    assert got == list(range(40))


def test_ctrl_c_while_waiting_then_running_the_cell_again() -> None:
    import signal
    import threading

    loader = DataLoader(SlowAt(6, 4), batch_size=2, num_workers=1)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            pass
    timer.join()
    del it
    # The notebook user runs the cell again: a whole epoch, in order.
    assert [x for b in loader for x in b.tolist()] == list(range(6))


def test_a_helper_forked_mid_epoch_takes_no_batch() -> None:
    loader = DataLoader(Mixed(40), batch_size=2, num_workers=2)
    it = iter(loader)
    got = next(it)[1].tolist()
    pid = os.fork()
    if pid == 0:  # the helper: iterating the parent's loop must fail
        code = 1
        try:
            next(it)
        except fastq.PrefetcherClosed:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got += [x for b in it for x in b[1].tolist()]
    assert got == list(range(40))


class SlowAt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is i; sample `slow` takes 3 s in the first epoch's workers."""

    def __init__(self, n: int, slow: int) -> None:
        self.n = n
        self.slow = slow
        self.slept = False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import time

        if i == self.slow and not self.slept:
            self.slept = True
            time.sleep(3)
        return i
