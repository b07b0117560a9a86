"""One job in a fresh interpreter (`python -m MODULE JOB`, the JOB as JSON),
its answer JSON on the last line of standard output: how the training
benches keep each loader's workers, CUDA state and heap from another's;
and their jobs run in turn, interleaved over repeats."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

Job = TypeVar("Job")
Answer = TypeVar("Answer")


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


def serve_job(config: Callable[..., Job], measure: Callable[[Job], Any]) -> int:
    """A job module's side (``python -m MODULE JOB``): ``measure`` of the
    ``config`` the JOB's JSON gives, its answer (a dataclass) printed as the
    last line of JSON."""
    run = measure(config(**json.loads(sys.argv[1])))
    print(json.dumps(asdict(run)), flush=True)
    return 0


def run_job(
    module: str,
    job: dict[str, Any],
    read: Callable[[Any], Answer],
    failed: Callable[[str], Answer],
    timeout_s: float,
) -> Answer:
    """``read`` of the job's answer, or ``failed(why)`` where there is none
    or it cannot be read."""
    answer, error = run_module(module, job, timeout_s)
    if error is not None:
        return failed(error)
    try:
        return read(answer)
    except (TypeError, KeyError) as exc:
        return failed(f"unreadable answer: {exc!r}")


def run_in_turn(
    jobs: Sequence[Job],
    repeats: int,
    run: Callable[[Job], Answer],
    progress: Callable[[Answer], None] | None = None,
    before: Callable[[], None] | None = None,
) -> list[Answer]:
    """Every job ``repeats`` times, interleaved so that a slow spell of the
    machine hits every loader; ``before`` runs before each job."""
    answers = []
    for _ in range(repeats):
        for job in jobs:
            if before is not None:
                before()
            answer = run(job)
            if progress is not None:
                progress(answer)
            answers.append(answer)
    return answers
