"""A run over an IterableDataset killed with SIGKILL mid-epoch, resumed from
its last checkpoint on another number of workers: every sample of the
epoch once (those before the checkpoint from the killed run, the rest from
the resumed one), nothing made twice past the checkpoint (a dataset that
keeps its place resumes from it), and nothing of the killed run left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tagged_runs import HERE, TAG, fastq_names, kill_all, tagged

pytest.importorskip("torch")

from torch_helpers.killed_stream import BATCH, CHECKPOINT
from torch_helpers.stream_sources import sample_ids

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def run(out: Path, mode: str, workers: int) -> int:
    """The script's exit status, once it and every process it started are
    gone (a killed run's workers follow it)."""
    token = uuid.uuid4().hex
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(map(str, [HERE, HERE.parent])),
        **{TAG: token},
    )
    script = HERE / "torch_helpers" / "killed_stream.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(out), mode, str(workers)],
        env=env,
        capture_output=True,
        timeout=90,
        start_new_session=True,
    )
    deadline = time.monotonic() + 5.0
    while tagged(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = tagged(token)
    kill_all(left)
    assert left == [], f"processes left by the {mode} run"
    if proc.returncode not in (0, -9):
        pytest.fail(proc.stdout.decode() + proc.stderr.decode())
    return proc.returncode


def lines(paths: list[Path]) -> list[int]:
    return [int(x) for p in paths for x in p.read_text().split()]


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    shm_before = fastq_names()
    assert run(tmp_path, "first", 3) == -9
    checkpoint = json.loads((tmp_path / "state.json").read_text())
    before = checkpoint["delivered"]
    first = lines([tmp_path / "delivered-first.txt"])
    assert before == first[: len(before)]
    # The killed run went past its checkpoint: those batches come again.
    assert len(first) > len(before) >= CHECKPOINT * BATCH
    assert run(tmp_path, "resume", 2) == 0
    after = lines([tmp_path / "delivered-resume.txt"])
    assert sorted(before + after) == sorted(sample_ids())
    made = lines(sorted(tmp_path.glob("made-resume-*.txt")))
    assert sorted(made) == sorted(after), "a sample made twice past the checkpoint"
    assert fastq_names() - shm_before == set()
