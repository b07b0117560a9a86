"""A dataset class and a lambda defined in a __main__ with no file behind
it: `python -c`, standard input, and the cells of a notebook run in a real
Jupyter kernel (ipykernel, driven by nbclient and jupyter_client), with
both faces, under the default start method and under spawn, which gets
them by value. Ctrl+C in a notebook (an interrupted kernel) leaves no
worker, and the next cell iterates again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
HAS_TORCH = True
try:
    import torch  # noqa: F401
except ImportError:
    HAS_TORCH = False

# Both faces over a class and a lambda of this __main__; prints one JSON line.
PROGRAM = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import fastq

    METHOD = os.environ.get("FASTQ_TEST_METHOD") or None
    out = {}

    class Squares:
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return np.int64(i * i)

    shift = 5
    with fastq.Prefetcher(Squares(), batch_size=4, workers=2, copy=True,
                          start_method=METHOD) as pf:
        out["prefetcher"] = [int(x) for b in pf for x in b]

    try:
        import torch
        from fastq.torch import DataLoader
    except ImportError:
        pass
    else:
        class Pairs(torch.utils.data.Dataset):
            def __len__(self):
                return 12

            def __getitem__(self, i):
                return i

        loader = DataLoader(Pairs(), batch_size=4, num_workers=2,
                            collate_fn=lambda b: torch.tensor(b) + shift,
                            multiprocessing_context=METHOD)
        out["dataloader"] = [int(x) for b in loader for x in b]
    print(json.dumps(out), flush=True)
    """
)


