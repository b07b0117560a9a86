"""fastq.torch.DataLoader: DataLoader's signature and meaning, with fastq's
workers behind the iterator. Each test compares with torch's own DataLoader
where there is something to compare."""

from __future__ import annotations

import gc
import inspect
import json
import os
import re
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import BatchSampler, RandomSampler  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402
from torch_helpers.dataloader_port_data import (  # noqa: E402
    CountingIterableDataset,
    WorkerSpecificIterableDataset,
)
from torch_helpers.loader_data import (  # noqa: E402
    Augmented,
    FailsAt,
    FailsBelow,
    FirstItemFails,
    Growing,
    MarksFirst,
    Mixed,
    OnlyInWorkers,
    Pairs,
    Point,
    Sharded,
    Turns,
    WorkerReport,
    seed_torch_in_worker,
)

import fastq  # noqa: E402
from fastq.torch import DataLoader, DataLoaderTimeout  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]


def same(a: Any, b: Any) -> bool:
    """Equal structure, types and values (tensors bit for bit)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def children() -> list[int]:
    import multiprocessing as mp

    return [p.pid for p in mp.active_children() if p.name.startswith("fastq-")]


def test_signature_is_dataloaders_then_fastqs_own() -> None:
    ours = list(inspect.signature(DataLoader.__init__).parameters.values())
    theirs = list(inspect.signature(TorchLoader.__init__).parameters.values())
    assert [(p.name, p.kind) for p in ours[: len(theirs)]] == [
        (p.name, p.kind) for p in theirs
    ]
    for mine, torch_p in zip(ours, theirs):
        if mine.name != "num_workers":  # the migration table's first row
            assert mine.default == torch_p.default, mine.name
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs) :])
    assert issubclass(DataLoader, TorchLoader)


def test_batches_equal_torchs_bit_for_bit_with_the_same_types() -> None:
    torch.manual_seed(7)
    want = list(TorchLoader(Mixed(23), batch_size=4, shuffle=True))
    torch.manual_seed(7)
    loader = DataLoader(Mixed(23), batch_size=4, shuffle=True, num_workers=2)
    got = list(loader)
    assert len(got) == len(want) == len(loader) == 6
    for g, w in zip(got, want):
        assert same(g, w), (g, w)
    assert type(got[0][3]) is Point and isinstance(got[0], list)
    loader.close()


def test_workers_start_at_the_first_iter_and_stop_after_a_non_persistent_epoch() -> (
    None
):
    loader = DataLoader(Mixed(8), batch_size=4, num_workers=2)
    assert children() == []
    it = iter(loader)
    assert len(children()) == 2
    assert len(list(it)) == 2
    assert children() == []  # persistent_workers=False, as DataLoader


def test_persistent_workers_serve_every_epoch() -> None:
    loader = DataLoader(
        WorkerReport(12), batch_size=3, num_workers=2, persistent_workers=True
    )
    seen: set[int] = set()
    engines = []
    for _ in range(3):
        rows = torch.cat(list(loader))
        assert sorted(rows[:, 0].tolist()) == list(range(12))
        seen |= set(rows[:, 5].tolist())
        engines.append(loader._engine)
    assert engines[0] is engines[1] is engines[2]
    assert engines[0] is not None and seen <= set(engines[0]._pool.pids)
    loader.close()
    assert children() == []


def test_torch_worker_info_in_workers() -> None:
    rows = torch.cat(list(DataLoader(WorkerReport(16), batch_size=2, num_workers=2)))
    assert set(rows[:, 1].tolist()) <= {0, 1}
    assert set(rows[:, 2].tolist()) == {2}
    assert rows[:, 3].all(), "get_worker_info().seed != torch.initial_seed()"
    assert rows[:, 4].all(), "get_worker_info().dataset is not the dataset's copy"


def test_a_torch_iterable_dataset_shards_itself_even_with_a_len() -> None:
    loader = DataLoader(Sharded(21), batch_size=4, num_workers=2)
    seen = sorted(x for b in loader for x in b.tolist())
    assert seen == list(range(21))
    assert len(loader) == 6  # DataLoader's len for an iterable: len(dataset)


def test_the_dataset_is_never_read_in_the_consumer() -> None:
    loader = DataLoader(OnlyInWorkers(10), batch_size=3, num_workers=2)
    assert sorted(x for b in loader for x in b.tolist()) == list(range(10))


def test_each_sample_is_read_once_per_epoch(tmp_path: Any, worker0_late: None) -> None:
    """The first batch, made by worker 0 before the ring exists to size the
    slots, is delivered: the workers that reach the ring before worker 0
    do not make it again (DataLoader reads each index once per epoch)."""
    from helpers import CallLog, calls

    loader = DataLoader(CallLog(24, str(tmp_path)), batch_size=2, num_workers=3)
    assert sorted(int(i) for b in loader for i in b[1]) == list(range(24))
    read = calls(str(tmp_path))
    assert sorted(c.indices[0] for c in read) == list(range(24))
    assert os.getpid() not in {c.pid for c in read}


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


def test_torch_randomness_does_not_depend_on_the_number_of_workers() -> None:
    runs = []
    for workers in (1, 2):
        torch.manual_seed(3)
        loader = DataLoader(Augmented(24), batch_size=4, num_workers=workers)
        runs.append(list(loader))
    for a, b in zip(*runs):
        assert same(a, b)
    # and the epochs differ from one another
    torch.manual_seed(3)
    loader = DataLoader(Augmented(8), batch_size=4, num_workers=2)
    first, second = list(loader), list(loader)
    assert not torch.equal(first[0][0], second[0][0])


def test_a_seed_set_in_worker_init_fn_is_left_alone() -> None:
    loader = DataLoader(
        Augmented(8), batch_size=8, num_workers=1, worker_init_fn=seed_torch_in_worker
    )
    (batch,) = list(loader)
    torch.manual_seed(1234)
    want = torch.stack([torch.rand(3) + i for i in range(8)])
    assert torch.equal(batch[0], want)


def test_an_iter_abandoned_or_a_peek_uses_no_epoch() -> None:
    loader = DataLoader(Mixed(8), batch_size=4, num_workers=1)
    assert loader.epoch == 0
    iter(loader)  # a trainer peeking
    iter(loader)
    assert loader.epoch == 0
    list(loader)
    assert loader.epoch == 1
    next(iter(loader))  # a peek
    assert loader.epoch == 1
    loader.set_epoch(5)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.epoch == 6


def test_set_epoch_on_a_distributed_sampler_names_the_epoch() -> None:
    from torch.utils.data.distributed import DistributedSampler

    ds = Augmented(8)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=1)
    loader = DataLoader(
        ds, batch_size=2, sampler=sampler, num_workers=1, persistent_workers=True
    )
    sampler.set_epoch(4)  # where Lightning calls it
    a = list(loader)
    loader.set_epoch(4)
    assert sampler.epoch == 4
    b = list(loader)
    for x, y in zip(a, b):
        assert same(x, y)
    assert len(a) == 2
    loader.close()


def test_resuming_at_an_epoch_repeats_it_exactly() -> None:
    torch.manual_seed(0)
    loader = DataLoader(
        Augmented(12), batch_size=4, num_workers=2, persistent_workers=True
    )
    epochs = [list(loader) for _ in range(3)]
    loader.close()
    torch.manual_seed(0)
    resumed = DataLoader(
        Augmented(12), batch_size=4, num_workers=1, persistent_workers=True
    )
    resumed.epoch = 2
    for a, b in zip(list(resumed), epochs[2]):
        assert torch.equal(a[0], b[0])
    resumed.close()


def loader_for_state(workers: int, persistent: bool) -> DataLoader:
    return DataLoader(
        Augmented(40),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
    )


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_state_dict_resumes_mid_epoch_bit_identical(persistent_workers: bool) -> None:
    """A checkpoint in epoch 1, a new process (another global seed, another
    number of workers): the rest of epoch 1 and epoch 2 are the
    uninterrupted run's, shuffling and augmentations included."""
    torch.manual_seed(3)
    ref = loader_for_state(2, persistent_workers)
    want = [list(ref) for _ in range(3)]
    ref.close()
    torch.manual_seed(3)
    loader = loader_for_state(2, persistent_workers)
    list(loader)
    it = iter(loader)
    got = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 1 and state["batches_done"] == 4
    loader.close()
    torch.manual_seed(999)
    resumed = loader_for_state(3, persistent_workers)
    resumed.load_state_dict(state)
    assert same(got + list(resumed), want[1])
    assert same(list(resumed), want[2])
    resumed.close()


