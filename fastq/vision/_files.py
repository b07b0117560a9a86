"""A dataset of image files, decoded in the worker (as torchvision's
ImageFolder with its transform) or handed on encoded, with each sample's
box and flip, for a GPU stage to decode."""

from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Iterable
from typing import Any, Callable

import numpy as np

from .._layout._jagged import Jagged
from .._make._worker_info import get_worker_info
from ..errors import ConfigError, ImageError
from ._decode import decode_error, decode_on_cpu, load_rgb
from ._header import image_header
from ._plan import DecodePlan, Unreadable, read_transform
from ._shared_samples import SharedSamples


class ImageFiles(SharedSamples):
    """Images from a list of ``(path, label)``, as torchvision's ImageFolder
    gives them, or encoded for a GPU to decode.

    A ``transform`` that is torchvision's ``Compose`` of RandomResizedCrop,
    RandomHorizontalFlip, ToTensor and Normalize (or Resize, CenterCrop,
    ToTensor and Normalize) is read into ``decode_plan``, and the dataset
    has two modes:

    - decoded (the default): ``dataset[i]`` is ``(image, label)``, image a
      float32 (3, h, w) array decoded with Pillow, as the transform makes it;
    - encoded (after ``decode_on_gpu(True)``): ``dataset[i]`` is a dict of
      the file's bytes and what a GPU stage needs to decode it: ``data``,
      ``label``, ``index``, ``size``, ``box``, ``flip``, ``kind``.

    Either way each sample's box and flip are a function of (seed, epoch,
    index): inside a fastq worker, the Prefetcher's seed and epoch
    (``fastq.get_worker_info()``); elsewhere this dataset's ``seed`` and
    ``epoch`` (``set_epoch``). Any other transform leaves the dataset a
    plain ImageFolder (Pillow decode, then the transform), with one
    warning naming the transform that stopped it.

    ``samples``, ``imgs`` and ``targets`` are torchvision's lists, to read,
    change or replace before iterating. fastq's worker processes read each
    (path, label) from a copy of ``samples`` in shared memory, made as they
    start (again only if the list changed since), so that no worker copies
    the list: NOTE [ Samples the workers do not copy ] in
    fastq/vision/_shared_samples.py. A subclass that overrides
    ``__getitem__`` keeps the list alone.

    Parameters
    ----------
    samples : iterable of (str, int)
        Each image's path and label.
    transform : callable, optional
        What torchvision's ImageFolder would be given.
    target_transform : callable, optional
        Applied to each label.
    loader : callable, optional
        A path's image, as torchvision's ``loader=``; another loader than
        the default leaves the dataset a plain ImageFolder.
    seed : int, optional
        The boxes' seed outside fastq workers; default: drawn once here.
    """

    def __init__(
        self,
        samples: Iterable[tuple[str, int]],
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        loader: Callable[[str], Any] | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.samples = [(os.fspath(path), int(label)) for path, label in samples]
        self.targets = [label for _, label in self.samples]
        self.imgs = self.samples
        self.transform = transform
        self.target_transform = target_transform
        self.loader = loader
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        self.epoch = 0
        self.decode_plan = self._read_plan(transform, loader)
        self._encoded = False
        self._file_bytes: np.ndarray[Any, np.dtype[np.int64]] | None = None

    @staticmethod
    def _read_plan(transform: Any, loader: Any) -> DecodePlan | None:
        if transform is None:
            return None  # PIL images out, as torchvision's: nothing to plan
        if loader is not None:
            reason = f"loader={loader!r} (only the default loader is read)"
        else:
            try:
                return read_transform(transform)
            except Unreadable as exc:
                reason = str(exc)
        warnings.warn(
            f"fastq.vision: the transform is not one it can decode itself, "
            f"stopped by {reason}; images are decoded with Pillow and the "
            "transform in the workers, as torchvision's ImageFolder does, and "
            "cannot be decoded on a GPU. A Compose of RandomResizedCrop, "
            "RandomHorizontalFlip, ToTensor, Normalize (or Resize, CenterCrop, "
            "ToTensor, Normalize) can.",
            stacklevel=3,
        )
        return None

    def __len__(self) -> int:
        return self._sample_count()

    def _reads_records(self) -> bool:
        return type(self).__getitem__ is ImageFiles.__getitem__

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose boxes and flips samples get outside fastq workers
        (inside one, the Prefetcher's epoch counts)."""
        self.epoch = int(epoch)

    def decode_on_gpu(self, flag: bool) -> None:
        """Hand out encoded samples (True) for a GPU stage to decode, or
        decoded images (False, the default). Set before workers start.

        Raises
        ------
        ConfigError
            True for a dataset without a ``decode_plan``.
        """
        if flag and self.decode_plan is None:
            raise ConfigError(
                f"decode_on_gpu(True): this dataset's transform={self.transform!r} "
                f"(loader={self.loader!r}) is not one fastq.vision reads, so its "
                "images cannot be decoded on a GPU; use a Compose of "
                "RandomResizedCrop, RandomHorizontalFlip, ToTensor and Normalize"
            )
        self._encoded = bool(flag)

    @property
    def encoded(self) -> bool:
        """Whether samples are handed out encoded (``decode_on_gpu(True)``)."""
        return self._encoded

    def encoded_spec(
        self, batch_size: int, budget: int | None = None
    ) -> dict[str, Any]:
        """The batch spec of encoded samples: ``spec=`` for a Prefetcher.

        Parameters
        ----------
        batch_size : int
            Samples per batch.
        budget : int, optional
            The most bytes of files one batch may carry. Default: the
            ``batch_size`` largest files' total, which no batch exceeds; a
            smaller one makes smaller slots where a few files are large (a
            batch over it raises a SpecError naming it).

        Returns
        -------
        dict
            ``{"data": fastq.Jagged("uint8", max_len=<largest file>,
            budget=...), "label", "index", "size", "box", "flip", "kind"}``.
        """
        sizes = self.file_bytes()
        if budget is None:
            largest = np.sort(sizes)[-min(batch_size, len(sizes)) :]
            budget = int(largest.sum())
        return {
            "data": Jagged("uint8", max_len=int(sizes.max()), budget=budget),
            "label": ((), "int64"),
            "index": ((), "int64"),
            "size": ((2,), "int32"),
            "box": ((4,), "int32"),
            "flip": ((), "uint8"),
            "kind": ((), "uint8"),
        }

    def file_bytes(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each sample's file size in bytes (read once)."""
        if self._file_bytes is None:
            if not self.samples:
                raise ConfigError(
                    f"{type(self).__name__}: samples=[] (no images), so no file "
                    "sizes a batch spec; give it at least one (path, label)"
                )
            self._file_bytes = np.array(
                [os.stat(path).st_size for path, _ in self.samples], np.int64
            )
        return self._file_bytes

    def _seed_and_epoch(self) -> tuple[int, int]:
        info = get_worker_info()
        if info is not None and info.epoch >= 0:
            return info.seed, info.epoch
        return self.seed, self.epoch

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if index < 0:  # the crop is the positive index's
            index += len(self)
        path, label = self._sample(index)
        if self.target_transform is not None:
            label = self.target_transform(label)
        plan = self.decode_plan
        if plan is None:
            return self._plain(index, path), label
        with open(path, "rb") as file:
            data = file.read()
        try:
            height, width, kind = image_header(data)
        except ImageError as exc:
            raise ImageError(
                f"image {path!r} (sample {index}): {exc}", path=path, index=index
            ) from exc
        seed, epoch = self._seed_and_epoch()
        box, flip = plan.crop(seed, epoch, index, height, width)
        if self._encoded:
            return {
                "data": np.frombuffer(data, np.uint8),
                "label": np.int64(label),
                "index": np.int64(index),
                "size": np.array((height, width), np.int32),
                "box": np.array(box, np.int32),
                "flip": np.uint8(flip),
                "kind": np.uint8(kind),
            }
        try:
            image = decode_on_cpu(data, box, flip, plan)
        except OSError as exc:
            raise decode_error(path, index, exc) from exc
        return image, label

    def _plain(self, index: int, path: str) -> Any:
        if self.loader is not None:
            image = self.loader(path)
        else:
            with open(path, "rb") as file:
                data = file.read()
            try:
                image = load_rgb(data)
            except OSError as exc:
                raise decode_error(path, index, exc) from exc
        if self.transform is not None:
            image = self.transform(image)
        return image

    def __repr__(self) -> str:
        mode = "encoded" if self._encoded else "decoded"
        name = type(self).__name__
        return f"{name}({len(self)} images, {mode}, plan={self.decode_plan})"
