"""Where the loop is in the task stream: a map-style source's epoch or a
stream's pass, and where a loaded state starts the next one. Bookkeeping
only: the Feed moves the ring and the consumer to what these say."""

from __future__ import annotations

from dataclasses import dataclass

from .._make._state import Place, Resume, StreamResume


@dataclass(frozen=True)
class EpochSpan:
    """The tasks of the next epoch's loop: [first, end), ``count`` of them
    to hand out, ``skip`` dropped (delivered before a resumed state). With
    ``jump``, the workers skip ahead to ``first``."""

    epoch: int
    start: int  # the epoch's first task
    first: int
    end: int
    count: int
    skip: frozenset[int]
    jump: bool


class EpochCursor:
    """A map-style source's epochs: the one being (or last) iterated, how
    much of it was delivered, and where a loaded state (or ``set_epoch``)
    starts the next one."""

    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self.epoch = -1  # being (or last) iterated
        # The last epoch's loop handed out its every batch: nothing of it
        # is in flight past its end.
        self.finished = True
        # The next epoch starts at batch resume_batch, and drops the
        # batches in resume_skip (unordered mode: delivered before the
        # state was saved).
        self.resume_batch = 0
        self.resume_skip: frozenset[int] = frozenset()
        # A loaded state's place as it spelled it: the next loop's, then
        # the loop's begun from it until that loop hands out a batch. A
        # state saved meanwhile repeats it (a checkpoint at the first step
        # saves what was loaded, epoch's end and delivered set included).
        self.loaded: Place | None = None
        self.loop_loaded: Place | None = None
        # The epoch in progress: its first task, the batches of it handed
        # out before this loop (a resumed state's) and those past them
        # (its skip), the consumer's count when the loop began, and
        # (unordered) which tasks it handed out.
        self.in_epoch = False
        self.start = 0
        self.done_before = 0
        self.skip: frozenset[int] = frozenset()
        self.handed0 = 0
        self.delivered: set[int] | None = None

    def upcoming(self, batches_per_epoch: int) -> EpochSpan:
        """The next epoch's loop, as ``enter`` will begin it."""
        epoch = self.epoch + 1
        start = epoch * batches_per_epoch
        first = start + self.resume_batch
        return EpochSpan(
            epoch=epoch,
            start=start,
            first=first,
            end=start + batches_per_epoch,
            count=batches_per_epoch - self.resume_batch,
            skip=frozenset(start + k for k in self.resume_skip),
            # The last loop stopped early, or a resumed state starts past
            # the epoch's start: what is still in flight before `first` is
            # dropped when it arrives.
            jump=not self.finished or first > start,
        )

    def enter(self, span: EpochSpan, handed: int) -> None:
        """The loop over ``span`` begins; ``handed``: the consumer's count
        of batches handed out so far."""
        self.epoch = span.epoch
        self.finished = False
        self.in_epoch = True
        self.start = span.start
        self.done_before = span.first - span.start
        self.skip = self.resume_skip
        self.handed0 = handed
        self.delivered = None if self.ordered else set(span.skip)
        self.resume_batch, self.resume_skip = 0, frozenset()
        self.loop_loaded, self.loaded = self.loaded, None

    def finish(self) -> None:
        """The epoch's last batch was handed out."""
        self.finished = True
        self.in_epoch = False
        self.loop_loaded = None

    def resume_at(self, resume: Resume) -> None:
        """The next loop iterates ``resume``'s epoch from its batch
        ``first``; the workers skip ahead to it."""
        self.epoch = resume.epoch - 1
        self.finished = False
        self.in_epoch = False
        self.resume_batch = resume.first
        self.resume_skip = resume.skip
        self.loaded = resume.saved

    def place(self, handed: int) -> tuple[int, int, list[int] | None]:
        """Where a state saved now resumes: (epoch, the batches of it
        delivered as a prefix, those delivered past the prefix; None in
        ordered mode unless a loaded state's were). ``handed``: the
        consumer's count so far (dropped batches included)."""
        if not self.in_epoch:  # between epochs, or a state loaded, not used
            if self.loaded is not None:
                return _spelled(self.loaded)
            return (
                self.epoch + 1,
                self.resume_batch,
                self._above(self.resume_batch, self.resume_skip),
            )
        if self.loop_loaded is not None and handed == self.handed0:
            return _spelled(self.loop_loaded)
        done = self.done_before
        if self.ordered:
            # In order, a loaded state's skipped batches are dropped in
            # their turn (and counted in `handed`); those still ahead stay
            # delivered.
            done += handed - self.handed0
            while done in self.skip:
                done += 1
            return self.epoch, done, self._above(done, self.skip)
        assert self.delivered is not None
        got = {t - self.start for t in self.delivered}
        while done in got:
            done += 1
        return self.epoch, done, sorted(b for b in got if b > done)

    def _above(self, done: int, skip: frozenset[int]) -> list[int] | None:
        """The batches of ``skip`` past ``done``: a list in unordered mode,
        and in ordered mode where there are any (None otherwise)."""
        above = sorted(b for b in skip if b > done)
        return None if self.ordered and not above else above


def _spelled(place: Place) -> tuple[int, int, list[int] | None]:
    epoch, done, delivered = place
    return epoch, done, None if delivered is None else list(delivered)


class PassCursor:
    """A stream's passes: the number a state gives the ring's pass 0, and
    each worker's items a loaded state's next pass starts from (the
    Consumer counts the items handed out in the current pass)."""

    def __init__(self) -> None:
        self.started = False  # pass 0 was begun
        self.in_pass = False
        self.resume_items: list[int] | None = None
        self.first_pass = 0  # the number of the ring's pass 0 (a state's)

    def begin(self, workers: int) -> tuple[bool, list[int]]:
        """A pass begins: (whether the ring moves on to its next pass, each
        worker's items delivered before it)."""
        advance = self.started
        self.started = True
        self.in_pass = True
        items = self.resume_items or [0] * workers
        self.resume_items = None
        return advance, items

    def end(self) -> None:
        """Every worker's stream of the pass has ended."""
        self.in_pass = False

    def resume_at(self, place: StreamResume) -> None:
        """The next pass is ``place``'s, its workers past their items."""
        self.first_pass = place.pass_
        self.resume_items = list(place.items)

    def place(self, ring_pass: int, items: list[int], workers: int) -> StreamResume:
        """Where a stream is: the pass in progress and each worker's items
        delivered in it (``ring_pass`` and ``items``, the consumer's);
        between passes (or with a state loaded, not yet used), where the
        next pass starts."""
        if self.in_pass:
            return StreamResume(self.first_pass + ring_pass, items)
        following = ring_pass + 1 if self.started else ring_pass
        next_items = self.resume_items or [0] * workers
        return StreamResume(self.first_pass + following, list(next_items))
