"""Memory of fastq.vision's ImageFiles (ImageFolder's base) with an
ImageNet-sized ``samples`` list, read by forked workers over one shuffled
epoch: from the list itself, and from the records in shared memory its
workers read since.

    PYTHONPATH=. python benchmarks/vision_samples_memory.py [--samples 1000000]
        [--workers 4] [--cases list,records]

Each case runs in a fresh interpreter. It builds the dataset of fake
(path, class) samples, ImageNet's file names (the files need not exist:
the loader is a stub that returns a number from the path, so the epoch
reads the records and decodes nothing), measures what the list takes
(PSS before and after), and takes the total PSS of the process and its
workers at the first batch and at the last one (the workers still up),
as benchmarks/shared_records_memory.py does (its PSS helpers are reused).
"added" is the growth between the two, in copies of the list. Cases:

- list: the dataset as it was, its workers reading ``samples`` (a subclass
  that turns the store off);
- records: as shipped, the workers reading the records made as they start.

Also printed: the time the store takes to make as the workers start, and
to find unchanged at a later start.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

import numpy as np
from case_process import case_in_fresh_process

from fastq._bench.procstat import pss_bytes, total_pss

BATCH = 500
CASES = ["list", "records"]


def path_number(path: str) -> np.int64:
    """The stand-in for decoding: a number read from the path."""
    return np.int64(len(path))


def fake_samples(n: int) -> list[tuple[str, int]]:
    """ImageNet's layout: 1,000 class folders, file names of its form."""
    return [
        (
            f"/data/imagenet/train/n{1440764 + i % 1000:08d}/"
            f"n{1440764 + i % 1000:08d}_{i:d}.JPEG",
            i % 1000,
        )
        for i in range(n)
    ]


def run_case(case: str, n: int, workers: int) -> dict[str, Any]:
    import fastq
    from fastq.vision import ImageFiles

    class ListRead(ImageFiles):
        """ImageFiles with the store off: its workers read the list."""

        def _reads_records(self) -> bool:
            return False

    kind = ListRead if case == "list" else ImageFiles
    before = pss_bytes(os.getpid())
    dataset = kind(fake_samples(n), loader=path_number)
    list_bytes = pss_bytes(os.getpid()) - before
    t0 = time.perf_counter()
    dataset._fastq_before_workers(fastq.shared_records)
    made_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dataset._fastq_before_workers(fastq.shared_records)
    found_s = time.perf_counter() - t0
    records = dataset._records
    shared = 0
    if records is not None:
        shared = records.nbytes  # type: ignore[attr-defined]
        # A page of shared memory counts in PSS once a process maps it: read
        # here, the store's one copy counts from the start, as a list does.
        for _record in records:
            pass
    loader = fastq.Prefetcher(
        dataset, batch_size=BATCH, shuffle=True, workers=workers, seed=0
    )
    batches = len(loader)
    first = last = 0
    t0 = time.perf_counter()
    for k, _batch in enumerate(loader):
        if k == 0:
            first = total_pss(os.getpid())
        if k == batches - 1:  # before the loader ends its workers
            last = total_pss(os.getpid())
    epoch_s = time.perf_counter() - t0
    loader.close()
    return {
        "case": case,
        "list_bytes": list_bytes,
        "shared_bytes": shared,
        "first_pss": first,
        "last_pss": last,
        "epoch_s": epoch_s,
        "made_s": made_s,
        "found_s": found_s,
    }


def launch(case: str, n: int, workers: int) -> dict[str, Any]:
    return case_in_fresh_process(
        __file__, case, ["--samples", str(n), "--workers", str(workers)]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--cases", default=",".join(CASES), help=f"of {','.join(CASES)}")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.samples, args.workers)), flush=True)
        return
    mib = 1 << 20
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"\nImageFiles of {args.samples:,} samples, {args.workers} forked "
        f"workers, one shuffled epoch, batch_size={BATCH}"
    )
    print(
        f"{'workers read':<13} {'list (MiB)':>10} {'shared (MiB)':>12} "
        f"{'PSS first':>10} {'PSS last':>9} {'added (MiB)':>11} "
        f"{'added (copies)':>14} {'epoch (s)':>9} {'store made (s)':>14} "
        f"{'found (ms)':>10}"
    )
    for case in args.cases.split(","):
        row = launch(case, args.samples, args.workers)
        added = row["last_pss"] - row["first_pss"]
        made = f"{row['made_s']:.2f}" if row["shared_bytes"] else "-"
        found = f"{row['found_s'] * 1e3:.0f}" if row["shared_bytes"] else "-"
        print(
            f"{case:<13} {row['list_bytes'] / mib:>10.0f} "
            f"{row['shared_bytes'] / mib:>12.0f} {row['first_pss'] / mib:>10.0f} "
            f"{row['last_pss'] / mib:>9.0f} {added / mib:>11.0f} "
            f"{added / max(row['list_bytes'], 1):>14.2f} {row['epoch_s']:>9.1f} "
            f"{made:>14} {found:>10}",
            flush=True,
        )


if __name__ == "__main__":
    main()
