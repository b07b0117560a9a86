"""First batch of the torch-startup bench's "photos" case (3x224x224 uint8
samples of 3 ms, batch 128, shuffled, persistent workers), 4 and 15
workers: DataLoader, the drop-in in this checkout ("after") and in another
("before"), interleaved, each run a fresh process; medians.

    python benchmarks/first_batch_large_ring.py ROUNDS BEFORE_CHECKOUT
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(rounds: int, before: str) -> None:
    trees = {
        "DataLoader": (HERE, "DataLoader"),
        "before": (before, "fastq.torch.DataLoader"),
        "after": (HERE, "fastq.torch.DataLoader"),
    }
    res: dict[tuple[int, str], list[float]] = {}
    for _ in range(rounds):
        for w in (4, 15):
            for name, (tree, loader) in trees.items():
                job = json.dumps({"loader": loader, "method": "photos", "workers": w})
                out = subprocess.run(
                    [
                        sys.executable,
                        "-W",
                        "ignore",
                        "-m",
                        "fastq._bench.torch_startup",
                        job,
                    ],
                    cwd=tree,
                    capture_output=True,
                    text=True,
                )
                r = json.loads(out.stdout.strip().splitlines()[-1])
                res.setdefault((w, name), []).append(r["first_batch_s"])
    for (w, name), v in sorted(res.items()):
        runs = " ".join(f"{x:.2f}" for x in v)
        print(f"{w:3d} {name:11s} median {statistics.median(v):.3f}  [{runs}]")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
