"""fastq.torch.DataLoader's place in its stream: set_epoch, and
state_dict / load_state_dict resuming bit for bit, refusing a state of
another stream by name."""

from __future__ import annotations

import json

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


def test_state_dict_at_an_epochs_end_resumes_at_the_next() -> None:
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
    # After the last batch, before StopIteration: the next epoch too.
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
    with pytest.raises(TypeError, match="IterableDataset's place"):
        DataLoader(Sharded(8), num_workers=1).state_dict()


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
