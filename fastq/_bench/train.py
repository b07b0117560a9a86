"""`python -m fastq bench --case train`: a training loop fed by torch's
DataLoader, fastq.torch.DataLoader and TorchPrefetcher, beside the same
step on one batch held on the device, each loader in a fresh process.

What it needs: torch (the step, the models, DataLoader; the torch extra);
Pillow (JPEG encoding and decoding) and matplotlib (the sample pictures
the files are made from, see NOTE [ Benchmark pictures ]), both in the
bench extra; torchvision (the ResNets alone; the train extra, pinned beside
torch)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from .._faces._prefetcher import _cpus_per_rank, default_workers

# Re-exported: the runner reads them here.
from .fresh import run_in_turn, run_job
from .train_loop import DECODE_LOADERS as DECODE_LOADERS
from .train_loop import EVERY_LOADER as EVERY_LOADER
from .train_loop import LOADERS as LOADERS
from .train_loop import PSS_INTERVAL_S
from .train_loop import Config as Config
from .train_loop import Run as Run

# One run's limit, far above any run's need (the slowest: ResNet-50 on a
# small GPU, cuDNN's autotuning included), so that a hung run still ends.
_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Defaults:
    """What `--case train` runs where no option says otherwise."""

    models: tuple[str, ...]
    batch_size: int
    steps: int
    warmup: int
    image_size: int
    pin_memory: bool


# A GPU: ImageNet's training recipe, ResNet-18 (whose step outruns the CPUs'
# decoding: an input-bound loop) and ResNet-50 (a GPU-bound one). The CPU
# short form: small models and images, well under a minute on 2 cores.
GPU = Defaults(("resnet18", "resnet50"), 128, 100, 10, 224, True)
CPU = Defaults(("tiny", "cnn"), 32, 100, 5, 64, False)


INTRO = (
    "A training loop fed by each loader, each in a fresh process: images/s "
    "over the measured steps, the share of their wall time spent waiting in "
    "next(), the loop thread's CPU time per step, the time from the loader's "
    "construction to the first batch in hand, and the peak PSS of the process "
    f"and its children (sampled every {PSS_INTERVAL_S:g} s), and the "
    "workers' CPU time per image; ratios to torch's DataLoader and to the "
    "ceiling (the same step on one batch held on the device). The GPU-decode "
    "rows: fastq.torch.DataLoader over the files as a fastq.vision dataset "
    "with torchvision's ImageNet transform, decoded on the GPU by each "
    "backend (bf16, channels_last), with the decode stage's GPU time per "
    "batch and its peak GPU memory from its stats()"
)


def add_options(p: argparse.ArgumentParser) -> None:
    """The options of `--case train`, as a group of the bench's parser."""
    t = p.add_argument_group(
        "--case train",
        "Each loader in a fresh process, with the same workers (--workers, "
        "default: usable CPUs - 1), batch size and pin_memory; --repeat runs "
        "each that many times and reports the median. Defaults on a GPU: "
        f"{_describe(GPU)}; on the CPU: {_describe(CPU)}.",
    )
    t.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="tiny, cnn (small CNNs), resnet18, resnet50 (torchvision's), "
        "repeatable or comma-separated",
    )
    t.add_argument("--batch-size", type=int, metavar="N")
    t.add_argument("--steps", type=int, metavar="N", help="measured steps")
    t.add_argument(
        "--warmup-steps",
        type=int,
        metavar="N",
        help="steps before the measured ones, the first batch's included",
    )
    t.add_argument(
        "--images",
        type=int,
        metavar="N",
        help="JPEG files in the dataset (default: one epoch's worth)",
    )
    t.add_argument(
        "--image-size", type=int, metavar="N", help="side of the random crops"
    )
    t.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where the step runs (default: cuda where torch sees a GPU)",
    )
    t.add_argument(
        "--pin-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="page-locked batches (default: on with cuda)",
    )
    t.add_argument(
        "--data",
        metavar="DIR",
        help="where the JPEG files are made once and kept (default: "
        "fastq-train-images under the system's temp dir)",
    )
    t.add_argument(
        "--loader",
        action="append",
        metavar="NAME",
        help=f"some of {', '.join(EVERY_LOADER)}, repeatable or "
        "comma-separated (default: all; the GPU-decode rows on a GPU only)",
    )


