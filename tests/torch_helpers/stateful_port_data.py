"""Datasets, samplers and functions for tests/stateful_port/ (the port of
torchdata's test/stateful_dataloader/test_state_dict.py), at module level
so that workers of any start method import them by name. Each is the
original's, by the same name; sizes are the tests' to choose."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data


class DummyIterator(Iterator[Any]):
    def __init__(self, samples: list[Any], shuffle: bool, include_generator: bool):
        self.samples = samples
        self.shuffle = shuffle
        self.include_generator = include_generator
        self.size = len(self.samples)
        self.i = 0

    def __iter__(self) -> DummyIterator:
        return self

    def __next__(self) -> Any:
        if self.i >= len(self.samples):
            raise StopIteration
        if self.shuffle:
            i = torch.randint(self.size, (1,)).item()
        else:
            i = self.i
        sample = self.samples[i]
        self.i += 1
        return sample

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {"nest": {"i": self.i}}
        if self.include_generator:
            sd["nest"]["g"] = torch.get_rng_state()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.i = state_dict["nest"]["i"]
        if self.include_generator:
            torch.set_rng_state(state_dict["nest"]["g"])


class DummySamplerIterator(Iterator[int]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.i = 0

    def __next__(self) -> int:
        idx = self.i
        if idx >= self.size:
            raise StopIteration
        self.i += 1
        return idx

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.i = state_dict["i"]


class DummySampler(torch.utils.data.Sampler[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[int]:
        return DummySamplerIterator(self.size)

    def __len__(self) -> int:
        return self.size


class DummyIteratorIterableDataset(
    torch.utils.data.IterableDataset[Any], DummyIterator
):
    def __init__(self, samples: list[Any], shuffle: bool, include_generator: bool):
        DummyIterator.__init__(self, samples, shuffle, include_generator)

    def __iter__(self) -> DummyIteratorIterableDataset:
        return self


class DummyIterableDataset(torch.utils.data.IterableDataset[Any]):
    def __init__(
        self,
        sizes_for_all_workers: list[int],
        shuffle: bool = False,
        include_generator: bool = True,
    ) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers
        self.shuffle = shuffle
        self.include_generator = include_generator

    def __iter__(self) -> DummyIterator:
        worker_info = torch.utils.data.get_worker_info()
        if worker_info:
            worker_id = worker_info.id
        else:
            worker_id = 0
            self.sizes_for_all_workers = [sum(self.sizes_for_all_workers)]
        start = sum(self.sizes_for_all_workers[:worker_id])
        iter_data = list(range(start, start + self.sizes_for_all_workers[worker_id]))
        return DummyIterator(iter_data, self.shuffle, self.include_generator)


class DummyMapDataset(torch.utils.data.Dataset[Any]):
    def __init__(self, size: int, shuffle: bool, include_generator: bool = True):
        self.size = size
        self.data = [
            {"id": i, "strcol": f"strcol_{i}", "listcol": [i, i + 1, i + 2]}
            for i in range(size)
        ]
        self.shuffle = shuffle
        self.include_generator = include_generator

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        if self.shuffle:
            i = torch.randint(self.size, (1,)).item()
        return self.data[i]

    def state_dict(self) -> dict[str, Any]:
        if self.include_generator:
            return {"g": torch.get_rng_state()}
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.include_generator:
            torch.set_rng_state(state_dict["g"])


class DynamicStateIterableDataset(torch.utils.data.IterableDataset[Any]):
    def __init__(self, samples: list[Any]) -> None:
        self.samples = samples
        self.size = len(self.samples)
        self.i = 0
        self.state: dict[str, Any] = {}

    def __iter__(self) -> DynamicStateIterableDataset:
        return self

    def __next__(self) -> Any:
        if self.i >= len(self.samples):
            raise StopIteration
        sample = self.samples[self.i]
        self.i += 1
        return sample

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"i": self.i}
        for a in range(self.i):
            state[str(a)] = {a: list(range(a))}
            state[f"t{a}"] = torch.tensor(a, dtype=torch.int8)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.i = state_dict["i"]
        self.state = state_dict


def identity(x: Any) -> Any:
    return x


class GeneratorIterable(torch.utils.data.IterableDataset[Any]):
    def __init__(self, sizes_for_all_workers: list[int], increment_epoch: bool = False):
        self.sizes_for_all_workers = sizes_for_all_workers
        self.i = 0
        self.resume: int | None = None
        self.epoch = 0
        self.increment_epoch = increment_epoch

    def __iter__(self) -> Iterator[Any]:
        worker_info = torch.utils.data.get_worker_info()
        if worker_info:
            worker_id = worker_info.id
        else:
            worker_id = 0
            self.sizes_for_all_workers = [sum(self.sizes_for_all_workers)]
        self.i = 0
        if self.resume is not None:
            self.i = self.resume
            self.resume = None
        start = sum(self.sizes_for_all_workers[:worker_id])
        skip = self.i
        for i in range(start + skip, start + self.sizes_for_all_workers[worker_id]):
            self.i += 1
            yield (i, self.epoch)
        # To save end-of-epoch state properly, reset variables here so
        # loading begins from the correct position and epoch.
        self.i = 0
        if self.increment_epoch:
            self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume = state["i"]
        self.epoch = state["epoch"]


class GeneratorIterableNoState(torch.utils.data.IterableDataset[Any]):
    def __init__(self, sizes_for_all_workers: list[int]) -> None:
        self.sizes_for_all_workers = sizes_for_all_workers

    def __iter__(self) -> Iterator[Any]:
        worker_info = torch.utils.data.get_worker_info()
        if worker_info:
            worker_id = worker_info.id
        else:
            worker_id = 0
            self.sizes_for_all_workers = [sum(self.sizes_for_all_workers)]
        start = sum(self.sizes_for_all_workers[:worker_id])
        yield from range(start, start + self.sizes_for_all_workers[worker_id])


class ErrorDataset(torch.utils.data.Dataset[Any]):
    def __getitem__(self, index: int) -> Any:
        raise ValueError("Iteration error")

    def __len__(self) -> int:
        return 10


ERROR_MSG = "Worker init error"


def error_worker_init_fn(worker_id: int) -> None:
    raise ValueError(ERROR_MSG)


class PeriodicStateIterableDataset(torch.utils.data.IterableDataset[Any]):
    def __init__(self, limit: int = 100) -> None:
        self.state = {0: 0, 1: 0, 2: 0, 3: 0}
        self.step = 0
        self.limit = limit

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.step, self.limit):
            self.step += 1
            y = self.state[self.step % len(self.state)]
            self.state[self.step % len(self.state)] = 1 - y
            yield self.state[self.step % len(self.state)]

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state, "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state["state"]
        self.step = state["step"]


class IterationState:
    def __init__(self, start: int, end: int) -> None:
        self.curr = start
        self.end = end

    def set_state(self, state: dict[str, int]) -> None:
        self.curr = state["curr"]
        self.end = state["end"]

    def get_state(self) -> dict[str, int]:
        return {"curr": self.curr, "end": self.end}


class CountIterCalls(torch.utils.data.IterableDataset[Any]):
    def __init__(self, length: int) -> None:
        self.length = length
        self.iter_calls = 0

    def __iter__(self) -> Iterator[Any]:
        self.iter_calls += 1
        return iter(list(range(self.length)))

    def state_dict(self) -> dict[str, Any]:
        return {"iter_calls": self.iter_calls}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class CountIterCallsIter(torch.utils.data.IterableDataset[Any]):
    def __init__(self, length: int) -> None:
        self.length = length
        self.iter_calls = 0

    def __iter__(self) -> CountIterCallsIter:
        self.iter_calls += 1
        info = torch.utils.data.get_worker_info()
        worker_id = 0 if info is None else info.id
        num_workers = 1 if info is None else info.num_workers
        num_samples = int(self.length / num_workers)
        self.iter_state = IterationState(
            num_samples * worker_id, num_samples * (worker_id + 1)
        )
        return self

    def __next__(self) -> Any:
        if self.iter_state.curr >= self.iter_state.end:
            raise StopIteration
        value = self.iter_state.curr
        self.iter_state.curr += 1
        return value

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.iter_state.get_state(), "iter_calls": self.iter_calls}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iter_state.set_state(state_dict["state"])


class SlowIndexDataset(torch.utils.data.Dataset[int]):
    """The original's _TestSlowIndexDataset."""

    def __init__(self, end: int, slow_index: int) -> None:
        self.end = end
        self.slow_index = slow_index

    def __getitem__(self, idx: int) -> int:
        if idx == self.slow_index:
            time.sleep(1.0)
        return idx

    def __len__(self) -> int:
        return self.end


class SlowIterableDataset(torch.utils.data.IterableDataset[int]):
    """The original's _TestSlowIterableDataset."""

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.mid = math.ceil((self.end - self.start) / 2)

    def give_data(self, iter_start: int, iter_end: int) -> Iterator[int]:
        for i in range(iter_start, iter_end):
            if i == self.mid:
                time.sleep(1.0)
            yield i

    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        per_worker = math.ceil((self.end - self.start) / info.num_workers)
        iter_start = self.start + info.id * per_worker
        iter_end = min(iter_start + per_worker, self.end)
        return self.give_data(iter_start, iter_end)
