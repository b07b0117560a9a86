"""`python -m fastq bench --case gpu-model`: the rows it simulates
(fastq/_bench/gpu_timeline.py), the check of today's loaders against the
H200's figures, the table, and the case's options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from . import decode_model as dm
from .gpu_timeline import CEILING, CPU_LOADERS, GPU_DECODE, Result, Row


def today_stages() -> list[dm.Stage]:
    """The code as it is today: the stage's host work per image at either
    end of its measured range, one Decoder; and torchvision's route."""
    low, high = dm.STAGE_HOST_US_TODAY
    return [
        dm.Stage(f"today's stage ({low:g} us/image), one Decoder", host_us=low),
        dm.Stage(f"today's stage ({high:g} us/image), one Decoder", host_us=high),
        dm.Stage(
            f"today's stage ({low:g} us/image), torchvision, Pillow files on "
            "the stage's thread",
            backend="torchvision",
            host_us=low,
        ),
    ]


SHIPPED = "shipped"
# The hybrid row's CPU threads: about the cores that the workers (reading
# encoded files), the loop's thread and the stage's leave of 16.
HYBRID_THREADS = 12


def batched_stages(engine_rate: float) -> list[dm.Stage]:
    """The batched stage (host work at its target), with one and two
    Decoders, and each second source of capacity; the shipped row last."""
    share = round(dm.balanced_worker_share(engine_rate), 2)
    batched = dm.Stage("batched stage, one Decoder")
    two = batched.but(name="batched stage, two Decoders", decoders=2)
    return [
        batched,
        two,
        two.but(
            name=f"batched stage, two Decoders, hybrid: 25% of the files on "
            f"{HYBRID_THREADS} nvImageCodec CPU threads",
            hybrid_share=0.25,
            cpu_threads=HYBRID_THREADS,
        ),
        batched.but(
            name=f"batched stage, one Decoder, workers decode {share:.0%} to pixels",
            worker_share=share,
        ),
        two.but(
            name=f"{SHIPPED}: batched stage, two Decoders, workers decode "
            f"{share:.0%} to pixels",
            worker_share=share,
        ),
    ]


def plan(
    engine_rates: Sequence[float], models: Sequence[str] = ("resnet18",)
) -> list[Row]:
    rows: list[Row] = []
    for model in models:
        rows.append(Row(model, CEILING))
        rows += [Row(model, loader) for loader in CPU_LOADERS]
        for rate in engine_rates:
            for stage in (*today_stages(), *batched_stages(rate)):
                rows.append(Row(model, GPU_DECODE, stage, rate))
    return rows


def calibrated(r: Result) -> bool | None:
    """Whether a CPU loader's modelled fraction of the ceiling lies in the
    H200's measured range for it, give or take CALIBRATION_TOLERANCE; None
    for a row the H200 has no figure for."""
    measured = dm.H200_INPUT_BOUND_FRACTION.get(r.row.loader)
    if measured is None or r.row.model != "resnet18":
        return None
    tol = dm.CALIBRATION_TOLERANCE
    return min(measured) - tol <= r.of_ceiling <= max(measured) + tol


def calibration(results: Sequence[Result]) -> list[str]:
    """Each CPU loader's modelled fraction against the H200's two runs."""
    lines = []
    for r in results:
        ok = calibrated(r)
        if ok is None:
            continue
        measured = dm.H200_INPUT_BOUND_FRACTION[r.row.loader]
        lines.append(
            f"{r.row.loader}: modelled {r.of_ceiling:.2f} of the ceiling, measured "
            f"{min(measured):.2f}-{max(measured):.2f} on the H200: "
            + ("within" if ok else "OUTSIDE")
            + f" +-{dm.CALIBRATION_TOLERANCE:g}"
        )
    return lines


