"""Exact resume: a Prefetcher's state_dict() loaded into another (any number
of workers) continues bit for bit where it was saved, and the known
pitfalls of resuming are each a test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import Augmented, CallLog, RandomDataset, calls

import fastq

BATCH = 4  # RandomDataset has 64 samples: 16 batches per epoch


def make(**kw: Any) -> fastq.Prefetcher:
    kw.setdefault("workers", 2)
    kw.setdefault("seed", 11)
    return fastq.Prefetcher(RandomDataset(), batch_size=BATCH, shuffle=True, **kw)


def take(it: Any, n: int) -> list[tuple[np.ndarray, ...]]:
    return [tuple(np.array(x) for x in next(it)) for _ in range(n)]


def epoch(pf: fastq.Prefetcher) -> list[tuple[np.ndarray, ...]]:
    return [tuple(np.array(x) for x in b) for b in pf]


def same(a: list[tuple[np.ndarray, ...]], b: list[tuple[np.ndarray, ...]]) -> bool:
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b)
    )


@pytest.fixture(scope="module")
def reference() -> list[list[tuple[np.ndarray, ...]]]:
    """Three epochs, never interrupted."""
    with make() as pf:
        return [epoch(pf) for _ in range(3)]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


@pytest.mark.parametrize("workers", [1, 3])
def test_resume_mid_epoch_is_bit_identical_with_any_workers(
    reference: Any, workers: int
) -> None:
    with make() as pf:
        it = iter(pf)
        first = take(it, 6)
        state = roundtrip(pf.state_dict())
    assert state["epoch"] == 0 and state["batches_done"] == 6
    with make(workers=workers, seed=None, state=state) as pf:
        rest = epoch(pf)
        later = [epoch(pf), epoch(pf)]
    assert same(first + rest, reference[0])
    assert same(later[0], reference[1]) and same(later[1], reference[2])


def test_skipped_batches_are_never_made() -> None:
    with make() as pf:
        it = iter(pf)
        take(it, 12)
        state = pf.state_dict()
    with make(state=state, slots=2) as pf:
        rest = epoch(pf)
        made = sum(w["batches"] for w in pf.stats()["workers"])
    assert len(rest) == 4
    assert made <= len(rest) + 3  # the next epoch's prefetch at most


def test_load_state_dict_into_a_running_prefetcher(reference: Any) -> None:
    with make() as pf:
        it = iter(pf)
        take(it, 3)
        state = pf.state_dict()
    with make() as pf:
        pf.load_state_dict(state)
        assert same(epoch(pf), reference[0][3:])


def test_a_state_saved_at_an_epochs_end_resumes_at_the_next(reference: Any) -> None:
    with make() as pf:
        epoch(pf)
        state = pf.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 0
    with make(state=state) as pf:
        assert same(epoch(pf), reference[1])


def test_a_state_saved_after_the_last_batch_but_before_stopiteration(
    reference: Any,
) -> None:
    with make() as pf:
        it = iter(pf)
        take(it, 16)  # every batch, StopIteration not yet seen
        state = pf.state_dict()
    with make(state=state) as pf:
        assert same(epoch(pf), reference[1])


def test_a_state_saved_before_any_batch_is_the_whole_run(reference: Any) -> None:
    with make() as pf:
        state = pf.state_dict()
    assert state["epoch"] == 0 and state["batches_done"] == 0
    with make(state=state) as pf:
        assert same(epoch(pf), reference[0])


def test_a_state_saved_after_a_break_resumes_the_rest_of_that_epoch(
    reference: Any,
) -> None:
    with make() as pf:
        for i, _ in enumerate(pf):
            if i == 4:
                break
        state = pf.state_dict()
    assert state["epoch"] == 0 and state["batches_done"] == 5
    with make(state=state) as pf:
        assert same(epoch(pf), reference[0][5:])


def test_a_loaded_state_reads_back_unchanged() -> None:
    with make() as pf:
        it = iter(pf)
        take(it, 7)
        state = pf.state_dict()
    with make(state=state) as pf:
        assert pf.state_dict() == state


def _face(name: str) -> Any:
    if name == "TorchPrefetcher":
        return pytest.importorskip("fastq.torch").TorchPrefetcher
    return fastq.Prefetcher


@pytest.mark.parametrize("face", ["Prefetcher", "TorchPrefetcher"])
@pytest.mark.parametrize(
    ("saved_ordered", "batches", "loaded_ordered"),
    [
        (True, 16, True),  # after an epoch's last batch, before StopIteration
        (False, 16, False),
        (False, 7, True),  # delivered out of order, resumed in order
    ],
)
def test_a_state_saved_before_the_first_batch_is_the_loaded_one(
    face: str, saved_ordered: bool, batches: int, loaded_ordered: bool
) -> None:
    """A checkpoint at the first step after a restart (before iter(), and
    after it before any next()) saves exactly what was loaded, through
    load_state_dict and state= alike."""
    with make(ordered=saved_ordered) as pf:
        take(iter(pf), batches)
        state = roundtrip(pf.state_dict())
    cls = _face(face)
    kw: dict[str, Any] = {"workers": 1, "seed": 11, "shuffle": True}
    with cls(RandomDataset(), BATCH, ordered=loaded_ordered, **kw) as pf:
        pf.load_state_dict(state)
        assert roundtrip(pf.state_dict()) == state
        it = iter(pf)
        assert roundtrip(pf.state_dict()) == state
        del it
    with cls(RandomDataset(), BATCH, ordered=loaded_ordered, state=state, **kw) as pf:
        assert roundtrip(pf.state_dict()) == state


@pytest.mark.parametrize("second_save", ["before iter", "after iter", "after a batch"])
def test_an_unordered_state_resumed_in_order_and_saved_again_keeps_its_place(
    reference: Any, second_save: str
) -> None:
    """Save, load, save, load, run: the batches an unordered run delivered
    past its prefix (here 5, 6 and 9 after 0 to 2) are never made twice,
    and every batch is the uninterrupted run's, bit for bit."""
    with make(ordered=False) as pf:
        state = {**pf.state_dict(), "batches_done": 3, "delivered": [5, 6, 9]}
    got = [reference[0][b] for b in (0, 1, 2, 5, 6, 9)]
    with make(ordered=True, state=state) as pf:
        it = iter(pf) if second_save != "before iter" else None
        if second_save == "after a batch":
            got += take(it, 1)
        again = roundtrip(pf.state_dict())
        del it
    with make(ordered=True, state=again) as pf:
        rest = epoch(pf)
        later = epoch(pf)
    assert len(got) + len(rest) == len(reference[0])
    ids = [tuple(int(i) for i in b[2]) for b in reference[0]]
    order = sorted(got + rest, key=lambda b: ids.index(tuple(int(i) for i in b[2])))
    assert same(order, reference[0])
    assert same(later, reference[1])


