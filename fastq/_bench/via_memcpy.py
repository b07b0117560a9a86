"""The physical limit: one process copies each batch (the same producer work
as every transport) into a destination, with no second process at all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .transports import Case, Feed, ring_slots
from .workloads import Arrays, Producer


def _copies(case: Case, buffers: int) -> Iterator[Arrays]:
    producer = Producer(case.producer())
    targets = [case.shape.empty() for _ in range(buffers)]
    for t in targets:  # fault the destinations in now, as fastq's ring is
        for a in t:
            a.fill(0)
    n = 0
    while True:
        out = targets[n % buffers]
        for dst, src in zip(out, producer.batch(n)):
            np.copyto(dst, src)
        n += 1
        yield out


@contextmanager
def ring(case: Case) -> Iterator[Feed]:
    """As many destinations as the fastq ring has slots: the same memory
    footprint, so the limit of writing each batch once to memory."""
    yield Feed(_copies(case, ring_slots(case.slots)))


@contextmanager
def hot(case: Case) -> Iterator[Feed]:
    """One destination: with a large last-level cache it never leaves it, so
    this measures the cache, not memory."""
    yield Feed(_copies(case, 1))
