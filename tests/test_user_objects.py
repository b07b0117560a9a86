"""Whatever DataLoader takes with default arguments, fastq takes: lambdas
and closures anywhere in the source and worker_init, multiprocessing
objects of the default context shared with every worker and with this
process, and large arrays at fork's cost; under the start methods that
pickle, the same objects by value (cloudpickle) or, for multiprocessing
objects, made with that start method's context. Classes of a __main__
without a file (`python -c`, standard input, a notebook) are in
tests/test_main_without_file.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import threading
from typing import Any

import numpy as np
import pytest

import fastq
from fastq._workers import _start_method

PICKLING_METHODS = [
    m for m in ("spawn", "forkserver") if m in mp.get_all_start_methods()
]
SAMPLES = 24
BATCH = 4


def test_default_start_method_forks_from_this_process() -> None:
    class Parent:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> Any:
            return np.int64(os.getppid())

    assert _start_method.default_start_method() == "fork"
    with fastq.Prefetcher(Parent(), batch_size=4, workers=2, copy=True) as pf:
        parents = {int(p) for b in pf for p in b}
    assert parents == {os.getpid()}


@pytest.mark.parametrize("start_method", [None, "fork"])
def test_after_cuda_workers_still_fork(
    start_method: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As DataLoader's: workers never touch CUDA, so a process that
    initialised it (told so here, no GPU needed) forks them too, and they
    inherit a lambda as it is."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    source = Transformed(lambda i: 3 * i)
    with fastq.Prefetcher(
        source, batch_size=BATCH, workers=2, copy=True, start_method=start_method
    ) as pf:
        assert [int(x) for b in pf for x in b[0]] == [3 * i for i in range(SAMPLES)]
        assert {int(p) for b in pf for p in b[1]} == {os.getpid()}


# ------------------------------------------------------ lambdas, closures


class Transformed:
    """Applies a transform held as an attribute (torchvision's
    transforms.Lambda, a tutorial's `lambda x: x / 255`); sample i is
    (transform(i), the worker's parent pid, what worker_init left)."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Any:
        left = int(os.environ.get("FASTQ_TEST_INIT", "-1"))
        return np.int64(self.transform(i)), np.int64(os.getppid()), np.int64(left)


def _make_closures(scale: int, offset: int) -> tuple[Any, Any]:
    def transform(i: int) -> int:
        return scale * i + offset

    def worker_init(worker_id: int) -> None:
        os.environ["FASTQ_TEST_INIT"] = str(offset + worker_id)

    return transform, worker_init


@pytest.mark.parametrize("method", [None, *PICKLING_METHODS])
def test_lambdas_and_closures_reach_every_worker(method: str | None) -> None:
    transform, worker_init = _make_closures(scale=7, offset=1000)
    source = Transformed(lambda i: transform(i) - 1)
    with fastq.Prefetcher(
        source,
        batch_size=BATCH,
        workers=2,
        start_method=method,
        worker_init=worker_init,
        copy=True,
    ) as pf:
        batches = list(pf)
    values = [int(x) for b in batches for x in b[0]]
    assert values == [7 * i + 999 for i in range(SAMPLES)]
    assert {int(x) for b in batches for x in b[2]} <= {1000, 1001}


def test_a_generator_is_refused_for_a_pickling_start_method() -> None:
    """What cannot cross into a new process is named, with the fix."""

    def numbers() -> Any:
        yield 1

    source = Transformed(abs)
    source.pending = numbers()  # type: ignore[attr-defined]
    with pytest.raises(fastq.ConfigError, match="generator.*worker_init"):
        fastq.Prefetcher(source, batch_size=BATCH, workers=1, start_method="spawn")


# ------------------------------------------------ handles


def _handles(path: str) -> dict[str, Any]:
    """What docs/limits.md says cannot cross into a worker that does not
    fork, each made fresh."""
    return {
        "text file": lambda: open(path),
        "binary file": lambda: open(path, "rb"),
        "socket": socket.socket,
        "thread lock": threading.Lock,
    }


@pytest.mark.parametrize("kind", list(_handles("")))
def test_a_handle_is_refused_with_its_path_for_a_pickling_start_method(
    kind: str, tmp_path: Any
) -> None:
    """A text file opened for reading is refused too: no worker gets a copy
    of the file's contents in place of the file (as cloudpickle would give
    it), nor a duplicate of a socket."""
    path = tmp_path / "labels.txt"
    path.write_text("cat\ndog\n")
    handle = _handles(str(path))[kind]()
    value = repr(handle)[:40]
    source = Transformed(abs)
    source.parts = {"labels": [0, handle]}  # type: ignore[attr-defined]
    try:
        with pytest.raises(fastq.ConfigError) as err:
            fastq.Prefetcher(source, batch_size=BATCH, workers=1, start_method="spawn")
    finally:
        getattr(handle, "close", lambda: None)()
    message = str(err.value)
    named = "an open file" if "file" in kind else f"a {kind}"
    assert message.startswith(f"source.parts['labels'][1] is {named} (")
    assert value in message
    assert "in worker_init, or on first use" in message  # the fix
    assert "'spawn'" in message


def test_dataloader_names_the_dataset_attribute_holding_a_file(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    path = tmp_path / "labels.txt"
    path.write_text("cat\n")
    with open(path) as handle:
        source = Transformed(abs)
        source.labels = handle  # type: ignore[attr-defined]
        loader = DataLoader(
            source, batch_size=BATCH, num_workers=1, multiprocessing_context="spawn"
        )
        with pytest.raises(fastq.ConfigError, match=r"^dataset\.labels is an open"):
            next(iter(loader))


# ------------------------------------------------ multiprocessing objects


class SharedCounters:
    """Every multiprocessing object a dataset holds in practice, each used
    by every worker (in worker_init) and by each sample."""

    def __init__(self, ctx: Any, manager: Any, workers: int) -> None:
        self.count = ctx.Value("i", 0)
        self.lock = ctx.Lock()
        self.rlock = ctx.RLock()
        self.semaphore = ctx.Semaphore(1)
        self.started = ctx.Array("i", workers)
        self.event = ctx.Event()
        self.condition = ctx.Condition()
        self.queue = ctx.Queue()
        self.made = manager.list()  # a proxy: each sample made, once

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Any:
        with self.lock:
            self.count.value += 1
            ticket = self.count.value
        with self.rlock, self.rlock, self.semaphore:
            self.made.append(i)
        return np.int64(i), np.int64(ticket)

    def worker_init(self, worker_id: int) -> None:
        self.started[worker_id] = 1
        self.event.set()
        with self.condition:
            self.condition.notify_all()
        self.queue.put(worker_id)


def _check_shared(ds: SharedCounters, batches: list[Any], workers: int) -> None:
    assert sorted(int(i) for b in batches for i in b[0]) == list(range(SAMPLES))
    # One counter for all: no ticket was drawn twice.
    tickets = [int(t) for b in batches for t in b[1]]
    assert len(set(tickets)) == len(tickets)
    # This process sees what every worker did.
    assert ds.count.value == len(ds.made) >= SAMPLES
    assert list(ds.started) == [1] * workers
    assert ds.event.is_set()
    assert sorted(ds.queue.get(timeout=10) for _ in range(workers)) == list(
        range(workers)
    )


def test_default_context_objects_are_shared_with_every_worker() -> None:
    with mp.Manager() as manager:
        ds = SharedCounters(mp.get_context(), manager, workers=2)
        with fastq.Prefetcher(
            ds, batch_size=BATCH, workers=2, worker_init=ds.worker_init, copy=True
        ) as pf:
            batches = list(pf)
        _check_shared(ds, batches, workers=2)


@pytest.mark.parametrize("method", PICKLING_METHODS)
def test_objects_of_the_start_methods_context_reach_every_worker(
    method: str,
) -> None:
    """Each worker gets its own duplicate of a Value's or a Queue's
    descriptors, though the source is pickled once for all of them."""
    ctx = mp.get_context(method)
    with ctx.Manager() as manager:
        ds = SharedCounters(ctx, manager, workers=3)
        with fastq.Prefetcher(
            ds,
            batch_size=BATCH,
            workers=3,
            start_method=method,
            worker_init=ds.worker_init,
            copy=True,
        ) as pf:
            batches = list(pf)
        _check_shared(ds, batches, workers=3)


@pytest.mark.parametrize("method", PICKLING_METHODS)
def test_fork_context_lock_refused_for_a_pickling_start_method(method: str) -> None:
    source = Transformed(abs)
    source.lock = mp.get_context("fork").Lock()  # type: ignore[attr-defined]
    with pytest.raises(fastq.ConfigError) as err:
        fastq.Prefetcher(source, batch_size=BATCH, workers=1, start_method=method)
    message = str(err.value)
    assert "'fork' context" in message
    assert f"multiprocessing.get_context({method!r})" in message


# ------------------------------------------------------------ large arrays


class HoldsTable:
    """Sample i: the table's address as the worker sees it, whether the
    worker maps a copy of dataset arrays, and a checksum of a row."""

    def __init__(self, table: np.ndarray[Any, Any]) -> None:
        self.table = table

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        with open("/proc/self/maps") as f:
            copied = any("fastq-dataset-arrays" in line for line in f)
        row = self.table[i * 1000 : (i + 1) * 1000]
        return (
            np.int64(self.table.ctypes.data),
            np.int64(copied),
            np.int64(row.sum()),
        )


def test_large_array_reaches_forked_workers_without_a_copy() -> None:
    """The default start method shares the array's pages copy-on-write, as
    a forked DataLoader worker does: the same address, no copy made."""
    table = np.arange(8 << 20, dtype=np.int64)  # 64 MiB
    with fastq.Prefetcher(HoldsTable(table), batch_size=4, workers=2, copy=True) as pf:
        batches = list(pf)
    assert {int(a) for b in batches for a in b[0]} == {table.ctypes.data}
    assert not any(int(c) for b in batches for c in b[1])
    sums = [int(s) for b in batches for s in b[2]]
    assert sums == [int(table[i * 1000 : (i + 1) * 1000].sum()) for i in range(8)]


# ------------------------------------------------------ the DataLoader face


class CountedTransform:
    """A torch-style dataset: a lambda transform, and a shared counter of
    the samples made (a multiprocessing.Value and Lock of the default
    context), as the issue's programs hold them."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform
        self.made = mp.Value("i", 0)
        self.lock = mp.Lock()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> Any:
        with self.lock:
            self.made.value += 1
        return self.transform(i)


@pytest.mark.parametrize("context", [None, *PICKLING_METHODS])
def test_dataloader_takes_lambdas_closures_and_a_shared_counter(
    context: str | None,
) -> None:
    torch = pytest.importorskip("torch")
    from fastq.torch import DataLoader

    transform, worker_init = _make_closures(scale=3, offset=0)
    if context is None:
        dataset = CountedTransform(lambda i: transform(i) + 1)
    else:  # the counter made with the loader's own start method's context
        dataset = CountedTransform(lambda i: transform(i) + 1)
        ctx = mp.get_context(context)
        dataset.made, dataset.lock = ctx.Value("i", 0), ctx.Lock()
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=2,
        collate_fn=lambda batch: torch.tensor(batch) * 2,
        worker_init_fn=worker_init,
        multiprocessing_context=context,
    )
    got = [int(x) for b in loader for x in b]
    assert got == [2 * (3 * i + 1) for i in range(SAMPLES)]
    # Every sample made once, counted by every worker in one shared Value.
    assert dataset.made.value == SAMPLES
    loader.close()
