"""fastq's own cost per sample on the map-style path, beyond __getitem__.

Drives, in one process, the function a worker runs per task of a map-style
dataset (fastq._make._map_fill.MapFill.fill: the task's indices, the worker info
and per-batch seeds, then one row per sample) over a plain buffer laid out
like a slot, against a loop that only calls ``__getitem__`` for the same
indices. The dataset is the bench's own (fastq._bench.workloads
SampleDataset), for its small and medium shapes.

Two measures, per sample:

- instructions, counted by ``valgrind --tool=callgrind``: each variant runs
  twice, for two numbers of batches, and the difference between the two
  counts, over the batches between them, is the cost of one more batch
  (start-up, imports and set-up cancel out);
- wall time: the median over blocks of batches, in this process.

Variants, each adding one part of the worker's path to the one before:

  getitem   dataset[i] for each index of the batch (a C loop: map)
  rows      + the copy of each sample into its row (RowWriter)
  noseed    + the task's indices and worker info (MapFill, no reseed)
  fill      + the per-batch reseed of random and np.random: the worker's
            whole per-task path

fastq's own cost = fill - getitem, split as rows - getitem, noseed - rows,
fill - noseed. The collector is frozen (gc.freeze) after set-up in every
variant, so that its passes over the start-up's objects do not blur the
counts; the per-batch garbage fastq makes is one list of indices at most.

    python benchmarks/per_sample_cost.py                # table
    python benchmarks/per_sample_cost.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any, Callable

import numpy as np
from callgrind_run import quiet_env, run_steps, step_instructions

from fastq._bench.report import machine

VARIANTS = ("getitem", "rows", "noseed", "fill")
SHAPES = ("small", "medium")
# Batches per epoch of the measured dataset: its epoch's index array is
# made once per that many batches, as a worker's sampler does per epoch.
EPOCH_BATCHES = 64


def _setup(shape: str, variant: str) -> Callable[[int], None]:
    """The variant's per-batch step: step(task) makes batch `task`."""
    from fastq._bench.workloads import WORKLOADS, ProducerConfig, SampleDataset
    from fastq._layout._spec import BatchSpec
    from fastq._make._map_fill import MapFill
    from fastq._make._sampler import EpochSampler
    from fastq._make._worker_info import WorkerInfo

    w = WORKLOADS[shape]
    dataset = SampleDataset(ProducerConfig(w), length=w.rows * EPOCH_BATCHES)
    spec = BatchSpec.from_sample(dataset[0], w.rows)
    slot = np.zeros(spec.slot_bytes + 4096, np.uint8)
    views = spec.views(slot, spec.rows, capacity=True)
    full = spec.unflatten(views)
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
    maker = MapFill(dataset, sampler, spec, info, seed=0, reseed=variant == "fill")
    # The indices of each batch of an epoch, made ahead for the variants
    # that do not run the sampler.
    keys = [sampler.batch_indices(t) for t in range(EPOCH_BATCHES)]
    key_lists = [k.tolist() for k in keys]
    get = dataset.__getitem__
    rows = maker.rows
    write_indices = getattr(rows, "write_indices", None)

    def getitem(task: int) -> None:
        deque(map(get, key_lists[task % EPOCH_BATCHES]), 0)

    def rows_only(task: int) -> None:
        if write_indices is not None:
            write_indices(get, keys[task % EPOCH_BATCHES], views)
        else:
            rows.write_samples(get, key_lists[task % EPOCH_BATCHES], views)

    def fill(task: int) -> None:
        maker.fill(task, views, full)

    step = {"getitem": getitem, "rows": rows_only}.get(variant, fill)
    for t in range(EPOCH_BATCHES):  # warm: every row template, every epoch
        step(t)
    step(EPOCH_BATCHES)
    gc.collect()
    gc.freeze()
    return step


def _memcpy(path: str) -> int:
    """Instructions counted in the C library's memcpy (self cost) in a
    callgrind output file."""
    names: dict[str, str] = {}
    fn = ""
    total = 0
    skip = False
    with open(path) as f:
        for line in f:
            if line.startswith(("fn=", "cfn=")):
                ref, _, name = line.split("=", 1)[1].strip().partition(" ")
                if name:
                    names[ref] = name
                if line.startswith("fn="):
                    fn = names.get(ref, ref)
            elif line.startswith("calls="):
                skip = True  # the next cost line is the call's, inclusive
            elif line[:1].isdigit() or line[:1] in "+-*":
                if skip:
                    skip = False
                elif "memcpy" in fn or "memmove" in fn:
                    parts = line.split()
                    if len(parts) > 1:
                        total += int(parts[1])
    return total


def _marginal(
    shape: str, variant: str, lengths: tuple[int, int], tmp: str
) -> tuple[float, float]:
    """Instructions per sample of one more batch: all, and memcpy's."""
    from fastq._bench.workloads import WORKLOADS

    a, b = (step_instructions(__file__, shape, variant, n, tmp) for n in lengths)
    samples = (lengths[1] - lengths[0]) * WORKLOADS[shape].rows
    cp = [_memcpy(os.path.join(tmp, f"cg.{shape}.{variant}.{n}")) for n in lengths]
    return (b - a) / samples, (cp[1] - cp[0]) / samples


