"""fastq.torch.DataLoader under the trainers that treat torch DataLoaders
specially, one route at a time: Lightning in one process and under DDP on
CPU (it re-creates the loader with a DistributedSampler), accelerate in one
and two processes (``prepare`` rebuilds the loader as torch's class, which
keeps fastq's workers), and transformers' Trainer after
``fastq.torch.install()``.

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
    out: Path,
    routes: str,
    *,
    processes: int = 1,
    launcher: str = "",
    timeout: float,
    loader: str = "fastq",
) -> dict[str, list[dict[str, Any]]]:
    """Each route's records, one per rank, rank 0 first."""
    cmd = [sys.executable]
    if launcher == "torchrun":
        cmd += ["-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={processes}"]
    cmd += [str(SCRIPT), routes, str(out), "--loader", loader]
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


# Two processes (DDP, torchrun) are the long route: FASTQ_SLOW_TESTS=1.
@pytest.fixture(
    scope="module",
    params=[1, pytest.param(2, marks=pytest.mark.slow)],
    ids=["1proc", "ddp2"],
)
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

# prepare(model, opt, loader) routes, run again over torch's DataLoader to
# compare: the same batches, in the same order, on every rank.
PREPARED = ["accelerate-prepare", "accelerate-skip", "accelerate-uneven"]
ACCELERATE = [
    *PREPARED,
    "accelerate-sampler",
    "accelerate-prefetcher",
    "accelerate-iterable",
    "accelerate-iterable-prepare",
]
BATCH, UNEVEN_N = 8, 60  # as in trainer_routes.py


@pytest.fixture(
    scope="module",
    params=[1, pytest.param(2, marks=pytest.mark.slow)],
    ids=["1proc", "2proc"],
)
def accelerate_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """{"fastq": route -> records, "torch": route -> records}."""
    pytest.importorskip("accelerate")
    processes = int(request.param)
    # `accelerate launch --cpu --num_processes 2` starts one process on one
    # machine (without an MPI hostfile), so two processes come from torchrun,
    # as accelerate's own multi-process launcher does it.
    launcher = "torchrun" if processes > 1 else ""
    runs = {}
    for loader, routes in (("fastq", ACCELERATE), ("torch", PREPARED)):
        out = tmp_path_factory.mktemp(f"accelerate{processes}-{loader}")
        runs[loader] = run_routes(
            out,
            ",".join(routes),
            processes=processes,
            launcher=launcher,
            timeout=200,
            loader=loader,
        )
    return runs


