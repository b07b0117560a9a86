"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
errors raised in workers."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    PERSISTENT,
    START_METHODS,
    Tensors,
    count_errors,
    raises_in_loop,
)
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


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