def _wall(shape: str, blocks: int, per_block: int) -> dict[str, float]:
    """Median ns per sample of each variant over `blocks` blocks, in a fresh
    interpreter; the variants' blocks take turns, so that a change in the
    machine's load meets them all alike."""
    code = (
        "import sys, time, statistics; sys.path.insert(0, sys.argv[1]);"
        "from per_sample_cost import _setup, VARIANTS;"
        "steps = {v: _setup(sys.argv[2], v) for v in VARIANTS};"
        "n = int(sys.argv[4]); t = 0; out = {v: [] for v in VARIANTS}\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    for v, step in steps.items():\n"
        "        t0 = time.perf_counter_ns()\n"
        "        for _ in range(n):\n"
        "            step(t); t += 1\n"
        "        out[v].append(time.perf_counter_ns() - t0)\n"
        "print(' '.join(str(statistics.median(out[v]) / n) for v in VARIANTS))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-c", code, here, shape, str(blocks), str(per_block)]
    res = subprocess.run(
        cmd, env=quiet_env(), check=True, capture_output=True, text=True
    )
    from fastq._bench.workloads import WORKLOADS

    rows = WORKLOADS[shape].rows
    return {
        v: float(x) / rows for v, x in zip(VARIANTS, res.stdout.split(), strict=True)
    }


def measure(
    shapes: tuple[str, ...],
    lengths: tuple[int, int],
    blocks: int,
    wall_batches: int,
    callgrind: bool,
) -> dict[str, Any]:
    from fastq._bench.workloads import WORKLOADS

    result: dict[str, Any] = {
        "machine": machine(),
        "command": "python " + " ".join(sys.argv),
        "shapes": {},
    }
    tmp = tempfile.mkdtemp(prefix="fastq-per-sample-")
    try:
        for shape in shapes:
            row: dict[str, Any] = {"describe": WORKLOADS[shape].describe()}
            scale = 256 / WORKLOADS[shape].rows  # the same samples per run
            per_block = max(1, round(wall_batches * scale))
            runs = (round(lengths[0] * scale), round(lengths[1] * scale))
            measured = {}
            if callgrind:
                counts = {v: _marginal(shape, v, runs, tmp) for v in VARIANTS}
                measured["instructions"] = {v: c[0] for v, c in counts.items()}
                # callgrind counts each byte a `rep movsb` moves: memcpy's
                # share of the row copies is the bytes, not fastq's logic.
                memcpy = counts["rows"][1] - counts["getitem"][1]
            measured["ns"] = _wall(shape, blocks, per_block)
            for unit, v in measured.items():
                row[unit] = {
                    "getitem": v["getitem"],
                    "fastq_total": v["fill"],
                    "fastq_own": v["fill"] - v["getitem"],
                    "split": {
                        "row copies": v["rows"] - v["getitem"],
                        "indices and worker info": v["noseed"] - v["rows"],
                        "reseed (random, np.random)": v["fill"] - v["noseed"],
                    },
                    "variants": v,
                }
                if unit == "instructions":
                    row[unit]["split"]["row copies: memcpy"] = memcpy
            result["shapes"][shape] = row
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"machine: {result['machine']}",
        f"command: {result['command']}",
        "",
        "Per sample, map-style path (one worker's per-task fill, in process):",
    ]
    for shape, row in result["shapes"].items():
        lines.append("")
        lines.append(f"{shape}: {row['describe']}")
        units = [u for u in ("instructions", "ns") if u in row]
        header = f"  {'':34}" + "".join(f"{u:>14}" for u in units)
        lines.append(header)
        names = [
            ("getitem alone", lambda r: r["getitem"]),
            ("fastq total", lambda r: r["fastq_total"]),
            ("fastq's own (total - getitem)", lambda r: r["fastq_own"]),
        ]
        for key in (
            "row copies",
            "row copies: memcpy",
            "indices and worker info",
            "reseed (random, np.random)",
        ):
            label = f"  of which {key}" if ":" not in key else "    of which memcpy"
            names.append((label, lambda r, k=key: r["split"].get(k)))
        for label, get in names:
            cells = "".join(
                f"{'':>14}"
                if get(row[u]) is None
                else f"{get(row[u]):>14,.0f}"
                if u == "instructions"
                else f"{get(row[u]):>14.1f}"
                for u in units
            )
            lines.append(f"  {label:34}{cells}")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        run_steps(_setup, sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-s", "--shapes", default=",".join(SHAPES))
    p.add_argument(
        "--batches",
        default="50,200",
        help="the two run lengths whose counts are subtracted, in batches of "
        "256 samples (the small shape's; other shapes run as many samples)",
    )
    p.add_argument("--blocks", type=int, default=21, help="timed blocks per variant")
    p.add_argument(
        "--wall-batches",
        type=int,
        default=40,
        help="batches of 256 samples per timed block (other shapes: as many samples)",
    )
    p.add_argument("--no-callgrind", action="store_true", help="wall time only")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = p.parse_args()
    if not args.no_callgrind and shutil.which("valgrind") is None:
        p.error("valgrind is not installed; pass --no-callgrind for wall time only")
    lo, hi = (int(x) for x in args.batches.split(","))
    t0 = time.monotonic()
    result = measure(
        tuple(args.shapes.split(",")),
        (lo, hi),
        args.blocks,
        args.wall_batches,
        not args.no_callgrind,
    )
    result["seconds"] = round(time.monotonic() - t0, 1)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
