"""fastq.torch.install(): every torch DataLoader with num_workers > 0 runs
on fastq's workers, whoever built it and whenever, and stays what it was
(its class, its pickle, its order); uninstall() gives torch its workers
back. Each check counts who made every sample, not only the data."""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

# As a library binds it at import, before the line runs.
from torch.utils.data import DataLoader as BoundAtImport  # noqa: E402

import fastq  # noqa: E402
import fastq.torch  # noqa: E402
from fastq.torch import _install  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]

N = 32
FASTQ, TORCH, HERE = 2, 1, 0  # who made a sample


class Marked(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[int, int]:
        if fastq.get_worker_info() is not None:
            return int(i), FASTQ
        if torch.utils.data.get_worker_info() is not None:
            return int(i), TORCH
        return int(i), HERE


class Subclass(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A library's own loader class that keeps torch's iterator."""

    def __iter__(self) -> Any:
        return super().__iter__()


class OwnIterator(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """Replaces _get_iterator, as torchdata's StatefulDataLoader does."""

    def _get_iterator(self) -> Any:
        return _install._ORIGINAL(self)


def epoch_of(loader: Any) -> tuple[list[int], set[int]]:
    seen: list[int] = []
    made_by: set[int] = set()
    for index, producer in loader:  # tensors, or ints with batch_size=None
        seen.extend(torch.as_tensor(index).flatten().tolist())
        made_by.update(torch.as_tensor(producer).flatten().tolist())
    return seen, made_by


@pytest.fixture
def installed() -> Iterator[None]:
    with fastq.torch.install():
        yield
    assert not fastq.torch.is_installed()
    gc.collect()  # routed loaders' workers go with their loaders


def test_every_loader_runs_on_fastqs_workers(installed: None) -> None:
    """Built before the line, through a name bound before it, a subclass,
    and after it: each keeps its class and trains every sample of each
    epoch from fastq's workers."""
    before = torch.utils.data.DataLoader(Marked(), batch_size=4, num_workers=2)
    loaders = [
        before,
        BoundAtImport(Marked(), batch_size=4, shuffle=True, num_workers=2),
        Subclass(Marked(), batch_size=4, num_workers=2, persistent_workers=True),
        torch.utils.data.DataLoader(Marked(), batch_size=None, num_workers=1),
    ]
    for loader in loaders:
        assert type(loader) in (torch.utils.data.DataLoader, Subclass)
        assert isinstance(loader, torch.utils.data.DataLoader)
        for _ in range(2):
            seen, made_by = epoch_of(loader)
            assert sorted(seen) == list(range(N)), type(loader)
            assert made_by == {FASTQ}, type(loader)
    assert len(loaders[0]) == N // 4


def test_what_it_leaves_alone(installed: None) -> None:
    """num_workers=0 loads in this process; a class with its own
    _get_iterator (but torchdata's StatefulDataLoader) keeps its workers."""
    _, made_by = epoch_of(torch.utils.data.DataLoader(Marked(), batch_size=4))
    assert made_by == {HERE}
    own = OwnIterator(Marked(), batch_size=4, num_workers=2)
    assert epoch_of(own)[1] == {TORCH}


def test_torchdatas_stateful_dataloader_runs_on_fastq_and_resumes(
    installed: None,
) -> None:
    """torchdata's StatefulDataLoader is routed too, and its state_dict()
    is fastq's: resumed in a new loader (on another number of workers) it
    delivers the rest of the epoch and the next one, from fastq's workers,
    as the run that never stopped; uninstalled, torchdata's workers."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def make(workers: int = 2, persistent: bool = False) -> Any:
        return sdl.StatefulDataLoader(
            Marked(),
            batch_size=4,
            shuffle=True,
            num_workers=workers,
            persistent_workers=persistent,
        )

    for persistent in (False, True):
        torch.manual_seed(3)
        ref = make(persistent=persistent)
        want = [epoch_of(ref)[0] for _ in range(2)]
        torch.manual_seed(3)
        first = make(persistent=persistent)
        it = iter(first)
        got = [next(it) for _ in range(3)]
        assert all(int(p) == FASTQ for _, made_by in got for p in made_by)
        state = first.state_dict()
        assert state["format"] == "fastq.torch.DataLoader/1"
        del it, first
        torch.manual_seed(50)
        resumed = make(workers=3, persistent=persistent)
        resumed.load_state_dict(state)
        seen, made_by = epoch_of(resumed)
        assert [int(i) for b, _ in got for i in b] + seen == want[0]
        assert made_by == {FASTQ}
        assert epoch_of(resumed) == (want[1], {FASTQ})
    fastq.torch.uninstall()
    try:
        assert epoch_of(make())[1] == {TORCH}
    finally:
        fastq.torch.install()


def test_torchdatas_stateful_dataloader_resumes_an_iterable_on_fastq(
    installed: None,
) -> None:
    """Routed, torchdata's StatefulDataLoader over an IterableDataset that
    keeps its own place saves fastq's stream state, which a routed loader
    on another number of workers resumes with the rest of the epoch."""
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    from torch_helpers.stateful_objects import StatefulIterStream

    def make(workers: int) -> Any:
        return sdl.StatefulDataLoader(
            StatefulIterStream(30), batch_size=2, num_workers=workers, collate_fn=list
        )

    first = make(3)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    assert state["format"] == "fastq.torch.DataLoader.stream/1"
    rest = list(it)
    del it, first
    resumed = make(2)
    resumed.load_state_dict(state)
    assert list(resumed) == rest


def test_the_order_is_torchs() -> None:
    """With the same torch.manual_seed, a shuffled loader's epochs come in
    the order torch's own workers give."""
    orders = []
    for on in (False, True):
        torch.manual_seed(7)
        loader = torch.utils.data.DataLoader(
            Marked(), batch_size=4, shuffle=True, num_workers=2
        )
        with fastq.torch.install() if on else _nothing():
            runs = [epoch_of(loader) for _ in range(2)]
        assert {p for _, made_by in runs for p in made_by} == {FASTQ if on else TORCH}
        orders.append([seen for seen, _ in runs])
    assert orders[0] == orders[1]
    assert orders[0][0] != orders[0][1]


def test_uninstall_gives_torch_its_workers_back() -> None:
    """Calls nest; after the last uninstall() torch's own method is back,
    and a persistent loader's next epoch is made by torch's workers."""
    original = _install._ORIGINAL
    loader = torch.utils.data.DataLoader(
        Marked(), batch_size=4, num_workers=2, persistent_workers=True
    )
    fastq.torch.install()
    with fastq.torch.install():
        assert epoch_of(loader)[1] == {FASTQ}
    assert fastq.torch.is_installed()
    assert epoch_of(loader)[1] == {FASTQ}
    fastq.torch.uninstall()
    assert not fastq.torch.is_installed()
    fastq.torch.uninstall()  # without an install: nothing
    if not _install._ADOPTED:  # a loader accelerate prepared keeps the hook
        assert torch.utils.data.DataLoader.__dict__["_get_iterator"] is original
    seen, made_by = epoch_of(loader)
    assert sorted(seen) == list(range(N))
    assert made_by == {TORCH}
    del loader
    gc.collect()


def test_a_routed_loader_pickles_as_torchs(installed: None) -> None:
    """Idle or mid-epoch, the copy trains on fastq's workers of its own.
    With persistent workers once its epochs began, torch's loader holds its
    iterator and cannot be pickled; neither can this one, and it says why."""
    loader = torch.utils.data.DataLoader(Marked(), batch_size=4, num_workers=2)
    idle = pickle.loads(pickle.dumps(loader))
    it = iter(loader)
    next(it)
    running = pickle.loads(pickle.dumps(loader))
    for copy in (idle, running):
        seen, made_by = epoch_of(copy)
        assert sorted(seen) == list(range(N))
        assert made_by == {FASTQ}
    del it
    persistent = torch.utils.data.DataLoader(
        Marked(), batch_size=4, num_workers=2, persistent_workers=True
    )
    epoch_of(persistent)
    with pytest.raises(TypeError, match="fastq's workers cannot be pickled"):
        pickle.dumps(persistent)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_loader_rebuilt_from_an_adopted_one_keeps_its_decode_options() -> None:
    """accelerate rebuilds a prepared fastq DataLoader as torch's class over
    its batch sampler: the fastq loader behind it decodes as the user asked
    (dtype, memory format, lookahead), not with the defaults."""
    ds = torch.utils.data.TensorDataset(torch.arange(16))
    mine = fastq.torch.DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        decode_dtype=torch.bfloat16,
        channels_last=True,
        decode_lookahead=3,
    )
    _install.adopt(mine)
    try:
        rebuilt = torch.utils.data.DataLoader(
            ds, batch_sampler=mine.batch_sampler, num_workers=2
        )
        routed, origin = _install._route(rebuilt)
        assert routed
        shadow = _install._shadow(rebuilt, origin)
        assert shadow.decode_dtype is torch.bfloat16
        assert shadow.channels_last is True
        assert shadow.decode_lookahead == 3
        assert [b[0].tolist() for b in rebuilt] == [
            list(range(k, k + 4)) for k in range(0, 16, 4)
        ]
    finally:
        del mine
        _install._ADOPTED.clear()
        if not _install.is_installed():
            _install._remove_hook()
