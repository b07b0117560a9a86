"""Each sample's crop box and flip, a function of (seed, epoch, index) alone.

NOTE [ The crop box ]
torchvision's ``RandomResizedCrop.get_params`` draws a box as follows, and
so does ``random_box``: up to ten tries, each drawing a target area uniform
in ``scale`` times the image's area and an aspect ratio (width / height)
whose logarithm is uniform between the logs of ``ratio``'s bounds; the
box's width and height are the rounded square roots of area x ratio and
area / ratio, and the first try that fits inside the image gets a top-left
corner uniform over the places it fits. When no try fits (very long or
very thin images, or a scale above 1), the box is the centre of the image,
as large as it can be with its aspect ratio clamped into ``ratio``.
Python's ``round`` (half to even) rounds, as torchvision's does.
"""

from __future__ import annotations

import math

import numpy as np

_MASK64 = (1 << 64) - 1
_TRIES = 10


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of dataset sample ``index`` in ``epoch``: its box and
    flip, whichever worker (or how many) makes it."""
    key = [seed & _MASK64, epoch & _MASK64, index & _MASK64]
    return np.random.default_rng(np.random.SeedSequence(key))


def random_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> tuple[int, int, int, int]:
    """A RandomResizedCrop box ``(top, left, height, width)`` inside an image
    of ``height`` x ``width`` (see NOTE [ The crop box ])."""
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_TRIES):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return centre_box(height, width, ratio)


def centre_box(
    height: int, width: int, ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """The fallback box: centred, its aspect ratio clamped into ``ratio``."""
    image_ratio = width / height
    if image_ratio < min(ratio):
        w = width
        h = round(w / min(ratio))
    elif image_ratio > max(ratio):
        h = height
        w = round(h * max(ratio))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def resize_centre_box(
    height: int, width: int, resize: int, crop: tuple[int, int]
) -> tuple[int, int, int, int]:
    """Where ``Resize(resize)`` then ``CenterCrop(crop)`` takes its pixels
    from, in the original image: the box that, resized to ``crop``, is
    that pipeline's output up to resampling at the box's edges."""
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(resize * long / short)
    new_h, new_w = (resize, new_long) if height <= width else (new_long, resize)
    crop_h, crop_w = crop
    # CenterCrop's corner in the resized image, mapped back by each axis's
    # own scale.
    top = round((new_h - crop_h) / 2.0) * height / new_h
    left = round((new_w - crop_w) / 2.0) * width / new_w
    h = min(height, max(1, round(crop_h * height / new_h)))
    w = min(width, max(1, round(crop_w * width / new_w)))
    top_i = min(max(0, round(top)), height - h)
    left_i = min(max(0, round(left)), width - w)
    return top_i, left_i, h, w
