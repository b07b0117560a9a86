"""A consumer process for fault tests: `python victim.py SCENARIO METHOD`.

Prints one JSON line with its workers' pids (and its fork server's, if any),
then runs SCENARIO until the test kills or interrupts it. Output on stdout
and stderr is what the test inspects."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from helpers import PatternDataset, StuckDataset, alive

import fastq

# Its test sends it SIGINT: started from a run in the background (SIGINT
# ignored, as `cmd &` and nohup leave it), it sets the handler it needs.
signal.signal(signal.SIGINT, signal.default_int_handler)


def children() -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        out.append(int(entry))
            except OSError:
                pass
    return out


def announce(pf: fastq.Prefetcher, attached: int | None = None) -> None:
    """Prints the pids once `attached` workers (all, by default) have
    attached to the ring (bounded): a worker stuck inside its first batch
    never does, since it maps the ring only to deliver that batch."""
    want = pf.workers if attached is None else attached
    deadline = time.monotonic() + 15
    ring = pf._ring
    while (
        time.monotonic() < deadline
        and sum(bool(ring.worker_stats(w)[3]) for w in range(pf.workers)) < want
    ):
        time.sleep(0.01)
    servers = [p for p in children() if p not in pf._pool.pids]  # the fork server
    print(json.dumps({"workers": pf._pool.pids, "others": servers}), flush=True)


def main(scenario: str, method: str) -> None:
    if scenario == "killed-consumer":
        # The worker on batch 3 is stuck in user code (sample 7); the others fill
        # the ring and wait for a free slot. (Batches 0 to 2, one per worker, are
        # made before the ring exists, to infer the spec: a worker stuck there
        # would not map the ring yet.)
        pf = fastq.Prefetcher(
            StuckDataset(1000, stuck=7),
            batch_size=2,
            workers=3,
            slots=2,
            start_method=method,
        )
        announce(pf)
        time.sleep(0.3)  # let workers reach their states
        time.sleep(60)
    elif scenario == "sigint-waiting":
        # Worker 0 is stuck inside batch 0 (sample 1), worker 1 goes on.
        with fastq.Prefetcher(
            StuckDataset(1000, stuck=1), batch_size=2, workers=2, start_method=method
        ) as pf:
            announce(pf, attached=1)
            print("waiting", flush=True)
            for _ in pf:
                pass
    elif scenario == "sigint-in-body":
        with fastq.Prefetcher(
            PatternDataset(1000), batch_size=2, workers=2, start_method=method
        ) as pf:
            announce(pf)
            for _ in pf:
                print("in body", flush=True)
                time.sleep(60)
    elif scenario == "sigint-in-close":
        # Workers stuck in user code: close() waits its whole grace for them,
        # and the Ctrl+C lands in that wait.
        pf = fastq.Prefetcher(
            StuckDataset(1000, stuck=1), batch_size=2, workers=2, start_method=method
        )
        announce(pf, attached=1)  # worker 0 is stuck inside batch 0
        time.sleep(0.3)  # let worker 1 fill the ring
        print("closing", flush=True)
        try:
            pf.close()
        except KeyboardInterrupt:
            # The process lives on (a notebook): nothing of it may be left.
            left = [p for p in pf._pool.pids if alive(p)]
            print(json.dumps({"left_after_interrupted_close": left}), flush=True)
            raise
        print("close was not interrupted", flush=True)
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    mp.set_start_method(sys.argv[2])
    try:
        main(sys.argv[1], sys.argv[2])
    except KeyboardInterrupt:
        print("KeyboardInterrupt caught once", flush=True)
        sys.exit(130)
