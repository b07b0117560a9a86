"""A fastq.torch.DataLoader's epoch with num_workers=0: torch's own iterator,
in this process, keeping its place for state_dict() as the workers'
epochs do."""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data

from ._loader_iterator import LoaderIterator
from ._loader_state import decode_rng, user_states
from ._user_state import (
    SamplerStates,
    is_stateful,
    load_iterator,
    load_samplers,
    restored_at_first_index,
    sampler_owners,
)


def in_process_epoch(loader: Any) -> LoaderIterator:
    """The next epoch of `loader` (map-style, num_workers=0) over torch's
    single-process iterator, resumed where a loaded state says: the
    generator as the epoch's sampler began to draw, the samplers' states
    loaded (or the batches delivered drawn again), and the dataset's state
    loaded once the sampler drew its first index (torch's RandomSampler
    takes its seed from the generator then, before the dataset's draws)."""
    epoch = loader._next_epoch()
    generator = loader.generator or torch.default_generator
    resume, loader._resume = loader._resume, None
    loaded, loader._loaded = loader._loaded, None
    samplers_saved, datasets_saved = (
        (None, None) if resume is None else user_states(resume)
    )
    if resume is not None and resume["seed"] is None:
        generator.set_state(decode_rng(resume["rng_state"]))
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
    samplers = None
    if owners or is_stateful(indices):
        samplers = SamplerStates(owners)
        samplers.begin(indices, skip, samplers_saved)
        indices = samplers.drawing(indices, skip)
    copies: dict[str, Any] | None = None
    dataset = loader.dataset
    if is_stateful(dataset):
        copies = {}
        if datasets_saved and "0" in datasets_saved:
            copies["0"] = datasets_saved["0"]  # what state_dict() says until loaded

            def restore() -> None:
                dataset.load_state_dict(copies.pop("0"))

            indices = restored_at_first_index(indices, restore)
    it._sampler_iter = indices
    seed = int(it._base_seed) & ((1 << 63) - 1)
    live: LoaderIterator = loader._loop(
        it, epoch, skip, rng, samplers, seed, loaded=loaded
    )
    live.inline = True
    live.copies = copies
    return live