def test_load_state_dict_after_iter_ends_that_loop_with_the_fix(
    reference: Any,
) -> None:
    """torchdata's StatefulDataLoader restarts silently here."""
    with make() as pf:
        it = iter(pf)
        take(it, 5)
        state = pf.state_dict()
    with make() as pf:
        stale = iter(pf)
        take(stale, 2)
        pf.load_state_dict(state)
        with pytest.raises(fastq.ConfigError, match="call iter\\(\\) again"):
            next(stale)
        assert same(epoch(pf), reference[0][5:])


def test_unordered_resume_delivers_exactly_the_others() -> None:
    with make(ordered=False) as pf:
        it = iter(pf)
        got = take(it, 7)
        state = roundtrip(pf.state_dict())
    done = state["batches_done"] + len(state["delivered"])
    assert done == 7
    with make(ordered=False, state=state) as pf:
        rest = epoch(pf)
    samples = sorted(int(s) for b in got + rest for s in b[2])
    assert samples == list(range(64))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"batch_size": 8}, "batch_size"),
        ({"samples": 65}, "samples"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 1}, "rank"),
        ({"reshard": [[2]]}, "reshard"),
        ({"seed": 12}, "seed"),
        ({"batches_done": 99}, "batches_done"),
        ({"format": "other"}, "format"),
    ],
)
def test_a_state_of_another_stream_is_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    with make() as pf:
        state = {**pf.state_dict(), **change}
        with pytest.raises(fastq.ConfigError, match=field):
            pf.load_state_dict(state)


def test_a_state_of_another_dataset_length_names_both_lengths() -> None:
    with make() as pf:
        state = {**pf.state_dict(), "samples": 100}
    with pytest.raises(fastq.ConfigError, match=r"samples'\]=100.*samples=64"):
        make(state=state)


def test_the_stream_only_moves_forward() -> None:
    with make() as pf:
        old = pf.state_dict()
        epoch(pf)
        epoch(pf)
        with pytest.raises(fastq.ConfigError, match="only\\s+moves forward"):
            pf.load_state_dict(old)


def test_a_run_resumed_without_spec_is_bit_identical(tmp_path: Path) -> None:
    """Worker 0 infers the spec from the state's next batch (not batch 0),
    seeded as in the run that never stopped, and delivers it."""
    kw: dict[str, Any] = {
        "batch_size": BATCH,
        "workers": 2,
        "shuffle": True,
        "seed": 11,
        "start_method": "fork",
    }
    with fastq.Prefetcher(Augmented(40), **kw) as pf:
        reference = [epoch(pf) for _ in range(2)]
    with fastq.Prefetcher(Augmented(40), **kw) as pf:
        first = take(iter(pf), 3)
        state = roundtrip(pf.state_dict())
    with fastq.Prefetcher(Augmented(40), state=state, **kw) as pf:
        rest = epoch(pf)
        later = epoch(pf)
    assert same(first + rest, reference[0]) and same(later, reference[1])

    # Only what was left of the epoch is fetched, each sample once.
    log = str(tmp_path)
    with fastq.Prefetcher(CallLog(40, log), state=state, **kw) as pf:
        rest_indices = [i for b in pf for i in b[1].tolist()]
    fetched = [c.indices[0] for c in calls(log) if c.epoch == 0]
    assert len(rest_indices) == 40 - 3 * BATCH
    assert sorted(fetched) == sorted(rest_indices)
