"""Memory of a dataset that holds one large numpy array, read whole by every
worker: total PSS of the training process and all its descendants (workers,
fork servers), and the time to the first batch.

    python benchmarks/shared_arrays_memory.py [--mib 512 4096] [--workers 2 8]

Each case runs in a fresh interpreter. The first batch is timed from the
loader's construction; then every worker sums the whole array (so each
has touched every page), and PSS is measured. PSS splits a shared page among the
processes that map it, so the total counts each page once. Cases (the
default ones first):

- fastq: fastq.Prefetcher with default arguments: workers fork and share
  the parent's pages copy-on-write;
- fastq-dataloader: fastq.torch.DataLoader with default arguments (the
  same, through the DataLoader face);
- torch-fork: torch's DataLoader with default arguments (fork on Linux);
- fastq-spawn: start_method="spawn": the array is copied once into shared
  memory, which every worker maps;
- fastq-shared: a fastq.shared_array: the array lives in shared memory
  from the start, so the training process holds no second copy;
- torch-spawn: torch's DataLoader under spawn: the array is pickled into
  each worker (a copy per worker: leave it out for arrays near memory);
- each with a 1 MiB array too, for its baseline (interpreter, imports,
  ring), and its first-batch time.

"copies" is the PSS beyond the baseline, in arrays: 1.00 is one copy of the
array for the training process and all its workers together. "PSS vs
fork" and "first vs fork" set each loader beside torch-fork's in the same
run: a ratio of total PSS, and the difference of first-batch times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
from case_process import case_in_fresh_process

from fastq._bench.procstat import total_pss

CASES = [
    "fastq",
    "fastq-dataloader",
    "torch-fork",
    "fastq-spawn",
    "fastq-shared",
    "torch-spawn",
]
DEFAULT_CASES = CASES[:3]


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
    # The loader's modules are imported before the clock starts, as a
    # training script imports them at its top.
    if case.startswith("torch") or case == "fastq-dataloader":
        import torch.utils.data

        from fastq.torch import DataLoader
    import fastq

    t0 = time.perf_counter()
    if case == "fastq-dataloader":
        loader: Any = DataLoader(dataset, batch_size=1, num_workers=workers)
    elif case.startswith("fastq"):
        method = "spawn" if case == "fastq-spawn" else None
        loader = fastq.Prefetcher(
            dataset, batch_size=1, workers=workers, start_method=method
        )
    else:
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
        wid, read_all = (int(x) for x in np.asarray(next(it)).reshape(-1))
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
    return case_in_fresh_process(
        __file__, case, ["--mib", str(mib), "--workers", str(workers)]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 8])
    p.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help=f"comma-separated, of {','.join(CASES)}",
    )
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        row = run_case(args.one, args.mib[0], args.workers[0])
        print(json.dumps(row), flush=True)
        return
    cases = args.cases.split(",")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: its cases are skipped", file=sys.stderr)
        cases = [c for c in cases if c not in ("fastq-dataloader",)]
        cases = [c for c in cases if not c.startswith("torch")]
    print("total PSS of the training process and its descendants")
    for mib in args.mib:
        for workers in args.workers:
            _measure(cases, mib, workers)


def _measure(cases: list[str], mib: int, workers: int) -> None:
    print(f"\narray {mib} MiB, {workers} workers")
    print(
        f"{'loader':<17} {'PSS (MiB)':>10} {'baseline':>9} {'copies':>7} "
        f"{'first batch (s)':>16} {'baseline':>9} {'PSS vs fork':>12} "
        f"{'first vs fork (s)':>18}"
    )
    rows = {}
    for case in cases:
        big = launch(case, mib, workers)
        small = launch(case, 1, workers)
        # Copies of the array: PSS beyond the 1 MiB case's, in arrays.
        copies = (big["pss_mib"] - small["pss_mib"]) / (mib - 1)
        rows[case] = (big, small, copies)
    fork = rows.get("torch-fork", (None,))[0]
    for case, (big, small, copies) in rows.items():
        versus = ""
        if fork is not None:
            ratio = big["pss_mib"] / fork["pss_mib"]
            later = big["first_batch_s"] - fork["first_batch_s"]
            versus = f"{ratio:>11.2f}x {later:>+18.3f}"
        print(
            f"{case:<17} {big['pss_mib']:>10.0f} {small['pss_mib']:>9.0f} "
            f"{copies:>7.2f} {big['first_batch_s']:>16.3f} "
            f"{small['first_batch_s']:>9.3f} {versus}",
            flush=True,
        )


if __name__ == "__main__":
    main()
