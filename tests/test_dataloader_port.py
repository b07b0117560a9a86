"""PyTorch's test/test_dataloader.py, ported to pytest for fastq.torch.DataLoader.

Each test asserts the behaviour of one test of PyTorch's file (named in its
docstring), rewritten for a drop-in DataLoader: small datasets, at most two
workers, no private attributes. The datasets and functions that travel to
workers are in torch_helpers/dataloader_port_data.py, importable by spawn and
forkserver workers.

FASTQ_PORT_AGAINST selects the class under test: "fastq" (the default) for
fastq.torch.DataLoader, "torch" for torch.utils.data.DataLoader, which
validates the tests themselves::

    FASTQ_PORT_AGAINST=torch python -m pytest tests/test_dataloader_port.py

Where fastq deliberately differs from DataLoader (its migration table), the
test is an expected failure, strict, against fastq only.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
import typing
import warnings
from collections import Counter
from typing import Any, NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import (  # noqa: E402
    ChainDataset,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    random_split,
)
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

AGAINST = os.environ.get("FASTQ_PORT_AGAINST", "fastq")
if AGAINST not in ("fastq", "torch"):
    raise ValueError(f"FASTQ_PORT_AGAINST={AGAINST!r}: use 'fastq' or 'torch'")
FASTQ = AGAINST == "fastq"

START_METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()
]

PERSISTENT = pytest.mark.parametrize(
    "persistent_workers", [False, True], ids=["transient", "persistent"]
)


def fastq_default(argument: str) -> Any:
    """The default of one of fastq.torch.DataLoader's arguments (None when
    not testing fastq, or before the class exists)."""
    if not FASTQ:
        return None
    try:
        from fastq.torch import DataLoader as FastqDataLoader
    except ImportError:
        return None
    return inspect.signature(FastqDataLoader).parameters[argument].default


def migration(reason: str, condition: bool = True) -> pytest.MarkDecorator:
    """A deliberate difference of fastq's DataLoader: fails against fastq."""
    return pytest.mark.xfail(
        FASTQ and condition, strict=True, reason=f"migration table: {reason}"
    )


@pytest.fixture(scope="module")
def DataLoader() -> Any:
    """The class under test."""
    if AGAINST == "torch":
        return torch.utils.data.DataLoader
    from fastq.torch import DataLoader as FastqDataLoader

    assert issubclass(FastqDataLoader, torch.utils.data.DataLoader)
    return FastqDataLoader


class Tensors(NamedTuple):
    data: Any
    labels: Any
    dataset: Any


@pytest.fixture
def td() -> Tensors:
    """100 random samples of shape (2, 3, 5); labels 0..49 permuted, twice."""
    g = torch.Generator().manual_seed(0)
    data = torch.randn(100, 2, 3, 5, generator=g)
    labels = torch.randperm(50, generator=g).repeat(2)
    return Tensors(data, labels, TensorDataset(data, labels))


# ------------------------------------------------------------------ helpers


def check_sequential(loader: Any, td: Tensors) -> None:
    """Batches (or samples, for batch_size=None) in dataset order."""
    bs = loader.batch_size
    n = 0
    for i, (sample, target) in enumerate(loader):
        if bs is None:
            assert torch.equal(sample, td.data[i])
            assert torch.equal(target, td.labels[i])
        else:
            assert torch.equal(sample, td.data[i * bs : (i + 1) * bs])
            assert torch.equal(target, td.labels[i * bs : (i + 1) * bs])
        n += 1
    assert n == (len(td.dataset) if bs is None else math.ceil(len(td.dataset) / bs))


def check_shuffled(loader: Any, td: Tensors) -> None:
    """Every sample exactly once, each with its own label."""
    index_of = {tuple(row.flatten().tolist()): i for i, row in enumerate(td.data)}
    assert len(index_of) == len(td.data)
    bs = loader.batch_size
    seen: list[int] = []
    batches = 0
    for samples, targets in loader:
        pairs = [(samples, targets)] if bs is None else list(zip(samples, targets))
        if bs is not None:
            assert len(pairs) <= bs
        for sample, target in pairs:
            i = index_of[tuple(sample.flatten().tolist())]
            assert int(target) == int(td.labels[i])
            seen.append(i)
        batches += 1
    assert sorted(seen) == list(range(len(td.data)))
    assert batches == (len(td.data) if bs is None else math.ceil(len(td.data) / bs))


def count_errors(loader: Any, error: type[BaseException]) -> int:
    """next() until StopIteration, counting `error`s (bounded: a loader that
    raises forever fails instead of hanging)."""
    it = iter(loader)
    errors = 0
    for _ in range(len(loader) + 5):
        try:
            next(it)
        except error as exc:
            forget_frames(exc)  # see raises_in_loop
            errors += 1
        except StopIteration:
            return errors
    pytest.fail(f"no StopIteration after {len(loader) + 5} next() calls")


class raises_in_loop:
    """pytest.raises for an error out of a loader's iterator, which then
    clears the frames of the caught traceback. They hold the iterator in a
    reference cycle (a frame that re-raises refers to its exception), and
    torch's iterator, when the garbage collector finalizes it, waits 5 s per
    worker for workers its closed queues no longer reach. Cleared, the
    iterator is freed, and shuts down, with its last name. (A class, not a
    generator: a generator's frame would join the traceback's cycle.)"""

    def __init__(
        self,
        expected: type[BaseException] | tuple[type[BaseException], ...],
        match: str | None = None,
    ) -> None:
        self.raises = pytest.raises(expected, match=match)

    def __enter__(self) -> pytest.ExceptionInfo[Any]:
        return self.raises.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        suppress = bool(self.raises.__exit__(*exc_info))
        forget_frames(exc_info[1])
        return suppress


def forget_frames(exc: BaseException | None) -> None:
    """Clears the frames of an exception's traceback (and its causes')."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            with contextlib.suppress(RuntimeError):  # a frame still running
                tb.tb_frame.clear()
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie or a reaped pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# How long workers may take to exit once nothing needs them: a bound for a
# loaded machine, not a timing; waiting for them is polled.
PROMPT_EXIT_S = 5.0


def wait_gone(pids: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            pytest.fail(f"workers still alive: {[p for p in pids if alive(p)]}")
        time.sleep(0.05)


# A script's import of the DataLoader under test (its environment names it).
IMPORT_DATALOADER = (
    "if os.environ['FASTQ_PORT_AGAINST'] == 'torch':\n"
    "    from torch.utils.data import DataLoader\n"
    "else:\n"
    "    from fastq.torch import DataLoader\n"
)


def script_env() -> dict[str, str]:
    """The environment of a script a test runs: the class under test named,
    and this directory importable ahead of whatever PYTHONPATH already
    holds (the fastq under test, for one)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, FASTQ_PORT_AGAINST=AGAINST, PYTHONPATH=path)


