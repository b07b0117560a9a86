"""Image files for fastq.vision's tests, made with Pillow from seeded
pixels (the same bytes wherever numpy and Pillow are the same versions),
and stand-ins for torchvision's transforms (torchvision does not import
beside the tests' torch): classes of the same names and attributes, in a
module named as torchvision's, which is what fastq.vision reads.

tests/data/make_*_reference.py import it too, to record torchvision's own
results on the same files."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

# name: (height, width, what to save). Every readable kind the GPU stage
# sorts: baseline YCbCr JPEGs of several sizes and qualities (one 4:4:4,
# one very wide, one very tall), a progressive one, grayscale, CMYK, PNG.
READABLE = {
    "baseline_375x500_q90": (375, 500, {"format": "JPEG", "quality": 90}),
    "baseline_480x320_q75": (480, 320, {"format": "JPEG", "quality": 75}),
    "baseline_333x333_444": (
        333,
        333,
        {"format": "JPEG", "quality": 95, "subsampling": 0},
    ),
    "baseline_40x700_wide": (40, 700, {"format": "JPEG", "quality": 85}),
    "baseline_600x48_tall": (600, 48, {"format": "JPEG", "quality": 85}),
    "progressive_300x400": (
        300,
        400,
        {"format": "JPEG", "quality": 85, "progressive": True},
    ),
    "gray_240x320": (240, 320, {"format": "JPEG", "quality": 85, "mode": "L"}),
    "cmyk_200x300": (200, 300, {"format": "JPEG", "quality": 90, "mode": "CMYK"}),
    "png_150x200": (150, 200, {"format": "PNG"}),
}
HARDWARE = {name for name in READABLE if name.startswith("baseline_")}
SUFFIX = {"JPEG": ".jpg", "PNG": ".png"}


def pixels(height: int, width: int, seed: int) -> np.ndarray[Any, Any]:
    """An RGB picture with smooth gradients, edges and some noise: what a
    resize's filter and a JPEG's quantisation both have work to do on."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack(
        [
            128 + 100 * np.sin(x / (7 + seed % 5)) * np.cos(y / 11),
            255 * x / max(width - 1, 1),
            255 * ((x // 16 + y // 16) % 2),
        ],
        axis=-1,
    )
    noisy = base + rng.normal(0, 12, base.shape)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def encode(name: str) -> bytes:
    """The named readable fixture's file bytes."""
    from PIL import Image

    height, width, how = READABLE[name]
    how = dict(how)
    mode = how.pop("mode", "RGB")
    seed = sorted(READABLE).index(name)
    image = Image.fromarray(pixels(height, width, seed), "RGB").convert(mode)
    out = io.BytesIO()
    image.save(out, **how)
    return out.getvalue()


def truncated_in_scan() -> bytes:
    """A baseline JPEG cut in its scan data: its size reads, it does not
    decode."""
    data = encode("baseline_375x500_q90")
    return data[: len(data) // 2]


def truncated_in_header() -> bytes:
    """A JPEG cut before its frame header: not even its size reads."""
    return encode("baseline_375x500_q90")[:40]


def write_folder(root: str, bad: bool = False) -> list[str]:
    """An ImageFolder tree under ``root``: classes ``a`` and ``b`` holding
    the readable fixtures (alternately), and with ``bad`` a class ``c`` of
    a file truncated in its scan, one truncated before its size and one
    that is no image. Returns the fixture names in the dataset's order."""
    files: dict[str, bytes] = {}
    for k, name in enumerate(sorted(READABLE)):
        klass = "ab"[k % 2]
        files[f"{klass}/{name}{SUFFIX[READABLE[name][2]['format']]}"] = encode(name)
    if bad:
        files["c/cut_in_header.jpg"] = truncated_in_header()
        files["c/cut_in_scan.jpg"] = truncated_in_scan()
        files["c/not_an_image.jpg"] = b"this is a text file, not a JPEG\n" * 4
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return [os.path.splitext(rel)[0].split("/")[1] for rel in sorted(files)]


# ---------------------------------------------------------------- stand-ins


class _Transform:
    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Compose(_Transform):
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, image: Any) -> Any:
        for t in self.transforms:
            image = t(image)
        return image


class RandomResizedCrop(_Transform):
    def __init__(
        self,
        size: Any,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: str = "bilinear",
        antialias: bool = True,
    ) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)
        self.scale, self.ratio = scale, ratio
        self.interpolation, self.antialias = interpolation, antialias


class RandomHorizontalFlip(_Transform):
    def __init__(self, p: float = 0.5) -> None:
        self.p = p


class ToTensor(_Transform):
    pass


class Normalize(_Transform):
    def __init__(self, mean: Any, std: Any) -> None:
        self.mean, self.std = mean, std


class Resize(_Transform):
    def __init__(self, size: Any, interpolation: str = "bilinear") -> None:
        self.size, self.interpolation = size, interpolation
        self.max_size = None


class CenterCrop(_Transform):
    def __init__(self, size: Any) -> None:
        self.size = (size, size) if isinstance(size, int) else tuple(size)


class ColorJitter(_Transform):
    """One torchvision transform fastq.vision does not read: applied as is,
    on the PIL image (here: none of it, the picture unchanged)."""

    def __init__(self, brightness: float = 0.0) -> None:
        self.brightness = brightness

    def __call__(self, image: Any) -> Any:
        return image


for _cls in (
    Compose,
    RandomResizedCrop,
    RandomHorizontalFlip,
    ToTensor,
    Normalize,
    Resize,
    CenterCrop,
    ColorJitter,
):
    _cls.__module__ = "torchvision.transforms.transforms"

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def train_transform(size: Any = (24, 32)) -> Compose:
    """ImageNet's training pipeline, as torchvision's example writes it."""
    return Compose(
        [
            RandomResizedCrop(size),
            RandomHorizontalFlip(),
            ToTensor(),
            Normalize(MEAN, STD),
        ]
    )


def val_transform(resize: int = 40, crop: int = 32) -> Compose:
    """ImageNet's validation pipeline, scaled down."""
    return Compose([Resize(resize), CenterCrop(crop), ToTensor(), Normalize(MEAN, STD)])
