"""The fixtures of the Feed's tests: a ring on a private mapping, its
workers' side played by this thread, a fake pool and a fake owner."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import pytest
from feed_fakes import SLOT_BYTES, SLOTS, WORKERS, FakeOwner, FakePool, Workers

from fastq._core._ring import (
    Ring,
    region_size,
)
from fastq._core._shm import PAGE_SIZE


@pytest.fixture
def ring() -> Iterator[Ring]:
    size = region_size(SLOTS, WORKERS, SLOT_BYTES, PAGE_SIZE)
    ring = Ring.create(mmap.mmap(-1, size), SLOTS, WORKERS, SLOT_BYTES, PAGE_SIZE, 0)
    yield ring
    ring.close()


@pytest.fixture
def owner() -> FakeOwner:
    return FakeOwner()


@pytest.fixture
def pool(ring: Ring) -> FakePool:
    return FakePool(ring)


@pytest.fixture
def workers(ring: Ring) -> Workers:
    return Workers(ring)
