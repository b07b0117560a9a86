"""Datasets, samplers, collate and init functions for
tests/dataloader_port/ (the port of PyTorch's test_dataloader.py).

Everything that travels to a worker lives here, at module level, so that
spawn and forkserver workers can import it by name."""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import sys
import time
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

# ---------------------------------------------------------------- map-style


class CountingDataset(Dataset[int]):
    """Sample i is the int i."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class PidDataset(Dataset[Any]):
    """Sample i is (i, pid of the process that loaded it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, os.getpid()


class IntKeyDataset(Dataset[int]):
    """Refuses any index that is not a Python int (a numpy or tensor index
    would pass most code but not this)."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: Any) -> int:
        if type(key) is not int:
            raise TypeError(f"index of type {type(key).__name__}, not int")
        return self.values[key]


class ErrorDataset(Dataset[Any]):
    """Has a length but no __getitem__: torch's Dataset base raises
    NotImplementedError for every sample."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


class KeyErrorDataset(Dataset[int]):
    """Raises KeyError for sample `bad`, IndexError past the end."""

    def __init__(self, size: int, bad: int) -> None:
        self.size = size
        self.bad = bad

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        if i >= self.size:
            raise IndexError(i)
        return i


class SegfaultDataset(Dataset[Any]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        return ctypes.string_at(0)  # reads address 0: SIGSEGV


class SleepDataset(Dataset[int]):
    """Sleeps `sleep_sec` on the first sample each copy loads."""

    def __init__(self, size: int, sleep_sec: float) -> None:
        self.size = size
        self.sleep_sec = sleep_sec
        self.slept = False

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        if not self.slept:
            time.sleep(self.sleep_sec)
            self.slept = True
        return i


class SeedDataset(Dataset[int]):
    """Sample = torch.initial_seed() of the process that loads it."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        return torch.initial_seed()


class SynchronizedDataset(Dataset[Any]):
    """test_dataloader.py's SynchronizedDataset: the first sample of each of
    `num_workers` workers waits until all of them are being made, as a
    dataset that synchronizes its workers does (a hang unless every worker
    begins at once)."""

    def __init__(self, size: int, batch_size: int, num_workers: int) -> None:
        assert size >= num_workers * batch_size
        self.count = multiprocessing.Value("i", 0, lock=True)
        self.barrier = multiprocessing.Semaphore(0)
        self.num_workers = num_workers
        self.size = size

    def sync_once(self) -> None:
        with self.count.get_lock():
            self.count.value += 1
            if self.count.value == self.num_workers:
                self.barrier.release()
        self.barrier.acquire()
        self.barrier.release()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        raise NotImplementedError


class SynchronizedSeedDataset(SynchronizedDataset):
    """Sample = torch.initial_seed() of its worker, once every worker is
    making one."""

    def __getitem__(self, i: int) -> int:
        self.sync_once()
        return torch.initial_seed()


class SlowIndexDataset(Dataset[Any]):
    """test_dataloader.py's _TestSlowIndexDataset: sample `slow_index`
    takes a second; every sample is (worker id, index)."""

    def __init__(self, end: int, slow_index: int) -> None:
        self.end = end
        self.slow_index = slow_index

    def __len__(self) -> int:
        return self.end

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = get_worker_info()
        if i == self.slow_index:
            time.sleep(1.0)
        return (-1 if info is None else info.id, i)


class WorkerInfoDataset(Dataset[Any]):
    """Returns `self.value`, which only `worker_info_init_fn` sets (on the
    worker's copy)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        return torch.tensor(self.value)


class SynchronizedWorkerInfoDataset(WorkerInfoDataset):
    """test_dataloader.py's TestWorkerInfoDataset: WorkerInfoDataset whose
    first samples wait for every worker's (SynchronizedDataset)."""

    def __init__(self, size: int, batch_size: int, num_workers: int) -> None:
        super().__init__(size)
        self.sync = SynchronizedDataset(size, batch_size, num_workers)

    def __getitem__(self, i: int) -> Any:
        self.sync.sync_once()
        return torch.tensor(self.value)


class EmptyTensorDataset(Dataset[Any]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.empty(0)


class BulkLoadingDataset(Dataset[Any]):
    """Indexed by a whole list of indices at once (batch_size=None with a
    sampler that yields lists)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: Any) -> Any:
        if not isinstance(indices, (list, tuple)):
            raise TypeError(f"expected a list of indices, got {type(indices)}")
        return torch.as_tensor(indices)


class BulkLoadingSampler(Sampler[list[int]]):
    """Yields a random permutation in lists of `batch_size` indices."""

    def __init__(self, dataset: Any, batch_size: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for chunk in torch.randperm(len(self.dataset)).split(self.batch_size):
            yield chunk.tolist()

    def __len__(self) -> int:
        return math.ceil(len(self.dataset) / self.batch_size)


class NumpyDataset(Dataset[Any]):
    """Sample i = np.ones((2, 3, 4)) * i (float64)."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> Any:
        return np.ones((2, 3, 4)) * i


class ScalarDataset(Dataset[Any]):
    """Every sample is a numpy scalar of `dtype`."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return self.dtype(i)


class ListDataset(Dataset[Any]):
    """Serves the given samples as they are."""

    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        return self.samples[i]


class CustomList(list):  # type: ignore[type-arg]
    pass


class CustomDict(dict):  # type: ignore[type-arg]
    pass


class StringDataset(Dataset[Any]):
    def __init__(self) -> None:
        self.s = "12345"

    def __len__(self) -> int:
        return len(self.s)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.s[i], i


class DictDataset(Dataset[Any]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "a_tensor": torch.empty(4, 2).fill_(i),
            "another_dict": {"a_number": i},
        }


class StartCheckDataset(Dataset[int]):
    """Asserts `self.start == 0` in whichever copy loads a sample; the test
    changes `start` in the parent between epochs."""

    def __init__(self) -> None:
        self.data = list(range(10))
        self.start = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: Any) -> int:
        if torch.is_tensor(i):
            i = i.tolist()
        if self.start != 0:
            raise AssertionError(f"a worker saw start={self.start}")
        return self.data[i]


Batch = namedtuple("Batch", ["data", "label", "random_tensor"])
Data = namedtuple("Data", ["positive", "negative"])


class NamedTupleDataset(Dataset[Any]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Batch:
        return Batch(
            data=Data(positive=i, negative=-i),
            label=str(i),
            random_tensor=torch.randn(3),
        )


class WorkerQueueDataset(Dataset[Any]):
    """Sample = (id of the worker whose `worker_init_fn` ran on this copy,
    item): the init function is a bound method of the dataset."""

    def __init__(self, data: list[int]) -> None:
        self.data = data
        self.worker_id: int | None = None

    def worker_init_fn(self, worker_id: int) -> None:
        self.worker_id = worker_id

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.worker_id, self.data[i]


class ConvDataset(Dataset[Any]):
    """Runs a convolution in the parent at construction, then in workers."""

    def __init__(self) -> None:
        self.x = torch.ones(1, 1, 24000)
        self[0]

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> Any:
        return torch.nn.functional.conv1d(self.x, torch.ones(1, 1, 2))


# ----------------------------------------------------------------- iterable


class CountingIterableDataset(IterableDataset[int]):
    """0 .. n-1 in every copy (not sharded across workers)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


class SizedIterableDataset(IterableDataset[int]):
    def __len__(self) -> int:
        return 10

    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


class WorkerSpecificIterableDataset(IterableDataset[int]):
    """Worker k yields 0 .. sizes[k]-1."""

    def __init__(self, sizes_for_all_workers: list[int]) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            raise AssertionError("get_worker_info() is None in a worker")
        return iter(range(self.sizes_for_all_workers[info.id]))

    def __len__(self) -> int:
        return sum(self.sizes_for_all_workers)


class MultiEpochIterableDataset(IterableDataset[int]):
    """Each worker yields its own id, length // num_workers times."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            raise AssertionError("get_worker_info() is None in a worker")
        for _ in range(self.length // info.num_workers):
            yield info.id

    def __len__(self) -> int:
        return self.length


class ErrorIterableDataset(IterableDataset[Any]):
    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("Error in __iter__")


class SetAffinityDataset(IterableDataset[int]):
    """Yields the CPUs this process may run on."""

    def __iter__(self) -> Iterator[int]:
        torch.randperm(1)
        return iter(sorted(os.sched_getaffinity(0)))


# -------------------------------------------------- init and collate fns


def seed_12345_init_fn(worker_id: int) -> None:
    torch.manual_seed(12345)


def error_worker_init_fn(worker_id: int) -> None:
    raise RuntimeError("Error in worker_init_fn")


def disable_stderr(worker_id: int) -> None:
    """Silences a worker at the descriptor level (faulthandler and signal
    messages are written below Python's sys.stderr)."""
    sys.stderr.flush()
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), sys.stderr.fileno())


def set_affinity(cpu: int, worker_id: int) -> None:
    os.sched_setaffinity(0, [cpu])


def worker_info_init_fn(worker_id: int) -> None:
    """Checks what get_worker_info() says in worker_init_fn, then stamps the
    worker's dataset copy with [worker_id, pid]."""
    info = get_worker_info()
    if info is None:
        raise AssertionError("get_worker_info() is None in worker_init_fn")
    if info.id != worker_id:
        raise AssertionError(f"worker_info.id {info.id} != worker_id {worker_id}")
    if not 0 <= worker_id < info.num_workers:
        raise AssertionError(f"worker_id {worker_id} of {info.num_workers}")
    if info.seed != torch.initial_seed():
        raise AssertionError(
            f"worker_info.seed {info.seed} != torch.initial_seed() "
            f"{torch.initial_seed()}"
        )
    dataset = info.dataset
    if not isinstance(dataset, WorkerInfoDataset):
        raise AssertionError(f"worker_info.dataset is a {type(dataset)}")
    if hasattr(dataset, "value"):
        raise AssertionError("worker_info.dataset already has .value")
    for name, value in (("id", 3999), ("a", 3)):
        try:
            setattr(info, name, value)
        except Exception:  # refused: torch 2.13's WorkerInfo is a frozen dataclass
            pass
        else:
            raise AssertionError(f"worker_info.{name} could be assigned")
    for k in ("id", "num_workers", "seed", "dataset"):
        if f"{k}=" not in repr(info):
            raise AssertionError(f"{k}= missing from {info!r}")
    dataset.value = [worker_id, os.getpid()]


def clone_collate(batch: list[Any]) -> list[Any]:
    return [x.clone() for x in batch]


class SimpleCustomBatch:
    def __init__(self, data: list[Any]) -> None:
        transposed = list(zip(*data))
        self.inp = torch.stack(transposed[0], 0)
        self.tgt = torch.stack(transposed[1], 0)


def collate_wrapper(batch: list[Any]) -> SimpleCustomBatch:
    return SimpleCustomBatch(batch)


def collate_into_packed_sequence(batch: list[Any]) -> Any:
    data = torch.stack([sample[0] for sample in batch], 1)
    t, b = data.size()
    lengths = torch.randint(1, t, size=(b,), dtype=torch.int64)
    return torch.nn.utils.rnn.pack_padded_sequence(data, lengths, enforce_sorted=False)


def collate_into_packed_sequence_batch_first(batch: list[Any]) -> Any:
    data = torch.stack([sample[0] for sample in batch], 0)
    b, t = data.size()
    lengths = torch.randint(1, t, size=(b,), dtype=torch.int64)
    return torch.nn.utils.rnn.pack_padded_sequence(
        data, lengths, batch_first=True, enforce_sorted=False
    )


class RandomIterableDataset(IterableDataset[Any]):
    """`length` tensors of torch.randn(size)."""

    def __init__(self, length: int, size: tuple[int, ...]) -> None:
        self.length = length
        self.size = size

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield torch.randn(self.size)


# ---------------------------------------------------------- proper exit


class ProperExitDataset(Dataset[Any]):
    """Sample i is tensor([i]) until the file `flag` exists; then every
    sample raises RuntimeError("Worker error")."""

    def __init__(self, size: int, flag: str) -> None:
        self.size = size
        self.flag = flag

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        if os.path.exists(self.flag):
            raise RuntimeError("Worker error")
        return torch.tensor([i])


class ProperExitIterableDataset(IterableDataset[Any]):
    """Each copy yields tensor(-1000) `size` times; once the file `flag`
    exists, the last worker's copy raises RuntimeError("Worker error")."""

    def __init__(self, size: int, flag: str) -> None:
        self.size = size
        self.flag = flag
        self.remaining = size

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        info = get_worker_info()
        last = info is not None and info.id == info.num_workers - 1
        if last and os.path.exists(self.flag):
            raise RuntimeError("Worker error")
        self.remaining -= 1
        if self.remaining < 0:
            raise StopIteration
        return torch.tensor(-1000)


def record_pid(path: str, worker_id: int) -> None:
    """worker_init_fn (with functools.partial): appends this worker's pid
    to the file `path`."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
