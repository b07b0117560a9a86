"""torch inside fastq's workers, for fastq.torch.DataLoader: what a worker
runs to make a batch (DataLoader's fetch and collate), tensors laid into
packed slots and rebuilt over them, ``torch.utils.data.get_worker_info()``,
and torch's generator seeded per batch."""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.data
import torch.utils.data._utils.collate as torch_collate
import torch.utils.data._utils.worker as torch_worker

from .._layout._packing import NDARRAY, Arena, Codec, LeafKind
from .._layout._rows import stack_rows
from .._make._worker_info import WorkerInfo
from ._row_collate import RowCollate
from ._user_state import is_stateful

# --------------------------------------------------------------- tensors


def _slot_tensor(
    slot: np.ndarray[Any, Any], off: int, dtype: torch.dtype, shape: Sequence[int]
) -> torch.Tensor:
    """A tensor of `dtype` and `shape` over slot[off:]."""
    nbytes = math.prod(shape) * _itemsize(dtype)
    raw = torch.from_numpy(slot[off : off + nbytes])
    return raw.view(dtype).view(tuple(shape))


_ITEMSIZE: dict[torch.dtype, int] = {}


def _itemsize(dtype: torch.dtype) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = torch.empty(0, dtype=dtype).element_size()
    return size


def _place_tensor(t: torch.Tensor, arena: Arena) -> tuple[Any, ...] | None:
    if (
        t.layout != torch.strided
        or t.device.type != "cpu"
        or t.is_quantized
        or t.is_nested
        or t.requires_grad
    ):
        return None  # pickled as torch pickles it
    shape = tuple(t.shape)
    name = str(t.dtype).removeprefix("torch.")
    nbytes = t.numel() * t.element_size()
    if arena.count_only:
        arena.alloc(nbytes, f"tensor shape {shape} dtype {name}")
        return ("t", 0, shape, name)
    off = -1
    if nbytes and t.is_contiguous():
        off = arena.owns(t.data_ptr(), nbytes)
    if off >= 0:
        arena.claim(off, nbytes)
    else:
        off = arena.alloc(nbytes, f"tensor shape {shape} dtype {name}")
        if nbytes:
            _slot_tensor(arena.slot, off, t.dtype, shape).copy_(t)
    return ("t", off, shape, name)


def _rebuild_tensor(ref: tuple[Any, ...], slot: np.ndarray[Any, Any]) -> torch.Tensor:
    _, off, shape, name = ref
    return _slot_tensor(slot, off, getattr(torch, name), shape)


TENSOR = LeafKind("t", (torch.Tensor,), _place_tensor, _rebuild_tensor)
CODEC = Codec([TENSOR, NDARRAY])


# --------------------------------------------------- collate into the slot

# The slot being filled in this worker: default_collate stacks straight
# into it, so a batch's tensors are written once.
_arena: Arena | None = None

# NOTE [ Stacking with numpy ]
#
# Where default_collate runs (a user's collate_fn that calls it, samples
# whose rows are not written as they are fetched: NOTE [ Rows written as
# fetched ] in fastq/torch/_row_collate.py), a batch of same-shaped CPU
# samples is stacked into its slot row by row by
# fastq's own copy (stack_rows, src_c/_rows.pyx), as the Prefetcher's
# per-sample path writes its rows: a large batch's rows in non-temporal
# stores, which spare the read of every destination line and the caches
# (src_c/fq_stream.h). torch.stack (and np.stack) write through the caches,
# and default_collate's numpy case first wraps each sample in a tensor
# (torch.as_tensor, about 4 us each): together twice the Prefetcher's CPU
# per ImageNet-like batch (benchmarks/dataloader_worker_cost.py). Anything
# that cannot be stacked exactly as torch would (dtypes numpy lacks,
# samples that differ in shape or dtype, tensors that need autograd or are
# not plain CPU memory) takes torch's own path, which also raises torch's
# errors.


def _slot_out(
    batch: Sequence[Any], shape: tuple[int, ...], dtype: np.dtype[Any]
) -> np.ndarray[Any, Any] | None:
    """Room in the slot being filled for the stacked batch, or None."""
    arena = _arena
    if arena is None:
        return None
    out_shape = (len(batch), *shape)
    off = arena.try_alloc(math.prod(out_shape) * dtype.itemsize)
    if off < 0:
        return None
    nbytes = math.prod(out_shape) * dtype.itemsize
    return arena.slot[off : off + nbytes].view(dtype).reshape(out_shape)


