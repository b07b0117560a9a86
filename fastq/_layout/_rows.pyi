# Type stubs for the producer's copies (src_c/_rows.pyx).
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from ._spec import BatchSpec

class RowWriter:
    row: int
    @property
    def stream(self) -> bool: ...
    def __init__(self, spec: BatchSpec) -> None: ...
    def write_samples(
        self,
        get: Callable[[Any], Any],
        keys: list[Any],
        views: list[np.ndarray[Any, Any]],
    ) -> None: ...
    def write_indices(
        self,
        get: Callable[[int], Any],
        indices: np.ndarray[Any, Any],
        views: list[np.ndarray[Any, Any]],
    ) -> None: ...
    def write_exact(
        self,
        get: Callable[[Any], Any],
        keys: list[Any],
        views: list[np.ndarray[Any, Any]],
        kept: list[Any],
        leaf_types: tuple[type, ...],
    ) -> int: ...
    def write_stream(
        self,
        it: Iterator[Any],
        first: int,
        rows: int,
        views: list[np.ndarray[Any, Any]],
    ) -> int: ...

def copy_rows(dst: np.ndarray[Any, Any], src: Any, rows: int) -> None: ...
def stack_rows(
    dst: np.ndarray[Any, Any], arrays: list[np.ndarray[Any, Any]]
) -> bool: ...
