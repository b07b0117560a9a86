"""Resuming on another number of ranks: ranks that each delivered k batches
delivered a prefix of the epoch's order, so the rest of it is sharded
across the new ranks. No sample of the interrupted epoch is delivered twice
or missed across the ranks (beyond DistributedSampler's padding, or its
drop_last cut), every new rank has the same number of batches (DDP's
collectives stay in step), and later epochs are those of a run that always
had the new world size."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

import fastq
from fastq.errors import ConfigError

SAMPLES = 61  # divides by neither batch nor any world size: padding is exercised
BATCH = 4


class Indices:
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        return np.int64(i), np.full(3, i, dtype=np.float32)


def ranks(world_size: int, **kw: Any) -> list[fastq.Prefetcher]:
    kw.setdefault("seed", 5)
    kw.setdefault("shuffle", True)
    return [
        fastq.Prefetcher(
            Indices(), batch_size=BATCH, workers=1, rank=r, world_size=world_size, **kw
        )
        for r in range(world_size)
    ]


def samples(batch: Any) -> list[int]:
    return [int(i) for i in batch[0]]


def take(pfs: list[fastq.Prefetcher], k: int) -> tuple[list[int], list[dict[str, Any]]]:
    """k batches from every rank, in step; the samples and each rank's state."""
    its = [iter(pf) for pf in pfs]
    seen = [i for _ in range(k) for it in its for i in samples(next(it))]
    states = [json.loads(json.dumps(pf.state_dict())) for pf in pfs]
    return seen, states


def rest(pfs: list[fastq.Prefetcher]) -> list[list[int]]:
    """Every rank's batches to the end of the epoch, as sample lists."""
    return [[i for b in pf for i in samples(b)] for pf in pfs]


def close(pfs: list[fastq.Prefetcher]) -> None:
    for pf in pfs:
        pf.close()


def resumed(state: dict[str, Any], world_size: int) -> list[list[int]]:
    """The rest of the epoch on new ranks created with ``state=``."""
    pfs = ranks(world_size, seed=None, state=state)
    out = rest(pfs)
    close(pfs)
    return out


def padding(n: int, world_size: int) -> int:
    return -(-n // world_size) * world_size - n


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (2, 1), (1, 4)])
@pytest.mark.parametrize("k", [0, 1, 5])
def test_the_rest_of_the_epoch_is_sharded_across_the_new_ranks(
    before: int, after: int, k: int
) -> None:
    old = ranks(before)
    seen, states = take(old, k)
    close(old)
    # Every rank of the new world may load any old rank's state.
    new = ranks(after, seed=None, state=states[0])
    per_rank = rest(new)
    following = rest(new)  # the next epoch, as if always on `after` ranks
    close(new)

    assert len({len(r) for r in per_rank}) == 1  # in step
    counts = Counter(seen + [i for r in per_rank for i in r])
    assert set(counts) == set(range(SAMPLES))
    left = SAMPLES - k * BATCH * before
    assert sum(counts.values()) - SAMPLES == padding(left, after)

    fresh = ranks(after, seed=5)
    rest(fresh)  # epoch 0
    assert following == rest(fresh)
    close(fresh)


def test_drop_last_drops_only_what_does_not_fill_the_new_ranks() -> None:
    old = ranks(2, drop_last=True)
    seen, states = take(old, 3)
    close(old)
    new = ranks(3, seed=None, drop_last=True, state=states[1])
    per_rank = rest(new)
    close(new)
    assert len({len(r) for r in per_rank}) == 1
    delivered = seen + [i for r in per_rank for i in r]
    assert len(delivered) == len(set(delivered))  # nothing twice
    left = SAMPLES - 3 * BATCH * 2
    assert len(delivered) - len(seen) == (left // 3) // BATCH * BATCH * 3


def test_a_resharded_epoch_resumes_again_on_the_same_and_on_another_world() -> None:
    old = ranks(3)
    seen, states = take(old, 2)
    close(old)
    mid = ranks(2, seed=None, state=states[0])
    its = [iter(pf) for pf in mid]
    more = [i for it in its for i in samples(next(it))]
    mid_states = [json.loads(json.dumps(pf.state_dict())) for pf in mid]
    assert mid_states[0]["reshard"] == [[3, 2]]
    # The same world size: bit for bit what the interrupted ranks had left.
    expected = [[i for b in it for i in samples(b)] for it in its]
    close(mid)
    again = [
        fastq.Prefetcher(
            Indices(), BATCH, workers=2, shuffle=True, rank=r, world_size=2, state=s
        )
        for r, s in enumerate(mid_states)
    ]
    assert rest(again) == expected
    close(again)
    # Another world size once more: still every sample once, plus padding.
    last = ranks(4, seed=None, state=mid_states[1])
    per_rank = rest(last)
    close(last)
    counts = Counter(seen + more + [i for r in per_rank for i in r])
    assert set(counts) == set(range(SAMPLES))
    left = SAMPLES - 2 * BATCH * 3 - 1 * BATCH * 2
    assert sum(counts.values()) - SAMPLES == padding(left, 4)


@pytest.mark.parametrize("worker_method", ["process", "thread"])
def test_load_state_dict_reshards_a_running_prefetcher(worker_method: str) -> None:
    """Thread workers share the consumer's sampler, which has the running
    epoch's order at hand: the reshard must replace it, not add to it."""
    old = ranks(2)
    _, states = take(old, 4)
    close(old)
    expected = resumed(states[0], 3)
    running = ranks(3, worker_method=worker_method)
    for pf in running:
        next(iter(pf))  # workers running epoch 0 the usual way
        pf.load_state_dict(states[0])
    assert rest(running) == expected
    close(running)


def test_a_state_at_an_epochs_end_or_start_needs_no_reshard() -> None:
    old = ranks(2)
    at_start = old[0].state_dict()
    rest(old)
    at_end = old[1].state_dict()
    close(old)
    assert at_end["epoch"] == 1 and at_end["batches_done"] == 0
    for state in (at_start, at_end):
        new = ranks(3, seed=None, state=state)
        fresh = ranks(3)
        if state is at_end:
            rest(fresh)
        assert rest(new) == rest(fresh)
        assert new[0].state_dict()["reshard"] is None
        close(new + fresh)


def test_an_unordered_state_out_of_order_cannot_be_resharded() -> None:
    pf = ranks(1)[0]
    state = dict(pf.state_dict(), world_size=2, rank=0, batches_done=2)
    state["delivered"] = [4]
    pf.close()
    with pytest.raises(ConfigError, match=r"state\['delivered'\]=\[4\].*world_size=2"):
        ranks(3, seed=None, state=state)


def test_on_the_same_world_size_each_rank_loads_its_own_state() -> None:
    old = ranks(2)
    _, states = take(old, 1)
    close(old)
    with pytest.raises(ConfigError, match=r"state\['rank'\]=1.*rank=0.*own state"):
        ranks(2, seed=None, state=states[1])


def test_a_torch_prefetcher_reshards_through_load_state_dict() -> None:
    """The trainer's route: it calls load_state_dict on the loader it has."""
    fastq_torch = pytest.importorskip("fastq.torch")
    old = ranks(2)
    _, states = take(old, 3)
    close(old)
    expected = resumed(states[0], 3)
    loaders = [
        fastq_torch.TorchPrefetcher(
            Indices(), BATCH, workers=1, shuffle=True, seed=5, rank=r, world_size=3
        )
        for r in range(3)
    ]
    for loader in loaders:
        loader.load_state_dict(states[0])
    assert rest(loaders) == expected
    close(loaders)
