"""fastq.torch.DataLoader's place in its stream: set_epoch, and
state_dict / load_state_dict resuming bit for bit, refusing a state of
another stream by name."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers.loader_checks import same  # noqa: E402
from torch_helpers.loader_data import (  # noqa: E402
    Augmented,
    Sharded,
)

import fastq  # noqa: E402
from fastq.torch import DataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]


def test_set_epoch_on_a_distributed_sampler_names_the_epoch() -> None:
    from torch.utils.data.distributed import DistributedSampler

    ds = Augmented(8)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=1)
    loader = DataLoader(
        ds, batch_size=2, sampler=sampler, num_workers=1, persistent_workers=True
    )
    sampler.set_epoch(4)  # where Lightning calls it
    a = list(loader)
    loader.set_epoch(4)
    assert sampler.epoch == 4
    b = list(loader)
    for x, y in zip(a, b):
        assert same(x, y)
    assert len(a) == 2
    loader.close()


def test_resuming_at_an_epoch_repeats_it_exactly() -> None:
    torch.manual_seed(0)
    loader = DataLoader(
        Augmented(12), batch_size=4, num_workers=2, persistent_workers=True
    )
    epochs = [list(loader) for _ in range(3)]
    loader.close()
    torch.manual_seed(0)
    resumed = DataLoader(
        Augmented(12), batch_size=4, num_workers=1, persistent_workers=True
    )
    resumed.epoch = 2
    for a, b in zip(list(resumed), epochs[2]):
        assert torch.equal(a[0], b[0])
    resumed.close()


def loader_for_state(workers: int, persistent: bool) -> DataLoader:
    return DataLoader(
        Augmented(40),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
    )


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_state_dict_resumes_mid_epoch_bit_identical(persistent_workers: bool) -> None:
    """A checkpoint in epoch 1, a new process (another global seed, another
    number of workers): the rest of epoch 1 and epoch 2 are the
    uninterrupted run's, shuffling and augmentations included."""
    torch.manual_seed(3)
    ref = loader_for_state(2, persistent_workers)
    want = [list(ref) for _ in range(3)]
    ref.close()
    torch.manual_seed(3)
    loader = loader_for_state(2, persistent_workers)
    list(loader)
    it = iter(loader)
    got = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 1 and state["batches_done"] == 4
    loader.close()
    torch.manual_seed(999)
    resumed = loader_for_state(3, persistent_workers)
    resumed.load_state_dict(state)
    assert same(got + list(resumed), want[1])
    assert same(list(resumed), want[2])
    resumed.close()


