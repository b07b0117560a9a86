"""examples/train_cnn.py runs, alone and under torchrun with two ranks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from test_torch_distributed import torchrun

pytestmark = [pytest.mark.torch]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_cnn.py"
ARGS = ["--epochs", "2", "--samples", "1024", "--batch-size", "32", "--cpu"]


def epochs_in(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"epoch \d+: loss ([0-9.]+)", out)]


@pytest.mark.timeout(90)
def test_example_trains_in_one_process() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *ARGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "1 rank(s), 32 steps per epoch" in proc.stdout
    losses = epochs_in(proc.stdout)
    assert len(losses) == 2 and losses[1] < losses[0], proc.stdout


# Two ranks under torchrun are the long route; the default run has them in
# tests/test_examples_converted.py's short DDP tutorial.
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_example_trains_under_torchrun() -> None:
    out = torchrun(EXAMPLE, *ARGS, timeout=110)
    assert "2 rank(s), 16 steps per epoch and rank" in out
    assert len(epochs_in(out)) == 2, out
