"""Resuming a callable source: which worker makes a batch, and when, is
decided at run time, so the state is per worker (the items of its own
stream delivered in the pass), and each worker's stream, sharded with
get_worker_info(), goes on where it stopped: every item of the pass once,
each worker's in its order. An iterator that can seek offers skip(n);
any other makes the delivered items again, unseen."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastq

ITEMS = 9  # per worker and pass


class Stream:
    """Worker w's items are w * 100 + k; each batch also carries how many
    items this iterator made, to tell a skip from a replay."""

    def __init__(self, seekable: bool = False) -> None:
        self.seekable = seekable

    def __call__(self) -> Iterator[dict[str, np.ndarray]]:
        info = fastq.get_worker_info()
        assert info is not None
        return _Items(info.id, self.seekable)


class _Items:
    def __init__(self, worker: int, seekable: bool) -> None:
        self.worker, self.next_item, self.made = worker, 0, 0
        if seekable:
            self.skip = self._skip

    def __iter__(self) -> _Items:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.next_item == ITEMS:
            raise StopIteration
        self.next_item += 1
        self.made += 1
        item = self.worker * 100 + self.next_item - 1
        return {"item": np.array([item]), "made": np.array([self.made])}

    def _skip(self, n: int) -> None:
        self.next_item += n


def make(**kw: Any) -> fastq.Prefetcher:
    kw.setdefault("workers", 2)
    kw.setdefault("copy", True)  # batches kept past the next
    return fastq.Prefetcher(kw.pop("source", Stream()), **kw)


def items(batches: list[dict[str, Any]]) -> list[int]:
    return [int(b["item"][0]) for b in batches]


def check_pass(seen: list[int], workers: int = 2) -> None:
    assert sorted(seen) == [w * 100 + k for w in range(workers) for k in range(ITEMS)]
    for w in range(workers):
        mine = [i for i in seen if i // 100 == w]
        assert mine == sorted(mine)  # each worker's stream in its order


def test_a_pass_resumes_per_worker_stream_in_a_new_prefetcher() -> None:
    with make() as pf:
        it = iter(pf)
        first = items([next(it) for _ in range(7)])
        state = json.loads(json.dumps(pf.state_dict()))
    assert sum(state["items"]) == 7 and state["workers"] == 2
    with make(state=state) as pf:
        after = list(pf)
        made = {int(b["item"][0]) // 100: int(b["made"][0]) for b in after[::-1]}
        whole = items(list(pf))  # the next pass, whole
    check_pass(first + items(after))
    # Without skip(), the delivered items were made again, unseen.
    assert made == {
        w: state["items"][w] + 1 for w in range(2) if state["items"][w] < ITEMS
    }
    check_pass(whole)


def test_an_iterator_with_skip_is_not_made_to_produce_them_again() -> None:
    with make(source=Stream(seekable=True)) as pf:
        it = iter(pf)
        first = items([next(it) for _ in range(5)])
        state = pf.state_dict()
    # With spec= no first item is made to infer it.
    spec = {"item": ((1,), np.int64), "made": ((1,), np.int64)}
    with make(source=Stream(seekable=True), spec=spec, state=state) as pf:
        after = list(pf)
    check_pass(first + items(after))
    firsts = {}
    for b in after:
        firsts.setdefault(int(b["item"][0]) // 100, int(b["made"][0]))
    assert set(firsts.values()) == {1}


def test_load_state_dict_restarts_the_workers_at_the_state() -> None:
    with make() as pf:
        it = iter(pf)
        first = items([next(it) for _ in range(4)])
        state = pf.state_dict()
    with make(seed=state["seed"]) as pf:
        running = iter(pf)
        next(running)
        pf.load_state_dict(state)
        with pytest.raises(fastq.ConfigError, match=r"call iter\(\) again"):
            next(running)
        assert pf.state_dict()["items"] == state["items"]  # loaded, not used
        check_pass(first + items(list(pf)))


def test_between_passes_and_after_a_break() -> None:
    with make() as pf:
        assert pf.state_dict()["items"] == [0, 0]
        list(pf)
        assert pf.state_dict()["items"] == [0, 0]  # the next pass, whole
        it = iter(pf)
        first = items([next(it) for _ in range(3)])
        del it  # a break
        state = pf.state_dict()
    assert sum(state["items"]) == 3
    with make(state=state) as pf:
        check_pass(first + items(list(pf)))


def test_a_state_resumes_on_another_number_of_workers() -> None:
    # The state's workers are lanes (NOTE [ A stream's lanes ] in
    # fastq/_workers/_lanes.py): 2 of them, run here by 3 processes.
    with make() as pf:
        it = iter(pf)
        first = items([next(it) for _ in range(5)])
        state = pf.state_dict()
    with make(workers=3, state=state) as pf:
        check_pass(first + items(list(pf)))
    map_state = {**state, "format": "fastq.Prefetcher/1"}
    with pytest.raises(fastq.ConfigError, match="over a stream"):
        make(state=map_state)
