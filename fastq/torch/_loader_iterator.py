"""The iterator a fastq.torch.DataLoader hands out for an epoch, and the
errors it raises as DataLoader's: a worker's exception as its own type, a
timeout as DataLoader's RuntimeError."""

from __future__ import annotations

import contextlib
import pickle
import warnings
from collections.abc import Iterator
from typing import Any, Protocol

from ..errors import ConfigError, FetchTimeout, WorkerError


class EpochOwner(Protocol):
    """What an epoch's iterator asks of its DataLoader."""

    dataset: Any
    persistent_workers: bool

    @property
    def _IterableDataset_len_called(self) -> int | None: ...
    def __len__(self) -> int: ...
    def close(self) -> None: ...
    def _current_loop(self) -> Any: ...
    def _epoch_begun(self) -> None: ...
    def _loop_dropped(self, loop: Any) -> None: ...


class DataLoaderTimeout(FetchTimeout, RuntimeError):
    """No batch within ``timeout`` seconds: a FetchTimeout that is also the
    RuntimeError DataLoader raises."""


class LoaderIterator:
    """The iterator a DataLoader hands out: the engine's epoch, with a
    worker's exception raised as its own type and a timeout as
    DataLoader's. It keeps the epoch's place for state_dict(): the batches
    delivered (a failed one included, as it is gone), the base seed and
    the sampler generator's state as the epoch began; begun from a loaded
    state, that state until its first batch; with Stateful samplers, their
    states by batches drawn (``samplers``); with a Stateful dataset, each
    worker copy's state as of its last batch delivered (``copies``, the
    loader's, by worker id), which the workers send with each batch
    (``carrying``). In this process (``inline``, torch's own iterator), any
    exception of a batch uses the batch up. Out of order (``numbered``:
    the engine, which says each batch's number), the batches delivered are
    the first ``prefix`` and those in ``delivered``. Over an IterableDataset
    in this process, ``stream_iter`` is torch's iterator, whose dataset
    iterator a state asks for its own."""

    __slots__ = (
        "__weakref__",
        "_begun",
        "_done0",
        "_handed",
        "_it",
        "_loaded",
        "_loader",
        "carrying",
        "copies",
        "delivered",
        "done",
        "epoch",
        "in_epoch",
        "inline",
        "numbered",
        "prefix",
        "rng",
        "samplers",
        "seed",
        "stream_iter",
        "superseded",
    )

    def __init__(
        self,
        loader: EpochOwner,
        it: Iterator[Any],
        epoch: int = 0,
        done: int = 0,
        seed: int | None = None,
        rng: Any = None,
        loaded: dict[str, Any] | None = None,
    ) -> None:
        self._loader = loader
        self._it = it
        self._begun = False
        self._handed = 0
        self._loaded = loaded
        self._done0 = done
        self.epoch = epoch
        self.done = done
        self.seed = seed
        self.rng = rng
        self.in_epoch = True
        self.superseded = False  # a state was loaded while it ran
        self.samplers: Any = None
        self.copies: dict[str, Any] | None = None
        self.carrying = False
        self.inline = False
        self.numbered: Any = None
        self.delivered: set[int] = set()
        self.prefix = done
        self.stream_iter: Any = None

    def __iter__(self) -> LoaderIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def as_loaded(self) -> dict[str, Any] | None:
        """The state this loop was begun from, while it has delivered no
        batch (None otherwise): its place, as it was spelled."""
        return self._loaded if self.done == self._done0 else None

    def __reduce__(self) -> Any:
        raise TypeError(
            "a fastq.torch.DataLoader's iterator cannot be pickled: it holds "
            "the running workers of one epoch (torch's cannot be pickled "
            "either); pickle the DataLoader, whose copy starts its own workers"
        )

    def __next__(self) -> Any:
        if self.superseded:
            raise ConfigError(
                "load_state_dict() was called after this loop began; call "
                "iter() again (a new for loop) to resume from the state"
            )
        try:
            batch = next(self._it)
        except StopIteration:
            self.in_epoch = False
            self._end()
            raise
        except WorkerError as exc:
            self.done += 1
            if self.numbered is not None:
                self._numbered_delivered()
            self._mark_begun()
            raise with_own_type(exc) from None
        except FetchTimeout as exc:
            raise as_dataloader_timeout(exc) from None
        except Exception as exc:
            # In this process (torch's iterator) the sampler drew it, and a
            # file that cannot be decoded spent it: either way it is gone.
            if self.inline or getattr(exc, "fastq_batch_spent", False):
                self.done += 1
                if self.numbered is not None:
                    self._numbered_delivered()
                self._mark_begun()
            raise
        self._handed += 1
        self.done += 1
        if self.carrying:
            batch, worker, state = batch
            assert self.copies is not None
            self.copies[str(worker)] = pickle.loads(state)
        if self.numbered is not None:
            self._numbered_delivered()
        if self.samplers is not None:
            self.samplers.forget_before(self.place)
        loader = self._loader
        reported = loader._IterableDataset_len_called
        # In this process torch's own iterator warns (self.inline).
        if reported is not None and not self.inline and self._handed > reported:
            warnings.warn(  # at every batch past it, as DataLoader does
                f"Length of IterableDataset {loader.dataset} was reported to be "
                f"{reported} (when accessing len(dataloader)), but "
                f"{self._handed} samples have been fetched. Its __len__ is "
                "wrong for this number of workers: shard it with "
                "get_worker_info() or fix __len__",
                UserWarning,
                stacklevel=2,
            )
        if self._handed == 2:
            # Past a peek (`next(iter(loader))`): this epoch is used up.
            self._mark_begun()
        return batch

    @property
    def place(self) -> int:
        """The batches delivered as a prefix of the epoch."""
        return self.done if self.numbered is None else self.prefix

    def _numbered_delivered(self) -> None:
        delivered = self.delivered
        delivered.add(self.numbered.last_batch)
        prefix = self.prefix
        while prefix in delivered:
            delivered.discard(prefix)
            prefix += 1
        self.prefix = prefix

    def __del__(self) -> None:
        # DataLoader's iterator shuts its workers down when it is dropped,
        # without persistent_workers: so does the current loop (an older
        # one's workers are already gone, or belong to a newer loop). A
        # weak reference to a dying object still answers in its __del__.
        # No module global is read here: at interpreter exit they may be
        # None already, and the workers closed (NOTE [ A face left open is
        # closed before the interpreter's teardown ] in fastq/_faces/_face.py).
        loader = self._loader
        if not self.in_epoch or loader._current_loop() is not self:
            return
        try:
            # Dropped mid-epoch (a `break` out of a for loop): state_dict()
            # still says where it stopped, as StatefulDataLoader's does;
            # dropped before it began (a peek), the next iter() starts the
            # same epoch again, and so does a state saved meanwhile.
            if self._begun:
                loader._loop_dropped(self)
        except Exception:  # never raise from __del__
            pass
        if not loader.persistent_workers:
            try:  # noqa: SIM105 (contextlib is a module global)
                loader.close()
            except Exception:  # never raise from __del__
                pass

    def _mark_begun(self) -> None:
        if not self._begun:
            self._begun = True
            self._loader._epoch_begun()

    def _end(self) -> None:
        loader = self._loader
        if not self._begun:
            self._mark_begun()  # an empty epoch is an epoch too
        if not loader.persistent_workers:
            loader.close()


