"""The decode stage's thread: it takes an epoch's host batches from the
loader as they are ready and decodes them on the stage's stream, so that
the training loop's thread only takes each decoded batch and makes its
stream wait for the batch's event."""

from __future__ import annotations

import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._decode_stage import DecodeStage, _Decoded
from ._pinned import CudaRing

# NOTE [ The decode stage's thread ]
#
# On a GPU the loop's thread is the scarcest resource: it launches the
# model's kernels and must stay ahead of the GPU. So a decode stage works on
# a thread of its own, as DataLoader's pin_memory thread does: it takes each
# batch from the loader as it is ready, decodes it on the stage's stream
# (the per-image kernels, the decoder's call, which torchvision's makes
# wait for its own stream, and the files decoded with Pillow, which
# releases the GIL), records the batch's event, and puts the result in a
# queue of at most `lookahead` batches. The loop's next() takes the next
# result and makes its stream wait on the event: no decode work, no wait
# for the GPU. The thread is the only one that takes batches from the
# loader in an epoch: before a new epoch begins, or the loader closes, it
# is stopped (`stop_epoch`) and joined; it is a daemon, and is not joined
# while the interpreter exits (NOTE [ A region closed at interpreter exit ]
# in fastq/_core/_shm.py). A batch it holds keeps its slot's lease, and the
# lease keeps the ring's mapping: closing the engine under it unmaps
# nothing. An error taking a batch (a worker's, a timeout) is put in the
# queue in its place and the thread takes no further batch until the loop
# has met it, as without the stage. A result sits in the queue until the
# loop's next() has taken it, so a Ctrl+C in next() loses no batch.

_END = object()


class Ahead:
    """What the stage's thread and the loop share for one epoch (never the
    DecodedEpoch itself, so that dropping the epoch stops the thread)."""

    def __init__(self, lookahead: int) -> None:
        self.lookahead = max(1, int(lookahead))
        self.changed = threading.Condition()
        self.ready: deque[Any] = deque()
        self.stopped = False
        self.held = False  # an error taking a batch, not met by the loop yet
        self.thread: threading.Thread | None = None

    def stop(self, wait: bool = True) -> None:
        """Stops the thread (at its next batch: one decode at most); joins
        it if ``wait``, except from itself or while the interpreter exits."""
        with self.changed:
            self.stopped = True
            self.ready.clear()
            self.changed.notify_all()
        thread = self.thread
        if (
            wait
            and thread is not None
            and thread is not threading.current_thread()
            and not sys.is_finalizing()
        ):
            thread.join()


def _decode_ahead(
    ahead: Ahead,
    stage: DecodeStage,
    batches: Iterator[Any],
    ring_of: Callable[[], CudaRing | None],
    place: Callable[[], Any] | None,
) -> None:
    """The stage's thread (NOTE [ The decode stage's thread ])."""
    changed = ahead.changed
    try:
        with stage.cuda.device():
            while True:
                with changed:
                    while not ahead.stopped and (
                        ahead.held or len(ahead.ready) >= ahead.lookahead
                    ):
                        changed.wait()
                    if ahead.stopped:
                        return
                item: Any
                where = None
                from_feed = False  # an error taking the batch
                try:
                    batch = next(batches)
                except StopIteration:
                    item = _END
                except Exception as exc:
                    item, from_feed = _Decoded(error=exc), True
                    where = _place_after(place)
                else:
                    # The loader's place after this batch, before the next
                    # is taken: a state saved once the loop has it.
                    where = _place_after(place)
                    stage.attach(ring_of())
                    item = stage.issue(batch)
                    del batch
                if item is not _END:
                    item.place = where
                with changed:
                    if ahead.stopped:
                        return
                    ahead.ready.append(item)
                    if item is not _END:
                        ahead.held = from_feed
                    changed.notify_all()
                if item is _END:
                    return
                del item
    except BaseException as exc:  # the stage's own failure: the loop's to see
        with changed:
            if not ahead.stopped:
                ahead.ready.append(_Decoded(error=exc))
                ahead.held = True
                changed.notify_all()


def _place_after(place: Callable[[], Any] | None) -> Any:
    """``place()``, or None (the loop keeps the place it had) where there
    is none or the loader cannot say (closed under the thread)."""
    if place is None:
        return None
    try:
        return place()
    except Exception:
        return None


class DecodedEpoch:
    """An epoch of host batches, handed out decoded by the stage's thread
    (NOTE [ The decode stage's thread ]): up to the stage's ``lookahead``
    batches decode while the loop's steps run. An error taking a batch (a
    worker's, a timeout) is raised at its turn, as without the stage.
    ``place`` is the loader's place as the batch last handed out was taken
    (``place()`` then), before the next was taken: what a state saved now
    must resume from, while the epoch is ``running``."""

    __slots__ = (
        "__weakref__",
        "_ahead",
        "_args",
        "_batches",
        "_ended",
        "_stage",
        "place",
    )

    def __init__(
        self,
        stage: DecodeStage,
        batches: Iterator[Any],
        ring_of: Callable[[], CudaRing | None],
        place: Callable[[], Any] | None,
    ) -> None:
        self._stage = stage
        self._batches = batches
        self._args: tuple[Any, ...] | None = (batches, ring_of, place)
        self._ahead = Ahead(stage.lookahead)
        self._ended = False
        # Nothing taken yet: a state saved now resumes where the epoch starts.
        self.place: Any = None if place is None else place()
        weakref.finalize(self, self._ahead.stop, False)

    def __iter__(self) -> DecodedEpoch:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._ended:
            raise StopIteration
        ahead = self._ahead
        if self._args is not None:
            self._start()
        with ahead.changed:
            while not ahead.ready and not ahead.stopped:
                ahead.changed.wait()  # a Ctrl+C here leaves the batch queued
            item = ahead.ready.popleft() if ahead.ready else None
            if item is not _END:
                ahead.held = False
            ahead.changed.notify_all()
        if item is None:
            return self._stopped()
        if item is _END:
            self._ended = True
            raise StopIteration
        if item.place is not None:
            self.place = item.place
        return self._stage.hand_out(item)

    def _stopped(self) -> tuple[torch.Tensor, torch.Tensor]:
        """next() once a new epoch or close() stopped the thread: the
        loader says how this loop ends (PrefetcherClosed after a close, the
        end for a superseded epoch), asked once the thread is gone."""
        self._ended = True
        self._ahead.stop()
        next(self._batches)
        raise StopIteration  # a batch past the stop is not this loop's

    def _start(self) -> None:
        assert self._args is not None
        batches, ring_of, place = self._args
        self._args = None
        self._stage.adopt(self._ahead)
        thread = threading.Thread(
            target=_decode_ahead,
            args=(self._ahead, self._stage, batches, ring_of, place),
            name="fastq-decode-stage",
            daemon=True,
        )
        self._ahead.thread = thread
        thread.start()

    @property
    def running(self) -> bool:
        """The epoch has not ended for the loop: its thread may be taking
        batches, so the loader's own place may be past ``place``."""
        return not self._ended

    def stop(self) -> None:
        """Stops and joins the stage's thread; later next() calls end."""
        self._ended = True
        self._ahead.stop()
