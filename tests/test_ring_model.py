"""Model checking of the ring protocol: spin explores every interleaving of
src_c/model/fq_ring.pml, and must refute each deliberately broken variant."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent.parent / "src_c" / "model" / "fq_ring.pml"
SPIN = shutil.which("spin")
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = [
    pytest.mark.skipif(
        SPIN is None, reason="spin is not installed (apt-get install -y spin)"
    ),
    pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) to build pan"),
]

# Depth bound: the deepest run of the sizes below is about 500 steps, so a
# search that hits this bound is incomplete and fails rather than passes.
MAX_DEPTH = 5000
# pan stops with "out of memory" past this many megabytes instead of
# swapping the machine (the largest size below needs about 1.5 GB).
MEMLIM_MB = 4096


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory for pan.c, pan and trails, removed afterwards."""
    shutil.copy(MODEL, tmp_path / MODEL.name)
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


def verify(workdir: Path, defines: list[str], timeout: float) -> tuple[int, str]:
    """Generates, builds and runs the verifier; returns (errors, output)."""
    steps = [
        [str(SPIN), *defines, "-a", MODEL.name],
        # -O1: -O2 takes seconds longer to build pan.c than it saves.
        [
            str(CC),
            "-w",
            "-O1",
            "-DSAFETY",
            f"-DMEMLIM={MEMLIM_MB}",
            "-o",
            "pan",
            "pan.c",
        ],
    ]
    for cmd in steps:
        proc = subprocess.run(
            cmd, cwd=workdir, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout}{proc.stderr}"
    proc = subprocess.run(
        ["./pan", f"-m{MAX_DEPTH}", "-w25"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    found = re.search(r"errors: (\d+)", out)
    assert found, f"pan printed no error count:\n{out}"
    return int(found.group(1)), out


def summary(out: str) -> str:
    """The lines of pan's report worth keeping in the test log."""
    keep = ("errors:", "states, stored", "elapsed time", "pan:1:", "depth reached")
    return "\n".join(line for line in out.splitlines() if any(k in line for k in keep))


def assert_verified(workdir: Path, defines: list[str], timeout: float) -> None:
    errors, out = verify(workdir, defines, timeout)
    assert "max search depth too small" not in out, f"incomplete search:\n{out}"
    assert "out of memory" not in out, f"incomplete search:\n{out}"
    assert errors == 0, f"spin found a counterexample ({defines}):\n{out}"
    print(" ".join(defines), "\n", summary(out))


# Sizes that CI checks on every run: together about 20 s on two cores.
# NSLOTS 3 lets the reorder window hold two early tasks; a death needs the
# smaller ring to stay within the budget.
QUICK = {
    "3 slots, 3 tasks": ["-DNSLOTS=3", "-DNTASKS=3", "-DMAXDEATHS=0"],
    "2 slots, 2 tasks, a worker may die": [
        "-DNSLOTS=2",
        "-DNTASKS=2",
        "-DMAXDEATHS=1",
    ],
}

# Larger sizes, each well under a minute but together too long for CI.
LARGE = {
    "3 slots, 4 tasks": ["-DNSLOTS=3", "-DNTASKS=4", "-DMAXDEATHS=0"],
    "2 slots, 3 tasks, a worker may die": [
        "-DNSLOTS=2",
        "-DNTASKS=3",
        "-DMAXDEATHS=1",
    ],
    "3 slots, 2 tasks, a worker may die": [
        "-DNSLOTS=3",
        "-DNTASKS=2",
        "-DMAXDEATHS=1",
    ],
}

# Each broken variant and the kind of error spin must report for it.
BROKEN = {
    # The lost wakeup: a sleeper that skips the re-check after waiters += 1
    # sleeps on a slot pushed just before, forever.
    "BROKEN_WAKE": "invalid end state",
    # Close that only sets the flag leaves sleepers asleep.
    "BROKEN_CLOSE": "invalid end state",
    # Waiting while holding every slot is a deadlock, not a slow batch.
    "NO_HOLD_CHECK": "invalid end state",
    # A task claimed before its slot breaks "a claimed task holds a slot".
    "CLAIM_FIRST": "assertion violated",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", list(QUICK))
def test_model_holds(workdir: Path, size: str) -> None:
    assert_verified(workdir, QUICK[size], timeout=200)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", list(LARGE))
def test_model_holds_large(workdir: Path, size: str) -> None:
    assert_verified(workdir, LARGE[size], timeout=540)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_model_is_refuted(workdir: Path, variant: str) -> None:
    defines = [f"-D{variant}", "-DNSLOTS=2", "-DNTASKS=3", "-DMAXDEATHS=0"]
    errors, out = verify(workdir, defines, timeout=150)
    assert errors > 0, f"spin found no error in the {variant} variant:\n{out}"
    assert BROKEN[variant] in out, out
    # The counterexample replays: spin can walk the trail it wrote.
    replay = subprocess.run(
        [str(SPIN), *defines, "-t", MODEL.name],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0 and "trail ends" in replay.stdout, (
        replay.stdout + replay.stderr
    )
    print(variant, "\n", summary(out))
