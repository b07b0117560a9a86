"""The image decode stage's files and modes: what the GPU backend leaves is
decoded per image, a corrupt file fails its own batch at its turn naming
its path and index, and without CUDA or a decoder the workers decode with
one warning, as on CI and laptops."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from torch_helpers import encoded_images  # noqa: E402
from torch_helpers.encoded_images import (  # noqa: E402
    MIN_PSNR_DB,
    SIZE,
    OnFakeGpu,
    image_files,
    loader_on,
    psnr,
    reference,
    truncate,
)
from torch_helpers.pinning import wait_until  # noqa: E402

from fastq.errors import ConfigError, ImageError  # noqa: E402
from fastq.torch import DataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The shared fixtures, taken by name.
files = encoded_images.files
fake_gpu = encoded_images.fake_gpu


def test_other_kinds_and_rejected_files_are_decoded_per_image(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """The backend is given the baseline JPEGs only (it does not take other
    kinds), and rejects one of them: the progressive, grayscale, CMYK and
    PNG files and the rejected one are decoded per image, and the batch is
    whole and right."""
    decoder = fake_gpu.decoder
    dataset = image_files(files)  # 8 baseline, then 4 others
    rejected = 3
    decoder.reject = {Path(files[rejected][0]).stat().st_size}
    # Without workers: the crops are the dataset's own, as reference()'s.
    loader = loader_on(dataset, fake_gpu, batch_size=len(dataset), num_workers=0)
    [(images, _labels)] = list(loader)
    assert decoder.calls[0][0] == 8  # the baseline files only
    want = reference(dataset, range(len(dataset)))
    for i in range(len(dataset)):
        assert psnr(images[i], want[i]) >= MIN_PSNR_DB, dataset.samples[i][0]
    stats = loader.stats()["decode"]
    assert stats["rejected"] == 1 and stats["per_image"] == 4 + 1
    fake_gpu.gpu.run_all()
    loader.close()


def test_a_corrupt_file_fails_its_own_batch_naming_its_path_and_index(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]], tmp_path: Path
) -> None:
    """A truncated file: the batches before it come whole, its batch raises
    the ImageError a worker decoding it raises (path and index, with
    Pillow's error), at its turn (not while the batch before it is handed out),
    and the epoch goes on."""
    copies = []
    for path, label, kind in files[:8]:
        copy = tmp_path / Path(path).name
        shutil.copy(path, copy)
        copies.append((str(copy), label, kind))
    bad = 5
    truncate(copies[bad][0])
    dataset = image_files(copies)
    loader = loader_on(dataset, fake_gpu, batch_size=2)
    it = iter(loader)
    for b in range(bad // 2):
        _images, labels = next(it)
        assert labels.tolist() == [dataset.samples[i][1] for i in (2 * b, 2 * b + 1)]
    with pytest.raises(OSError) as failed:
        next(it)
    # As the workers' decoded mode says it (fastq.vision).
    said = f"image {copies[bad][0]!r} (sample {bad}) cannot be decoded: OSError"
    assert str(failed.value).startswith(said)
    assert isinstance(failed.value, ImageError) and failed.value.index == bad
    del failed
    rest = [labels.tolist() for _, labels in it]
    assert rest == [[dataset.samples[6][1], dataset.samples[7][1]]]
    fake_gpu.gpu.run_all()
    loader.close()


def test_without_cuda_the_workers_decode_with_one_warning(
    files: list[tuple[str, int, int]],
) -> None:
    """No CUDA (this machine): the dataset stays in decoded mode, the
    workers decode, the batches are DataLoader's (float32 images and
    labels), and one warning says why, for two epochs."""
    dataset = image_files(files)
    with pytest.warns(RuntimeWarning, match="decoded in the workers") as caught:
        loader = DataLoader(dataset, batch_size=4, num_workers=1)
        epochs = [list(loader) for _ in range(2)]
    assert len([w for w in caught if "decoded in the workers" in str(w.message)]) == 1
    assert not dataset.encoded
    images, _labels = epochs[1][0]
    assert images.shape == (4, 3, *SIZE) and images.dtype == torch.float32
    loader.close()


def test_decode_backend_cpu_decodes_in_the_workers_quietly(
    files: list[tuple[str, int, int]],
) -> None:
    dataset = image_files(files)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoader(dataset, batch_size=4, num_workers=0, decode_backend="cpu")
    assert not dataset.encoded and len(list(loader)) == 3


def test_a_gpu_without_a_decoder_decodes_in_the_workers_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, files: list[tuple[str, int, int]]
) -> None:
    from fastq.torch import _image_decode

    monkeypatch.setattr(_image_decode, "_installed", lambda name: False)
    monkeypatch.setattr(_image_decode, "cuda_available", lambda: True)
    dataset = image_files(files)
    with pytest.warns(RuntimeWarning, match="no GPU decoder is installed"):
        DataLoader(dataset, batch_size=4, decode_backend="nvimgcodec")
    assert not dataset.encoded


def test_a_collate_fn_keeps_the_workers_decoding(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    dataset = image_files(files)
    with pytest.warns(RuntimeWarning, match="collate_fn="):
        DataLoader(dataset, batch_size=4, collate_fn=lambda b: b)
    assert not dataset.encoded


def test_an_unknown_backend_or_dtype_is_refused(
    files: list[tuple[str, int, int]],
) -> None:
    with pytest.raises(ConfigError, match="decode_backend='nvjpeg'"):
        DataLoader(image_files(files), decode_backend="nvjpeg")
    with pytest.raises(ConfigError, match="decode_dtype='bf16'"):
        DataLoader(image_files(files), decode_dtype="bf16")


def test_without_workers_the_stage_decodes_in_the_loaders_process(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """num_workers=0: DataLoader's own loop makes the encoded batches, and
    the stage decodes them as it decodes a ring's."""
    dataset = image_files(files[:8])
    loader = loader_on(dataset, fake_gpu, batch_size=4, num_workers=0)
    got = []
    for images, _labels in loader:
        got.append(images)
        fake_gpu.gpu.run_all()
    want = reference(dataset, range(8))
    assert all(psnr(a, b) >= MIN_PSNR_DB for a, b in zip(torch.cat(got), want))
    loader.close()


