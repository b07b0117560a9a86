"""fastq.vision's crop boxes are distributed as torchvision's
RandomResizedCrop.get_params draws them (torchvision's own draws recorded in
tests/data/crop_reference.npz by tests/data/make_crop_reference.py), stay
inside the image, fall back to the centre box as torchvision's do, and are
a function of (seed, epoch, index) alone."""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest

from fastq.vision import DecodePlan
from fastq.vision._crop import centre_box, sample_rng

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "crop_reference.npz")
CASES = ["375x500", "500x375", "48x400", "256x256_wide_bounds"]
# The two-sample Kolmogorov-Smirnov test's critical value at this level:
# c(alpha) * sqrt((n + m) / (n m)), c(alpha) = sqrt(-ln(alpha / 2) / 2).
ALPHA = 0.001


def reference(case: str) -> dict[str, Any]:
    with np.load(REFERENCE) as data:
        return {
            "boxes": data[f"{case}/boxes"].astype(np.int64),
            "image": tuple(int(v) for v in data[f"{case}/image"]),
            "scale": tuple(float(v) for v in data[f"{case}/scale"]),
            "ratio": tuple(float(v) for v in data[f"{case}/ratio"]),
        }


def fastq_boxes(case: str, n: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    ref = reference(case)
    height, width = ref["image"]
    plan = DecodePlan(size=(8, 8), scale=ref["scale"], ratio=ref["ratio"], flip_p=0.5)
    drawn = [plan.crop(seed, 3, index, height, width) for index in range(n)]
    boxes = np.array([box for box, _ in drawn], np.int64)
    flips = np.array([flip for _, flip in drawn], bool)
    return boxes, flips


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest distance
    between the two empirical distribution functions."""
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, points, side="right") / len(a)
    cdf_b = np.searchsorted(b, points, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def ks_critical(n: int, m: int, alpha: float = ALPHA) -> float:
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def features(boxes: np.ndarray, height: int, width: int) -> dict[str, np.ndarray]:
    top, left, h, w = boxes.T
    return {
        "area fraction": h * w / (height * width),
        "aspect ratio": w / h,
        # Where the box lies: its centre, as a fraction of the image.
        "centre row": (top + h / 2) / height,
        "centre column": (left + w / 2) / width,
    }


@pytest.fixture(scope="module")
def drawn() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {case: fastq_boxes(case, len(reference(case)["boxes"])) for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_boxes_are_distributed_as_torchvisions(drawn: Any, case: str) -> None:
    ref = reference(case)
    height, width = ref["image"]
    ours = features(drawn[case][0], height, width)
    theirs = features(ref["boxes"], height, width)
    critical = ks_critical(len(drawn[case][0]), len(ref["boxes"]))
    for name in ours:
        statistic = ks_statistic(ours[name], theirs[name])
        assert statistic < critical, (case, name, statistic, critical)


@pytest.mark.parametrize("case", CASES)
def test_as_many_boxes_fall_back_to_the_centre(drawn: Any, case: str) -> None:
    ref = reference(case)
    height, width = ref["image"]
    centre = np.array(centre_box(height, width, ref["ratio"]))
    ours = (drawn[case][0] == centre).all(axis=1).mean()
    theirs = (ref["boxes"] == centre).all(axis=1).mean()
    # Two proportions of 10,000: their difference's standard error is at
    # most 0.0071; 4.5 of it is far beyond chance.
    assert abs(ours - theirs) < 0.032, (ours, theirs)


@pytest.mark.parametrize("case", CASES)
def test_every_box_lies_inside_the_image(drawn: Any, case: str) -> None:
    height, width = reference(case)["image"]
    top, left, h, w = drawn[case][0].T
    assert (h > 0).all() and (w > 0).all()
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= height).all() and (left + w <= width).all()


def test_flips_are_half_and_independent_of_the_box(drawn: Any) -> None:
    boxes, flips = drawn["375x500"]
    assert abs(flips.mean() - 0.5) < 0.02  # 4 standard errors of 10,000
    big = boxes[:, 2] * boxes[:, 3] > np.median(boxes[:, 2] * boxes[:, 3])
    assert abs(flips[big].mean() - flips[~big].mean()) < 0.04


def test_a_uniform_aspect_ratio_is_told_apart() -> None:
    """The test above has the power to see a wrong sampler: the same
    algorithm with the ratio drawn uniformly rather than log-uniformly."""

    def wrong(rng: np.random.Generator, height: int, width: int) -> tuple[int, ...]:
        for _ in range(10):
            target = height * width * rng.uniform(0.08, 1.0)
            aspect = rng.uniform(3 / 4, 4 / 3)
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                return top, int(rng.integers(0, width - w + 1)), h, w
        return centre_box(height, width, (3 / 4, 4 / 3))

    ref = reference("375x500")
    boxes = np.array([wrong(sample_rng(7, 3, i), 375, 500) for i in range(10_000)])
    statistic = ks_statistic(
        features(boxes, 375, 500)["aspect ratio"],
        features(ref["boxes"], 375, 500)["aspect ratio"],
    )
    assert statistic > ks_critical(len(boxes), len(ref["boxes"])), statistic


def test_a_strip_too_thin_for_any_try_gets_the_clamped_centre_box() -> None:
    plan = DecodePlan(size=(8, 8))
    # 40 x 700: no box of 8% of the area at ratio <= 4/3 is 40 rows or less.
    for index in range(200):
        box, _ = plan.crop(1, 0, index, 40, 700)
        assert box == (0, 323, 40, 53)  # height 40, width round(40 * 4/3)
        box, _ = plan.crop(1, 0, index, 700, 40)
        assert box == (323, 0, 53, 40)  # width 40, height round(40 / (3/4))


def test_a_scale_above_one_always_falls_back() -> None:
    plan = DecodePlan(size=(8, 8), scale=(1.5, 2.0))
    for index in range(50):
        assert plan.crop(1, 0, index, 300, 400)[0] == (0, 0, 300, 400)
        assert plan.crop(1, 0, index, 100, 400)[0] == (0, 133, 100, 133)


def test_a_box_is_a_function_of_seed_epoch_and_index() -> None:
    plan = DecodePlan(size=(8, 8), flip_p=0.5)
    first = [plan.crop(5, 2, i, 375, 500) for i in range(100)]
    # In another order, as another worker would make them: the same.
    again = {i: plan.crop(5, 2, i, 375, 500) for i in reversed(range(100))}
    assert first == [again[i] for i in range(100)]
    assert first != [plan.crop(5, 3, i, 375, 500) for i in range(100)]
    assert first != [plan.crop(6, 2, i, 375, 500) for i in range(100)]
