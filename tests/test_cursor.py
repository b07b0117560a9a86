"""The cursors: where the next epoch's loop starts and ends, what a state
saved at any point says, and a stream's passes; no ring, no process."""

from __future__ import annotations

import pytest

from fastq._loop._cursor import EpochCursor, EpochSpan, PassCursor
from fastq._make._state import Resume, StreamResume

pytestmark = pytest.mark.timeout(60)

B = 8  # batches per epoch


def run(cursor: EpochCursor, handed: int = 0) -> EpochSpan:
    span = cursor.upcoming(B)
    cursor.enter(span, handed)
    return span


# ------------------------------------------------------------------ epochs


def test_the_first_epoch_is_every_batch_from_task_zero() -> None:
    cursor = EpochCursor(ordered=True)
    assert cursor.epoch == -1
    assert cursor.place(0) == (0, 0, None)  # a state saved before any loop
    span = cursor.upcoming(B)
    assert span == EpochSpan(
        epoch=0, start=0, first=0, end=B, count=B, skip=frozenset(), jump=False
    )
    assert cursor.epoch == -1, "upcoming() must not move the cursor"
    cursor.enter(span, handed=0)
    assert cursor.epoch == 0 and cursor.in_epoch
    assert cursor.delivered is None  # ordered: the prefix is the count


def test_an_epoch_run_to_its_end_leads_to_the_next_without_a_jump() -> None:
    cursor = EpochCursor(ordered=True)
    run(cursor)
    cursor.finish()
    assert not cursor.in_epoch
    assert cursor.place(B) == (1, 0, None)
    span = cursor.upcoming(B)
    assert (span.epoch, span.first, span.end, span.count) == (1, B, 2 * B, B)
    assert not span.jump


def test_an_abandoned_epoch_makes_the_workers_jump() -> None:
    cursor = EpochCursor(ordered=True)
    run(cursor)  # a `break`: never finished
    span = cursor.upcoming(B)
    assert span.epoch == 1 and span.first == B
    assert span.jump, "tasks of the abandoned epoch are still being made"


def test_ordered_place_counts_the_batches_handed_out_in_this_loop() -> None:
    cursor = EpochCursor(ordered=True)
    cursor.resume_at(Resume(3, 2, frozenset(), None))
    run(cursor, handed=40)
    # Two batches before the state, five handed out since the loop began.
    assert cursor.place(45) == (3, 7, None)


def test_a_resumed_state_starts_past_its_delivered_batches() -> None:
    cursor = EpochCursor(ordered=False)
    cursor.resume_at(Resume(2, 3, frozenset({5, 6}), None))
    assert cursor.epoch == 1 and not cursor.in_epoch
    # Saved again before its loop: the same state.
    assert cursor.place(0) == (2, 3, [5, 6])
    span = cursor.upcoming(B)
    assert span == EpochSpan(
        epoch=2,
        start=2 * B,
        first=2 * B + 3,
        end=3 * B,
        count=B - 3,
        skip=frozenset({2 * B + 5, 2 * B + 6}),
        jump=True,
    )
    cursor.enter(span, handed=0)
    assert cursor.delivered == {2 * B + 5, 2 * B + 6}
    assert (cursor.resume_batch, cursor.resume_skip) == (0, frozenset())
    # The next epoch is whole again.
    cursor.finish()
    assert cursor.upcoming(B).count == B


def test_a_resumed_state_at_an_epochs_start_needs_no_jump_after_a_finish() -> None:
    cursor = EpochCursor(ordered=True)
    run(cursor)
    cursor.finish()
    cursor.resume_at(Resume(1, 0, frozenset(), None))  # set_epoch(1)
    # set_epoch makes the next loop skip the workers ahead, whatever came
    # before it.
    assert cursor.upcoming(B).jump


def test_unordered_place_is_the_prefix_and_what_lies_past_it() -> None:
    cursor = EpochCursor(ordered=False)
    run(cursor)  # epoch 0
    cursor.finish()
    run(cursor)  # epoch 1, tasks 8..15
    assert cursor.delivered is not None
    cursor.delivered.update({B + 0, B + 1, B + 3, B + 6})
    assert cursor.place(4) == (1, 2, [3, 6])


def test_unordered_place_with_nothing_delivered_yet() -> None:
    cursor = EpochCursor(ordered=False)
    run(cursor)
    assert cursor.place(0) == (0, 0, [])


# ------------------------------------------------------------------ passes


def test_the_first_pass_starts_from_nothing_and_the_next_ones_advance() -> None:
    cursor = PassCursor()
    assert cursor.place(0, [0, 0], 2) == StreamResume(0, [0, 0])
    assert cursor.begin(2) == (False, [0, 0])
    assert cursor.place(0, [3, 1], 2) == StreamResume(0, [3, 1])
    cursor.end()
    # Between passes: the next one starts afresh.
    assert cursor.place(0, [3, 1], 2) == StreamResume(1, [0, 0])
    assert cursor.begin(2) == (True, [0, 0])
    assert cursor.place(1, [1, 0], 2) == StreamResume(1, [1, 0])


def test_an_abandoned_pass_is_left_for_the_next() -> None:
    cursor = PassCursor()
    cursor.begin(2)  # a `break`: never ended
    assert cursor.begin(2) == (True, [0, 0])


def test_a_resumed_stream_numbers_its_passes_from_the_state() -> None:
    cursor = PassCursor()
    cursor.resume_at(StreamResume(4, [5, 2]))
    # Saved again before its pass: the same state.
    assert cursor.place(0, [0, 0], 2) == StreamResume(4, [5, 2])
    assert cursor.begin(2) == (False, [5, 2])
    assert cursor.place(0, [6, 2], 2) == StreamResume(4, [6, 2])
    cursor.end()
    assert cursor.place(0, [7, 3], 2) == StreamResume(5, [0, 0])
    assert cursor.begin(2) == (True, [0, 0])
    assert cursor.place(1, [1, 0], 2) == StreamResume(5, [1, 0])
