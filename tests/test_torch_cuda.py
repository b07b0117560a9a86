"""fastq.torch on a GPU: the page-locked ring, copies to the device on a
side stream, slots held until their copies have run, and host-to-device
bandwidth from the ring. Skipped where no CUDA device is visible."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers.datasets import Bulk, DictImages, Images, expected  # noqa: E402

import fastq  # noqa: E402
from fastq.torch import TorchPrefetcher  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (torch.cuda.is_available() is False)",
    ),
]

# torch.cuda._sleep spins a kernel for this many GPU clock cycles (about a
# second at 1-2 GHz): long enough that every batch below is handed out
# while the copies are still queued behind it.
SLEEP_CYCLES = 1_500_000_000


def check(batch: Any, labels: Any) -> None:
    want = expected(labels)
    assert np.array_equal(batch[0].cpu().numpy(), want[0])
    assert np.array_equal(batch[2].cpu().numpy(), want[2])


def check_in_order(batches: list[Any], rows: int) -> None:
    """Batch b holds samples b*rows .. (b+1)*rows - 1, labels and content."""
    for b, batch in enumerate(batches):
        labels = np.arange(b * rows, (b + 1) * rows)
        assert batch[1].cpu().tolist() == labels.tolist()
        check(batch, labels)


def test_device_batches_are_correct_and_on_the_device() -> None:
    with TorchPrefetcher(Images(70), batch_size=8, workers=2, device="cuda") as pf:
        assert pf.pin_memory and pf.device is not None and pf.device.index is not None
        seen = []
        for images, labels, halves in pf:
            for t in (images, labels, halves):
                assert t.device == pf.device
            check((images, labels, halves), labels.cpu().numpy())
            seen += labels.tolist()
        assert seen == list(range(70))


def test_device_keeps_the_batch_structure() -> None:
    with TorchPrefetcher(
        DictImages(10), batch_size=4, workers=1, device="cuda:0"
    ) as pf:
        for batch in pf:
            assert list(batch) == ["image", "label"]
            assert batch["image"].is_cuda and batch["label"].is_cuda
            assert np.array_equal(
                batch["image"].cpu().numpy(), expected(batch["label"].cpu().numpy())[0]
            )


def test_device_slot_is_held_until_its_copy_has_run() -> None:
    n, rows = 160, 8
    with TorchPrefetcher(
        Images(n), batch_size=rows, workers=2, slots=3, device="cuda"
    ) as pf:
        cuda = pf._cuda
        assert cuda is not None and cuda.stream is not None
        it = iter(pf)
        # Every copy queues behind this kernel on the copy stream.
        with torch.cuda.stream(cuda.stream):
            torch.cuda._sleep(SLEEP_CYCLES)
        first = next(it)
        event, _ = cuda.pending[-1]
        assert not event.query(), "the copy ran before the sleep kernel ended"
        assert pf._feed.consumer.held == 1, "the slot was freed before its copy ran"
        batches = [first, *it]  # slots=3: the loop must wait for copies
        torch.cuda.synchronize()
        # Had a slot been reused early, its copy would have read a later batch.
        check_in_order(batches, rows)


def test_consumer_stream_waits_for_the_copy() -> None:
    rows, row_bytes = 32, 1 << 16
    with TorchPrefetcher(
        Bulk(3 * rows, row_bytes), batch_size=rows, workers=1, device="cuda"
    ) as pf:
        cuda = pf._cuda
        assert cuda is not None and cuda.stream is not None
        it = iter(pf)
        for b in range(3):
            with torch.cuda.stream(cuda.stream):
                torch.cuda._sleep(SLEEP_CYCLES // 4)
            batch = next(it)
            # Queued on the current stream at once: it must see the copy,
            # which is still behind the sleep on the copy stream.
            total = batch.sum(dtype=torch.int64).item()
            rows_ = range(b * rows, (b + 1) * rows)
            assert total == sum(i % 251 for i in rows_) * row_bytes


def test_pinned_cpu_batches_outlive_their_non_blocking_copies() -> None:
    n, rows = 120, 8
    with TorchPrefetcher(
        Images(n), batch_size=rows, workers=2, slots=3, pin_memory=True
    ) as pf:
        assert pf.device is None
        copies = []
        for b, (images, labels, halves) in enumerate(pf):
            assert images.is_pinned() and not images.is_cuda
            if b == 0:
                torch.cuda._sleep(SLEEP_CYCLES)  # on the current stream
            copies.append(
                [t.to("cuda", non_blocking=True) for t in (images, labels, halves)]
            )
            del images, labels, halves  # the slot waits for the copy, not for us
        torch.cuda.synchronize()
        check_in_order(copies, rows)


def test_copy_true_with_pinning_is_refused() -> None:
    for kwargs in ({"pin_memory": True}, {"device": "cuda"}):
        with pytest.raises(fastq.ConfigError, match="drop copy=True"):
            TorchPrefetcher(Images(8), batch_size=4, workers=1, copy=True, **kwargs)


def test_close_unpins_and_handed_out_batches_stay_valid() -> None:
    pf = TorchPrefetcher(Images(16), batch_size=8, workers=1, pin_memory=True)
    images, labels, halves = next(iter(pf))
    assert images.is_pinned()
    pf.close()
    assert pf._cuda is not None and not pf._cuda.registered
    assert not images.is_pinned()
    check((images, labels, halves), labels.numpy())
    del images, labels, halves


def h2d_seconds(src: Any, dst: Any, repeat: int = 10) -> float:
    """Best time of `repeat` host-to-device copies, timed with CUDA events."""
    best = float("inf")
    for _ in range(repeat):
        start, end = (
            torch.cuda.Event(enable_timing=True),
            torch.cuda.Event(enable_timing=True),
        )
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def test_host_to_device_bandwidth_from_the_ring_matches_pinned_tensors() -> None:
    rows, row_bytes = 64, 1 << 20  # one 64 MiB batch
    with TorchPrefetcher(
        Bulk(rows, row_bytes), batch_size=rows, workers=1, pin_memory=True
    ) as pf:
        (batch,) = [b for b in pf]
        assert batch.is_pinned() and batch.numel() == rows * row_bytes
        reference = torch.empty_like(batch).pin_memory()
        reference.copy_(batch)
        dst = torch.empty(batch.shape, dtype=batch.dtype, device="cuda")
        h2d_seconds(batch, dst, 2)  # warm-up
        ring = batch.numel() / h2d_seconds(batch, dst)
        pinned = reference.numel() / h2d_seconds(reference, dst)
        del batch
        assert torch.equal(dst.cpu(), reference)
        assert ring >= 0.9 * pinned, (
            f"ring {ring / 1e9:.2f} GB/s vs torch pinned {pinned / 1e9:.2f} GB/s"
        )
