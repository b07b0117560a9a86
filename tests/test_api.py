"""Arguments, lifecycle and stats of the public object."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CallLog,
    CallLogFill,
    CallLogItems,
    CountingBatches,
    FailingDataset,
    FillOnly,
    PatternDataset,
    StuckDataset,
    assert_whole_loop,
    calls,
    expected_batch,
)
from process_checks import child_pids

import fastq

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"workers": 0}, r"workers=0: expected a positive integer"),
        ({"workers": -2}, r"workers=-2"),
        ({"slots": 0}, r"slots=0: expected a positive integer"),
        ({"batch_size": 0}, r"batch_size=0"),
        ({"batch_size": None}, r"batch_size=None: a map-style source needs batch_size"),
        ({"batch_size": 200, "drop_last": True}, r"leaves no batch"),
        ({"timeout": -1}, r"timeout=-1"),
        ({"start_method": "thread"}, r"start_method='thread' is not available"),
        ({"rank": 2, "world_size": 2}, r"rank=2: expected 0 <= rank < world_size=2"),
        ({"worker_init": 3}, r"worker_init=3"),
    ],
)
def test_bad_arguments_name_the_argument_and_fix(kwargs, match) -> None:  # type: ignore[no-untyped-def]
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(fastq.ConfigError, match=match):
        fastq.Prefetcher(PatternDataset(100), **args)


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError):
        fastq.Prefetcher(PatternDataset(10), batch_size=4, workers=0)


def test_a_source_that_is_neither_kind_is_refused() -> None:
    with pytest.raises(fastq.ConfigError, match="expected a map-style dataset"):
        fastq.Prefetcher(42, batch_size=4)


def test_unpicklable_source_under_spawn_names_the_fix() -> None:
    source = PatternDataset(10)
    source.guard = threading.Lock()  # type: ignore[attr-defined]

    with pytest.raises(
        fastq.ConfigError,
        match="cannot be pickled.*thread locks.*leave start_method unset",
    ):
        fastq.Prefetcher(source, batch_size=2, workers=1, start_method="spawn")


def test_closed_prefetcher_refuses_iteration() -> None:
    pf = fastq.Prefetcher(
        PatternDataset(10), batch_size=2, workers=1, start_method="fork"
    )
    pf.close()
    pf.close()  # idempotent
    with pytest.raises(fastq.PrefetcherClosed):
        iter(pf)


def test_unclosed_prefetcher_warns_and_cleans_up() -> None:
    pf = fastq.Prefetcher(
        PatternDataset(10), batch_size=2, workers=1, start_method="fork"
    )
    with pytest.warns(ResourceWarning, match="not closed"):
        del pf
    assert child_pids() == []


@pytest.mark.parametrize("source", ["map-style", "callable"])
def test_an_unnamed_prefetcher_serves_its_whole_loop_then_closes_quietly(
    source: str,
) -> None:
    """`for batch in fastq.Prefetcher(...)`, nothing naming the Prefetcher:
    its loop holds it (NOTE [ A loop holds its face ]), so every batch
    comes, bit for bit; once the loop is done its workers are gone (by
    reference count alone, no collector pass), with nothing to warn of."""
    got: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.disable()
        try:
            if source == "map-style":
                for batch in fastq.Prefetcher(
                    PatternDataset(22), batch_size=4, workers=2, start_method="fork"
                ):
                    got.append(tuple(a.copy() for a in batch))
            else:
                for batch in fastq.Prefetcher(
                    CountingBatches(3), workers=2, start_method="fork"
                ):
                    got.append(tuple(a.copy() for a in batch))
            left = child_pids()
        finally:
            gc.enable()
    assert left == [], "the workers outlived the loop and the Prefetcher"
    assert [w for w in caught if w.category is ResourceWarning] == []
    map_style = [expected_batch(range(i, min(i + 4, 22))) for i in range(0, 22, 4)]
    assert_whole_loop(got, map_style if source == "map-style" else None)


def test_stats_report_throughput_and_workers() -> None:
    with fastq.Prefetcher(
        PatternDataset(64), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        for _ in pf:
            pass
        s = pf.stats()
    assert s["batches"] == 16 and s["bytes"] == 64 * pf.spec.row_bytes
    assert 0.0 <= s["wait_share"] <= 1.0
    assert len(s["workers"]) == 2 and sum(w["batches"] for w in s["workers"]) >= 16
    assert all(w["pid"] > 0 for w in s["workers"])


def test_defaults() -> None:
    with fastq.Prefetcher(PatternDataset(10), batch_size=2) as pf:
        assert pf.workers >= 1 and pf.slots == max(2, 2 * pf.workers)
        assert sum(1 for _ in pf) == 5


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("via", ["-c", "stdin"])
def test_source_defined_in_python_c_reaches_every_start_method(
    method: str, via: str
) -> None:
    # No worker can import a `python -c` or standard-input __main__: its
    # class travels by value, and the main module's missing file is not
    # looked for.
    script = textwrap.dedent(
        f"""
        import fastq, numpy as np

        class Rows:
            def __len__(self):
                return 8
            def __getitem__(self, i):
                return np.full(2, i, np.int64)

        for method in ({method!r}, "fork"):
            with fastq.Prefetcher(Rows(), batch_size=4, start_method=method) as pf:
                print(method, [b[:, 0].tolist() for b in pf])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script] if via == "-c" else [sys.executable, "-"],
        input=None if via == "-c" else script,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{m} [[0, 1, 2, 3], [4, 5, 6, 7]]" for m in (method, "fork")
    ]


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE"])
def test_a_malformed_torchrun_variable_is_named(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "two")
    with pytest.raises(fastq.ConfigError, match=f"{name}='two'.*expected an integer"):
        fastq.Prefetcher(PatternDataset(8), batch_size=2, workers=1)


