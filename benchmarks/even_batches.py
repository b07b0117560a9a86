"""What even_batches="drop" costs a 2-rank run over an IterableDataset (NOTE
[ Even batches across ranks ] in fastq/torch/_even_ranks.py): one
all_reduce of one int per batch, on the training thread. Each rank reads
shards of equal length, so even_batches=None does not hang; the loop does
nothing with a batch, so the difference is the whole cost. Prints each
rank's microseconds per batch for both, best of three.

    python -m torch.distributed.run --standalone --nproc_per_node=2 \\
        benchmarks/even_batches.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.utils.data

BATCHES = 2000


class Equal(torch.utils.data.IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        wid, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for k in range(BATCHES)[wid::workers]:
            yield torch.full((4,), float(k))


def per_batch_us(even: str | None) -> float:
    from fastq.torch import DataLoader

    loader = DataLoader(
        Equal(),
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        even_batches=even,
    )
    for _ in loader:  # workers started, slots sized
        pass
    best = float("inf")
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    loader.close()
    return best


def main() -> None:
    dist.init_process_group("gloo")
    results = {str(even): per_batch_us(even) for even in (None, "drop")}
    print(
        f"rank {dist.get_rank()}: "
        + ", ".join(f"even_batches={k}: {v:.1f} us/batch" for k, v in results.items())
        + f"; drop costs {results['drop'] - results['None']:.1f} us/batch",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
