"""Train a tiny CNN on synthetic images, fed by fastq.

    python examples/train_cnn.py                        # CPU, or one GPU
    torchrun --nproc_per_node=2 examples/train_cnn.py   # two ranks (gloo on CPU)

Under torchrun each rank reads its own shard of every epoch: TorchPrefetcher
takes rank and world size from torch.distributed, with no sampler to set up.
On a GPU the batches arrive on the device, copied from the page-locked ring
on a side stream. The dataset lives in synthetic.py, a module without torch,
so that fastq's worker processes start in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from synthetic import SyntheticImages
from torch import nn

from fastq.torch import TorchPrefetcher


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--samples", type=int, default=4096, help="images per epoch (all ranks)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--workers", type=int, default=None, help="fastq workers per rank")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the training step (default: the CPUs "
        "the fastq workers leave free, at least 1)",
    )
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument(
        "--cpu", action="store_true", help="train on the CPU even if a GPU is there"
    )
    return p.parse_args()


def main() -> None:
    args = parse_args()
    use_cuda = torch.cuda.is_available() and not args.cpu
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    is_main = not distributed or dist.get_rank() == 0
    # This rank's share of the CPUs, split between fastq's workers and the
    # training step: oversubscribed OpenMP threads spin against the workers.
    cpus = len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    workers = args.workers or max(1, cpus - 1)
    torch.set_num_threads(args.threads or max(1, cpus - workers))

    torch.manual_seed(0)  # the same initial weights on every rank
    model: nn.Module = TinyCNN().to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[local_rank] if use_cuda else None
        )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    # shuffle: a new permutation every epoch, the same on every rank (seed),
    # each rank taking its own share. drop_last keeps every rank's number of
    # steps equal and every batch full.
    data = TorchPrefetcher(
        SyntheticImages(args.samples),
        batch_size=args.batch_size,
        workers=workers,
        shuffle=True,
        seed=0,
        drop_last=True,
        device=device if use_cuda else None,
    )
    with data:
        if is_main:
            print(
                f"{data.world_size} rank(s), {len(data)} steps per epoch and rank, "
                f"{data.workers} fastq worker(s) per rank, device {device}"
            )
        for epoch in range(args.epochs):
            model.train()
            totals = torch.zeros(3, device=device)  # loss sum, correct, samples
            start = time.perf_counter()
            for images, labels in data:
                x = images.to(device, non_blocking=True).float().div_(255)
                y = labels.to(device, non_blocking=True)
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                totals += torch.stack(
                    [
                        loss.detach() * len(y),
                        (logits.argmax(1) == y).sum().to(totals.dtype),
                        torch.tensor(float(len(y)), device=device),
                    ]
                )
            if distributed:
                dist.all_reduce(totals)
            seconds = time.perf_counter() - start
            loss_sum, correct, seen = totals.tolist()
            if is_main:
                print(
                    f"epoch {epoch}: loss {loss_sum / seen:.3f}  "
                    f"accuracy {correct / seen:.3f}  "
                    f"{seen / seconds:,.0f} samples/s (all ranks)",
                    flush=True,
                )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
