"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
the workers' lifecycle."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    IMPORT_DATALOADER,
    PERSISTENT,
    PROMPT_EXIT_S,
    START_METHODS,
    Tensors,
    alive,
    ints,
    run_script,
    wait_gone,
)
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


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
