"""The JPEG engines on their own: nvImageCodec 0.9's batched decode called
directly (not through fastq's decode stage), on the training bench's files
in batches, in each configuration the decode stage could take, beside
torchvision's batched ``decode_jpeg``. For each: images/s, the CPU time
per image of the calling thread (``time.thread_time``) and of the whole
process (``os.times``: nvImageCodec's own threads included), and
``nvidia-smi dmon``'s jpg% over the run where nvidia-smi exists.

Each configuration runs whole passes over the files for ``--seconds`` at
least (one pass at least), after one warm-up batch per Decoder; a pass
ends with the device synchronized, so that images/s counts finished
decodes. Boxes are RandomResizedCrop's (torchvision's parameters, a fixed
seed). On ``--device cpu`` the configurations of nvImageCodec's CPU
backend run (CI runs them) and the GPU's are listed as skipped.

    python benchmarks/decode_engine.py [--device cuda|cpu] [--files 2048]
        [--batch 128] [--seconds 3] [--cpu-threads N] [--only a,b] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from jpg_utilization import JpgSampler

from fastq._bench import train_data
from fastq.vision import KIND_HW_JPEG, image_header

# The boxes' seed: the same boxes on every run and in every configuration.
BOX_SEED = 20260502


@dataclass(frozen=True)
class Sample:
    data: np.ndarray[Any, Any]  # the file's bytes, uint8
    box: tuple[int, int, int, int]  # top, left, height, width
    hardware: bool  # a baseline 3-component JPEG, the engines' kind


def load_samples(data_dir: str, count: int, side: int = 224) -> list[Sample]:
    """The first ``count`` bench files (made where missing), each with its
    RandomResizedCrop box."""
    paths = train_data.make_files(data_dir, count, side)
    rng_state = random.getstate()
    random.seed(BOX_SEED)
    try:
        out = []
        for p in paths:
            with open(p, "rb") as f:
                data = np.frombuffer(f.read(), np.uint8)
            height, width, kind = image_header(data)
            box = train_data.crop_box(width, height)
            out.append(Sample(data, box, kind == KIND_HW_JPEG))
        return out
    finally:
        random.setstate(rng_state)


@dataclass
class Row:
    name: str
    what: str
    cpu_threads: int = 0  # nvImageCodec's max_num_cpu_threads
    images: int = 0  # decoded over the measured passes
    rejected: int = 0  # returned as None (the configuration does not take them)
    seconds: float = 0.0
    images_per_s: float = 0.0
    thread_cpu_us_per_image: float = 0.0
    process_cpu_us_per_image: float = 0.0
    jpg_percent: float | None = None
    jpg_samples: int = 0
    jpg_why: str | None = None
    skipped: str | None = None
    error: str | None = None
    window: tuple[float, float] = field(default=(0.0, 0.0), repr=False)


# A configuration: (its decoders' backends, boxes or whole images, how many
# Decoders, how many calling threads). Backends are built per run: a
# function of nvImageCodec's module.
@dataclass(frozen=True)
class Config:
    name: str
    what: str
    backends: Callable[[Any], list[Any]] | None  # None: torchvision
    boxes: bool = True
    decoders: int = 1
    threads: int = 1
    cuda: bool = True
    cpu_threads: int | None = None  # nvImageCodec's, where not --cpu-threads


def _hw(nv: Any) -> list[Any]:
    return [nv.Backend(nv.BackendKind.HW_GPU_ONLY)]


def _split(share: float, adaptive: bool = False) -> Callable[[Any], list[Any]]:
    def backends(nv: Any) -> list[Any]:
        policy = (
            nv.LoadHintPolicy.ADAPTIVE_MINIMIZE_IDLE_TIME
            if adaptive
            else nv.LoadHintPolicy.FIXED
        )
        return [
            nv.Backend(
                nv.BackendKind.HW_GPU_ONLY, load_hint=share, load_hint_policy=policy
            ),
            nv.Backend(nv.BackendKind.HYBRID_CPU_GPU),
            nv.Backend(nv.BackendKind.CPU_ONLY),
        ]

    return backends


def _all_gpu(nv: Any) -> list[Any]:
    # Every path, in nvImageCodec's order of preference: the engines first,
    # then the CUDA, hybrid and CPU paths for what they leave.
    kinds = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU", "CPU_ONLY")
    return [nv.Backend(getattr(nv.BackendKind, k)) for k in kinds]


def _cpu(nv: Any) -> list[Any]:
    return [nv.Backend(nv.BackendKind.CPU_ONLY)]


# In order of what the summary needs most: a run cut short by its timeout
# keeps the rows before.
CONFIGS = (
    Config("hw-whole", "hardware engines only, whole images", _hw, boxes=False),
    Config("hw-boxes", "hardware engines only, boxes", _hw),
    Config("all-boxes", "hardware, CUDA, hybrid, CPU, boxes", _all_gpu),
    Config(
        "two-decoders",
        "hardware, CUDA, hybrid, CPU; two Decoders in turn, boxes",
        _all_gpu,
        decoders=2,
    ),
    Config(
        "torchvision",
        "torchvision decode_jpeg(list, device='cuda'), whole images, "
        "hardware-kind files",
        None,
        boxes=False,
    ),
    Config("split-0.75", "hardware 75%, hybrid the rest, boxes", _split(0.75)),
    Config(
        "adaptive",
        "hardware from 75%, ADAPTIVE_MINIMIZE_IDLE_TIME, hybrid the rest, boxes",
        _split(0.75, adaptive=True),
    ),
    Config("split-0.9", "hardware 90%, hybrid the rest, boxes", _split(0.9)),
    Config("split-0.5", "hardware 50%, hybrid the rest, boxes", _split(0.5)),
    Config(
        "split-0.75-4t",
        "hardware 75%, hybrid the rest on 4 CPU threads, boxes",
        _split(0.75),
        cpu_threads=4,
    ),
    Config(
        "two-threads",
        "hardware, CUDA, hybrid, CPU; two Decoders on two threads, boxes",
        _all_gpu,
        decoders=2,
        threads=2,
    ),
    Config(
        "cpu-whole",
        "nvImageCodec CPU backend, whole images",
        _cpu,
        boxes=False,
        cuda=False,
    ),
    Config("cpu-boxes", "nvImageCodec CPU backend, boxes", _cpu, cuda=False),
    Config(
        "cpu-two-decoders",
        "nvImageCodec CPU backend, two Decoders in turn, boxes",
        _cpu,
        decoders=2,
        cuda=False,
    ),
)


class Engine:
    """The decoders of one configuration, with their streams."""

    def __init__(self, cfg: Config, device: str, cpu_threads: int) -> None:
        self.cfg = cfg
        self.device = device
        self._streams: list[Any] = []
        if cfg.backends is None:
            import torch
            from torchvision.io import ImageReadMode, decode_jpeg

            self._decode_jpeg = decode_jpeg
            self._rgb = ImageReadMode.RGB
            self._torch = torch
            return
        from nvidia import nvimgcodec as nv

        self._nv = nv
        device_id = 0 if cfg.cuda else nv.NVIMGCODEC_DEVICE_CPU_ONLY
        self._decoders = [
            nv.Decoder(
                device_id=device_id,
                max_num_cpu_threads=cpu_threads,
                backends=cfg.backends(nv),
            )
            for _ in range(cfg.decoders)
        ]
        # As ImageFolder's Pillow loader gives them: RGB, stored orientation.
        self._params = nv.DecodeParams(
            color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False
        )
        if cfg.cuda:
            import torch

            self._torch = torch
            self._streams = [torch.cuda.Stream() for _ in self._decoders]

    def sources(self, batch: Sequence[Sample]) -> list[Any]:
        if self.cfg.backends is None:
            return [self._torch.from_numpy(s.data.copy()) for s in batch]
        nv = self._nv
        out = []
        for s in batch:
            stream = nv.CodeStream(s.data)
            if self.cfg.boxes:
                top, left, h, w = s.box
                stream = stream.get_sub_code_stream(
                    region=nv.Region(top, left, top + h, left + w)
                )
            out.append(stream)
        return out

    def decode(self, k: int, sources: list[Any]) -> list[Any]:
        """Batch k's sources, on Decoder k % decoders and its stream."""
        if self.cfg.backends is None:
            return list(self._decode_jpeg(sources, mode=self._rgb, device="cuda"))
        i = k % len(self._decoders)
        stream = self._streams[i].cuda_stream if self._streams else 0
        return list(
            self._decoders[i].decode(sources, params=self._params, cuda_stream=stream)
        )

    def sync(self) -> None:
        if self.cfg.cuda:
            self._torch.cuda.synchronize()


