"""Time to the first training batch under each trainer route, fastq's
loader next to torch's DataLoader (num_workers=2 both), on CPU.

    python benchmarks/trainers_first_batch.py [--runs 5] [--routes ...]

Each run is a fresh launch of tests/torch_helpers/trainer_routes.py (one
epoch, no validation); the time is taken inside it, on every rank, from the
start of the trainer's fit (Lightning's on_fit_start: after the launch and
the process group's setup) or of accelerate's loop set-up (after
Accelerator()), to the first batch in a training step; a run counts its
slowest rank. Prints the median and the runs. Needs the trainers extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "torch_helpers" / "trainer_routes.py"

# (label, route, processes, loader). TorchPrefetcher has no torch twin;
# transformers' Trainer builds its own loader, on fastq's workers after
# fastq.torch.install() (the fastq case).
CASES = [
    ("Lightning, 1 process", "lightning-hook", 1, "torch"),
    ("Lightning, 1 process", "lightning-hook", 1, "fastq"),
    ("Lightning DDP, 2 processes", "lightning-hook", 2, "torch"),
    ("Lightning DDP, 2 processes", "lightning-hook", 2, "fastq"),
    ("accelerate prepare(loader), 1 process", "accelerate-prepare", 1, "torch"),
    ("accelerate prepare(loader), 1 process", "accelerate-prepare", 1, "fastq"),
    ("accelerate prepare(loader), 2 processes", "accelerate-prepare", 2, "torch"),
    ("accelerate prepare(loader), 2 processes", "accelerate-prepare", 2, "fastq"),
    ("transformers Trainer, 1 process", "transformers", 1, "torch"),
    ("transformers Trainer, 1 process", "transformers", 1, "fastq"),
    ("accelerate + DistributedSampler, 1 process", "accelerate-sampler", 1, "torch"),
    ("accelerate + DistributedSampler, 1 process", "accelerate-sampler", 1, "fastq"),
    ("accelerate + DistributedSampler, 2 processes", "accelerate-sampler", 2, "torch"),
    ("accelerate + DistributedSampler, 2 processes", "accelerate-sampler", 2, "fastq"),
    ("accelerate + TorchPrefetcher, 1 process", "accelerate-prefetcher", 1, "fastq"),
    ("accelerate + TorchPrefetcher, 2 processes", "accelerate-prefetcher", 2, "fastq"),
]


def one_run(route: str, processes: int, loader: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable]
        if processes > 1 and route.startswith("accelerate"):
            cmd += ["-m", "torch.distributed.run", "--standalone"]
            cmd += [f"--nproc_per_node={processes}"]
        cmd += [str(SCRIPT), route, out, "--loader", loader]
        cmd += ["--epochs", "1", "--no-val"]
        if route.startswith("lightning"):
            cmd += ["--devices", str(processes)]
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(SCRIPT.parent), str(ROOT)]),
            OMP_NUM_THREADS="1",
        )
        subprocess.run(
            cmd, cwd=out, env=env, check=True, capture_output=True, timeout=600
        )
        times = [
            json.loads((Path(out) / f"{route}-rank{r}.json").read_text())[
                "first_batch_s"
            ]
            for r in range(processes)
        ]
    return max(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--routes", help="comma-separated routes (default: all)")
    args = p.parse_args()
    wanted = set(args.routes.split(",")) if args.routes else None
    print(f"{'route':46} {'loader':6} {'median s':>9}  runs (s)")
    for label, route, processes, loader in CASES:
        if wanted and route not in wanted:
            continue
        runs = [one_run(route, processes, loader) for _ in range(args.runs)]
        shown = " ".join(f"{t:.2f}" for t in runs)
        print(f"{label:46} {loader:6} {statistics.median(runs):9.2f}  {shown}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
