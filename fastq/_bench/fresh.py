"""One job in a fresh interpreter (`python -m MODULE JOB`, the JOB as JSON),
its answer JSON on the last line of standard output: how the training
benches keep each loader's workers, CUDA state and heap from another's."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def run_module(module: str, job: Any, timeout_s: float) -> tuple[Any, str | None]:
    """(the answer, None), or (None, why there is none)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", module, json.dumps(job)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return None, "timed out"
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"exit {proc.returncode}: {tail}"
