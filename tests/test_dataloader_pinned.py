"""fastq.torch.DataLoader(pin_memory=True) on the page-locked ring, without
a GPU: batches are handed out over their slots (no copy), a slot goes back
only once the event recorded when its batch was dropped has completed, and
what DataLoader pins besides arrays is still pinned as it pins it. The same
loop on a GPU: tests/test_torch_cuda.py."""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import alive  # noqa: E402
from torch_helpers.pinning import (  # noqa: E402
    FakeEvent,
    fake_events,
    fake_ring,
    in_ring,
    ring_range,
)

import fastq  # noqa: E402
from fastq.torch import DataLoader, _dataloader  # noqa: E402
from fastq.torch._pinned import CudaRing  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

ROW = 4096  # values per sample: a batch fills much of its slot


class Rows:
    """Sample i: (ROW int32 values equal to i, i, a string)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        return torch.full((ROW,), i, dtype=torch.int32), i, f"sample {i}"


@pytest.fixture
def on_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """As on a CUDA machine, with fake events; returns the types of the
    batches torch's pin_memory was given (it returns the ring's tensors as
    they are, being pinned already, and cannot run on a torch without
    CUDA)."""
    fake_events(monkeypatch)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda *a: torch.device("cuda")
    )
    monkeypatch.setattr(
        _dataloader,
        "_page_locked_ring",
        lambda: fake_ring(torch.device("cuda", 0)),
    )
    pinned: list[str] = []

    def pin_batch(batch: Any, device: Any = None) -> Any:
        assert device == "cuda"
        pinned.append(type(batch).__name__)
        return batch

    monkeypatch.setattr(_dataloader, "pin_batch", pin_batch)
    return pinned


def test_a_slot_is_not_rewritten_before_its_event_completes(
    on_fake_cuda: list[str],
) -> None:
    """Two slots and a fast producer: each batch is dropped while its
    (pretend) non_blocking copy is still queued, and its bytes stay as they
    were until that copy's event has completed; then the slot is reused."""
    loader = DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True, slots=2)
    it = iter(loader)
    batches = 0
    queued: list[tuple[FakeEvent, int, np.ndarray[Any, Any]]] = []
    engine = None
    for rows, labels, names in it:
        if engine is None:
            engine = loader._engine
            bounds = ring_range(engine)
            ring = engine._engine.pinning
            whole = np.frombuffer(engine._region.mapping, dtype=np.uint8)
        assert in_ring(rows, bounds), "pinned batches are not copied"
        want = labels.tolist()
        assert want == list(range(4 * batches, 4 * batches + 4))
        assert (rows == labels[:, None].int()).all()
        assert list(names) == [f"sample {i}" for i in want]
        offset, size = rows.data_ptr() - bounds[0], rows.numel() * 4
        snapshot = whole[offset : offset + size].copy()
        del rows, labels, names
        assert ring.waiting == len(ring.pending) >= 1
        event = ring.pending[-1][0]
        assert not event.done, "the slot was freed before its event"
        queued.append((event, offset, snapshot))
        for event, at, seen in queued:
            if not event.done:
                assert np.array_equal(whole[at : at + seen.size], seen)
        batches += 1
    assert batches == 10
    assert any(e.done for e, _, _ in queued), "slots were never waited for"
    assert on_fake_cuda == ["list"] * 10  # each batch through pin_memory once
    for event in FakeEvent.made:
        event.done = True
    ring.reap()
    assert engine._feed.consumer.held == 0
    del whole
    loader.close()


def test_batches_kept_by_the_loop_are_copied_and_pinned(
    on_fake_cuda: list[str],
) -> None:
    """list(loader) keeps every batch: past the slots, batches are copied
    out of the ring, pinned as DataLoader pins (here: given to pin_memory),
    and the workers never run out of slots."""
    loader = DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True, slots=2)
    with pytest.warns(RuntimeWarning, match="copied out of the ring"):
        it = iter(loader)
        kept = [next(it)]
        bounds = ring_range(loader._engine)
        kept += list(it)
    assert [b[1].tolist() for b in kept] == [
        list(range(4 * b, 4 * b + 4)) for b in range(10)
    ]
    assert all((rows == labels[:, None].int()).all() for rows, labels, _ in kept)
    assert on_fake_cuda == ["list"] * 10
    # Some batches were copied, and their slots returned at once: none of
    # them waited for device work (the others are still referenced).
    assert 0 < sum(in_ring(rows, bounds) for rows, _, _ in kept) < 10
    assert FakeEvent.made == []
    del kept
    loader.close()


def test_pin_memory_device_is_deprecated_as_in_dataloader(
    on_fake_cuda: list[str],
) -> None:
    loader = DataLoader(
        Rows(), batch_size=8, num_workers=1, pin_memory=True, pin_memory_device="cuda"
    )
    with pytest.warns(UserWarning, match="pin_memory_device is deprecated"):
        assert sum(1 for _ in loader) == 5
    loader.close()


def test_a_workers_death_is_raised_even_if_unpinning_fails(
    on_fake_cuda: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop sees WorkerDied, not the error of closing the pinned ring
    (a CUDA error, say), and the engine still reaps its workers and closes
    its ring (the session's leak check)."""

    def failing_ring() -> Any:
        ring = fake_ring(torch.device("cuda", 0))

        def close() -> None:
            CudaRing.close(ring)  # lets go of what it held, then fails
            raise RuntimeError("CUDA error: an illegal memory access")

        ring.close = close
        return ring

    monkeypatch.setattr(_dataloader, "_page_locked_ring", failing_ring)
    loader = DataLoader(Rows(), batch_size=2, num_workers=1, pin_memory=True)
    it = iter(loader)
    next(it)
    engine = loader._engine
    pids = engine._pool.pids
    os.kill(pids[0], signal.SIGKILL)
    try:
        for _ in it:
            pass
    except fastq.WorkerDied as exc:  # not kept: its context holds the engine
        assert "SIGKILL" in str(exc)
        assert isinstance(exc.__context__, RuntimeError)
    else:
        pytest.fail("the loop went on past a dead worker")
    assert engine.closed and not any(alive(p) for p in pids)
    del it, engine
    loader.close()