INTRO = (
    "GPU-timeline model, simulated (fastq/_bench/gpu_timeline.py on "
    "fastq/_bench/event_sim.py; its inputs in fastq/_bench/decode_model.py): "
    "one H200 with 16 vCPUs, batch 128, {workers} workers. Measured on the "
    "H200: the step ({gpu:.1f} ms of GPU, {cpu:.1f} ms of the loop's CPU, "
    "all of it holding the GIL). Measured on a CPU: the workers' CPU per "
    "image (train bench: DataLoader {dl:,.0f} us, fastq {fq:,.0f} us; "
    "encoded only {enc:g} us), a file decoded on a CPU thread {cpu_dec:,.0f} us, "
    "{other:.0%} of files the engines do not take, the stage's host work "
    "(today {today_lo:g}-{today_hi:g} us/image, batched {batched:g}). Assumed: "
    "the engines' rate (the rows' column), the decode call's submit "
    "{submit:g} us/image, the stage's kernels {post:g} us/image. "
    "{steps} steps after {warmup}. A model, not a GPU's measurement"
)


def intro() -> str:
    row = Row("resnet18", CEILING)
    return INTRO.format(
        workers=dm.WORKERS,
        gpu=dm.step_gpu_ms("resnet18"),
        cpu=dm.step_cpu_ms("resnet18"),
        dl=dm.worker_us("DataLoader"),
        fq=dm.worker_us("fastq.torch.DataLoader"),
        enc=dm.ENCODED_US_PER_IMAGE,
        cpu_dec=dm.CPU_DECODE_US_PER_IMAGE,
        other=dm.OTHER_SHARE,
        today_lo=dm.STAGE_HOST_US_TODAY[0],
        today_hi=dm.STAGE_HOST_US_TODAY[1],
        batched=dm.STAGE_HOST_US_BATCHED,
        submit=dm.SUBMIT_US_PER_IMAGE,
        post=dm.POST_US_PER_IMAGE,
        steps=row.steps,
        warmup=row.warmup,
    )


_SHOWN = ("GIL", "JPEG engines", "SMs", "cores", "workers", "stage thread")


def table(results: Sequence[Result]) -> str:
    lines = [
        "| model | row | engine images/s | images/s | of the ceiling | "
        + " | ".join(f"{k} busy" for k in _SHOWN)
        + " | engines idle ms/batch | the stage thread's time | bound by |",
        "|---|---|---|---|---|" + "---|" * len(_SHOWN) + "---|---|---|",
    ]
    for r in results:
        rate = "-" if r.row.engine_rate is None else f"{r.row.engine_rate:,.0f}"
        idle = f"{r.engine_idle_ms_per_batch:.2f}" if r.row.stage else "-"
        lines.append(
            f"| {r.row.model} | {r.row.name} | {rate} | {r.images_per_s:,.0f} | "
            f"{r.of_ceiling:.2f} | "
            + " | ".join(f"{r.busy[k]:.0%}" for k in _SHOWN)
            + f" | {idle} | {_phases(r)} | {r.bound_by} |"
        )
    return "\n".join(lines)


def _phases(r: Result) -> str:
    phases = r.extra.get("stage thread", {})
    shown = [f"{k} {v:.0%}" for k, v in phases.items() if v >= 0.05]
    return ", ".join(shown) or "-"


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of `--case gpu-model`, as a group of the bench's parser."""
    g = p.add_argument_group("--case gpu-model")
    g.add_argument(
        "--engine-rate",
        type=float,
        action="append",
        metavar="N",
        help="the JPEG engines' images/s of the bench's files, repeatable "
        f"(default: {', '.join(f'{r:g}' for r in dm.ENGINE_RATES)})",
    )


def engine_rates(args: argparse.Namespace) -> tuple[float, ...]:
    rates = tuple(getattr(args, "engine_rate", None) or dm.ENGINE_RATES)
    for r in rates:
        if r <= 0:
            raise SystemExit(
                f"python -m fastq bench --case gpu-model: --engine-rate {r:g}: "
                "give a positive images/s, e.g. --engine-rate 7000"
            )
    return rates
