"""Instructions the training loop spends in one `next()` that finds its
batch waiting, counted by valgrind's callgrind: repeatable on a noisy
machine, whatever else runs.

    python benchmarks/consumer_instructions.py [--shape small|medium]

The loop runs under callgrind with collection on only inside
`slot_tp_iternext` (CPython's entry to a Python-level `__next__`), so only
the calls count. The worker runs natively (callgrind follows no child that
the fork server starts). Each round waits until the worker has filled the
ring, then takes 15 batches; the script runs two round counts and reports
the difference per call, so start-up and the first calls cancel out.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

SHAPES = {
    # rows, per-row fields: (shape, dtype)
    "small": (256, [((32,), np.float32), ((), np.int64)]),
    "medium": (64, [((3, 64, 64), np.uint8), ((), np.int64)]),
}
CALLS_PER_ROUND = 15
SLOTS = 16
ROUNDS = (40, 80)


def batches(shape: str) -> Iterator[tuple[Any, ...]]:
    """The same prepared batch, again and again (the loop's cost is what
    is measured, not the worker's)."""
    rows, fields = SHAPES[shape]
    batch = tuple(np.ones((rows, *s), dtype=d) for s, d in fields)
    while True:
        yield batch


class Source:
    def __init__(self, shape: str) -> None:
        self.shape = shape

    def __call__(self) -> Iterator[tuple[Any, ...]]:
        return batches(self.shape)


def loop(shape: str, rounds: int) -> None:
    """The measured process: rounds of CALLS_PER_ROUND next() calls, each
    round after the worker has filled the ring."""
    import fastq

    with fastq.Prefetcher(Source(shape), workers=1, slots=SLOTS) as pf:
        it = iter(pf)
        held = [next(it)]  # as a `for` loop's variable holds its batch
        for _ in range(rounds):
            held.clear()  # its slot goes back for the worker to fill
            deadline = time.monotonic() + 5.0
            while _ready(pf) < CALLS_PER_ROUND and time.monotonic() < deadline:
                time.sleep(0.002)
            for _ in range(CALLS_PER_ROUND):
                held[:] = [next(it)]


def _ready(pf: Any) -> int:
    """Batches published and not yet taken."""
    stats = pf.stats()
    return sum(w["batches"] for w in stats["workers"]) - stats["batches"]


def instructions(shape: str, rounds: int) -> int:
    out = tempfile.mkdtemp(prefix="fastq-callgrind-")
    try:
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--toggle-collect=slot_tp_iternext",
                f"--callgrind-out-file={out}/cg.%p",
                sys.executable,
                __file__,
                "--child",
                shape,
                str(rounds),
            ],
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        totals = []
        for path in glob.glob(f"{out}/cg.*"):
            with open(path) as f:
                for line in f:
                    m = re.match(r"(?:summary|totals): (\d+)", line)
                    if m:
                        totals.append(int(m.group(1)))
                        break
        return max(totals)  # the loop's process; others collect nothing
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        loop(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    lo, hi = (instructions(args.shape, r) for r in ROUNDS)
    calls = (ROUNDS[1] - ROUNDS[0]) * CALLS_PER_ROUND
    rows, fields = SHAPES[args.shape]
    print(f"shape {args.shape}: {rows} rows x {len(fields)} fields, {SLOTS} slots")
    print(f"{ROUNDS[0]} rounds: {lo:,} instructions inside next()")
    print(f"{ROUNDS[1]} rounds: {hi:,} instructions inside next()")
    print(f"per next() with the batch waiting: {(hi - lo) / calls:,.0f} instructions")


if __name__ == "__main__":
    main()
