"""A fastq.torch.DataLoader's epoch on its workers: the engine started or
kept, the generator brought back where a loaded state's epoch began, and
the batches (a map-style dataset's, drawn from its samplers, or an
IterableDataset's stream) resumed where the state says."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from ._even_ranks import EvenBatches, ranks_group
from ._loader_iterator import LoaderIterator
from ._loader_state import MAP_STYLE, decode_rng, delivered_past, user_states
from ._user_state import is_stateful, sampled_batches


def workers_epoch(loader: Any) -> LoaderIterator:
    """The next epoch of `loader` (num_workers > 0), as its loop."""
    epoch = loader._next_epoch()
    engine = loader._engine
    if engine is not None and (
        engine.closed
        or not loader.persistent_workers
        or engine.sizing
        or engine.inherited
    ):
        engine.close()  # a no-op where it is inherited
        engine = loader._engine = None
    # A loaded state brings the generator back to where this epoch's
    # draws began: before the base seed's draw if the state has no
    # seed (saved between epochs), else after it.
    generator = loader.generator or torch.default_generator
    resume, loader._resume = loader._resume, None
    loaded, loader._loaded = loader._loaded, None
    if resume is not None and resume["seed"] is None:
        generator.set_state(decode_rng(resume["rng_state"]))
    if engine is None:
        loader._draw_seed()
    if resume is not None and resume["seed"] is not None:
        generator.set_state(decode_rng(resume["rng_state"]))
    if loader._dataset_kind != MAP_STYLE:
        rng = generator.get_state()  # after the base seed's draw
        if engine is None:
            engine = loader._start(None, epoch)
            loader._stream_resume = None  # the new engine's, once
        stream = iter(()) if engine is None else iter(engine)
        group = ranks_group() if loader.even_batches else None
        if group is not None:
            stream = EvenBatches(stream, group)
        return loader._loop(stream, epoch, 0, rng, None, loaded=loaded)
    rng = generator.get_state()  # as the sampler starts to draw
    skip = 0 if resume is None else int(resume["batches_done"])
    past = frozenset() if resume is None else delivered_past(resume)
    dataset_states = None if resume is None else user_states(resume)[1]
    if engine is None:  # new workers, new copies of the dataset
        # (Not beside the GPU decode stage, which takes the batches as
        # the workers made them.)
        stateful = is_stateful(loader.dataset) and not loader._images.on_gpu
        loader._copies = dict(dataset_states or {}) if stateful else None
    saved = None if resume is None else user_states(resume)[0]
    batches, samplers = sampled_batches(loader, saved, skip)
    if engine is None:
        first = next(batches, None)
        if first is None:  # an empty epoch
            return loader._loop(iter(()), epoch, skip, rng, samplers, loaded=loaded)
        batches = itertools.chain([first], batches)
        carried = None if loader._copies is None else dict(loader._copies)
        engine = loader._start(batches, epoch, skip, carried, past)
        assert engine is not None
        it = engine.begin_epoch(iter(()), epoch)
    else:
        it = engine.begin_epoch(batches, epoch, skip, past)
    live = loader._loop(it, epoch, skip, rng, samplers, loaded=loaded)
    if past or not loader.in_order:  # the batches delivered, by number
        live.numbered = engine
        live.delivered = set(past)
    return live
