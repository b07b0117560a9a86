"""Records torchvision's own RandomResizedCrop boxes, which
tests/test_vision_crop.py compares fastq.vision's with (a two-sample test).

Run with a Python that has torchvision (0.29.1 made the committed file):

    /work/venv-tv/bin/python tests/data/make_crop_reference.py

It writes tests/data/crop_reference.npz: for each case, DRAWS boxes
(top, left, height, width) from ``RandomResizedCrop.get_params`` under
``torch.manual_seed(0)``, as int16, with the image size, scale and ratio.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torchvision
from torchvision import transforms

DRAWS = 10_000
# name: (height, width, scale, ratio). Landscape and portrait at ImageNet's
# usual size; a thin strip where about half the draws fall back to the
# centre box; other scale and ratio bounds.
CASES = {
    "375x500": (375, 500, (0.08, 1.0), (3 / 4, 4 / 3)),
    "500x375": (500, 375, (0.08, 1.0), (3 / 4, 4 / 3)),
    "48x400": (48, 400, (0.08, 1.0), (3 / 4, 4 / 3)),
    "256x256_wide_bounds": (256, 256, (0.25, 1.0), (0.5, 2.0)),
}


def main() -> None:
    out: dict[str, np.ndarray] = {}
    for name, (height, width, scale, ratio) in CASES.items():
        torch.manual_seed(0)
        image = torch.empty((1, height, width), dtype=torch.uint8)
        boxes = [
            transforms.RandomResizedCrop.get_params(image, list(scale), list(ratio))
            for _ in range(DRAWS)
        ]
        out[f"{name}/boxes"] = np.array(boxes, np.int16)
        out[f"{name}/image"] = np.array((height, width), np.int32)
        out[f"{name}/scale"] = np.array(scale, np.float64)
        out[f"{name}/ratio"] = np.array(ratio, np.float64)
    out["torchvision"] = np.array(torchvision.__version__)
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "crop_reference.npz"
    )
    np.savez_compressed(path, **out)
    print(
        f"wrote {path} ({os.path.getsize(path)} bytes), "
        f"torchvision {torchvision.__version__}"
    )


if __name__ == "__main__":
    main()
