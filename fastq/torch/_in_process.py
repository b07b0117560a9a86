"""A fastq.torch.DataLoader's epoch with num_workers=0: torch's own iterator,
in this process, keeping its place for state_dict() as the workers'
epochs do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data

from ._loader_iterator import LoaderIterator
from ._loader_state import decode_rng, delivered_past, user_states
from ._user_state import (
    SamplerStates,
    is_stateful,
    load_iterator,
    load_samplers,
    sampler_owners,
)


def in_process_epoch(loader: Any) -> LoaderIterator:
    """The next epoch of `loader` (map-style, num_workers=0) over torch's
    single-process iterator, resumed where a loaded state says: the
    generator as the epoch's sampler began to draw, the samplers' states
    loaded (or the batches delivered drawn again), and the dataset's state
    loaded where it was saved in the generator's draws: before the
    iterator's base seed for a state saved between epochs, else after the
    batches delivered were drawn (a dataset that saves torch's generator
    state, as torchdata's examples do, then draws as the uninterrupted run
    did)."""
    epoch = loader._next_epoch()
    generator = loader.generator or torch.default_generator
    resume, loader._resume = loader._resume, None
    loaded, loader._loaded = loader._loaded, None
    samplers_saved, datasets_saved = (
        (None, None) if resume is None else user_states(resume)
    )
    dataset = loader.dataset
    dataset_saved = None
    if datasets_saved and is_stateful(dataset):
        dataset_saved = datasets_saved.get("0")
    if resume is not None and resume["seed"] is None:
        generator.set_state(decode_rng(resume["rng_state"]))
        if dataset_saved is not None:
            dataset.load_state_dict(dataset_saved)
            dataset_saved = None
    owners = sampler_owners(loader)
    if samplers_saved is not None:
        load_samplers(owners, samplers_saved)
    # torch's iterator: makes the index iterator, then draws a base seed.
    it: Any = torch.utils.data.DataLoader.__iter__(loader)
    if resume is not None and resume["seed"] is not None:
        generator.set_state(decode_rng(resume["rng_state"]))
    rng = generator.get_state()
    skip = 0 if resume is None else int(resume["batches_done"])
    indices = it._sampler_iter
    if samplers_saved is not None:
        load_iterator(indices, samplers_saved)
    else:
        for _ in range(skip):  # delivered before the state was saved
            next(indices, None)
    if dataset_saved is not None:
        dataset.load_state_dict(dataset_saved)
    samplers = None
    if owners or is_stateful(indices):
        samplers = SamplerStates(owners)
        samplers.begin(indices, skip, samplers_saved)
        it._sampler_iter = samplers.drawing(indices, skip)
    past = frozenset() if resume is None else delivered_past(resume)
    numbers = None
    if past:
        numbers = DrawnNumbers(it._sampler_iter, skip, past)
        it._sampler_iter = iter(numbers)
    seed = int(it._base_seed) & ((1 << 63) - 1)
    live: LoaderIterator = loader._loop(
        it, epoch, skip, rng, samplers, seed, loaded=loaded
    )
    live.inline = True
    if numbers is not None:
        live.numbered = numbers
        live.delivered = set(past)
    return live


class DrawnNumbers:
    """An epoch's index lists from batch `first` on, dropping those numbered
    in `past` (delivered out of order before a loaded state), with the
    number of the one drawn last."""

    def __init__(self, indices: Iterator[Any], first: int, past: frozenset[int]):
        self._indices = indices
        self._first = first
        self._past = past
        self.last_batch = -1

    def __iter__(self) -> Iterator[Any]:
        number = self._first
        for index in self._indices:
            if number not in self._past:
                self.last_batch = number
                yield index
            number += 1


def in_process_stream(loader: Any) -> LoaderIterator:
    """The next epoch of `loader` (an IterableDataset, num_workers=0) over
    torch's single-process iterator, resumed where a loaded state says, as
    StatefulDataLoader resumes one: the generator as the epoch began, the
    dataset's own state loaded before its iterator is made, then the
    iterator's loaded where it keeps one; where neither keeps its place,
    the batches delivered are made again and dropped."""
    epoch = loader._next_epoch()
    generator = loader.generator or torch.default_generator
    resume, loader._resume = loader._resume, None
    loaded, loader._loaded = loader._loaded, None
    dataset = loader.dataset
    if resume is not None:
        generator.set_state(decode_rng(resume["rng_state"]))
        states = resume.get("dataset_states")
        if states is not None and states[0] is not None:
            dataset.load_state_dict(states[0])
    rng = generator.get_state()  # as the epoch began, before torch's draw
    # torch's iterator: draws its base seed, then makes the dataset's iterator.
    it: Any = torch.utils.data.DataLoader.__iter__(loader)
    items = None if resume is None else resume.get("items")
    if items:
        dataset_iter = it._dataset_fetcher.dataset_iter
        saved = resume.get("iterator_state")  # type: ignore[union-attr]
        if saved is not None and is_stateful(dataset_iter):
            dataset_iter.load_state_dict(saved)
        elif not is_stateful(dataset) and not is_stateful(dataset_iter):
            for _ in range(items[0]):  # delivered before the state was saved
                if next(it, _END) is _END:
                    break
    done = 0 if not items else items[0]
    live: LoaderIterator = loader._loop(it, epoch, done, rng, None, loaded=loaded)
    live.inline = True
    live.stream_iter = it
    return live


_END = object()
