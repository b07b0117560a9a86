"""What fastq.torch.DataLoader's worker spends per batch, beside the
Prefetcher's per-sample path, for the same samples.

Drives, in one process, what each worker runs per task over a buffer laid
out like a slot, for the bench's own dataset (fastq._bench.workloads
SampleDataset: each sample a row of a prepared batch, so the dataset itself
costs almost nothing):

  prefetcher   the Prefetcher's per-sample path: MapFill.fill, one row
               written per sample (fastq._make._map_fill)
  dropin       the drop-in's path: each sample's rows written into the
               slot as it is fetched, default_collate's batch made over
               them (fastq/torch/_row_collate.py, NOTE [ Rows written as
               fetched ]), then the batch packed (its record)
  dropin-collate the drop-in's path for samples it cannot write so:
               DataLoader's fetch, then default_collate stacking into the
               slot (fastq.torch._worker_side, NOTE [ Stacking with
               numpy ]), then the batch packed
  dropin-torch the same with torch's own stacking (torch.as_tensor per
               sample, torch.stack into the slot): the path before numpy
               stacked

Two measures, per batch:

- CPU time: the median over blocks, the variants' blocks taking turns so
  that a change in the machine's load meets them alike;
- instructions, counted by ``valgrind --tool=callgrind`` (``--callgrind``):
  each variant runs for two numbers of batches and the difference, over the
  batches between them, is one more batch's cost.

    python benchmarks/dataloader_worker_cost.py                 # imagenet
    python benchmarks/dataloader_worker_cost.py -s small --callgrind
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from typing import Callable

import numpy as np
from callgrind_run import run_steps, step_instructions

VARIANTS = ("prefetcher", "dropin", "dropin-collate", "dropin-torch")
EPOCH_BATCHES = 16


def _setup(shape: str, variant: str) -> Callable[[int], None]:
    """The variant's per-batch step: step(task) makes batch `task`."""
    import torch
    import torch.utils.data._utils.collate as torch_collate
    from torch.utils.data import default_collate

    from fastq._bench.workloads import WORKLOADS, ProducerConfig, SampleDataset
    from fastq._layout._packing import Arena, pack
    from fastq._layout._spec import BatchSpec
    from fastq._make._map_fill import MapFill
    from fastq._make._sampler import EpochSampler
    from fastq._make._worker_info import WorkerInfo
    from fastq.torch._worker_side import CODEC, MapSource

    torch.set_num_threads(1)  # as in a worker
    w = WORKLOADS[shape]
    dataset = SampleDataset(ProducerConfig(w), length=w.rows * EPOCH_BATCHES)
    spec = BatchSpec.from_sample(dataset[0], w.rows)
    slot = np.zeros(spec.slot_bytes + (1 << 16), np.uint8)
    sampler = EpochSampler(
        len(dataset),
        w.rows,
        shuffle=False,
        seed=0,
        drop_last=False,
        rank=0,
        world_size=1,
    )
    info = WorkerInfo(0, 1, 0, 0, 1, dataset)
    if variant == "prefetcher":
        views = spec.views(slot, spec.rows, capacity=True)
        full = spec.unflatten(views)
        maker = MapFill(dataset, sampler, spec, info, seed=0, reseed=False)

        def step(task: int) -> None:
            maker.fill(task % EPOCH_BATCHES, views, full)

    else:
        source = MapSource(dataset, default_collate, auto_collation=True)
        if variant != "dropin":
            source._rows = False  # default_collate, not rows written as fetched
        source.start_worker(info)  # fastq's collate functions in the table
        table = torch_collate.default_collate_fn_map
        # Each step puts its own collate functions in torch's table: the
        # variants share it in this process.
        mine = {np.ndarray: table[np.ndarray], torch.Tensor: table[torch.Tensor]}
        if variant == "dropin-torch":

            def torch_stacking(batch, *, collate_fn_map=None):  # type: ignore[no-untyped-def]
                elem = batch[0]
                shape = (len(batch), *elem.shape)
                nbytes = int(np.prod(shape)) * elem.element_size()
                off = source.arena.try_alloc(nbytes)
                out = torch.from_numpy(source.arena.slot[off : off + nbytes])
                return torch.stack(list(batch), 0, out=out.view(elem.dtype).view(shape))

            mine = {
                np.ndarray: torch_collate.collate_numpy_array_fn,
                torch.Tensor: torch_stacking,
            }
        keys = [sampler.batch_indices(t).tolist() for t in range(EPOCH_BATCHES)]

        def step(task: int) -> None:
            table.update(mine)
            arena = source.arena = Arena(slot)
            batch = source.make(keys[task % EPOCH_BATCHES])
            pack(batch, slot, CODEC, arena)
            source.arena = None

    for t in range(EPOCH_BATCHES + 1):  # warm: every page of the slot
        step(t)
    gc.collect()
    gc.freeze()
    return step


def _wall(shape: str, blocks: int, per_block: int) -> dict[str, float]:
    steps = {v: _setup(shape, v) for v in VARIANTS}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    task = 0
    for _ in range(blocks):
        for v, step in steps.items():
            t0 = time.process_time_ns()
            for _ in range(per_block):
                step(task)
                task += 1
            times[v].append((time.process_time_ns() - t0) / per_block / 1e3)
    return {v: statistics.median(ts) for v, ts in times.items()}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_steps(_setup, sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--shape", default="imagenet")
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--per-block", type=int, default=10)
    parser.add_argument("--callgrind", action="store_true")
    args = parser.parse_args()
    from fastq._bench.report import machine

    print(f"machine: {machine()}")
    wall = _wall(args.shape, args.blocks, args.per_block)
    base = wall["prefetcher"]
    print(f"shape {args.shape}: CPU us per batch, median of {args.blocks} blocks")
    for v, us in wall.items():
        print(f"  {v:<15} {us:10.1f} us   {us / base:5.2f}x the Prefetcher's")
    if not args.callgrind:
        return
    with tempfile.TemporaryDirectory() as tmp:
        counts = {}
        for v in VARIANTS:
            a, b = (step_instructions(__file__, args.shape, v, n, tmp) for n in (4, 12))
            counts[v] = (b - a) / 8
        base_i = counts["prefetcher"]
        print("instructions per batch (callgrind, 12 batches less 4)")
        for v, n in counts.items():
            print(f"  {v:<15} {n:14,.0f}   {n / base_i:5.2f}x the Prefetcher's")


if __name__ == "__main__":
    main()