def test_state_dict_at_an_epochs_end_resumes_after_it() -> None:
    torch.manual_seed(5)
    ref = loader_for_state(2, False)
    want = [list(ref) for _ in range(2)]
    torch.manual_seed(5)
    loader = loader_for_state(2, False)
    list(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 0
    resumed = loader_for_state(1, False)
    resumed.load_state_dict(state)
    assert same(list(resumed), want[1])
    # After the last batch, before StopIteration: the rest of that epoch
    # (nothing), then the next, as StatefulDataLoader resumes it.
    torch.manual_seed(5)
    ref = loader_for_state(2, True)
    want = [list(ref) for _ in range(2)]
    ref.close()
    torch.manual_seed(5)
    loader = loader_for_state(2, True)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    state = loader.state_dict()
    assert state["batches_done"] == len(loader)
    loader.close()
    resumed = loader_for_state(2, True)
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert same(list(resumed), want[1])
    resumed.close()


def test_load_state_dict_after_iter_ends_that_loop() -> None:
    loader = loader_for_state(2, True)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    with pytest.raises(fastq.ConfigError, match=r"call iter\(\) again"):
        next(it)
    assert len(list(loader)) == 10
    loader.close()


def test_a_state_of_another_dataset_is_refused() -> None:
    loader = loader_for_state(2, False)
    state = {**loader.state_dict(), "samples": 41}
    with pytest.raises(fastq.ConfigError, match=r"samples'\]=41.*samples=40"):
        loader.load_state_dict(state)
    state = {**loader.state_dict(), "batches": 5}
    with pytest.raises(fastq.ConfigError, match="batch_size"):
        loader.load_state_dict(state)
    with pytest.raises(
        fastq.ConfigError, match=r"over an IterableDataset.*DataLoader/1"
    ):
        DataLoader(Sharded(8), num_workers=1).load_state_dict(loader.state_dict())


def test_a_state_of_another_world_size_names_both_and_the_reshard() -> None:
    from torch.utils.data.distributed import DistributedSampler

    def on(world_size: int) -> DataLoader:
        data = Augmented(40)
        sampler = DistributedSampler(data, num_replicas=world_size, rank=0)
        return DataLoader(data, batch_size=2, sampler=sampler, num_workers=1)

    state = on(2).state_dict()
    assert state["world_size"] == 2
    with pytest.raises(
        fastq.ConfigError, match=r"world_size'\]=2.*world_size=4.*TorchPrefetcher"
    ):
        on(4).load_state_dict(state)


def loader_of_20(persistent: bool, own_generator: bool, workers: int = 2) -> DataLoader:
    """20 batches an epoch, shuffled by the loader's generator or torch's."""
    generator = torch.Generator().manual_seed(7) if own_generator else None
    return DataLoader(
        Augmented(80),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
        generator=generator,
    )


def state_after(loader: DataLoader, batches: int) -> tuple[list[Any], dict[str, Any]]:
    """Epoch 0 whole, then `batches` of epoch 1: those, and the state."""
    list(loader)
    it = iter(loader)
    got = [next(it) for _ in range(batches)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    loader.close()
    return got, state


@pytest.mark.parametrize("persistent_workers", [False, True])
@pytest.mark.parametrize("batches", [3, 20], ids=["mid-epoch", "epoch's end"])
def test_a_state_saved_before_the_first_batch_is_the_loaded_one(
    persistent_workers: bool, batches: int
) -> None:
    """A checkpoint at the first step after a restart (before iter(), and
    after it before any next()) saves exactly what was loaded, as
    torchdata's test_load_state_before_initial_state_dict has it; so does
    a loader whose loop was running (its test_load_then_state)."""
    torch.manual_seed(3)
    _, state = state_after(loader_of_20(persistent_workers, False), batches)
    torch.manual_seed(100)
    loader = loader_of_20(persistent_workers, False)
    loader.load_state_dict(state)
    assert json.loads(json.dumps(loader.state_dict())) == state
    it = iter(loader)
    assert json.loads(json.dumps(loader.state_dict())) == state
    next(it, None)  # (saved at the epoch's end, the rest of it is empty)
    loader.load_state_dict(state)
    assert loader.state_dict() == state
    del it
    loader.close()


@pytest.mark.parametrize(
    ("persistent_workers", "own_generator", "batches"),
    [
        (False, False, 3),
        (False, True, 3),
        (True, False, 3),
        (True, True, 3),
        (True, False, 20),  # at epoch 1's end, before StopIteration
    ],
)
def test_save_load_save_load_run_delivers_exactly_the_rest(
    persistent_workers: bool, own_generator: bool, batches: int
) -> None:
    """A state loaded and saved again before the first batch (a preemption
    handler right after a restart), loaded in a third loader: it delivers
    the batches that remained, bit for bit the uninterrupted run's, and
    the next epoch too."""
    torch.manual_seed(3)
    ref = loader_of_20(persistent_workers, own_generator)
    want = [list(ref) for _ in range(3)]
    ref.close()
    torch.manual_seed(3)
    got, state = state_after(loader_of_20(persistent_workers, own_generator), batches)
    torch.manual_seed(100)
    restarted = loader_of_20(persistent_workers, own_generator, workers=1)
    restarted.load_state_dict(state)
    again = json.loads(json.dumps(restarted.state_dict()))
    restarted.close()
    torch.manual_seed(200)
    resumed = loader_of_20(persistent_workers, own_generator)
    resumed.load_state_dict(again)
    rest = list(resumed)
    later = list(resumed)
    resumed.close()
    if batches < 20:
        assert len(rest) == 20 - batches
        assert same(got + rest, want[1]) and same(later, want[2])
    else:  # the rest of epoch 1 (nothing), as StatefulDataLoader's
        assert rest == []
        assert same(later, want[2])


def test_a_state_saved_between_epochs_keeps_persistent_workers_seed() -> None:
    """Persistent workers keep their base seed across epochs, also when
    the loader was closed in between: so does its state."""
    torch.manual_seed(3)
    ref = loader_of_20(True, False)
    want = [list(ref) for _ in range(2)]
    ref.close()
    torch.manual_seed(3)
    loader = loader_of_20(True, False)
    list(loader)
    loader.close()
    state = json.loads(json.dumps(loader.state_dict()))
    assert same(list(loader), want[1])  # the run that never stopped
    loader.close()
    torch.manual_seed(100)
    resumed = loader_of_20(True, False)
    resumed.load_state_dict(state)
    assert same(list(resumed), want[1])
    resumed.close()
