"""`python -m fastq bench`: run transports side by side, print a table of
throughput with ratios to memcpy and to the pickled queue."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from .transports import DEFAULT_TRANSPORTS, MEMCPY, QUEUE, TRANSPORTS, Budget, Result
from .workloads import DEFAULT_WORKLOAD, WORKLOADS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fastq bench",
        description="Throughput of fastq next to a pickled multiprocessing.Queue "
        "and a plain memcpy of the same bytes, in one run.",
    )
    p.add_argument("--workload", "-w", action="append", choices=sorted(WORKLOADS),
                   help=f"batch shape (repeatable; default {DEFAULT_WORKLOAD})")
    p.add_argument("--transport", "-t", action="append", choices=sorted(TRANSPORTS),
                   help="transport (repeatable; default: all)")
    p.add_argument("--workers", type=int, default=1, help="producer processes (1)")
    p.add_argument("--slots", type=int, default=4,
                   help="ring slots / queue size (4)")
    p.add_argument("--seconds", type=float, default=8.0,
                   help="measured seconds per case, after warm-up (8)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up batches (10)")
    p.add_argument("--json", metavar="FILE", help="also write results as JSON")
    return p


def machine() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{platform.machine()}, {cpus} CPUs, Linux {platform.release()}, Python {platform.python_version()}"


def _table(results: list[Result]) -> str:
    base = {r.transport: r for r in results}
    memcpy = base.get(MEMCPY)
    queue = base.get(QUEUE)
    lines = [f"{'transport':24} {'batches/s':>10} {'GB/s':>7} {'us/batch':>9} "
             f"{'1st batch s':>11} {'x memcpy':>9} {'x queue':>8}"]
    for r in results:
        vm = f"{r.batches_per_s / memcpy.batches_per_s:9.2f}" if memcpy else f"{'-':>9}"
        vq = f"{r.batches_per_s / queue.batches_per_s:8.1f}" if queue else f"{'-':>8}"
        lines.append(f"{r.transport:24} {r.batches_per_s:10.1f} {r.gb_per_s:7.2f} "
                     f"{r.us_per_batch:9.1f} {r.first_batch_s:11.3f} {vm} {vq}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workloads = args.workload or [DEFAULT_WORKLOAD]
    transports = args.transport or list(DEFAULT_TRANSPORTS)
    budget = Budget(args.seconds, args.warmup)
    print(f"fastq bench on {machine()}")
    print(f"workers={args.workers} slots={args.slots}, {args.seconds:g} s per case "
          f"after {args.warmup} warm-up batches\n")
    report: list[dict[str, Any]] = []
    for name in workloads:
        w = WORKLOADS[name]
        print(f"workload {name}: {w.describe()}", flush=True)
        results = []
        for t in transports:
            print(f"  running {t} ...", end="", flush=True, file=sys.stderr)
            r = TRANSPORTS[t](w, args.workers, args.slots, budget)
            print(f" {r.batches_per_s:.1f} batches/s", file=sys.stderr)
            results.append(r)
            report.append({"workload": name, "transport": r.transport,
                           "batches_per_s": r.batches_per_s, "gb_per_s": r.gb_per_s,
                           "us_per_batch": r.us_per_batch,
                           "first_batch_s": r.first_batch_s, "batches": r.batches,
                           "seconds": r.seconds, "batch_bytes": r.batch_bytes,
                           "workers": args.workers, "slots": args.slots})
        print(_table(results) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "results": report}, f, indent=2)
    return 0
