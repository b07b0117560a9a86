"""Local stand-ins for the torchvision pieces the vendored pytorch/examples
scripts use (torchvision is not installed here): datasets of the same
sample shape and length made from the index alone, transforms as plain
tensor ops, and a small model under a torchvision model name.

``EXAMPLES_FAKE_LEN`` (an int) caps every dataset's length, so a test runs a
script to its end in seconds; without it the lengths are the real ones.
``EXAMPLES_IN_FASTQ=1`` makes a sample made anywhere but in a fastq worker
an error (a converted script must load through fastq).
"""

from __future__ import annotations

import os
import types
from typing import Any

import torch
import torch.nn as nn


def _length(real: int) -> int:
    cap = os.environ.get("EXAMPLES_FAKE_LEN")
    return min(real, int(cap)) if cap else real


def _check_where() -> None:
    if os.environ.get("EXAMPLES_IN_FASTQ") == "1":
        import fastq

        if fastq.get_worker_info() is None:
            raise RuntimeError("a sample was made outside fastq's workers")


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


class FakeMNIST(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """datasets.MNIST's interface: (1x28x28 uint8 image through
    ``transform``, int label). The label's digit is drawn as a bright
    column, so a model can learn it and accuracy means something."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Any = None,
        target_transform: Any = None,
        download: bool = False,
    ) -> None:
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        self.offset = 0 if train else 1 << 20
        self.n = _length(60000 if train else 10000)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        _check_where()
        g = _generator(self.offset + index)
        target = int(torch.randint(10, (), generator=g))
        img = torch.randint(0, 64, (1, 28, 28), generator=g, dtype=torch.uint8)
        img[:, :, 2 + 2 * target : 4 + 2 * target] = 255
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class FakeData(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """datasets.FakeData's interface: (uint8 image of ``image_size`` through
    ``transform``, int label below ``num_classes``), fixed by the index."""

    def __init__(
        self,
        size: int = 1000,
        image_size: tuple[int, int, int] = (3, 224, 224),
        num_classes: int = 10,
        transform: Any = None,
        target_transform: Any = None,
        random_offset: int = 0,
    ) -> None:
        self.size = _length(size)
        self.image_size = image_size
        self.num_classes = num_classes
        self.transform = transform
        self.target_transform = target_transform
        self.random_offset = random_offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < self.size:
            raise IndexError(f"{self.__class__.__name__} index out of range")
        _check_where()
        g = _generator(index + self.random_offset)
        img = torch.randint(0, 256, self.image_size, generator=g, dtype=torch.uint8)
        target = int(torch.randint(self.num_classes, (), generator=g))
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target


class ToTensor:
    """uint8 image -> float in [0, 1], as transforms.ToTensor does."""

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        return img.to(torch.float32).div_(255)


class Normalize:
    def __init__(self, mean: Any, std: Any) -> None:
        self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return (t - self.mean) / self.std


class Compose:
    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps

    def __call__(self, x: Any) -> Any:
        for step in self.steps:
            x = step(x)
        return x


class TinyNet(nn.Module):
    """Stands in for resnet18: a strided convolution, pooling, a classifier."""

    def __init__(self, num_classes: int = 1000, pretrained: bool = False) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=8, stride=8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


datasets = types.SimpleNamespace(MNIST=FakeMNIST, FakeData=FakeData)
transforms = types.SimpleNamespace(
    ToTensor=ToTensor, Normalize=Normalize, Compose=Compose
)
models = types.SimpleNamespace(resnet18=TinyNet)
