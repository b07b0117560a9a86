"""benchmarks/gpu_check.sh and benchmarks/fetch_gpu_wheels.sh, without a
GPU: both parse, each part of the check fits the device machine's ten
minutes a command, every test file it names exists, and the wheels it
installs are kept out of git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "benchmarks" / "gpu_check.sh"
FETCH = ROOT / "benchmarks" / "fetch_gpu_wheels.sh"
# The device machine's limit on one command, seconds; a part's timeouts
# together stay this far below it, for the setup before them.
COMMAND_LIMIT_S = 600
SETUP_S = 30


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", [CHECK, FETCH], ids=lambda p: p.name)
def test_the_scripts_parse(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _parts() -> dict[str, int]:
    """Each part of gpu_check.sh and the sum of its steps' timeouts."""
    text = CHECK.read_text()
    body = text[text.index('case "$part" in') :]
    parts: dict[str, int] = {}
    for name, steps in re.findall(r"^    ([a-z-]+)\)\n(.*?);;", body, re.M | re.S):
        parts[name] = sum(int(t) for t in re.findall(r"timeout (\d+) ", steps))
    return parts


def test_each_part_fits_a_device_command() -> None:
    parts = _parts()
    assert set(parts) == {"tests", "first-batch", "train", "model"}
    for name, seconds in parts.items():
        assert 0 < seconds <= COMMAND_LIMIT_S - SETUP_S, (name, seconds)
    default = re.search(r'parts="\$\{PARTS:-([^}]*)\}"', CHECK.read_text())
    assert default is not None and set(default.group(1).split()) == set(parts)


def test_the_files_it_names_exist() -> None:
    text = CHECK.read_text()
    for path in set(re.findall(r"(?:tests|benchmarks)/[\w/]+\.py", text)):
        assert (ROOT / path).is_file(), path


def test_the_wheels_are_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(
        ["git", "check-ignore", "-q", "benchmarks/wheels/x.whl"], cwd=ROOT
    )
    assert done.returncode == 0
    assert "benchmarks/wheels" in FETCH.read_text()
