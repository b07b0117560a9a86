"""Run as a script by tests/test_slot_census.py: hundreds of real SIGINTs at
random points of a tight loop over one Prefetcher, each caught, then full
epochs checked bit for bit and the slot census checked. Prints one JSON line
with what it saw; exits non-zero on any violation.

Usage: sigint_storm.py START_METHOD INTERRUPTS SEED
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from itertools import islice

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from helpers import PatternDataset, expected_batch

import fastq

# Its test sends it SIGINT: started from a run in the background (SIGINT
# ignored, as `cmd &` and nohup leave it), it sets the handler it needs.
signal.signal(signal.SIGINT, signal.default_int_handler)

N, BATCH = 240, 4
BATCHES = N // BATCH


def check_epoch(batches: list[tuple[np.ndarray, ...]]) -> None:
    """A whole epoch: every batch, in order, bit for bit."""
    assert len(batches) == BATCHES, f"{len(batches)} batches, want {BATCHES}"
    for k, batch in enumerate(batches):
        want = expected_batch(range(k * BATCH, (k + 1) * BATCH))
        for got, w in zip(batch, want):
            np.testing.assert_array_equal(got, w)


def main(start_method: str, interrupts: int, seed: int) -> None:
    rng = random.Random(seed)
    done = threading.Event()

    go = threading.Event()

    def storm() -> None:
        go.wait()  # set inside the loop's try: every interrupt is caught
        for _ in range(interrupts):
            # Mostly inside one epoch, sometimes long enough to finish one.
            time.sleep(rng.uniform(0.0002, 0.003 if rng.random() < 0.8 else 0.03))
            os.kill(os.getpid(), signal.SIGINT)
        done.set()

    caught = resumed_epochs = fresh_loops = 0
    with fastq.Prefetcher(
        PatternDataset(N),
        batch_size=BATCH,
        workers=2,
        slots=4,
        start_method=start_method,
        copy=False,
    ) as pf:
        sender = threading.Thread(target=storm, daemon=True)
        it = None
        seen: list[tuple[np.ndarray, ...]] = []

        def play() -> None:
            """One random move: go on with the same iterator, or start a
            fresh loop; an interrupt may cut it anywhere."""
            nonlocal it, seen, resumed_epochs, fresh_loops
            if rng.random() < 0.75:
                # The same iterator, resumed after each interrupt: its epoch
                # must still be whole and in order. list.extend appends in
                # C, so the record itself cannot lose one.
                if it is None:
                    seen = []
                    it = iter(pf)
                while True:
                    before = len(seen)
                    seen.extend(islice(it, 1))
                    if len(seen) == before:
                        check_epoch(seen)
                        resumed_epochs += 1
                        it = None
                        return
                    if len(seen) > 1:
                        # Hold at most two views: copies need no slot.
                        seen = [tuple(np.copy(a) for a in b) for b in seen]
            else:
                # A fresh loop (the notebook's cell run again): the
                # abandoned epoch is simply left.
                it = None
                fresh_loops += 1
                for batch in pf:
                    del batch

        sender.start()
        settled = False
        while not settled:
            # An interrupt lands anywhere: in play(), between the loop's own
            # lines, in a handler; every one is caught by one of the trys.
            try:
                while not done.is_set():
                    try:
                        go.set()
                        play()
                    except KeyboardInterrupt:
                        caught += 1
                sender.join()
                time.sleep(0.05)  # interrupts still pending land here
                settled = True
            except KeyboardInterrupt:
                caught += 1
        if it is not None:
            # The iterator interrupted last, resumed to its end.
            seen = [tuple(np.copy(a) for a in b) for b in seen]
            seen += [tuple(np.copy(a) for a in b) for b in it]
            check_epoch(seen)
            resumed_epochs += 1
        seen = []
        for _ in range(3):
            check_epoch([tuple(np.copy(a) for a in b) for b in pf])
        consumer = pf._feed.consumer
        _mine, odd = consumer.audit()
        census = {
            "held": consumer.held,
            "in_window": consumer.in_window,
            "deferred": consumer.ndeferred,
            "odd": odd,
        }
        assert odd == -1, f"slot {odd}: census and books disagree"
        assert consumer.held == 0, f"{consumer.held} slots still held"
        assert not pf.closed
    print(
        json.dumps(
            {
                "caught": caught,
                "resumed_epochs": resumed_epochs,
                "fresh_loops": fresh_loops,
                "census": census,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
