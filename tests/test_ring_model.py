"""Model checking of the ring protocol: spin explores every interleaving of
src_c/model/fq_ring.pml, must refute each deliberately broken variant, and
must reach each situation the checks are about (so that they are not
vacuous)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from spin_models import REQUIRES_SPIN, SPIN, scratch
from spin_models import verify as run_model

MODEL = "fq_ring.pml"

pytestmark = REQUIRES_SPIN

# Depth bound: the deepest run of the sizes below is about 700 steps, so a
# search that hits this bound is incomplete and fails rather than passes.
MAX_DEPTH = 5000
# pan stops with "out of memory" past this many megabytes instead of
# swapping the machine (the largest quick size needs about 1.4 GB, the
# largest slow one about 2.5 GB, compressed).
MEMLIM_MB = 4096

# How pan is built. A full search: -Og builds pan.c in a few seconds and
# runs nearly as fast as -O1, which takes longer to build than it saves. A
# search that stops at its first counterexample: -O0, the fastest build.
FULL = ["-Og"]
FIRST_ERROR = ["-O0"]
# The larger sizes: states stored compressed (-DCOLLAPSE, about a quarter
# of the memory for a third more time) and a larger hash table.
LARGE_BUILD = ["-Og", "-DCOLLAPSE"]


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory for pan.c, pan and trails."""
    yield scratch(MODEL, tmp_path)


def verify(
    workdir: Path,
    defines: list[str],
    timeout: float,
    cflags: list[str] = FULL,
    hash_bits: int = 25,
) -> tuple[int, str]:
    """Generates, builds and runs the verifier; returns (errors, output)."""
    return run_model(
        workdir,
        MODEL,
        defines,
        timeout=timeout,
        max_depth=MAX_DEPTH,
        cflags=[*cflags, f"-DMEMLIM={MEMLIM_MB}"],
        pan_args=[f"-w{hash_bits}"],
    )


def summary(out: str) -> str:
    """The lines of pan's report worth keeping in the test log."""
    keep = ("errors:", "states, stored", "elapsed time", "pan:1:", "depth reached")
    return "\n".join(line for line in out.splitlines() if any(k in line for k in keep))


def assert_verified(
    workdir: Path,
    defines: list[str],
    timeout: float,
    cflags: list[str] = FULL,
    hash_bits: int = 25,
) -> None:
    errors, out = verify(workdir, defines, timeout, cflags, hash_bits)
    assert "max search depth too small" not in out, f"incomplete search:\n{out}"
    assert "out of memory" not in out, f"incomplete search:\n{out}"
    assert errors == 0, f"spin found a counterexample ({defines}):\n{out}"
    print(" ".join(defines), "\n", summary(out))


def size(nslots: int, ntasks: int, maxdeaths: int) -> list[str]:
    return [f"-DNSLOTS={nslots}", f"-DNTASKS={ntasks}", f"-DMAXDEATHS={maxdeaths}"]


# Sizes that CI checks on every run: together about 30 s on two cores. Three
# slots let the reorder window hold two early tasks (and make the queues'
# capacity 4, larger than the ring); a death needs the smaller ring to stay
# within the budget, and three tasks on two slots reach the "holds every
# slot" report, deferred releases and deaths inside queue operations.
QUICK = {
    "3 slots, 3 tasks": size(3, 3, 0),
    "2 slots, 3 tasks, a worker may die": size(2, 3, 1),
}

# Larger sizes, together about 4 minutes on two cores: too long for CI.
LARGE = {
    "3 slots, 4 tasks": size(3, 4, 0),
    "3 slots, 2 tasks, a worker may die": size(3, 2, 1),
    "2 slots, 4 tasks, a worker may die": size(2, 4, 1),
    "3 slots, 3 tasks, a worker may die": size(3, 3, 1),
    "2 slots, 3 tasks, both workers may die": size(2, 3, 2),
    # Waiting for a popper is harmless while it only stalls: what makes
    # BROKEN_DEATH_WAIT wrong is the death alone.
    "waiting for a stalled popper, 2 slots, 3 tasks": [
        "-DBROKEN_DEATH_WAIT",
        *size(2, 3, 0),
    ],
}

# Each broken variant, the size that refutes it, and the kind of error spin
# must report for it.
BROKEN = {
    # The lost wakeup: a sleeper that skips the re-check after waiters += 1
    # sleeps on a slot pushed just before, forever.
    "BROKEN_WAKE": (size(2, 3, 0), "invalid end state"),
    # Close that only sets the flag leaves sleepers asleep.
    "BROKEN_CLOSE": (size(2, 3, 0), "invalid end state"),
    # Waiting while holding every slot is a deadlock, not a slow batch.
    "NO_HOLD_CHECK": (size(2, 3, 0), "invalid end state"),
    # A task claimed before its slot breaks "a claimed task holds a slot".
    "CLAIM_FIRST": (size(2, 3, 0), "assertion violated"),
    # A release that drops the slot when it meets a popper inside its pop
    # loses it: the census finds it nowhere. A popper that is only slow is
    # enough, no death needed.
    "BROKEN_DEFER": (size(2, 2, 0), "assertion violated ((n+m)==1)"),
    # A release that waits for the popper's cell without looking at the
    # flags waits forever once that popper is dead.
    "BROKEN_DEATH_WAIT": (size(2, 2, 1), "invalid end state"),
}

# What the model must reach (REACH=n in fq_ring.pml) and the size at which
# it does: every check that depends on it would pass vacuously otherwise.
REACH = {
    "a deferred release goes out later": (1, size(2, 2, 0)),
    "the consumer reports it holds every slot": (2, size(2, 3, 0)),
    "a release is deferred past a dead popper": (3, size(2, 2, 1)),
    "a dead pusher's cell blocks READY until the alert": (4, size(2, 2, 1)),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(QUICK))
def test_model_holds(workdir: Path, name: str) -> None:
    assert_verified(workdir, QUICK[name], timeout=200)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LARGE))
def test_model_holds_large(workdir: Path, name: str) -> None:
    assert_verified(workdir, LARGE[name], 540, LARGE_BUILD, hash_bits=26)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_model_is_refuted(workdir: Path, variant: str) -> None:
    sizes, error = BROKEN[variant]
    defines = [f"-D{variant}", *sizes]
    errors, out = verify(workdir, defines, 150, FIRST_ERROR)
    assert errors > 0, f"spin found no error in the {variant} variant:\n{out}"
    assert error in out, out
    # The counterexample replays: spin can walk the trail it wrote.
    replay = subprocess.run(
        [str(SPIN), *defines, "-t", MODEL],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0 and "trail ends" in replay.stdout, (
        replay.stdout + replay.stderr
    )
    print(variant, "\n", summary(out))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", list(REACH))
def test_model_reaches(workdir: Path, name: str) -> None:
    point, sizes = REACH[name]
    errors, out = verify(workdir, [f"-DREACH={point}", *sizes], 150, FIRST_ERROR)
    assert errors > 0 and f"assertion violated ({point}!={point})" in out, (
        f"the model never reaches: {name}\n{out}"
    )
    print(name, "\n", summary(out))
