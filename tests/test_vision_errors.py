"""A file fastq.vision cannot read (truncated in its scan or before its
size, or no image at all) raises, at its turn, an ImageError naming its
path and index; the epoch's other samples still arrive."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import vision_fixtures as vf

import fastq
from fastq.errors import ImageError
from fastq.vision import ImageFiles, ImageFolder

pytestmark = pytest.mark.timeout(90)
BAD_AT = 4
BAD = {
    "cut_in_scan": vf.truncated_in_scan,
    "cut_in_header": vf.truncated_in_header,
    "not_an_image": lambda: b"this is a text file, not a JPEG\n" * 4,
}


def with_bad_file(root: Any, bad: str, encoded: bool = False) -> ImageFiles:
    """The fixture files with one bad file at index BAD_AT."""
    vf.write_folder(str(root))
    good = ImageFolder(str(root), vf.train_transform()).samples
    path = os.path.join(str(root), f"{bad}.jpg")
    with open(path, "wb") as f:
        f.write(BAD[bad]())
    samples = [*good[:BAD_AT], (path, 7), *good[BAD_AT:]]
    dataset = ImageFiles(samples, vf.train_transform(), seed=0)
    dataset.decode_on_gpu(encoded)
    return dataset


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("encoded", [False, True], ids=["decoded", "encoded"])
def test_the_error_names_the_path_and_index(
    tmp_path: Any, bad: str, encoded: bool
) -> None:
    dataset = with_bad_file(tmp_path, bad, encoded)
    path = dataset.samples[BAD_AT][0]
    if encoded and bad == "cut_in_scan":
        # Its size reads: the stage that decodes it meets the error.
        assert dataset[BAD_AT]["size"].tolist() == [375, 500]
        return
    with pytest.raises(ImageError) as info:
        dataset[BAD_AT]
    assert isinstance(info.value, OSError)  # as Pillow's own errors are
    assert info.value.path == path and info.value.index == BAD_AT
    assert repr(path) in str(info.value) and f"sample {BAD_AT}" in str(info.value)
    for index in range(len(dataset)):
        if index != BAD_AT:
            dataset[index]  # the others read


def test_prefetcher_raises_it_at_its_batchs_turn(tmp_path: Any) -> None:
    dataset = with_bad_file(tmp_path, "cut_in_scan")
    got = []
    with fastq.Prefetcher(dataset, batch_size=2, workers=2, seed=1) as pf:
        with pytest.raises(fastq.WorkerError) as info:
            for _, labels in pf:
                got.append(labels.tolist())
    assert len(got) == BAD_AT // 2  # the batches before it arrived
    assert info.value.sample == BAD_AT
    assert "ImageError" in str(info.value) and "truncated" in str(info.value)
    assert dataset.samples[BAD_AT][0] in info.value.remote_traceback


def test_fastq_torch_dataloader_goes_on_past_it(tmp_path: Any) -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    dataset = with_bad_file(tmp_path, "cut_in_scan")
    it = iter(DataLoader(dataset, batch_size=2, num_workers=2))
    got = [next(it)[1].tolist() for _ in range(BAD_AT // 2)]
    with pytest.raises(ImageError) as info:
        next(it)
    assert info.value.path == dataset.samples[BAD_AT][0]
    assert info.value.index == BAD_AT
    got += [labels.tolist() for _, labels in it]
    lost = dataset.targets[BAD_AT : BAD_AT + 2]  # the failed batch's two
    rest = dataset.targets[:BAD_AT] + dataset.targets[BAD_AT + 2 :]
    assert [label for batch in got for label in batch] == rest
    assert lost[0] == 7


def test_torchs_dataloader_goes_on_past_it(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    dataset = with_bad_file(tmp_path, "cut_in_header")
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2)
    it = iter(loader)
    got = [next(it)[1].tolist() for _ in range(BAD_AT // 2)]
    with pytest.raises(ImageError) as info:
        next(it)
    assert dataset.samples[BAD_AT][0] in str(info.value)
    assert f"sample {BAD_AT}" in str(info.value)
    got += [labels.tolist() for _, labels in it]
    rest = dataset.targets[:BAD_AT] + dataset.targets[BAD_AT + 2 :]
    assert [label for batch in got for label in batch] == rest
    del it
    assert np.isfinite(dataset[0][0]).all()
