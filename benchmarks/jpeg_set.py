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


def vision_dataset(paths: Sequence[str], side: int, encoded: bool) -> Any:
    """The files as fastq.vision.ImageFiles with the plan of torchvision's
    ImageNet training transform (RandomResizedCrop(side), a flip, ToTensor,
    Normalize): encoded, a sample is what a worker hands the GPU stage (the
    bytes, the header's size and kind, the box and flip drawn from the
    sample's generator); decoded, the same crop decoded with PIL."""
    import warnings

    from fastq.vision import DecodePlan, ImageFiles

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = ImageFiles([(p, 0) for p in paths], seed=0)
    dataset.decode_plan = DecodePlan(
        size=(side, side),
        flip_p=0.5,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
    )
    dataset.decode_on_gpu(encoded)
    return dataset


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
    encoded_set = vision_dataset(paths, args.side, encoded=True)
    other = sum(int(encoded_set[i]["kind"]) != 0 for i in range(len(paths)))
    encoded = per_image_us(lambda i: encoded_set[i], len(paths), args.rounds)
    decoded_set = vision_dataset(paths, args.side, encoded=False)
    decoded = per_image_us(lambda i: decoded_set[i], len(paths), args.rounds)
    print(
        f"{other} files the GPU's hardware engine does not take (fastq.vision's kind)"
    )
    print(
        f"worker CPU per image, median of {args.rounds} passes: the bench's "
        f"pipeline (PIL decode, {args.side}-pixel RandomResizedCrop, flip, "
        f"uint8 CHW) {decode:,.0f} us; fastq.vision decoding with PIL (the "
        f"same, float32 normalized) {decoded:,.0f} us; fastq.vision encoded, "
        f"for the GPU's decode (read, header, box and flip) {encoded:,.0f} "
        f"us: {encoded / decode:.3f} of the pipeline's"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
