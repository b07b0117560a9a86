"""Run under `torchrun --nproc_per_node=2`: records what each rank's
TorchPrefetcher hands out, epoch by epoch, into OUT_DIR/rank<r>.json.

Cases: rank/world_size from the RANK/WORLD_SIZE torchrun sets (before
torch.distributed is initialised), then from torch.distributed (with the
environment deliberately wrong, to show which one wins), then with
drop_last, then through the IterableDataset adapter.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

N = 101  # not a multiple of the world size: padding and drop_last show
EPOCHS = 2


def epochs(pf: Any, n_epochs: int = EPOCHS) -> list[list[int]]:
    import torch

    out = []
    for _ in range(n_epochs):
        out.append([int(i) for b in pf for i in torch.as_tensor(b).tolist()])
    return out


def record(pf: Any) -> dict[str, Any]:
    return {
        "rank": pf.rank,
        "world_size": pf.world_size,
        "len": len(pf),
        "epochs": epochs(pf),
    }


def main(out_dir: str) -> None:
    import torch.distributed as dist

    from fastq.torch import IterableDataset, TorchPrefetcher
    from torch_helpers.datasets import Indices

    results: dict[str, Any] = {}
    ds = Indices(N)
    assert not dist.is_initialized()
    with TorchPrefetcher(ds, batch_size=8, workers=1, shuffle=True) as pf:
        results["env"] = record(pf)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # torch.distributed, once initialised, wins over the environment.
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    with TorchPrefetcher(ds, batch_size=8, workers=1, shuffle=True) as pf:
        results["dist"] = record(pf)
    with TorchPrefetcher(
        ds, batch_size=5, workers=1, shuffle=True, seed=1234, drop_last=True
    ) as pf:
        results["drop_last"] = record(pf)
    with IterableDataset(ds, batch_size=8, workers=1, shuffle=True, seed=7) as adapter:
        loader = adapter.loader()
        results["adapter"] = {
            "rank": adapter.prefetcher.rank,
            "world_size": adapter.prefetcher.world_size,
            "len": len(loader),
            "epochs": epochs(loader),
        }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1])
