"""Runs a Promela model of src_c/model/ with spin: generates the verifier,
builds it, runs it, and reads its error count. Shared by the model tests
of the ring (test_ring_model.py) and of turns (test_turns_model.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent.parent / "src_c" / "model"
SPIN = shutil.which("spin")
CC = shutil.which("cc") or shutil.which("gcc")

# Every model test needs both; each skips, saying which is missing.
REQUIRES_SPIN = [
    pytest.mark.skipif(
        SPIN is None, reason="spin is not installed (apt-get install -y spin)"
    ),
    pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) to build pan"),
]


def scratch(model: str, workdir: Path) -> Path:
    """A copy of the model in workdir, where pan.c, pan and trails go."""
    shutil.copy(MODELS / model, workdir / model)
    return workdir


def verify(
    workdir: Path,
    model: str,
    defines: list[str],
    *,
    timeout: float,
    max_depth: int,
    cflags: list[str],
    pan_args: list[str] = [],  # noqa: B006 (never mutated)
) -> tuple[int, str]:
    """Generates, builds and runs the verifier; returns (errors, output)."""
    for cmd in (
        [str(SPIN), *defines, "-a", model],
        [str(CC), "-w", *cflags, "-DSAFETY", "-o", "pan", "pan.c"],
    ):
        proc = subprocess.run(
            cmd, cwd=workdir, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}{proc.stderr}"
    proc = subprocess.run(
        ["./pan", f"-m{max_depth}", *pan_args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    found = re.search(r"errors: (\d+)", out)
    assert found, f"pan printed no error count:\n{out}"
    return int(found.group(1)), out