def test_set_epoch_resumes_at_that_epoch() -> None:
    def run(workers: int, resume_at: int | None, epochs: int) -> list[list[Any]]:
        out = []
        with fastq.Prefetcher(
            PatternDataset(20), batch_size=5, workers=workers, shuffle=True, seed=3
        ) as pf:
            if resume_at is not None:
                pf.set_epoch(resume_at)
            for _ in range(epochs):
                out.append([b[1].tolist() for b in pf])
            assert len(pf.dataset) == 20
            if resume_at is not None:
                with pytest.raises(fastq.ConfigError, match="only moves forward"):
                    pf.set_epoch(0)
        return out

    assert run(2, None, 3)[2] == run(1, 2, 1)[0]


def test_world_size_without_rank_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(fastq.ConfigError, match="WORLD_SIZE=2 is set but RANK"):
        fastq.Prefetcher(PatternDataset(8), batch_size=2, workers=1)


# ------------------------------------------- the dataset runs in workers only


@pytest.mark.parametrize(
    "kind", [CallLog, CallLogItems, CallLogFill], ids=["getitem", "getitems", "fill"]
)
def test_a_map_dataset_runs_in_workers_only_and_once_per_sample_per_epoch(
    started_by: dict[str, str], kind: type[CallLog], tmp_path: Path
) -> None:
    """Without spec=, worker 0 infers it from the first batch and delivers
    that batch: no call in the training process, none made twice."""
    with fastq.Prefetcher(
        kind(10, str(tmp_path)),
        batch_size=3,
        workers=2,
        shuffle=True,
        seed=3,
        **started_by,
    ) as pf:
        epochs = [[i for b in pf for i in b[1].tolist()] for _ in range(2)]
        assert pf.spec.fields[0].shape == (3, 5, 7)
    assert [sorted(e) for e in epochs] == [list(range(10))] * 2
    log = calls(str(tmp_path))
    if "worker_method" in started_by:
        assert threading.get_ident() not in {c.thread for c in log}
    else:
        assert os.getpid() not in {c.pid for c in log}
    assert -1 not in {c.epoch for c in log}  # every call inside a batch
    for e in (0, 1):  # later epochs may have begun (workers run ahead)
        made = [
            i for c in log if c.epoch == e and c.what != "getitem" for i in c.indices
        ]
        single = [c.indices[0] for c in log if c.epoch == e and c.what == "getitem"]
        if kind is CallLog:
            assert made == [] and sorted(single) == list(range(10))
        else:
            assert sorted(made) == list(range(10))
            # fill_batch: one sample read once per run to lay out the slots.
            assert single == ([epochs[0][0]] if kind is CallLogFill and e == 0 else [])


