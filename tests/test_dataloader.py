"""fastq.torch.DataLoader: DataLoader's signature and meaning, with fastq's
workers behind the iterator. Each test compares with torch's own DataLoader
where there is something to compare."""

from __future__ import annotations

import gc
import inspect
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
)
from torch_helpers.loader_checks import children, same  # noqa: E402
from torch_helpers.loader_data import (  # noqa: E402
    Augmented,
    Growing,
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


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("kind", ["map-style", "iterable"])
def test_an_unnamed_loader_serves_its_whole_epoch_then_leaves_nothing(
    kind: str, persistent: bool
) -> None:
    """`for batch in DataLoader(...)`, as everyday PyTorch code writes it:
    torch's batches, bit for bit; once the loop is done the workers are
    gone (by reference count alone, no collector pass), and nothing is
    said that DataLoader does not say."""

    def loader(cls: Any) -> Any:
        # Ours keeps every batch in its slot (slots=8: no copies); torch's
        # iterable one runs the same two workers' shards.
        ours = {"num_workers": 2, "persistent_workers": persistent, "slots": 8}
        if kind == "map-style":
            options = ours if cls is DataLoader else {}
            return cls(Mixed(23), batch_size=4, shuffle=True, **options)
        options = ours if cls is DataLoader else {"num_workers": 2}
        return cls(Sharded(23), batch_size=4, **options)

    torch.manual_seed(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's: more workers than CPUs
        want = list(loader(TorchLoader))
    torch.manual_seed(7)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.disable()
        try:
            for batch in loader(DataLoader):
                got.append(batch)
            left = children()
        finally:
            gc.enable()
    assert left == [], "the workers outlived the loop and the loader"
    assert [str(w.message) for w in caught] == []
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert same(g, w), (g, w)


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
    # torch's own iterator, in this process, kept with its place for state_dict()
    assert type(iter(loader)._it).__name__ == "_SingleProcessDataLoaderIter"
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


def test_keeping_every_batch_degrades_to_copies_silently_as_dataloader_keeps() -> None:
    """`torch.cat(list(loader))` runs silently under torch's DataLoader, and
    so under `-W error` too: past the slots fastq copies, and counts it."""
    loader = DataLoader(
        Mixed(200), batch_size=2, num_workers=2, persistent_workers=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = list(loader)
    assert len(kept) == 100
    assert [x for b in kept for x in b[1].tolist()] == list(range(200))
    assert 0 < loader.stats()["copied_batches"] < 100
    del kept
    loader.close()


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


class Slow(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each sample takes 5 s: past any timeout the tests give."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import time

        time.sleep(5)
        return i


def test_timeout_is_catchable_as_dataloaders() -> None:
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
