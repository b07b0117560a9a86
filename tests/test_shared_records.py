"""fastq.shared_records: a list of Python records kept once in shared memory,
read back as the same values in this process and in workers of every
start method, without the workers copying it; and the warning that names
a large list of Python objects a dataset holds."""

from __future__ import annotations

import collections
import enum
import gc
import math
import os
import pickle
import threading
import warnings
from typing import Any

import numpy as np
import pytest
from helpers import HoldsRecords, ReadsRecords, annotation, make_record, mapping_inode
from process_checks import ring_mappings

import fastq
from fastq._bench.procstat import total_pss
from fastq._workers import _copied_objects

PICKLING = [
    m
    for m in ("forkserver", "spawn")
    if m in __import__("multiprocessing").get_all_start_methods()
]
N = 60  # records in the workers' tests


def records_mapped() -> list[str]:
    return [line for line in ring_mappings() if "fastq-shared-records" in line]


def batches_of(loader: Any) -> dict[str, np.ndarray]:
    out: dict[str, list[np.ndarray]] = {}
    for batch in loader:
        for name, value in batch.items():
            out.setdefault(name, []).append(np.asarray(value).copy())  # not the slot
    return {name: np.concatenate(values) for name, values in out.items()}


# ------------------------------------------------------------ in this process


def test_values_round_trip_exactly_with_their_types() -> None:
    want = [make_record(i) for i in range(N)]
    records = fastq.shared_records(want)
    assert len(records) == N
    # repr tells 1 from 1.0 and True, a tuple from a list, -0.0 from 0.0,
    # and shows a NaN, which == would not find equal.
    assert [repr(r) for r in records] == [repr(r) for r in want]
    assert repr(records[7]) == repr(want[7])
    assert repr(records[-1]) == repr(want[-1])
    assert repr(records[np.int64(4)]) == repr(want[4])
    assert records[5] is not records[5]  # a new copy at every read
    with pytest.raises(IndexError, match=f"record index {N} out of range"):
        records[N]
    with pytest.raises(IndexError):
        records[-N - 1]
    with pytest.raises(TypeError):
        records[1.0]  # type: ignore[call-overload]


class Level(enum.IntEnum):
    LOW = 1


class Name(str):
    pass


def every_kind() -> list[Any]:
    """Records of each type a store keeps, plain or not (what a compact
    encoding or marshal would turn into its base type is here)."""
    surrogate = "\udc80"
    return [
        None,
        True,
        0,
        (1 << 63) - 1,
        -(1 << 63),
        1 << 63,
        -(1 << 200),
        1.5,
        float("nan"),
        -0.0,
        float("inf"),
        2 - 3j,
        "",
        "plain ascii",
        "é€😀" + surrogate,
        b"\x00\xff",
        [],
        (),
        {},
        set(),
        frozenset(),
        [1, [2, (3, {"x": [4.0, None]})], {5, "six", (7, 8.5)}],
        {"set": {1, 2}, "frozen": frozenset({"a", (1, 2)}), "c": 1j},
        {"level": Level.LOW, "flag": True, "n": 1},
        [Name("sub"), "str"],
        {Name("key"): 1},
        bytearray(b"abc"),
        {"buffer": bytearray(b"xy"), "view": [np.int64(3), np.float32(0.5)]},
        np.float64(2.5),
        {"array": np.arange(3, dtype=np.int16)},
        collections.OrderedDict(a=1),
        collections.defaultdict(list, a=[1]),
    ]


def same(got: Any, want: Any) -> bool:
    """Equal, and of the same type at every level (NaN equal to NaN, -0.0
    not equal to 0.0, a dict's keys in the same order)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return bool(got == want) and math.copysign(1, got) == math.copysign(1, want)
    if isinstance(want, np.ndarray):
        return got.dtype == want.dtype and np.array_equal(got, want)
    if isinstance(want, np.generic):
        return bool(got.dtype == want.dtype and got == want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return same(list(got), list(want)) and same(
            list(got.values()), list(want.values())
        )
    if isinstance(want, (set, frozenset)):
        return sorted(map(repr, got)) == sorted(map(repr, want)) and got == want
    return bool(got == want)


def test_every_type_reads_back_exactly() -> None:
    want = every_kind()
    records = fastq.shared_records(want)
    for i, record in enumerate(want):
        assert same(records[i], record), (i, records[i], record)
    assert [same(got, w) for got, w in zip(records, want)] == [True] * len(want)
    again = pickle.loads(pickle.dumps(records))
    assert all(same(again[i], w) for i, w in enumerate(want))


def test_dicts_keep_their_own_keys_and_order() -> None:
    """Dicts of one key set are stored by their values, the keys once: a
    dict of other keys, of the same keys in another order, or of keys
    equal to strings' but not strings, keeps its own."""
    want: list[Any] = [
        {"a": 1, "b": 2},
        {"b": 2, "a": 1},
        {"a": 1},
        {},
        {"a": 1, "b": 2, "c": 3},
        {"a": 3, "b": [4]},
        {1: "one", 2: "two"},
        {True: "one", 2: "two"},
        {1.0: "one", 2: "two"},
        {"a": 1, 2: "b"},
        {Name("a"): 1, "b": 2},
    ]
    records = fastq.shared_records(want + want)
    for i, record in enumerate(want + want):
        assert same(records[i], record), (i, records[i], record)
    assert records[5] is not records[5] and records[5]["b"] is not records[5]["b"]


