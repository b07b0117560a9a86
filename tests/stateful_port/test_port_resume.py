"""torchdata's test_state_dict.py, ported (stateful_support.py says how):
the resume checks its test classes share (`_run_and_checkpoint`), over
each kind of dataset and sampler. The original's classes differ only in
that method; here each is a function, and each of the five tests runs with
each, its id naming the original class."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import pytest

torch = pytest.importorskip("torch")

from stateful_support import frees_on_error  # noqa: E402
from torch_helpers import stateful_port_data as data  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The original's iterable datasets are 137 items; these keep each test's
# point (an empty worker, a worker with more, interrupts inside and at
# the start) at a fraction of the time.
SIZES = [0, 20, 7]
MAP_SIZE = 72  # the original's 100: 11 batches of 7, past the interrupt at 10


def loader(SDL: Any, dataset: Any, num_workers: int, pw: bool, **kw: Any) -> Any:
    return SDL(
        dataset=dataset,
        num_workers=num_workers,
        collate_fn=data.identity,
        persistent_workers=pw,
        **kw,
    )


def run_iterable(
    SDL: Any, dataset: Any, num_workers: int, pw: bool, interrupt: int
) -> None:
    dl = loader(SDL, dataset, num_workers, pw)
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state_dict = dl.state_dict()
    exp = list(it)
    dl = loader(SDL, dataset, num_workers, pw)
    dl.load_state_dict(state_dict)
    assert list(dl) == exp


@frees_on_error
def iterable_shard0(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulDataLoaderIterable_shard0._run_and_checkpoint (which, as
    the original, does not pass batch_size on)."""
    run_iterable(
        SDL,
        data.DummyIterableDataset(SIZES, shuffle=shuffle),
        num_workers,
        pw,
        interrupt,
    )


@frees_on_error
def iterable2_shard0(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulDataLoaderIterable2_shard0: a dataset that is its own
    iterator."""
    dataset = data.DummyIteratorIterableDataset(
        list(range(sum(SIZES))), shuffle=shuffle, include_generator=True
    )
    run_iterable(SDL, dataset, num_workers, pw, interrupt)


def run_map(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool,
    sampler_of: Callable[[Any], Any],
) -> None:
    dataset = data.DummyMapDataset(MAP_SIZE, shuffle=shuffle)
    dl = loader(
        SDL,
        dataset,
        num_workers,
        pw,
        batch_size=batch_size,
        sampler=sampler_of(dataset),
    )
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state_dict = dl.state_dict()
    exp = list(it)
    dl = loader(
        SDL,
        dataset,
        num_workers,
        pw,
        batch_size=batch_size,
        sampler=sampler_of(dataset),
    )
    dl.load_state_dict(state_dict)
    assert list(dl) == exp


def seeded_random_sampler(dataset: Any) -> Any:
    generator = torch.Generator()
    generator.manual_seed(13)
    return torch.utils.data.RandomSampler(dataset, generator=generator)


def map_shard1(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulDataLoaderMap_shard1._run_and_checkpoint (nothing with
    num_workers=0, as the original)."""
    if num_workers == 0:
        return
    run_map(SDL, num_workers, batch_size, pw, interrupt, shuffle, seeded_random_sampler)


def sampler_shard1(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulSampler_shard1._run_and_checkpoint: a sampler whose
    iterator is Stateful."""
    run_map(
        SDL,
        num_workers,
        batch_size,
        pw,
        interrupt,
        shuffle,
        lambda ds: data.DummySampler(len(ds)),
    )


def run_generator(
    SDL: Any, make: Callable[[], Any], num_workers: int, pw: bool, interrupt: int
) -> None:
    exp = list(loader(SDL, make(), num_workers, pw))
    dl = loader(SDL, make(), num_workers, pw)
    batches = []
    it = iter(dl)
    for _ in range(interrupt):
        batches.append(next(it))
    state_dict = dl.state_dict()
    assert batches == exp[:interrupt]
    dl = loader(SDL, make(), num_workers, pw)
    dl.load_state_dict(state_dict)
    batches.extend(dl)
    assert batches == exp


@frees_on_error
def generator_shard2(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulDataLoaderGenerator_shard2._run_and_checkpoint."""
    run_generator(
        SDL, lambda: data.GeneratorIterable(SIZES), num_workers, pw, interrupt
    )


@frees_on_error
def generator_no_state_shard2(
    SDL: Any,
    num_workers: int,
    batch_size: Any,
    pw: bool,
    interrupt: int,
    shuffle: bool = False,
) -> None:
    """TestStatefulDataLoaderGeneratorNoState_shard2._run_and_checkpoint."""
    run_generator(
        SDL, lambda: data.GeneratorIterableNoState(SIZES), num_workers, pw, interrupt
    )


FAMILIES = [
    pytest.param(iterable_shard0, id="TestStatefulDataLoaderIterable_shard0"),
    pytest.param(map_shard1, id="TestStatefulDataLoaderMap_shard1"),
    pytest.param(sampler_shard1, id="TestStatefulSampler_shard1"),
    pytest.param(generator_shard2, id="TestStatefulDataLoaderGenerator_shard2"),
    pytest.param(
        generator_no_state_shard2, id="TestStatefulDataLoaderGeneratorNoState_shard2"
    ),
    pytest.param(iterable2_shard0, id="TestStatefulDataLoaderIterable2_shard0"),
]

# Two workers where the original has three: the point (a state saved and
# loaded across workers) is the same, on a 2-core runner.
WORKERS = 2
INTERRUPTS = [0, 1, 10]


@pytest.mark.parametrize("run", FAMILIES)
def test_no_mp(StatefulDataLoader: Any, run: Any) -> None:
    """test_state_dict.py: <class>.test_no_mp"""
    for batch_size, interrupt in itertools.product([None, 7], INTERRUPTS):
        run(StatefulDataLoader, 0, batch_size, False, interrupt)


@pytest.mark.parametrize("run", FAMILIES)
def test_mp_x(StatefulDataLoader: Any, run: Any) -> None:
    """test_state_dict.py: <class>.test_mp_x"""
    for batch_size, interrupt in itertools.product([None, 7], INTERRUPTS):
        run(StatefulDataLoader, WORKERS, batch_size, False, interrupt)


@pytest.mark.parametrize("run", FAMILIES)
def test_mp_pw(StatefulDataLoader: Any, run: Any) -> None:
    """test_state_dict.py: <class>.test_mp_pw"""
    for batch_size, interrupt in itertools.product([None, 7], INTERRUPTS):
        run(StatefulDataLoader, WORKERS, batch_size, True, interrupt)


@pytest.mark.parametrize("run", FAMILIES)
def test_mp_every_n_steps(StatefulDataLoader: Any, run: Any) -> None:
    """test_state_dict.py: <class>.test_mp_every_n_steps (which, as the
    original, passes neither every_n_steps nor batch_size on)"""
    for _every_n_steps, interrupt in itertools.product([2, 5], INTERRUPTS):
        run(StatefulDataLoader, WORKERS, 7, True, interrupt)


@pytest.mark.parametrize("run", FAMILIES)
def test_random_state(StatefulDataLoader: Any, run: Any) -> None:
    """test_state_dict.py: <class>.test_random_state"""
    for num_workers, interrupt in itertools.product([0, WORKERS], INTERRUPTS):
        run(StatefulDataLoader, num_workers, 7, False, interrupt, shuffle=True)
