"""fastq.torch on a GPU: the page-locked ring, copies to the device on a
side stream, slots held until their copies have run, and host-to-device
bandwidth from the ring. Skipped where no CUDA device is visible."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_helpers.datasets import Bulk, DictImages, Images, expected  # noqa: E402
from torch_helpers.pinning import wait_until  # noqa: E402

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


def copy_behind_a_long_kernel(batches: Any) -> list[Any]:
    """Queues each pinned batch's non_blocking copy, the first behind a
    kernel that runs about a second, and drops the batch at once: its slot
    must wait for the copy, not for us."""
    copies = []
    for b, (images, labels, halves) in enumerate(batches):
        assert images.is_pinned() and labels.is_pinned() and not images.is_cuda
        if b == 0:
            torch.cuda._sleep(SLEEP_CYCLES)  # on the current stream
        copies.append(
            [t.to("cuda", non_blocking=True) for t in (images, labels, halves)]
        )
        del images, labels, halves
    torch.cuda.synchronize()
    return copies


def test_pinned_cpu_batches_outlive_their_non_blocking_copies() -> None:
    n, rows = 120, 8
    with TorchPrefetcher(
        Images(n), batch_size=rows, workers=2, slots=3, pin_memory=True
    ) as pf:
        assert pf.device is None
        check_in_order(copy_behind_a_long_kernel(pf), rows)


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


# ------------------------------------ the DataLoader face's pinned ring


def test_dataloader_pinned_batches_outlive_their_non_blocking_copies() -> None:
    """Two slots and a fast producer: every batch is released while its
    copy is still queued behind a long kernel, and still arrives intact."""
    from fastq.torch import DataLoader

    n, rows = 120, 8
    loader = DataLoader(
        Images(n), batch_size=rows, num_workers=2, pin_memory=True, slots=2
    )
    check_in_order(copy_behind_a_long_kernel(loader), rows)
    loader.close()


def pinned_blocks_taken(loader: Any) -> tuple[int, int]:
    """(batches, blocks of torch's pinned-memory allocator handed out while
    they were iterated, after the first)."""

    def handed() -> int:
        return int(torch.cuda.host_memory_stats()["active_requests.allocated"])

    it = iter(loader)
    next(it)  # the workers run (and fastq's ring exists)
    engine = getattr(loader, "_engine", None)
    if engine is not None:
        # fastq pins its ring off the first batch's path: once it is
        # pinned, no batch takes a block.
        wait_until(lambda: engine._engine.pinning.registered)
    before = handed()
    batches = 0
    for images, *_ in it:
        assert images.is_pinned()
        images.to("cuda", non_blocking=True)
        batches += 1
    torch.cuda.synchronize()
    return batches, handed() - before


def test_dataloader_pins_without_a_page_locked_allocation_per_batch() -> None:
    """torch's DataLoader takes a block of its pinned-memory allocator per
    batch (which shows the count counts); the page-locked ring takes none."""
    from torch.utils.data import DataLoader as TorchLoader

    from fastq.torch import DataLoader

    kwargs: dict[str, Any] = {"batch_size": 8, "num_workers": 2, "pin_memory": True}
    batches, taken = pinned_blocks_taken(TorchLoader(Images(256), **kwargs))
    assert batches == 31 and taken >= batches
    loader = DataLoader(Images(256), slots=4, **kwargs)
    batches, taken = pinned_blocks_taken(loader)
    # Not one per batch (whatever else in the process may take one).
    assert batches == 31 and taken < batches, f"{taken} pinned blocks taken"
    loader.close()


def test_dataloader_forks_its_workers_after_cuda_with_a_late_import(
    tmp_path: Any,
) -> None:
    """A model on the GPU, then `import fastq.torch` (a notebook cell, a
    trainer's late import): the workers fork from the script, as
    DataLoader's do, and the first batch comes at fork's cost
    (benchmarks: python -m fastq bench --case torch-startup)."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import json, os, time
        import torch
        torch.zeros(1, device="cuda")
        import fastq.torch
        from torch_helpers.datasets import Images

        loader = fastq.torch.DataLoader(Images(64), batch_size=8, num_workers=2)
        t0 = time.perf_counter()
        it = iter(loader)
        images, labels, halves = next(it)
        first = time.perf_counter() - t0
        pids = [w["pid"] for w in loader.stats()["workers"]]
        parents = set()
        for pid in pids:
            with open(f"/proc/{pid}/stat") as f:
                parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
        rows = labels.tolist() + [x for b in it for x in b[1].tolist()]
        print(json.dumps({"parents": sorted(parents), "me": os.getpid(),
                          "rows": rows, "first_s": first}))
        """
    )
    path = tmp_path / "late.py"
    path.write_text(script)
    here = str(__import__("pathlib").Path(__file__).resolve().parent)
    paths = [here, os.environ.get("PYTHONPATH")]
    proc = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        # The tests' helpers, then whatever path made fastq importable here.
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parents"] == [out["me"]]
    assert out["rows"] == list(range(64))
