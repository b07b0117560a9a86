"""Start-up: workers fork from the script, as DataLoader's do, whatever it
imported, whatever threads it runs and wherever it imports fastq.torch, so
they share what it imported and never run its code; nothing outlives the
script. Each script runs in a fresh interpreter, and the world is checked
afterwards. What the workers inherit: tests/test_user_objects.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import alive

import fastq

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; forks as on Linux"
)

ROOT = Path(__file__).resolve().parent.parent

try:
    import torch  # noqa: F401
except ImportError:
    HAS_TORCH = False
else:
    HAS_TORCH = True
# The tests whose scripts import fastq.torch.
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch (fastq.torch)")

# Imported by the scripts: every import of it appends this process's pid
# to IMPORTS, so a second line is a second import.
PROBE = """
import os
with open(os.environ["IMPORTS"], "a") as f:
    f.write(f"{os.getpid()}\\n")
"""

# Sample i: (i, worker's parent pid, whether the worker has `probe`).
DATASET = """
import os
import sys

import numpy as np


class WhereAmI:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return (
            np.int64(i),
            np.int64(os.getppid()),
            np.int64("probe" in sys.modules),
        )
"""

# The script's helpers: what its workers report, and the processes that
# are left.
COMMON = """
import json, os, sys, threading, time
import numpy as np
import probe  # imported once, here; the workers must not import it again
import fastq
from where import WhereAmI


def take(**kw):
    with fastq.Prefetcher(WhereAmI(), batch_size=4, workers=2, **kw) as pf:
        rows = np.concatenate([b[0] for b in pf])
        parents = sorted({int(p) for b in pf for p in b[1]})
        probe_in_worker = all(int(x) for b in pf for x in b[2])
        pids = list(pf._pool.pids)
    return {
        "rows": sorted(int(r) for r in rows),
        "parents": parents,
        "probe_in_worker": probe_in_worker,
        "workers": pids,
    }


def say(**kw):
    print(json.dumps(kw), flush=True)
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "where.py").write_text(DATASET)
    (tmp_path / "common.py").write_text(COMMON)
    yield tmp_path


def env_for(project: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT)])
    env["IMPORTS"] = str(project / "imports.txt")
    return env


def run_python(project: Path, *args: str) -> str:
    """`python *args` in `project`, which must exit 0; its output."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=project,
        env=env_for(project),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def run_script(project: Path, body: str, *args: str) -> list[dict[str, Any]]:
    """Runs `body` as the script `main.py` in `project`; its JSON lines."""
    script = project / "main.py"
    script.write_text("from common import *\n\n" + textwrap.dedent(body))
    out = run_python(project, str(script), *args)
    return [json.loads(line) for line in out.splitlines() if line[:1] == "{"]


def imports(project: Path) -> list[int]:
    return [int(x) for x in (project / "imports.txt").read_text().split()]


def wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


MAIN = """
if __name__ == "__main__":
    say(**take(), me=os.getpid())
"""


def test_workers_share_the_scripts_imports(project: Path) -> None:
    (out,) = run_script(project, MAIN)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["me"]]
    # `probe` is in the workers' modules, imported once: by the script,
    # before the Prefetcher existed, not by a worker.
    assert out["probe_in_worker"]
    assert imports(project) == [out["me"]]
    assert wait_gone(out["workers"]) == []


def test_main_module_run_with_dash_m(project: Path) -> None:
    (project / "entry.py").write_text("from common import *\n" + MAIN)
    stdout = run_python(project, "-m", "entry")
    out = json.loads(stdout.splitlines()[-1])
    assert out["parents"] == [out["me"]]
    assert imports(project) == [out["me"]]


def test_python_dash_c(project: Path) -> None:
    """No worker could import a `-c` main: its class and a lambda reach
    the forked workers as they are."""
    code = textwrap.dedent(
        """
        from common import *

        class Local:
            def __init__(self):
                self.f = lambda i: 10 * i

            def __len__(self):
                return 4

            def __getitem__(self, i):
                return np.int64(self.f(i)), np.int64(os.getppid())

        with fastq.Prefetcher(Local(), batch_size=2, workers=1) as pf:
            rows = [int(x) for b in pf for x in b[0]]
            parents = sorted({int(p) for b in pf for p in b[1]})
        say(rows=rows, parents=parents, me=os.getpid())
        """
    )
    out = json.loads(run_python(project, "-c", code).splitlines()[-1])
    assert out["rows"] == [0, 10, 20, 30]
    assert out["parents"] == [out["me"]]
    assert imports(project) == [out["me"]]


def test_threaded_parent_forks_its_workers(project: Path) -> None:
    """A thread running (torch.distributed's, a trainer's) changes nothing:
    the workers still fork from the script."""
    body = """
    if __name__ == "__main__":
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            first = take()
            # The first Prefetcher's threads run while the second starts.
            with fastq.Prefetcher(WhereAmI(), batch_size=4, workers=1) as held:
                next(iter(held))
                second = take()
        finally:
            stop.set()
            t.join()
        say(first=first, second=second, me=os.getpid())
    """
    (out,) = run_script(project, body)
    assert out["first"]["rows"] == out["second"]["rows"] == list(range(16))
    assert out["first"]["parents"] == out["second"]["parents"] == [out["me"]]
    assert imports(project) == [out["me"]]


def test_script_that_sets_a_start_method_as_it_is_imported(project: Path) -> None:
    """multiprocessing's own default is the script's business: fastq's
    workers still fork."""
    body = """
    import multiprocessing
    multiprocessing.set_start_method("spawn")

    if __name__ == "__main__":
        say(**take(), me=os.getpid())
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["me"]]