def _stacked(arrays: Sequence[np.ndarray[Any, Any]]) -> torch.Tensor | None:
    """The arrays stacked by numpy into the slot (or fresh memory), as a
    tensor; None where torch's own stacking must run (NOTE [ Stacking with
    numpy ])."""
    first = arrays[0]
    shape, dtype = first.shape, first.dtype
    if dtype.hasobject or not dtype.isnative or dtype.fields is not None:
        return None
    for a in arrays:
        if a.shape != shape or a.dtype != dtype:
            return None
    out = _slot_out(arrays, shape, dtype)
    if out is None:
        return torch.from_numpy(np.stack(arrays))
    if not stack_rows(out, list(arrays)):  # strided samples: numpy's copy
        np.stack(arrays, out=out)
    return torch.from_numpy(out)


def _stack_into_slot(
    batch: Sequence[torch.Tensor],
    *,
    collate_fn_map: dict[Any, Callable[..., Any]] | None = None,
) -> torch.Tensor:
    """default_collate's tensor case, stacking into the slot being filled
    (or, without room or outside a slot, into fresh memory; never into the
    shared memory DataLoader's workers allocate per batch)."""
    elem = batch[0]
    # torch.stack takes a list or tuple: a batch that is one tensor (from
    # __getitems__) gets torch's error, not a stack of its rows.
    if (
        type(batch) not in (list, tuple)
        or elem.is_nested
        or elem.layout != torch.strided
    ):
        out: torch.Tensor = torch_collate.collate_tensor_fn(
            batch, collate_fn_map=collate_fn_map
        )
        return out
    if (
        elem.device.type == "cpu"
        and elem.dtype in _NUMPY_DTYPES
        and not any(t.requires_grad or t.is_conj() or t.is_neg() for t in batch)
    ):
        stacked = _stacked([t.numpy() for t in batch])
        if stacked is not None and stacked.dtype == elem.dtype:
            return stacked
    arena = _arena
    if arena is not None and elem.device.type == "cpu":
        shape = (len(batch), *elem.shape)
        nbytes = math.prod(shape) * elem.element_size()
        off = arena.try_alloc(nbytes)
        if off >= 0:
            out = _slot_tensor(arena.slot, off, elem.dtype, shape)
            return torch.stack(list(batch), 0, out=out)
    return torch.stack(list(batch), 0)


def _stack_arrays_into_slot(
    batch: Sequence[np.ndarray[Any, Any]],
    *,
    collate_fn_map: dict[Any, Callable[..., Any]] | None = None,
) -> Any:
    """default_collate's numpy-array case: the same tensor, stacked by
    numpy straight into the slot (NOTE [ Stacking with numpy ])."""
    stacked = None
    if type(batch[0]) is np.ndarray:  # a subclass keeps torch's path
        stacked = _stacked(batch)
    if stacked is not None:
        return stacked
    return torch_collate.collate_numpy_array_fn(batch, collate_fn_map=collate_fn_map)


# The dtypes whose tensors .numpy() views and np.stack copies bit for bit.
_NUMPY_DTYPES = frozenset(
    getattr(torch, name)
    for name in (
        *("bool", "uint8", "int8", "int16", "int32", "int64", "uint16"),
        *("uint32", "uint64", "float16", "float32", "float64"),
        *("complex64", "complex128"),
    )
    if hasattr(torch, name)
)


# ------------------------------------------------------------- sources


class _TorchSource:
    """What both kinds of DataLoader source do in a worker."""

    codec = CODEC
    # Errors name what it holds as the user does: dataset..., collate_fn...
    _path_transparent = True

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any]) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.position = -1
        self._seeded: int | None = None  # the seed fastq last gave torch

    @property
    def arena(self) -> Arena | None:
        return _arena

    @arena.setter
    def arena(self, value: Arena | None) -> None:
        global _arena
        _arena = value

    def start_worker(self, info: WorkerInfo) -> None:
        """Makes this process a DataLoader worker in torch's eyes."""
        # Every collate that falls back on default_collate (collate_fn
        # wrappers included) stacks into the slot, not into new shared memory.
        torch_collate.default_collate_fn_map[torch.Tensor] = _stack_into_slot
        torch_collate.default_collate_fn_map[np.ndarray] = _stack_arrays_into_slot
        seed = torch.initial_seed()
        self._seeded = seed
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=info.id,
            num_workers=info.num_workers,
            seed=seed,
            dataset=self.dataset,
        )

    def reseed(self, seed: int) -> None:
        """torch's generator for the next batch, like random's and numpy's.
        A seed the user set meanwhile (torch.manual_seed in worker_init_fn)
        is their decision: fastq leaves the generator alone from then on."""
        if self._seeded is None or torch.initial_seed() != self._seeded:
            self._seeded = None
            return
        torch.default_generator.manual_seed(seed)
        self._seeded = seed
        info = torch_worker._worker_info
        if info is not None:
            # seed == torch.initial_seed(), as in a DataLoader worker.
            object.__setattr__(info, "seed", seed)


