"""The documented installs run the documented commands: the benchmarks'
pytest front end after the bench extra alone, whatever else the test
environment holds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> dict[str, set[str]]:
    """The checkout's requirements (pyproject.toml, not the installed
    metadata, which is as old as the last install), by extra ("" for the
    core)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    lists = {"": project["dependencies"], **project["optional-dependencies"]}
    by_extra = {}
    for extra, reqs in lists.items():
        names = [re.match(r"[A-Za-z0-9._-]+", req) for req in reqs]
        by_extra[extra] = {_canonical(n.group(0)) for n in names if n is not None}
    return by_extra


def plugins_missing_from(extras: list[str]) -> list[str]:
    """The pytest plugins that only fastq-ring's other extras bring: absent
    from an environment made by installing ``extras``."""
    by_extra = _requirements()
    kept = set().union(*(by_extra.get(e, set()) for e in ["", *extras]))
    others = set().union(*by_extra.values()) - kept
    blocked = []
    for dist in metadata.distributions():
        if _canonical(dist.metadata["Name"]) in others:
            blocked += [ep.name for ep in dist.entry_points if ep.group == "pytest11"]
    return sorted(blocked)


@pytest.mark.timeout(120)
def test_the_benchmarks_run_after_the_bench_extra_alone() -> None:
    """docs/performance.md: `pip install -e ".[bench,torch]"`, then
    `pytest benchmarks/ --benchmark-only`; the project's addopts name
    plugin options, which that install must bring."""
    blocked = plugins_missing_from(["bench", "torch"])
    command = [
        *(sys.executable, "-m", "pytest"),
        *(f"-pno:{name}" for name in blocked),
        *("benchmarks/test_reseed.py", "--benchmark-only", "--collect-only"),
        *("-q", "-p", "no:cacheprovider"),
    ]
    # A user's shell: none of this run's own pytest-xdist worker variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