@pytest.mark.timeout(240)
def test_accelerate_prepare_keeps_fastq(
    accelerate_runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """accelerator.prepare(model, opt, loader) rebuilds the fastq loader as a
    torch DataLoader (in a DataLoaderShard) over the same batch sampler,
    sharded across the processes: fastq's workers make every sample of
    every epoch, the batches arrive on accelerator.device, and each rank
    trains on the batches accelerate over torch's DataLoader gives it, in
    the same order."""
    records = accelerate_runs["fastq"]["accelerate-prepare"]
    check_epochs(records, FASTQ)
    torch_records = accelerate_runs["torch"]["accelerate-prepare"]
    check_epochs(torch_records, TORCH)
    for r, t in zip(records, torch_records):
        assert "torch.utils.data.dataloader.DataLoader" in r["loader_types"]
        assert "DataLoaderShard" in r["loader_types"]
        assert r["devices"] == ["cpu"]
        assert r["train"] == t["train"], f"rank {r['rank']}: not torch's order"
        assert r["ends"] == t["ends"]


@pytest.mark.timeout(240)
def test_accelerate_skip_first_batches_keeps_fastq(
    accelerate_runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """A run resumed two steps into its second epoch, as accelerate resumes
    one: accelerator.skip_first_batches(prepared, 2) skips this rank's first
    two batches of that epoch and no others, ends the epoch where accelerate
    says it ends (gradient_state.end_of_dataloader at its last batch only),
    and its batches, like the first epoch's, are torch's run's, all made by
    fastq's workers."""
    world = len(accelerate_runs["fastq"]["accelerate-skip"])
    share = 64 // world
    for r, t in zip(
        accelerate_runs["fastq"]["accelerate-skip"],
        accelerate_runs["torch"]["accelerate-skip"],
    ):
        assert r["producers"] == [FASTQ]
        assert t["producers"] == [TORCH]
        assert [len(r["train"][e]) for e in ("0", "1")] == [share, share - 2 * BATCH]
        assert r["train"] == t["train"]
        assert r["ends"] == t["ends"]
        per_epoch = [share // BATCH, share // BATCH - 2]
        assert r["ends"] == [i == n - 1 for n in per_epoch for i in range(n)]


@pytest.mark.timeout(240)
def test_accelerate_even_batches_keeps_fastq(
    accelerate_runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """60 samples, batches of 8: with two processes accelerate's even_batches
    fills the last batches from the epoch's start so each rank gets 4 full
    ones (with one, the last batch has 4). The same batches as accelerate
    over torch's DataLoader, every sample of them made by fastq's workers."""
    records = accelerate_runs["fastq"]["accelerate-uneven"]
    world = len(records)
    for r, t in zip(records, accelerate_runs["torch"]["accelerate-uneven"]):
        assert r["producers"] == [FASTQ]
        assert r["train"] == t["train"]
    for epoch in ("0", "1"):
        seen = [i for r in records for i in r["train"][epoch]]
        assert len(seen) == (UNEVEN_N if world == 1 else 64)
        assert set(seen) == set(range(UNEVEN_N))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("route", ["accelerate-sampler", "accelerate-prefetcher"])
def test_accelerate_unprepared_keeps_fastq(
    accelerate_runs: dict[str, dict[str, list[dict[str, Any]]]], route: str
) -> None:
    """prepare(model, opt) only, and either a fastq DataLoader with a
    DistributedSampler(num_replicas=num_processes, rank=process_index) and
    set_epoch, or a TorchPrefetcher, which shards itself."""
    check_epochs(accelerate_runs["fastq"][route], FASTQ)


@pytest.mark.timeout(240)
def test_accelerate_and_an_iterable_datasets_loader(
    accelerate_runs: dict[str, dict[str, list[dict[str, Any]]]],
) -> None:
    """fastq.torch.IterableDataset(...).loader() shards itself across the
    processes. Kept out of prepare(), it trains on every sample once per
    epoch across them. Given to prepare(model, opt, loader): with one
    process accelerate wraps it and every sample still comes once; with
    two, prepare() refuses it naming the fix (accelerate would shard it
    again: process 0's share alone was trained on, split between the two)."""
    check_epochs(accelerate_runs["fastq"]["accelerate-iterable"], FASTQ)
    records = accelerate_runs["fastq"]["accelerate-iterable-prepare"]
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


# -------------------------------------------------------------- transformers


@pytest.mark.timeout(120)
def test_transformers_trainer_after_install(tmp_path: Path) -> None:
    """transformers' Trainer builds its own torch DataLoader (two workers)
    and hands it to accelerate; after fastq.torch.install() at the top of
    the script, fastq's workers make every sample of both epochs, and each
    step's loss is the one the same run gets from torch's DataLoader."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    runs = {}
    for loader in ("fastq", "torch"):
        out = tmp_path / loader
        out.mkdir()
        runs[loader] = run_routes(out, "transformers", timeout=100, loader=loader)
    fastq_run, torch_run = runs["fastq"]["transformers"], runs["torch"]["transformers"]
    check_epochs(fastq_run, FASTQ)
    check_epochs(torch_run, TORCH)
    fastq_run, torch_run = fastq_run[0], torch_run[0]
    assert len(fastq_run["losses"]) == EPOCHS * N // BATCH
    assert fastq_run["losses"] == torch_run["losses"]
    assert fastq_run["train"] == torch_run["train"]


@pytest.mark.slow
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
