"""fastq.vision's datasets under the loaders: fastq.Prefetcher's workers in
both modes (the crops drawn from the Prefetcher's seed and epoch), and
PyTorch's DataLoader in the decoded mode (from the dataset's own)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import vision_fixtures as vf

import fastq
from fastq.vision import KIND_HW_JPEG, KIND_OTHER, ImageFolder

pytestmark = pytest.mark.timeout(90)
SEED = 5


@pytest.fixture
def folder(tmp_path: Any) -> str:
    vf.write_folder(str(tmp_path))
    return str(tmp_path)


def test_prefetcher_workers_decode_with_its_seed_and_epoch(folder: str) -> None:
    dataset = ImageFolder(folder, vf.train_transform())
    # The same crops outside a worker, from the Prefetcher's seed and epoch.
    outside = ImageFolder(folder, vf.train_transform(), seed=SEED)
    with fastq.Prefetcher(dataset, batch_size=4, workers=2, seed=SEED) as pf:
        for epoch in range(2):
            outside.set_epoch(epoch)
            index = 0
            for images, labels in pf:
                for image, label in zip(images, labels):
                    expected, target = outside[index]
                    np.testing.assert_array_equal(image, expected)
                    assert label == target
                    index += 1
            assert index == len(dataset)


def test_prefetcher_workers_hand_on_encoded_samples(folder: str) -> None:
    dataset = ImageFolder(folder, vf.train_transform())
    dataset.decode_on_gpu(True)
    plan = dataset.decode_plan
    assert plan is not None
    spec = dataset.encoded_spec(4)
    seen = []
    with fastq.Prefetcher(dataset, batch_size=4, workers=2, seed=SEED, spec=spec) as pf:
        for epoch in range(2):
            for batch in pf:
                for row, data in enumerate(batch["data"]):
                    index = int(batch["index"][row])
                    path, label = dataset.samples[index]
                    with open(path, "rb") as f:
                        assert data.tobytes() == f.read()
                    height, width = (int(v) for v in batch["size"][row])
                    box, flip = plan.crop(SEED, epoch, index, height, width)
                    assert tuple(batch["box"][row]) == box
                    assert bool(batch["flip"][row]) == flip
                    assert batch["label"][row] == label
                    name = path.rsplit("/", 1)[1].split(".")[0]
                    assert (height, width) == vf.READABLE[name][:2]
                    kind = KIND_HW_JPEG if name in vf.HARDWARE else KIND_OTHER
                    assert batch["kind"][row] == kind
                    seen.append((epoch, index))
    assert sorted(seen) == [(e, i) for e in range(2) for i in range(len(dataset))]


def test_the_encoded_spec_bounds_a_batch_by_its_largest_files(folder: str) -> None:
    dataset = ImageFolder(folder, vf.train_transform())
    sizes = dataset.file_bytes()
    data = dataset.encoded_spec(3)["data"]
    assert data.max_len == sizes.max()
    assert data.budget == np.sort(sizes)[-3:].sum()
    assert dataset.encoded_spec(3, budget=1000)["data"].budget == 1000


def test_torchs_dataloader_decodes_with_the_datasets_seed_and_epoch(
    folder: str,
) -> None:
    torch = pytest.importorskip("torch")
    dataset = ImageFolder(folder, vf.train_transform(), seed=SEED)
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)  # workers start afresh each epoch
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
        images = torch.cat([images for images, _ in loader]).numpy()
        expected = np.stack([dataset[i][0] for i in range(len(dataset))])
        np.testing.assert_array_equal(images, expected)
        epochs.append(images)
    assert not np.array_equal(epochs[0], epochs[1])


def test_fastq_torch_dataloader_decodes_in_its_workers(folder: str) -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    dataset = ImageFolder(folder, vf.train_transform())
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    labels = [labels.tolist() for _, labels in loader]
    images = [images.shape for images, _ in loader]
    assert [label for batch in labels for label in batch] == dataset.targets
    assert images[0] == (4, 3, 24, 32)
