"""What a torchvision transform does to an image, read into a plain
``DecodePlan`` by duck typing (torchvision is never imported), and each
sample's box and flip under it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._crop import random_box, resize_centre_box, sample_rng


@dataclass(frozen=True)
class DecodePlan:
    """A recognised torchvision pipeline, as plain values (picklable).

    Attributes
    ----------
    size : tuple of int
        The output's (height, width).
    scale, ratio : tuple of float
        RandomResizedCrop's area fraction and aspect-ratio bounds.
    flip_p : float
        RandomHorizontalFlip's probability (0: no flip).
    mean, std : tuple of float
        Normalize's, per channel, on ToTensor's 0-1 scale (0 and 1 without a
        Normalize).
    antialias : bool
        Always True: torchvision resizes a PIL image with antialiasing.
    resize : int or None
        None for RandomResizedCrop; for a validation pipeline,
        ``Resize(resize)`` then ``CenterCrop(size)``: the box is then fixed,
        where the centre crop takes its pixels from.
    """

    size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip_p: float = 0.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    antialias: bool = True
    resize: int | None = None

    def crop(
        self, seed: int, epoch: int, index: int, height: int, width: int
    ) -> tuple[tuple[int, int, int, int], bool]:
        """Sample ``index``'s box ``(top, left, height, width)`` in an image
        of ``height`` x ``width``, and whether it is flipped: a function of
        (seed, epoch, index) alone, drawn box first, then flip."""
        if self.resize is not None:
            return resize_centre_box(height, width, self.resize, self.size), False
        rng = sample_rng(seed, epoch, index)
        box = random_box(rng, height, width, self.scale, self.ratio)
        flip = self.flip_p > 0 and bool(rng.random() < self.flip_p)
        return box, flip


class Unreadable(Exception):
    """A transform ``read_transform`` cannot turn into a plan; its message
    names the transform."""


def _is(transform: Any, name: str) -> bool:
    # torchvision's own classes only (v1 or v2): a subclass, or a class of
    # the same name elsewhere, may do something else.
    cls = type(transform)
    return cls.__name__ == name and cls.__module__.startswith("torchvision.")


def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if isinstance(size, Sequence) and len(size) == 1:
        return int(size[0]), int(size[0])
    height, width = size
    return int(height), int(width)


def _bilinear(transform: Any) -> bool:
    mode = getattr(transform, "interpolation", "bilinear")
    # InterpolationMode.BILINEAR, or PIL's constant in old torchvision.
    return getattr(mode, "value", mode) in ("bilinear", 2)


def _three(values: Any, what: str, transform: Any) -> tuple[float, float, float]:
    values = [float(v) for v in values]
    if len(values) == 1:
        values *= 3
    if len(values) != 3:
        raise Unreadable(f"{transform!r} ({what} for {len(values)} channels)")
    return values[0], values[1], values[2]


def read_transform(transform: Any) -> DecodePlan:
    """The DecodePlan of a torchvision ``Compose`` of RandomResizedCrop,
    RandomHorizontalFlip (optional), ToTensor and Normalize (optional), or
    of Resize, CenterCrop, ToTensor and Normalize (optional).

    Raises
    ------
    Unreadable
        Naming the first transform that does not fit either pipeline.
    """
    steps = list(getattr(transform, "transforms", [transform]))
    if not _is(transform, "Compose") or not steps:
        raise Unreadable(f"{transform!r} (not a torchvision Compose)")
    fields: dict[str, Any] = {}
    at = 0

    def stop(reason: str = "") -> Unreadable:
        step = steps[at] if at < len(steps) else "the end of the Compose"
        return Unreadable(f"{step!r}{f' ({reason})' if reason else ''}")

    first = steps[0]
    if _is(first, "RandomResizedCrop") and _bilinear(first):
        fields.update(
            size=_pair(first.size),
            scale=tuple(float(s) for s in first.scale),
            ratio=tuple(float(r) for r in first.ratio),
        )
        at = 1
        if at < len(steps) and _is(steps[at], "RandomHorizontalFlip"):
            fields["flip_p"] = float(steps[at].p)
            at += 1
    elif _is(first, "Resize") and _bilinear(first):
        size = first.size
        if isinstance(size, Sequence) and len(size) == 1:
            size = size[0]
        if not isinstance(size, int) or getattr(first, "max_size", None):
            raise stop("a Resize to one shorter-edge size, no max_size, is read")
        at = 1
        if at >= len(steps) or not _is(steps[at], "CenterCrop"):
            raise stop("a Resize is read when a CenterCrop follows it")
        fields.update(resize=size, size=_pair(steps[at].size))
        at += 1
    else:
        raise stop("expected RandomResizedCrop, or Resize, bilinear")
    if at >= len(steps) or not _is(steps[at], "ToTensor"):
        raise stop("expected ToTensor")
    at += 1
    if at < len(steps) and _is(steps[at], "Normalize"):
        fields["mean"] = _three(steps[at].mean, "mean", steps[at])
        fields["std"] = _three(steps[at].std, "std", steps[at])
        at += 1
    if at < len(steps):
        raise stop("nothing is read after ToTensor and Normalize")
    return DecodePlan(**fields)
