"""Memory of a dataset that holds one large numpy array, read whole by every
worker: total PSS of the training process and all its descendants (workers,
fork servers), and the time to the first batch.

    python benchmarks/shared_arrays_memory.py [--mib 1024] [--workers 8]

Each case runs in a fresh interpreter. The first batch is timed from the
loader's construction; then every worker sums the whole array (so each
has touched every page), and PSS is measured. PSS splits a shared page among the
processes that map it, so the total counts each page once. Cases:

- fastq, array attribute: the default start method; the array is copied
  once into shared memory, which every worker maps;
- fastq, fastq.shared_array: the array lives in shared memory from the
  start, so the training process holds no second copy;
- torch DataLoader, fork: workers share the parent's pages copy-on-write;
- torch DataLoader, spawn: the array is pickled into each worker;
- the same with a 1 MiB array, for each loader's baseline (interpreter,
  imports, ring), and its first-batch time.

"copies" is the PSS beyond the baseline, in arrays: 1.00 is one copy of the
array for the training process and all its workers together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from fastq._bench.procstat import total_pss

CASES = ["fastq", "fastq-shared", "torch-fork", "torch-spawn"]


class Holds:
    """Sample i: (worker id, whether this worker has read the whole array).
    A worker reads it all at its second sample: its first batch shows what
    the handoff costs, and PSS is measured once every worker has read it."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.calls = 0

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> Any:
        info = _worker_info()
        if info is None:  # read here, for the spec
            return np.array([-1, 0], dtype=np.int64)
        self.calls += 1
        if self.calls == 2:
            self.array.sum()  # every page of this worker's copy
        return np.array([info.id, self.calls >= 2], dtype=np.int64)


def _worker_info() -> Any:
    import fastq

    info = fastq.get_worker_info()
    if info is None and "torch" in sys.modules:
        import torch.utils.data

        info = torch.utils.data.get_worker_info()
    return info


def run_case(case: str, mib: int, workers: int) -> dict[str, Any]:
    """In this (fresh) process: build the loader, wait for every worker's
    first batch, measure."""
    n = mib * (1 << 20) // 8
    array = np.arange(n, dtype=np.int64)
    if case == "fastq-shared":
        import fastq

        array = fastq.shared_array(array)  # the only copy from here on
    dataset = Holds(array)
    del array
    t0 = time.perf_counter()
    if case.startswith("fastq"):
        import fastq

        loader: Any = fastq.Prefetcher(dataset, batch_size=1, workers=workers)
    else:
        import torch.utils.data

        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=1,
            num_workers=workers,
            multiprocessing_context=case.split("-")[1],
        )
    it = iter(loader)
    first = None
    done: set[int] = set()  # workers that have read the whole array
    while len(done) < workers:
        wid, read_all = (int(x) for x in np.asarray(next(it))[0])
        if first is None:
            first = time.perf_counter() - t0
        if read_all:
            done.add(wid)
    total = total_pss(os.getpid()) / (1 << 20)
    del it
    if hasattr(loader, "close"):
        loader.close()
    return {"case": case, "pss_mib": total, "first_batch_s": first}


def launch(case: str, mib: int, workers: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--one", case]
    command += ["--mib", str(mib), "--workers", str(workers)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="array size (MiB)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.mib, args.workers)), flush=True)
        return
    cases = args.cases.split(",")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: its cases are skipped", file=sys.stderr)
        cases = [c for c in cases if not c.startswith("torch")]
    print(
        f"array {args.mib} MiB, {args.workers} workers; total PSS of the "
        "training process and its descendants"
    )
    print(
        f"{'loader':<14} {'PSS (MiB)':>10} {'baseline':>9} {'copies':>7} "
        f"{'first batch (s)':>16} {'baseline':>9}"
    )
    for case in cases:
        big = launch(case, args.mib, args.workers)
        small = launch(case, 1, args.workers)
        # Copies of the array: PSS beyond the 1 MiB case's, in arrays.
        copies = (big["pss_mib"] - small["pss_mib"]) / (args.mib - 1)
        print(
            f"{case:<14} {big['pss_mib']:>10.0f} {small['pss_mib']:>9.0f} "
            f"{copies:>7.2f} {big['first_batch_s']:>16.3f} "
            f"{small['first_batch_s']:>9.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
