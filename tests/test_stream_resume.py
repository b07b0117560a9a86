"""A stream resumed on another number of worker processes: stopped after k
batches, saved as JSON and loaded by a loader with 3, 2 or 4 workers, it
delivers exactly the uninterrupted run's remaining batches, in order, over
two epochs; for the sources users have (their own IterableDataset, a list
of files, webdataset, HF datasets), on both faces. The state's workers are
lanes (NOTE [ A stream's lanes ] in fastq/_workers/_lanes.py), which every
number of processes runs in the same order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("webdataset")
pytest.importorskip("datasets")

from torch_helpers import stream_sources as sources  # noqa: E402

import fastq  # noqa: E402
from fastq.torch import DataLoader  # noqa: E402

pytestmark = [pytest.mark.torch]

SOURCES = ["own", "files", "webdataset", "hf"]
BATCH = 2
WORKERS = 3
EPOCHS = 2


def dataset(kind: str, folder: Path) -> Any:
    """The source as a torch IterableDataset (the drop-in's)."""
    if kind == "own":
        return sources.OwnSharded()
    if kind == "files":
        return sources.FileList(sources.write_files(folder))
    if kind == "webdataset":
        return sources.webdataset(sources.write_tars(folder))
    return sources.hf_iterable()


def stream(kind: str, folder: Path) -> Any:
    """The source as fastq.Prefetcher takes it: a list of files through a
    generator function, the others as they are."""
    if kind == "files":
        return sources.file_samples(sources.write_files(folder))
    return dataset(kind, folder)


def rows(batch: Any) -> list[list[int]]:
    if isinstance(batch, dict):
        batch = batch["id"]
    data = np.asarray(batch)
    return data.reshape(len(data), -1).tolist()


def epochs(loader: Any, first: int, stop: int | None = None) -> tuple[list[Any], Any]:
    """Batches of the epochs from `first` on; with `stop`, the state after
    that many batches, through JSON."""
    out: list[Any] = []
    for _ in range(first, EPOCHS):
        for batch in loader:
            out.append(rows(batch))
            if len(out) == stop:
                return out, json.loads(json.dumps(loader.state_dict()))
    return out, None


def per_epoch(full: list[Any]) -> int:
    return len(full) // EPOCHS


@pytest.mark.parametrize("kind", SOURCES)
def test_the_drop_in_resumes_a_stream_on_any_number_of_workers(
    kind: str, tmp_path: Path
) -> None:
    data = dataset(kind, tmp_path)
    torch.manual_seed(0)
    full, _ = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0)
    assert sorted(r[0] for b in full for r in b) == sorted(sources.sample_ids() * 2)
    # In the second epoch too, and in its first batches.
    for stop in (7, per_epoch(full) + 3):
        torch.manual_seed(0)
        loader = DataLoader(data, batch_size=BATCH, num_workers=WORKERS)
        head, state = epochs(loader, 0, stop)
        assert head == full[:stop]
        assert len(json.dumps(state)) < 64 * 1024
        for workers in (3, 2, 4):
            resumed = DataLoader(data, batch_size=BATCH, num_workers=workers)
            resumed.load_state_dict(state)
            rest, _ = epochs(resumed, state["epoch"])
            assert rest == full[stop:], f"resumed on {workers} workers"


@pytest.mark.parametrize("kind", SOURCES)
def test_the_prefetcher_resumes_a_stream_on_any_number_of_workers(
    kind: str, tmp_path: Path
) -> None:
    source = stream(kind, tmp_path)

    def prefetcher(workers: int, state: Any = None) -> fastq.Prefetcher:
        return fastq.Prefetcher(
            source, batch_size=BATCH, workers=workers, seed=5, copy=True, state=state
        )

    with prefetcher(WORKERS) as pf:
        full, _ = epochs(pf, 0)
    for stop in (7, per_epoch(full) + 3):
        with prefetcher(WORKERS) as pf:
            head, state = epochs(pf, 0, stop)
        assert head == full[:stop]
        done = 0 if stop < per_epoch(full) else 1
        assert state["pass"] == done
        for workers in (3, 2, 4):
            with prefetcher(workers, state) as pf:
                rest, _ = epochs(pf, done)
            assert rest == full[stop:], f"resumed on {workers} workers"


@pytest.mark.parametrize("kind", ["own", "webdataset", "hf"])
def test_the_drop_in_delivers_torchs_batches(kind: str, tmp_path: Path) -> None:
    data = dataset(kind, tmp_path)
    torch.manual_seed(0)
    mine, _ = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, num_workers=WORKERS)
    theirs, _ = epochs(loader, 0)

    def ids(run: list[Any]) -> list[Any]:  # a sample's draws are a worker's own
        return [[r[0] for r in b] for b in run]

    assert ids(mine) == ids(theirs)


