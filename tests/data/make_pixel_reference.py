"""Records torchvision's own pixels for the fixture images of
tests/vision_fixtures.py, which tests/test_vision_pixels.py compares
fastq.vision's CPU decode with.

Run with a Python that has torchvision (0.29.1 made the committed file):

    /work/venv-tv/bin/python tests/data/make_pixel_reference.py

For each readable fixture it loads the file with torchvision's ImageFolder
loader and runs, for two boxes drawn by RandomResizedCrop.get_params (the
second flipped), what RandomResizedCrop(SIZE), RandomHorizontalFlip,
ToTensor and Normalize do with that box and flip; and the validation
pipeline Resize(40), CenterCrop(32), ToTensor, Normalize. It writes
tests/data/pixel_reference.npz: the boxes, flips, outputs (float32) and
each fixture's SHA-256 (the test asserts exact equality where the bytes it
makes are the same, PSNR otherwise).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile

import numpy as np
import torch
import torchvision
from torchvision import transforms
from torchvision.datasets.folder import default_loader
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import vision_fixtures as vf

SIZE = (20, 28)


def main() -> None:
    out: dict[str, np.ndarray] = {"size": np.array(SIZE, np.int32)}
    validation = transforms.Compose(
        [
            transforms.Resize(40),
            transforms.CenterCrop(32),
            transforms.ToTensor(),
            transforms.Normalize(vf.MEAN, vf.STD),
        ]
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        for name in sorted(vf.READABLE):
            data = vf.encode(name)
            path = os.path.join(folder, name)
            with open(path, "wb") as f:
                f.write(data)
            image = default_loader(path)
            boxes, flips, images = [], [], []
            for flip in (False, True):
                box = transforms.RandomResizedCrop.get_params(
                    image, [0.08, 1.0], [3 / 4, 4 / 3]
                )
                crop = F.resized_crop(
                    image, *box, list(SIZE), InterpolationMode.BILINEAR, antialias=True
                )
                if flip:
                    crop = F.hflip(crop)
                tensor = F.normalize(F.to_tensor(crop), vf.MEAN, vf.STD)
                boxes.append(box)
                flips.append(flip)
                images.append(tensor.numpy())
            out[f"{name}/sha256"] = np.array(hashlib.sha256(data).hexdigest())
            out[f"{name}/boxes"] = np.array(boxes, np.int32)
            out[f"{name}/flips"] = np.array(flips, bool)
            out[f"{name}/train"] = np.stack(images).astype(np.float32)
            out[f"{name}/validation"] = validation(image).numpy()
    out["torchvision"] = np.array(torchvision.__version__)
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "pixel_reference.npz"
    )
    np.savez_compressed(path, **out)
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
