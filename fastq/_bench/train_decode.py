"""The training bench's GPU-decode rows: fastq.torch.DataLoader over the
bench's JPEG files as a ``fastq.vision.ImageFiles`` dataset with
torchvision's ImageNet training transform, its decode stage on the GPU
with one backend (nvImageCodec or torchvision's ``decode_jpeg``), handing
the loop ``(images, labels)`` on the device, bf16 and channels_last.

Where the stage or the backend is missing, the row says so ("not
available: ...") instead of measuring something else."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

# The rows, and each one's decode_backend= (fastq.torch.DataLoader's).
BACKENDS = {
    "GPU decode: nvImageCodec": "nvimgcodec",
    "GPU decode: torchvision": "torchvision",
}
DECODE_LOADERS = tuple(BACKENDS)
# ImageNet's channel means and deviations, as Normalize takes them.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
_MODULES = {"nvimgcodec": "nvidia.nvimgcodec", "torchvision": "torchvision"}


class Unavailable(Exception):
    """Why a GPU-decode row cannot run here."""


def problem(loader: str, device: str) -> str | None:
    """Why ``loader``'s row cannot run here, or None."""
    if importlib.util.find_spec("fastq.vision") is None:
        return "fastq.vision (the encoded-image dataset) is not in this checkout"
    if importlib.util.find_spec("torchvision") is None:
        return "torchvision (the transform the dataset reads) is not installed"
    import inspect

    from ..torch import DataLoader

    if "decode_backend" not in inspect.signature(DataLoader).parameters:
        return "fastq.torch.DataLoader has no decode stage (decode_backend=) here"
    backend = BACKENDS[loader]
    if device == "cuda" and importlib.util.find_spec(_MODULES[backend]) is None:
        return f"the {backend} backend is not installed ({_MODULES[backend]})"
    return None


def transform(size: int) -> Any:
    """torchvision's ImageNet training transform, as a script passes it."""
    from torchvision import transforms

    return transforms.Compose(
        [
            transforms.RandomResizedCrop(size, antialias=True),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )


def open_loader(
    loader: str,
    paths: Sequence[str],
    classes: int,
    size: int,
    device: Any,
    common: dict[str, Any],
    workers: int,
) -> Any:
    """The row's DataLoader; Unavailable where it cannot run here."""
    why = problem(loader, device.type)
    if why is not None:
        raise Unavailable(why)
    import importlib

    import torch

    from ..torch import DataLoader

    vision = importlib.import_module("fastq.vision")

    samples = [(p, i % classes) for i, p in enumerate(paths)]
    dataset = vision.ImageFiles(samples, transform=transform(size))
    return DataLoader(
        dataset,
        num_workers=workers,
        persistent_workers=True,
        decode_backend=BACKENDS[loader],
        decode_dtype=torch.bfloat16,
        channels_last=True,
        **common,
    )


def stage_stats(loader: Any) -> dict[str, Any] | None:
    """The decode stage's stats (``stats()["decode"]``), or None."""
    stats = getattr(loader, "stats", None)
    if stats is None:
        return None
    decode = stats().get("decode")
    return None if decode is None else dict(decode)


def gpu_ms_per_batch(decode: dict[str, Any] | None) -> float | None:
    """The stage's GPU time per batch from its stats, where it reports it."""
    if not decode:
        return None
    if "gpu_ms_per_batch" in decode:
        return float(decode["gpu_ms_per_batch"])
    if "gpu_s" in decode and decode.get("batches"):
        return float(decode["gpu_s"]) / decode["batches"] * 1e3
    return None