def _describe(d: Defaults) -> str:
    return (
        f"{' and '.join(d.models)}, batch {d.batch_size}, {d.image_size}-pixel "
        f"crops, {d.steps} steps after {d.warmup}, "
        f"pin_memory {'on' if d.pin_memory else 'off'}"
    )


def _csv(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [x.strip() for v in values for x in v.split(",") if x.strip()]


def plan_from(args: argparse.Namespace) -> list[Config]:
    """plan() from the bench's parsed options (--workers is the bench's)."""
    return plan(
        models=_csv(args.model),
        workers=args.workers,
        loaders=_csv(args.loader),
        device=args.device,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup_steps,
        images=args.images,
        image_size=args.image_size,
        pin_memory=args.pin_memory,
        data=args.data,
    )


def missing() -> str | None:
    """Why the case cannot run here (a package it needs is absent), or None."""
    for module, why in (
        ("torch", "torch is not installed (the torch extra)"),
        ("PIL", "Pillow is not installed (the bench extra)"),
        ("matplotlib", "matplotlib is not installed (the bench extra)"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"train: skipped, {why}"
    return None


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def software(device: str) -> str:
    """The versions the runs used, and the GPU's name."""
    import PIL
    import torch

    parts = [f"torch {torch.__version__}", f"Pillow {PIL.__version__}"]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        parts.append(f"torchvision {importlib.metadata.version('torchvision')}")
    if device == "cuda":
        parts.append(torch.cuda.get_device_name())
    return ", ".join(parts)


def defaults(device: str) -> Defaults:
    return GPU if device == "cuda" else CPU


def step_threads(device: str, workers: int) -> int:
    """torch's intra-op threads for a CPU step: the CPUs the workers leave."""
    return max(1, _cpus_per_rank() - workers) if device == "cpu" else 1


def plan(
    models: Sequence[str] | None = None,
    workers: Sequence[int] | None = None,
    loaders: Sequence[str] | None = None,
    device: str | None = None,
    batch_size: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    images: int | None = None,
    image_size: int | None = None,
    pin_memory: bool | None = None,
    data: str | None = None,
) -> list[Config]:
    """One config per (model, workers, loader), every option left out taken
    from the device's Defaults: the device is CUDA where torch sees one,
    workers fastq's default (usable CPUs less one), and images enough for
    one epoch of the run. ValueError names an option that cannot be."""
    from .train_data import default_dir
    from .train_model import MODELS, torchvision_problem

    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: choose cpu or cuda")
    if device == "cuda" and default_device() != "cuda":
        raise ValueError("--device cuda: torch sees no CUDA device here")
    d = defaults(device)
    pin = d.pin_memory if pin_memory is None else pin_memory
    if pin and device != "cuda":
        raise ValueError("--pin-memory: page-locked batches need --device cuda")
    models = list(dict.fromkeys(models or d.models))
    for m in models:
        if m not in MODELS:
            raise ValueError(f"--model {m}: choose from {', '.join(MODELS)}")
    if any(m.startswith("resnet") for m in models):
        problem = torchvision_problem()
        if problem is not None:
            raise ValueError(problem)
    for name in loaders or ():
        if name not in EVERY_LOADER:
            raise ValueError(f"--loader {name}: choose from {', '.join(EVERY_LOADER)}")
    default = EVERY_LOADER if device == "cuda" else LOADERS
    loaders = sorted(set(loaders or default), key=EVERY_LOADER.index)
    batch = d.batch_size if batch_size is None else batch_size
    warm = d.warmup if warmup is None else warmup
    measured = d.steps if steps is None else steps
    side = d.image_size if image_size is None else image_size
    counts = list(dict.fromkeys(workers or [default_workers()]))
    numbers = {
        "--batch-size": batch,
        "--steps": measured,
        "--warmup-steps": warm,
        "--image-size": side,
        "--workers": min(counts),
    }
    for option, value in numbers.items():
        if value < 1:
            raise ValueError(f"{option} {value}: at least 1")
    count = (warm + measured) * batch if images is None else images
    if count < batch:
        raise ValueError(f"--images {count}: at least one batch ({batch})")
    base = Config(
        loader="",
        model="",
        device=device,
        batch_size=batch,
        workers=0,
        steps=measured,
        warmup=warm,
        images=count,
        image_size=side,
        pin_memory=pin,
        data=data or default_dir(),
        threads=1,
    )
    return [
        replace(
            base,
            model=m,
            workers=w,
            loader=loader,
            threads=step_threads(device, w),
        )
        for m in models
        for w in counts
        for loader in loaders
    ]


def run_once(cfg: Config) -> Run:
    """One run in a fresh interpreter."""
    return run_job(
        "fastq._bench.train_loop",
        asdict(cfg),
        Run.from_json,
        lambda why: Run(cfg, error=why),
        _TIMEOUT_S,
    )


def run_all(
    configs: Sequence[Config],
    repeats: int = 1,
    progress: Callable[[Run], None] | None = None,
    before: Callable[[], None] | None = None,
) -> list[Run]:
    """Every config `repeats` times, interleaved; `before` runs before
    each run."""
    return run_in_turn(configs, repeats, run_once, progress, before)


def label(cfg: Config) -> str:
    if cfg.loader == "TorchPrefetcher" and cfg.device != "cpu":
        return f"TorchPrefetcher(device={cfg.device!r})"
    if cfg.loader == "ceiling":
        return "ceiling: one batch, reused"
    return cfg.loader


def describe(r: Run) -> str:
    c = r.config
    head = f"{c.model} w={c.workers} {label(c)}"
    if r.error:
        return f"{head}: {r.error}"
    first = "" if r.first_batch_s is None else f", first batch {r.first_batch_s:.2f} s"
    return (
        f"{head}: {r.images_per_s:,.0f} images/s, waiting {100 * r.wait_share:.0f}%, "
        f"loop CPU {r.loop_cpu_ms:.1f} ms/step{first}, "
        f"workers' CPU {r.worker_cpu_us:,.0f} us/image, "
        f"peak PSS {r.peak_pss / 1e6:.0f} MB{_decode_figures(r)}"
    )


def _decode_figures(r: Run) -> str:
    """The decode stage's figures, for a GPU-decode row."""
    if r.config.loader not in DECODE_LOADERS or r.decode is None:
        return ""
    d = r.decode
    gpu = "-" if r.decode_gpu_ms is None else f"{r.decode_gpu_ms:.2f}"
    return (
        f"; decode stage: {d.get('backend')}, GPU {gpu} ms/batch, GPU memory "
        f"{d.get('gpu_bytes', 0) / 1e6:.0f} MB (peak "
        f"{d.get('peak_gpu_bytes', 0) / 1e6:.0f}), {d.get('per_image', 0)} "
        "files decoded with Pillow"
    )


def heading(cfg: Config, repeats: int) -> str:
    runs = f"; median of {repeats} runs (by images/s)" if repeats > 1 else ""
    return (
        f"Training loop, {cfg.model} on {cfg.device}: batch {cfg.batch_size}, "
        f"{cfg.image_size}x{cfg.image_size} crops of {cfg.images} JPEG files, "
        f"{cfg.workers} worker(s), pin_memory={cfg.pin_memory}"
        + (f", {cfg.threads} torch thread(s)" if cfg.device == "cpu" else "")
        + f"; {cfg.steps} steps after {cfg.warmup} warm-up{runs}"
    )


COLUMNS = (
    ("loader", 32),
    ("images/s", 9),
    ("x DataLoader", 12),
    ("x ceiling", 9),
    ("waiting", 7),
    ("loop CPU ms/step", 16),
    ("x DataLoader", 12),
    ("first batch s", 13),
    ("peak PSS MB", 11),
    ("x DataLoader", 12),
    ("workers' CPU us/image", 21),
    ("decode GPU ms/batch", 19),
    ("decode GPU MB peak", 18),
)


def _by_loader(runs: Sequence[Run]) -> dict[tuple[str, int, str], list[Run]]:
    groups: dict[tuple[str, int, str], list[Run]] = {}
    for r in runs:
        c = r.config
        groups.setdefault((c.model, c.workers, c.loader), []).append(r)
    return groups


def _median(rs: Sequence[Run]) -> Run:
    """The run of median images/s (a failed one where none succeeded)."""
    ok = sorted((r for r in rs if not r.error), key=lambda r: r.images_per_s)
    return ok[len(ok) // 2] if ok else rs[0]


def medians(runs: Sequence[Run]) -> list[Run]:
    """Per (model, workers, loader), the run of median images/s, in plan
    order."""
    return [_median(rs) for rs in _by_loader(runs).values()]


def table(runs: Sequence[Run], repeats: int = 1) -> str:
    """One table per (model, workers), ratios to DataLoader and to the
    ceiling; each loader's run is the median of its repeats, whose images/s
    the last column lists."""
    every = _by_loader(runs)
    groups: dict[tuple[str, int], list[Run]] = {}
    for rs in every.values():
        r = _median(rs)
        groups.setdefault((r.config.model, r.config.workers), []).append(r)
    columns = list(COLUMNS)
    if repeats > 1:
        columns.append(("images/s, each run", 18))
    blocks = []
    for rs in groups.values():
        rs.sort(key=lambda r: EVERY_LOADER.index(r.config.loader))
        by = {r.config.loader: r for r in rs if not r.error}
        base, ceiling = by.get("DataLoader"), by.get("ceiling")
        head = "  ".join(
            h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(columns)
        )
        lines = [heading(rs[0].config, repeats), head, "-" * len(head)]
        for r in rs:
            name = label(r.config)
            if r.error:
                lines.append(f"{name:{columns[0][1]}}  {r.error}")
                continue
            cells = [
                name,
                f"{r.images_per_s:,.0f}",
                _ratio(r.images_per_s, base.images_per_s if base else None),
                _ratio(r.images_per_s, ceiling.images_per_s if ceiling else None),
                f"{100 * r.wait_share:.0f}%",
                f"{r.loop_cpu_ms:.2f}",
                _ratio(r.loop_cpu_ms, base.loop_cpu_ms if base else None),
                "-" if r.first_batch_s is None else f"{r.first_batch_s:.3f}",
                f"{r.peak_pss / 1e6:.0f}",
                _ratio(r.peak_pss, base.peak_pss if base else None),
                f"{r.worker_cpu_us:,.0f}" if r.config.loader != "ceiling" else "-",
                "-" if r.decode_gpu_ms is None else f"{r.decode_gpu_ms:.2f}",
                "-"
                if r.decode is None
                else f"{r.decode.get('peak_gpu_bytes', 0) / 1e6:.0f}",
            ]
            if repeats > 1:
                c = r.config
                cells.append(
                    " ".join(
                        f"{x.images_per_s:.0f}"
                        for x in every[(c.model, c.workers, c.loader)]
                        if not x.error
                    )
                )
            lines.append(
                "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, (_, w)) in enumerate(zip(cells, columns))
                )
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _ratio(value: float, base: float | None) -> str:
    return "-" if not base else f"{value / base:.2f}"
