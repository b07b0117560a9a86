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
    _get_iterator (torchdata's StatefulDataLoader) keeps its workers."""
    _, made_by = epoch_of(torch.utils.data.DataLoader(Marked(), batch_size=4))
    assert made_by == {HERE}
    own = OwnIterator(Marked(), batch_size=4, num_workers=2)
    assert epoch_of(own)[1] == {TORCH}


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
