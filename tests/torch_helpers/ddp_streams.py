"""Run under `torchrun --nproc_per_node=2` (gloo, CPU): each rank reads an
IterableDataset of its own length (rank 0 fewer samples than rank 1) with
fastq.torch.DataLoader, and takes a DDP step on every batch and one more
after the epoch; records each rank's batches per epoch into
OUT_DIR/rank<r>.json. A rank left without a batch while the other takes a
step would hang there (the test's deadline)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.utils.data

EPOCHS = 2


class RankShards(torch.utils.data.IterableDataset[torch.Tensor]):
    """Rank r holds 9 + 8 r samples, split among its workers."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
        info = torch.utils.data.get_worker_info()
        wid, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for k in range(9 + 8 * rank)[wid::workers]:
            yield torch.tensor([float(rank * 100 + k)])


def main(out_dir: str, even: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from fastq.torch import DataLoader

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    loader = DataLoader(
        RankShards(),
        batch_size=2,
        num_workers=2,
        even_batches=None if even == "none" else even,
    )
    counts = []
    for _ in range(EPOCHS):
        n = 0
        for batch in loader:
            model(batch).sum().backward()
            n += 1
        counts.append(n)
        # A step after the last batch: every rank reaches it.
        flag = torch.ones(())
        dist.all_reduce(flag)
    # The same through TorchPrefetcher, a stream of samples.
    from fastq.torch import TorchPrefetcher

    passes = []
    with TorchPrefetcher(RankShards(), batch_size=2, workers=2, seed=0) as pf:
        for _ in range(EPOCHS):
            n = 0
            for batch in pf:
                model(batch).sum().backward()
                n += 1
            passes.append(n)
            dist.all_reduce(torch.ones(()))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "batches": counts, "passes": passes}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], sys.argv[2])