def test_a_state_saved_mid_epoch_resumes_after_the_batch_handed_out(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """fastq.torch.DataLoader: a state saved after batch k (batch k+1 then
    decoding) resumes at batch k+1, on another number of workers, with the
    same crops and flips as the uninterrupted run's."""
    gpu = fake_gpu.gpu
    dataset = image_files(files[:8], repeat=3)  # 24 files, 6 batches
    loader = loader_on(dataset, fake_gpu, batch_size=4, num_workers=2, shuffle=True)
    whole = []
    for k, (images, labels) in enumerate(loader):
        whole.append((images, labels))
        gpu.run_all()
        if k == 1:
            state = loader.state_dict()
    loader.close()
    again = loader_on(dataset, fake_gpu, batch_size=4, num_workers=1, shuffle=True)
    again.load_state_dict(state)
    rest = []
    for images, labels in again:
        rest.append((images, labels))
        gpu.run_all()
    assert len(rest) == 4
    for (a, la), (b, lb) in zip(rest, whole[2:]):
        assert torch.equal(la, lb) and torch.equal(a, b)
    again.close()


# ------------------------------------------------------- TorchPrefetcher


@pytest.fixture
def fake_cuda_device(fake_gpu: OnFakeGpu, monkeypatch: pytest.MonkeyPatch) -> OnFakeGpu:
    """TorchPrefetcher(device="cuda") accepted on this machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return fake_gpu


def test_torchprefetcher_decodes_on_the_gpu_and_saves_the_place_it_handed_out(
    fake_cuda_device: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """TorchPrefetcher(dataset, device="cuda"): the dataset's encoded_spec
    is the spec, batches are (images, labels) from the decode stage, and a
    state saved after batch k (batches after it already decoding) resumes
    at batch k+1, as the uninterrupted run goes on."""
    from fastq.torch import TorchPrefetcher

    gpu, decoder = fake_cuda_device.gpu, fake_cuda_device.decoder
    dataset = image_files(files[:8], repeat=3)  # 24 files, 6 batches
    kwargs: dict[str, Any] = {"workers": 1, "device": "cuda", "decode_backend": decoder}
    with TorchPrefetcher(dataset, 4, **kwargs) as pf:
        assert dataset.encoded
        it = iter(pf)
        whole = []
        for k, (images, labels) in enumerate(it):
            assert images.shape == (4, 3, *SIZE)
            # The next one is decoding, or soon is.
            wait_until(lambda k=k: len(decoder.calls) >= min(k + 2, 6))
            whole.append(labels.tolist())
            if k == 1:
                state = pf.state_dict()
            gpu.run_all()
        assert pf.stats()["decode"]["batches"] == 6
    with TorchPrefetcher(dataset, 4, state=state, **kwargs) as pf:
        rest = []
        for _, labels in pf:
            rest.append(labels.tolist())
            gpu.run_all()
    assert rest == whole[2:]