def _env(method: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["FASTQ_TEST_METHOD"] = method or ""
    return env


def _check(out: dict[str, Any]) -> None:
    assert out["prefetcher"] == [i * i for i in range(16)]
    if HAS_TORCH:
        assert out["dataloader"] == [i + 5 for i in range(12)]


# spawn is the long route (a fresh interpreter per worker): the main given
# by -c spawns by default, the main read from stdin in the long form.
@pytest.mark.parametrize(
    ("how", "method"),
    [
        ("-c", None),
        ("stdin", None),
        ("-c", "spawn"),
        pytest.param("stdin", "spawn", marks=pytest.mark.slow),
    ],
)
def test_classes_and_lambdas_of_a_main_without_file(
    how: str, method: str | None, tmp_path: Path
) -> None:
    args = ["-c", PROGRAM] if how == "-c" else ["-"]
    proc = subprocess.run(
        [sys.executable, *args],
        input=PROGRAM if how == "stdin" else None,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(method),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    _check(json.loads(proc.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------- notebooks

KERNEL = "fastq-test-python"

# Cells a notebook user writes: imports, a dataset class, a lambda, a loop.
CELLS = [
    "import os, json\nimport numpy as np\nimport fastq",
    "class Squares:\n"
    "    def __len__(self):\n"
    "        return 16\n"
    "    def __getitem__(self, i):\n"
    "        return np.int64(i * i)",
    "METHOD = os.environ.get('FASTQ_TEST_METHOD') or None\n"
    "with fastq.Prefetcher(Squares(), batch_size=4, workers=2, copy=True,\n"
    "                      start_method=METHOD) as pf:\n"
    "    got = [int(x) for b in pf for x in b]\n"
    "print('prefetcher', json.dumps(got))",
]
TORCH_CELLS = [
    "import torch\nfrom fastq.torch import DataLoader",
    "class Pairs(torch.utils.data.Dataset):\n"
    "    def __len__(self):\n"
    "        return 12\n"
    "    def __getitem__(self, i):\n"
    "        return i",
    "shift = 5\ncollate = lambda b: torch.tensor(b) + shift",
    "loader = DataLoader(Pairs(), batch_size=4, num_workers=2, collate_fn=collate,\n"
    "                    multiprocessing_context=METHOD)\n"
    "print('dataloader', json.dumps([int(x) for b in loader for x in b]))",
]
# The kernel's children, but for multiprocessing's own resource tracker
# (spawn starts one, for the life of the kernel).
CHILDREN = (
    "import gc\n"
    "gc.collect()\n"
    "def children():\n"
    "    me, found = os.getpid(), []\n"
    "    for e in os.listdir('/proc'):\n"
    "        if e.isdigit():\n"
    "            try:\n"
    "                stat = open(f'/proc/{e}/stat').read().rsplit(')', 1)[1].split()\n"
    "                cmd = open(f'/proc/{e}/cmdline', 'rb').read()\n"
    "            except OSError:\n"
    "                continue\n"
    "            if int(stat[1]) == me and b'resource_tracker' not in cmd:\n"
    "                found.append(int(e))\n"
    "    return found\n"
    "print('children', json.dumps(children()))"
)


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A kernel spec that runs ipykernel on this interpreter, whatever the
    PATH says, with this checkout importable (the test extra installs
    ipykernel and nbclient)."""
    for module in ("ipykernel", "nbclient", "nbformat", "jupyter_client"):
        pytest.importorskip(module)
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [
                    sys.executable,
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                ],
                "display_name": "fastq tests",
                "language": "python",
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    yield


def _printed(nb: Any) -> dict[str, Any]:
    found = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            for line in output.get("text", "").splitlines():
                name, _, value = line.partition(" ")
                if name in ("prefetcher", "dataloader", "children"):
                    found[name] = json.loads(value)
    return found


@pytest.mark.usefixtures("kernel_env")
@pytest.mark.parametrize(
    "method", [None, pytest.param("spawn", marks=pytest.mark.slow)]
)
def test_notebook_cells_define_the_dataset_and_collate_fn(
    method: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbclient
    import nbformat

    monkeypatch.setenv("FASTQ_TEST_METHOD", method or "")
    cells = CELLS + (TORCH_CELLS if HAS_TORCH else []) + [CHILDREN]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=120,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    out = _printed(nb)
    _check(out)
    assert out["children"] == []


# An endless loop over a loader, interrupted as a notebook's stop button does.
ENDLESS = (
    "import time\n"
    "class Slow(Squares):\n"
    "    def __getitem__(self, i):\n"
    "        time.sleep(0.01)\n"
    "        return np.int64(i)\n"
    "pf = fastq.Prefetcher(Slow(), batch_size=4, workers=2)\n"
    "print('started', flush=True)\n"
    "while True:\n"
    "    for batch in pf:\n"
    "        pass"
)


def _run(client: Any, code: str, deadline: float, on_output: Any = None) -> Any:
    """Executes code in the kernel; (its stdout, the error name or None)."""
    msg_id = client.execute(code)
    text, error = [], None
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except Exception:  # queue.Empty: nothing yet
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
            if on_output is not None:
                on_output("".join(text))
        elif kind == "error":
            error = content["ename"]
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(text), error
    raise AssertionError(f"the kernel did not finish {code!r}: {''.join(text)}")


@pytest.mark.usefixtures("kernel_env")
def test_interrupted_notebook_cell_leaves_no_worker(tmp_path: Path) -> None:
    import jupyter_client

    manager = jupyter_client.KernelManager(kernel_name=KERNEL)
    manager.start_kernel(cwd=str(tmp_path))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        deadline = time.monotonic() + 120
        for cell in CELLS[:2]:
            assert _run(client, cell, deadline)[1] is None
        interrupted = []

        def interrupt_once_started(text: str) -> None:
            if "started" in text and not interrupted:
                time.sleep(0.5)  # well inside the loop
                manager.interrupt_kernel()
                interrupted.append(True)

        _, error = _run(client, ENDLESS, deadline, interrupt_once_started)
        assert error == "KeyboardInterrupt"
        # As after a `break`: the same Prefetcher goes on, then closes.
        text, error = _run(
            client,
            "got = sorted(int(x) for b in pf for x in b[:])\n"
            "pf.close()\n"
            "print('prefetcher', json.dumps(got))",
            deadline,
        )
        assert error is None
        assert json.loads(text.split("prefetcher ", 1)[1]) == list(range(16))
        text, error = _run(client, CHILDREN, deadline)
        assert error is None
        assert json.loads(text.split("children ", 1)[1]) == []
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
