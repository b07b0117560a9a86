"""The image decode stage on a fake GPU whose events complete only when the
test says (tests/torch_helpers/encoded_images.py): batch k+1's decode is
queued before the loop gets batch k, the loop's thread never
synchronizes, a slot goes back only after the decode that reads it, the
stage's memory stays bounded, files the GPU backend leaves are decoded
per image, a corrupt file fails its own batch at its turn, and the pixels
equal Pillow's within a stated tolerance."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from torch_helpers import encoded_images  # noqa: E402
from torch_helpers.encoded_images import (  # noqa: E402
    MIN_PSNR_DB,
    SIZE,
    OnFakeGpu,
    baseline,
    encoded_sample,
    image_files,
    loader_on,
    psnr,
    reference,
)
from torch_helpers.pinning import wait_until  # noqa: E402

from fastq._core._ring import FREE  # noqa: E402
from fastq._loop._engine import DEVICE_SLOTS  # noqa: E402
from fastq.torch._decode_stage import (  # noqa: E402
    DECODE_LOOKAHEAD,
    DecodeStage,
    collate_encoded,
)

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The shared fixtures, taken by name.
files = encoded_images.files
fake_gpu = encoded_images.fake_gpu


# ------------------------------------------------------------------ pixels


@pytest.mark.parametrize(
    ("crops", "validation"), [(False, False), (True, False), (True, True)]
)
def test_the_stage_output_equals_pillows_within_the_tolerance(
    files: list[tuple[str, int, int]], crops: bool, validation: bool
) -> None:
    """Every kind of file (baseline JPEGs on the stand-in GPU backend, the
    others per image): the stage's normalized batch is fastq.vision's CPU
    decode (Pillow's decode, the same box, resize, flip, Normalize) within
    MIN_PSNR_DB, with the backend decoding whole images (then cropped) or
    the box alone; a validation pipeline's (Resize, CenterCrop) too, its
    centre crop taken as the box it comes from."""
    on = OnFakeGpu(crops=crops)
    dataset = image_files(files, validation=validation)
    stage = DecodeStage(dataset.decode_plan, on.decoder, on.cuda)
    batch = collate_encoded([encoded_sample(dataset, i) for i in range(len(dataset))])
    images, labels = stage.hand_out(stage.issue(batch))
    size = (32, 32) if validation else SIZE
    assert images.shape == (len(dataset), 3, *size) and images.dtype == torch.float32
    assert labels.tolist() == [label for _, label in dataset.samples]
    want = reference(dataset, range(len(dataset)))
    for i in range(len(dataset)):
        assert psnr(images[i], want[i]) >= MIN_PSNR_DB, (i, dataset.samples[i][0])
    assert stage.stats()["per_image"] == 4  # progressive, gray, CMYK, PNG
    on.gpu.run_all()
    stage.close()


def test_the_dtype_and_memory_format_are_the_steps(
    files: list[tuple[str, int, int]],
) -> None:
    """decode_dtype and channels_last: the batch as the step wants it."""
    on = OnFakeGpu()
    ds = image_files(files)
    stage = DecodeStage(
        ds.decode_plan, None, on.cuda, dtype=torch.bfloat16, channels_last=True
    )
    batch = collate_encoded([encoded_sample(ds, 0), encoded_sample(ds, 1)])
    images, _ = stage.hand_out(stage.issue(batch))
    assert images.dtype == torch.bfloat16
    assert images.is_contiguous(memory_format=torch.channels_last)
    want = reference(ds, [0, 1])
    # bf16 keeps 8 bits of mantissa: about 1/256 of a normalized value.
    assert all(psnr(images[i].float(), want[i]) >= 30.0 for i in range(2))
    on.gpu.run_all()
    stage.close()


def test_crops_of_one_shape_resize_in_one_call_as_each_alone() -> None:
    """Crops that share a shape are resized in one call per shape: each
    image's result is exactly what its own call gives, whatever else the
    batch holds."""
    import torch.nn.functional as F

    on = OnFakeGpu()
    ds = image_files([("unused.jpg", 0, 0)])
    stage = DecodeStage(ds.decode_plan, None, on.cuda)
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 40, 50), (3, 31, 47), (3, 40, 50), (3, 40, 50), (3, 31, 47)]
    crops = [torch.randint(0, 256, s, generator=gen, dtype=torch.uint8) for s in shapes]
    calls = []
    interpolate = F.interpolate

    def counted(x: Any, **kwargs: Any) -> Any:
        calls.append(len(x))
        return interpolate(x, **kwargs)

    F.interpolate = counted
    try:
        batch = stage._resize(crops)
    finally:
        F.interpolate = interpolate
    assert sorted(calls) == [2, 3]
    for i, c in enumerate(crops):
        alone = interpolate(
            c.unsqueeze(0).float(),
            size=SIZE,
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )
        assert torch.equal(batch[i], alone[0])


# ------------------------------------------------- the loop and the GPU


def test_batch_k_plus_1_is_decoding_before_the_loop_gets_batch_k(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """When the loop gets batch k, batch k+1's decode is queued on the
    stage's stream (so it runs while step k does) or soon is, no more than
    the lookahead beyond it, batch k's images are fenced by its event on
    the loop's stream, and the GPU has run nothing yet: the loop never
    waited for it."""
    gpu, decoder, cuda = fake_gpu.gpu, fake_gpu.decoder, fake_gpu.cuda
    dataset = image_files(baseline(files), repeat=3)  # 24 files
    loader = loader_on(dataset, fake_gpu, batch_size=4, timeout=30)
    batches = len(loader)
    seen = 0
    for k, (images, labels) in enumerate(loader):
        wait_until(lambda k=k: len(decoder.calls) >= min(k + 2, batches))
        assert len(decoder.calls) <= min(k + 1 + DECODE_LOOKAHEAD, batches)
        assert all(stream is cuda.streams[0] for _, stream in decoder.calls)
        done = cuda.handed[k][1]
        assert cuda.consumer.waited[-1] is done  # the loop's stream waits
        assert not done.done and gpu.passed == 0  # and its thread did not
        assert threading.current_thread().name not in gpu.synchronized_on
        assert images.shape == (4, 3, *SIZE)
        want = [dataset.samples[i][1] for i in range(4 * k, 4 * k + 4)]
        assert labels.tolist() == want
        seen += 1
    assert seen == batches == 6
    stats = loader.stats()  # the engine is closed after a transient epoch
    assert stats["decode"]["batches"] == 6
    gpu.run_all()
    loader.close()


def test_no_synchronize_on_the_loops_thread_and_slots_wait_for_their_decode(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """The GPU stops: every slot whose bytes a queued decode reads stays
    held, and the workers make no batch into one (the loop's thread never
    waits on the GPU for them: it would wait for a batch, as for slow
    workers); once the GPU runs, the slots come back and the epoch goes on
    to its end."""
    gpu = fake_gpu.gpu
    dataset = image_files(baseline(files), repeat=10)  # 80 files
    loader = loader_on(
        dataset, fake_gpu, batch_size=2, slots=2, persistent_workers=True
    )
    it = iter(loader)
    next(it)
    engine = loader._engine._engine
    [ring] = fake_gpu.rings
    nslots = engine.ring.nslots  # the window (2), one for the loop, DEVICE_SLOTS
    for _ in range(nslots - 2):
        next(it)
    # Each batch handed out, and those decoding ahead, wait on the GPU.
    wait_until(lambda: ring.waiting == nslots)
    wait_until(lambda: engine.ring.depth(FREE) == 0)
    made = sum(w["batches"] for w in loader.stats()["workers"])
    assert made == nslots
    assert threading.current_thread().name not in gpu.synchronized_on
    got = nslots - 1
    while True:
        # The GPU runs all but the decode queued last (the batch ahead).
        gpu.run_to(len(gpu.recorded) - 1)
        if next(it, None) is None:
            break
        got += 1
    assert got == 40
    assert threading.current_thread().name not in gpu.synchronized_on
    assert loader.stats()["pinned"]["loop_synchronizes"] == 0
    gpu.run_all()
    del it
    loader.close()


def test_the_stages_memory_stays_bounded_over_a_thousand_batches(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """A thousand batches, the GPU a step behind the loop: the stage's
    batches in flight, its device bytes, the decoder's live outputs and
    the slots waiting for a decode stay bounded by a few batches."""
    gpu, decoder = fake_gpu.gpu, fake_gpu.decoder
    dataset = image_files(baseline(files), repeat=250)  # 2,000 files
    loader = loader_on(dataset, fake_gpu, batch_size=2, slots=4)
    one_batch = 0
    live_peak = 0
    for k, (images, labels) in enumerate(loader):
        del images, labels
        gpu.run_to(k)  # the GPU has run batch k - 1's decode; k and k+1 queued
        stats = loader.stats()["decode"]
        if k == 0:
            one_batch = stats["peak_gpu_bytes"]
        live_peak = max(live_peak, sum(r() is not None for r in decoder.made))
    assert k == 999
    stats = loader.stats()
    assert stats["decode"]["peak_in_flight"] <= 3
    assert stats["decode"]["peak_gpu_bytes"] <= 3 * one_batch * 1.5
    [ring] = fake_gpu.rings
    # The decoded files go with their slot (the returner drops both, a
    # moment after the GPU passes their event): never more than the ring's
    # slots' worth, and none once every decode has run.
    nslots = 4 + 1 + DEVICE_SLOTS
    assert ring.peak_waiting <= nslots
    assert live_peak <= 2 * nslots
    gpu.run_all()
    loader.close()
    assert sum(r() is not None for r in decoder.made) == 0
