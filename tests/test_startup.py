"""The default start method once CUDA is initialised: workers fork from the
zygote, a server forked from the script, so they share what it imported; a
parent with threads falls back to the normal fork server; nothing outlives
the script. Each script runs in a fresh interpreter, told that CUDA forbids
forking its workers (no GPU is needed), and the world is checked afterwards.
Before CUDA, workers fork from the script itself (tests/test_user_objects.py)."""

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
    not sys.platform.startswith("linux"), reason="the zygote is Linux-only"
)

ROOT = Path(__file__).resolve().parent.parent

try:
    import torch  # noqa: F401
except ImportError:
    HAS_TORCH = False
else:
    HAS_TORCH = True
# The tests whose scripts fork the zygote as `import fastq.torch` does.
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

# The script's helpers: the pid serving its default-method workers, what
# its workers report, and the processes that are left.
COMMON = """
import json, os, sys, threading, time
import numpy as np
import probe  # imported once, here; the workers must not import it again
import fastq
from fastq import _pool
from fastq import _zygote as zygote
from where import WhereAmI

# As once CUDA is initialised: the default start method is the zygote's,
# which `import fastq.torch` forks ahead as on a torch built with CUDA.
_pool._cuda_forbids_fork = lambda: True
zygote.cuda_possible = lambda: True


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
        "server": zygote.server_pid(),
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


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


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
    # The workers' parent is the zygote, which this script started.
    assert out["server"] is not None
    assert out["parents"] == [out["server"]]
    # `probe` is in the workers' modules, imported once: by the script,
    # before the Prefetcher existed, not by the zygote or a worker.
    assert out["probe_in_worker"]
    assert imports(project) == [out["me"]]
    assert wait_gone([out["server"], *out["workers"]]) == []


def test_main_module_run_with_dash_m(project: Path) -> None:
    (project / "entry.py").write_text("from common import *\n" + MAIN)
    stdout = run_python(project, "-m", "entry")
    out = json.loads(stdout.splitlines()[-1])
    assert out["parents"] == [out["server"]]
    assert imports(project) == [out["me"]]


def test_python_dash_c(project: Path) -> None:
    code = "from common import *\nsay(**take(), me=os.getpid())\n"
    stdout = run_python(project, "-c", code)
    out = json.loads(stdout.splitlines()[-1])
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["server"]]
    assert imports(project) == [out["me"]]


def test_main_defined_source_reaches_zygote_workers_under_dash_c(
    project: Path,
) -> None:
    """No worker can import a `-c` main: its class and a lambda travel by
    value (cloudpickle) to the zygote's workers."""
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
        say(rows=rows, parents=parents, server=zygote.server_pid())
        """
    )
    out = json.loads(run_python(project, "-c", code).splitlines()[-1])
    assert out["rows"] == [0, 10, 20, 30]
    assert out["server"] is not None and out["parents"] == [out["server"]]


def test_repeated_prefetchers_reuse_the_zygote(project: Path) -> None:
    body = """
    if __name__ == "__main__":
        first = take()
        # The first Prefetcher's threads run while the second starts: no
        # new fork is needed, the zygote serves it.
        with fastq.Prefetcher(WhereAmI(), batch_size=4, workers=1) as held:
            next(iter(held))
            second = take()
        say(first=first, second=second, me=os.getpid())
    """
    (out,) = run_script(project, body)
    server = out["first"]["server"]
    assert server is not None and out["second"]["server"] == server
    assert out["first"]["parents"] == out["second"]["parents"] == [server]
    assert imports(project) == [out["me"]]


def test_threaded_parent_falls_back_to_the_fork_server(project: Path) -> None:
    body = """
    if __name__ == "__main__":
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            out = take()
            cmd = open(f"/proc/{out['parents'][0]}/cmdline", "rb").read()
            out["parent_cmd"] = cmd.decode(errors="replace")
        finally:
            stop.set()
            t.join()
        say(**out)
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["server"] is None  # no zygote: a fork would not be safe
    assert "multiprocessing.forkserver" in out["parent_cmd"]


def test_script_that_sets_a_start_method_as_it_is_imported(project: Path) -> None:
    """The zygote imports the script as a fresh interpreter would: a
    start method set at import time does not clash with the parent's."""
    body = """
    import multiprocessing
    multiprocessing.set_start_method("spawn")

    if __name__ == "__main__":
        say(**take(), me=os.getpid())
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["server"]]


@pytest.mark.parametrize(
    "prelude",
    ["", pytest.param("    import fastq.torch\n", marks=needs_torch)],
    ids=["at-first-workers", "at-import"],
)
def test_zygote_never_runs_the_script(project: Path, prelude: str) -> None:
    """Neither the zygote nor its workers run the script's code (what they
    need of its __main__ travels by value): a script that cannot be run as
    __mp_main__ gets its batches, and an unguarded one's top-level code
    runs once, as under DataLoader's fork."""
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
    say(rows=rows, parents=parents, server=zygote.server_pid(), me=os.getpid())
    """
    )
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["server"] is not None and out["parents"] == [out["server"]]
    runs = (project / "imports.txt.runs").read_text().split()
    assert runs == [str(out["me"])]


KEEP_RUNNING = """
if __name__ == "__main__":
    pf = fastq.Prefetcher(WhereAmI(), batch_size=4, workers=2)
    next(iter(pf))
    say(server=zygote.server_pid(), workers=pf._pool.pids)
    time.sleep(60)
