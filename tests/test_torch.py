"""fastq.torch on the CPU: tensor batches over the ring, their lifetime, the
errors for CUDA options without CUDA, the IterableDataset adapter."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import CountingBatches, assert_whole_loop  # noqa: E402
from process_checks import child_pids  # noqa: E402
from torch_helpers.datasets import (  # noqa: E402
    Datetimes,
    DictImages,
    Images,
    Indices,
    Rows,
    expected,
    image,
)
from torch_helpers.pinning import (  # noqa: E402
    FakeGpu,
    fake_ring,
    in_ring,
    ring_range,
    wait_until,
)

import fastq  # noqa: E402
from fastq.torch import IterableDataset, TorchPrefetcher  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the errors given where CUDA is absent"
)


@pytest.mark.timeout(30)
def test_import_fastq_does_not_import_torch() -> None:
    code = (
        "import sys, fastq\n"
        "from torch_helpers.datasets import Images\n"
        "with fastq.Prefetcher(Images(8), batch_size=4, workers=1) as pf:\n"
        "    batches = list(pf)\n"
        "assert 'torch' not in sys.modules, 'import fastq imported torch'\n"
        "import fastq.torch\n"
        "assert 'torch' in sys.modules\n"
    )
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30, env=env)


def test_tuple_batches_are_bit_exact_zero_copy_tensors() -> None:
    ds = Images(50)
    with TorchPrefetcher(ds, batch_size=8, workers=2) as pf:
        bounds = ring_range(pf)
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # from_numpy must not warn
            for images, labels, halves in pf:
                for t in (images, labels, halves):
                    assert isinstance(t, torch.Tensor)
                    assert in_ring(t, bounds), "a tensor does not view its slot"
                want = expected(labels.numpy())
                assert images.dtype == torch.uint8 and images.shape[1:] == (3, 6, 5)
                assert labels.dtype == torch.int64 and halves.dtype == torch.float32
                assert np.array_equal(images.numpy(), want[0])
                assert np.array_equal(halves.numpy(), want[2])
                images.add_(0)  # writable
                seen += labels.tolist()
        assert seen == list(range(50))
        assert len(pf) == 7


@pytest.mark.parametrize("source", ["map-style", "callable"])
def test_an_unnamed_torch_prefetcher_serves_its_whole_loop_then_closes_quietly(
    source: str,
) -> None:
    """`for batch in TorchPrefetcher(...)`, nothing naming it: its loop
    holds it, so every batch comes, bit for bit; once the loop is done its
    workers are gone (by reference count alone), with nothing to warn of."""
    got: list[tuple[Any, ...]] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.disable()
        try:
            if source == "map-style":
                for batch in TorchPrefetcher(Images(22), batch_size=4, workers=2):
                    got.append(tuple(t.numpy().copy() for t in batch))
            else:
                for batch in TorchPrefetcher(CountingBatches(3), workers=2):
                    got.append(tuple(t.numpy().copy() for t in batch))
            left = child_pids()
        finally:
            gc.enable()
    assert left == [], "the workers outlived the loop and the TorchPrefetcher"
    assert [w for w in caught if w.category is ResourceWarning] == []
    map_style = [expected(range(i, min(i + 4, 22))) for i in range(0, 22, 4)]
    assert_whole_loop(got, map_style if source == "map-style" else None)


@pytest.mark.parametrize("dataset", [DictImages, Rows])
def test_dict_and_single_array_batches_keep_their_structure(dataset: Any) -> None:
    with TorchPrefetcher(dataset(20), batch_size=6, workers=1) as pf:
        bounds = ring_range(pf)
        for b, batch in enumerate(pf):
            idx = np.arange(b * 6, min(20, b * 6 + 6))
            if dataset is DictImages:
                assert list(batch) == ["image", "label"]
                assert in_ring(batch["image"], bounds)
                assert np.array_equal(batch["image"].numpy(), expected(idx)[0])
                assert batch["label"].tolist() == idx.tolist()
            else:
                assert isinstance(batch, torch.Tensor) and in_ring(batch, bounds)
                assert batch.dtype == torch.float64
                assert np.array_equal(batch.numpy(), np.repeat(idx, 4).reshape(-1, 4))


def test_tensors_held_across_iterations_never_change() -> None:
    with TorchPrefetcher(Images(96), batch_size=8, workers=2, slots=4) as pf:
        held: list[tuple[Any, ...]] = []
        for b, (images, labels, _) in enumerate(pf):
            if b % 5 == 0:
                held.append((images, labels, images.clone(), b))
            if len(held) > 2:  # at most two held at once, well under slots=4
                images_, labels_, copy, b_ = held.pop(0)
                assert torch.equal(images_, copy)
                assert np.array_equal(images_.numpy(), expected(labels_.numpy())[0])
                assert labels_.tolist() == list(range(8 * b_, 8 * b_ + 8))
        for images_, labels_, copy, b_ in held:
            assert torch.equal(images_, copy)
            assert labels_.tolist() == list(range(8 * b_, 8 * b_ + 8))


@pytest.mark.parametrize("slots", [1, 3])
def test_slots_batches_may_be_kept_while_taking_the_next(slots: int) -> None:
    """The documented number (docs/torch.md): `slots` batches alive at each
    next() go on indefinitely; one more holds every slot of the ring
    (slots + 1)."""
    with TorchPrefetcher(Images(200), 2, workers=2, slots=slots) as pf:
        it = iter(pf)
        kept = [next(it) for _ in range(slots)]
        for _ in range(30):  # far past the ring's size
            kept.append(next(it))
            kept.pop(0)
        kept.append(next(it))
        match = f"all {slots + 1} slots are held"
        with pytest.raises(fastq.SlotsExhausted, match=match):
            next(it)
        del kept


def test_slot_returns_when_the_last_tensor_is_garbage() -> None:
    with TorchPrefetcher(Images(64), batch_size=8, workers=1, slots=3) as pf:
        consumer = pf._feed.consumer
        it = iter(pf)
        images, labels, halves = next(it)
        assert consumer.held == 1
        view = images[2:].numpy()  # a numpy view of a slice of one tensor
        del images, labels, halves
        gc.collect()
        assert consumer.held == 1, "the slot went back while a view was alive"
        assert np.array_equal(view[0], image(2))
        del view
        assert consumer.held == 0
        for _ in it:  # the rest of the epoch still flows
            pass


def test_copy_true_gives_owned_tensors() -> None:
    with TorchPrefetcher(Images(24), batch_size=8, workers=1, copy=True) as pf:
        bounds = ring_range(pf)
        for images, labels, _ in pf:
            assert pf._feed.consumer.held == 0
            assert not in_ring(images, bounds)
            assert np.array_equal(images.numpy(), expected(labels.numpy())[0])


@pytest.mark.parametrize(
    "how", [{}, {"worker_method": "thread"}], ids=["processes", "threads"]
)
def test_a_dataset_that_needs_its_worker_runs_under_torch_prefetcher(
    how: dict[str, str],
) -> None:
    """Its __getitem__ draws from get_worker_info().rng (None outside a
    worker): the spec comes from a worker, and the tensors are the numpy
    batches of a Prefetcher."""
    from helpers import Augmented

    kw: dict[str, Any] = {"batch_size": 4, "workers": 2, "shuffle": True, "seed": 3}
    with fastq.Prefetcher(Augmented(18), copy=True, **kw, **how) as pf:
        want = [list(b) for b in pf]
    with TorchPrefetcher(Augmented(18), **kw, **how) as pf:
        got = [[t.clone() for t in b] for b in pf]
    assert len(got) == len(want) == 5
    fields = 2 if how else 4  # threads leave `random` and `np.random` alone
    for a, b in zip(got, want):
        for t, x in zip(a[:fields], b[:fields]):
            assert isinstance(t, torch.Tensor)
            np.testing.assert_array_equal(t.numpy(), x)


def test_device_cpu_is_plain_cpu_tensors() -> None:
    with TorchPrefetcher(Rows(8), batch_size=4, workers=1, device="cpu") as pf:
        assert pf.device is None and pf.pin_memory is False
        bounds = ring_range(pf)
        assert all(in_ring(b, bounds) for b in pf)


def test_rank_and_world_size_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with TorchPrefetcher(Indices(10), batch_size=2, workers=1) as pf:
        assert (pf.rank, pf.world_size) == (1, 3)
        assert len(pf) == 2  # ceil(10 / 3) = 4 samples on each rank
        got = torch.cat(list(pf)).tolist()
        # DistributedSampler: padded by wrap-around to 12, then every third.
        assert got == [1, 4, 7, 0]


# ----------------------------------------------------------- errors


@no_cuda
@pytest.mark.parametrize(
    "kwargs",
    [
        {"pin_memory": True},
        {"pin_memory": True, "device": "cpu"},
    ],
)
def test_pin_memory_without_cuda_is_a_clear_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(fastq.ConfigError) as info:
        TorchPrefetcher(Images(8), batch_size=4, workers=1, **kwargs)
    message = str(info.value)
    assert "pin_memory=True needs CUDA" in message
    assert "torch.cuda.is_available() is False" in message
    assert "Leave pin_memory unset" in message


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:1", "cuda:0"])
def test_cuda_device_without_cuda_is_a_clear_error(device: Any) -> None:
    for dev in (device, torch.device(device)):
        with pytest.raises(fastq.ConfigError) as info:
            TorchPrefetcher(Images(8), batch_size=4, workers=1, device=dev)
        message = str(info.value)
        assert f"device={dev!r} needs CUDA" in message
        assert "Leave device unset" in message
    with pytest.raises(fastq.ConfigError, match="needs CUDA"):
        IterableDataset(Images(8), batch_size=4, device=device)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"device": "meta"}, "CUDA devices only"),
        ({"device": "no-such-device"}, "not a torch device"),
        ({"pin_memory": "yes"}, "expected True, False or None"),
    ],
)
def test_bad_torch_options(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(fastq.ConfigError, match=match):
        TorchPrefetcher(Images(8), batch_size=4, workers=1, **kwargs)


def test_dtype_without_torch_equivalent_is_a_spec_error() -> None:
    with pytest.raises(fastq.SpecError, match="no torch equivalent"):
        TorchPrefetcher(Datetimes(8), batch_size=4, workers=1)


def test_prefetcher_arguments_are_checked_before_anything_starts() -> None:
    with pytest.raises(TypeError):
        TorchPrefetcher(Images(8), batch_size=4, no_such_option=1)


# ----------------------------------------------------------- adapter


def test_adapter_feeds_a_dataloader_epoch_after_epoch() -> None:
    with IterableDataset(
        Images(20), batch_size=8, workers=1, shuffle=True, seed=3
    ) as ds:
        assert isinstance(ds, torch.utils.data.IterableDataset)
        loader = ds.loader()
        assert len(loader) == 3
        epochs = []
        for _ in range(2):
            labels = []
            for batch in loader:
                assert isinstance(batch, tuple) and len(batch) == 3
                assert np.array_equal(batch[0].numpy(), expected(batch[1].numpy())[0])
                labels += batch[1].tolist()
            assert sorted(labels) == list(range(20))
            epochs.append(labels)
        assert epochs[0] != epochs[1], "each iter() should be a new epoch"
        assert ds.prefetcher.epoch == 1
        # A DataLoader built by hand: its default collate turns tuples into lists.
        plain = torch.utils.data.DataLoader(ds, batch_size=None)
        first = next(iter(plain))
        assert isinstance(first, list) and first[0].dtype == torch.uint8
        del first


def test_adapter_pickles_until_started() -> None:
    ds = IterableDataset(Images(8), batch_size=4, workers=1)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._prefetcher is None
    try:
        assert len(ds) == 2  # starts it
        with pytest.raises(fastq.ConfigError, match="cannot be pickled"):
            pickle.dumps(ds)
    finally:
        ds.close()
        clone.close()


@pytest.mark.timeout(60)
def test_adapter_refuses_dataloader_workers() -> None:
    ds = IterableDataset(Images(8), batch_size=4, workers=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1)
    it = iter(loader)
    try:
        with pytest.raises(fastq.ConfigError, match="DataLoader worker"):
            next(it)
    finally:
        it._shutdown_workers()
        del it
        ds.close()


# ------------------------------------- deferred release, with fake events


def test_pinned_batch_slots_wait_for_their_gpu_events() -> None:
    """The pinned-memory bookkeeping without a GPU: a pinned batch's slot
    goes back only once the event recorded when its last tensor died has
    completed, the GPU running a step behind the loop; the loop's thread
    never waits on an event (the ring's returner thread does)."""
    gpu = FakeGpu()
    with TorchPrefetcher(Images(80), batch_size=8, workers=1, slots=3) as pf:
        cuda = fake_ring(torch.device("cuda", 0), gpu)
        pf._cuda = cuda  # as pin_memory=True would, less the registration
        ring = pf._ring
        consumer = pf._feed.consumer
        bounds = ring_range(pf)
        it = iter(pf)
        images, labels, _ = next(it)
        assert in_ring(images, bounds)
        assert np.array_equal(images.numpy(), expected(labels.numpy())[0])
        del images, labels, _
        assert len(cuda.pending) == 1 and consumer.held == 1, "freed before its event"
        for b, (images, labels, _) in enumerate(it, start=1):
            assert labels.tolist() == list(range(8 * b, 8 * b + 8))
            assert np.array_equal(images.numpy(), expected(labels.numpy())[0])
            del images, labels, _
            assert consumer.held <= ring.nslots
            gpu.run_to(len(gpu.recorded) - 1)  # one step behind
        assert set(gpu.synchronized_on) == {"fastq-pinned-returner"}
        gpu.run_all()
        wait_until(lambda: consumer.held == 0 and not cuda.pending)


def test_device_batch_slots_wait_for_their_copy_events() -> None:
    """The device path's bookkeeping without a GPU ('meta' tensors stand in
    for device copies): the consumer's stream waits on each copy's event,
    and a slot is held exactly until its copy's event has completed, never
    by the handed-out tensors."""
    gpu = FakeGpu()
    with TorchPrefetcher(Images(80), batch_size=8, workers=1, slots=3) as pf:
        cuda = fake_ring(torch.device("meta"), gpu, copy_stream=True)
        pf._cuda, pf.device = cuda, cuda.device  # as device= would, on 'meta'
        books = pf._feed.consumer
        consumer = cuda.cuda.consumer
        batches = 0
        for images, labels, halves in pf:
            assert images.is_meta and labels.is_meta and halves.is_meta
            assert images.shape == (8, 3, 6, 5) and labels.dtype == torch.int64
            assert consumer.waited[-1] is cuda.pending[-1][0]
            # Only copies not yet done hold slots (the returner gives the
            # others back); the tensors we hold hold none.
            wait_until(lambda: books.held == sum(not e.done for e, _ in cuda.pending))
            batches += 1
            gpu.run_to(len(gpu.recorded) - 1)  # the copy before this one ran
        assert batches == 10
        assert set(gpu.synchronized_on) == {"fastq-pinned-returner"}
        gpu.run_all()
        wait_until(lambda: books.held == 0)
