"""fastq.torch.DataLoader(pin_memory=True) on the page-locked ring, without
a GPU: batches are handed out over their slots (no copy), a slot goes back
only once the event recorded when its batch was dropped has completed, and
what DataLoader pins besides arrays is still pinned as it pins it. The same
loop on a GPU: tests/test_torch_cuda.py."""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import alive  # noqa: E402
from torch_helpers.pinning import (  # noqa: E402
    FakeCuda,
    FakeEvent,
    FakeGpu,
    fake_ring,
    in_ring,
    ring_range,
    wait_until,
)

import fastq  # noqa: E402
from fastq._core._ring import FREE, READY  # noqa: E402
from fastq._loop._engine import DEVICE_SLOTS  # noqa: E402
from fastq.torch import DataLoader, _loader_engine  # noqa: E402
from fastq.torch._pinned import CudaRing  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

ROW = 4096  # values per sample: a batch fills much of its slot


class Rows:
    """Sample i: (ROW int32 values equal to i, i, a string)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        return torch.full((ROW,), i, dtype=torch.int32), i, f"sample {i}"


class PinnedCuda:
    """What a test on the fake GPU holds: the GPU, the types of the batches
    torch's pin_memory was given, and each CudaRing the loaders made."""

    def __init__(self) -> None:
        self.gpu = FakeGpu()
        self.pinned: list[str] = []
        self.rings: list[CudaRing] = []

    def ring(self) -> CudaRing:
        ring = fake_ring(torch.device("cuda", 0), self.gpu, pin=True)
        self.rings.append(ring)
        return ring


@pytest.fixture
def on_fake_cuda(monkeypatch: pytest.MonkeyPatch) -> PinnedCuda:
    """As on a CUDA machine, on a FakeGpu whose events complete only when
    the test runs it (torch's pin_memory returns the ring's tensors as they
    are, being pinned already, and cannot run on a torch without CUDA)."""
    cuda = PinnedCuda()
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda *a: torch.device("cuda")
    )
    monkeypatch.setattr(_loader_engine, "_page_locked_ring", cuda.ring)

    def pin_batch(batch: Any, device: Any = None) -> Any:
        assert device == "cuda"
        cuda.pinned.append(type(batch).__name__)
        return batch

    monkeypatch.setattr(_loader_engine, "pin_batch", pin_batch)
    return cuda


def test_a_slot_is_not_rewritten_before_its_event_completes(
    on_fake_cuda: PinnedCuda,
) -> None:
    """Two slots and a fast producer: each batch is dropped while its
    (pretend) non_blocking copy is still queued, two steps behind the loop,
    and its bytes stay as they were until that copy's event has completed;
    then the slot is reused."""
    gpu = on_fake_cuda.gpu
    loader = DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True, slots=2)
    it = iter(loader)
    batches = 0
    queued: list[tuple[FakeEvent, int, np.ndarray[Any, Any]]] = []
    engine = None
    for rows, labels, names in it:
        if engine is None:
            engine = loader._engine
            bounds = ring_range(engine)
            whole = np.frombuffer(engine._region.mapping, dtype=np.uint8)
        assert in_ring(rows, bounds), "pinned batches are not copied"
        want = labels.tolist()
        assert want == list(range(4 * batches, 4 * batches + 4))
        assert (rows == labels[:, None].int()).all()
        assert list(names) == [f"sample {i}" for i in want]
        offset, size = rows.data_ptr() - bounds[0], rows.numel() * 4
        snapshot = whole[offset : offset + size].copy()
        del rows, labels, names
        event = gpu.recorded[-1]
        assert not event.done, "the slot was freed before its event"
        queued.append((event, offset, snapshot))
        for event, at, seen in queued:
            if not event.done:
                assert np.array_equal(whole[at : at + seen.size], seen)
        batches += 1
        gpu.run_to(batches - 2)
    assert batches == 10
    assert on_fake_cuda.pinned == ["list"] * 10  # each batch through pin_memory once
    assert set(gpu.synchronized_on) == {"fastq-pinned-returner"}
    gpu.run_all()
    wait_until(lambda: engine._feed.consumer.held == 0)
    del whole
    loader.close()


