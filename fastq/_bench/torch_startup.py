"""Time to the first batch and worker memory when the script has imported
torch: fastq per start method, and the one-line migration imported late
(after CUDA is initialised, where there is a GPU), beside torch's
DataLoader. Each run is a fresh interpreter running this module (`python -m
fastq._bench.torch_startup JOB`), which imports torch before the clock
starts, as a training script does."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import procstat

# What each run builds: (loader, start method); "default" is the loader's
# own default (fastq: fork; DataLoader: the interpreter's default, fork on
# Linux before Python 3.14); "late" is the default with CUDA initialised
# first (where there is a GPU) and fastq.torch imported only then, as by a
# notebook cell after model.cuda() or a trainer's late import.
CONFIGS = (
    ("fastq", "fork"),
    ("fastq", "spawn"),
    ("fastq", "forkserver"),
    ("fastq", "default"),
    ("fastq.torch.DataLoader", "default"),
    ("fastq.torch.DataLoader", "late"),
    ("DataLoader", "default"),
    ("DataLoader", "late"),
)
# The large-ring case ("photos"): SlowPhotos, batch 128, shuffled,
# persistent workers, for these worker counts; the drop-in's default ring
# is then 2 slots of 19 MB per worker (580 MB at 15 workers).
PHOTO_CONFIGS = (
    ("fastq.torch.DataLoader", "photos"),
    ("DataLoader", "photos"),
)
PHOTO_WORKERS = (4, 15)
PHOTO_SAMPLES = 4096
PHOTO_BATCH = 128
REPEATS = 5
WORKERS = (1, 2)
SAMPLES = 512
BATCH_SIZE = 32
_TIMEOUT_S = 120.0


@dataclass
class Run:
    loader: str
    method: str
    workers: int
    first_batch_s: float = 0.0
    worker_pss: list[int] = field(default_factory=list)  # bytes, per worker
    server_pss: int = 0  # the fork server, if any
    total_pss: int = 0  # the script and every process under it
    actual: str = ""  # the start method used: "default" resolved
    error: str | None = None


def run_once(loader: str, method: str, workers: int) -> Run:
    """One run in a fresh interpreter."""
    job = json.dumps({"loader": loader, "method": method, "workers": workers})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", __name__, job],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Run(loader, method, workers, error="timed out")
    try:
        return Run(**json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, TypeError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Run(loader, method, workers, error=f"exit {proc.returncode}: {tail}")


def run_all(
    workers: Sequence[int] = WORKERS,
    repeats: int = REPEATS,
    progress: Callable[[Run], None] | None = None,
    photo_workers: Sequence[int] = PHOTO_WORKERS,
) -> list[Run]:
    """Every config for every worker count, and the large-ring case for
    ``photo_workers``, `repeats` fresh runs each, interleaved so that a
    slow spell of the machine hits every config."""
    runs = []
    jobs = [(loader, method, w) for w in workers for loader, method in CONFIGS]
    jobs += [(ld, m, w) for w in photo_workers for ld, m in PHOTO_CONFIGS]
    for _ in range(repeats):
        for loader, method, w in jobs:
            r = run_once(loader, method, w)
            if progress is not None:
                progress(r)
            runs.append(r)
    return runs


def describe(r: Run) -> str:
    if r.error:
        return f"{r.loader} {r.method} w={r.workers}: {r.error}"
    pss = statistics.mean(r.worker_pss) / 1e6 if r.worker_pss else 0.0
    return (
        f"{r.loader} {r.method} w={r.workers}: first batch {r.first_batch_s:.3f} s, "
        f"worker PSS {pss:.0f} MB ({r.actual})"
    )


def table(runs: Sequence[Run]) -> str:
    """Medians per (loader, method, workers), with ratios to fastq's fork."""
    groups: dict[tuple[str, str, int], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.loader, r.method, r.workers), []).append(r)

    def medians(key: tuple[str, str, int]) -> tuple[float, float, float, float]:
        ok = [r for r in groups.get(key, []) if not r.error]
        if not ok:
            return (float("nan"),) * 4
        return (
            statistics.median(r.first_batch_s for r in ok),
            statistics.median(statistics.mean(r.worker_pss) for r in ok) / 1e6,
            statistics.median(r.server_pss for r in ok) / 1e6,
            statistics.median(r.total_pss for r in ok) / 1e6,
        )

    head = (
        f"{'loader, start method':40}  {'w':>1}  {'first batch s':>13}  {'x fork':>6}  "
        f"{'worker PSS MB':>13}  {'x fork':>6}  {'server MB':>9}  {'total MB':>8}  "
        "first batch runs (s)"
    )
    lines = [head, "-" * len(head)]
    for (loader, method, w), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][2], _order(kv[0][0], kv[0][1]))
    ):
        ok = [r for r in rs if not r.error]
        label = f"{loader}, {method}"
        actual = sorted({r.actual for r in ok})
        if actual and method in ("default", "late"):
            label += f" ({'/'.join(actual)})"
        if not ok:
            lines.append(f"{label:40}  {w:>1}  {rs[0].error}")
            continue
        first, worker, server, total = medians((loader, method, w))
        base = ("fastq", "fork", w)
        if method == "photos":
            base = ("DataLoader", "photos", w)
        base_first, base_worker, _, _ = medians(base)
        spread = " ".join(f"{r.first_batch_s:.2f}" for r in ok)
        lines.append(
            f"{label:40}  {w:>1}  {first:13.3f}  {first / base_first:6.1f}  "
            f"{worker:13.0f}  {worker / base_worker:6.2f}  {server:9.0f}  "
            f"{total:8.0f}  {spread}"
        )
    return "\n".join(lines)