@pytest.mark.parametrize(
    "prelude",
    ["", pytest.param("    import fastq.torch\n", marks=needs_torch)],
    ids=["fastq", "fastq.torch"],
)
def test_workers_never_run_the_script(project: Path, prelude: str) -> None:
    """A script that cannot be run as __mp_main__ gets its batches, and an
    unguarded one's top-level code runs once, as under DataLoader's fork."""
    body = (
        prelude
        + """
    with open(os.environ["IMPORTS"] + ".runs", "a") as f:
        f.write(f"{os.getpid()}\\n")
    if __name__ != "__main__":
        raise RuntimeError("only as a script")

    class Local(WhereAmI):
        pass

    with fastq.Prefetcher(Local(), batch_size=4, workers=2) as pf:
        rows = sorted(int(r) for b in pf for r in b[0])
        parents = sorted({int(p) for b in pf for p in b[1]})
    say(rows=rows, parents=parents, me=os.getpid())
    """
    )
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["me"]]
    runs = (project / "imports.txt.runs").read_text().split()
    assert runs == [str(out["me"])]


KEEP_RUNNING = """
if __name__ == "__main__":
    pf = fastq.Prefetcher(WhereAmI(), batch_size=4, workers=2)
    next(iter(pf))
    say(workers=pf._pool.pids)
    time.sleep(60)
"""


def test_parent_killed_leaves_no_worker(project: Path) -> None:
    script = project / "main.py"
    script.write_text("from common import *\n" + KEEP_RUNNING)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=project,
        env=env_for(project),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        out = json.loads(proc.stdout.readline())
        pids = out["workers"]
        assert all(alive(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert wait_gone(pids) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_parent_exit_leaves_nothing(project: Path) -> None:
    body = """
    if __name__ == "__main__":
        pf = fastq.Prefetcher(WhereAmI(), batch_size=4, workers=2)
        next(iter(pf))
        say(workers=pf._pool.pids)
        # No close(): the interpreter's exit tears everything down.
    """
    (out,) = run_script(project, body)
    assert wait_gone(out["workers"]) == []


def test_default_start_method_in_this_process() -> None:
    """Under pytest too (threads run here): the default start method
    delivers every batch, and close() leaves nothing."""
    from helpers import PatternDataset

    with fastq.Prefetcher(PatternDataset(24), batch_size=4, workers=2) as pf:
        got = sorted(int(i) for b in pf for i in b[1])
    assert got == list(range(24))


# ------------------------------------------------------------ fastq.torch


@needs_torch
def test_importing_fastq_torch_starts_no_process(project: Path) -> None:
    code = textwrap.dedent(
        """
        import json, os
        import fastq.torch

        def parent_of(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:  # gone meanwhile
                return -1

        children = [
            int(e) for e in os.listdir("/proc")
            if e.isdigit() and parent_of(e) == os.getpid()
        ]
        print(json.dumps({"children": children}))
        """
    )
    out = json.loads(run_python(project, "-c", code).splitlines()[-1])
    assert out["children"] == []


@needs_torch
def test_a_helper_forked_by_the_script_leaves_the_loader_alone(
    project: Path,
) -> None:
    """A child the script forks (a logger, a data-prep helper) that exits
    through sys.exit runs its atexit handlers and finalizers: the parent's
    loader and its workers go on."""
    body = """
    import fastq.torch

    if __name__ == "__main__":
        pf = fastq.Prefetcher(WhereAmI(), batch_size=4, workers=2)
        it = iter(pf)
        first = next(it)
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        rows = sorted(int(r) for b in [first, *it] for r in b[0])
        pf.close()
        say(rows=rows, after=take(), me=os.getpid())
    """
    (out,) = run_script(project, body)
    assert out["rows"] == out["after"]["rows"] == list(range(16))
    assert out["after"]["parents"] == [out["me"]]
