"""The start method: which one ``start_method=None`` means (fork where the
platform has it, as DataLoader's default on Linux), and its multiprocessing
context, with the fork server's preload."""

from __future__ import annotations

import multiprocessing as mp
import sys
from typing import Any

from ..errors import ConfigError

START_METHODS = ("fork", "spawn", "forkserver")


def default_start_method() -> str:
    """The start method behind ``start_method=None``: ``fork`` where the
    platform has it, as DataLoader's default on Linux (see NOTE [ Default
    start method ]), else ``forkserver`` or ``spawn``."""
    methods = mp.get_all_start_methods()
    if "fork" in methods:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


# NOTE [ Default start method ]
#
# Without start_method=, workers are forked from the training process, as
# DataLoader's are on Linux: they inherit the dataset, collate_fn and
# worker_init as they are, so lambdas, closures, classes a notebook cell or
# `python -c` defines, multiprocessing objects of the default context and
# large arrays (shared copy-on-write, at fork's cost) all reach them, and
# nothing the script imported is imported again. The first batch comes as
# soon as DataLoader's wherever the script imports fastq.
#
# A fork is made whatever threads the process runs, as DataLoader's is: the
# child runs only the worker loop and the dataset, CPython, glibc, OpenBLAS
# and torch reset their own locks and thread pools in a forked child, and
# workers run torch and BLAS on one thread (worker_threads=1).
#
# Also once CUDA is initialised: workers never touch CUDA (batches reach the
# GPU from this process, pinned by it), and a dataset that does gets torch's
# own error from its worker ("Cannot re-initialize CUDA in forked
# subprocess"), which names the fix: start_method="spawn" or "forkserver".
# Those pickle the user's objects for the workers (fastq/_workers/_handoff.py): by
# value where they cannot be imported (cloudpickle), large arrays as one
# shared copy, descriptors duplicated for each worker.


def get_context(start_method: str | None) -> Any:
    method = default_start_method() if start_method is None else start_method
    if method not in START_METHODS or method not in mp.get_all_start_methods():
        raise ConfigError(
            f"start_method={start_method!r} is not available here; use one of "
            f"{[m for m in START_METHODS if m in mp.get_all_start_methods()]}"
        )
    ctx = mp.get_context(method)
    if method == "forkserver":
        # Workers fork from a server that already imported what they need.
        # The main module must be import-safe (`if __name__ == "__main__":`),
        # as under spawn.
        ctx.set_forkserver_preload(_forkserver_preload())
    return ctx


def _forkserver_preload() -> list[str]:
    """What the fork server preloads for fastq's workers: fastq and numpy
    through fastq._workers._worker, and torch when this process has it. CPython
    (3.11 to 3.13 at least) never preloads "__main__" itself (ForkServer
    passes forkserver.main no main_path), so each worker would run the main
    script, and import torch with it, every time workers start (each epoch
    without persistent_workers)."""
    torch = ["torch"] if "torch" in sys.modules else []
    return ["__main__", "fastq._workers._worker", *torch]
