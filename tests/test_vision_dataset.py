"""fastq.vision's datasets: torchvision's ImageFolder layout and
attributes, the transforms they read into a DecodePlan (and the ones they
leave to a plain ImageFolder, with one warning), the encoded samples'
fields, and an import that brings in neither torch nor Pillow."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
import vision_fixtures as vf

import fastq
from fastq.vision import DecodePlan, ImageFiles, ImageFolder


def touch(root: Any, *paths: str) -> None:
    for rel in paths:
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(vf.encode("png_150x200"))


def test_the_layout_is_torchvisions(tmp_path: Any) -> None:
    touch(tmp_path, "dog/b.JPG", "dog/a.png", "cat/z/x.jpeg", "cat/y.jpg")
    touch(tmp_path, "cat/notes.txt")  # no image extension: skipped
    dataset = ImageFolder(tmp_path)
    root = str(tmp_path)
    assert dataset.classes == ["cat", "dog"]
    assert dataset.class_to_idx == {"cat": 0, "dog": 1}
    assert dataset.samples == [
        (os.path.join(root, "cat", "y.jpg"), 0),
        (os.path.join(root, "cat", "z", "x.jpeg"), 0),
        (os.path.join(root, "dog", "a.png"), 1),
        (os.path.join(root, "dog", "b.JPG"), 1),
    ]
    assert dataset.targets == [0, 0, 1, 1] and dataset.imgs == dataset.samples
    assert len(dataset) == 4 and dataset.decode_plan is None
    image, label = dataset[2]  # no transform: the PIL image, in RGB
    assert image.mode == "RGB" and image.size == (200, 150) and label == 1


def test_empty_classes_and_chosen_files(tmp_path: Any) -> None:
    touch(tmp_path, "a/x.jpg")
    os.makedirs(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="b"):
        ImageFolder(tmp_path)
    assert len(ImageFolder(tmp_path, allow_empty=True)) == 1
    only = ImageFolder(
        tmp_path, is_valid_file=lambda p: p.endswith(".none"), allow_empty=True
    )
    assert only.samples == []
    with pytest.raises(FileNotFoundError):
        ImageFolder(tmp_path / "a")  # no class folder


def test_the_training_and_validation_pipelines_are_read() -> None:
    train = ImageFiles([], vf.train_transform((24, 32))).decode_plan
    assert train == DecodePlan(
        size=(24, 32),
        scale=(0.08, 1.0),
        ratio=(3 / 4, 4 / 3),
        flip_p=0.5,
        mean=vf.MEAN,
        std=vf.STD,
    )
    validation = ImageFiles([], vf.val_transform(40, 32)).decode_plan
    assert validation == DecodePlan(size=(32, 32), mean=vf.MEAN, std=vf.STD, resize=40)
    bare = vf.Compose([vf.RandomResizedCrop(8, scale=(0.5, 1.0)), vf.ToTensor()])
    plan = ImageFiles([], bare).decode_plan
    assert plan == DecodePlan(size=(8, 8), scale=(0.5, 1.0))
    one = vf.Compose(
        [vf.RandomResizedCrop(8), vf.ToTensor(), vf.Normalize([0.5], [0.25])]
    )
    plan = ImageFiles([], one).decode_plan
    assert plan is not None and plan.mean == (0.5,) * 3 and plan.std == (0.25,) * 3
    assert pickle.loads(pickle.dumps(plan)) == plan


class RandomResizedCrop(vf.RandomResizedCrop):
    """A user's own subclass: it may crop otherwise."""


RandomResizedCrop.__module__ = __name__


@pytest.mark.parametrize(
    "transform,names",
    [
        (vf.Compose([vf.ColorJitter(0.4), vf.ToTensor()]), "ColorJitter"),
        (vf.Compose([vf.RandomResizedCrop(8)]), "the end of the Compose"),
        (
            vf.Compose([vf.RandomResizedCrop(8), vf.ToTensor(), vf.ColorJitter()]),
            "ColorJitter",
        ),
        (
            vf.Compose(
                [vf.RandomResizedCrop(8, interpolation="nearest"), vf.ToTensor()]
            ),
            "RandomResizedCrop",
        ),
        (vf.Compose([RandomResizedCrop(8), vf.ToTensor()]), "RandomResizedCrop"),
        (vf.RandomResizedCrop(8), "not a torchvision Compose"),
        (vf.Compose([vf.Resize(40), vf.ToTensor()]), "ToTensor"),
    ],
    ids=["jitter", "no-totensor", "after", "nearest", "subclass", "bare", "no-crop"],
)
def test_another_transform_leaves_a_plain_imagefolder_with_one_warning(
    tmp_path: Any, transform: Any, names: str
) -> None:
    touch(tmp_path, "a/x.png")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = ImageFolder(tmp_path, transform)
    assert len(caught) == 1 and names in str(caught[0].message)
    assert dataset.decode_plan is None
    with pytest.raises(fastq.ConfigError, match="decode_on_gpu"):
        dataset.decode_on_gpu(True)


def test_a_plain_imagefolder_applies_the_transform_to_the_pil_image(
    tmp_path: Any,
) -> None:
    touch(tmp_path, "a/x.png")
    seen = []

    def transform(image: Any) -> Any:
        seen.append(image.mode)
        return np.asarray(image)

    with pytest.warns(UserWarning, match="transform"):
        dataset = ImageFolder(tmp_path, transform, target_transform=lambda t: t + 10)
    image, label = dataset[0]
    assert seen == ["RGB"] and image.shape == (150, 200, 3) and label == 10


def test_another_loader_leaves_a_plain_imagefolder(tmp_path: Any) -> None:
    touch(tmp_path, "a/x.png")
    with pytest.warns(UserWarning, match="loader"):
        dataset = ImageFolder(tmp_path, vf.train_transform(), loader=lambda p: p)
    assert dataset.decode_plan is None


def test_an_encoded_sample_has_the_contracts_fields(tmp_path: Any) -> None:
    vf.write_folder(str(tmp_path))
    dataset = ImageFolder(
        tmp_path, vf.train_transform(), target_transform=lambda t: t + 1
    )
    assert not dataset.encoded
    dataset.decode_on_gpu(True)
    sample = dataset[1]
    assert list(sample) == ["data", "label", "index", "size", "box", "flip", "kind"]
    fields = {k: (np.shape(v), np.asarray(v).dtype) for k, v in sample.items()}
    assert fields == {
        "data": ((os.path.getsize(dataset.samples[1][0]),), np.uint8),
        "label": ((), np.int64),
        "index": ((), np.int64),
        "size": ((2,), np.int32),
        "box": ((4,), np.int32),
        "flip": ((), np.uint8),
        "kind": ((), np.uint8),
    }
    assert int(sample["label"]) == dataset.targets[1] + 1 and sample["index"] == 1
    last = len(dataset) - 1
    assert dataset[-1]["index"] == last
    assert (dataset[-1]["box"] == dataset[last]["box"]).all()
    dataset.decode_on_gpu(False)
    image, label = dataset[1]
    assert image.shape == (3, 24, 32) and label == dataset.targets[1] + 1


def test_the_seed_is_drawn_once_unless_given(tmp_path: Any) -> None:
    assert ImageFiles([]).seed != ImageFiles([]).seed
    assert ImageFiles([], seed=3).seed == 3


def test_importing_it_imports_neither_torch_nor_pillow() -> None:
    code = (
        "import sys, fastq, fastq.vision; fastq.vision.ImageFolder; "
        "print(sorted(m for m in ('torch', 'PIL') if m in sys.modules))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
