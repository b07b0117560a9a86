"""The training loop of `python -m fastq bench --case train`, its short CPU
form: torch's DataLoader, fastq.torch.DataLoader and TorchPrefetcher
feeding the same step (JPEG decoding and augmentation in the workers), and
the step on one batch reused.

    pytest benchmarks/test_train.py --benchmark-only

Each round is a fresh interpreter running one loader, as the command does.
The round time pytest-benchmark shows is that whole process, start-up
included; the loop's own figures (images/s, the share spent waiting, the
loop's CPU time per step, the first batch, peak PSS) go to extra_info and
to a table with ratios at the end. Rounds per loader:
FASTQ_BENCH_TRAIN_ROUNDS (default 1; the table reports the median).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("torch", reason="the training benchmark needs torch")
pytest.importorskip("PIL", reason="the training benchmark decodes JPEGs with Pillow")
pytest.importorskip(
    "matplotlib", reason="the training benchmark's pictures come with matplotlib"
)

from fastq._bench import train
from fastq._bench.train_data import make_files
from fastq._bench.train_loop import Config, Run

pytestmark = pytest.mark.torch

ROUNDS = int(os.environ.get("FASTQ_BENCH_TRAIN_ROUNDS", "1"))
CONFIGS = train.plan(device="cpu")
_RUNS: list[Run] = []


@pytest.fixture(scope="module")
def files() -> None:
    c = CONFIGS[0]
    make_files(c.data, c.images, c.image_size)


@pytest.mark.parametrize(
    "cfg", CONFIGS, ids=[f"{c.model}-w{c.workers}-{c.loader}" for c in CONFIGS]
)
def test_train_cpu(
    benchmark: Any, summary_table: Any, files: None, cfg: Config
) -> None:
    benchmark.group = f"train {cfg.model} on cpu, {cfg.workers} worker(s)"
    runs: list[Run] = []

    def one() -> None:
        runs.append(train.run_once(cfg))

    benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    errors = [r.error for r in runs if r.error]
    assert not errors, errors[0]
    r = train.medians(runs)[0]
    benchmark.extra_info.update(
        loader=train.label(cfg),
        images_per_s=round(r.images_per_s, 1),
        wait_share=round(r.wait_share, 3),
        loop_cpu_ms_per_step=round(r.loop_cpu_ms, 2),
        first_batch_s=None if r.first_batch_s is None else round(r.first_batch_s, 3),
        peak_pss_mb=round(r.peak_pss / 1e6, 1),
        images=r.images,
        complete=r.complete,
        config=vars(cfg),
    )
    _RUNS.extend(runs)
    summary_table(
        "fastq bench --case train (CPU form)",
        lambda: f"{train.software('cpu')}\n{train.table(_RUNS, ROUNDS)}",
    )
