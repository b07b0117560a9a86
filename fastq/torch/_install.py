"""Loaders that libraries build as torch's DataLoader, run on fastq's workers:
``install()`` for every one in the process, and the loaders accelerate
rebuilds from a ``fastq.torch.DataLoader`` it prepares."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import torch.utils.data

from . import _dataloader
from ._dataloader import DataLoader
from ._loader_state import is_fastq_state

__all__ = ["install", "is_installed", "uninstall"]

# NOTE [ Where the switch acts ]
#
# torch's DataLoader.__iter__ gets every epoch's iterator from
# self._get_iterator() (with persistent workers, once, then _reset()), and
# that method is looked up on the class at each call. Replacing it on
# torch.utils.data.DataLoader reaches every DataLoader in the process: those
# built before the switch, those a library built with a name it bound at
# import (accelerate's and transformers' `from torch.utils.data import
# DataLoader`), and subclasses that keep torch's iterator. The loaders stay
# what they are: the same class for isinstance checks, the same __dict__
# for pickling (fastq's part lives beside them, in _SHADOWS), the same
# attributes for trainers. Rebinding the name `DataLoader` instead would
# miss every module that bound it before the switch and every loader
# already built, and would make isinstance(torch_loader, DataLoader) false
# where the name was rebound. A class that replaces _get_iterator keeps
# its own workers, except torchdata's StatefulDataLoader: its state_dict()
# and load_state_dict() ask its iterator, so its _get_iterator is replaced
# too, and its routed iterator answers with the fastq loader's state (see
# _RoutedStateful).

_TorchDataLoader = torch.utils.data.DataLoader
_ORIGINAL = _TorchDataLoader.__dict__["_get_iterator"]
# torchdata's StatefulDataLoader and its own _get_iterator, once install()
# found it (None: torchdata is not installed).
_STATEFUL: tuple[type[Any], Any] | None = None

_lock = threading.Lock()
_installs = 0  # install() calls not yet undone
# fastq's loader for each torch DataLoader routed so far (weakly: it goes
# with the torch loader, and its workers with it).
_SHADOWS: weakref.WeakKeyDictionary[Any, DataLoader[Any]] = weakref.WeakKeyDictionary()
# What a fastq DataLoader given to accelerate is recognised by, by identity
# (weakly): its batch sampler (map-style with batches), its sampler
# (map-style without) or its dataset (iterable), with that loader's own
# options. Not the loader itself, which `a, b, loader = prepare(a, b,
# loader)` lets go.
_ADOPTED: dict[int, tuple[weakref.ref[Any], dict[str, Any]]] = {}


class _Installed:
    """What install() returns: ``with fastq.torch.install(): ...`` undoes the
    install at the block's end."""

    def __enter__(self) -> _Installed:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        uninstall()


def install() -> _Installed:
    """Runs every ``torch.utils.data.DataLoader`` with ``num_workers > 0`` in
    this process on fastq's workers, whoever built it (transformers' Trainer,
    accelerate, a library's own loader), until ``uninstall()``.

    The loaders keep their class, attributes, samplers, ``len()``,
    ``num_workers`` and pickling; each epoch's batches come from fastq's
    workers with the differences ``docs/dataloader.md`` lists. torchdata's
    ``StatefulDataLoader`` too: its ``state_dict()`` is then fastq's, exact
    on any number of workers (a state torchdata's workers saved resumes on
    them). Loaders with ``num_workers=0`` and other classes that replace
    ``_get_iterator`` are left as they are.

    Returns
    -------
    A context manager: ``with fastq.torch.install(): ...`` uninstalls at the
    block's end. Calls nest: each ``uninstall()`` undoes one ``install()``.
    """
    global _installs
    with _lock:
        _installs += 1
        _place_hook()
    return _Installed()


def uninstall() -> None:
    """Undoes one ``install()``; after the last, torch's DataLoader makes its
    own workers again (from each loader's next epoch). Without an install, it
    does nothing."""
    global _installs
    with _lock:
        if _installs == 0:
            return
        _installs -= 1
        _prune_adopted()
        if _installs == 0 and not _ADOPTED:
            _remove_hook()


