"""Per-process counters from /proc and getrusage, and syscall counts from
`perf stat` where it is installed: what each side of a transport pays; the
peak memory of a process tree, sampled while it runs."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children_of(pid: int) -> list[int]:
    """Every live descendant of `pid` (workers, fork servers, their children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


@dataclass
class Counters:
    """Cumulative CPU seconds, minor and major page faults, context switches."""

    cpu_s: float = 0.0
    minflt: int = 0
    majflt: int = 0
    csw: int = 0

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.cpu_s - other.cpu_s,
            self.minflt - other.minflt,
            self.majflt - other.majflt,
            self.csw - other.csw,
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.cpu_s + other.cpu_s,
            self.minflt + other.minflt,
            self.majflt + other.majflt,
            self.csw + other.csw,
        )


def self_counters() -> Counters:
    """This process, every thread."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return Counters(
        r.ru_utime + r.ru_stime, r.ru_minflt, r.ru_majflt, r.ru_nvcsw + r.ru_nivcsw
    )


def process_counters(pid: int) -> Counters:
    """Another process, every thread; zeros if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return Counters()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # man 5 proc: minflt, majflt, utime, stime are fields 10, 12, 14, 15.
    minflt, majflt = int(fields[7]), int(fields[9])
    cpu = (int(fields[11]) + int(fields[12])) / _TICK
    csw = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if "ctxt_switches:" in line:
                        csw += int(line.split()[-1])
    except OSError:
        pass
    return Counters(cpu, minflt, majflt, csw)


def tree_counters(pids: list[int]) -> Counters:
    total = Counters()
    for pid in pids:
        total = total + process_counters(pid)
    return total


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages count once across processes."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def total_pss(pid: int) -> int:
    """PSS of `pid` and every descendant."""
    return pss_bytes(pid) + sum(pss_bytes(p) for p in children_of(pid))


class PeakPss:
    """Samples total_pss(pid) every `interval` seconds on a thread of its
    own, from start() to stop(), which returns the largest sample; sample()
    adds one at a moment the caller chooses."""

    def __init__(self, pid: int, interval: float) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = 0
        self._lock = threading.Lock()  # the sampler's and the caller's samples
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="fastq-bench-pss", daemon=True
        )

    def sample(self) -> None:
        value = total_pss(self.pid)
        with self._lock:
            self.peak = max(self.peak, value)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.sample()
        return self.peak


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields), idle


def busy_share(interval: float = 0.5) -> float:
    """Fraction of all CPUs busy over `interval` seconds (0 where /proc/stat
    cannot be read)."""
    try:
        t0, i0 = _cpu_times()
        time.sleep(interval)
        t1, i1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 0.0 if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


def wait_for_quiet(max_wait: float, threshold: float = 0.1) -> float:
    """Waits (up to max_wait seconds) until the machine is nearly idle, so
    that a case is not measured while other work shares the CPUs; returns
    the last busy share seen."""
    deadline = time.monotonic() + max_wait
    share = busy_share()
    while share > threshold and time.monotonic() < deadline:
        share = busy_share()
    return share


# --------------------------------------------------------------- perf stat

PERF_EVENTS = (
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_futex",
    "page-faults",
    "context-switches",
)


def perf_available() -> bool:
    if shutil.which("perf") is None:
        return False
    try:
        r = subprocess.run(
            ["perf", "stat", "-x,", "-e", PERF_EVENTS[0], "true"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "not supported" not in r.stderr


class PerfStat:
    """`perf stat` attached to a set of processes (every thread), counting
    PERF_EVENTS only between enable() and disable(): its control pipe makes
    the window exact, however long perf takes to attach."""

    def __init__(self, pids: list[int]) -> None:
        ctl_r, self._ctl = os.pipe()
        self._ack, ack_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    "perf",
                    "stat",
                    "-x,",
                    "-D",
                    "-1",
                    "--control",
                    f"fd:{ctl_r},{ack_w}",
                    "-e",
                    ",".join(PERF_EVENTS),
                    "-p",
                    ",".join(map(str, pids)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                pass_fds=(ctl_r, ack_w),
            )
        finally:
            os.close(ctl_r)
            os.close(ack_w)

    def _command(self, word: bytes) -> None:
        os.write(self._ctl, word + b"\n")
        os.read(self._ack, 16)  # "ack": perf has applied it

    def enable(self) -> None:
        self._command(b"enable")

    def disable(self) -> None:
        self._command(b"disable")

    def close(self) -> dict[str, int]:
        """Stops perf; the counts of every enabled window, by event."""
        proc = self._proc
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        finally:
            os.close(self._ctl)
            os.close(self._ack)
        out: dict[str, int] = {}
        for line in err.splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2] in PERF_EVENTS:
                with contextlib.suppress(ValueError):  # "<not counted>"
                    out[parts[2]] = int(float(parts[0]))
        return out
