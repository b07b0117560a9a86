"""How a fastq.torch.DataLoader's arguments become the engine it runs on:
its source and planned loader, its workers' start method, and pinning as
DataLoader pins (the page-locked ring on CUDA, by copy elsewhere)."""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.utils.data
from torch.utils.data._utils.pin_memory import pin_memory as pin_batch

from .._faces._arguments import as_int
from .._faces._planned import PlannedLoader
from .._faces._prefetcher import default_workers
from .._make._state import StreamResume
from .._make._streams import warn_fewer_shards
from .._workers._start_method import get_context
from ..errors import ConfigError
from . import _image_decode
from ._pinned import CudaRing
from ._worker_side import IterableSource, MapSource


class LoaderArgs(Protocol):
    """What the engine is made from: a fastq.torch.DataLoader's arguments
    (torch's, then fastq's own) and its drawn base seed."""

    dataset: Any
    batch_size: int | None
    drop_last: bool
    num_workers: int
    collate_fn: Callable[[Any], Any]
    prefetch_factor: int | None
    multiprocessing_context: Any
    timeout: float
    worker_init_fn: Callable[[int], Any] | None
    in_order: bool
    pin_memory: bool
    slots: int | None
    slot_bytes: int | None
    max_batch_size: int | None
    worker_threads: int | None
    _seed: int | None
    _images: Any  # its ImageDecode (fastq/torch/_image_decode.py)
    # An iterable dataset's lanes (None: one per worker) and where a loaded
    # state resumes them (NOTE [ A stream's lanes ] in fastq/_workers/_lanes.py).
    _streams: int | None
    _stream_resume: StreamResume | None

    @property
    def _auto_collation(self) -> bool: ...


def new_engine(
    loader: LoaderArgs,
    batches: Iterator[Any] | None,
    epoch: int,
    first_batch: int,
    dataset_states: dict[str, Any] | None = None,
    skip: frozenset[int] = frozenset(),
) -> PlannedLoader:
    """The engine of DataLoader's arguments: a map-style dataset's batches
    from `batches` (planned indices), else the iterable dataset's own. A
    Stateful map-style dataset's copies (with `dataset_states` not None)
    load `dataset_states` (by worker id) and send their states with their
    batches. The batches numbered in `skip` are dropped (delivered out of
    order before a loaded state)."""
    assert loader._seed is not None
    collate = loader.collate_fn
    if batches is not None:
        source: Any = MapSource(
            loader.dataset,
            collate,
            loader._auto_collation,
            carry_state=dataset_states is not None,
            states=dataset_states or None,
        )
    else:
        warn_fewer_shards(loader.dataset, loader._streams or loader.num_workers)
        source = IterableSource(
            loader.dataset,
            collate,
            loader.batch_size if loader._auto_collation else None,
            loader.drop_last,
        )
    workers = loader.num_workers
    prefetch = loader.prefetch_factor or 2
    convert, pinning = _pinning(loader)
    rank, world_size = rank_and_world_size()
    return PlannedLoader(
        source,
        ctx=_context(loader.multiprocessing_context),
        workers=workers,
        slots=loader.slots or max(4, prefetch * workers),
        seed=loader._seed,
        first=batches,
        epoch=epoch,
        max_rows=loader.max_batch_size or (loader.batch_size or 1),
        ordered=loader.in_order,
        timeout=float(loader.timeout) if loader.timeout > 0 else None,
        worker_init=loader.worker_init_fn,
        worker_threads=loader.worker_threads,
        slot_bytes=loader.slot_bytes,
        rank=rank,
        world_size=world_size,
        convert=convert,
        pinning=pinning,
        first_batch=first_batch,
        streams=0 if batches is not None else loader._streams or 0,
        stream_resume=None if batches is not None else loader._stream_resume,
        skip=skip,
    )


def _context(multiprocessing_context: Any) -> Any:
    """fastq's context for DataLoader's multiprocessing_context (None, a
    start method's name, or a context object)."""
    if multiprocessing_context is None:
        return get_context(None)
    if isinstance(multiprocessing_context, str):
        return get_context(multiprocessing_context)
    return get_context(multiprocessing_context.get_start_method())


def warn_as_dataloader_pins(pin_memory_device: str) -> None:
    """DataLoader's warnings for pin_memory=True: its pin_memory_device is
    deprecated (the current accelerator's is used), and there may be no
    accelerator to pin for."""
    if pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be "
            f"used as the device, ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=3,
        )
    if not torch.accelerator.is_available():
        warnings.warn(
            "pin_memory=True, but no accelerator is available: batches are "
            "not pinned (as DataLoader does here)",
            UserWarning,
            stacklevel=3,
        )


def _pinning(loader: LoaderArgs) -> tuple[Any, Any]:
    """(convert, pinning) for the engine, as DataLoader pins: for the
    current accelerator, nothing where there is none (or MPS). On CUDA the
    ring is page-locked once (fastq/torch/_pinned.py), so that its tensors
    are pinned as they are; torch's pin_memory then returns them untouched
    and pins the rest as DataLoader would (tensors rebuilt from pickles, a
    custom batch's own pin_memory()). Images decoded on the GPU: a ring
    whose returner keeps each slot until its decode has run, page-locked
    if pin_memory=True, and nothing pinned by copy (the batch is bytes the
    decoder reads)."""
    if loader._images.on_gpu:
        return None, functools.partial(_image_decode.decode_ring, loader.pin_memory)
    device = _pin_device(loader)
    if device is None:
        return None, None
    convert = functools.partial(pin_batch, device=device)
    if device != "cuda":
        return convert, None  # copied into page-locked memory, as torch does
    return convert, _page_locked_ring


def _pin_device(loader: LoaderArgs) -> str | None:
    if not loader.pin_memory or not torch.accelerator.is_available():
        return None
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type == "mps":
        return None  # DataLoader does not pin for MPS either
    return str(accelerator.type)


def _page_locked_ring() -> CudaRing:
    """Made once the ring exists (its workers started), on the current
    device; page-locked off the first batch's path."""
    return CudaRing(
        torch.device("cuda", torch.cuda.current_device()), False, register_later=True
    )


def rank_and_world_size() -> tuple[int, int]:
    """For get_worker_info() only: DataLoader does not shard, its sampler
    does (DistributedSampler), so fastq.torch.DataLoader does not either."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


def checked_workers(dataset: Any, num_workers: Any) -> int:
    """num_workers, checked, or fastq's default for `dataset` (None)."""
    if num_workers is None:
        # An IterableDataset is read by every worker, whole unless it
        # shards itself with get_worker_info() (few do: a generator over
        # files or a stream): one worker reads it once per epoch, as
        # DataLoader's default does, still off the loop's thread.
        iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        return 1 if iterable else default_workers()
    count = as_int(num_workers)
    if count is None or count < 0:
        raise ConfigError(
            f"num_workers={num_workers!r}: expected an int >= 0 (0 loads "
            "in this process), or None for fastq's default"
        )
    return count
