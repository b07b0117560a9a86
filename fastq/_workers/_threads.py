"""Native thread pools in a worker: one BLAS/OpenMP thread per worker unless
the user asks otherwise, so N workers do not start N x cores threads."""

from __future__ import annotations

import ctypes
import os
import re
import sys

_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# Setters of the pools numpy, scipy and torch wheels bundle, by symbol.
_SETTERS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "scipy_openblas_set_num_threads64_",
    "MKL_Set_Num_Threads",
    "omp_set_num_threads",
)
_POOL_LIBRARY = re.compile(r"(openblas|mkl_rt|libgomp|libiomp|libomp)[^/]*\.so")


def limit_threads(threads: int) -> None:
    """Sets every thread pool to `threads`: through the environment for
    libraries loaded later, and directly for those already loaded (numpy's
    OpenBLAS is, by the time a worker runs)."""
    for name in _ENV:
        os.environ[name] = str(threads)
    for path in _loaded_pool_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in _SETTERS:
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(ctypes.c_int(threads))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def _loaded_pool_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if ".so" in line}
    except OSError:  # not Linux: the environment variables are all we have
        return []
    return sorted(p for p in paths if _POOL_LIBRARY.search(os.path.basename(p)))
