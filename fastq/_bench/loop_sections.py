"""The training-loop sections of `python -m fastq bench`: `--case train`
(a real training loop fed by each loader) and `--case gpu-model` (the GPU
loop, simulated), each planned onto a session."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict

from . import gpu_model_case, gpu_timeline, procstat, train
from .session import Session


def add_train(
    args: argparse.Namespace,
    plan: list[tuple[str, Callable[[Session], None]]],
    counts: list[int],
    text: list[str],
) -> None:
    """Plans `--case train`: refuses options that cannot be before anything
    runs; skips it, saying why, where a package it needs is missing."""
    why = train.missing()
    if why is not None:
        plan.append(("train", lambda session: session.skipped.add(why)))
        counts.append(0)
        return
    try:
        configs = train.plan_from(args)
    except ValueError as exc:
        raise SystemExit(f"python -m fastq bench --case train: {exc}") from None
    repeats = max(1, int(args.repeat))

    def train_runs(session: Session) -> None:
        from .train_data import make_files

        first = configs[0]
        print(
            f"train: {first.images} JPEG files for {first.image_size}-pixel "
            f"crops in {first.data}",
            file=sys.stderr,
            flush=True,
        )
        make_files(first.data, first.images, first.image_size)

        def progress(r: train.Run) -> None:
            session.done += 1
            print(
                f"[{session.done:3}/{session.total}] train {train.describe(r)}",
                file=sys.stderr,
                flush=True,
            )
            session.records.append({"section": "train", **asdict(r)})

        def quiet() -> None:
            if session.quiet > 0:
                procstat.wait_for_quiet(session.quiet)

        runs = train.run_all(configs, repeats, progress, quiet)
        text.append(f"{train.software(first.device)}. {train.INTRO}\n")
        text.append(train.table(runs, repeats) + "\n")

    plan.append(("train", train_runs))
    counts.append(len(configs) * repeats)


def add_gpu_model(
    args: argparse.Namespace,
    plan: list[tuple[str, Callable[[Session], None]]],
    counts: list[int],
    text: list[str],
) -> None:
    """Plans `--case gpu-model`: the simulated rows at each --engine-rate
    (simulated time: seconds on any machine, whatever its load)."""
    rows = gpu_model_case.plan(gpu_model_case.engine_rates(args))

    def model_runs(session: Session) -> None:
        results = []
        for row in rows:
            r = gpu_timeline.simulate(row)
            results.append(r)
            session.done += 1
            rate = "" if row.engine_rate is None else f" at {row.engine_rate:,.0f}/s"
            print(
                f"[{session.done:3}/{session.total}] gpu-model {row.model} "
                f"{row.name}{rate}: {r.images_per_s:,.0f} img/s, "
                f"{r.of_ceiling:.2f} of the ceiling, bound by {r.bound_by}",
                file=sys.stderr,
                flush=True,
            )
            session.records.append({"section": "gpu-model", **asdict(r)})
        text.append(gpu_model_case.intro() + "\n")
        text.append(gpu_model_case.table(results) + "\n")
        text.append(
            "Calibration, today's loaders input-bound on the H200: "
            + "; ".join(gpu_model_case.calibration(results))
            + "\n"
        )

    plan.append(("gpu-model", model_runs))
    counts.append(len(rows))
