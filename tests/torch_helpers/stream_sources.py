"""Streams as users have them, for the resume tests: their own
IterableDataset sharded by torch's get_worker_info(), a list of files,
webdataset tar shards split by worker, and an HF datasets IterableDataset.
Sample k of shard s is s * 100 + k; shards have unequal lengths."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

import fastq

SHARDS = 6


def shard_length(shard: int) -> int:
    return 3 + (shard * 5) % 7  # 3 to 9 samples, unequal


def sample_ids() -> list[int]:
    return [s * 100 + k for s in range(SHARDS) for k in range(shard_length(s))]


def _mine(shards: list[Any]) -> list[Any]:
    info = torch.utils.data.get_worker_info()
    if info is None:
        return shards
    return shards[info.id :: info.num_workers]


class OwnSharded(torch.utils.data.IterableDataset[torch.Tensor]):
    """A user's own IterableDataset: it shards its shards by
    torch.utils.data.get_worker_info(), and draws from torch's generator
    (a lane's own, resumed with it)."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        for shard in _mine(list(range(SHARDS))):
            for k in range(shard_length(shard)):
                noise = int(torch.randint(0, 1000, ()).item())
                yield torch.tensor([shard * 100 + k, noise])


class FileList(torch.utils.data.IterableDataset[np.ndarray]):
    """A list of .npy files, each a shard, read by the worker it falls to."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __iter__(self) -> Iterator[np.ndarray]:
        for path in _mine(self.files):
            yield from np.load(path)


def write_files(folder: Path) -> list[str]:
    files = []
    for s in range(SHARDS):
        path = folder / f"shard-{s:02d}.npy"
        ids = np.array([[s * 100 + k] for k in range(shard_length(s))], np.int64)
        np.save(path, ids)
        files.append(str(path))
    return files


def file_samples(files: list[str]) -> Any:
    """The same files as a generator function for fastq.Prefetcher,
    sharded with fastq.get_worker_info()."""

    def samples() -> Iterator[np.ndarray]:
        info = fastq.get_worker_info()
        assert info is not None
        for path in files[info.id :: info.num_workers]:
            yield from np.load(path)

    return samples


def write_tars(folder: Path) -> list[str]:
    urls = []
    for s in range(SHARDS):
        path = folder / f"shard-{s:02d}.tar"
        with tarfile.open(path, "w") as tar:
            for k in range(shard_length(s)):
                data = str(s * 100 + k).encode()
                member = tarfile.TarInfo(f"{s:02d}{k:04d}.cls")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
        urls.append(str(path))
    return urls


def _cls(sample: dict[str, Any]) -> np.ndarray:
    return np.array([int(sample["cls"])], np.int64)


def webdataset(urls: list[str]) -> Any:
    """webdataset's pipeline over tar shards, split by worker
    (split_by_worker, webdataset's default)."""
    import webdataset as wds

    return wds.WebDataset(
        urls,
        shardshuffle=False,
        workersplitter=wds.split_by_worker,
        empty_check=False,
    ).map(_cls)


def hf_iterable() -> Any:
    """An HF datasets IterableDataset in SHARDS shards, which shards itself
    across DataLoader workers."""
    import datasets

    ids = sample_ids()
    data = datasets.Dataset.from_dict({"id": ids})
    return data.to_iterable_dataset(num_shards=SHARDS).with_format("numpy")


class KeepsItsPlace(torch.utils.data.IterableDataset[torch.Tensor]):
    """A dataset that keeps its own place, as HF datasets' IterableDataset
    does (torchdata's Stateful protocol): state_dict() after each sample,
    and load_state_dict() that the next iterator starts from. Each sample
    carries how many this iterator made, to tell a load from a replay."""

    def __init__(self) -> None:
        self._place = 0
        self._start = 0

    def state_dict(self) -> dict[str, int]:
        return {"place": self._place}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = state["place"]

    def __iter__(self) -> Iterator[torch.Tensor]:
        ids = [
            s * 100 + k
            for s in _mine(list(range(SHARDS)))
            for k in range(shard_length(s))
        ]
        start, self._start = self._start, 0
        self._place = start
        for made, sample in enumerate(ids[start:], 1):
            self._place += 1
            yield torch.tensor([sample, made])