def _order(loader: str, method: str) -> int:
    every = CONFIGS + PHOTO_CONFIGS
    return every.index((loader, method)) if (loader, method) in every else 99


# ------------------------------------------------------------ one run


def _actual(method: str, server: int | None) -> str:
    """The start method a run used: its workers' parent is this process
    (fork) or a fork server."""
    if method not in ("default", "late", "photos"):
        return method
    return "fork" if server is None else "forkserver"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _measure(loader: str, method: str, workers: int) -> Run:
    import gc
    import os

    import torch.utils.data

    if method == "late" and torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # the model is on the GPU first
    if loader == "fastq.torch.DataLoader":
        import fastq.torch  # not before: the late import is what is timed

    import fastq

    from .torch_dataset import Images, SlowPhotos

    dataset: Any = Images(SAMPLES)
    options: dict[str, Any] = {"batch_size": BATCH_SIZE}
    if method == "photos":
        dataset = SlowPhotos(PHOTO_SAMPLES)
        options = {
            "batch_size": PHOTO_BATCH,
            "shuffle": True,
            "persistent_workers": True,
        }
    context = None if method in ("default", "late", "photos") else method
    gc.collect()
    t0 = time.perf_counter()
    if loader == "fastq":
        feed: Any = fastq.Prefetcher(
            dataset, batch_size=BATCH_SIZE, workers=workers, start_method=context
        )
        it = iter(feed)
        first = next(it)
        elapsed = time.perf_counter() - t0
        pids = [w["pid"] for w in feed.stats()["workers"]]
    else:
        kind = (
            fastq.torch.DataLoader
            if loader == "fastq.torch.DataLoader"
            else torch.utils.data.DataLoader
        )
        feed = kind(
            dataset, num_workers=workers, multiprocessing_context=context, **options
        )
        it = iter(feed)
        first = next(it)
        elapsed = time.perf_counter() - t0
        if loader == "DataLoader":
            pids = [p.pid for p in it._workers]
        else:
            pids = [w["pid"] for w in feed.stats()["workers"]]
    del first
    me = os.getpid()
    servers = {_parent(p) for p in pids} - {me}
    server = next(iter(servers), None)
    run = Run(
        loader,
        method,
        workers,
        first_batch_s=elapsed,
        worker_pss=[procstat.pss_bytes(p) for p in pids],
        server_pss=sum(procstat.pss_bytes(p) for p in servers),
        total_pss=procstat.total_pss(me),
        actual=_actual(method, server),
    )
    if loader == "DataLoader":
        del it
    else:
        feed.close()
    return run


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    run = _measure(job["loader"], job["method"], int(job["workers"]))
    print(json.dumps(asdict(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
