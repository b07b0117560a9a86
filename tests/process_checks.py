"""What a test checks this process with: the start methods it has, its
live children, and its ring mappings and descriptors (the conftest's leak
check after every test, and tests that look for themselves)."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile

START_METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()
]


def is_fastq_file(path: str) -> bool:
    """Whether a mapped or open path is one of fastq's nameless files: a
    memfd it named ("/memfd:fastq-ring (deleted)"), or where memfd does not
    exist the unlinked temporary file standing in for one. A checkout or a
    virtual environment whose path holds "fastq-" (a clone named for the
    distribution, fastq-ring/) maps libraries, not rings."""
    if path.startswith("/memfd:fastq-"):
        return True
    folder, name = os.path.split(path)
    return (
        folder == tempfile.gettempdir()
        and name.startswith("fastq-")
        and name.endswith(" (deleted)")
    )


def ring_mappings() -> list[str]:
    """This process's mappings and descriptors of fastq rings."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            # address perms offset dev inode [path]: the path may hold spaces.
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) == 6 and is_fastq_file(fields[5]):
                found.append(line.strip())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if is_fastq_file(target):
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
