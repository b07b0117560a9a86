"""The training benchmark's input: JPEG files made once from the sample
pictures matplotlib ships, and a dataset that decodes and augments them per
sample as a torchvision ImageNet training pipeline does."""

from __future__ import annotations

import math
import os
import random
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np

# Bump when what a file holds changes, so that an old cache is not reused.
_FORMAT = "v2"
_SEED = 20260501
# NOTE [ An ImageNet-like set ]
# ImageNet's training photos are mostly 500 x 375 (or 375 x 500) for
# 224-pixel crops, about 110 KB a file, and a few of them are progressive
# or grayscale JPEGs, which a GPU's hardware decoder does not take. The
# files follow that, scaled by the crop's side (500 px for 224): a longer
# side of 0.85-1.15 x (side x 500 / 224); 60% of them 4:3, 15% 3:4, the
# rest of a ratio between 2:3 and 3:2; per-pixel grain (photographs'
# sensor noise, which is what makes their files that large) and a JPEG
# quality of 86-95 (about 110 KB a file at 224); 2% progressive and 2%
# grayscale.
_LONGER_PER_SIDE = 500 / 224
_LONGER_SPREAD = (0.85, 1.15)
_GRAIN = (8.0, 20.0)  # the grain's standard deviation, 0-255 scale
_QUALITY = (86, 96)
PROGRESSIVE_SHARE = 0.02
GRAYSCALE_SHARE = 0.02
# Below this many missing files, making them here beats starting a pool.
_POOL_FROM = 256

# NOTE [ Benchmark pictures ]
# No download: the files are made from the two pictures matplotlib ships
# that look like photographs, its portrait of Grace Hopper (a JPEG) and its
# Jacksboro fault elevation map rendered as shaded relief. Each file is a
# random crop of one of them, resized, its colours scaled per channel and
# re-encoded at a random JPEG quality: every file decodes to different
# pixels, and file i is the same on every run (its randomness is seeded by
# i), given the same Pillow.


def default_dir() -> str:
    """Where the files are kept between runs: under the system's temp dir."""
    return os.path.join(tempfile.gettempdir(), "fastq-train-images")


def file_paths(root: str, count: int, size: int) -> list[str]:
    """The paths of the first `count` files for `size`-pixel crops."""
    folder = os.path.join(root, f"{size}px-{_FORMAT}")
    return [os.path.join(folder, f"{i:07d}.jpg") for i in range(count)]


def make_files(root: str, count: int, size: int) -> list[str]:
    """Makes whichever of the first `count` files are missing (in a pool of
    processes when there are many) and returns every path."""
    paths = file_paths(root, count, size)
    missing = [i for i, p in enumerate(paths) if not os.path.exists(p)]
    if not missing:
        return paths
    os.makedirs(os.path.dirname(paths[0]), exist_ok=True)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if len(missing) < _POOL_FROM or cpus < 2:
        _make_some(paths[0], missing, size)
        return paths
    chunks = [missing[k::cpus] for k in range(cpus)]
    # spawn: the caller may have imported torch or touched CUDA.
    with ProcessPoolExecutor(cpus, mp_context=get_context("spawn")) as pool:
        list(pool.map(_make_some, [paths[0]] * cpus, chunks, [size] * cpus))
    return paths


def _make_some(first_path: str, indices: Sequence[int], size: int) -> int:
    folder = os.path.dirname(first_path)
    sources = _sources()
    for i in indices:
        path = os.path.join(folder, f"{i:07d}.jpg")
        # Written aside, then renamed: a run killed halfway, or another run
        # making the same file, never leaves a truncated JPEG under its name.
        tmp = f"{path}.{os.getpid()}.tmp"
        image, options = _make_one(i, size, sources)
        image.save(tmp, format="JPEG", **options)
        os.replace(tmp, path)
    return len(indices)