def test_more_key_sets_than_a_tag_names() -> None:
    want = [{f"key{i}": i, "value": str(i)} for i in range(600)]
    records = fastq.shared_records(want + want[::-1])
    assert all(same(got, w) for got, w in zip(records, want + want[::-1]))


def test_a_record_too_deep_or_holding_itself_reads_back() -> None:
    deep: list[Any] = [0]
    for _ in range(300):
        deep = [deep]
    itself: list[Any] = [1]
    itself.append(itself)
    records = fastq.shared_records([deep, itself, {"x": itself}])
    assert records[0] == deep
    got = records[1]
    assert got[0] == 1 and got[1] is got
    held = records[2]["x"]
    assert held[1] is held


@pytest.mark.parametrize(
    "where", [slice(2, 9), slice(None, None, -1), slice(1, None, 4), slice(5, 2)]
)
def test_a_slice_is_a_view_of_the_same_memory(where: slice) -> None:
    want = [make_record(i) for i in range(20)]
    records = fastq.shared_records(want)
    part = records[where]
    assert isinstance(part, fastq.SharedRecords)
    assert [repr(r) for r in part] == [repr(r) for r in want[where]]
    assert part._data is records._data  # no copy of the records' bytes
    assert len(part) == len(want[where])


def test_records_come_from_any_iterable_and_pickle_whole() -> None:
    records = fastq.shared_records(make_record(i) for i in range(10))
    again = pickle.loads(pickle.dumps(records))
    assert [repr(r) for r in again] == [repr(make_record(i)) for i in range(10)]
    assert len(fastq.shared_records([])) == 0


@pytest.mark.parametrize(
    "record,named",
    [
        ({"ok": 1, "lock": [threading.Lock()]}, "holds a _thread.lock"),
        (lambda: 1, "is a function"),
        ({"gen": (i for i in range(3))}, "holds a generator"),
    ],
    ids=["lock", "lambda", "generator"],
)
def test_a_record_that_cannot_be_stored_is_named(record: Any, named: str) -> None:
    with pytest.raises(fastq.ConfigError) as info:
        fastq.shared_records([make_record(0), make_record(1), record])
    message = str(info.value)
    assert f"record 2 {named}" in message or f"record 2 (a dict) {named}" in message
    assert "Fix: keep what opens or runs something" in message


def test_memory_is_gone_with_the_last_view() -> None:
    records = fastq.shared_records([make_record(i) for i in range(10)])
    part = records[2:5]
    assert records_mapped()
    del records
    gc.collect()
    assert records_mapped()  # the slice still reads it
    del part
    gc.collect()
    assert records_mapped() == []


# ------------------------------------------------------------ in workers


def test_forked_workers_read_the_same_values_under_the_prefetcher() -> None:
    records = fastq.shared_records([make_record(i) for i in range(N)])
    with fastq.Prefetcher(
        HoldsRecords(records), batch_size=4, workers=2, shuffle=True
    ) as pf:
        got = batches_of(pf)
    assert got["same"].all() and len(got["same"]) == N
    assert set(got["inode"].tolist()) == {mapping_inode(records._data)}


def test_forked_workers_read_the_same_values_under_the_dataloader() -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    records = fastq.shared_records([make_record(i) for i in range(N)])
    loader = DataLoader(HoldsRecords(records), batch_size=4, num_workers=2)
    got = batches_of(loader)
    assert got["same"].all() and len(got["same"]) == N
    assert set(got["inode"].tolist()) == {mapping_inode(records._data)}


@pytest.mark.parametrize("start_method", PICKLING)
def test_spawned_workers_map_the_same_memory(start_method: str) -> None:
    records = fastq.shared_records([make_record(i) for i in range(N)])
    with fastq.Prefetcher(
        HoldsRecords(records[10:], first=10),
        batch_size=4,
        workers=2,
        start_method=start_method,
    ) as pf:
        got = batches_of(pf)
    assert got["same"].all() and len(got["same"]) == N - 10
    assert set(got["inode"].tolist()) == {mapping_inode(records._data)}


