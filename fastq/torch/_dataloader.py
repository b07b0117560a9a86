"""fastq.torch.DataLoader: torch's DataLoader, argument for argument, with
fastq's workers and ring behind its iterator.

It subclasses ``torch.utils.data.DataLoader`` and lets torch's constructor
validate the arguments and build the sampler, batch sampler and collate
function, so every argument keeps DataLoader's meaning and every attribute
a trainer reads is there; ``isinstance(loader, DataLoader)`` holds, so
Lightning can re-create it with a DistributedSampler. Only iteration with
``num_workers > 0`` differs: the sampler runs here, as in DataLoader's main
process, and each batch's indices reach the workers through the ring's plan
table; a worker fetches and collates into a slot; the batch is rebuilt here
over the slot, without a copy, a pickle of its arrays, or a file descriptor.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.utils.data

from .._faces._arguments import as_int, positive_int
from .._faces._planned import PlannedLoader
from .._make._state import StreamResume
from ..errors import ConfigError, EmptySource, FetchTimeout, WorkerError
from . import _image_decode
from ._decode_stage import DECODE_LOOKAHEAD, collate_encoded
from ._decoders import DEFAULT_BACKEND
from ._even_ranks import check_even_batches
from ._image_decode import ImageDecode, encoded_slot_bytes
from ._in_process import in_process_epoch, in_process_stream
from ._loader_engine import checked_workers, new_engine, warn_as_dataloader_pins
from ._loader_iterator import (
    DataLoaderTimeout,
    LoaderIterator,
    as_dataloader_timeout,
    with_own_type,
)
from ._loader_state import (
    MAP_STYLE,
    load_map_state,
    state_between_epochs,
    state_of_loop,
)
from ._stream_state import (
    load_stream_state,
    stream_state_between_epochs,
    stream_state_of_loop,
)
from ._user_state import SamplerStates
from ._workers_epoch import workers_epoch

__all__ = ["DataLoader", "DataLoaderTimeout"]

# What a batch is, as torch's DataLoader is generic in it: the annotation
# DataLoader[torch.Tensor] means the same for both.
_T_co = TypeVar("_T_co", covariant=True)


def _not_routed(loader: DataLoader[Any]) -> None:
    pass


# What reading _is_accelerate_prepared does: set to `adopt` by
# fastq/torch/_install.py, which builds on this module (fastq.torch imports
# both), so that accelerate's rebuilt loader runs on fastq's workers.
on_accelerate_prepare: Callable[[DataLoader[Any]], None] = _not_routed


class DataLoader(torch.utils.data.DataLoader[_T_co]):
    """``torch.utils.data.DataLoader`` with fastq's workers: the same
    arguments, in the same order, with the same meaning, then fastq's own.

    Differences (the migration table in ``docs/dataloader.md`` gives each
    with its reason):
    ``num_workers`` defaults to the usable CPUs / ``LOCAL_WORLD_SIZE`` - 1
    for a map-style dataset, and to one worker for an ``IterableDataset``,
    which each worker would read whole unless it shards itself (0 runs in
    this process, as DataLoader's 0 does); torch's generator is
    seeded per batch, from (base seed, epoch, batch), like ``random`` and
    ``numpy.random``, so a batch's randomness does not depend on the number
    of workers.

    DataLoader's arguments keep torch's meaning; fastq's own come after
    them, keyword-only.

    Parameters
    ----------
    slots : int, optional
        Batches in flight; default ``max(4, prefetch_factor * num_workers)``.
    slot_bytes : int, optional
        Bytes per slot. By default sized from the first batch, scaled to
        the largest batch the sampler's first batches ask for.
    max_batch_size : int, optional
        The most indices a batch from ``batch_sampler`` may have; default
        the largest among its first batches.
    worker_threads : int or None
        BLAS/OpenMP/torch threads per worker (default 1); None leaves them.
    decode_backend : str or decoder object
        For a dataset of encoded images (``fastq.vision.ImageFolder``, one
        with a ``decode_plan``): the GPU decoder, ``"nvimgcodec"``,
        ``"torchvision"``, ``"auto"`` (the first installed; the default) or
        ``"cpu"`` (the workers decode with Pillow). On a CUDA device with a
        decoder, batches are ``(images, labels)`` already on the device,
        decoded there while the previous step computes; elsewhere the
        workers decode, with one warning saying why.
    decode_dtype : torch.dtype
        The GPU-decoded images' dtype (default float32, as ToTensor's;
        ``torch.bfloat16`` for a bf16 step).
    channels_last : bool
        The GPU-decoded images in channels-last memory format.
    decode_lookahead : int
        How many GPU-decoded batches the decode stage's thread keeps ready
        ahead of the loop (default 2): each holds its output on the device.
    even_batches : "drop" or None
        An IterableDataset under torch.distributed with several ranks:
        "drop" (the default) ends every rank's epoch at the batch the
        shortest rank ends at, so a DDP step never waits on a rank with
        none left (one all_reduce per batch; NOTE [ Even batches across
        ranks ] in fastq/torch/_even_ranks.py); None runs each rank's
        stream to its end.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | None = None,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        slots: int | None = None,
        slot_bytes: int | None = None,
        max_batch_size: int | None = None,
        worker_threads: int | None = 1,
        decode_backend: Any = DEFAULT_BACKEND,
        decode_dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        decode_lookahead: int = DECODE_LOOKAHEAD,
        even_batches: str | None = "drop",
    ) -> None:
        num_workers = checked_workers(dataset, num_workers)
        fix = "or None for the default"
        # fastq's own arguments are attributes of the same name, so a trainer
        # that re-creates the loader from its attributes keeps them.
        self.slots = None if slots is None else positive_int("slots", slots, fix)
        self.slot_bytes = (
            None if slot_bytes is None else positive_int("slot_bytes", slot_bytes, fix)
        )
        self.max_batch_size = (
            None
            if max_batch_size is None
            else positive_int("max_batch_size", max_batch_size, fix)
        )
        self.worker_threads = worker_threads
        self.decode_backend = decode_backend
        self.decode_dtype = decode_dtype
        self.channels_last = channels_last
        self.decode_lookahead = positive_int(
            "decode_lookahead", decode_lookahead, "e.g. 2 (the default)"
        )
        # A copy made from this loader's attributes (Lightning's) is given
        # the stage's own collate function: not a user's.
        self._images = ImageDecode(
            dataset,
            decode_backend,
            decode_dtype,
            channels_last,
            cuda=_image_decode.cuda_available(),
            collate_fn=None if collate_fn in (None, collate_encoded) else collate_fn,
            lookahead=self.decode_lookahead,
        )
        if self._images.on_gpu:
            collate_fn = collate_encoded
            if self.slot_bytes is None:
                self.slot_bytes = encoded_slot_bytes(dataset, batch_size)
        self.even_batches = check_even_batches(even_batches)
        self._engine: PlannedLoader | None = None
        self._epoch = 0  # the next epoch's number
        self._epoch_fixed = False  # set_epoch() named the next epoch
        self._seed: int | None = None  # persistent workers' base seed
        self._warned_pin = False
        self._resume: dict[str, Any] | None = None  # loaded, for the next iter()
        # The state loaded, as given: state_dict() gives it back until a
        # loop begun from it (which then holds it) delivers a batch.
        self._loaded: dict[str, Any] | None = None
        self._seed_from_state = False
        # An IterableDataset's lanes, fixed by a loaded state (None: one per
        # worker), and where the next engine resumes them.
        self._streams: int | None = None
        self._stream_resume: StreamResume | None = None
        # The state of a loop dropped mid-epoch (a `break`), until the next.
        self._dropped: dict[str, Any] | None = None
        # A Stateful dataset's copies in the running workers: their states
        # as of each one's last batch delivered, by worker id.
        self._copies: dict[str, Any] | None = None
        # The current epoch's loop, weakly: the loop refers to this loader,
        # and a cycle would keep both (and the workers) alive after the
        # loop is dropped, until a garbage-collector pass.
        self._live: weakref.ref[LoaderIterator] | None = None
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )

    # ------------------------------------------------------------- epochs

    @property
    def epoch(self) -> int:
        """The number of the next epoch (the current one while iterating):
        it seeds every batch's randomness. Set it (or call ``set_epoch``) to
        resume at epoch N."""
        return self._epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Names the next epoch, here and on the sampler (DistributedSampler's
        ``set_epoch``), so a resumed run starts where it stopped."""
        e = as_int(epoch)
        if e is None or e < 0:
            raise ConfigError(f"epoch={epoch!r}: expected an int >= 0")
        self._epoch = e
        self._epoch_fixed = True
        for s in _samplers(self):
            set_epoch = getattr(s, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(e)

    def _next_epoch(self) -> int:
        if not self._epoch_fixed:
            # A trainer that calls set_epoch on the sampler (Lightning does)
            # names the epoch there.
            for s in _samplers(self):
                named = getattr(s, "epoch", None)
                if callable(getattr(s, "set_epoch", None)) and isinstance(named, int):
                    self._epoch = named
        self._epoch_fixed = False
        return self._epoch

    def _epoch_begun(self) -> None:
        """An epoch got past its first batch (or ended): the next iter() is
        the next epoch. An iter() abandoned before that (a trainer calling
        iter() up front, a `next(iter(loader))` peek) does not use one up."""
        self._epoch += 1

    # ---------------------------------------------------------- iteration

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # The last epoch's decode thread takes no batch once this one begins.
        self._images.stop_epoch()
        self._dropped = None
        if self.num_workers == 0:
            if self._dataset_kind != MAP_STYLE:
                return in_process_stream(self)
            return in_process_epoch(self)
        if self.pin_memory and not self._warned_pin:
            self._warned_pin = True
            warn_as_dataloader_pins(self.pin_memory_device)
        return workers_epoch(self)

    def _loop(
        self,
        it: Iterator[Any],
        epoch: int,
        done: int,
        rng: torch.Tensor,
        samplers: SamplerStates | None,
        seed: int | None = None,
        loaded: dict[str, Any] | None = None,
    ) -> LoaderIterator:
        live = LoaderIterator(
            self,
            self._decoded(it),
            epoch,
            done,
            self._seed if seed is None else seed,
            rng,
            loaded,
        )
        live.samplers = samplers
        if self._copies is not None and self.num_workers > 0:
            live.copies = self._copies
            live.carrying = True
        return self._register(live)

    def _decoded(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The epoch's batches, decoded on the GPU if its images are
        encoded; each batch's slot is kept by the engine's ring until its
        decode has run."""
        if not self._images.on_gpu:
            return batches
        return self._images.epoch(batches, ring_of=self._decode_ring)

    def _decode_ring(self) -> Any:
        planned = self._engine
        return None if planned is None else planned._engine.pinning

    def _register(self, live: LoaderIterator) -> LoaderIterator:
        """Makes ``live`` the current loop (the one state_dict() reads, and
        the one whose drop stops transient workers)."""
        self._live = weakref.ref(live)
        return live

    # -------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is, as a small dict, for a checkpoint
        (StatefulDataLoader's method, any ``num_workers``): the epoch, the
        batches of it delivered, the base seed and the sampler generator's
        state as the epoch began, and the states of a sampler, batch
        sampler, sampler iterator or dataset that has
        ``state_dict()``/``load_state_dict()`` (torchdata's ``Stateful``),
        asked where each lives. JSON-serialisable where those states are.
        ``load_state_dict`` in a new process continues with the rest of
        that epoch and every later one, bit-identical to a run that never
        stopped, with any ``num_workers``. For an IterableDataset: the
        epoch and each of its iterators' batches delivered (and the states
        of a dataset or iterator that keeps its own), resumed with any
        ``num_workers > 0`` in the same order, or with num_workers=0 as it
        was saved (``fastq/torch/_stream_state.py``)."""
        if self._loaded is not None:  # loaded, no loop begun from it yet
            return copy.deepcopy(self._loaded)
        live = self._current_loop()
        if live is not None and live.in_epoch and not live.superseded:
            return self._state_of(live)
        if self._dropped is not None:
            return copy.deepcopy(self._dropped)
        if self._dataset_kind != MAP_STYLE:
            return stream_state_between_epochs(self)
        return state_between_epochs(self)

    def _state_of(self, live: LoaderIterator) -> dict[str, Any]:
        if self._dataset_kind != MAP_STYLE:
            return stream_state_of_loop(self, live)
        return state_of_loop(self, live)

    def _loop_dropped(self, live: LoaderIterator) -> None:
        if not live.superseded:
            self._dropped = self._state_of(live)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next ``iter()`` resumes where ``state`` (from ``state_dict()``)
        was saved: the rest of its epoch (none, for a state saved after the
        epoch's last batch), then the next ones. Without a ``generator=``,
        torch's global generator is set to the state it had when that
        epoch began, as the uninterrupted run had it. A loop begun before
        this call ends with a ConfigError at its next batch (it would
        otherwise silently restart)."""
        if self._dataset_kind != MAP_STYLE:
            load_stream_state(self, state)
        else:
            load_map_state(self, state)

    def _current_loop(self) -> LoaderIterator | None:
        return None if self._live is None else self._live()

    def _draw_seed(self) -> None:
        """DataLoader's base seed: one draw from torch's generator (or the
        loader's) when its workers start, before the sampler draws its own,
        so torch.manual_seed makes a run repeatable and the same order as
        DataLoader's. A loaded state's seed is used instead, once."""
        if self._seed_from_state:
            self._seed_from_state = False
            return
        if self._seed is None or not self.persistent_workers:
            self._seed = int(
                torch.empty((), dtype=torch.int64)
                .random_(generator=self.generator)
                .item()
            ) & ((1 << 63) - 1)

    def _start(
        self,
        batches: Iterator[Any] | None,
        epoch: int,
        first_batch: int = 0,
        dataset_states: dict[str, Any] | None = None,
        past: frozenset[int] = frozenset(),
    ) -> PlannedLoader | None:
        """Starts the workers (at the first iter(), never at construction);
        a Stateful dataset's copies (`dataset_states` not None) send their
        states with their batches and load `dataset_states`, by worker id;
        the batches numbered in `past` were delivered before a loaded state.
        None for an iterable dataset with nothing in it."""
        try:
            engine = new_engine(self, batches, epoch, first_batch, dataset_states, past)
        except EmptySource:
            if batches is None:
                return None  # an iterable dataset with nothing in it
            raise
        except WorkerError as exc:
            raise with_own_type(exc) from None
        except FetchTimeout as exc:
            raise as_dataloader_timeout(exc) from None
        self._engine = engine
        return engine

    def close(self) -> None:
        """Stops the workers now (they also stop when the loader is garbage,
        at exit, and after each epoch without persistent_workers)."""
        engine, self._engine = self._engine, None
        self._copies = None  # the next workers' copies start from the dataset
        try:
            self._images.stop_epoch(wait=False)
            if engine is not None:
                engine.close()
        finally:
            self._images.close()

    def stats(self) -> dict[str, Any]:
        """The workers' throughput and the consumer's wait share (see
        fastq.Prefetcher.stats); empty before the first iter(). With images
        decoded on the GPU, ``decode`` is the decode stage's (see
        ``DecodeStage.stats`` in fastq/torch/_decode_stage.py): its backend,
        the files decoded per image, and its GPU memory now and at peak."""
        stats = {} if self._engine is None else self._engine.stats()
        decode = self._images.stats()
        if decode is not None:
            stats["decode"] = decode
        return stats

    def __getstate__(self) -> dict[str, Any]:
        # As DataLoader's pickle: the arguments and the samplers, idle or
        # mid-epoch; the copy starts its own workers at its first iter().
        # The workers, the ring and the current loop stay with this loader.
        state = self.__dict__.copy()
        state["_engine"] = None
        state["_live"] = None
        state["_copies"] = None
        return state

    # accelerate's Accelerator.prepare_data_loader() reads this attribute of
    # the loader it is given, then rebuilds the loader as torch's class over
    # the same batch sampler (sharded, or skipping, around it): reading it
    # makes that rebuilt loader run on fastq's workers (fastq/torch/_install.py).
    @property
    def _is_accelerate_prepared(self) -> bool:
        on_accelerate_prepare(self)
        return bool(self.__dict__.get("_accelerate_prepared", False))

    @_is_accelerate_prepared.setter
    def _is_accelerate_prepared(self, value: bool) -> None:
        self.__dict__["_accelerate_prepared"] = value

    def __del__(self) -> None:
        # Its workers stop with it, even while something else (an error's
        # traceback) still holds their engine. No module global is read:
        # at interpreter exit the engine is closed already (NOTE [ A face
        # left open is closed before the interpreter's teardown ] in
        # fastq/_faces/_face.py).
        engine = self.__dict__.get("_engine")
        if engine is not None and not engine.closed:
            try:  # noqa: SIM105 (contextlib is a module global)
                engine.close()
            except Exception:  # never raise from __del__
                pass


def _samplers(loader: DataLoader[Any]) -> list[Any]:
    found: list[Any] = []
    for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if s is not None and all(s is not f for f in found):
            found.append(s)
    return found
