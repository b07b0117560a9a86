"""Pickling a fastq.torch.DataLoader, as DataLoader pickles: idle or
mid-epoch, the copy works and starts its own workers, and what cannot be
pickled (an epoch's iterator) says so, naming itself and why. The
launchers that copy a loader into new processes (torch's mp.spawn pickles
it; accelerate's notebook_launcher forks with it) get a working loader."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tagged_runs import launch  # noqa: E402

import fastq  # noqa: E402
import fastq.torch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "torch_helpers" / "pickled_loaders.py"
N = 32


class Marked(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i = (i, 2 when a fastq worker made it, 1 a torch worker's, 0
    this process's)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[int, int]:
        if fastq.get_worker_info() is not None:
            return int(i), 2
        return int(i), 1 if torch.utils.data.get_worker_info() is not None else 0


def epoch_of(loader: Any) -> tuple[list[int], set[int]]:
    """(the indices of one epoch, in order; who made them)."""
    seen: list[int] = []
    made_by: set[int] = set()
    for index, producer in loader:
        seen.extend(int(i) for i in index)
        made_by.update(int(p) for p in producer)
    return seen, made_by


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_a_copy_works_idle_and_mid_epoch(persistent: bool) -> None:
    """A copy made before the first epoch, and one made while an epoch runs:
    each trains a whole epoch on workers of its own, all of it made by
    fastq's workers, and the original ends its epoch as if never copied."""
    loader = fastq.torch.DataLoader(
        Marked(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=persistent,
    )
    try:
        idle = pickle.loads(pickle.dumps(loader))
        it = iter(loader)
        first = [int(i) for i in next(it)[0]]
        running = pickle.loads(pickle.dumps(loader))
        for copy in (idle, running):
            try:
                seen, made_by = epoch_of(copy)
                assert sorted(seen) == list(range(N))
                assert made_by == {2}
                assert copy._engine is not loader._engine
            finally:
                copy.close()
        rest, made_by = epoch_of(it)
        assert sorted(first + rest) == list(range(N))
        assert made_by == {2}
    finally:
        loader.close()


def test_an_epochs_iterator_says_why_it_cannot_be_pickled() -> None:
    loader = fastq.torch.DataLoader(Marked(), batch_size=4, num_workers=2)
    try:
        it = iter(loader)
        next(it)
        with pytest.raises(
            TypeError, match=r"fastq\.torch\.DataLoader's iterator"
        ) as e:
            pickle.dumps(it)
        assert "running workers" in str(e.value)
        assert "pickle the DataLoader" in str(e.value)
    finally:
        loader.close()


@pytest.mark.timeout(150)
# spawn (a fresh interpreter importing torch) is the long route.
@pytest.mark.parametrize(
    "launcher", [pytest.param("spawn", marks=pytest.mark.slow), "notebook"]
)
@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_launchers_copy_a_running_loader(
    tmp_path: Path, launcher: str, persistent: bool
) -> None:
    """torch.multiprocessing.spawn(fn, args=(loader, ...), nprocs=2) pickles
    a loader whose epoch is under way; accelerate's notebook_launcher (two
    CPU processes) forks with it. Each child trains two epochs on its copy,
    every sample made by its own fastq workers, and the parent then ends its
    epoch; nothing is left behind."""
    if launcher == "notebook":
        pytest.importorskip("accelerate")
    cmd = [sys.executable, str(SCRIPT), launcher, str(tmp_path)]
    launch([*cmd, *(["--persistent"] if persistent else [])], tmp_path, timeout=120)
    for i in range(2):
        child = json.loads((tmp_path / f"child{i}.json").read_text())
        for epoch in ("0", "1"):
            assert sorted(child["seen"][epoch]) == list(range(N))
        assert set(child["producers"]) == {2}
        assert len(child["producers"]) == 2 * N
    parent = json.loads((tmp_path / "parent.json").read_text())
    assert parent == {"seen": list(range(N)), "producers": [2]}
