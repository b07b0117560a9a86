"""What the memory benchmarks share: each case run in a fresh interpreter
(so that one case's pages never count in another's PSS), its result the
last line it prints, as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def case_in_fresh_process(script: str, case: str, options: list[str]) -> dict[str, Any]:
    """``python script --one case *options``'s result; SystemExit with its
    stderr if it fails."""
    command = [sys.executable, script, "--one", case, *options]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