def test_state_dict_at_an_epochs_end_resumes_at_the_next() -> None:
    torch.manual_seed(5)
    ref = loader_for_state(2, False)
    want = [list(ref) for _ in range(2)]
    torch.manual_seed(5)
    loader = loader_for_state(2, False)
    list(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 0
    resumed = loader_for_state(1, False)
    resumed.load_state_dict(state)
    assert same(list(resumed), want[1])
    # After the last batch, before StopIteration: the next epoch too.
    torch.manual_seed(5)
    ref = loader_for_state(2, True)
    want = [list(ref) for _ in range(2)]
    ref.close()
    torch.manual_seed(5)
    loader = loader_for_state(2, True)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    state = loader.state_dict()
    assert state["batches_done"] == len(loader)
    loader.close()
    resumed = loader_for_state(2, True)
    resumed.load_state_dict(state)
    assert same(list(resumed), want[1])
    resumed.close()


def test_load_state_dict_after_iter_ends_that_loop() -> None:
    loader = loader_for_state(2, True)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    with pytest.raises(fastq.ConfigError, match=r"call iter\(\) again"):
        next(it)
    assert len(list(loader)) == 10
    loader.close()


def test_a_state_of_another_dataset_is_refused() -> None:
    loader = loader_for_state(2, False)
    state = {**loader.state_dict(), "samples": 41}
    with pytest.raises(fastq.ConfigError, match=r"samples'\]=41.*samples=40"):
        loader.load_state_dict(state)
    state = {**loader.state_dict(), "batches": 5}
    with pytest.raises(fastq.ConfigError, match="batch_size"):
        loader.load_state_dict(state)
    with pytest.raises(TypeError, match="IterableDataset's place"):
        DataLoader(Sharded(8), num_workers=1).state_dict()


def test_a_state_of_another_world_size_names_both_and_the_reshard() -> None:
    from torch.utils.data.distributed import DistributedSampler

    def on(world_size: int) -> DataLoader:
        data = Augmented(40)
        sampler = DistributedSampler(data, num_replicas=world_size, rank=0)
        return DataLoader(data, batch_size=2, sampler=sampler, num_workers=1)

    state = on(2).state_dict()
    assert state["world_size"] == 2
    with pytest.raises(
        fastq.ConfigError, match=r"world_size'\]=2.*world_size=4.*TorchPrefetcher"
    ):
        on(4).load_state_dict(state)


def test_batch_sampler_with_variable_sizes_up_to_a_bound() -> None:
    sizes = [3, 5, 1, 5, 2]
    batches, start = [], 0
    for s in sizes:
        batches.append(list(range(start, start + s)))
        start += s
    got = list(DataLoader(Mixed(16), batch_sampler=batches, num_workers=2))
    assert [len(b[1]) for b in got] == sizes
    assert [b[1].tolist() for b in got] == batches
    # a batch larger than any of the first ones the slots were sized for
    many = [[0]] * 30 + [list(range(16))]
    with pytest.raises(fastq.ConfigError, match="max_batch_size=16"):
        list(DataLoader(Mixed(16), batch_sampler=many, num_workers=1))
    got = list(
        DataLoader(Mixed(16), batch_sampler=many, num_workers=1, max_batch_size=16)
    )
    assert got[-1][1].tolist() == list(range(16))


def test_batch_size_none_and_num_workers_zero_are_dataloaders() -> None:
    got = list(DataLoader(Mixed(3), batch_size=None, num_workers=2))
    want = list(TorchLoader(Mixed(3), batch_size=None))
    assert all(same(a, b) for a, b in zip(got, want)) and len(got) == 3
    loader = DataLoader(Mixed(5), batch_size=2, num_workers=0)
    assert type(iter(loader)).__name__ == "_SingleProcessDataLoaderIter"
    assert len(list(loader)) == 3 and children() == []


def test_batches_view_the_ring_without_a_copy() -> None:
    loader = DataLoader(Mixed(8), batch_size=4, num_workers=1)
    it = iter(loader)
    batch = next(it)
    engine = loader._engine
    assert engine is not None and engine._region is not None
    ring = np.frombuffer(engine._region.mapping, dtype=np.uint8)
    lo, hi = ring.ctypes.data, ring.ctypes.data + ring.nbytes
    for t in (batch[0], batch[1], batch[4]["half"]):
        assert lo <= t.data_ptr() < hi
    del batch, it
    loader.close()


def test_many_tensors_in_the_dataset_need_no_descriptor_each() -> None:
    ds = Pairs(400)
    loader = DataLoader(ds, batch_size=50, num_workers=2)
    got = list(loader)
    assert torch.equal(
        torch.cat([b[0] for b in got]), torch.stack([x for x, _ in ds.data])
    )


def test_keeping_every_batch_degrades_to_copies_with_one_warning() -> None:
    loader = DataLoader(Mixed(200), batch_size=2, num_workers=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kept = list(loader)
    assert len(kept) == 100
    assert [x for b in kept for x in b[1].tolist()] == list(range(200))
    assert len([w for w in caught if "copied out of the ring" in str(w.message)]) == 1


def test_an_empty_dataset_is_an_empty_epoch() -> None:
    assert list(DataLoader(Mixed(0), batch_size=2, num_workers=2)) == []
    assert list(DataLoader(Sharded(0), batch_size=2, num_workers=2)) == []
    assert children() == []


def test_a_dataset_that_grows_is_read_at_each_epoch() -> None:
    ds = Growing(4)
    loader = DataLoader(ds, batch_size=4, num_workers=1)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3]]
    ds.n = 6
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5]]