def test_an_error_in_the_first_sample_is_raised_by_the_constructor(
    started_by: dict[str, str],
) -> None:
    """The only worker's: no spec can be had, so no ring: the constructor
    raises it, with the worker's traceback, as a stream's first item's
    error."""
    with pytest.raises(fastq.WorkerError) as info:
        fastq.Prefetcher(
            FailingDataset(20, bad=0), batch_size=4, workers=1, **started_by
        )
    err = info.value
    assert (err.worker, err.task, err.sample) == (0, 0, 0)
    assert "ValueError" in str(err) and "batch 0, sample 0" in str(err)
    assert "__getitem__" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)


def test_a_first_sample_s_error_comes_at_its_turn_when_another_sizes_the_ring(
    started_by: dict[str, str],
) -> None:
    """Every worker begins at once: worker 1's first sample gives the spec,
    and batch 0's error comes at the first next(), as with spec=."""
    with fastq.Prefetcher(
        FailingDataset(20, bad=0), batch_size=4, workers=2, **started_by
    ) as pf:
        it = iter(pf)
        with pytest.raises(fastq.WorkerError) as info:
            next(it)
    err = info.value
    assert (err.worker, err.task, err.sample) == (0, 0, 0)
    assert "__getitem__" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)


def test_an_error_later_in_the_first_batch_is_raised_at_its_turn() -> None:
    """Once its first sample gave the spec, the first batch fails as it
    would with spec=: at the first next()."""
    with fastq.Prefetcher(
        FailingDataset(20, bad=2), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        it = iter(pf)
        with pytest.raises(fastq.WorkerError) as info:
            next(it)
    err = info.value
    assert (err.worker, err.task, err.sample) == (0, 0, 2)
    assert "__getitem__" in err.remote_traceback
    assert pf.closed


def test_a_first_sample_that_never_comes_is_a_fetch_timeout() -> None:
    with pytest.raises(fastq.FetchTimeout, match="worker 0 made no first batch"):
        fastq.Prefetcher(
            StuckDataset(20, stuck=0),
            batch_size=4,
            workers=1,
            timeout=0.5,
            start_method="fork",
        )


class _StuckEverywhere(StuckDataset):
    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return super().__getitem__(self.stuck)


def test_first_samples_that_never_come_are_a_fetch_timeout_naming_the_workers() -> None:
    with pytest.raises(fastq.FetchTimeout, match="workers 0, 1 made no first batch"):
        fastq.Prefetcher(
            _StuckEverywhere(20, stuck=0),
            batch_size=4,
            workers=2,
            timeout=0.5,
            start_method="fork",
        )


def test_a_stuck_first_batch_times_out_at_its_turn_when_another_sizes_the_ring() -> (
    None
):
    with fastq.Prefetcher(
        StuckDataset(20, stuck=0),
        batch_size=4,
        workers=2,
        timeout=0.5,
        start_method="fork",
    ) as pf:
        it = iter(pf)
        with pytest.raises(fastq.FetchTimeout) as info:
            next(it)
    assert info.value.task == 0


def test_a_fill_batch_without_getitem_needs_a_spec() -> None:
    with pytest.raises(
        fastq.ConfigError,
        match=r"spec=None: FillOnly has fill_batch but no __getitem__",
    ):
        fastq.Prefetcher(FillOnly(10), batch_size=4, workers=1)
    spec = (((), "int64"), ((), "float32"))
    with fastq.Prefetcher(
        FillOnly(10), batch_size=4, workers=2, spec=spec, start_method="fork"
    ) as pf:
        batches = [b[0].tolist() for b in pf]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_the_first_batch_never_waits_for_a_slot_later_batches_took(
    tmp_path: Path, worker0_late: None
) -> None:
    """Worker 0 reaches the ring last, after the others took every slot
    but the one claimed with its first batch (DESIGN.md section 3): that
    batch comes, in order, and is not made twice."""
    with fastq.Prefetcher(
        CallLog(24, str(tmp_path)),
        batch_size=2,
        workers=3,
        slots=1,
        timeout=20,
        start_method="fork",
    ) as pf:
        got = [b[1].tolist() for b in pf]
    assert got == [[2 * k, 2 * k + 1] for k in range(12)]
    first_epoch = [c.indices[0] for c in calls(str(tmp_path)) if c.epoch == 0]
    assert sorted(first_epoch) == list(range(24))
