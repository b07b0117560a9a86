"""Runs a script (a trainer, a launcher and what they start) as a test
would a user's: to its end within a deadline, then checks that no process
of the run and no fastq shared memory is left. Each run carries a token in
its environment, so its processes are found whatever session or parent
they end up with (torchrun starts each rank in a session of its own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TAG = "FASTQ_TEST_RUN"  # every process of a run inherits it


def tagged(token: str) -> list[int]:
    """Live processes whose environment carries this run's token: the
    trainer's ranks, launchers, fork servers and workers, whatever session
    or parent they ended up with (torchrun starts each rank in a session
    of its own)."""
    needle = f"{TAG}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def fastq_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "fastq" in n}


def launch(
    cmd: list[str],
    cwd: Path,
    timeout: float,
    *,
    path: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
) -> str:
    """Runs one script to its end; its output. Fails if it exits non-zero,
    outlives `timeout` (then it is killed, every process of it), or leaves
    a process or a shared-memory name behind. `path` goes before tests/ and
    the repository on PYTHONPATH; `env` adds variables."""
    token = uuid.uuid4().hex
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(map(str, [*path, HERE, HERE.parent])),
        OMP_NUM_THREADS="1",
        **(env or {}),
        **{TAG: token},
    )
    shm_before = fastq_names()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(tagged(token))
        out, _ = proc.communicate()
        pytest.fail(
            f"{' '.join(cmd[1:])} did not finish in {timeout:.0f} s:\n"
            + out.decode(errors="replace")[-6000:]
        )
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    # The launcher has exited; what it started has a moment to follow.
    deadline = time.monotonic() + 5.0
    while tagged(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = tagged(token)
    kill_all(left)
    assert left == [], f"processes left behind by the run: {left}\n{text[-3000:]}"
    leaked = fastq_names() - shm_before
    assert not leaked, f"shared memory left behind: {leaked}"
    return text
