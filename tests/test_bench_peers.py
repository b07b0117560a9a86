"""Each transport of `python -m fastq bench`, opened in this process on a
short run: the consumer gets the batch its producer made, byte for byte, and
still holds it intact while it waits for the next. Transports whose package is
missing are skipped, saying which to install."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from fastq._bench.runner import GROUPS
from fastq._bench.transports import PEERS, TRANSPORTS, Case, Transport
from fastq._bench.workloads import STAMP_BYTES, Producer, read_stamp

NEW_PEERS = ("spdl-threads", "spdl-shm", "torchdata-threads", "torchdata-processes")
BATCHES = 6


def _fields(batch: Any) -> list[np.ndarray[Any, Any]]:
    if isinstance(batch, dict):
        batch = list(batch.values())
    if not isinstance(batch, (tuple, list)):
        batch = [batch]
    return [np.asarray(f.numpy() if hasattr(f, "numpy") else f) for f in batch]


def _check(batch: Any, expected: Producer) -> None:
    """`batch` holds the bytes `expected` makes for its batch number; the
    stamp's time (bytes 8 to 16) differs from one making to the next."""
    fields = _fields(batch)
    n, _ = read_stamp(fields[0])
    want = [f.copy() for f in expected.batch(n)]
    assert len(fields) == len(want)
    for got, ref in zip(fields, want):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        got_bytes = got.reshape(-1).view(np.uint8).copy()
        ref_bytes = ref.reshape(-1).view(np.uint8)
        if got is fields[0]:
            got_bytes[8:STAMP_BYTES] = ref_bytes[8:STAMP_BYTES]
        assert np.array_equal(got_bytes, ref_bytes), f"batch {n} differs"


def _psm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape", ["small", "decode"])
@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_transport_hands_over_the_producers_batch(transport: str, shape: str) -> None:
    if shape == "decode" and transport not in (*NEW_PEERS, "fastq", "memcpy"):
        pytest.skip("the compute-bound case is checked for the new peers only")
    t = TRANSPORTS[transport]
    why = t.missing()
    if why:
        pytest.skip(why)
    case = Case(transport, shape, workers=1, slots=2)
    expected = Producer(case.producer())
    before = _psm_names()
    with t.open(case) as feed:
        held = next(feed.batches)
        _check(held, expected)
        for _ in range(BATCHES):
            batch = next(feed.batches)
            _check(held, expected)  # not overwritten while the next one came
            _check(batch, expected)
            held = batch
        del held, batch
    assert _psm_names() <= before, "shared memory left behind"


def test_new_peers_are_in_the_peers_group() -> None:
    for key in NEW_PEERS:
        assert TRANSPORTS[key].role == "peer"
        assert key in PEERS and key in GROUPS["peers"]


def test_a_missing_peer_is_skipped_with_its_pip_line() -> None:
    t = Transport("x", "X", "peer", "via_x:x", requires="no_such_module_x", pip="x==1")
    assert t.missing() == (
        "X: skipped, no_such_module_x is not installed (pip install x==1)"
    )
    assert TRANSPORTS["spdl-shm"].pip == "spdl==0.8.0"
    assert TRANSPORTS["torchdata-processes"].pip == "torchdata==0.11.0 torch==2.13.0"
