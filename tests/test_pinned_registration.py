"""The page-locked ring is registered slot by slot, first slots first
(NOTE [ Page-locking the ring slot by slot ] in fastq/torch/_pinned.py): on
a fake driver that a registration holds while it runs, a copy from the
first slot waits for one piece at most, never for the whole ring."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers.pinning import FakeCuda, FakeGpu, wait_until  # noqa: E402

from fastq.torch import _pinned  # noqa: E402
from fastq.torch._pinned import CudaRing, register_pieces  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

HEADER = 4096
SLOT = 1 << 20
SLOTS = 6


class FifoLock:
    """The driver as a copy meets it: one call at a time, served in the
    order they came."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._next = 0  # the next ticket handed out
        self._serving = 0
        self.queued = 0  # callers waiting

    def __enter__(self) -> None:
        with self._changed:
            ticket = self._next
            self._next += 1
            self.queued += 1
            self._changed.wait_for(lambda: self._serving == ticket)
            self.queued -= 1

    def __exit__(self, *exc: Any) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()


class GatedDriver(FakeCuda):
    """A FakeCuda whose cudaHostRegister holds the driver until the test
    lets it finish (``finish``), and whose copies take the driver too."""

    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__(gpu)
        self.driver = FifoLock()
        self.gate = threading.Semaphore(0)
        self.pieces: list[tuple[int, int]] = []  # (address, nbytes), in order
        self.unregistered: list[int] = []
        self.events: list[str] = []
        self.registering = 0  # the piece holding the driver, counted from 1

    def register(self, address: int, nbytes: int) -> str | None:
        with self.driver:
            self.registering = len(self.pieces) + 1
            self.gate.acquire()
            self.pieces.append((address, nbytes))
            self.events.append(f"registered {len(self.pieces)}")
        return None

    def unregister(self, address: int) -> str | None:
        self.unregistered.append(address)
        return None

    def copy(self, address: int) -> None:
        with self.driver:
            self.events.append(f"copied {address}")

    def finish(self, pieces: int) -> None:
        for _ in range(pieces):
            self.gate.release()


def _ring_and_slots() -> tuple[bytearray, list[tuple[int, int]]]:
    mapping = bytearray(HEADER + SLOTS * SLOT + 512)
    return mapping, [(HEADER + k * SLOT, SLOT) for k in range(SLOTS)]


def test_pieces_cover_the_ring_along_its_slots_first_slot_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_pinned, "REGISTER_CHUNK_BYTES", 2 * SLOT)
    total = HEADER + SLOTS * SLOT + 512
    _, slots = _ring_and_slots()
    pieces = register_pieces(total, slots)
    assert pieces[0] == (0, HEADER + SLOT), "what precedes slot 0, and slot 0"
    assert sum(n for _, n in pieces) == total
    assert all(a + n == b for (a, n), (b, _) in zip(pieces, pieces[1:]))
    ends = {off + n for off, n in slots} | {total}
    assert all(a + n in ends for a, n in pieces), "no slot split in two"
    assert max(n for _, n in pieces[:-1]) <= 2 * SLOT
    assert register_pieces(total, None) == [(0, total)]


def test_a_copy_of_slot_0_waits_for_one_piece_not_the_whole_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_pinned, "REGISTER_CHUNK_BYTES", SLOT)
    driver = GatedDriver(FakeGpu())
    ring = CudaRing(
        torch.device("cuda", 0), False, pin=True, register_later=True, cuda=driver
    )
    mapping, slots = _ring_and_slots()
    ring.attach(mapping, lambda: None, slots)
    total = len(register_pieces(len(mapping), slots))
    assert total == SLOTS
    try:
        driver.finish(1)
        wait_until(lambda: len(driver.pieces) == 1)
        base = driver.pieces[0][0]
        assert driver.pieces[0] == (base, HEADER + SLOT), "slot 0 is pinned first"
        stats = ring.stats()
        assert stats["registered"] is False
        assert stats["registered_bytes"] == HEADER + SLOT
        # The second piece holds the driver now; the first batch's copy
        # from slot 0 queues behind it.
        wait_until(lambda: driver.registering == 2)
        copier = threading.Thread(target=driver.copy, args=(base + HEADER,))
        copier.start()
        wait_until(lambda: driver.driver.queued >= 1)
        driver.finish(1)
        copier.join(10)
        assert not copier.is_alive()
        assert driver.events[:3] == [
            "registered 1",
            "registered 2",
            f"copied {base + HEADER}",
        ]
        assert len(driver.pieces) < total, "copied before the ring was all pinned"
    finally:
        driver.finish(total)
        wait_until(lambda: ring.registered)
        ring.close()
    assert ring.stats()["registered_bytes"] == 0
    assert driver.unregistered == [address for address, _ in driver.pieces]
    assert sum(n for _, n in driver.pieces) == len(mapping)


def test_a_piece_that_cannot_be_pinned_leaves_the_others_to_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registered later: the pieces pinned before the failure stay pinned
    (copies may read them) until close(), with the warning."""
    monkeypatch.setattr(_pinned, "REGISTER_CHUNK_BYTES", SLOT)
    driver = FakeCuda(FakeGpu())
    calls = []

    def register(address: int, nbytes: int) -> str | None:
        calls.append(address)
        return "cudaErrorMemoryAllocation" if len(calls) == 3 else None

    monkeypatch.setattr(driver, "register", register)
    unregistered: list[int] = []
    monkeypatch.setattr(driver, "unregister", lambda a: unregistered.append(a))
    ring = CudaRing(
        torch.device("cuda", 0), False, pin=True, register_later=True, cuda=driver
    )
    mapping, slots = _ring_and_slots()
    with pytest.warns(RuntimeWarning, match="not page-locked are pinned by copy"):
        ring.attach(mapping, lambda: None, slots)
        assert ring._registrar is not None
        ring._registrar.join(10)
    assert not ring.registered
    assert ring.stats()["registered_bytes"] == HEADER + 2 * SLOT
    ring.close()
    assert unregistered == calls[:2]
