"""fastq.vision's CPU decode gives torchvision's pixels: against
torchvision 0.29.1's own pipeline on the fixture files (recorded in
tests/data/pixel_reference.npz by tests/data/make_pixel_reference.py),
exactly where this Pillow makes the same fixture bytes (it runs the same
Pillow operations in the same float32 arithmetic), else within PSNR 35 dB;
and the dataset's decoded mode crops the box its encoded mode hands on."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import pytest
import vision_fixtures as vf

from fastq.vision import DecodePlan, ImageFolder, decode_on_cpu
from fastq.vision._crop import resize_centre_box

REFERENCE = os.path.join(os.path.dirname(__file__), "data", "pixel_reference.npz")
MIN_PSNR = 35.0
NAMES = sorted(vf.READABLE)


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    with np.load(REFERENCE) as data:
        return {key: data[key] for key in data.files}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """On ToTensor's 0-1 scale (Normalize undone), peak 1."""
    std = np.array(vf.STD, np.float64)[:, None, None]
    mean = np.array(vf.MEAN, np.float64)[:, None, None]
    a, b = a * std + mean, b * std + mean
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


def same_bytes(recorded: dict[str, Any], name: str, data: bytes) -> bool:
    return str(recorded[f"{name}/sha256"]) == hashlib.sha256(data).hexdigest()


def assert_close(ours: np.ndarray, theirs: np.ndarray, exact: bool) -> None:
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    if exact:
        np.testing.assert_array_equal(ours, theirs)
    else:
        assert psnr(ours, theirs) >= MIN_PSNR


@pytest.mark.parametrize("name", NAMES)
def test_a_training_crop_is_torchvisions(recorded: Any, name: str) -> None:
    data = vf.encode(name)
    size = tuple(int(v) for v in recorded["size"])
    plan = DecodePlan(size=size, flip_p=0.5, mean=vf.MEAN, std=vf.STD)
    boxes, flips = recorded[f"{name}/boxes"], recorded[f"{name}/flips"]
    for box, flip, theirs in zip(boxes, flips, recorded[f"{name}/train"]):
        ours = decode_on_cpu(data, box, bool(flip), plan)
        assert_close(ours, theirs, same_bytes(recorded, name, data))


@pytest.mark.parametrize("name", NAMES)
def test_a_validation_crop_is_torchvisions(recorded: Any, name: str) -> None:
    data = vf.encode(name)
    plan = DecodePlan(size=(32, 32), mean=vf.MEAN, std=vf.STD, resize=40)
    ours = decode_on_cpu(data, (0, 0, 1, 1), False, plan)
    assert_close(ours, recorded[f"{name}/validation"], same_bytes(recorded, name, data))


@pytest.mark.parametrize("name", NAMES)
def test_the_validation_box_resized_is_close_to_resize_then_crop(
    recorded: Any, name: str
) -> None:
    """A GPU stage decodes a validation image as its box resized: close to
    torchvision's whole-image resize then centre crop, not bit-equal."""
    height, width, _ = vf.READABLE[name]
    box = resize_centre_box(height, width, 40, (32, 32))
    as_box = DecodePlan(size=(32, 32), mean=vf.MEAN, std=vf.STD)
    ours = decode_on_cpu(vf.encode(name), box, False, as_box)
    assert psnr(ours, recorded[f"{name}/validation"]) >= 25.0


def test_decoded_mode_crops_the_box_and_flip_encoded_mode_hands_on(
    tmp_path: Any,
) -> None:
    vf.write_folder(str(tmp_path))
    decoded = ImageFolder(tmp_path, vf.train_transform(), seed=11)
    encoded = ImageFolder(tmp_path, vf.train_transform(), seed=11)
    encoded.decode_on_gpu(True)
    flips = set()
    for epoch in range(3):
        decoded.set_epoch(epoch)
        encoded.set_epoch(epoch)
        for index in range(len(decoded)):
            image, label = decoded[index]
            sample = encoded[index]
            data = sample["data"].tobytes()
            box, flip = sample["box"], bool(sample["flip"])
            assert label == int(sample["label"]) == decoded.targets[index]
            expected = decode_on_cpu(data, box, flip, decoded.decode_plan)
            np.testing.assert_array_equal(image, expected)
            flips.add(flip)
    assert flips == {False, True}


def test_every_readable_kind_decodes_to_rgb(tmp_path: Any) -> None:
    """Progressive, grayscale, CMYK and PNG files decode as torchvision's
    loader makes them (converted to RGB): the same as a baseline JPEG of
    the file's own RGB pixels, within what JPEG's quantisation moves."""
    vf.write_folder(str(tmp_path))
    dataset = ImageFolder(tmp_path, vf.val_transform(), seed=0)
    for index, (path, _) in enumerate(dataset.samples):
        image, _ = dataset[index]
        assert image.shape == (3, 32, 32) and image.dtype == np.float32
        assert np.isfinite(image).all(), path
    gray = next(i for i, (p, _) in enumerate(dataset.samples) if "gray" in p)
    image, _ = dataset[gray]
    # Gray made RGB: the three channels equal before Normalize.
    std = np.array(vf.STD, np.float32)[:, None, None]
    mean = np.array(vf.MEAN, np.float32)[:, None, None]
    pixels = image * std + mean
    np.testing.assert_allclose(pixels[0], pixels[1], atol=1e-5)
    np.testing.assert_allclose(pixels[1], pixels[2], atol=1e-5)
