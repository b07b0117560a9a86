"""torchdata 0.11.0's test/stateful_dataloader/test_state_dict.py, ported to
pytest for fastq.torch.StatefulDataLoader, in this folder, one file per part
of it; this module holds what they share (the fixture is in conftest.py).

Ported from meta-pytorch/data at tag v0.11.0, commit
377e64c1be69a9be6649d14c9e3664070323e464. Each test asserts the behaviour
of one test of that file, named in its docstring, with smaller datasets
and fewer workers where the point does not depend on them (each such
change is said where it is made). The datasets and functions that travel
to workers are in tests/torch_helpers/stateful_port_data.py.

FASTQ_PORT_AGAINST selects the class under test: "fastq" (the default) for
fastq.torch.StatefulDataLoader, "torchdata" for torchdata's
StatefulDataLoader, which validates the tests themselves (all pass there)::

    FASTQ_PORT_AGAINST=torchdata python -m pytest tests/stateful_port

Against fastq, two kinds of test do not simply pass, each marked here:
`snapshot_layout` (skipped: the test reads StatefulDataLoader's internal
snapshot layout, ``state["_snapshot"]["_worker_snapshots"]``, which
fastq's state does not have), and a deliberate difference, tested the
other way round (resuming on another number of workers, which torchdata
refuses and fastq does).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable

import pytest

AGAINST = os.environ.get("FASTQ_PORT_AGAINST", "fastq")
if AGAINST == "torch":
    # The DataLoader port's value: torch's DataLoader keeps no state.
    pytest.skip(
        "FASTQ_PORT_AGAINST=torch: torch's DataLoader has no state_dict(); "
        "use 'torchdata' for this port",
        allow_module_level=True,
    )
if AGAINST not in ("fastq", "torchdata"):
    raise ValueError(f"FASTQ_PORT_AGAINST={AGAINST!r}: use 'fastq' or 'torchdata'")
FASTQ = AGAINST == "fastq"
TORCHDATA = not FASTQ


def snapshot_layout(what: str) -> pytest.MarkDecorator:
    """A test that reads StatefulDataLoader's snapshot layout: skipped on
    fastq, whose state has none."""
    return pytest.mark.skipif(
        FASTQ,
        reason=f"reads StatefulDataLoader's internal snapshot layout ({what}); "
        "fastq's state is computed, not snapshotted, and has no such keys",
    )


class raises_freeing:
    """pytest.raises for a loader's error, which then clears the frames of
    the caught traceback: they hold the loader's iterator (and its
    workers) alive as long as pytest keeps the error."""

    def __init__(self, expected: type[BaseException], match: str) -> None:
        self.raises = pytest.raises(expected, match=match)

    def __enter__(self) -> Any:
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


def frees_on_error(run: Callable[..., Any]) -> Callable[..., Any]:
    """`run`, whose loaders (and their workers) are freed when it raises:
    the frames of the error's traceback are cleared, so that the error
    pytest keeps for its report does not keep them alive past the test."""

    @functools.wraps(run)
    def freeing(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except Exception as exc:
            forget_frames(exc)
            raise

    return freeing


def stream_state(test: Callable[..., Any]) -> Callable[..., Any]:
    """A test of an IterableDataset's state: its loaders freed on error."""
    return frees_on_error(test)
