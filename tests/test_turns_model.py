"""Model checking of turns: spin explores every interleaving of
src_c/model/fq_turns.pml (two workers in turn, the consumer's grant, a user
who keeps batches), must refute each deliberately broken variant, and must
reach each situation the checks are about."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from spin_models import REQUIRES_SPIN, scratch
from spin_models import verify as run_model

MODEL = "fq_turns.pml"

pytestmark = [
    *REQUIRES_SPIN,
    pytest.mark.timeout(120),
]

# Depth bound: the deepest run of the sizes below is about 300 steps, so a
# search that hits this bound is incomplete and fails rather than passes.
MAX_DEPTH = 5000


def size(nslots: int, len0: int, len1: int, hold: int) -> list[str]:
    """NSLOTS slots, streams of len0 and len1 items, a user who keeps up to
    `hold` batches (fewer than the slots, as fastq copies past `slots`)."""
    return [f"-DNSLOTS={nslots}", f"-DLEN0={len0}", f"-DLEN1={len1}", f"-DHOLD={hold}"]


# Each a fraction of a second: the smallest ring, uneven streams, a worker
# with nothing, and a user who keeps all but one slot.
SIZES = {
    "2 slots, streams of 2 and 3": size(2, 2, 3, 1),
    "3 slots, streams of 3 and 1": size(3, 3, 1, 2),
    "3 slots, worker 0 has nothing": size(3, 0, 3, 2),
    "3 slots, streams of 4 and 4": size(3, 4, 4, 2),
    "4 slots, streams of 3 and 3, the user keeps 3": size(4, 3, 3, 3),
}

# Each broken variant and the size that refutes it: both deadlock.
BROKEN = {
    # A worker that holds its slot while it waits for its grant.
    "SLOT_FIRST": size(2, 2, 3, 1),
    # A grant that forgets the slots the user holds.
    "NO_BUDGET": size(2, 2, 3, 1),
}

# What the model must reach (REACH=n in fq_turns.pml).
REACH = {
    "a worker waits for its grant while a slot is free": (1, size(2, 2, 3, 1)),
    "the consumer steps over an ended worker's task": (2, size(2, 2, 3, 1)),
}


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory for pan.c, pan and trails."""
    yield scratch(MODEL, tmp_path)


def verify(workdir: Path, defines: list[str]) -> tuple[int, str]:
    """Generates, builds and runs the verifier; returns (errors, output)."""
    return run_model(
        workdir, MODEL, defines, timeout=60, max_depth=MAX_DEPTH, cflags=["-O0"]
    )


@pytest.mark.parametrize("name", list(SIZES))
def test_turns_model_holds(workdir: Path, name: str) -> None:
    errors, out = verify(workdir, SIZES[name])
    assert "max search depth too small" not in out, f"incomplete search:\n{out}"
    assert errors == 0, f"spin found a counterexample ({name}):\n{out}"


@pytest.mark.parametrize("variant", list(BROKEN))
def test_broken_turns_model_deadlocks(workdir: Path, variant: str) -> None:
    errors, out = verify(workdir, [f"-D{variant}", *BROKEN[variant]])
    assert errors > 0 and "invalid end state" in out, (
        f"spin found no deadlock in the {variant} variant:\n{out}"
    )


@pytest.mark.parametrize("name", list(REACH))
def test_turns_model_reaches(workdir: Path, name: str) -> None:
    point, sizes = REACH[name]
    errors, out = verify(workdir, [f"-DREACH={point}", *sizes])
    assert errors > 0 and "assertion violated" in out, (
        f"the model never reaches: {name}\n{out}"
    )
