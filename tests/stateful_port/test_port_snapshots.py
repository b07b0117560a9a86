"""torchdata's test_state_dict.py, ported (stateful_support.py says how):
states taken at an epoch's start or end, states asked for soon after a
load, and a state loaded then saved again."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stateful_support import TORCHDATA, raises_freeing, stream_state  # noqa: E402
from torch_helpers import stateful_port_data as data  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The original's iterable datasets hold 137 items over three workers (one
# with none) and its map datasets 100; smaller here, the same shapes.
SIZES = [0, 20, 7]
MAP_SIZE = 24
WORKERS = 3  # as the original: worker 0 of SIZES has nothing
MAP_WORKERS = 2  # the original's 3: a map-style dataset has no shards


def make(SDL: Any, dataset: Any, **kw: Any) -> Any:
    kw.setdefault("collate_fn", data.identity)
    return SDL(dataset=dataset, **kw)


# ------------------------------------------------------ TestSnapshotZero


def restart_from_zero(
    SDL: Any, dataset: Any, workers: int = WORKERS, **kw: Any
) -> None:
    for pw in [False, True]:
        dl = make(SDL, dataset, num_workers=workers, persistent_workers=pw, **kw)
        it = iter(dl)
        state0 = dl.state_dict()
        exp = list(it)
        dl.load_state_dict(state0)
        assert list(dl) == exp


@stream_state
def test_snapshot_zero_generator(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotZero_shard2.test_generator"""
    restart_from_zero(
        StatefulDataLoader, data.GeneratorIterable(SIZES), snapshot_every_n_steps=10
    )


