"""Runs one case in a fresh interpreter, so that no case inherits another's
imports, fork server or heap: `python -m fastq._bench.isolated` reads the
case as JSON on stdin and prints the result as JSON on the last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from .measure import Budget, Options, Result, run
from .transports import TRANSPORTS, Case

# Beyond the case's own budget: interpreter and library start, worker start
# and teardown, and the slowest warm-up (a huge batch through a pipe).
_SLACK_S = 180.0


def run_isolated(case: Case, budget: Budget, options: Options) -> Result:
    payload = json.dumps(
        {"case": asdict(case), "budget": asdict(budget), "options": asdict(options)}
    )
    env = dict(os.environ)
    if options.spin_us is not None:
        env["FASTQ_SPIN_US"] = str(options.spin_us)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fastq._bench.isolated"],
            input=payload,
            capture_output=True,
            text=True,
            env=env,
            timeout=budget.seconds + budget.warmup_s + _SLACK_S,
        )
    except subprocess.TimeoutExpired:
        return _failed(case, "timed out (the case process was killed)")
    lines = proc.stdout.strip().splitlines()
    try:
        result = Result.from_json(json.loads(lines[-1]))
    except (IndexError, ValueError, TypeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return _failed(case, f"failed (exit {proc.returncode}): {tail}")
    if proc.returncode != 0:  # measured, then failed on the way out
        result.notes.append(f"case process exited with {proc.returncode}")
    return result


def _failed(case: Case, why: str) -> Result:
    t = TRANSPORTS[case.transport]
    r = Result(asdict(case), t.label, case.shape.batch_bytes)
    r.error = f"{t.label}: {why}"
    return r


def main() -> int:
    job: dict[str, Any] = json.loads(sys.stdin.read())
    result = run(
        Case(**job["case"]), Budget(**job["budget"]), Options(**job["options"])
    )
    print(json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