"""


def test_parent_killed_leaves_no_zygote_and_no_worker(project: Path) -> None:
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
        pids = [out["server"], *out["workers"]]
        assert all(alive(p) for p in pids)
        assert comm(out["server"]) == "fastq-zygote"
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
        say(server=zygote.server_pid(), workers=pf._pool.pids)
        # No close(): the interpreter's exit tears everything down.
    """
    (out,) = run_script(project, body)
    assert out["server"] is not None
    assert wait_gone([out["server"], *out["workers"]]) == []


def test_default_start_method_in_this_process() -> None:
    """Under pytest too (a thread here means the normal fork server): the
    default start method delivers every batch, and close() leaves nothing."""
    from helpers import PatternDataset

    with fastq.Prefetcher(PatternDataset(24), batch_size=4, workers=2) as pf:
        got = sorted(int(i) for b in pf for i in b[1])
    assert got == list(range(24))


# ------------------------------------------------------ forked at import


@needs_torch
def test_zygote_forked_at_import_serves_a_threaded_parent(project: Path) -> None:
    """`import fastq.torch` forks the zygote while the script has one thread:
    a loader whose workers start after torch.distributed (or a trainer)
    started threads still gets workers that share the script's imports."""
    body = """
    import fastq.torch

    if __name__ == "__main__":
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)  # torch.distributed's, say
        t.start()
        try:
            say(**take(), zygote_comm=open(
                f"/proc/{zygote.server_pid()}/comm").read().strip())
        finally:
            stop.set()
            t.join()
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["zygote_comm"] == "fastq-zygote"
    assert out["parents"] == [out["server"]]
    assert out["probe_in_worker"]
    assert len(imports(project)) == 1  # the zygote inherited the script's


@needs_torch
def test_zygote_forked_inside_a_modules_import(project: Path) -> None:
    """The zygote is forked from inside `import fastq.torch`, itself inside
    the import of one of the script's modules: it imports them afresh, and
    what that module defines after the import reaches the workers."""
    (project / "data.py").write_text(
        textwrap.dedent(
            """
            import fastq.torch
            from where import WhereAmI


            class Later(WhereAmI):
                pass
            """
        )
    )
    body = """
    import data

    if __name__ == "__main__":
        with fastq.Prefetcher(data.Later(), batch_size=4, workers=2) as pf:
            rows = sorted(int(r) for b in pf for r in b[0])
            parents = sorted({int(p) for b in pf for p in b[1]})
        say(rows=rows, parents=parents, server=zygote.server_pid())
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["server"]]


@needs_torch
def test_no_zygote_where_torch_has_no_cuda(project: Path) -> None:
    """Workers fork from the script until CUDA is initialised, which a
    torch built without CUDA never is: `import fastq.torch` forks no
    zygote there, and leaves no process behind."""
    code = textwrap.dedent(
        """
        import json, os
        import torch
        import fastq.torch
        from fastq import _zygote

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
        print(json.dumps({
            "cuda_built": torch.backends.cuda.is_built(),
            "pending": _zygote._state.pending is not None,
            "children": children,
        }))
        """
    )
    out = json.loads(run_python(project, "-c", code).splitlines()[-1])
    assert out["pending"] == out["cuda_built"]
    if not out["cuda_built"]:
        assert out["children"] == []


@needs_torch
def test_zygote_forked_at_import_and_never_used_leaves_nothing(
    project: Path,
) -> None:
    body = """
    import fastq.torch

    if __name__ == "__main__":
        say(pending=zygote._state.pending.pid)
    """
    (out,) = run_script(project, body)
    assert wait_gone([out["pending"]]) == []


@needs_torch
def test_a_helper_forked_while_the_zygote_starts_leaves_it_alone(
    project: Path,
) -> None:
    """A child forked right after `import fastq.torch` (the zygote still
    importing the script) exits through sys.exit: the parent's zygote is
    not its own, and the parent's workers still come from it."""
    body = """
    import fastq.torch

    if __name__ == "__main__":
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # atexit handlers and finalizers run here
        os.waitpid(pid, 0)
        say(**take())
    """
    (out,) = run_script(project, body)
    assert out["rows"] == list(range(16))
    assert out["parents"] == [out["server"]]
