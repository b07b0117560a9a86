"""The training bench's JPEG set, measured: what its files are (size in
bytes and pixels, progressive and grayscale shares), what a worker's CPU
spends per image decoding one as the training pipeline does (PIL decode,
RandomResizedCrop's box and resize, flip, uint8 CHW:
``fastq._bench.train_data.Images``), and what it spends per image when the
GPU decodes instead (the file's bytes read, its header parsed, the box and
flip drawn from the per-sample generator), one process, files in the page
cache.

    python benchmarks/jpeg_set.py [--files N] [--side 224] [--data DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fastq._bench import train_data


def describe(paths: Sequence[str]) -> str:
    from PIL import Image

    sizes = np.array([os.path.getsize(p) for p in paths], dtype=np.float64)
    dims, progressive, gray = [], 0, 0
    for p in paths:
        with Image.open(p) as f:
            dims.append(f.size)
            progressive += bool(f.info.get("progressive") or f.info.get("progression"))
            gray += f.mode == "L"
    d = np.array(dims, dtype=np.float64)
    p5, p50, p95 = np.percentile(sizes, [5, 50, 95]) / 1e3
    return (
        f"{len(paths)} files: {sizes.mean() / 1e3:.0f} KB a file on average "
        f"(median {p50:.0f}, 5-95% {p5:.0f}-{p95:.0f}); {d[:, 0].mean():.0f} x "
        f"{d[:, 1].mean():.0f} pixels on average (median "
        f"{np.median(d[:, 0]):.0f} x {np.median(d[:, 1]):.0f}, "
        f"{(d[:, 0] * d[:, 1]).mean() / 1e6:.3f} MP); {progressive} progressive, "
        f"{gray} grayscale"
    )


def header_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the header: fastq.vision's reader where it is
    installed, else PIL's (which reads the header alone until asked for
    pixels)."""
    try:
        from fastq.vision import image_header
    except ImportError:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as f:
            return f.size[1], f.size[0]
    height, width, _ = image_header(data)
    return height, width


def encoded_sample(path: str, index: int, seed: int = 0, epoch: int = 0) -> Any:
    """What a worker does per image when the GPU decodes: the bytes, the
    header's size, RandomResizedCrop's box and the flip from the
    per-sample generator (SeedSequence([seed, epoch, index]))."""
    with open(path, "rb") as f:
        data = f.read()
    height, width = header_size(data)
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch, index]))
    area = height * width
    box = (0, 0, height, width)
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        w = round(float(np.sqrt(target * aspect)))
        h = round(float(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            box = (
                int(rng.integers(0, height - h + 1)),
                int(rng.integers(0, width - w + 1)),
                h,
                w,
            )
            break
    flip = rng.random() < 0.5
    return np.frombuffer(data, dtype=np.uint8), box, flip


def per_image_us(work: Callable[[int], Any], count: int, rounds: int) -> float:
    """CPU microseconds per image: the median over ``rounds`` passes of
    ``work(i)`` for i < count."""
    work(0)
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for i in range(count):
            work(i)
        times.append((time.process_time() - t0) / count)
    return statistics.median(times) * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--side", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "fastq-train-images")
    )
    args = p.parse_args(argv)
    paths = train_data.make_files(args.data, args.files, args.side)
    print(describe(paths))
    images = train_data.Images(paths, args.side, classes=1000)
    decode = per_image_us(lambda i: images[i], len(paths), args.rounds)
    encoded = per_image_us(
        lambda i: encoded_sample(paths[i], i), len(paths), args.rounds
    )
    print(
        f"worker CPU per image, median of {args.rounds} passes: decoding on "
        f"the CPU (PIL, {args.side}-pixel RandomResizedCrop, flip, uint8 CHW) "
        f"{decode:,.0f} us; for the GPU's decode (read, header, box and "
        f"flip) {encoded:,.0f} us: {encoded / decode:.3f} of it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