def _batches(samples: Sequence[Sample], cfg: Config, batch: int) -> list[list[Sample]]:
    if cfg.backends is None:  # torchvision's call fails a batch for one such file
        samples = [s for s in samples if s.hardware]
    return [list(samples[i : i + batch]) for i in range(0, len(samples), batch)]


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def measure(
    cfg: Config, samples: Sequence[Sample], batch: int, seconds: float, cpu_threads: int
) -> Row:
    """One configuration's row: whole passes for ``seconds`` at least."""
    row = Row(cfg.name, cfg.what, cpu_threads=cfg.cpu_threads or cpu_threads)
    engine = Engine(cfg, "cuda" if cfg.cuda else "cpu", row.cpu_threads)
    batches = _batches(samples, cfg, batch)
    warm = [  # one batch on each Decoder
        engine.decode(k, engine.sources(batches[k]))
        for k in range(min(len(batches), cfg.decoders))
    ]
    engine.sync()
    del warm
    lanes = [list(range(t, len(batches), cfg.threads)) for t in range(cfg.threads)]
    counts = [[0, 0, 0.0] for _ in lanes]  # decoded, rejected, thread CPU s

    failures: list[BaseException] = []
    held: list[Any] = []  # a pass's decoded images, alive until its sync

    def lane(t: int) -> None:
        try:
            run_lane(t)
        except BaseException as exc:  # raised again on the calling thread
            failures.append(exc)

    def run_lane(t: int) -> None:
        cpu0 = time.thread_time()
        for k in lanes[t]:
            # Sources are made in the timed loop, as the stage makes them.
            out = engine.decode(k, engine.sources(batches[k]))
            decoded = sum(x is not None for x in out)
            counts[t][0] += decoded
            counts[t][1] += len(out) - decoded
            held.append(out)
        counts[t][2] += time.thread_time() - cpu0

    wall0, stamp0, cpu0 = time.perf_counter(), time.time(), _cpu_s()
    while True:
        if cfg.threads == 1:
            lane(0)
        else:
            pool = [
                threading.Thread(target=lane, args=(t,)) for t in range(cfg.threads)
            ]
            for th in pool:
                th.start()
            for th in pool:
                th.join()
        if failures:
            raise failures[0]
        engine.sync()
        held.clear()
        if time.perf_counter() - wall0 >= seconds:
            break
    row.seconds = time.perf_counter() - wall0
    row.window = (stamp0, time.time())
    row.images = int(sum(c[0] for c in counts))
    row.rejected = int(sum(c[1] for c in counts))
    if row.images:
        row.images_per_s = row.images / row.seconds
        row.thread_cpu_us_per_image = sum(c[2] for c in counts) / row.images * 1e6
        row.process_cpu_us_per_image = (_cpu_s() - cpu0) / row.images * 1e6
    return row