def run_script(script: Any) -> subprocess.CompletedProcess[str]:
    """Runs a script a test wrote, in script_env(), within a bound."""
    return subprocess.run(
        [sys.executable, str(script)],
        env=script_env(),
        timeout=50,
        capture_output=True,
        text=True,
    )


def assert_like(got: Any, want: Any, path: str = "batch") -> None:
    """`got` has the structure and types of `want` (made by default_collate
    or default_convert in this process): the same containers, tensors of the
    same dtype and shape, leaves of the same type."""
    assert type(got) is type(want), (
        f"{path}: {type(got).__name__}, torch gives {type(want).__name__}"
    )
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for key in want:
            assert_like(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for k, (g, w) in enumerate(zip(got, want)):
            assert_like(g, w, f"{path}[{k}]")


def ints(loader: Any) -> list[int]:
    return [int(x) for x in loader]


# ------------------------------------------------- sequential and shuffled


def test_sequential_nonbatch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_nonbatch"""
    check_sequential(DataLoader(td.dataset, batch_size=None), td)


def test_sequential_batch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_batch"""
    check_sequential(DataLoader(td.dataset), td)
    check_sequential(DataLoader(td.dataset, batch_size=2), td)


@PERSISTENT
def test_sequential_workers(
    DataLoader: Any, td: Tensors, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_workers (and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        td.dataset, num_workers=2, persistent_workers=persistent_workers
    )
    check_sequential(loader, td)


def test_seqential_batch_workers(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_seqential_batch_workers"""
    check_sequential(DataLoader(td.dataset, batch_size=2, num_workers=2), td)


def test_seqential_batch_workers_prefetch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_seqential_batch_workers_prefetch"""
    loader = DataLoader(td.dataset, batch_size=2, num_workers=2, prefetch_factor=3)
    check_sequential(loader, td)


def test_shuffle(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle"""
    check_shuffled(DataLoader(td.dataset, shuffle=True), td)


def test_shuffle_batch_none(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_none"""
    check_shuffled(DataLoader(td.dataset, batch_size=None, shuffle=True), td)


def test_shuffle_batch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch"""
    check_shuffled(DataLoader(td.dataset, batch_size=2, shuffle=True), td)


@PERSISTENT
def test_shuffle_workers(
    DataLoader: Any, td: Tensors, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_workers (and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        td.dataset, shuffle=True, num_workers=2, persistent_workers=persistent_workers
    )
    check_shuffled(loader, td)


def test_shuffle_batch_workers(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_workers"""
    loader = DataLoader(td.dataset, batch_size=2, shuffle=True, num_workers=2)
    check_shuffled(loader, td)


def test_shuffle_batch_workers_prefetch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_workers_prefetch"""
    loader = DataLoader(
        td.dataset, batch_size=2, shuffle=True, num_workers=2, prefetch_factor=3
    )
    check_shuffled(loader, td)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducibility(
    DataLoader: Any, td: Tensors, num_workers: int
) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_reproducibility (also
    list() of a loader of 100 batches)"""

    def epoch() -> list[tuple[Any, Any]]:
        loader = DataLoader(
            td.dataset,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )
        return [(x.clone(), y.clone()) for x, y in list(loader)]

    first, second = epoch(), epoch()
    assert len(first) == len(second) == 100
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


# --------------------------------------------------------------- samplers


def test_random_sampler(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_random_sampler (the samples a
    loader delivers from each RandomSampler, rather than the sampler alone)"""
    ds = port.CountingDataset(100)

    def stat(sampler: Any) -> tuple[int, int, int, int]:
        counts = Counter(ints(DataLoader(ds, batch_size=None, sampler=sampler)))
        repeated = sum(c > 1 for c in counts.values())
        return repeated, min(counts), max(counts), sum(counts.values())

    repeated, lo, hi, total = stat(RandomSampler(ds, replacement=True, num_samples=101))
    assert repeated > 0 and lo >= 0 and hi < 100 and total == 101

    assert stat(RandomSampler(ds)) == (0, 0, 99, 100)
    assert stat(RandomSampler(ds, num_samples=200)) == (100, 0, 99, 200)
    repeated, lo, hi, total = stat(RandomSampler(ds, num_samples=99))
    assert repeated == 0 and lo >= 0 and hi < 100 and total == 99
    assert stat(RandomSampler(ds, num_samples=101)) == (1, 0, 99, 101)


@pytest.mark.parametrize("replacement", [True, False])
def test_random_sampler_len(DataLoader: Any, replacement: bool) -> None:
    """test_dataloader.py: TestDataLoader.test_random_sampler_len_with_replacement
    and test_random_sampler_len_without_replacement (plus one epoch of the
    batch_size=6 loader)"""
    ds = port.CountingDataset(100)
    sampler = RandomSampler(ds, replacement=replacement, num_samples=105)
    assert len(DataLoader(ds, batch_size=1, sampler=sampler)) == 105
    loader = DataLoader(ds, batch_size=6, sampler=sampler)
    assert len(loader) == math.ceil(105 / 6)
    batches = [b.tolist() for b in loader]
    assert len(batches) == len(loader)
    assert sum(map(len, batches)) == 105


def test_duplicating_data_with_drop_last(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_duplicating_data_with_drop_last"""
    num_processes, num_batches = 4, 9
    data = torch.IntTensor(range(num_batches))
    scanned = []
    for rank in range(num_processes):
        sampler = DistributedSampler(data, num_processes, rank)
        loader = DataLoader(
            data,
            batch_size=num_batches // num_processes,
            drop_last=True,
            sampler=sampler,
        )
        for batch in loader:
            scanned += batch.tolist()
    assert len(scanned) == len(set(scanned)) == 8


def test_distributed_sampler_set_epoch(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_duplicating_data_with_drop_last
    (extended to shuffle=True: set_epoch() between epochs of the same
    loaders gives each epoch its order, the ranks together cover the data,
    and the same epoch gives the same order again)"""
    ds = port.CountingDataset(10)
    samplers = [
        DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0)
        for r in (0, 1)
    ]
    loaders = [
        DataLoader(ds, batch_size=None, sampler=s, num_workers=1) for s in samplers
    ]

    def epoch(e: int) -> list[list[int]]:
        for s in samplers:
            s.set_epoch(e)
        return [ints(loader) for loader in loaders]

    e0, e1, e0_again = epoch(0), epoch(1), epoch(0)
    for ranks in (e0, e1):
        assert sorted(ranks[0] + ranks[1]) == list(range(10))
    assert e0 == e0_again
    assert e0 != e1


SAMPLERS = {
    "random_replacement": lambda ds, g: RandomSampler(
        ds, num_samples=5, replacement=True, generator=g
    ),
    "random": lambda ds, g: RandomSampler(ds, replacement=False, generator=g),
    "weighted_replacement": lambda ds, g: WeightedRandomSampler(
        [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], num_samples=5, replacement=True, generator=g
    ),
    "weighted": lambda ds, g: WeightedRandomSampler(
        [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], num_samples=5, replacement=False, generator=g
    ),
    "subset": lambda ds, g: SubsetRandomSampler(range(10), generator=g),
}


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_sampler_reproducibility(DataLoader: Any, kind: str) -> None:
    """test_dataloader.py: TestDataLoader.test_sampler_reproducibility (through
    a loader with a worker: a seeded generator gives the same samples; with
    no generator, the same torch.manual_seed gives the same two epochs)"""
    ds = port.CountingDataset(100)

    def with_generator() -> list[int]:
        sampler = SAMPLERS[kind](ds, torch.Generator().manual_seed(42))
        return ints(DataLoader(ds, batch_size=None, sampler=sampler, num_workers=1))

    assert with_generator() == with_generator()

    loader = DataLoader(
        ds, batch_size=None, sampler=SAMPLERS[kind](ds, None), num_workers=1
    )
    torch.manual_seed(0)
    first = ints(loader) + ints(loader)
    torch.manual_seed(0)
    second = ints(loader) + ints(loader)
    assert first == second


SAMPLER_VARIANTS = [
    pytest.param({}, id="in-process"),
    pytest.param({"num_workers": 2}, id="workers"),
]


@pytest.mark.parametrize("kwargs", SAMPLER_VARIANTS)
def test_sampler(DataLoader: Any, td: Tensors, kwargs: dict[str, Any]) -> None:
    """test_dataloader.py: TestDataLoader.test_sampler (a range as sampler)"""
    loader = DataLoader(td.dataset, sampler=range(2, 12), batch_size=2, **kwargs)
    assert len(loader) == 5
    n = 0
    for i, (inp, _target) in enumerate(loader):
        assert len(inp) == 2
        assert torch.equal(inp, td.data[i * 2 + 2 : i * 2 + 4])
        n += 1
    assert n == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        *SAMPLER_VARIANTS,
        pytest.param(
            {"num_workers": 2, "multiprocessing_context": "spawn"}, id="spawn"
        ),
    ],
)
def test_batch_sampler(DataLoader: Any, td: Tensors, kwargs: dict[str, Any]) -> None:
    """test_dataloader.py: TestDataLoader.test_batch_sampler (batches of 2 and
    3 in turn from a list of tuples)"""
    batches = []
    for i in range(0, 20, 5):
        batches.append(tuple(range(i, i + 2)))
        batches.append(tuple(range(i + 2, i + 5)))
    loader = DataLoader(td.dataset, batch_sampler=batches, **kwargs)
    assert len(loader) == 8
    n = 0
    for i, (inp, _target) in enumerate(loader):
        offset = i * 5 // 2
        size = 2 if i % 2 == 0 else 3
        assert len(inp) == size
        assert torch.equal(inp, td.data[offset : offset + size])
        n += 1
    assert n == 8


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bulk_loading_nobatch(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_bulk_loading_nobatch (without
    the private _auto_collation and CUDA pinning)"""
    ds = port.BulkLoadingDataset(35)
    sampler = port.BulkLoadingSampler(ds, batch_size=4)
    loader = DataLoader(ds, num_workers=num_workers, batch_size=None, sampler=sampler)
    samples = list(loader)
    assert len(samples) == 9
    assert sorted(torch.cat(samples, 0).tolist()) == list(range(35))


# ------------------------------------------------------------- collation


def test_numpy(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_numpy"""
    batch = next(iter(DataLoader(port.NumpyDataset(), batch_size=12)))
    assert isinstance(batch, torch.Tensor)
    assert batch.dtype == torch.float64
    assert batch.shape == (12, 2, 3, 4)
    assert torch.equal(batch[5], torch.full((2, 3, 4), 5.0, dtype=torch.float64))


NUMPY_SCALARS = {
    np.float64: torch.float64,
    np.float32: torch.float32,
    np.float16: torch.float16,
    np.int64: torch.int64,
    np.int32: torch.int32,
    np.int16: torch.int16,
    np.int8: torch.int8,
    np.uint8: torch.uint8,
}


def test_numpy_scalars(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_numpy_scalars"""
    for dtype, expected in NUMPY_SCALARS.items():
        batch = next(iter(DataLoader(port.ScalarDataset(dtype), batch_size=2)))
        assert isinstance(batch, torch.Tensor), dtype
        assert batch.dtype == expected, dtype
        assert batch.tolist() == [0, 1], dtype


def test_default_collate_dtype(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_dtype (collated
    in a worker: Python numbers become tensors of their dtype, strings stay
    a list)"""
    for samples, dtype in (
        ([1, 2, -1], torch.int64),
        ([1.1, 2.3, -0.9], torch.float64),
        ([True, False], torch.bool),
        (["a", "b", "c"], None),
    ):
        loader = DataLoader(
            port.ListDataset(samples), batch_size=len(samples), num_workers=1
        )
        (batch,) = list(loader)
        if dtype is None:
            assert type(batch) is list
            assert batch == samples
        else:
            assert isinstance(batch, torch.Tensor), samples
            assert batch.dtype == dtype, samples
            assert batch.tolist() == samples


def test_default_collate_mapping_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_mapping_keep_type
    (collated in a worker)"""
    samples = [port.CustomDict({"a": 1, "b": 2}), port.CustomDict({"a": 3, "b": 4})]
    loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
    (batch,) = list(loader)
    assert type(batch) is port.CustomDict
    assert sorted(batch) == ["a", "b"]
    assert batch["a"].tolist() == [1, 3]
    assert batch["b"].tolist() == [2, 4]


def test_default_collate_sequence_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_sequence_keep_type
    (collated in a worker)"""
    samples = [port.CustomList([1, 2, 3]), port.CustomList([4, 5, 6])]
    loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
    (batch,) = list(loader)
    assert type(batch) is port.CustomList
    assert [t.tolist() for t in batch] == [[1, 4], [2, 5], [3, 6]]


def test_default_collate_sequence_dont_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_sequence_dont_keep_type
    (collated in a worker: range samples give a list)"""
    loader = DataLoader(
        port.ListDataset([range(2), range(2)]), batch_size=2, num_workers=1
    )
    (batch,) = list(loader)
    assert type(batch) is list
    assert [t.tolist() for t in batch] == [[0, 0], [1, 1]]


def test_default_collate_bad_numpy_types(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_bad_numpy_types
    (batches of string and object arrays: collate's TypeError reaches the
    loop as a TypeError)"""
    for sample in (
        np.array([[["a", "b", "c"]]]),
        np.array([1, "x", None], dtype=object),
        np.array([[[1, "x", None]]], dtype=object),
    ):
        loader = DataLoader(
            port.ListDataset([sample, sample]), batch_size=2, num_workers=1
        )
        with raises_in_loop(TypeError):
            next(iter(loader))


def test_default_collate_bad_sequence_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_bad_sequence_type
    (lists of unequal length, either way round: collate's RuntimeError
    reaches the loop)"""
    for samples in ([["X"], ["X", "X"]], [["X", "X"], ["X"]]):
        loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
        with raises_in_loop(RuntimeError, match="equal size"):
            next(iter(loader))


def test_string_dataset_shuffle(DataLoader: Any) -> None:
    """test_dataloader.py: TestStringDataLoader.test_shuffle_pin_memory (without
    pin_memory: (str, int) samples give default_collate's tuple of str and a
    tensor)"""
    loader = DataLoader(port.StringDataset(), batch_size=2, shuffle=True, num_workers=2)
    seen = []
    for batch in loader:
        # default_collate keeps a batch of str as the sequence it is given:
        # here the tuple that transposing (str, int) samples makes
        s, n = batch
        reference = default_collate([port.StringDataset()[i] for i in n.tolist()])
        assert_like(batch, reference)
        assert s == reference[0]
        seen += s
    assert sorted(seen) == list("12345")


@PERSISTENT
def test_dict_sequential_batch(DataLoader: Any, persistent_workers: bool) -> None:
    """test_dataloader.py: TestDictDataLoader.test_sequential_batch"""
    kwargs: dict[str, Any] = {"batch_size": 2, "shuffle": False}
    if persistent_workers:
        kwargs.update(persistent_workers=True, num_workers=1)
    loader = DataLoader(port.DictDataset(), **kwargs)
    n = 0
    for i, sample in enumerate(loader):
        idx = i * 2
        assert set(sample) == {"a_tensor", "another_dict"}
        assert set(sample["another_dict"]) == {"a_number"}
        t = sample["a_tensor"]
        assert t.shape == (2, 4, 2)
        assert (t[0] == idx).all() and (t[1] == idx + 1).all()
        num = sample["another_dict"]["a_number"]
        assert isinstance(num, torch.Tensor) and num.shape == (2,)
        assert num.tolist() == [idx, idx + 1]
        n += 1
    assert n == 2


def test_dataloader_with_namedtuple(DataLoader: Any) -> None:
    """test_dataloader.py: TestNamedTupleDataLoader.test_dataloader_with_namedtuple
    (without pin_memory)"""
    ds = port.NamedTupleDataset()
    collated = default_collate([ds[0], ds[1]])
    for i, batch in enumerate(DataLoader(ds, batch_size=2)):
        assert isinstance(batch, port.Batch)
        assert isinstance(batch.data, port.Data)
        assert isinstance(batch.data.positive, torch.Tensor)
        assert_like(batch, collated)
        assert batch.data.positive.tolist() == [2 * i, 2 * i + 1]
        assert list(batch.label) == [str(2 * i), str(2 * i + 1)]
    converted = default_convert(ds[0])
    for i, batch in enumerate(DataLoader(ds, batch_size=None)):
        assert isinstance(batch, port.Batch)
        assert isinstance(batch.data, port.Data)
        assert not isinstance(batch.data.positive, torch.Tensor)
        assert_like(batch, converted)
        assert batch.data == (i, -i) and batch.label == str(i)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_custom_batch(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestCustomPinFn.test_custom_batch_pin and
    test_custom_batch_pin_worker (without pin_memory: a custom collate_fn's
    objects arrive as they are)"""
    inps = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    tgts = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    packed = torch.nn.utils.rnn.PackedSequence
    for collate_fn, elem_cls in (
        (port.collate_wrapper, port.SimpleCustomBatch),
        (port.collate_into_packed_sequence, packed),
        (port.collate_into_packed_sequence_batch_first, packed),
    ):
        loader = DataLoader(
            TensorDataset(inps, tgts),
            batch_size=2,
            collate_fn=collate_fn,
            num_workers=num_workers,
        )
        n = 0
        for i, sample in enumerate(loader):
            assert isinstance(sample, elem_cls), collate_fn.__name__
            if elem_cls is port.SimpleCustomBatch:
                assert torch.equal(sample.inp, inps[2 * i : 2 * i + 2])
                assert torch.equal(sample.tgt, tgts[2 * i : 2 * i + 2])
            n += 1
        assert n == 5


def test_nested_tensor_multiprocessing(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoaderDeviceType.test_nested_tensor_multiprocessing
    (CPU, the default context)"""
    g = torch.Generator().manual_seed(0)
    dataset = [
        torch.nested.nested_tensor([torch.randn(5, generator=g)]) for _ in range(10)
    ]
    loader = DataLoader(
        dataset, batch_size=1, num_workers=2, collate_fn=port.clone_collate
    )
    n = 0
    for i, batch in enumerate(loader):
        assert batch[0].is_nested
        assert torch.equal(batch[0].unbind()[0], dataset[i].unbind()[0])
        n += 1
    assert n == 10

    loader = DataLoader(dataset, batch_size=1, num_workers=2)
    with raises_in_loop(RuntimeError, match="not currently supported by the default"):
        next(iter(loader))


# ---------------------------------------------------------------- errors


def test_error(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_error (every batch raises
    NotImplementedError and the epoch goes on)"""
    loader = DataLoader(port.ErrorDataset(100), batch_size=2, shuffle=True)
    assert count_errors(loader, NotImplementedError) == 50


@PERSISTENT
def test_error_workers(DataLoader: Any, persistent_workers: bool) -> None:
    """test_dataloader.py: TestDataLoader.test_error_workers (and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        port.ErrorDataset(41),
        batch_size=2,
        shuffle=True,
        num_workers=2,
        persistent_workers=persistent_workers,
    )
    assert count_errors(loader, NotImplementedError) == 21


def test_error_keeps_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_error_workers (extended: a
    worker's KeyError arrives as a KeyError, an IndexError as an IndexError)"""
    loader = DataLoader(port.KeyErrorDataset(10, bad=3), batch_size=2, num_workers=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    with raises_in_loop(KeyError, match="no sample 3"):
        next(it)
    del it

    loader = DataLoader(
        port.KeyErrorDataset(10, bad=-1), sampler=[0, 1, 12, 3], num_workers=2
    )
    with raises_in_loop(IndexError):
        list(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_error_in_init(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_error_in_init (an IterableDataset
    whose __iter__ raises)"""
    loader = DataLoader(port.ErrorIterableDataset(), num_workers=num_workers)
    with raises_in_loop(RuntimeError, match="Error in __iter__"):
        list(iter(loader))


@PERSISTENT
def test_error_in_worker_init_fn(
    DataLoader: Any, td: Tensors, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_error_in_init (an error in
    worker_init_fn, and TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        td.dataset,
        num_workers=2,
        worker_init_fn=port.error_worker_init_fn,
        persistent_workers=persistent_workers,
    )
    with raises_in_loop(RuntimeError, match="Error in worker_init_fn"):
        list(iter(loader))


def test_segfault(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_segfault (in this process: a
    worker killed by SIGSEGV is a RuntimeError naming its pid; torch names the
    signal only when its SIGCHLD handler sees the death first)"""
    loader = DataLoader(
        port.SegfaultDataset(10),
        batch_size=2,
        num_workers=2,
        worker_init_fn=port.disable_stderr,
    )
    with raises_in_loop(RuntimeError, match=r"pid\D*\d+"):
        next(iter(loader))


@pytest.mark.skipif("fork" not in START_METHODS, reason="needs fork")
def test_no_segfault(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_no_segfault (in this process: a
    fork worker after set_num_threads in the parent; the context given as an
    object)"""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(4, before))
        loader = DataLoader(
            [1, 2, 3],
            num_workers=1,
            worker_init_fn=port.disable_stderr,
            multiprocessing_context=torch.multiprocessing.get_context("fork"),
        )
        assert next(iter(loader)).tolist() == [1]
    finally:
        torch.set_num_threads(before)


@PERSISTENT
def test_timeout(DataLoader: Any, persistent_workers: bool) -> None:
    """test_dataloader.py: TestDataLoader.test_timeout (in this process; and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        port.SleepDataset(10, 2.0),
        batch_size=2,
        num_workers=2,
        timeout=1,
        persistent_workers=persistent_workers,
    )
    with raises_in_loop(RuntimeError, match="timed out"):
        next(iter(loader))


@PERSISTENT
def test_large_sampler_indices(DataLoader: Any, persistent_workers: bool) -> None:
    """test_dataloader.py: TestDataLoader.test_large_sampler_indices (in this
    process: the loop raises while a worker holds batches of 40960 indices;
    the error arrives and every worker ends)"""
    loader = DataLoader(
        port.EmptyTensorDataset(1_000_000),
        batch_size=40960,
        persistent_workers=persistent_workers,
        num_workers=1,
    )
    it = iter(loader)
    with raises_in_loop(RuntimeError, match="My Error"):
        for x in it:
            assert x.numel() == 0
            raise RuntimeError("My Error")


# ------------------------------------------------------ worker lifecycle


@PERSISTENT
@pytest.mark.parametrize("keep_loader", [False, True], ids=["iter-only", "loader"])
def test_partial_workers(
    DataLoader: Any, persistent_workers: bool, keep_loader: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_partial_workers (workers exit
    once an iterator is dropped after 11 of 50 batches, with no garbage
    collection: the iterator held the only reference to the loader;
    extended: with the loader still referenced, the workers of a
    non-persistent one exit too. Pids taken from the samples)"""
    loader = DataLoader(
        port.PidDataset(100),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent_workers,
    )
    it = iter(loader)
    if not keep_loader:
        del loader
    pids: set[int] = set()
    i = -1
    for i, (_idx, pid) in enumerate(it):
        pids.update(pid.tolist())
        if i == 10:
            break
    assert i == 10
    assert pids and os.getpid() not in pids
    del it, _idx, pid
    if keep_loader and persistent_workers:
        assert all(alive(p) for p in pids)  # the loader keeps them
        return
    # A bound, not a timing: DataLoader joins its workers when the
    # iterator goes; a garbage-collector pass may never come.
    wait_gone(pids, timeout=PROMPT_EXIT_S)


@PERSISTENT
def test_partial_iteration_then_new_iteration(
    DataLoader: Any, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_partial_workers (extended: after
    a break, a new iter() of the same loader starts a whole epoch)"""
    loader = DataLoader(
        port.CountingDataset(40),
        batch_size=2,
        num_workers=2,
        persistent_workers=persistent_workers,
    )
    for i, _ in enumerate(loader):
        if i == 3:
            break
    assert [b.tolist() for b in loader] == [[k, k + 1] for k in range(0, 40, 2)]


def test_dataset_not_reset(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoaderPersistentWorkers.test_dataset_not_reset
    (persistent workers keep the dataset copy of their first epoch; workers
    start at the first iter(), after the loader was made)"""
    dataset = port.StartCheckDataset()
    dataset.start = 7
    loader = DataLoader(dataset, num_workers=2, persistent_workers=True)
    dataset.start = 0
    for i in range(3):
        assert ints(loader) == list(range(10))
        dataset.start = i + 1


@PERSISTENT
def test_multi_epochs_reproducibility(
    DataLoader: Any, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_multi_epochs_reproducibility (an
    IterableDataset's batches alternate between the workers, every epoch)"""
    loader = DataLoader(
        port.MultiEpochIterableDataset(20),
        batch_size=10,
        shuffle=False,
        num_workers=2,
        persistent_workers=persistent_workers,
    )
    for _ in range(3):
        batches = [b.tolist() for b in loader]
        assert batches == [[k % 2] * 10 for k in range(2)]


@pytest.mark.skipif(sys.platform != "linux", reason="uses fork semantics")
def test_early_exit(tmp_path: Any) -> None:
    """test_dataloader.py: TestDataLoaderPersistentWorkers.test_early_exit
    (without pin_memory: a script that breaks out of a persistent fork
    loader's first epoch exits cleanly)"""
    script = tmp_path / "early_exit.py"
    script.write_text(
        "import os\n"
        "from torch_helpers.dataloader_port_data import RandomIterableDataset\n"
        + IMPORT_DATALOADER
        + "\n"
        "if __name__ == '__main__':\n"
        "    dl = DataLoader(RandomIterableDataset(64, (28, 28)), batch_size=16,\n"
        "                    num_workers=2, persistent_workers=True,\n"
        "                    multiprocessing_context='fork')\n"
        "    for _ in dl:\n"
        "        break\n"
    )
    proc = run_script(script)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("iterable", [False, True], ids=["map", "iterable"])
@PERSISTENT
def test_proper_exit_worker_error(
    tmp_path: Any, iterable: bool, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_proper_exit (the worker_error
    exit with the iterator still referenced: a worker raises after the
    first batch, the error leaves the loop and ends the script with a
    non-zero exit, and none of its workers is left. The worker's failure
    is switched on by a file instead of a multiprocessing.Event)"""
    pids, flag = tmp_path / "pids", tmp_path / "flag"
    script = tmp_path / "proper_exit.py"
    dataset = "ProperExitIterableDataset(7" if iterable else "ProperExitDataset(12"
    script.write_text(
        "import functools, os\n"
        "from torch_helpers import dataloader_port_data as port\n"
        + IMPORT_DATALOADER
        + "\n"
        "if __name__ == '__main__':\n"
        f"    loader = DataLoader(port.{dataset}, {str(flag)!r}), batch_size=1,\n"
        "                        shuffle=False, num_workers=2,\n"
        f"                        persistent_workers={persistent_workers},\n"
        "                        worker_init_fn=functools.partial(\n"
        f"                            port.record_pid, {str(pids)!r}))\n"
        "    it = iter(loader)\n"
        "    for i, _ in enumerate(it):\n"
        "        if i == 0:\n"
        f"            open({str(flag)!r}, 'w').close()\n"
    )
    proc = run_script(script)
    assert proc.returncode != 0, proc.stderr
    assert "RuntimeError: Worker error" in proc.stderr
    workers = {int(line) for line in pids.read_text().split()}
    assert len(workers) == 2
    wait_gone(workers, timeout=PROMPT_EXIT_S)


def test_multiple_dataloaders(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_multiple_dataloaders (two
    loaders' iterators interleaved, each in order; the default context only,
    the others' cost left to test_multiprocessing_contexts)"""
    it1 = iter(DataLoader(td.dataset, num_workers=1))
    it2 = iter(DataLoader(td.dataset, num_workers=2))
    got: dict[str, list[Any]] = {"1": [], "2": []}
    for name, it in (("1", it1), ("1", it1), ("2", it2), ("2", it2), ("1", it1)):
        got[name].append(next(it)[0])
    got["2"].append(next(it2)[0])
    for samples in got.values():
        for k, sample in enumerate(samples):
            assert torch.equal(sample, td.data[k : k + 1])
    del it1, it2


CONTEXTS = [
    pytest.param(method, as_object, id=f"{method}-{'object' if as_object else 'str'}")
    for method, as_object in [
        (None, False),
        ("fork", False),
        ("fork", True),
        ("forkserver", False),
        ("spawn", True),
    ]
    if method is None or method in START_METHODS
]


@pytest.mark.parametrize(("method", "as_object"), CONTEXTS)
def test_multiprocessing_contexts(
    DataLoader: Any, method: str | None, as_object: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_multiprocessing_contexts (each
    start method as a string or a context object, not every pair: a spawn
    or forkserver worker imports torch, seconds each)"""
    context = mp.get_context(method) if as_object else method
    loader = DataLoader(
        port.CountingDataset(11),
        num_workers=2,
        batch_size=3,
        multiprocessing_context=context,
    )
    assert [t.tolist() for t in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no affinity")
def test_set_affinity_in_worker_init(DataLoader: Any) -> None:
    """test_dataloader.py: TestSetAffinity.test_set_affinity_in_worker_init"""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    loader = DataLoader(
        port.SetAffinityDataset(),
        num_workers=2,
        worker_init_fn=functools.partial(port.set_affinity, cpu),
    )
    samples = [s.tolist() for s in loader]
    assert samples == [[cpu], [cpu]]


def test_conv_after_fork(DataLoader: Any) -> None:
    """test_dataloader.py: TestConvAfterFork.test_conv_after_fork"""
    for x in DataLoader(port.ConvDataset(), num_workers=1):
        assert x.shape == (1, 1, 1, 23999)


# ------------------------------------------- worker info, seeds, init fns


def test_get_worker_info(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_get_worker_info (in this
    process; the workers' pids are taken from the samples). The workers'
    first samples wait for each other, so every worker must begin at once"""
    assert torch.utils.data.get_worker_info() is None
    dataset = port.SynchronizedWorkerInfoDataset(6, batch_size=2, num_workers=2)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, worker_init_fn=port.worker_info_init_fn
    )
    rows = torch.cat(list(loader), 0).tolist()
    assert len(rows) == 6
    pids_of: dict[int, set[int]] = {}
    for worker_id, pid in rows:
        pids_of.setdefault(worker_id, set()).add(pid)
    assert set(pids_of) == {0, 1}  # the barrier needs both
    assert all(len(p) == 1 for p in pids_of.values())
    pids = [p for ps in pids_of.values() for p in ps]
    assert len(set(pids)) == len(pids)
    assert os.getpid() not in pids
    assert torch.utils.data.get_worker_info() is None
    assert not hasattr(dataset, "value")
    with pytest.raises(AttributeError):
        dataset[0]


def test_worker_seed(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_seed (each of 6
    workers makes one sample, all at once behind a barrier, and each sees
    its own torch seed)"""
    num_workers = 6
    dataset = port.SynchronizedSeedDataset(num_workers, 1, num_workers)
    loader = DataLoader(dataset, batch_size=1, num_workers=num_workers)
    seeds = {int(batch[0]) for batch in loader}
    assert len(seeds) == num_workers


def test_worker_seed_reproducibility(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_seed_reproducibility
    (6 workers behind a barrier, twice with one generator seed)"""
    num_workers = 6

    def seeds() -> set[int]:
        dataset = port.SynchronizedSeedDataset(num_workers, 1, num_workers)
        loader = DataLoader(
            dataset,
            batch_size=1,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )
        return {int(batch) for batch in loader}

    first = seeds()
    assert len(first) == num_workers
    assert first == seeds()


def test_out_of_order_index_ds(DataLoader: Any) -> None:
    """test_dataloader.py: TestOutOfOrderDataLoader.test_out_of_order_index_ds
    (in_order=False: the slow sample 0 does not hold the others; the
    original's exact order has sample 2 queued behind it on worker 0, which
    holds against DataLoader only: fastq gives a batch to the first free
    worker, a row of the migration table)"""
    dataset = port.SlowIndexDataset(end=10, slow_index=0)
    loader = DataLoader(dataset, num_workers=2, in_order=False)
    outputs = [(int(w), int(i)) for w, i in loader]
    data = [i for _, i in outputs]
    assert sorted(data) == list(range(10))
    assert outputs[0] == (1, 1)  # the other worker's, not the slow one's
    assert outputs[-1][1] in (0, 2) and data.index(0) >= 8
    assert [i for i in data if i not in (0, 2)] == [1, 3, 4, 5, 6, 7, 8, 9]
    assert [w for w, i in outputs if i == 0] == [0]
    assert {w for w, i in outputs if i not in (0, 2)} == {1}
    if not FASTQ:
        assert data == [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]


def test_worker_init_fn(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_init_fn (a seed set in
    worker_init_fn is the one __getitem__ sees)"""
    loader = DataLoader(
        port.SeedDataset(4),
        batch_size=2,
        num_workers=2,
        worker_init_fn=port.seed_12345_init_fn,
    )
    batches = [b.tolist() for b in loader]
    assert batches == [[12345, 12345], [12345, 12345]]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_ind_worker_queue(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestIndividualWorkerQueue.test_ind_worker_queue
    (batches in order, each made by one worker whose bound-method
    worker_init_fn ran on that worker's dataset copy; batch i by worker
    i % num_workers against DataLoader only: fastq gives a map-style batch
    to the first worker with a free slot, a row of the migration table. An
    IterableDataset's batches do come in turn, as
    test_multi_epochs_reproducibility checks)"""
    for batch_size in (8, 16):
        dataset = port.WorkerQueueDataset(list(range(128)))
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=num_workers,
            timeout=30,  # the original's 5 s, with room for a loaded machine
            worker_init_fn=dataset.worker_init_fn,
        )
        n = 0
        for i, (worker_ids, sample) in enumerate(loader):
            ids = set(worker_ids.tolist())
            assert len(ids) == 1 and ids <= set(range(num_workers))
            if not FASTQ:
                assert ids == {i % num_workers}
            want = list(range(i * batch_size, (i + 1) * batch_size))
            assert sample.tolist() == want
            n += 1
        assert n == 128 // batch_size


# ------------------------------------------------------ iterable datasets


def test_iterable_style_dataset_single_process(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset (the
    single process parts: no auto-batching keeps ints; batch_size=7 with and
    without drop_last)"""
    dataset = port.CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None, num_workers=0)
    fetched = list(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)

    fetched = [t.tolist() for t in DataLoader(dataset, batch_size=7, num_workers=0)]
    assert fetched == [list(range(7)), list(range(7, 14)), list(range(14, 20))]
    loader = DataLoader(dataset, batch_size=7, drop_last=True, num_workers=0)
    assert [t.tolist() for t in loader] == [list(range(7)), list(range(7, 14))]


def test_iterable_style_dataset_default_num_workers(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset ([no
    auto-batching] single process loading, with num_workers left out: an
    IterableDataset that does not shard itself is read once, ints stay ints;
    fastq's default for it is one worker, DataLoader's is none)"""
    dataset = port.CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None)
    assert loader.num_workers == (1 if FASTQ else 0)
    fetched = list(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("prefetch_factor", [2, 4])
def test_iterable_style_dataset_workers_nobatch(
    DataLoader: Any, prefetch_factor: int
) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset ([no
    auto-batching] multiprocessing loading; one worker yields nothing)"""
    dataset = port.WorkerSpecificIterableDataset([0, 20])
    loader = DataLoader(
        dataset, num_workers=2, batch_size=None, prefetch_factor=prefetch_factor
    )
    fetched = sorted(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_style_dataset_workers_batched(
    DataLoader: Any, drop_last: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset
    ([auto-batching] and [auto-batching & drop_last] multiprocessing loading:
    each worker batches its own samples)"""
    dataset = port.WorkerSpecificIterableDataset([4, 20])
    loader = DataLoader(dataset, num_workers=2, batch_size=7, drop_last=drop_last)
    fetched = [tuple(t.tolist()) for t in loader]
    want = {tuple(range(7)), tuple(range(7, 14))}
    if not drop_last:
        want |= {tuple(range(4)), tuple(range(14, 20))}
    assert len(fetched) == len(want)
    assert set(fetched) == want


def test_iterable_style_dataset_length_warning(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset (after
    len(dataloader), fetching more samples than the reported length warns;
    before it, or within the length, nothing warns)"""
    dataset = port.CountingIterableDataset(20)  # every worker yields all 20
    loader = DataLoader(dataset, num_workers=2)
    it = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            next(it)
    assert [str(w.message) for w in caught] == []
    assert len(loader) == len(dataset) == 20
    it = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(20):
            next(it)
    assert [str(w.message) for w in caught] == []
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"\b20\b"):
            next(it)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_builtin_collection_conversion(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_builtin_collection_conversion"""
    pairs = [[i, i + 1] for i in range(0, 20, 2)]
    for coll_ty in (list, tuple):
        for dataset in (port.CountingDataset(20), port.CountingIterableDataset(20)):
            loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
            assert coll_ty(loader) == coll_ty(range(20))
            loader = DataLoader(dataset, batch_size=2, num_workers=num_workers)
            fetched = coll_ty(loader)
            assert isinstance(fetched, coll_ty)
            assert [t.tolist() for t in fetched] == pairs


@pytest.mark.parametrize("num_workers", [0, 1])
def test_chain_iterable_style_dataset(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_chain_iterable_style_dataset"""
    dataset1 = port.CountingIterableDataset(20)
    dataset2 = port.CountingIterableDataset(15)
    expected = list(range(20)) + list(range(15))
    for chained in (dataset1 + dataset2, ChainDataset([dataset1, dataset2])):
        fetched = list(DataLoader(chained, num_workers=num_workers))
        assert len(fetched) == len(expected)
        for e, d in zip(expected, fetched):
            assert isinstance(d, torch.Tensor)
            assert d.tolist() == [e]


# -------------------------------------------- len, arguments, attributes


def test_len(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_len"""
    for batch_size, expected in ((2, 50), (3, 34)):
        loader = DataLoader(td.dataset, batch_size=batch_size)
        assert len(loader) == expected
        assert sum(1 for _ in loader) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_empty_dataset(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_len (extended to an empty
    dataset: len 0 and an empty epoch, twice)"""
    loader = DataLoader(
        TensorDataset(torch.empty(0, 3)), batch_size=2, num_workers=num_workers
    )
    assert len(loader) == 0
    assert list(loader) == []
    assert list(loader) == []


def test_iterabledataset_len(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterabledataset_len"""
    for batch_size, drop_last, expected in (
        (1, False, 10),
        (1, True, 10),
        (2, False, 5),
        (2, True, 5),
        (3, False, 4),
        (3, True, 3),
    ):
        loader = DataLoader(
            port.SizedIterableDataset(), batch_size=batch_size, drop_last=drop_last
        )
        assert len(loader) == expected, (batch_size, drop_last)


def test_growing_dataset(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_growing_dataset"""
    dataset = [torch.ones(4) for _ in range(4)]
    loader_seq = DataLoader(dataset, shuffle=False)
    loader_shuffle = DataLoader(dataset, shuffle=True)
    dataset.append(torch.ones(4))
    assert len(loader_seq) == 5
    assert len(loader_shuffle) == 5


@pytest.mark.parametrize(
    "persistence",
    [
        pytest.param(
            {},
            id="default",
            marks=migration(
                "workers persist by default, so they keep the dataset copy of "
                "their first epoch",
                condition=fastq_default("persistent_workers") is True,
            ),
        ),
        pytest.param({"persistent_workers": False}, id="transient"),
    ],
)
def test_growing_dataset_between_epochs(
    DataLoader: Any, persistence: dict[str, Any]
) -> None:
    """test_dataloader.py: TestDataLoader.test_growing_dataset (extended: the
    next epoch reads the new length and loads the new sample)"""
    dataset = [torch.full((4,), float(i)) for i in range(4)]
    loader = DataLoader(dataset, num_workers=1, **persistence)
    assert [int(b[0, 0]) for b in loader] == [0, 1, 2, 3]
    dataset.append(torch.full((4,), 4.0))
    assert len(loader) == 5
    assert [int(b[0, 0]) for b in loader] == [0, 1, 2, 3, 4]


def test_splits_indexing_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDatasetRandomSplit.test_splits_indexing_type
    (the dataset's __getitem__ gets Python ints, through random_split's
    Subset and directly)"""
    dataset = port.IntKeyDataset([1, 2, 3, 4, 5])
    for lengths in ([5], [1.0]):
        subset = random_split(dataset, lengths)[0]
        assert sorted(ints(DataLoader(subset))) == [1, 2, 3, 4, 5]
    assert ints(DataLoader(dataset)) == [1, 2, 3, 4, 5]


def test_invalid_assign_after_init(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_invalid_assign_after_init"""
    loader = DataLoader(td.dataset)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
        with pytest.raises(ValueError):
            setattr(loader, attr, {})


def test_invalid_ctor_args_combinations(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_invalid_ctor_args_combinations"""
    ds = td.dataset
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="timeout"):
        DataLoader(ds, timeout=-1)
    with pytest.raises(ValueError, match="drop_last"):
        DataLoader(ds, batch_size=None, drop_last=True)

    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=0, multiprocessing_context=START_METHODS[-1])
    with pytest.raises(ValueError, match="multiprocessing_context"):
        DataLoader(ds, num_workers=1, multiprocessing_context="bad")
    with pytest.raises(TypeError, match="multiprocessing_context"):
        DataLoader(ds, num_workers=1, multiprocessing_context=object())

    sampler = torch.utils.data.SequentialSampler(ds)
    batch_sampler = torch.utils.data.BatchSampler(sampler, 3, False)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_size=11, sampler=sampler, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_sampler=batch_sampler, sampler=sampler, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_sampler=batch_sampler, sampler=sampler, shuffle=3)
    for kwargs in ({"batch_size": 11}, {"shuffle": True}, {"drop_last": True}):
        with pytest.raises(ValueError, match="batch_sampler"):
            DataLoader(ds, batch_sampler=batch_sampler, **kwargs)
    with pytest.raises(ValueError, match="batch_sampler"):
        DataLoader(ds, drop_last=3, batch_sampler=batch_sampler)

    iterable = port.CountingIterableDataset(20)
    for kwargs, word in (
        ({"shuffle": True}, "shuffle"),
        ({"shuffle": 3}, "shuffle"),
        ({"sampler": torch.utils.data.SequentialSampler(iterable)}, "sampler"),
        ({"sampler": 3}, "sampler"),
        (
            {
                "batch_sampler": torch.utils.data.BatchSampler(
                    torch.utils.data.SequentialSampler(iterable), 3, False
                )
            },
            "batch_sampler",
        ),
        ({"batch_sampler": 3}, "batch_sampler"),
    ):
        with pytest.raises(ValueError, match=word):
            DataLoader(iterable, **kwargs)


def test_typing(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_typing (the class takes a type
    argument, so DataLoader[list[torch.Tensor]] is an annotation)"""

    class SomeDatasetClass(torch.utils.data.Dataset[list[torch.Tensor]]):
        pass

    def create_dataloader(is_train: bool) -> DataLoader[list[torch.Tensor]]:
        raise NotImplementedError

    alias = DataLoader[list[torch.Tensor]]
    assert typing.get_origin(alias) is DataLoader
    assert typing.get_args(alias) == (list[torch.Tensor],)
    hints = typing.get_type_hints(create_dataloader, localns={"DataLoader": DataLoader})
    assert hints["return"] == alias


def test_excessive_thread_creation_warning(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_excessive_thread_creation_warning
    (warned when the loader is made, before any worker starts)"""
    with pytest.warns(UserWarning, match="excessive worker creation"):
        DataLoader(td.dataset, batch_size=2, num_workers=1000)
