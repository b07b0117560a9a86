"""The training-loop sections of `python -m fastq bench`: `--case train`
(a real training loop fed by each loader) and `--case gpu-model` (the GPU
loop on the model of its timeline), each planned onto a session."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import asdict

from . import decode_model, gpu_timeline, procstat, train
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
    """Plans `--case gpu-model`; skips it, saying why, without torch."""
    if importlib.util.find_spec("torch") is None:
        plan.append(
            ("gpu-model", lambda s: s.skipped.add("gpu-model: torch is not installed"))
        )
        counts.append(0)
        return
    configs = gpu_timeline.plan(tuple(gpu_timeline.SHAPES))
    repeats = max(1, int(args.repeat))

    def model_runs(session: Session) -> None:
        def progress(r: gpu_timeline.Run) -> None:
            session.done += 1
            print(
                f"[{session.done:3}/{session.total}] gpu-model "
                f"{gpu_timeline.describe(r)}",
                file=sys.stderr,
                flush=True,
            )
            session.records.append({"section": "gpu-model", **asdict(r)})

        runs = gpu_timeline.run_all(configs, repeats, progress)
        text.append(gpu_timeline.intro(repeats) + "\n")
        text.append(gpu_timeline.table(runs) + "\n")
        text.append(decode_model.intro() + "\n")
        text.append(decode_model.table() + "\n")

    plan.append(("gpu-model", model_runs))
    counts.append(len(configs) * repeats)