def is_installed() -> bool:
    """Whether ``install()`` is in effect."""
    return _installs > 0


def adopt(loader: DataLoader[Any]) -> None:
    """The torch DataLoader accelerate rebuilds from `loader` (over its batch
    sampler, or a sharded or skipping one around it) runs on fastq's workers,
    with `loader`'s own options."""
    mark: Any
    if loader._dataset_kind == torch.utils.data.dataloader._DatasetKind.Iterable:
        mark = loader.dataset
    elif loader.batch_sampler is not None:
        mark = loader.batch_sampler
    else:
        mark = loader.sampler
    try:
        held = weakref.ref(mark)
    except TypeError:
        return  # nothing to recognise it by: accelerate's loader uses torch's workers
    with _lock:
        _prune_adopted()
        _ADOPTED[id(mark)] = (held, _own_options(loader))
        _place_hook()


def _get_iterator(self: Any) -> Any:
    """torch's DataLoader._get_iterator, routed (see NOTE above)."""
    routed, origin = _route(self)
    if routed:
        return _Routed(_shadow(self, origin))
    return _ORIGINAL(self)


def _route(loader: Any) -> tuple[bool, dict[str, Any] | None]:
    """Whether `loader` runs on fastq's workers, and the options of the fastq
    DataLoader accelerate rebuilt it from, if any."""
    if loader.num_workers == 0:
        return False, None
    origin = _origin(loader) if _ADOPTED else None
    return (_installs > 0 or origin is not None), origin


def _get_stateful_iterator(self: Any) -> Any:
    """torchdata's StatefulDataLoader._get_iterator, routed: a state loaded
    into the loader (its next_iter_state) is loaded into fastq's, unless
    torchdata's workers saved it."""
    assert _STATEFUL is not None
    routed, origin = _route(self)
    state = self.next_iter_state
    if routed and (state is None or is_fastq_state(state)):
        self.next_iter_state = None
        shadow = _shadow(self, origin)
        if state is not None:
            shadow.load_state_dict(state)
        return _RoutedStateful(shadow)
    return _STATEFUL[1](self)


def _stateful_class() -> tuple[type[Any], Any] | None:
    global _STATEFUL
    if _STATEFUL is None:
        try:  # install() is explicit: importing torchdata here is asked for
            from torchdata.stateful_dataloader import StatefulDataLoader
        except ImportError:
            return None
        _STATEFUL = (StatefulDataLoader, StatefulDataLoader.__dict__["_get_iterator"])
    return _STATEFUL


def _place_hook() -> None:
    if _TorchDataLoader.__dict__["_get_iterator"] is not _get_iterator:
        _TorchDataLoader._get_iterator = _get_iterator  # type: ignore[method-assign]
    stateful = _stateful_class()
    if stateful is not None and (
        stateful[0].__dict__["_get_iterator"] is not _get_stateful_iterator
    ):
        stateful[0]._get_iterator = _get_stateful_iterator


def _remove_hook() -> None:
    # Only ours: a hook placed after it stays (and reaches ours, now idle).
    if _TorchDataLoader.__dict__["_get_iterator"] is _get_iterator:
        _TorchDataLoader._get_iterator = _ORIGINAL  # type: ignore[method-assign]
    stateful = _STATEFUL
    if stateful is not None and (
        stateful[0].__dict__["_get_iterator"] is _get_stateful_iterator
    ):
        stateful[0]._get_iterator = stateful[1]


def _prune_adopted() -> None:
    for key, (mark, _) in list(_ADOPTED.items()):
        if mark() is None:
            del _ADOPTED[key]


def _own_options(loader: DataLoader[Any]) -> dict[str, Any]:
    return {
        "slots": loader.slots,
        "slot_bytes": loader.slot_bytes,
        "max_batch_size": loader.max_batch_size,
        "worker_threads": loader.worker_threads,
        "even_batches": loader.even_batches,
        # An image dataset's GPU decode (fastq/torch/_image_decode.py): a
        # loader accelerate rebuilds hands out the dtype and layout asked.
        "decode_backend": loader.decode_backend,
        "decode_dtype": loader.decode_dtype,
        "channels_last": loader.channels_last,
        "decode_lookahead": loader.decode_lookahead,
    }