def skipped_reason(cfg: Config, device: str) -> str | None:
    if cfg.cuda and device != "cuda":
        return "needs --device cuda"
    if not cfg.cuda and device == "cuda":
        return "the CPU backend's row (--device cpu)"
    import importlib.util

    module = "torchvision" if cfg.backends is None else "nvidia.nvimgcodec"
    if importlib.util.find_spec(module.split(".")[0]) is None or (
        module != "torchvision" and importlib.util.find_spec(module) is None
    ):
        return f"{module} is not installed"
    return None


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "torch", "torchvision"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[name] = md.version(name)
    return out


def table(rows: Sequence[Row]) -> str:
    head = (
        f"{'configuration':18} {'images/s':>9} {'rejected':>8} "
        f"{'thread CPU us/img':>17} {'process CPU us/img':>18} {'jpg%':>5}  what"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.skipped or r.error:
            lines.append(f"{r.name:18} {r.skipped or 'error: ' + str(r.error)}")
            continue
        jpg = "-" if r.jpg_percent is None else f"{r.jpg_percent:.0f}"
        lines.append(
            f"{r.name:18} {r.images_per_s:9,.0f} {r.rejected:8} "
            f"{r.thread_cpu_us_per_image:17,.0f} {r.process_cpu_us_per_image:18,.0f} "
            f"{jpg:>5}  {r.what}"
        )
    return "\n".join(lines)


def write(
    args: argparse.Namespace, rows: Sequence[Row], files: int, hardware: int
) -> None:
    if not args.json:
        return
    report = {
        "device": args.device,
        "files": files,
        "hardware_files": hardware,
        "batch": args.batch,
        "cpu_threads": args.cpu_threads,
        "cpus": os.cpu_count(),
        "seconds_per_configuration": args.seconds,
        "versions": versions(),
        "rows": [{k: v for k, v in asdict(r).items() if k != "window"} for r in rows],
    }
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--files", type=int, default=2048)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seconds", type=float, default=3.0, help="per configuration")
    p.add_argument(
        "--cpu-threads",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="nvImageCodec's max_num_cpu_threads (its hybrid and CPU paths; "
        "default: 8, or the CPUs where fewer)",
    )
    p.add_argument("--only", help="comma-separated configuration names")
    p.add_argument("--data", default=train_data.default_dir())
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {c.name for c in CONFIGS}
    if unknown:
        p.error(f"--only: unknown {', '.join(sorted(unknown))}")
    samples = load_samples(args.data, args.files)
    hardware = sum(s.hardware for s in samples)
    print(
        f"{len(samples)} files ({hardware} of the engines' kind), batches of "
        f"{args.batch}, {args.seconds:g} s per configuration at least, "
        f"{args.cpu_threads} nvImageCodec CPU threads; {versions()}",
        flush=True,
    )
    sampler = JpgSampler().start() if args.device == "cuda" else JpgSampler()
    if args.device != "cuda":
        sampler.why_not = "--device cpu"
    rows = []
    try:
        for cfg in CONFIGS:
            if only is not None and cfg.name not in only:
                continue
            why = skipped_reason(cfg, args.device)
            if why is not None:
                rows.append(Row(cfg.name, cfg.what, skipped=why))
                continue
            try:
                row = measure(cfg, samples, args.batch, args.seconds, args.cpu_threads)
            except Exception as exc:  # one configuration's failure is its row
                row = Row(cfg.name, cfg.what, error=f"{type(exc).__name__}: {exc}")
            rows.append(row)
            print(f"  {cfg.name}: {row.images_per_s:,.0f} images/s", flush=True)
            write(args, rows, len(samples), hardware)  # a run cut short keeps its rows
        measured = [r for r in rows if r.images]
        if measured:
            sampler.settle(max(r.window[1] for r in measured))
        for r in measured:
            w = sampler.window(*r.window)
            r.jpg_percent, r.jpg_samples = w["jpg_percent"], w["jpg_samples"]
            r.jpg_why = w.get("jpg_why")
    finally:
        sampler.stop()
    print(table(rows))
    write(args, rows, len(samples), hardware)
    return 0 if any(r.images for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
