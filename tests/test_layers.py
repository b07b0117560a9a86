"""The package's layers hold: no import runs upward or in a circle, and the
two faces do not know each other (the contracts in pyproject.toml, checked
by import-linter over the sources)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the test extra")

ROOT = Path(__file__).resolve().parent.parent
# lint-imports, run by the interpreter running the tests.
LINT = (
    "import sys; from importlinter.cli import lint_imports; "
    "sys.exit(lint_imports(config_filename=sys.argv[1]))"
)


def test_the_import_contracts_are_kept() -> None:
    path = [str(ROOT), os.environ.get("PYTHONPATH")]
    proc = subprocess.run(
        [sys.executable, "-c", LINT, str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout
