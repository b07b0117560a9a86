"""The image decode stage on a real GPU, with each GPU decoder installed
(skipped without CUDA, or without the decoder): its pixels against
fastq.vision's CPU decode, and a DataLoader epoch whose loop's thread
never synchronizes. The same checks on a fake GPU run everywhere
(tests/test_decode_stage.py); these are for a GPU machine's run
(benchmarks/gpu_check.sh)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from torch_helpers.encoded_images import (  # noqa: E402
    MIN_PSNR_DB,
    SIZE,
    encoded_sample,
    image_files,
    make_files,
    psnr,
    reference,
)

from fastq.torch import DataLoader  # noqa: E402
from fastq.torch._decode_cuda import TorchDecodeCuda  # noqa: E402
from fastq.torch._decode_stage import DecodeStage, collate_encoded  # noqa: E402
from fastq.torch._decoders import open_decoder  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

BACKENDS = ["nvimgcodec", "torchvision"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, int, int]]:
    return make_files(tmp_path_factory.mktemp("images"), count=16)


def _decoder(name: str) -> object:
    decoder, why = open_decoder(name, torch.device("cuda", 0))
    if decoder is None:
        pytest.skip(why)
    return decoder


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_gpu_decode_equals_pillows_within_the_tolerance(
    backend: str, files: list[tuple[str, int, int]]
) -> None:
    decoder = _decoder(backend)
    dataset = image_files(files)
    device = torch.device("cuda", 0)
    stage = DecodeStage(dataset.decode_plan, decoder, TorchDecodeCuda(device))  # type: ignore[arg-type]
    batch = collate_encoded([encoded_sample(dataset, i) for i in range(len(dataset))])
    images, labels = stage.hand_out(stage.issue(batch))
    torch.cuda.synchronize()
    assert images.device.type == "cuda" and images.shape == (len(dataset), 3, *SIZE)
    want = reference(dataset, range(len(dataset)))
    got = images.cpu()
    for i in range(len(dataset)):
        assert psnr(got[i], want[i]) >= MIN_PSNR_DB, (backend, dataset.samples[i][0])
    assert labels.cpu().tolist() == [label for _, label in dataset.samples]
    print(backend, stage.stats())
    stage.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dataloader_epoch_on_the_gpu(
    backend: str, files: list[tuple[str, int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Images on the device, bf16 and channels-last as asked; the loop's
    thread never synchronizes on the stage's account (only close does)."""
    _decoder(backend)
    calls: list[str] = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(
        torch.cuda, "synchronize", lambda *a: (calls.append("s"), real(*a))
    )
    dataset = image_files(files, repeat=8)
    loader = DataLoader(
        dataset,
        batch_size=16,
        num_workers=2,
        pin_memory=True,
        decode_backend=backend,
        decode_dtype=torch.bfloat16,
        channels_last=True,
        persistent_workers=True,
    )
    for images, labels in loader:
        assert images.is_cuda and images.dtype == torch.bfloat16
        assert images.is_contiguous(memory_format=torch.channels_last)
        assert labels.is_cuda
    assert calls == []
    stats = loader.stats()
    assert stats["decode"]["batches"] == 8 and stats["pinned"]["loop_synchronizes"] == 0
    print(backend, stats["decode"])
    loader.close()
