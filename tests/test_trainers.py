"""fastq.torch.DataLoader under the trainers that treat torch DataLoaders
specially, one route at a time: Lightning in one process and under DDP on
CPU (it re-creates the loader with a DistributedSampler), and accelerate in
one and two processes (``prepare`` replaces any torch DataLoader with its
own; the fastq routes keep the loader out of ``prepare``).

Each run is a subprocess (tests/torch_helpers/trainer_routes.py) whose
training steps record the labels they saw; every epoch must train on every
sample exactly once across ranks, in a new order each epoch, from fastq's
workers producing that epoch, and the run must exit on its own in time,
leaving no process and no shared memory behind.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from tagged_runs import launch

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch]

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "torch_helpers" / "trainer_routes.py"
N, VAL_N, EPOCHS = 64, 32, 2  # as in trainer_routes.py
FASTQ, TORCH = 2, 1  # who produced a sample: a fastq worker, a DataLoader worker


def run_routes(
    out: Path, routes: str, *, processes: int = 1, launcher: str = "", timeout: float
) -> dict[str, list[dict[str, Any]]]:
    """Each route's records, one per rank, rank 0 first."""
    cmd = [sys.executable]
    if launcher == "torchrun":
        cmd += ["-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={processes}"]
    cmd += [str(SCRIPT), routes, str(out)]
    if launcher == "lightning":
        cmd += ["--devices", str(processes)]  # Lightning re-runs the script
    launch(cmd, out, timeout)
    return {
        route: [
            json.loads((out / f"{route}-rank{r}.json").read_text())
            for r in range(processes)
        ]
        for route in routes.split(",")
    }