@stream_state
def test_snapshot_zero_iterable(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotZero_shard2.test_iterable"""
    restart_from_zero(
        StatefulDataLoader,
        data.DummyIterableDataset(SIZES, shuffle=True),
        snapshot_every_n_steps=10,
    )


def test_snapshot_zero_map(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotZero_shard2.test_map"""
    restart_from_zero(
        StatefulDataLoader,
        data.DummyMapDataset(MAP_SIZE, shuffle=True),
        workers=MAP_WORKERS,
        snapshot_every_n_steps=10,
    )


def test_snapshot_zero_map_shuffle(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotZero_shard2.test_map_shuffle"""
    restart_from_zero(
        StatefulDataLoader,
        data.DummyMapDataset(MAP_SIZE, shuffle=False),
        workers=MAP_WORKERS,
        shuffle=True,
        snapshot_every_n_steps=10,
    )


def test_snapshot_zero_map_iterrupted_shuffle(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotZero_shard2.test_map_iterrupted_shuffle"""
    for pw, num_workers, every_n_steps in itertools.product(
        [False, True], [0, 2], [1, 15]
    ):
        dataset = data.DummyMapDataset(10, shuffle=True)
        dl = make(
            StatefulDataLoader,
            dataset,
            shuffle=True,
            num_workers=num_workers,
            snapshot_every_n_steps=every_n_steps,
            persistent_workers=pw if num_workers > 0 else False,
        )
        it = iter(dl)
        state0 = dl.state_dict()
        exp = [next(it) for _ in range(4)]
        state1 = dl.state_dict()
        dl.load_state_dict(state1)
        exp.extend(iter(dl))
        dl.load_state_dict(state0)
        assert list(iter(dl)) == exp


# ------------------------------------------------------- TestSnapshotEnd


def restart_from_end_of_generator(SDL: Any, make_dataset: Any) -> None:
    for pw, bs in itertools.product([False, True], [None, 4]):
        kw = dict(num_workers=WORKERS, persistent_workers=pw, batch_size=bs)
        dl = make(SDL, make_dataset(), snapshot_every_n_steps=10, **kw)
        exp = list(dl)
        state_end = dl.state_dict()
        assert list(dl) == exp  # simple restart
        dl = make(SDL, make_dataset(), snapshot_every_n_steps=10, **kw)
        it = iter(dl)
        for _ in range(2):
            next(it)
        dl.load_state_dict(state_end)
        assert list(dl) == exp


@stream_state
def test_snapshot_end_generator(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotEnd_shard2.test_generator"""
    restart_from_end_of_generator(
        StatefulDataLoader, lambda: data.GeneratorIterable(SIZES)
    )


@stream_state
def test_snapshot_end_generator_no_state(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotEnd_shard2.test_generator_no_state"""
    restart_from_end_of_generator(
        StatefulDataLoader, lambda: data.GeneratorIterableNoState(SIZES)
    )


def restart_from_end_with_generator(
    SDL: Any, dataset: Any, seed: int, workers: int = WORKERS
) -> None:
    for pw, bs in itertools.product([False, True], [None, 4]):
        g = torch.Generator()
        g.manual_seed(seed)
        kw = dict(num_workers=workers, persistent_workers=pw, batch_size=bs)
        dl = make(SDL, dataset, generator=g, snapshot_every_n_steps=10, **kw)
        list(dl)
        state_end = dl.state_dict()
        exp = list(dl)
        g.manual_seed(seed)
        dl = make(SDL, dataset, generator=g, snapshot_every_n_steps=10, **kw)
        dl.load_state_dict(state_end)
        assert list(dl) == exp


@stream_state
def test_snapshot_end_iterable(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotEnd_shard2.test_iterable"""
    restart_from_end_with_generator(
        StatefulDataLoader, data.DummyIterableDataset(SIZES, shuffle=True), 4
    )


def test_snapshot_end_map(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotEnd_shard2.test_map"""
    restart_from_end_with_generator(
        StatefulDataLoader,
        data.DummyMapDataset(MAP_SIZE, shuffle=True),
        15,
        workers=MAP_WORKERS,
    )


def test_snapshot_end_map_shuffle(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestSnapshotEnd_shard2.test_map_shuffle"""
    for pw, bs in itertools.product([False, True], [None, 4]):
        kw = dict(
            shuffle=True,
            num_workers=MAP_WORKERS,
            persistent_workers=pw,
            batch_size=bs,
            snapshot_every_n_steps=10,
        )
        dl = make(
            StatefulDataLoader, data.DummyMapDataset(MAP_SIZE, shuffle=False), **kw
        )
        list(dl)
        state_end = dl.state_dict()
        exp = list(dl)
        dl = make(
            StatefulDataLoader, data.DummyMapDataset(MAP_SIZE, shuffle=False), **kw
        )
        dl.load_state_dict(state_end)
        assert list(dl) == exp


# ------------------------------------ TestFastStateDictRequest(RoundRobin)


def fast_request(SDL: Any, snapshot_every_n_steps: int, interrupt: int) -> None:
    num_workers = 4
    dataset = data.DummyIterableDataset([25, 25, 25, 25], shuffle=True)
    kw = dict(
        num_workers=num_workers,
        batch_size=4,
        persistent_workers=True,
    )
    dl = make(SDL, dataset, snapshot_every_n_steps=snapshot_every_n_steps, **kw)
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state_dict = dl.state_dict()
    for _ in range(2):
        next(it)
    exp = list(it)
    dl.load_state_dict(state_dict)
    # A new iter after load_state_dict, its state asked for before
    # num_workers batches are yielded.
    it = iter(dl)
    for _ in range(2):
        next(it)
    state_dict2 = dl.state_dict()
    dl = make(SDL, dataset, **kw)
    dl.load_state_dict(state_dict2)
    assert list(dl) == exp


@stream_state
def test_fast_state_dict_request(StatefulDataLoader: Any) -> None:
    """test_state_dict.py:
    TestFastStateDictRequest_shard3.test_fast_state_dict_request"""
    fast_request(StatefulDataLoader, 0, 11)


@stream_state
def test_fast_state_dict_request_skip_steps(StatefulDataLoader: Any) -> None:
    """test_state_dict.py:
    TestFastStateDictRequest_shard3.test_fast_state_dict_request_skip_steps"""
    fast_request(StatefulDataLoader, 17, 19)


def round_robin(SDL: Any, snapshot_every_n_steps: int, interrupt: int) -> None:
    kw = dict(
        num_workers=4,
        batch_size=1,
        persistent_workers=True,
        snapshot_every_n_steps=snapshot_every_n_steps,
    )
    dl = make(SDL, data.PeriodicStateIterableDataset(), **kw)
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state_dict = dl.state_dict()
    for _ in range(2):
        next(it)
    exp_state_dict = dl.state_dict()
    exp = list(it)
    dl.load_state_dict(state_dict)
    it = iter(dl)
    for _ in range(2):
        next(it)
    state_dict2 = dl.state_dict()
    dl = make(SDL, data.PeriodicStateIterableDataset(), **kw)
    dl.load_state_dict(state_dict2)
    assert list(dl) == exp
    dl = make(SDL, data.PeriodicStateIterableDataset(), **kw)
    dl.load_state_dict(state_dict)
    it = iter(dl)
    for _ in range(2):
        next(it)
    assert dl.state_dict() == exp_state_dict


@stream_state
def test_fast_state_dict_request_round_robin(StatefulDataLoader: Any) -> None:
    """test_state_dict.py:
    TestFastStateDictRequestRoundRobin_shard3.test_fast_state_dict_request"""
    round_robin(StatefulDataLoader, 1, 15)


@stream_state
def test_fast_state_dict_request_round_robin_skip_steps(
    StatefulDataLoader: Any,
) -> None:
    """test_state_dict.py:
    TestFastStateDictRequestRoundRobin_shard3.test_fast_state_dict_request_skip_steps"""
    round_robin(StatefulDataLoader, 17, 19)


# ----------------------------------------------------- TestInitialState

# The original's four workers and 100 samples: two and 24 here.
INITIAL_WORKERS = 2


def test_initial_state(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestInitialState_shard0.test_initial_state (its
    check of the snapshot layout against torchdata only)"""
    for pw in [False, True]:
        dataset = data.DummyMapDataset(MAP_SIZE, shuffle=False)
        dl = make(
            StatefulDataLoader,
            dataset,
            num_workers=INITIAL_WORKERS,
            persistent_workers=pw,
        )
        state = dl.state_dict()
        if TORCHDATA:
            assert len(state["_snapshot"]["_worker_snapshots"]) == INITIAL_WORKERS
        exp = list(dl)
        it = iter(dl)
        for _ in range(2):
            next(it)
        dl.load_state_dict(state)
        assert list(dl) == exp
        assert list(dl) == exp


def interrupted(SDL: Any, pw: bool, interrupt: int) -> tuple[Any, list[Any]]:
    dataset = data.DummyMapDataset(MAP_SIZE, shuffle=True)
    dl = make(SDL, dataset, num_workers=INITIAL_WORKERS, persistent_workers=pw)
    it = iter(dl)
    for _ in range(interrupt):
        next(it)
    state = dl.state_dict()
    return state, list(it)


def test_load_state_after_initial_state_dict(StatefulDataLoader: Any) -> None:
    """test_state_dict.py:
    TestInitialState_shard0.test_load_state_after_initial_state_dict
    (its check of the snapshot layout against torchdata only)"""
    for pw, interrupt in itertools.product([False, True], [2, 9]):
        state, exp = interrupted(StatefulDataLoader, pw, interrupt)
        dataset = data.DummyMapDataset(MAP_SIZE, shuffle=True)
        dl = make(
            StatefulDataLoader,
            dataset,
            num_workers=INITIAL_WORKERS,
            persistent_workers=pw,
        )
        state0 = dl.state_dict()
        if TORCHDATA:
            assert len(state0["_snapshot"]["_worker_snapshots"]) == INITIAL_WORKERS
        dl.load_state_dict(state)
        assert list(dl) == exp


def test_load_state_before_initial_state_dict(StatefulDataLoader: Any) -> None:
    """test_state_dict.py:
    TestInitialState_shard0.test_load_state_before_initial_state_dict"""
    for pw, interrupt in itertools.product([False, True], [2, 9]):
        state, exp = interrupted(StatefulDataLoader, pw, interrupt)
        dataset = data.DummyMapDataset(MAP_SIZE, shuffle=True)
        dl = make(
            StatefulDataLoader,
            dataset,
            num_workers=INITIAL_WORKERS,
            persistent_workers=pw,
        )
        dl.load_state_dict(state)
        state0 = dl.state_dict()
        assert_states_equal(state0, state)
        assert list(dl) == exp


def assert_states_equal(a: Any, b: Any, path: str = "state") -> None:
    """torch's TestCase.assertEqual of two states, which may hold tensors
    (a dataset's generator state): the same structure, equal leaves."""
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            assert_states_equal(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_states_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path


def test_init_error(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestInitialState_shard0.test_init_error"""
    dl = make(
        StatefulDataLoader,
        data.DummyMapDataset(MAP_SIZE, shuffle=True),
        num_workers=INITIAL_WORKERS,
        worker_init_fn=data.error_worker_init_fn,
    )
    with raises_freeing(ValueError, match=data.ERROR_MSG):
        iter(dl)
        # fastq starts its workers at iter(), and reports a worker_init_fn's
        # error at the first batch, as torch's DataLoader does.
        next(iter(dl))


def test_iteration_error(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestInitialState_shard0.test_iteration_error"""
    dl = make(StatefulDataLoader, data.ErrorDataset(), num_workers=INITIAL_WORKERS)
    it = iter(dl)
    with raises_freeing(ValueError, match="Iteration error"):
        next(it)


def test_load_then_state(StatefulDataLoader: Any) -> None:
    """test_state_dict.py: TestInitialState_shard0.test_load_then_state"""
    for pw in [False, True]:
        dataset = data.DummyMapDataset(MAP_SIZE, shuffle=True)
        kw = dict(num_workers=INITIAL_WORKERS, persistent_workers=pw)
        dl = make(StatefulDataLoader, dataset, **kw)
        state0 = dl.state_dict()
        exp = list(dl)
        dl = make(StatefulDataLoader, dataset, **kw)
        it = iter(dl)
        for _ in range(3):
            next(it)
        dl.load_state_dict(state0)
        state1 = dl.state_dict()
        assert_states_equal(state1, state0)
        assert list(dl) == exp
