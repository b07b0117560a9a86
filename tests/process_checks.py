"""What a test checks this process with: the start methods it has, its
live children, and its ring mappings and descriptors (the conftest's leak
check after every test, and tests that look for themselves)."""

from __future__ import annotations

import multiprocessing as mp
import os

START_METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()
]


def ring_mappings() -> list[str]:
    """This process's mappings and descriptors of fastq rings."""
    found = []
    with open("/proc/self/maps") as f:
        found += [line.strip() for line in f if "fastq-" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "fastq-" in target:
            found.append(f"fd {fd} -> {target}")
    return found


def child_pids() -> list[int]:
    """Live children of this process, other than multiprocessing's own
    helpers (the fork server and the resource tracker)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(fields[1])  # zombies count: a leak is a child not reaped
        if ppid != me:
            continue
        if b"forkserver" in cmd or b"resource_tracker" in cmd:
            continue
        out.append(int(entry))
    return out
