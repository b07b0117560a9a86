"""fastq.torch's StatefulDataLoader over an IterableDataset: a dataset and
its iterator that keep their own place asked for it in each lane, a loaded
state that stays the place until each lane delivers, persistent workers
resumed in a later epoch, num_workers=0, JSON round trips, and resumes on
another number of workers."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers.stateful_objects import (  # noqa: E402
    DrawingStream,
    EpochCountingStream,
    StatefulIterStream,
)

import fastq  # noqa: E402
from fastq.torch import StatefulDataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def json_copy(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def loader(dataset: Any, workers: int, **kw: Any) -> StatefulDataLoader:
    return StatefulDataLoader(
        dataset, batch_size=2, num_workers=workers, collate_fn=list, **kw
    )


def test_loaded_lane_states_stay_until_each_lane_delivers() -> None:
    """A state loaded, then saved before the first batch, is the state
    loaded; after one batch, the lanes that delivered none still hold the
    dataset and iterator states they were loaded with: the state equals
    the uninterrupted run's after the same batches."""
    dl = loader(StatefulIterStream(40), 3)
    it = iter(dl)
    for _ in range(4):
        next(it)
    saved = json_copy(dl.state_dict())
    next(it)
    after_one = json_copy(dl.state_dict())
    del it
    dl.close()
    resumed = loader(StatefulIterStream(40), 3)
    resumed.load_state_dict(saved)
    it = iter(resumed)
    assert json_copy(resumed.state_dict()) == saved
    next(it)
    assert json_copy(resumed.state_dict()) == after_one
    del it
    resumed.close()


@pytest.mark.parametrize("workers", [2, 3])
def test_persistent_workers_resume_a_drawing_stream_in_a_later_epoch(
    workers: int,
) -> None:
    """Persistent workers' lanes are seeded by their pass: a state saved in
    their second epoch, or between their first and second, resumes the
    draws of that epoch on any number of workers."""

    def make(n: int) -> StatefulDataLoader:
        g = torch.Generator()
        g.manual_seed(7)
        return loader(DrawingStream(24), n, persistent_workers=True, generator=g)

    dl = make(2)
    list(dl)
    between = json_copy(dl.state_dict())
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    mid = json_copy(dl.state_dict())
    rest = list(it)
    dl.close()
    for state, expected in ((between, head + rest), (mid, rest)):
        resumed = make(workers)
        resumed.load_state_dict(state)
        assert list(resumed) == expected
        resumed.close()


@pytest.mark.parametrize("workers", [3, 2])
def test_a_state_changed_as_the_pass_ends_resumes_the_next_epoch(workers: int) -> None:
    """A dataset that advances its own epoch after its last item: persistent
    workers' copies carry it into their next pass, so a state saved between
    epochs holds each lane's state as its iterator ended, and resumed on
    the same or another number of workers, the next epochs are the
    uninterrupted run's."""

    def make(n: int) -> StatefulDataLoader:
        return loader(EpochCountingStream(15), n, persistent_workers=True)

    dl = make(3)
    list(dl)
    between = json_copy(dl.state_dict())
    second, third = list(dl), list(dl)
    dl.close()
    assert {epoch for batch in second for _, epoch in batch} == {1}
    resumed = make(workers)
    resumed.load_state_dict(between)
    assert list(resumed) == second
    assert list(resumed) == third
    resumed.close()


@pytest.mark.parametrize("dataset", [StatefulIterStream, DrawingStream])
def test_num_workers_0_resumes_a_stream(dataset: Any) -> None:
    """num_workers=0: the one iterator in this process resumes from its own
    state where it keeps one, else its batches are made again from the
    generator's state as the epoch began; a JSON round trip keeps it."""
    torch.manual_seed(3)
    dl = loader(dataset(15), 0)
    it = iter(dl)
    for _ in range(3):
        next(it)
    saved = json_copy(dl.state_dict())
    rest = list(it)
    nxt = list(dl)
    resumed = loader(dataset(15), 0)
    resumed.load_state_dict(saved)
    assert list(resumed) == rest
    assert list(resumed) == nxt


def test_a_state_of_num_workers_0_is_refused_with_workers() -> None:
    """With num_workers=0 the dataset runs without get_worker_info(), with
    workers each runs its share: another stream, refused naming both."""
    dl = loader(StatefulIterStream(10), 0)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    with pytest.raises(fastq.ConfigError, match=r"state\['workers'\]=0.*num_workers=2"):
        loader(StatefulIterStream(10), 2).load_state_dict(state)


@pytest.mark.parametrize("workers", [2, 4])
def test_stateful_iterable_resumes_on_another_number_of_workers(workers: int) -> None:
    """Saved on 3 workers, after a JSON round trip, resumed on 2 or 4: the
    rest of the uninterrupted run, in order, each lane's iterator loaded
    from its own state (an iterator that also skipped would lose items)."""
    dl = loader(StatefulIterStream(60), 3)
    it = iter(dl)
    for _ in range(5):
        next(it)
    saved = json_copy(dl.state_dict())
    rest = list(it)
    dl.close()
    resumed = loader(StatefulIterStream(60), workers)
    resumed.load_state_dict(saved)
    assert list(resumed) == rest
    resumed.close()


class _ShortLen(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(6))

    def __len__(self) -> int:
        return 3


def test_num_workers_0_warns_of_a_wrong_len_as_torch_does() -> None:
    """With num_workers=0 the epoch is torch's own iterator, whose warning
    of a __len__ passed is DataLoader's: given once a batch, not twice."""
    import warnings

    from fastq.torch import DataLoader

    counts = []
    for cls in (torch.utils.data.DataLoader, DataLoader):
        dl = cls(_ShortLen(), batch_size=None, num_workers=0)
        len(dl)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(dl)
        counts.append(
            sum("Length of IterableDataset" in str(w.message) for w in caught)
        )
    assert counts[1] == counts[0] == 3
