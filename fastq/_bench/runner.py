"""`python -m fastq bench`: choose transports, shapes, workers, slots and a
time budget, or a training loop's model and sizes; run every case (each in
a fresh interpreter by default); print a progress line per case and tables
with ratios; optionally JSON and a plot."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict

from . import cases, gpu_model_case, procstat, report, torch_startup, train
from .loop_sections import add_gpu_model, add_train
from .measure import Budget, Options, Result
from .session import Session
from .transports import FASTQ, PEERS, TRANSPORTS, Case
from .workloads import DEFAULT_WORKLOAD, SHAPES, WORKLOADS

SECTIONS = (
    "throughput",
    "latency",
    "handover",
    "startup",
    "steady",
    "compute",
    "decode",
    "torch-startup",
    "train",
    "gpu-model",
)
# Cases that run on the time budget (--seconds, --warmup, --blocks).
_BUDGETED = SECTIONS[:-3]
GROUPS = {
    "all": tuple(TRANSPORTS),
    "fastq-all": FASTQ,
    "peers": PEERS,
    "limits": ("memcpy-hot", "memcpy"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fastq bench",
        description="fastq next to a pickled multiprocessing.Queue (as Keras' "
        "GeneratorEnqueuer uses it, and blocking), PyTorch's DataLoader, "
        "faster-fifo, SPDL (thread pipeline, shared segment pool), torchdata's "
        "ParallelMapper (threads, processes) and a plain memcpy of the same "
        "bytes, in one run. Every "
        "producer does the same work per batch; warm-up is excluded; the "
        "median of timed blocks is reported.",
        epilog="With no options: throughput of every available transport on "
        f"the {DEFAULT_WORKLOAD} shape with 1 worker (about a minute).",
    )
    p.add_argument(
        "-t",
        "--transport",
        action="append",
        metavar="NAME",
        help="transports, repeatable or comma-separated: "
        f"{', '.join(TRANSPORTS)}, or a group: {', '.join(GROUPS)} "
        "(default: all)",
    )
    p.add_argument(
        "-s",
        "--shape",
        "-w",
        "--workload",
        action="append",
        metavar="SHAPE",
        dest="shape",
        help=f"batch shapes, repeatable or comma-separated: "
        f"{', '.join(SHAPES)}, or all (default: {DEFAULT_WORKLOAD})",
    )
    p.add_argument(
        "--workers",
        type=int,
        nargs="+",
        metavar="N",
        help="producer processes, one or more counts (default: 1)",
    )
    p.add_argument(
        "--slots",
        type=int,
        metavar="N",
        help="batches in flight ahead of the consumer: fastq slots=, "
        "queue maxsize, DataLoader prefetch_factor x workers "
        "(default: 2 per worker, fastq's and DataLoader's default)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="measured seconds per case, after warm-up (3)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=0.5,
        help="warm-up seconds per case, at least 3 batches (0.5)",
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=5,
        help="timed blocks per case; the median is reported (5)",
    )
    p.add_argument(
        "--case",
        action="append",
        choices=SECTIONS,
        dest="sections",
        help="what to measure, repeatable (default: throughput): "
        "latency = hand-over of paced small batches; handover = the "
        "consumer's own cost per batch, time inside next() with the batch "
        "waiting (small and medium shapes); startup = time "
        "to first batch under spawn; steady = system calls and page "
        "faults per batch (perf); compute = compute-bound workers (numpy "
        "augmentation); decode = compute-bound workers inflating images "
        "(zlib, which lets go of the GIL: where thread workers pay); "
        "torch-startup = first batch and worker memory with torch imported, "
        "per start method and beside DataLoader (workers 1 and 2 unless "
        "--workers; 5 runs unless --repeat; about 3 minutes); train = a "
        "training loop (JPEG decoding and augmentation in the workers, an SGD "
        "step) fed by torch's DataLoader, fastq.torch.DataLoader and "
        "TorchPrefetcher, beside the step on one batch reused (see the train "
        "options; on the CPU well under a minute); gpu-model = an H200's "
        "ResNet-18 loop, simulated (fastq/_bench/gpu_model_case.py): today's "
        "loaders and the GPU-decode rows at each --engine-rate, on any "
        "machine, in seconds",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="every shape, workers 1 and 2, and every --case",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per case; the run with the median rate is reported (1)",
    )
    p.add_argument(
        "--quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to SECONDS for the machine to be idle "
        "(under 10%% of the CPUs busy): for shared machines (0: do not wait)",
    )
    p.add_argument(
        "--perf",
        action="store_true",
        help="also count system calls per batch in throughput cases",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run cases in this process instead of one fresh "
        "interpreter each (faster; memory and start-up figures then "
        "include whatever earlier cases imported)",
    )
    train.add_options(p)
    gpu_model_case.add_options(p)
    p.add_argument("--json", metavar="FILE", help="write every result as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw GB/s per transport per shape (needs matplotlib)",
    )
    return p


def _expand(
    values: Sequence[str] | None,
    allowed: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    default: Sequence[str],
    what: str,
) -> list[str]:
    if not values:
        return list(default)
    out: list[str] = []
    for v in values:
        for name in filter(None, (x.strip() for x in v.split(","))):
            if name in allowed:
                if name not in out:
                    out.append(name)
            elif name in groups:
                out += [x for x in groups[name] if x not in out]
            else:
                raise SystemExit(
                    f"python -m fastq bench: unknown {what} {name!r}; "
                    f"choose from {', '.join([*allowed, *groups])}"
                )
    return out


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    sections = list(SECTIONS) if args.all else (args.sections or ["throughput"])
    shapes = _expand(
        args.shape,
        SHAPES,
        {"all": SHAPES},
        SHAPES if args.all else [DEFAULT_WORKLOAD],
        "shape",
    )
    transports = _expand(
        args.transport, list(TRANSPORTS), GROUPS, list(TRANSPORTS), "transport"
    )
    workers = args.workers or ([1, 2] if args.all else [1])
    if any(w < 1 for w in workers) or (args.slots is not None and args.slots < 1):
        raise SystemExit("python -m fastq bench: --workers and --slots must be >= 1")
    budget = Budget(args.seconds, args.warmup, args.blocks)

    plan: list[tuple[str, Callable[[Session], None]]] = []
    results: dict[str, list[Result]] = {s: [] for s in SECTIONS}
    text: list[str] = []

    def add(
        section: str,
        jobs: Sequence[tuple[Case, Options | None, Budget | None]],
        render: Callable[[list[Result]], None],
        before: Callable[[Session], None] | None = None,
    ) -> None:
        def go(session: Session) -> None:
            if before is not None:
                before(session)
            out = [session.run(section, c, o, b) for c, o, b in jobs]
            results[section] += out
            render(out)

        plan.append((section, go))
        counts.append(len(jobs))

    def add_compute(section: str) -> None:
        """A compute-bound section: its workload (named as the section)
        measured against workers x this process's own batch rate."""
        ideal: dict[int, float] = {}

        def measure_ideal(session: Session) -> None:
            if session.quiet > 0:
                procstat.wait_for_quiet(session.quiet)
            ideal.update(cases.compute_ideal(workers, section))
            session.records.append(
                {"section": f"{section}-ideal", "batches_per_s": ideal}
            )

        def compute_tables(out: list[Result]) -> None:
            w = WORKLOADS[section]
            text.append(
                f"Compute-bound ({section}): {w.describe()}; {w.note}. Ideal: "
                "workers x the batch rate of this process making batches "
                "alone (" + ", ".join(f"{k}: {v:.2f}/s" for k, v in ideal.items()) + ")"
            )
            text.append(report.compute_table(out, ideal) + "\n")

        jobs = cases.compute(transports, workers, args.slots, section)
        add(section, [(c, None, None) for c in jobs], compute_tables, measure_ideal)

    counts: list[int] = []
    if "throughput" in sections:
        jobs = [
            (c, Options(perf=args.perf), None)
            for c in cases.throughput(shapes, transports, workers, args.slots)
        ]

        def tables(out: list[Result]) -> None:
            groups: dict[tuple[str, int], list[Result]] = {}
            for r in out:
                groups.setdefault((r.case["workload"], r.case["workers"]), []).append(r)
            for (shape, w), rs in groups.items():
                text.append(report.heading(shape, w, int(rs[0].case["slots"])))
                text.append(report.throughput_table(rs) + "\n")

        add("throughput", jobs, tables)
    if "latency" in sections:
        add(
            "latency",
            [(c, None, None) for c in cases.latency(transports, args.slots)],
            lambda out: text.extend(
                [
                    f"Hand-over latency: {cases.LATENCY_WORKLOAD} batches made every "
                    f"{cases.LATENCY_PACE_S * 1e3:g} ms, time from 'batch made' in the "
                    "producer to 'batch in hand' in the consumer",
                    report.latency_table(out) + "\n",
                ]
            ),
        )
    if "handover" in sections:
        add(
            "handover",
            [
                (c, Options(drain=True), None)
                for c in cases.handover(transports, args.slots)
            ],
            lambda out: text.extend(
                [
                    "The consumer's cost per batch: each next() timed alone, "
                    f"the producer {cases.HANDOVER_SLOTS - 1} batches ahead "
                    "(every call finds its batch waiting; memcpy: the consumer "
                    "copies the batch's bytes itself; x = ratio of medians)",
                    report.handover_table(out) + "\n",
                ]
            ),
        )
    if "startup" in sections:
        first = Options(first_only=True)
        add(
            "startup",
            [(c, first, None) for c in cases.startup(transports, args.slots)],
            lambda out: text.extend(
                [
                    f"Time to first batch: {cases.STARTUP_WORKLOAD}, start method "
                    f"{cases.STARTUP_METHOD}, from construction to the first batch in "
                    f"hand (median of {cases.STARTUP_REPEATS} fresh processes)",
                    report.startup_table(out) + "\n",
                ]
            ),
        )
    if "steady" in sections:
        add(
            "steady",
            [(c, o, None) for c, o in cases.steady(transports, args.slots)],
            lambda out: text.extend(
                [
                    "Steady state, per batch (perf stat; c = consumer, p = all "
                    "producer processes; ready = batches waiting in the ring)",
                    report.steady_table(out) + "\n",
                ]
            ),
        )
    for section in ("compute", "decode"):
        if section in sections:
            add_compute(section)

    if "torch-startup" in sections:
        torch_workers = args.workers or list(torch_startup.WORKERS)
        torch_repeats = args.repeat if args.repeat > 1 else torch_startup.REPEATS

        def torch_runs(session: Session) -> None:
            if importlib.util.find_spec("torch") is None:
                session.skipped.add("torch-startup: skipped, torch is not installed")
                return

            def progress(r: torch_startup.Run) -> None:
                session.done += 1
                print(
                    f"[{session.done:3}/{session.total}] torch-startup "
                    f"{torch_startup.describe(r)}",
                    file=sys.stderr,
                    flush=True,
                )
                session.records.append({"section": "torch-startup", **asdict(r)})

            runs = torch_startup.run_all(torch_workers, torch_repeats, progress)
            text.append(
                "Start-up with torch imported by the script: from construction "
                "to the first batch in hand, and each worker's PSS then (shared "
                "pages counted once across processes); medians of "
                f"{torch_repeats} fresh processes, ratios to fastq's fork (the "
                "photos rows: 3x224x224 uint8 samples of 3 ms, batch 128, "
                "shuffled, persistent workers; ratios to DataLoader's)"
            )
            text.append(torch_startup.table(runs) + "\n")

        plan.append(("torch-startup", torch_runs))
        counts.append(
            (
                len(torch_workers) * len(torch_startup.CONFIGS)
                + len(torch_startup.PHOTO_WORKERS) * len(torch_startup.PHOTO_CONFIGS)
            )
            * torch_repeats
        )

    if "train" in sections:
        add_train(args, plan, counts, text)
    if "gpu-model" in sections:
        add_gpu_model(args, plan, counts, text)

    command = "python -m fastq bench" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[2:] if argv is None else argv)
    )
    print(f"fastq bench on {report.machine()}")
    print(f"command: {command}")
    print(f"load average before: {_load()}")
    if args.repeat > 1 or args.quiet:
        print(
            f"each case: median of {args.repeat} run(s)"
            + (
                f", each after waiting up to {args.quiet:g} s for an idle machine"
                if args.quiet
                else ""
            )
        )
    if any(s in _BUDGETED for s in sections):
        where = "in this process" if args.in_process else "each case in a fresh process"
        print(
            f"{budget.seconds:g} s per case after {budget.warmup_s:g} s warm-up, "
            f"median of {budget.blocks} blocks; {where}"
        )
    print(flush=True)
    session = Session(args, budget, sum(counts))
    t0 = time.perf_counter()
    for _, go in plan:
        go(session)
    print()
    print("\n".join(text))
    for note in sorted(session.skipped):
        print(f"note: {note}")
    if any(s in _BUDGETED for s in sections):
        print(report.legend())
    print(f"\n{time.perf_counter() - t0:.0f} s; load average after: {_load()}")
    if args.json:
        report.write_json(
            args.json,
            {
                "machine": report.machine(),
                "command": command,
                "budget": vars(budget),
                "results": session.records,
            },
        )
        print(f"wrote {args.json}")
    if args.plot:
        why = report.plot(results["throughput"], args.plot)
        print(why or f"wrote {args.plot}")
    return 0