def test_the_drop_in_resumes_as_statefuldataloader_does(tmp_path: Path) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    data = dataset("hf", tmp_path)
    torch.manual_seed(0)
    full, _ = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0)
    loader = stateful.StatefulDataLoader(data, batch_size=BATCH, num_workers=WORKERS)
    torch.manual_seed(0)
    _, state = epochs(loader, 0, 7)
    resumed = stateful.StatefulDataLoader(data, batch_size=BATCH, num_workers=WORKERS)
    resumed.load_state_dict(state)
    theirs, _ = epochs(resumed, 0)
    assert theirs == full[7:]


def test_a_lane_draws_what_it_would_alone() -> None:
    # OwnSharded draws from torch's generator: a process running two lanes
    # swaps each one's generators in, so each draws its own sequence.
    data = sources.OwnSharded()
    runs = []
    for workers in (3, 1):
        torch.manual_seed(0)
        loader = DataLoader(data, batch_size=BATCH, num_workers=3)
        _, state = epochs(loader, 0, 1)
        resumed = DataLoader(data, batch_size=BATCH, num_workers=workers)
        resumed.load_state_dict(state)
        runs.append(epochs(resumed, 0)[0])
    assert runs[0] == runs[1]


def test_a_state_of_another_source_or_rank_is_refused_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loader = DataLoader(sources.OwnSharded(), batch_size=BATCH, num_workers=2)
    state = loader.state_dict()
    other = DataLoader(dataset("files", tmp_path), batch_size=BATCH, num_workers=2)
    with pytest.raises(
        fastq.ConfigError, match=r"state\['source'\]=.*OwnSharded.*FileList"
    ):
        other.load_state_dict(state)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(fastq.ConfigError, match=r"state\['world_size'\]=1.*=2"):
        loader.load_state_dict(state)


def test_a_prefetcher_state_of_another_source_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    with fastq.Prefetcher(
        sources.OwnSharded(), batch_size=BATCH, workers=2, seed=1
    ) as pf:
        state = pf.state_dict()
    files = stream("files", tmp_path)
    with pytest.raises(fastq.ConfigError, match=r"state\['source'\]=.*OwnSharded"):
        fastq.Prefetcher(files, batch_size=BATCH, workers=2, state=state)


def test_the_state_stays_small_for_ten_thousand_shards(tmp_path: Path) -> None:
    # Its size follows the workers, never the shards: 10,000 of them (one
    # file named 10,000 times), a state saved after the first batch.
    shard = tmp_path / "shard.npy"
    np.save(shard, np.arange(4, dtype=np.int64).reshape(4, 1))
    files = [str(shard)] * 10_000
    loader = DataLoader(sources.FileList(files), batch_size=BATCH, num_workers=4)
    it = iter(loader)
    next(it)
    text = json.dumps(loader.state_dict())
    del it
    assert len(text) <= 64 * 1024
    with fastq.Prefetcher(
        sources.file_samples(files), batch_size=BATCH, workers=4, seed=1
    ) as pf:
        it = iter(pf)
        next(it)
        text = json.dumps(pf.state_dict())
        del it
    assert len(text) <= 64 * 1024


def test_a_dataset_that_keeps_its_place_is_asked_for_it_not_replayed() -> None:
    data = sources.KeepsItsPlace()
    torch.manual_seed(0)
    full, _ = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0)
    torch.manual_seed(0)
    loader = DataLoader(data, batch_size=BATCH, num_workers=WORKERS)
    _, state = epochs(loader, 0, 7)
    assert state["dataset_states"] == [
        {"dataset": {"place": n * BATCH}, "iterator": None} for n in state["items"]
    ]
    for workers in (3, 2, 4):
        resumed = DataLoader(data, batch_size=BATCH, num_workers=workers)
        resumed.load_state_dict(state)
        rest, _ = epochs(resumed, 0)
        assert [[r[0] for r in b] for b in rest] == [
            [r[0] for r in b] for b in full[7:]
        ]
        # Each worker's iterator made its rest of the epoch, nothing more.
        epoch0 = rest[: per_epoch(full) - 7]
        for lane in range(WORKERS):
            made = [r[1] for b in epoch0 for r in b if r[0] // 100 % WORKERS == lane]
            assert made == list(range(1, len(made) + 1))


def test_a_loaded_state_saved_again_before_a_batch_is_the_state_loaded() -> None:
    data = sources.OwnSharded()
    torch.manual_seed(0)
    full, _ = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0)
    torch.manual_seed(0)
    _, state = epochs(DataLoader(data, batch_size=BATCH, num_workers=WORKERS), 0, 5)
    loader = DataLoader(data, batch_size=BATCH, num_workers=2)
    loader.load_state_dict(state)
    assert loader.state_dict() == state
    it = iter(loader)  # a checkpoint at the first step after a restart
    again = json.loads(json.dumps(loader.state_dict()))
    del it
    assert again == state
    resumed = DataLoader(data, batch_size=BATCH, num_workers=4)
    resumed.load_state_dict(again)
    assert epochs(resumed, state["epoch"])[0] == full[5:]
