"""fastq.torch.DataLoader's state beyond its own place: num_workers=0,
samplers and datasets with state_dict()/load_state_dict() asked where they
live, batches delivered out of order, a loop left by `break`, and
fastq.torch.StatefulDataLoader's name and signature."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers.loader_checks import same  # noqa: E402
from torch_helpers.stateful_objects import (  # noqa: E402
    CountingCopies,
    ResumingSampler,
    SlowFirst,
)

import fastq  # noqa: E402
from fastq.torch import DataLoader, StatefulDataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]


def json_copy(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def test_num_workers_0_resumes_mid_epoch_exactly() -> None:
    """In this process, torch's own iterator keeps its place: the rest of
    the epoch in the sampler's order, then the next epoch, as the run that
    never stopped (torch's generator brought back for the sampler)."""

    def loader() -> DataLoader:
        return DataLoader(list(range(20)), batch_size=4, shuffle=True, num_workers=0)

    torch.manual_seed(1)
    ref = loader()
    want = [list(ref) for _ in range(2)]
    torch.manual_seed(1)
    first = loader()
    it = iter(first)
    got = [next(it) for _ in range(2)]
    state = json_copy(first.state_dict())
    assert (state["epoch"], state["batches_done"]) == (0, 2)
    del it
    torch.manual_seed(99)
    resumed = loader()
    resumed.load_state_dict(state)
    assert same(got + list(resumed), want[0])
    assert same(list(resumed), want[1])


def test_num_workers_0_and_workers_resume_each_others_states() -> None:
    """A state saved in this process resumes on workers, and back."""
    data = list(range(30))

    def loader(workers: int) -> DataLoader:
        return DataLoader(data, batch_size=3, shuffle=True, num_workers=workers)

    for saved_on, resumed_on in ((0, 2), (2, 0)):
        torch.manual_seed(5)
        want = [int(x) for b in loader(saved_on) for x in b]
        torch.manual_seed(5)
        first = loader(saved_on)
        it = iter(first)
        got = [int(x) for _ in range(4) for x in next(it)]
        state = json_copy(first.state_dict())
        del it
        first.close()
        resumed = loader(resumed_on)
        resumed.load_state_dict(state)
        assert got + [int(x) for b in resumed for x in b] == want


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_sampler_is_asked_for_its_state_not_skipped(workers: int) -> None:
    """A sampler with state_dict() is asked for it as each batch's indices
    are drawn (the workers' batches are drawn ahead): a state after 3
    batches holds the sampler after its third draw, and the resumed run
    loads it instead of drawing the delivered batches again."""

    def loader() -> DataLoader:
        return DataLoader(
            list(range(24)),
            batch_size=2,
            sampler=ResumingSampler(24),
            num_workers=workers,
        )

    first = loader()
    it = iter(first)
    got = [next(it).tolist() for _ in range(3)]
    state = json_copy(first.state_dict())
    assert state["user_states"]["samplers"] == {"sampler": {"yielded": 6}}
    del it
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in resumed]
    assert got + rest == [[i, i + 1] for i in range(0, 24, 2)]


def test_a_stateful_dataset_s_state_comes_with_its_batches_and_goes_back() -> None:
    """A map-style dataset with state_dict() is asked in the worker after
    each batch it makes; the state travels with the batch; loaded, each
    worker's copy starts from its saved state."""

    def loader() -> DataLoader:
        return DataLoader(
            CountingCopies(16), batch_size=2, num_workers=2, persistent_workers=True
        )

    first = loader()
    it = iter(first)
    made_by: dict[int, int] = {}
    for _ in range(5):
        batch = next(it)
        pids = batch[1].tolist()
        assert len(set(pids)) == 1
        made_by[pids[0]] = made_by.get(pids[0], 0) + 2
    state = json_copy(first.state_dict())
    copies = state["user_states"]["datasets"]
    # Each worker's copy, as of its last batch delivered: 10 samples in all.
    assert sorted(copies) == ["0", "1"][: len(copies)]
    assert sum(c["made"] for c in copies.values()) == 10
    assert sorted(c["made"] for c in copies.values()) == sorted(made_by.values())
    del it
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [int(i) for b in rest for i in b[0]] == list(range(10, 16))
    # Each copy went on counting from its saved state.
    first_counts = {int(b[1][0]): int(b[2][0]) for b in reversed(rest)}
    assert all(
        n >= min(c["made"] for c in copies.values()) for n in first_counts.values()
    )
    resumed.close()


