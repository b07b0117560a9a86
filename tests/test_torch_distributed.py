"""Sharding across ranks under `torchrun --nproc_per_node=2` (gloo, CPU):
DistributedSampler's semantics, with rank and world size found on their own."""

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
N = 101


def torchrun(script: Path, *args: str, timeout: float, nproc: int = 2) -> str:
    """Runs `script` under torchrun to its end (every process of it killed if
    it outlives `timeout`, none left behind); its output."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(script),
        *args,
    ]
    return launch(cmd, HERE, timeout)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    torchrun(HERE / "torch_helpers" / "ddp_shards.py", str(out), timeout=100)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def interleave(a: list[int], b: list[int]) -> list[int]:
    """The epoch's global order, from rank 0's and rank 1's shares."""
    return [x for pair in zip(a, b) for x in pair]


def check_padded_epochs(r0: dict[str, Any], r1: dict[str, Any]) -> None:
    assert [r0["rank"], r1["rank"]] == [0, 1]
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["len"] == r1["len"] == 7  # ceil(ceil(101 / 2) / 8) batches per rank
    orders = []
    for e0, e1 in zip(r0["epochs"], r1["epochs"]):
        assert len(e0) == len(e1) == 51
        # Padding by wrap-around: 102 places for 101 samples, the one extra
        # being the epoch's first sample, repeated last on rank 1.
        order = interleave(e0, e1)
        assert sorted(order[:N]) == list(range(N)), "ranks overlap or miss samples"
        assert order[N] == order[0]
        assert set(e0).isdisjoint(e1[:-1])
        orders.append(order[:N])
    assert orders[0] != list(range(N)), "shuffle=True did not shuffle"
    assert orders[0] != orders[1], "two epochs had the same order"


@pytest.mark.timeout(120)
def test_ranks_from_environment_shard_like_distributed_sampler(
    ranks: list[dict[str, Any]],
) -> None:
    check_padded_epochs(ranks[0]["env"], ranks[1]["env"])


@pytest.mark.timeout(120)
def test_ranks_from_torch_distributed_shard_like_distributed_sampler(
    ranks: list[dict[str, Any]],
) -> None:
    # The environment said RANK=0 WORLD_SIZE=1 on both; torch.distributed won.
    check_padded_epochs(ranks[0]["dist"], ranks[1]["dist"])
    # The same default seed on every rank, whether it came from env or dist.
    assert ranks[0]["dist"]["epochs"] == ranks[0]["env"]["epochs"]


@pytest.mark.timeout(120)
def test_drop_last_shards(ranks: list[dict[str, Any]]) -> None:
    r0, r1 = ranks[0]["drop_last"], ranks[1]["drop_last"]
    assert r0["len"] == r1["len"] == 10  # 101 // 2 = 50 samples, 5 per batch
    orders = []
    for e0, e1 in zip(r0["epochs"], r1["epochs"]):
        assert len(e0) == len(e1) == 50
        assert set(e0).isdisjoint(e1)
        order = interleave(e0, e1)
        assert len(set(order)) == 100  # the whole epoch less the one-sample tail
        orders.append(order)
    assert orders[0] != orders[1]
    assert sorted(orders[0]) != list(range(100)), "the dropped tail was not random"


@pytest.mark.timeout(120)
def test_adapter_shards_through_a_dataloader(ranks: list[dict[str, Any]]) -> None:
    check_padded_epochs(ranks[0]["adapter"], ranks[1]["adapter"])


@pytest.mark.timeout(150)
def test_ranks_with_streams_of_unequal_length_end_each_epoch_together(
    tmp_path: Path,
) -> None:
    # Rank 0 has 9 samples (5 batches of 2), rank 1 has 17 (9 batches):
    # both end each epoch after 5, and the DDP steps never wait.
    torchrun(
        HERE / "torch_helpers" / "ddp_streams.py", str(tmp_path), "drop", timeout=120
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["batches"] for r in ranks] == [[5, 5], [5, 5]]
    # TorchPrefetcher's passes of a stream too.
    assert [r["passes"] for r in ranks] == [[5, 5], [5, 5]]
