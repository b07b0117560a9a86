"""torchvision's ImageFolder layout (root/class/file) read into an
ImageFiles dataset: classes in sorted order, files by extension."""

from __future__ import annotations

import os
from typing import Any, Callable

from ._files import ImageFiles

IMG_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".ppm",
    ".bmp",
    ".pgm",
    ".tif",
    ".tiff",
    ".webp",
)


class ImageFolder(ImageFiles):
    """torchvision's ``ImageFolder``: ``root/<class>/**/<file>``, one class
    per sub-folder in sorted order, with its attributes (``classes``,
    ``class_to_idx``, ``samples``, ``targets``, ``imgs``), decoded in the
    workers or encoded for a GPU (see ``ImageFiles``).

    Parameters
    ----------
    root : str or path
        The folder of class folders.
    transform, target_transform, loader : callable, optional
        As torchvision's (see ``ImageFiles``).
    is_valid_file : callable, optional
        Which paths are images; default: by extension (IMG_EXTENSIONS).
    allow_empty : bool
        Whether a class folder may hold no image.
    seed : int, optional
        The boxes' seed outside fastq workers (see ``ImageFiles``).

    Raises
    ------
    FileNotFoundError
        No class folder under ``root``, or an empty one without
        ``allow_empty``, as torchvision's.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[..., Any] | None = None,
        loader: Callable[[str], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        seed: int | None = None,
    ) -> None:
        self.root = os.fspath(root)
        self.extensions = None if is_valid_file is not None else IMG_EXTENSIONS
        self.classes, self.class_to_idx = find_classes(self.root)
        samples = make_samples(self.root, self.class_to_idx, is_valid_file, allow_empty)
        super().__init__(samples, transform, target_transform, loader, seed=seed)


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """The class folders under ``root``, sorted, and their indices."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    return classes, {name: i for i, name in enumerate(classes)}


def make_samples(
    root: str,
    class_to_idx: dict[str, int],
    is_valid_file: Callable[[str], bool] | None,
    allow_empty: bool,
) -> list[tuple[str, int]]:
    """Every image's (path, class index), class by class, each class's
    files in sorted walk order, as torchvision lists them."""
    if is_valid_file is None:

        def is_valid_file(path: str) -> bool:
            return path.lower().endswith(IMG_EXTENSIONS)

    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for name in sorted(class_to_idx):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        before = len(samples)
        for parent, _, files in sorted(os.walk(folder, followlinks=True)):
            for file in sorted(files):
                path = os.path.join(parent, file)
                if is_valid_file(path):
                    samples.append((path, class_to_idx[name]))
        if len(samples) == before:
            empty.append(name)
    if empty and not allow_empty:
        raise FileNotFoundError(
            f"Found no valid file for the classes {', '.join(sorted(empty))}. "
            f"Supported extensions are: {', '.join(IMG_EXTENSIONS)}"
        )
    return samples