def test_a_stateful_dataset_in_this_process_is_worker_0_s() -> None:
    dataset = CountingCopies(12)
    loader = DataLoader(dataset, batch_size=3, num_workers=0)
    it = iter(loader)
    next(it), next(it)
    state = json_copy(loader.state_dict())
    assert state["user_states"]["datasets"] == {"0": {"made": 6}}
    other = CountingCopies(12)
    resumed = DataLoader(other, batch_size=3, num_workers=0)
    resumed.load_state_dict(state)
    assert [int(b[2][0]) for b in resumed] == [6, 9]


def test_out_of_order_batches_are_named_and_not_made_again() -> None:
    """With in_order=False a slow batch 0 arrives after later ones: the
    state names those delivered past the first undelivered one, and the
    resumed run (on another number of workers) delivers each once."""
    first = DataLoader(SlowFirst(12), batch_size=None, num_workers=2, in_order=False)
    got = []
    for i, x in enumerate(first):
        got.append(int(x))
        if i == 3:
            break
    state = json_copy(first.state_dict())
    assert 0 not in got
    assert state["batches_done"] == 0
    assert state["delivered"] == sorted(got)
    resumed = DataLoader(SlowFirst(12), batch_size=None, num_workers=3, in_order=False)
    resumed.load_state_dict(state)
    rest = [int(x) for x in resumed]
    assert sorted(got + rest) == list(range(12))
    in_process = DataLoader(SlowFirst(12), batch_size=None, num_workers=0)
    in_process.load_state_dict(state)
    assert sorted(got + [int(x) for x in in_process]) == list(range(12))


def test_a_loop_left_by_break_keeps_its_place() -> None:
    """`for batch in loader: ... break`, then state_dict(): the place where
    the loop stopped, not the next epoch (the loop is gone by then)."""
    for workers in (0, 2):
        loader = DataLoader(list(range(10)), batch_size=2, num_workers=workers)
        for i, _ in enumerate(loader):
            if i == 2:
                break
        state = loader.state_dict()
        assert (state["epoch"], state["batches_done"]) == (0, 3)
        resumed = DataLoader(list(range(10)), batch_size=2, num_workers=workers)
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == [[6, 7], [8, 9]]
        # A peek does not use the epoch up: the next iter() starts it again,
        # and a state saved after one says so.
        peeked = DataLoader(list(range(10)), batch_size=2, num_workers=workers)
        next(iter(peeked))
        state = peeked.state_dict()
        assert (state["epoch"], state["batches_done"]) == (0, 0)
        assert len(list(peeked)) == 5


def test_stateful_dataloader_takes_torchdata_s_signature() -> None:
    """torchdata's arguments, in its order, with its defaults (num_workers
    aside: fastq's default, as fastq.torch.DataLoader's), then fastq's own,
    keyword-only; snapshot_every_n_steps changes nothing."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    theirs = inspect.signature(sdl.StatefulDataLoader).parameters
    mine = inspect.signature(StatefulDataLoader).parameters
    assert list(mine)[: len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert mine[name].kind == p.kind, name
        if name != "num_workers":
            assert mine[name].default == p.default, name
    assert mine["num_workers"].default is None
    own = list(inspect.signature(DataLoader).parameters)
    assert list(mine)[len(theirs) :] == own[own.index("in_order") + 1 :]
    loader = StatefulDataLoader(list(range(6)), batch_size=2, snapshot_every_n_steps=5)
    assert loader.snapshot_every_n_steps == 5
    assert isinstance(loader, DataLoader)
    with pytest.raises(fastq.ConfigError, match="snapshot_every_n_steps=-1"):
        StatefulDataLoader(list(range(6)), snapshot_every_n_steps=-1)


def test_a_sampler_state_of_another_sampler_is_refused() -> None:
    loader = DataLoader(list(range(8)), batch_size=2, sampler=ResumingSampler(8))
    state = loader.state_dict()
    plain = DataLoader(list(range(8)), batch_size=2, num_workers=1)
    with pytest.raises(fastq.ConfigError, match=r"\['sampler'\].*sampler"):
        plain.load_state_dict(state)
        iter(plain)
