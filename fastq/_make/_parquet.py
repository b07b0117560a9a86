"""ParquetRows: a stream of parquet files' rows that splits its files, and
their row groups and rows where there are fewer than workers, so that no
worker is left idle."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ConfigError
from ._worker_info import get_worker_info

# A unit of work: rows [start, stop) of row group `group` of file `file`
# (group -1: the whole file, row group by row group).
_Unit = tuple[int, int, int, int]


class ParquetRows:
    """The rows of parquet files, as a stream source for ``Prefetcher`` (or
    a DataLoader's iterable dataset): each row a dict of its columns'
    values, sharded across the ranks and the workers its iterators see
    (``get_worker_info()``). With at least as many files as workers, each
    reads whole files; with fewer, the row groups are dealt out, and with
    fewer row groups than workers, row groups are cut into row ranges, so
    every worker reads its share of the rows. Its iterators offer
    ``skip(n)``: a resumed state passes over the delivered rows without
    reading them.

    Parameters
    ----------
    files : sequence of str
        Parquet files, in their order.
    columns : sequence of str, optional
        The columns to read (default: all).

    Raises
    ------
    ConfigError
        No files, or pyarrow is not installed (at the first iteration).
    """

    def __init__(self, files: Sequence[str], columns: Sequence[str] | None = None):
        self.files = [str(f) for f in files]
        if not self.files:
            raise ConfigError("files=[]: expected at least one parquet file")
        self.columns = None if columns is None else list(columns)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        share, total = _place()
        units = self.units(total)
        return _Rows(self, units[share::total])

    def units(self, shares: int) -> list[_Unit]:
        """The work split into at least ``shares`` units where the rows
        allow: whole files, else row groups, else row ranges."""
        if len(self.files) >= shares:
            return [(f, -1, 0, -1) for f in range(len(self.files))]
        pq = _parquet()
        units: list[_Unit] = []
        for f, path in enumerate(self.files):
            meta = pq.ParquetFile(path).metadata
            for g in range(meta.num_row_groups):
                units.append((f, g, 0, meta.row_group(g).num_rows))
        while len(units) < shares:
            # Halve the largest unit (the first of equals): deterministic.
            k = max(range(len(units)), key=lambda i: units[i][3] - units[i][2])
            f, g, start, stop = units[k]
            if stop - start < 2:
                break  # fewer rows than workers
            middle = (start + stop) // 2
            units[k : k + 1] = [(f, g, start, middle), (f, g, middle, stop)]
        return units


class _Rows:
    """One worker's iterator: its units' rows in order."""

    def __init__(self, source: ParquetRows, units: list[_Unit]) -> None:
        self.source = source
        self.units = units
        self.next_unit = 0
        self.skip_rows = 0  # rows of the next unit to pass over
        self.current: Iterator[dict[str, Any]] | None = None

    def __iter__(self) -> _Rows:
        return self

    def __next__(self) -> dict[str, Any]:
        while True:
            if self.current is not None:
                row = next(self.current, None)
                if row is not None:
                    return row
                self.current = None
            if self.next_unit == len(self.units):
                raise StopIteration
            unit = self.units[self.next_unit]
            self.next_unit += 1
            skip, self.skip_rows = self.skip_rows, 0
            self.current = self._read(unit, skip)

    def skip(self, n: int) -> None:
        """Passes over n rows, reading only the metadata of whole units."""
        pq = _parquet()
        while n > 0 and self.current is None and self.next_unit < len(self.units):
            f, g, start, stop = self.units[self.next_unit]
            if g < 0:
                rows = pq.ParquetFile(self.source.files[f]).metadata.num_rows
            else:
                rows = stop - start
            if n < rows:
                self.skip_rows = n
                return
            n -= rows
            self.next_unit += 1
        for _ in range(n):  # inside a unit already begun
            next(self)

    def _read(self, unit: _Unit, skip: int) -> Iterator[dict[str, Any]]:
        f, g, start, stop = unit
        pq = _parquet()
        reader = pq.ParquetFile(self.source.files[f])
        groups = range(reader.metadata.num_row_groups) if g < 0 else [g]
        for group in groups:
            table = reader.read_row_group(group, columns=self.source.columns)
            if g >= 0:
                table = table.slice(start, stop - start)
            if skip >= table.num_rows:
                skip -= table.num_rows
                continue
            table = table.slice(skip)
            skip = 0
            names = table.column_names
            columns = [table.column(n).to_numpy() for n in names]
            for i in range(table.num_rows):
                yield {n: c[i] for n, c in zip(names, columns)}


def _place() -> tuple[int, int]:
    """(this iterator's share, the shares): its rank's workers after the
    ranks before, as get_worker_info() (fastq's, else torch's) tells."""
    info = get_worker_info()
    if info is not None:
        return (
            info.rank * info.num_workers + info.id,
            info.world_size * info.num_workers,
        )
    data = sys.modules.get("torch.utils.data")
    torch_info = None if data is None else data.get_worker_info()
    if torch_info is not None:
        return torch_info.id, torch_info.num_workers
    return 0, 1


def _parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "fastq.ParquetRows reads parquet with pyarrow, which is not "
            "installed: pip install pyarrow"
        ) from None
    return pq


__all__ = ["ParquetRows"]