def check_epochs(
    records: list[dict[str, Any]], producer: int, *, val: bool = False
) -> None:
    """Every epoch trains on every sample exactly once across the ranks, each
    rank on an equal share, in a new order each epoch; ``producer`` made
    every sample, and fastq's workers were producing the trainer's epoch."""
    world = len(records)
    assert [(r["rank"], r["world_size"]) for r in records] == [
        (rank, world) for rank in range(world)
    ]
    orders = []
    for epoch in map(str, range(EPOCHS)):
        shares = [r["train"][epoch] for r in records]
        assert [len(s) for s in shares] == [N // world] * world, f"epoch {epoch}"
        seen = sorted(i for s in shares for i in s)
        assert seen == list(range(N)), f"epoch {epoch}: not every sample exactly once"
        orders.append(shares)
        if val:
            val_seen = sorted(i for r in records for i in r["val"][epoch])
            assert val_seen == list(range(VAL_N)), f"validation after epoch {epoch}"
    assert orders[0] != orders[1], "shuffle=True, yet both epochs had one order"
    for r in records:
        assert r["producers"] == [producer], r["producers"]
        if producer == FASTQ:
            # Trainer epoch k is fastq epoch k (Lightning's early iter() and
            # set_epoch on the DistributedSampler do not shift it).
            assert r["fastq_epochs"] == {str(e): [e] for e in range(EPOCHS)}


# ----------------------------------------------------------------- Lightning

# The top-level loader first: under DDP its rank 0 copy is built before
# Lightning launches rank 1, and rank 1's while Lightning's launcher has set
# WORLD_SIZE but not RANK. Then a second fit in the same processes, with the
# loaders from the module's hooks.
LIGHTNING = ["lightning-toplevel", "lightning-hook"]


@pytest.fixture(scope="module", params=[1, 2], ids=["1proc", "ddp2"])
def lightning_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    pytest.importorskip("lightning")
    processes = int(request.param)
    out = tmp_path_factory.mktemp(f"lightning{processes}")
    return run_routes(
        out, ",".join(LIGHTNING), processes=processes, launcher="lightning", timeout=200
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("route", LIGHTNING)
def test_lightning(lightning_runs: dict[str, list[dict[str, Any]]], route: str) -> None:
    """Trainer(accelerator="cpu", max_epochs=2) with devices=1, or with
    strategy="ddp", devices=2 (Lightning re-creates the fastq DataLoader with
    a DistributedSampler: for the top-level loader from its attributes), a
    shuffled training loader and a validation loader: the ranks split every
    epoch between them, and fastq's workers make every batch."""
    records = lightning_runs[route]
    check_epochs(records, FASTQ, val=True)
    for r in records:
        assert r["loader_types"] == ["DataLoader"]


# ---------------------------------------------------------------- accelerate

ACCELERATE = [
    "accelerate-prepare",
    "accelerate-sampler",
    "accelerate-prefetcher",
    "accelerate-iterable",
    "accelerate-iterable-prepare",
]


@pytest.fixture(scope="module", params=[1, 2], ids=["1proc", "2proc"])
def accelerate_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    pytest.importorskip("accelerate")
    processes = int(request.param)
    out = tmp_path_factory.mktemp(f"accelerate{processes}")
    # `accelerate launch --cpu --num_processes 2` starts one process on one
    # machine (without an MPI hostfile), so two processes come from torchrun,
    # as accelerate's own multi-process launcher does it.
    return run_routes(
        out,
        ",".join(ACCELERATE),
        processes=processes,
        launcher="torchrun" if processes > 1 else "",
        timeout=200,
    )


@pytest.mark.timeout(240)
def test_accelerate_prepare_replaces_the_loader(
    accelerate_runs: dict[str, list[dict[str, Any]]],
) -> None:
    """accelerator.prepare(model, opt, loader) builds a torch DataLoader from
    the loader's attributes (in a DataLoaderShard): still correct, but torch's
    workers produce the batches, not fastq's."""
    records = accelerate_runs["accelerate-prepare"]
    check_epochs(records, TORCH)
    for r in records:
        assert "torch.utils.data.dataloader.DataLoader" in r["loader_types"]
        assert "DataLoaderShard" in r["loader_types"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("route", ["accelerate-sampler", "accelerate-prefetcher"])
def test_accelerate_keeps_fastq(
    accelerate_runs: dict[str, list[dict[str, Any]]], route: str
) -> None:
    """prepare(model, opt) only, and either a fastq DataLoader with a
    DistributedSampler(num_replicas=num_processes, rank=process_index) and
    set_epoch, or a TorchPrefetcher, which shards itself."""
    check_epochs(accelerate_runs[route], FASTQ)


@pytest.mark.timeout(240)
def test_accelerate_and_an_iterable_datasets_loader(
    accelerate_runs: dict[str, list[dict[str, Any]]],
) -> None:
    """fastq.torch.IterableDataset(...).loader() shards itself across the
    processes. Kept out of prepare(), it trains on every sample once per
    epoch across them. Given to prepare(model, opt, loader): with one
    process accelerate wraps it and every sample still comes once; with
    two, prepare() refuses it naming the fix (accelerate would shard it
    again: process 0's share alone was trained on, split between the two)."""
    check_epochs(accelerate_runs["accelerate-iterable"], FASTQ)
    records = accelerate_runs["accelerate-iterable-prepare"]
    if len(records) == 1:
        check_epochs(records, FASTQ)
        assert records[0]["refused"] is None
        return
    for r in records:
        assert r["train"] == {}, "trained on a loader prepare() should refuse"
        refused = r["refused"] or ""
        assert "world_size=2" in refused, refused
        assert "accelerator.prepare(model, optimizer)" in refused, refused
        assert "device=accelerator.device" in refused, refused


@pytest.mark.timeout(180)
def test_the_resume_example_survives_a_kill_bit_for_bit(tmp_path: Path) -> None:
    """examples/resume_after_kill.py: Lightning killed with SIGKILL mid-epoch
    resumes from its checkpoint with the loader's state; the samples of every
    step after it and the final weights equal a run that never stopped, and
    the killed run leaves no worker and no shared memory behind."""
    pytest.importorskip("lightning")
    example = HERE.parent / "examples" / "resume_after_kill.py"
    out = launch([sys.executable, str(example)], tmp_path, timeout=170)
    assert "killed at step 11 (exit -9); checkpoints at steps [4, 8]" in out
    assert "resumed at step 9" in out
    assert "same samples, in the same order, at every step: True" in out
    assert "final weights bit-identical to the run that never stopped: True" in out