@pytest.mark.parametrize("start_method", ["fork", *PICKLING])
def test_nothing_is_left_after_a_worker_is_killed(start_method: str) -> None:
    records = fastq.shared_records([make_record(i) for i in range(N)])
    with (
        pytest.raises(fastq.WorkerDied, match="SIGKILL"),
        fastq.Prefetcher(
            HoldsRecords(records, kill_at=21),
            batch_size=4,
            workers=2,
            start_method=start_method,
        ) as pf,
    ):
        for _ in pf:
            pass
    del records, pf
    gc.collect()
    assert records_mapped() == []


def test_workers_do_not_copy_the_records() -> None:
    """Total PSS of this process and its workers over one shuffled epoch
    that reads every record: a list is copied into each worker (by the
    pages its reads write reference counts on); shared records are not."""
    n = 100_000
    list_bytes = _bytes_of(lambda: [annotation(i) for i in range(n)])
    records = fastq.shared_records(annotation(i) for i in range(n))
    for _record in records:  # maps every page here: PSS counts them from now
        pass
    with fastq.Prefetcher(
        ReadsRecords(records), batch_size=500, workers=2, shuffle=True, seed=0
    ) as pf:
        it = iter(pf)
        next(it)
        before = total_pss(os.getpid())
        for _ in it:
            pass
        added = total_pss(os.getpid()) - before  # the workers are still up
    # A list adds about 2 copies here (each worker reads half the records,
    # and so nearly every page); a generous bound for what is not copying.
    assert added < 0.25 * list_bytes, (added, list_bytes)


def _bytes_of(make: Any) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        made = make()
        return int(tracemalloc.get_traced_memory()[0] + 0 * len(made))
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------ the warning


class FewOfMany:
    """Eight samples, from a dataset that holds many records."""

    def __init__(self, records: Any, **more: Any) -> None:
        self.records = records
        self.__dict__.update(more)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(self.records[i]["id"])


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(_copied_objects, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def copied_warnings(caught: list[Any]) -> list[Any]:
    return [w for w in caught if issubclass(w.category, fastq.CopiedDataWarning)]


def many_annotations() -> list[dict[str, Any]]:
    return [annotation(i) for i in range(120_000)]  # about 85 MiB


def test_a_large_list_of_records_is_named_once(fresh_warnings: Any) -> None:
    dataset = FewOfMany(many_annotations())
    for _ in range(2):
        with fastq.Prefetcher(dataset, batch_size=4, workers=1) as pf:
            list(pf)
    (warned,) = copied_warnings(fresh_warnings)
    message = str(warned.message)
    assert message.startswith("source.records is a list of 120,000 Python objects")
    assert "MiB per worker" in message
    assert "self.records = fastq.shared_records(self.records)" in message
    assert warned.filename == __file__  # the line that started the workers


def test_the_dataloader_names_it_from_the_dataset(fresh_warnings: Any) -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    dataset = FewOfMany(
        [annotation(i) for i in range(8)], held={"annotations": many_annotations()}
    )
    list(DataLoader(dataset, batch_size=4, num_workers=1))
    (warned,) = copied_warnings(fresh_warnings)
    assert str(warned.message).startswith(
        "dataset.held['annotations'] is a list of 120,000"
    )
    assert warned.filename == __file__


def test_small_containers_and_shared_records_are_not_named(
    fresh_warnings: Any,
) -> None:
    dataset = FewOfMany(
        [annotation(i) for i in range(100)],
        ids=list(range(5000)),
        index={i: (i, str(i)) for i in range(2000)},
        shared=fastq.shared_records(many_annotations()),
    )
    with fastq.Prefetcher(dataset, batch_size=4, workers=1) as pf:
        list(pf)
    assert copied_warnings(fresh_warnings) == []


def test_an_array_of_python_objects_is_named(
    fresh_warnings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A numpy array of dtype object (a pandas column of strings) holds
    Python objects as a list does; other arrays hold none."""
    monkeypatch.setattr(_copied_objects, "WARN_AT_BYTES", 1 << 20)
    names = np.array([f"images/{i:08d}.jpg" for i in range(20_000)], dtype=object)
    dataset = FewOfMany(
        [annotation(i) for i in range(8)],
        names=names,
        numbers=np.arange(1 << 20),
    )
    with fastq.Prefetcher(dataset, batch_size=4, workers=1) as pf:
        list(pf)
    (warned,) = copied_warnings(fresh_warnings)
    message = str(warned.message)
    assert message.startswith(
        "source.names is a numpy array (dtype object) of 20,000 Python objects"
    )
    assert "self.names = fastq.shared_array(self.names.tolist())" in message


class NoLength(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise RuntimeError("no length here")


def test_a_container_that_cannot_be_looked_at_does_not_stop_workers(
    fresh_warnings: Any,
) -> None:
    dataset = FewOfMany([annotation(i) for i in range(8)], odd=NoLength([1, 2]))
    with fastq.Prefetcher(dataset, batch_size=4, workers=1) as pf:
        assert len(list(pf)) == 2
    assert copied_warnings(fresh_warnings) == []