def _origin(loader: Any) -> dict[str, Any] | None:
    """The options of the fastq DataLoader that `loader` was rebuilt from, if
    any: its
    batch sampler, sampler or dataset is one an adopted loader had, or wraps
    one (accelerate's BatchSamplerShard, SkipBatchSampler and
    IterableDatasetShard keep what they wrap as an attribute)."""
    for start in (loader.batch_sampler, loader.sampler, loader.dataset):
        obj = start
        for _ in range(4):  # the most accelerate nests
            if obj is None:
                break
            entry = _ADOPTED.get(id(obj))
            if entry is not None and entry[0]() is obj:
                return entry[1]
            inner = getattr(obj, "batch_sampler", None)
            obj = getattr(obj, "dataset", None) if inner is None else inner
    return None


def _shadow(loader: Any, origin: dict[str, Any] | None) -> DataLoader[Any]:
    """fastq's DataLoader behind `loader`, made at its first routed epoch and
    kept for the next (its epochs, its persistent workers): the same dataset,
    samplers, collate_fn and arguments, with `origin`'s own options."""
    with contextlib.suppress(TypeError):
        shadow = _SHADOWS.get(loader)
        if shadow is not None:
            return shadow
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
        "pin_memory_device": loader.pin_memory_device,
        "in_order": loader.in_order,
    }
    if origin is not None:
        kwargs.update(origin)
    iterable = loader._dataset_kind == torch.utils.data.dataloader._DatasetKind.Iterable
    if iterable:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        kwargs.update(batch_sampler=loader.batch_sampler)
    else:
        kwargs.update(batch_size=None, sampler=loader.sampler)
    shadow = DataLoader(loader.dataset, **kwargs)
    with contextlib.suppress(TypeError):  # unhashable: a shadow per epoch
        _SHADOWS[loader] = shadow
    return shadow


class _Routed:
    """The iterator a routed torch DataLoader hands out: the shadow's epoch.
    With persistent workers torch keeps it as the loader's ``_iterator`` and
    calls ``_reset`` for each new epoch, which begins the shadow's next."""

    def __init__(self, shadow: DataLoader[Any]) -> None:
        self._shadow = shadow
        self._it: Iterator[Any] = iter(shadow)

    def __iter__(self) -> _Routed:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def __len__(self) -> int:
        return len(self._shadow)

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        if _route(loader)[0]:
            self._it = iter(self._shadow)
            return
        # Uninstalled since the last epoch: torch's workers from this one
        # (torch's __iter__ returns the loader's _iterator as it is now).
        self._shadow.close()
        loader._iterator = _ORIGINAL(loader)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a DataLoader's iterator on fastq's workers cannot be pickled: it "
            "holds the running workers of an epoch (torch's iterator cannot be "
            "pickled either); pickle the DataLoader before its first epoch, or "
            "without persistent_workers, where the copy starts its own workers"
        )


class _RoutedStateful(_Routed):
    """The iterator a routed torchdata StatefulDataLoader hands out: the
    shadow's epoch, with the attribute and the methods StatefulDataLoader
    asks of its iterator (``_finished``, ``state_dict``)."""

    def __init__(self, shadow: DataLoader[Any]) -> None:
        super().__init__(shadow)
        self._finished = False

    def __next__(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            self._finished = True
            raise

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        self._finished = False
        if _route(loader)[0]:
            self._it = iter(self._shadow)
            return
        # Uninstalled since the last epoch: torchdata's workers from this one.
        self._shadow.close()
        assert _STATEFUL is not None
        loader._iterator = _STATEFUL[1](loader)

    def state_dict(self) -> dict[str, Any]:
        return self._shadow.state_dict()


_dataloader.on_accelerate_prepare = adopt
