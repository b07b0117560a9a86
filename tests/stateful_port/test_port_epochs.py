"""torchdata's test_state_dict.py, ported (stateful_support.py says how):
states across epochs, at an epoch's end, and with samplers that keep no
state of their own."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stateful_support import stream_state  # noqa: E402
from torch_helpers import stateful_port_data as data  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The original's 100 samples: 24 here, the same point at a quarter of the
# batches (its batch size is 1).
DATA_SIZE = 24


def map_dl(
    SDL: Any, data_size: int, num_workers: int, batch_size: int, shuffle: bool
) -> Any:
    return SDL(
        dataset=data.DummyMapDataset(data_size, shuffle=False),
        num_workers=num_workers,
        batch_size=batch_size,
        shuffle=shuffle,
    )


@pytest.mark.parametrize(
    ("data_size", "num_workers", "batch_size", "shuffle"),
    list(itertools.product([DATA_SIZE], [0, 2], [1], [False, True])),
)
def test_multi_epoch_sdl(
    StatefulDataLoader: Any,
    data_size: int,
    num_workers: int,
    batch_size: int,
    shuffle: bool,
) -> None:
    """test_state_dict.py: TestMultiEpochSDL_shard0.test_multi_epoch_sdl"""
    torch.manual_seed(0)
    dl1 = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    items = []
    for _ in range(2):
        items.extend(dl1)
    yielded = len(items)
    state_dict = dl1.state_dict()
    new_dl1 = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    new_dl1.load_state_dict(state_dict)
    for _ in range(2):
        items.extend(new_dl1)
    assert len(items) == data_size * 4
    assert yielded == data_size * 2
    torch.manual_seed(0)
    dl2 = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    items2 = []
    for _ in range(4):
        items2.extend(dl2)
    assert items == items2


@pytest.mark.parametrize(
    ("data_size", "num_workers", "batch_size", "shuffle"),
    list(itertools.product([DATA_SIZE], [0, 2], [1], [False, True])),
)
def test_end_of_epoch_behavior(
    StatefulDataLoader: Any,
    data_size: int,
    num_workers: int,
    batch_size: int,
    shuffle: bool,
) -> None:
    """test_state_dict.py: TestEndOfEpochBehavior_shard0.test_end_of_epoch_behavior"""
    dl = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    yielded = 0
    for _ in dl:
        yielded += 1
        sd_in = dl.state_dict()
    sd_out = dl.state_dict()
    assert yielded == data_size
    # Saved after the last batch, before the epoch ended: nothing is left.
    dl_in = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    dl_in.load_state_dict(sd_in)
    assert sum(1 for _ in dl_in) == 0
    # Saved after the epoch ended: the next one, whole.
    dl_out = map_dl(StatefulDataLoader, data_size, num_workers, batch_size, shuffle)
    dl_out.load_state_dict(sd_out)
    assert sum(1 for _ in dl_out) == data_size


@pytest.mark.parametrize(
    ("data_size", "num_workers", "batch_size", "interrupt", "sampler_cls"),
    list(
        itertools.product(
            [100],
            [0, 2],
            [1],
            [10, 50, 80],
            [torch.utils.data.RandomSampler, torch.utils.data.SequentialSampler],
        )
    ),
)
def test_notstatefulSDL(
    StatefulDataLoader: Any,
    data_size: int,
    num_workers: int,
    batch_size: int,
    interrupt: int,
    sampler_cls: Any,
) -> None:
    """test_state_dict.py: TestNotStatefulSamplerSDL_shard0.test_notstatefulSDL
    (which, as the original, runs every case with 100 samples, batches of
    one and num_workers=0, whatever its parameters say)"""
    data_size, num_workers, batch_size = 100, 0, 1

    def get_map_dl() -> Any:
        dataset = data.DummyMapDataset(data_size, shuffle=False)
        return StatefulDataLoader(
            dataset=dataset,
            num_workers=num_workers,
            batch_size=batch_size,
            sampler=sampler_cls(dataset),
        )

    torch.manual_seed(0)
    dataloader1 = get_map_dl()
    results1 = []
    for i, batch in enumerate(dataloader1):
        results1.append(batch)
        if i == interrupt:
            break
    state_dict = dataloader1.state_dict()  # after the loop is dropped
    torch.manual_seed(0)
    resumed = get_map_dl()
    resumed.load_state_dict(state_dict)
    results1.extend(resumed)
    torch.manual_seed(0)
    results2 = list(get_map_dl())
    assert results1 == results2


def iterable_dl(SDL: Any, pw: bool, num_workers: int) -> Any:
    data_size = [25, 50, 100, 75]
    if num_workers == 0:
        data_size = [sum(data_size)]
    return SDL(
        dataset=data.GeneratorIterable(data_size, True),
        num_workers=num_workers,
        persistent_workers=pw,
        collate_fn=data.identity,
    )


def multi_epoch_state(SDL: Any, pw: bool, num_workers: int) -> None:
    dl = iterable_dl(SDL, pw, num_workers)
    exp0 = list(dl)
    state1 = dl.state_dict()
    exp1 = list(dl)
    exp2 = list(dl)
    assert exp0 == [[(x[0][0], x[0][1] - 1)] for x in exp1]
    assert exp0 == [[(x[0][0], x[0][1] - 2)] for x in exp2]
    dl = iterable_dl(SDL, pw, num_workers)
    it = iter(dl)
    for _ in range(2):
        next(it)
    dl.load_state_dict(state1)
    it = iter(dl)
    data1 = list(it)
    data2 = list(dl)
    assert data1 == exp1
    assert data2 == exp2


@stream_state
def test_multi_epoch_state_inline(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestMultiEpochState_shard0.test_inline"""
    multi_epoch_state(StatefulDataLoader, False, 0)


@stream_state
def test_multi_epoch_state_pw(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestMultiEpochState_shard0.test_pw"""
    multi_epoch_state(StatefulDataLoader, True, 4)