def test_timeout_is_catchable_as_dataloaders() -> None:
    from torch_helpers.loader_data import Mixed as _  # noqa: F401

    loader = DataLoader(Slow(4), batch_size=1, num_workers=1, timeout=0.5)
    with pytest.raises(RuntimeError) as info:
        list(loader)
    assert isinstance(info.value, (DataLoaderTimeout, fastq.FetchTimeout))


def test_pin_memory_without_cuda_warns_like_dataloader() -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the machine without CUDA")
    loader = DataLoader(Mixed(4), batch_size=2, num_workers=1, pin_memory=True)
    with pytest.warns(UserWarning, match="pin_memory"):
        assert len(list(loader)) == 2


def test_multiprocessing_context_as_name_or_object() -> None:
    import multiprocessing as mp

    for ctx in ("spawn", mp.get_context("fork")):
        loader = DataLoader(
            Mixed(6), batch_size=3, num_workers=1, multiprocessing_context=ctx
        )
        assert [b[1].tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]


def test_default_workers_share_the_cpus_among_local_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastq._loop._autotune import cpu_budget

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert DataLoader(Mixed(1)).num_workers == max(1, cpu_budget() // 8 - 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert DataLoader(Mixed(1)).num_workers == max(1, cpu_budget() - 1)


def test_an_iterable_dataset_is_read_once_per_epoch_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With num_workers left out, an IterableDataset that does not shard
    itself (every worker would yield all of it) gets one worker, whatever
    the CPUs; a map-style dataset keeps CPUs - 1."""
    import fastq._faces._prefetcher

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(fastq._faces._prefetcher, "cpu_budget", lambda: 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's: more workers than CPUs here
        assert DataLoader(Mixed(1)).num_workers == 7
    loader = DataLoader(CountingIterableDataset(10), batch_size=3)
    assert loader.num_workers == 1
    for _ in range(2):  # every epoch
        assert sorted(int(i) for b in loader for i in b) == list(range(10))


def items_in_order(loader: Any, stop: int | None = None) -> list[Any]:
    """Each item (w, k) of a Turns dataset, or its error's "bad w k", in
    the order the loop gets them; at most `stop` of them."""
    got: list[Any] = []
    it = iter(loader)
    while stop is None or len(got) < stop:
        try:
            w, k = next(it)
        except StopIteration:
            break
        except ValueError as exc:  # torch's message quotes the original
            got.append(re.findall(r"bad \d+ \d+", str(exc))[-1])
            continue
        got.append((int(w), int(k)))
    return got


TURNS = {
    "even": {"counts": [6, 6]},
    "uneven": {"counts": [2, 7, 4]},
    "first-empty": {"counts": [0, 5, 3]},
    "errors": {"counts": [4, 4], "bad": ((0, 1), (1, 2))},
    "first-fails": {"counts": [4, 4], "bad": ((0, 0), (0, 1))},
    "all-fail": {"counts": [2, 2], "bad": ((0, 0), (0, 1), (1, 0), (1, 1))},
    "slow-first": {"counts": [4, 8, 8], "slow": 0, "delay": 0.05},
}


@pytest.mark.parametrize("case", list(TURNS))
def test_an_iterable_datasets_batches_come_from_the_workers_in_turn(
    case: str,
) -> None:
    """in_order over an IterableDataset: DataLoader's order, every epoch,
    persistent or not, after a break: worker 0, 1, 2, ... in turn, skipping
    a worker whose stream ended, each failed item in its worker's turn,
    whichever worker is quicker (the slow one is waited for)."""
    dataset = Turns(**TURNS[case])  # type: ignore[arg-type]
    workers = len(dataset.counts)
    opts: dict[str, Any] = {"batch_size": None, "num_workers": workers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's: more workers than CPUs
        want = items_in_order(TorchLoader(dataset, **opts))
        assert sorted(map(str, want)) == sorted(
            map(str, items_in_order(TorchLoader(dataset, **opts, in_order=False)))
        )
        for persistent in (False, True):
            loader = DataLoader(dataset, **opts, persistent_workers=persistent)
            assert items_in_order(loader, stop=3) == want[:3]
            for _ in range(2):
                assert items_in_order(loader) == want


def test_random_sampler_with_a_generator_matches_torch() -> None:
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    want = [
        b[1].tolist()
        for b in TorchLoader(Mixed(10), batch_size=3, shuffle=True, generator=g1)
    ]
    got = [
        b[1].tolist()
        for b in DataLoader(
            Mixed(10), batch_size=3, shuffle=True, generator=g2, num_workers=2
        )
    ]
    assert got == want
    sampler = BatchSampler(RandomSampler(range(10)), 4, drop_last=True)
    assert len(list(DataLoader(Mixed(10), batch_sampler=sampler, num_workers=1))) == 2


class Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import time

        time.sleep(5)
        return i


def test_prefetcher_iterates_a_torch_iterable_dataset_with_a_len() -> None:
    """Its len does not make it map-style: each worker iterates it as a
    sample stream, and torch's get_worker_info() shards it."""
    with fastq.Prefetcher(Sharded(9), batch_size=2, workers=2) as pf:
        got = sorted(int(i) for batch in pf for i in batch)
    assert got == list(range(9))


def test_an_abandoned_epoch_leaves_the_next_one_whole_with_persistent_workers() -> None:
    # The next epoch's plans reuse entries that the abandoned epoch's tasks
    # in flight may still read: those tasks are skipped, never mixed in.
    loader = DataLoader(Mixed(60), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(3):
        it = iter(loader)
        next(it)
        next(it)
        del it
        got = [x for b in loader for x in b[1].tolist()]
        assert got == list(range(60))
    loader.close()


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