def with_own_type(error: WorkerError) -> BaseException:
    """A worker's exception as its own type (a KeyError stays catchable as
    KeyError), carrying where it happened; WorkerError when it could not be
    rebuilt here."""
    original = error.__cause__
    if not isinstance(original, Exception):
        return error
    where = f"raised in fastq worker {error.worker}"
    if error.task >= 0:  # not a worker_init_fn's, nor a stream's (no task)
        where += f" while producing batch {error.task}"
    if error.sample is not None:
        where += f", sample {error.sample!r}"
    note = f"{where}. Remote traceback:\n{error.remote_traceback}"
    if hasattr(original, "add_note"):
        original.add_note(note)
        # Raised in its place, with `error` as its context: no cycle back,
        # which would keep error's frames (and a batch's slot) until a
        # garbage-collector pass.
        error.__cause__ = None
        out = original
    else:
        try:  # before Python 3.11: the note goes into the message, as DataLoader's
            out = type(original)(f"{original}\n{note}")
        except Exception:
            return error
    for name, value in (
        ("fastq_worker", error.worker),
        ("fastq_task", error.task),
        ("fastq_sample", error.sample),
        ("fastq_remote_traceback", error.remote_traceback),
        # WorkerError's name for it, so code written for either reads it.
        ("remote_traceback", error.remote_traceback),
    ):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(out, name, value)
    return out


def as_dataloader_timeout(error: FetchTimeout) -> DataLoaderTimeout:
    out = DataLoaderTimeout(
        f"DataLoader timed out: {error}", worker=error.worker, task=error.task
    )
    return out