def test_batches_kept_by_the_loop_are_copied_and_pinned(
    on_fake_cuda: PinnedCuda,
) -> None:
    """list(loader) keeps every batch: past the slots, batches are copied
    out of the ring, pinned as DataLoader pins (here: given to pin_memory),
    and the workers never run out of slots."""
    loader = DataLoader(
        Rows(),
        batch_size=4,
        num_workers=1,
        pin_memory=True,
        slots=2,
        persistent_workers=True,  # stats() after the epoch
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silently, as DataLoader keeps them
        it = iter(loader)
        kept = [next(it)]
        bounds = ring_range(loader._engine)
        kept += list(it)
    assert [b[1].tolist() for b in kept] == [
        list(range(4 * b, 4 * b + 4)) for b in range(10)
    ]
    assert all((rows == labels[:, None].int()).all() for rows, labels, _ in kept)
    assert on_fake_cuda.pinned == ["list"] * 10
    # Some batches were copied, and their slots returned at once: none of
    # them waited for device work (the others are still referenced).
    copied = 10 - sum(in_ring(rows, bounds) for rows, _, _ in kept)
    assert 0 < copied < 10
    assert on_fake_cuda.gpu.recorded == []
    assert loader.stats()["pinned"]["copied_batches"] == copied
    del kept
    loader.close()


class Many(Rows):
    def __len__(self) -> int:
        return 4 * 200


@pytest.mark.parametrize("behind", [1, DEVICE_SLOTS])
def test_the_workers_window_survives_a_gpu_steps_behind(
    on_fake_cuda: PinnedCuda, behind: int
) -> None:
    """The GPU runs ``behind`` steps behind the loop, then stops: the slots
    waiting on it come out of the ring's device slots, not the workers'
    window, so the loop still takes ``behind`` + the window's batches
    without a worker making one more; only then would it wait, and it waits
    for the GPU (a timeout here), never on the loop's thread."""
    gpu = on_fake_cuda.gpu
    window = 4
    loader = DataLoader(
        Many(), batch_size=4, num_workers=1, pin_memory=True, slots=window, timeout=1
    )
    it = iter(loader)
    for b in range(20):
        rows, labels, _ = next(it)
        assert labels.tolist() == list(range(4 * b, 4 * b + 4))
        del rows, labels, _
        gpu.run_to(b + 1 - behind)
    # The GPU stops; the worker fills every slot it can.
    engine = loader._engine
    ring, consumer = engine._ring, engine._feed.consumer
    wait_until(lambda: ring.depth(FREE) == 0)
    wait_until(
        lambda: ring.depth(READY) + consumer.in_window + consumer.held == ring.nslots
    )
    made = engine._pool and sum(w["batches"] for w in loader.stats()["workers"])
    ready = ring.depth(READY) + consumer.in_window
    assert ready >= window + DEVICE_SLOTS - behind
    for b in range(20, 20 + ready):
        rows, labels, _ = next(it)
        assert labels.tolist() == list(range(4 * b, 4 * b + 4))
        del rows, labels, _
    assert sum(w["batches"] for w in loader.stats()["workers"]) == made
    assert set(gpu.synchronized_on) <= {"fastq-pinned-returner"}
    pinned = loader.stats()["pinned"]
    assert pinned["loop_synchronizes"] == 0
    assert pinned["device_held"] == pinned["peak_device_held"] == ring.nslots
    with pytest.raises(fastq.FetchTimeout):
        next(it)  # every slot waits on the stopped GPU
    loader.close()


def test_page_locked_memory_stays_bounded_over_a_thousand_batches(
    on_fake_cuda: PinnedCuda,
) -> None:
    """A thousand batches with the GPU a step behind: the only page-locked
    memory is the ring, registered once, first slot first (no block per
    batch, as a pin thread's copies would take)."""
    gpu = on_fake_cuda.gpu

    class Thousand(Rows):
        def __len__(self) -> int:
            return 1000

    loader = DataLoader(
        Thousand(),
        batch_size=1,
        num_workers=2,
        pin_memory=True,
        slots=4,
        persistent_workers=True,
    )
    for b, (rows, labels, _) in enumerate(loader):
        assert labels.tolist() == [b] and (rows == b).all()
        del rows, labels, _
        gpu.run_to(b - 1)
    [ring] = on_fake_cuda.rings
    assert ring.registered
    engine = loader._engine._engine
    first_slot, size = min(engine._slot_ranges())
    # What precedes the first slot and the slot itself, then the rest.
    assert ring.cuda.registered == [
        first_slot + size,
        engine.region.size - first_slot - size,
    ]
    assert ring.stats()["registered_bytes"] == engine.region.size
    gpu.run_all()
    loader.close()


def test_pin_memory_device_is_deprecated_as_in_dataloader(
    on_fake_cuda: PinnedCuda,
) -> None:
    loader = DataLoader(
        Rows(), batch_size=8, num_workers=1, pin_memory=True, pin_memory_device="cuda"
    )
    with pytest.warns(UserWarning, match="pin_memory_device is deprecated"):
        assert sum(1 for _ in loader) == 5
    loader.close()


def test_a_workers_death_is_raised_even_if_unpinning_fails(
    on_fake_cuda: PinnedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop sees WorkerDied, not the error of closing the pinned ring
    (a CUDA error, say), and the engine still reaps its workers and closes
    its ring (the session's leak check)."""

    def failing_ring() -> Any:
        ring = on_fake_cuda.ring()

        def close() -> None:
            CudaRing.close(ring)  # lets go of what it held, then fails
            raise RuntimeError("CUDA error: an illegal memory access")

        ring.close = close
        return ring

    monkeypatch.setattr(_loader_engine, "_page_locked_ring", failing_ring)
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


def test_a_ring_that_cannot_be_page_locked_is_pinned_by_copy(
    on_fake_cuda: PinnedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cudaHostRegister fails (a memlock limit, say) on the thread that
    registers the ring: the loader warns, naming the fix, and goes on with
    every batch pinned by copy as DataLoader pins them; nothing is lost."""
    monkeypatch.setattr(
        FakeCuda, "register", lambda self, address, nbytes: "cudaErrorMemoryAllocation"
    )
    loader = DataLoader(
        Rows(), batch_size=4, num_workers=1, pin_memory=True, persistent_workers=True
    )
    with pytest.warns(RuntimeWarning, match=r"pin_memory=False.*pinned by copy"):
        it = iter(loader)
        batches = [next(it)[1].tolist()]
        [ring] = on_fake_cuda.rings
        wait_until(lambda: ring._mapping is None)  # the registration was tried
    for _, labels, _ in it:
        batches.append(labels.tolist())
        del labels
        on_fake_cuda.gpu.run_all()  # each batch's copy ran
    assert batches == [list(range(4 * b, 4 * b + 4)) for b in range(10)]
    assert not ring.registered
    on_fake_cuda.gpu.run_all()
    loader.close()


def test_a_cuda_error_while_waiting_on_an_event_returns_the_slot(
    on_fake_cuda: PinnedCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The returner's synchronize raises (a CUDA error): it still gives the
    slot back, so the epoch goes on to its end instead of waiting forever
    for slots that can no longer be read."""

    def broken(self: FakeEvent) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(FakeEvent, "synchronize", broken)
    loader = DataLoader(Rows(), batch_size=4, num_workers=1, pin_memory=True, slots=2)
    labels = [b[1].tolist() for b in loader]
    assert labels == [list(range(4 * b, 4 * b + 4)) for b in range(10)]
    loader.close()