class MapSource(_TorchSource):
    """DataLoader's map-style fetch: the planned indices through
    ``__getitems__`` or ``dataset[i]``, then collate_fn; or, without
    automatic batching, one index and collate_fn of its sample.

    With ``carry_state`` (a dataset with state_dict()/load_state_dict()),
    each batch travels as ``(batch, worker id, pickled state of this
    worker's copy)`` (NOTE [ Where a user object's state is asked ] in
    fastq/torch/_user_state.py), and the copy loads its entry of
    ``states`` (by worker id) before its first batch."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        auto_collation: bool,
        *,
        carry_state: bool = False,
        states: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(dataset, collate_fn)
        self.auto_collation = auto_collation
        self.carry_state = carry_state
        self._states = states
        self._worker = -1
        # NOTE [ Rows written as fetched ] (fastq/torch/_row_collate.py):
        # None until this worker's first batch into a slot says whether its
        # samples can be written as they are fetched; False for good.
        self._rows: RowCollate | bool | None = (
            None
            if auto_collation and collate_fn is torch_collate.default_collate
            else False
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if state["_rows"] is not False:
            state["_rows"] = None  # each worker learns its own
        return state

    def start_worker(self, info: WorkerInfo) -> None:
        super().start_worker(info)
        self._worker = info.id

    def reseed(self, seed: int) -> None:
        if self._states is not None:  # after worker_init_fn, once
            saved, self._states = self._states.get(str(self._worker)), None
            if saved is not None:
                self.dataset.load_state_dict(saved)
                if self._seeded is not None:
                    # A generator state the dataset restores (torchdata's
                    # examples do) is not the user seeding it: each batch is
                    # still seeded from its number, which resumes it exactly.
                    self._seeded = torch.initial_seed()
        super().reseed(seed)

    def make(self, indices: Sequence[Any]) -> Any:
        batch = self._make(indices)
        if not self.carry_state:
            return batch
        state = self.dataset.state_dict()
        return (batch, self._worker, pickle.dumps(state, pickle.HIGHEST_PROTOCOL))

    def _make(self, indices: Sequence[Any]) -> Any:
        dataset = self.dataset
        if not self.auto_collation:
            self.position = 0
            sample = dataset[indices[0]]
            self.position = -1
            return self.collate_fn(sample)
        getitems = getattr(dataset, "__getitems__", None)
        arena = _arena
        rows = self._rows
        if getitems is not None:
            data = getitems(list(indices))
            if (
                isinstance(rows, RowCollate)
                and arena is not None
                and type(data) in (list, tuple)
            ):
                batch, _ = rows.make(data.__getitem__, list(range(len(data))), arena)
                if batch is not None:
                    return batch
        elif isinstance(rows, RowCollate) and arena is not None:
            keys = indices if type(indices) is list else list(indices)
            try:
                batch, data = rows.make(dataset.__getitem__, keys, arena)
            except BaseException:
                self.position = rows.row
                raise
            if batch is not None:
                return batch
            self._fetch(keys, data)
        else:
            data = []
            self._fetch(indices, data)
        if rows is None and arena is not None:
            collated = self.collate_fn(data)
            self._rows = RowCollate.learn(data, collated, CODEC) or False
            return collated
        return self.collate_fn(data)

    def _fetch(self, indices: Sequence[Any], data: list[Any]) -> None:
        """The samples of indices past those already in `data`."""
        dataset = self.dataset
        for pos in range(len(data), len(indices)):
            self.position = pos
            data.append(dataset[indices[pos]])
        self.position = -1

    def __call__(self) -> Iterator[Any]:
        raise TypeError("a map-style source's batches are planned")


class IterableSource(_TorchSource):
    """DataLoader's iterable fetch: each worker iterates its copy of the
    dataset (which shards itself with get_worker_info()), in batches of
    batch_size (None: one item at a time), then collate_fn."""

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
    ) -> None:
        super().__init__(dataset, collate_fn)
        self.batch_size = batch_size
        self.drop_last = drop_last
        # A resumed lane's iterator state, loaded once __call__ makes it.
        self._iterator_state: Any = None

    def make(self, indices: Sequence[Any]) -> Any:
        raise TypeError("an iterable source has no planned batches")

    @property
    def stateful(self) -> bool:
        """The dataset keeps its own place (torchdata's Stateful protocol:
        ``state_dict()`` and ``load_state_dict()``, as HF datasets'
        IterableDataset has): each batch then travels as (batch, the
        states after it of the dataset and of its iterator, where that is
        another object that keeps one, as torchdata asks them), and a
        resumed lane loads them instead of making its batches again."""
        return is_stateful(self.dataset)

    def for_lane(self) -> IterableSource:
        """This source over a copy of its dataset, whose place is its own
        (NOTE [ A stream's lanes ] in fastq/_workers/_lanes.py)."""
        lane = copy.copy(self)
        lane.dataset = copy.copy(self.dataset)
        return lane

    def load_lane_state(self, state: Any) -> None:
        """A lane's saved states, in torchdata's order: the dataset's now,
        its iterator's once the next __call__ has made it."""
        if state.get("dataset") is not None:
            self.dataset.load_state_dict(state["dataset"])
        self._iterator_state = state.get("iterator")

    def __call__(self) -> Iterator[Any]:
        dataset = self.dataset
        it = iter(dataset)
        state_of = None
        if self.stateful:
            saved, self._iterator_state = self._iterator_state, None
            if saved is not None and is_stateful(it):
                it.load_state_dict(saved)
            state_of = _LaneState(dataset, it)
        return _Batches(it, self.collate_fn, self.batch_size, self.drop_last, state_of)


class _LaneState:
    """The states of a lane's dataset and of its iterator after a batch, as
    torchdata's workers save them: the iterator's where it keeps one, the
    dataset's where it is not its own iterator."""

    def __init__(self, dataset: Any, it: Any) -> None:
        self.dataset = dataset
        self.it = it

    def __call__(self) -> dict[str, Any]:
        return lane_states(self.dataset, self.it)


def lane_states(dataset: Any, it: Any) -> dict[str, Any]:
    """A Stateful dataset's state and its iterator's, as torchdata's
    workers save them: a dataset that is its own iterator is saved as the
    iterator (loaded once iter() has made its place); another iterator's
    state where it keeps one."""
    if it is dataset:
        return {"dataset": None, "iterator": dataset.state_dict()}
    return {
        "dataset": dataset.state_dict(),
        "iterator": it.state_dict() if is_stateful(it) else None,
    }


class _Batches:
    """DataLoader's iterable fetch, one batch per next(). An exception from
    the dataset's iterator or collate_fn ends that batch only (the samples
    taken for it are lost, as in DataLoader); the worker goes on with the
    same iterator, which a generator's is not after raising."""

    def __init__(
        self,
        it: Iterator[Any],
        collate_fn: Callable[[Any], Any],
        batch_size: int | None,
        drop_last: bool,
        state_of: Callable[[], Any] | None = None,
    ) -> None:
        self.it = it
        self.collate_fn = collate_fn
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.ended = False
        self.state_of = state_of  # a stateful dataset's state_dict

    def __next__(self) -> Any:
        batch = self._next_batch()
        if self.state_of is None:
            return batch
        return (batch, self.state_of())

    def __iter__(self) -> _Batches:
        return self

    def state_at_end(self) -> Any:
        """Once the iterator has ended: the states of a stateful dataset
        and of its iterator as they stand after it (a dataset may change
        its own as its pass ends, as torchdata's workers save it then);
        None for any other dataset."""
        return None if self.state_of is None else self.state_of()

    def _next_batch(self) -> Any:
        if self.ended:
            raise StopIteration
        size = self.batch_size
        if size is None:
            return self.collate_fn(next(self.it))
        data = []
        for _ in range(size):
            try:
                data.append(next(self.it))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < size):
            self.ended = True
            raise StopIteration
        return self.collate_fn(data)
