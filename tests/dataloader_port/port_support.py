"""PyTorch's test/test_dataloader.py, ported to pytest for
fastq.torch.DataLoader, in this folder, one file per part of it; this module
holds what they share (the fixtures are in conftest.py).

Each test asserts the behaviour of one test of PyTorch's file (named in its
docstring), rewritten for a drop-in DataLoader: small datasets, at most two
workers, no private attributes. The datasets and functions that travel to
workers are in tests/torch_helpers/dataloader_port_data.py, importable by
spawn and forkserver workers.

FASTQ_PORT_AGAINST selects the class under test: "fastq" (the default) for
fastq.torch.DataLoader, "torch" for torch.utils.data.DataLoader, which
validates the tests themselves::

    FASTQ_PORT_AGAINST=torch python -m pytest tests/dataloader_port

Where fastq deliberately differs from DataLoader (its migration table), the
test is an expected failure, strict, against fastq only.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")


AGAINST = os.environ.get("FASTQ_PORT_AGAINST", "fastq")
if AGAINST not in ("fastq", "torch"):
    raise ValueError(f"FASTQ_PORT_AGAINST={AGAINST!r}: use 'fastq' or 'torch'")
FASTQ = AGAINST == "fastq"

START_METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()
]

PERSISTENT = pytest.mark.parametrize(
    "persistent_workers", [False, True], ids=["transient", "persistent"]
)


def fastq_default(argument: str) -> Any:
    """The default of one of fastq.torch.DataLoader's arguments (None when
    not testing fastq, or before the class exists)."""
    if not FASTQ:
        return None
    try:
        from fastq.torch import DataLoader as FastqDataLoader
    except ImportError:
        return None
    return inspect.signature(FastqDataLoader).parameters[argument].default


def migration(reason: str, condition: bool = True) -> pytest.MarkDecorator:
    """A deliberate difference of fastq's DataLoader: fails against fastq."""
    return pytest.mark.xfail(
        FASTQ and condition, strict=True, reason=f"migration table: {reason}"
    )


class Tensors(NamedTuple):
    data: Any
    labels: Any
    dataset: Any


# ------------------------------------------------------------------ helpers


def check_sequential(loader: Any, td: Tensors) -> None:
    """Batches (or samples, for batch_size=None) in dataset order."""
    bs = loader.batch_size
    n = 0
    for i, (sample, target) in enumerate(loader):
        if bs is None:
            assert torch.equal(sample, td.data[i])
            assert torch.equal(target, td.labels[i])
        else:
            assert torch.equal(sample, td.data[i * bs : (i + 1) * bs])
            assert torch.equal(target, td.labels[i * bs : (i + 1) * bs])
        n += 1
    assert n == (len(td.dataset) if bs is None else math.ceil(len(td.dataset) / bs))


def check_shuffled(loader: Any, td: Tensors) -> None:
    """Every sample exactly once, each with its own label."""
    index_of = {tuple(row.flatten().tolist()): i for i, row in enumerate(td.data)}
    assert len(index_of) == len(td.data)
    bs = loader.batch_size
    seen: list[int] = []
    batches = 0
    for samples, targets in loader:
        pairs = [(samples, targets)] if bs is None else list(zip(samples, targets))
        if bs is not None:
            assert len(pairs) <= bs
        for sample, target in pairs:
            i = index_of[tuple(sample.flatten().tolist())]
            assert int(target) == int(td.labels[i])
            seen.append(i)
        batches += 1
    assert sorted(seen) == list(range(len(td.data)))
    assert batches == (len(td.data) if bs is None else math.ceil(len(td.data) / bs))


def count_errors(loader: Any, error: type[BaseException]) -> int:
    """next() until StopIteration, counting `error`s (bounded: a loader that
    raises forever fails instead of hanging)."""
    it = iter(loader)
    errors = 0
    for _ in range(len(loader) + 5):
        try:
            next(it)
        except error as exc:
            forget_frames(exc)  # see raises_in_loop
            errors += 1
        except StopIteration:
            return errors
    pytest.fail(f"no StopIteration after {len(loader) + 5} next() calls")


class raises_in_loop:
    """pytest.raises for an error out of a loader's iterator, which then
    clears the frames of the caught traceback. They hold the iterator in a
    reference cycle (a frame that re-raises refers to its exception), and
    torch's iterator, when the garbage collector finalizes it, waits 5 s per
    worker for workers its closed queues no longer reach. Cleared, the
    iterator is freed, and shuts down, with its last name. (A class, not a
    generator: a generator's frame would join the traceback's cycle.)"""

    def __init__(
        self,
        expected: type[BaseException] | tuple[type[BaseException], ...],
        match: str | None = None,
    ) -> None:
        self.raises = pytest.raises(expected, match=match)

    def __enter__(self) -> pytest.ExceptionInfo[Any]:
        return self.raises.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        suppress = bool(self.raises.__exit__(*exc_info))
        forget_frames(exc_info[1])
        return suppress


def forget_frames(exc: BaseException | None) -> None:
    """Clears the frames of an exception's traceback (and its causes')."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            with contextlib.suppress(RuntimeError):  # a frame still running
                tb.tb_frame.clear()
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie or a reaped pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# How long workers may take to exit once nothing needs them: a bound for a
# loaded machine, not a timing; waiting for them is polled.
PROMPT_EXIT_S = 5.0


def wait_gone(pids: set[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            pytest.fail(f"workers still alive: {[p for p in pids if alive(p)]}")
        time.sleep(0.05)


# A script's import of the DataLoader under test (its environment names it).
IMPORT_DATALOADER = (
    "if os.environ['FASTQ_PORT_AGAINST'] == 'torch':\n"
    "    from torch.utils.data import DataLoader\n"
    "else:\n"
    "    from fastq.torch import DataLoader\n"
)


def script_env() -> dict[str, str]:
    """The environment of a script a test runs: the class under test named,
    and tests/ importable ahead of whatever PYTHONPATH already
    holds (the fastq under test, for one)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, FASTQ_PORT_AGAINST=AGAINST, PYTHONPATH=path)


def run_script(script: Any) -> subprocess.CompletedProcess[str]:
    """Runs a script a test wrote, in script_env(), within a bound."""
    return subprocess.run(
        [sys.executable, str(script)],
        env=script_env(),
        timeout=50,
        capture_output=True,
        text=True,
    )


def assert_like(got: Any, want: Any, path: str = "batch") -> None:
    """`got` has the structure and types of `want` (made by default_collate
    or default_convert in this process): the same containers, tensors of the
    same dtype and shape, leaves of the same type."""
    assert type(got) is type(want), (
        f"{path}: {type(got).__name__}, torch gives {type(want).__name__}"
    )
    if isinstance(want, torch.Tensor):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for key in want:
            assert_like(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for k, (g, w) in enumerate(zip(got, want)):
            assert_like(g, w, f"{path}[{k}]")


def ints(loader: Any) -> list[int]:
    return [int(x) for x in loader]