def _make_one(i: int, size: int, sources: Sequence[Any]) -> tuple[Any, dict[str, Any]]:
    """File i's picture and its JPEG options (NOTE [ An ImageNet-like set ])."""
    from PIL import Image

    rng = np.random.default_rng([_SEED, i])
    src = sources[i % len(sources)]
    width, height = src.size
    shape = rng.random()
    if shape < 0.6:
        aspect = 4 / 3
    elif shape < 0.75:
        aspect = 3 / 4
    else:
        aspect = math.exp(rng.uniform(math.log(2 / 3), math.log(3 / 2)))
    # The source's crop: a random share of its area at the file's ratio.
    area = rng.uniform(0.35, 1.0) * width * height
    w = min(width, round(math.sqrt(area * aspect)))
    h = min(height, round(w / aspect))
    left = int(rng.integers(0, width - w + 1))
    top = int(rng.integers(0, height - h + 1))
    longer = max(2, round(size * _LONGER_PER_SIDE * rng.uniform(*_LONGER_SPREAD)))
    out = (
        (longer, max(1, round(longer / aspect)))
        if aspect >= 1
        else (max(1, round(longer * aspect)), longer)
    )
    image = src.resize(
        out, Image.Resampling.BILINEAR, box=(left, top, left + w, top + h)
    )
    gains = rng.uniform(0.85, 1.15, 3)
    pixels = np.asarray(image, dtype=np.float32) * gains
    pixels += rng.normal(0.0, rng.uniform(*_GRAIN), pixels.shape).astype(np.float32)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    kind = rng.random()
    options: dict[str, Any] = {"quality": int(rng.integers(*_QUALITY))}
    if kind < PROGRESSIVE_SHARE:
        options["progressive"] = True
    elif kind < PROGRESSIVE_SHARE + GRAYSCALE_SHARE:
        image = image.convert("L")
    return image, options


def _sources() -> list[Any]:
    """The pictures of NOTE [ Benchmark pictures ], as RGB PIL images."""
    import matplotlib
    from matplotlib import cbook
    from matplotlib.colors import LightSource
    from PIL import Image

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as f:
        portrait = f.convert("RGB")
    with np.load(
        cbook.get_sample_data("jacksboro_fault_dem.npz", asfileobj=False)
    ) as dem:
        elevation = np.asarray(dem["elevation"], dtype=np.float64)
    shaded = LightSource(azdeg=315, altdeg=45).shade(
        elevation, cmap=matplotlib.colormaps["gist_earth"], blend_mode="overlay"
    )
    relief = Image.fromarray((shaded[..., :3] * 255).astype(np.uint8), "RGB")
    return [portrait, relief]


class Images:
    """Map-style dataset over JPEG files: sample i is (image, label, i), the
    image decoded with PIL, cropped and resized as torchvision's
    ``RandomResizedCrop(size)`` does (the same parameters; crop and bilinear
    resize in one PIL call), flipped left-right half the time, as a uint8
    array (3, size, size); the label is ``i % classes``. Its randomness comes
    from ``random``, which both loaders reseed in each worker."""

    def __init__(self, paths: Sequence[str], size: int, classes: int) -> None:
        self.paths = list(paths)
        self.size = size
        self.classes = classes

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(
        self, i: int
    ) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], np.int64, np.int64]:
        from PIL import Image

        with Image.open(self.paths[i]) as f:
            image = f if f.mode == "RGB" else f.convert("RGB")
            top, left, h, w = crop_box(image.size[0], image.size[1])
            out = image.resize(
                (self.size, self.size),
                Image.Resampling.BILINEAR,
                box=(left, top, left + w, top + h),
            )
        if random.random() < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        chw = np.ascontiguousarray(np.asarray(out).transpose(2, 0, 1))
        return chw, np.int64(i % self.classes), np.int64(i)


def crop_box(
    width: int,
    height: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a random crop, drawn as torchvision's
    ``RandomResizedCrop.get_params`` draws it: ten tries at a random area
    and aspect ratio, then the centre crop of the nearest allowed ratio."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return random.randint(0, height - h), random.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
