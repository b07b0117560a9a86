"""The training benchmark's step: a torchvision ResNet or a small CNN in
channels_last, bf16 autocast, SGD, on uint8 batches normalised on the
device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# tiny and cnn are for CPUs: there decoding outruns tiny's step (an
# input-bound loop) and cnn's step outruns decoding (a compute-bound one), as
# resnet18 and resnet50 do on a GPU fed by a few CPUs per GPU.
MODELS = ("tiny", "cnn", "resnet18", "resnet50")
# ImageNet's channel means and deviations, on the 0-255 scale of uint8 pixels.
_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def classes(model: str) -> int:
    return 1000 if model.startswith("resnet") else 10


class SmallCNN(nn.Module):
    """Strided convolutions with batch norm, pooled into a linear head: a
    step a CPU makes in milliseconds, at any image size. `convs` holds
    (channels, kernel, stride, padding) per convolution."""

    def __init__(
        self, num_classes: int, convs: tuple[tuple[int, int, int, int], ...]
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 3
        for out, kernel, stride, padding in convs:
            layers += [
                nn.Conv2d(width, out, kernel, stride, padding, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
            ]
            width = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(
            F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        )
        return out


def torchvision_problem() -> str | None:
    """Why torchvision's models cannot be imported here, or None."""
    try:
        import torchvision.models  # noqa: F401
    except Exception as exc:  # a wrong build fails with RuntimeError, not ImportError
        return (
            f"torchvision cannot be imported ({type(exc).__name__}: {exc}); the "
            "ResNets need the torchvision built for this torch (torch 2.13.0: "
            'torchvision==0.28.0, pip install -e ".[bench,torch,train]"; '
            "PyPI's wheel is built for torch's CUDA build)"
        )
    return None


def build(model: str) -> nn.Module:
    if model == "tiny":  # one 4x4 patch projection
        return SmallCNN(classes(model), ((16, 4, 4, 0),))
    if model == "cnn":  # three 3x3 convolutions of stride 2
        return SmallCNN(classes(model), ((32, 3, 2, 1), (64, 3, 2, 1), (128, 3, 2, 1)))
    if model not in MODELS:
        raise ValueError(f"model={model!r}: choose from {', '.join(MODELS)}")
    problem = torchvision_problem()
    if problem is not None:
        raise RuntimeError(problem)
    import torchvision.models

    make = getattr(torchvision.models, model)
    net: nn.Module = make(weights=None, num_classes=classes(model))
    return net


def make_step(model: str, device: torch.device) -> Callable[[Any, Any], None]:
    """step(images, labels): one SGD step on a batch of uint8 images
    (B, 3, H, W), or of images normalized already (a GPU decode stage's,
    any float dtype), and int64 labels, wherever they are; they are moved
    to `device` without blocking (already there: no copy)."""
    torch.manual_seed(0)
    # Module.to takes memory_format (its documentation), which its
    # annotations leave out.
    net = build(model).to(device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    mean = torch.tensor(_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(_STD, device=device).view(1, 3, 1, 1)

    def step(images: Any, labels: Any) -> None:
        x = images.to(device, non_blocking=True)
        y = labels.to(device, non_blocking=True)
        # uint8 turned channels_last first: a quarter of the bytes to move.
        x = x.contiguous(memory_format=torch.channels_last)
        if x.dtype == torch.uint8:
            x = x.float().sub_(mean).div_(std)
        # Otherwise a decode stage's output, normalized already.
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()

    return step
