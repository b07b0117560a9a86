"""Arguments, lifecycle and stats of the public object."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from helpers import PatternDataset

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
        pf.__del__()
    assert pf.closed


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
