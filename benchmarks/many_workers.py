"""Many workers on few cores: start, exactly-once delivery, close, and the
system calls each batch costs, at 1, 8 and 64 workers (or any list).

Producers are sleep-bound (a map-style dataset whose ``__getitem__``
sleeps), so 64 workers fit on a 2-core machine: what is measured is fastq's
own cost of having many workers, not the CPUs' arithmetic.

Pacing decides what is fair to compare. By default (``--rate``) every worker
count delivers the same total rate: each sample sleeps ``workers / (rate *
batch_size)``, so the ring is in the same state (mostly empty, the consumer
waiting for the next batch) at 1 and at 64 workers, and a count per batch
that changes with the worker count is the worker count's doing.
``--sample-ms`` instead gives each sample a fixed sleep, so throughput grows
with workers until the CPUs run out; the ring then tends to fill, and the
cost moves from the consumer's waits to the workers'.

Per worker count, two fresh processes:

- untraced: seconds from the constructor's call to the first batch
  (``start``) and to the first batch of every worker (``all workers``), an
  epoch in which each sample index must arrive exactly once (and in order
  when ordered), a second epoch broken off after a few batches, and the
  seconds ``close()`` takes then, with workers asleep in ``__getitem__`` or
  waiting for a slot;
- under ``strace -f -ff -ttt`` (every process and thread, one file each):
  the system calls inside a window of ``--window`` batches in mid-epoch,
  counted per batch for the consumer (all its threads) and for all workers
  together; the same counts ``strace -f -c -e trace=futex`` gives, cut to
  the window by timestamps so that start-up, the epoch's end and close do
  not count. The delivery is checked there too.

Futex calls are split by kind. The ring's futexes are process-shared
(``FUTEX_WAIT``, ``FUTEX_WAKE``); a ``*_PRIVATE`` futex is the interpreter's
own (the GIL, a lock or condition of a thread in that process). A ring
futex call means somebody slept or woke a sleeper: by design a pusher makes
no system call unless a waiter sleeps, a waiter spins ``FASTQ_SPIN_US`` (50
us) before it sleeps, and each sleep is bounded by a 100 ms slice so that
it re-checks the closed flag, its peers and signals. So with the ring
mostly empty the consumer pays about one FUTEX_WAIT per batch (it waits for
every batch) and some worker one FUTEX_WAKE; with the ring full the
workers pay the waits and the consumer the wakes. Either way that is about
two per batch, whatever the number of workers.

A count per batch that grows with the worker count would mean one of:
wakes that reach more than one sleeper (a broadcast where one waiter can
use the event), waiters that wake for an event that is not theirs and
sleep again, or periodic work per worker (each sleeping worker's 100 ms
slice ends in a timed-out FUTEX_WAIT: ``W * 10`` calls a second, which per
batch is ``10 * W / rate``). The ``tmo`` column counts those apart, and
the last table says how each ring futex call ended: a FUTEX_WAIT that
returns EAGAIN found the event count moved between the waiter's read of it
and its sleep (a push meanwhile), costs a call but no sleep, and goes round;
one such call per push for every waiter caught in that window, so it grows
with the number of waiters preempted there (many workers on few CPUs).
Under strace every system call stops the process twice, so traced runs
are slower; the counts per batch are what they are for, not the times.

Run: python benchmarks/many_workers.py [--workers 1,8,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np

import fastq
from fastq._bench.report import machine

BATCH = 4
MARK = "MANY-WORKERS-RESULT "


class Sleepy:
    """Map-style: sample i = (i, the worker's id, when the call began), after
    sleeping `delay` s."""

    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.int64, np.int64, np.float64]:
        began = time.time()
        time.sleep(self.delay)
        info = fastq.get_worker_info()
        return np.int64(i), np.int64(-1 if info is None else info.id), np.float64(began)


def tasks_of(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def child_count() -> int:
    """Live children of this process other than multiprocessing's helpers."""
    me, n = os.getpid(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if ppid == me and b"forkserver" not in cmd and b"resource_tracker" not in cmd:
            n += 1
    return n


def one(args: argparse.Namespace) -> dict[str, Any]:
    """One worker count in this process; the figures as a dict."""
    w = args.one
    if args.sample_ms is not None:
        delay = args.sample_ms / 1e3
    else:
        delay = w / (args.rate * BATCH)
    warm = 2 * w + 100
    window = args.window
    # Ends well after the window: workers that run out of planned batches
    # at the epoch's end wait on another futex, which is not the subject.
    batches = warm + window + args.batches + 4 * w
    perf: list[Any] = []
    out: dict[str, Any] = {
        "workers": w,
        "sample_sleep_s": delay,
        "batches_per_epoch": batches,
        "ordered": not args.unordered,
    }
    t0 = time.monotonic()
    t0_wall = time.time()
    pf = fastq.Prefetcher(
        Sleepy(batches * BATCH, delay),
        batch_size=BATCH,
        workers=w,
        ordered=not args.unordered,
        start_method=args.start_method,
    )
    out["start_method"] = pf._pool._method if pf._pool is not None else "?"
    out["slots"] = pf.stats()["slots"]
    seen: list[int] = []
    producers: set[int] = set()
    first_call: dict[int, float] = {}
    window_at: list[float] = []
    threads: dict[str, set[int]] = {"consumer": set(), "workers": set()}

    def note_threads() -> None:
        threads["consumer"].update(tasks_of(os.getpid()))
        for pid in pf._pool.pids if pf._pool is not None else []:
            threads["workers"].update(tasks_of(pid))

    with pf:
        t_epoch = 0.0
        for n, (idx, wid, began) in enumerate(pf, 1):
            if n == 1:
                out["start_s"] = time.monotonic() - t0
                t_epoch = time.monotonic()
            if args.consumer_ms:
                time.sleep(args.consumer_ms / 1e3)  # a training step
            seen.extend(idx.tolist())
            for k, b in zip(wid.tolist(), began.tolist()):
                first_call[k] = min(first_call.get(k, b), b)
            if len(producers) < w:
                producers.update(wid.tolist())
                if len(producers) == w:
                    out["all_workers_s"] = time.monotonic() - t0
            if n == warm:
                note_threads()
                if args.perf:
                    perf = start_perf(pf)
                window_at.append(time.time())
            elif n == warm + window:
                window_at.append(time.time())
                for side in perf:
                    side.disable()
                note_threads()
        elapsed = time.monotonic() - t_epoch
        out["batches"] = len(seen) // BATCH
        out["batches_per_s"] = (out["batches"] - 1) / elapsed
        out["workers_producing"] = len(producers)
        # Every worker at work: the last worker's first __getitem__ call.
        if len(first_call) == w:
            out["workers_up_s"] = max(first_call.values()) - t0_wall
        out["batch_sleep_s"] = delay * BATCH
        expected = list(range(batches * BATCH))
        out["exactly_once"] = sorted(seen) == expected
        if not args.unordered:
            out["in_order"] = seen == expected
        # A second epoch, broken off: close() meets workers mid-batch.
        second = []
        for idx, _, _ in pf:
            second.extend(idx.tolist())
            if len(second) >= 8 * BATCH:
                break
        out["second_epoch_ok"] = second == list(range(len(second))) or (
            args.unordered and len(set(second)) == len(second)
        )
        if perf:
            out["perf_per_batch"] = {
                side: {k: v / window for k, v in p.close().items()}
                for side, p in zip(("consumer", "workers"), perf)
            }
        t_close = time.monotonic()
        pf.close()
        out["close_s"] = time.monotonic() - t_close
    out["children_left"] = child_count()
    if args.traced:
        out["window"] = {
            "batches": window,
            "begin": window_at[0],
            "end": window_at[1],
            "consumer_tids": sorted(threads["consumer"]),
            "worker_tids": sorted(threads["workers"]),
        }
    return out


def start_perf(pf: fastq.Prefetcher) -> list[Any]:
    """perf stat on the consumer and on all workers, counting from now on."""
    from fastq._bench.procstat import PerfStat

    sides = [PerfStat([os.getpid()]), PerfStat(list(pf._pool.pids))]  # type: ignore[union-attr]
    for side in sides:
        side.enable()
    return sides


# ------------------------------------------------------------------ strace

LINE = re.compile(r"^(\d+\.\d+) (\w+)\((.*)")
FUTEX_OP = re.compile(r"^[^,]*, (FUTEX_\w+)")


def count_trace(prefix: str, window: dict[str, Any]) -> dict[str, Any]:
    """System calls inside the window, per side, from strace -ff files."""
    begin, end = window["begin"], window["end"]
    side_of = {t: "consumer" for t in window["consumer_tids"]}
    side_of.update({t: "workers" for t in window["worker_tids"]})
    counts: dict[str, Counter[str]] = {
        s: Counter() for s in ("consumer", "workers", "other")
    }
    for path in glob.glob(prefix + ".*"):
        side = side_of.get(int(path.rsplit(".", 1)[1]), "other")
        c = counts[side]
        with open(path, errors="replace") as f:
            for line in f:
                m = LINE.match(line)
                if m is None:
                    continue
                ts = float(m.group(1))
                if ts < begin or ts > end:
                    continue
                name = m.group(2)
                c["total"] += 1
                c[name] += 1
                if name == "futex":
                    op = FUTEX_OP.match(m.group(3))
                    kind = op.group(1) if op else "?"
                    ring = "PRIVATE" not in kind
                    c["futex ring" if ring else "futex private"] += 1
                    if ring:
                        rv = line.rsplit(") = ", 1)[-1].split()
                        what = rv[0] if rv[0] != "-1" else rv[1]
                        c[
                            f"futex ring {'wake' if 'WAKE' in kind else 'wait'} {what}"
                        ] += 1
    n = window["batches"]
    return {
        side: {
            "futex": c["futex"] / n,
            "futex_ring": c["futex ring"] / n,
            "futex_ring_wake": sum(
                v for k, v in c.items() if k.startswith("futex ring wake")
            )
            / n,
            "futex_ring_timeout": c["futex ring wait ETIMEDOUT"] / n,
            # How each ring futex call ended, per batch: a wait woken (0),
            # ended before sleeping because the word had moved (EAGAIN), or
            # on its slice (ETIMEDOUT); a wake that found nobody (0) or 1.
            "futex_ring_outcomes": {
                k[len("futex ring ") :]: v / n
                for k, v in sorted(c.items())
                if k.startswith("futex ring ")
            },
            "futex_private": c["futex private"] / n,
            "syscalls": c["total"] / n,
            "sleeps": c["clock_nanosleep"] / n,
            "by_call": {k: v for k, v in c.most_common() if not k.startswith("futex ")},
        }
        for side, c in counts.items()
    }


# ------------------------------------------------------------------ driver


def run_one(args: argparse.Namespace, w: int, strace: str | None) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", str(w)]
    cmd += ["--batches", str(args.batches), "--window", str(args.window)]
    cmd += ["--rate", str(args.rate), "--consumer-ms", str(args.consumer_ms)]
    if args.sample_ms is not None:
        cmd += ["--sample-ms", str(args.sample_ms)]
    if args.start_method:
        cmd += ["--start-method", args.start_method]
    if args.unordered:
        cmd += ["--unordered"]
    if strace or not args.perf:
        cmd += ["--no-perf"]
    tmp = None
    if strace:
        tmp = tempfile.mkdtemp(prefix="many-workers-strace-")
        cmd = [strace, "-f", "-ff", "-ttt", "-qq", "-o", f"{tmp}/t", *cmd, "--traced"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
        if tmp is not None:
            result["syscalls_per_batch"] = count_trace(f"{tmp}/t", result["window"])
        return result
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        f"{'workers':>7} {'slots':>5} {'batch ms':>8} {'up s':>6} {'start s':>7} "
        f"{'all s':>6} {'batches':>7} {'once':>4} {'order':>5} {'b/s':>6} "
        f"{'2nd':>3} {'close s':>7} {'left':>4}"
    ]
    for r in rows:
        order = ("yes" if r["in_order"] else "NO") if "in_order" in r else "-"
        out.append(
            f"{r['workers']:>7} {r['slots']:>5} {r['batch_sleep_s'] * 1e3:>8.1f} "
            f"{fmt(r.get('workers_up_s'), '6.3f'):>6} {r['start_s']:>7.3f} "
            f"{fmt(r.get('all_workers_s'), '6.3f'):>6} {r['batches']:>7} "
            f"{'yes' if r['exactly_once'] else 'NO':>4} {order:>5} "
            f"{r['batches_per_s']:>6.0f} {'ok' if r['second_epoch_ok'] else 'NO':>3} "
            f"{r['close_s']:>7.3f} {r['children_left']:>4}"
        )
    if not any("traced" in r for r in rows):
        return "\n".join(out)
    out += [
        "",
        "system calls per batch, traced window:",
        f"{'workers':>7} {'b/s':>5} {'once':>4} | {'c futex':>7} {'c ring':>6} "
        f"{'c wake':>6} {'c tmo':>5} {'c sys':>6} | {'w futex':>7} {'w ring':>6} "
        f"{'w wake':>6} {'w tmo':>5} {'w sys':>6} {'w sleep':>7} | {'ring':>5}",
    ]
    for r in rows:
        t = r["traced"]
        c = t["syscalls_per_batch"]["consumer"]
        k = t["syscalls_per_batch"]["workers"]
        out.append(
            f"{r['workers']:>7} {t['batches_per_s']:>5.0f} "
            f"{'yes' if t['exactly_once'] else 'NO':>4} | "
            f"{c['futex']:>7.3f} {c['futex_ring']:>6.3f} {c['futex_ring_wake']:>6.3f} "
            f"{c['futex_ring_timeout']:>5.3f} {c['syscalls']:>6.2f} | "
            f"{k['futex']:>7.3f} {k['futex_ring']:>6.3f} {k['futex_ring_wake']:>6.3f} "
            f"{k['futex_ring_timeout']:>5.3f} {k['syscalls']:>6.2f} "
            f"{k['sleeps']:>7.2f} | {c['futex_ring'] + k['futex_ring']:>5.2f}"
        )
    if all("perf_per_batch" in r for r in rows):
        out += [
            "",
            "untraced, perf stat over the same window (every futex, every call):",
            f"{'workers':>7} {'b/s':>5} | {'c futex':>7} {'c sys':>6} {'c cs':>6} | "
            f"{'w futex':>7} {'w sys':>6} {'w cs':>6}",
        ]
        for r in rows:
            c, k = r["perf_per_batch"]["consumer"], r["perf_per_batch"]["workers"]
            f, sc, cs = (
                "syscalls:sys_enter_futex",
                "raw_syscalls:sys_enter",
                "context-switches",
            )
            out.append(
                f"{r['workers']:>7} {r['batches_per_s']:>5.0f} | "
                f"{c.get(f, 0):>7.3f} {c.get(sc, 0):>6.2f} {c.get(cs, 0):>6.2f} | "
                f"{k.get(f, 0):>7.3f} {k.get(sc, 0):>6.2f} {k.get(cs, 0):>6.2f}"
            )
    out += ["", "how the ring's futex calls ended, per batch:"]
    for r in rows:
        per = r["traced"]["syscalls_per_batch"]
        for side in ("consumer", "workers"):
            ends = per[side]["futex_ring_outcomes"]
            text = ", ".join(f"{k} {v:.3f}" for k, v in ends.items()) or "none"
            out.append(f"{r['workers']:>7} {side:<8}: {text}")
    return "\n".join(out)


LEGEND = """\
batch ms: the producer's sleep per batch; up s: constructor call until every
worker has begun its first sample; start s: until the first batch is in hand;
all s: until a batch of every worker is in hand; once: every sample index
exactly once; order: in sampler order; b/s: batches/s over the untraced
epoch; 2nd: a second epoch starts in order; close s: close() during that
second epoch, workers mid-batch; left: child processes after close.
Per batch inside the traced window (c = the consumer, all its threads; w =
all workers together): futex = every futex call; ring = the ring's own
(process-shared FUTEX_WAIT and FUTEX_WAKE; the rest are the interpreter's
private ones); wake = ring FUTEX_WAKE calls; tmo = ring waits that ended on
their 100 ms slice; sys = every system call; w sleep = the producers' own
clock_nanosleep ({batch} per batch, one per sample); ring = c ring + w ring.
The perf table counts the untraced run (no ptrace stops to slow anyone):
every futex call (ring and private), every system call, and context
switches (cs), per batch."""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default="1,8,64", help="comma-separated counts")
    p.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="total batches/s every worker count is paced to (default 500)",
    )
    p.add_argument(
        "--sample-ms",
        type=float,
        default=None,
        help="instead of --rate: each sample sleeps this long, whatever the "
        "worker count (throughput then grows with workers)",
    )
    p.add_argument(
        "--consumer-ms",
        type=float,
        default=0.0,
        help="the consumer sleeps this long per batch (a training step); "
        "slower than the producers, it keeps the ring full",
    )
    p.add_argument("--batches", type=int, default=2000, help="untraced epoch")
    p.add_argument("--window", type=int, default=2000, help="traced batches")
    p.add_argument("--start-method", default=None)
    p.add_argument("--unordered", action="store_true")
    p.add_argument("--no-strace", action="store_true")
    p.add_argument(
        "--no-perf",
        dest="perf",
        action="store_false",
        help="no perf stat counts in the untraced run",
    )
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one is not None:
        print(MARK + json.dumps(one(args)), flush=True)
        return

    strace = None if args.no_strace else shutil.which("strace")
    if args.perf:
        from fastq._bench.procstat import perf_available

        args.perf = perf_available()
    pace = (
        f"each sample sleeps {args.sample_ms} ms"
        if args.sample_ms is not None
        else f"paced to {args.rate:g} batches/s in total at every worker count"
    )
    print(f"many workers on {machine()}")
    print("command: python " + " ".join(sys.argv))
    with open("/proc/loadavg") as f:
        print("load average before: " + " ".join(f.read().split()[:3]))
    print(
        f"map-style source, {BATCH} samples a batch, sleep-bound: {pace}; "
        f"{'unordered' if args.unordered else 'ordered'}; the consumer "
        + (
            f"sleeps {args.consumer_ms} ms a batch"
            if args.consumer_ms
            else "only counts"
        )
        + f"; untraced epoch "
        f"{args.batches}+ batches; traced window {args.window} batches"
    )
    if strace is None:
        print("strace not found (or --no-strace): no system call counts")
    rows = []
    for w in (int(x) for x in args.workers.split(",")):
        row = run_one(args, w, None)
        if strace is not None:
            row["traced"] = run_one(args, w, strace)
        rows.append(row)
        print(
            f"  {w} workers: start {row['start_s']:.3f} s, close "
            f"{row['close_s']:.3f} s, exactly once: {row['exactly_once']}",
            flush=True,
        )
    print()
    print(table(rows))
    print()
    print(LEGEND.format(batch=BATCH))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"machine": machine(), "argv": sys.argv, "rows": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
