"""8 workers over 2 parquet files against 8 workers over 8 files (the same
rows): fastq.ParquetRows deals out row groups and row ranges where there
are fewer files than workers, so none idles. A reader that gives each
worker whole files (files[id::num_workers]) is measured beside it: over 2
files, 6 of its 8 workers idle. Prints rows/s for each, best of three.

    python benchmarks/fewer_shards.py [--workers 8] [--rows 400000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import fastq


def write(folder: Path, files: int, rows: int) -> list[str]:
    paths = []
    per_file = rows // files
    for f in range(files):
        ids = np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64)
        features = np.random.default_rng(f).random((per_file, 16), np.float32)
        table = pa.table({"id": ids, **{f"x{i}": features[:, i] for i in range(16)}})
        path = folder / f"{files}-part-{f}.parquet"
        pq.write_table(table, path, row_group_size=max(1, per_file // 8))
        paths.append(str(path))
    return paths


class WholeFiles:
    """A reader that shards by whole files, as most do."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = fastq.get_worker_info()
        assert info is not None
        for path in self.files[info.id :: info.num_workers]:
            table = pq.read_table(path)
            columns = [table.column(n).to_numpy() for n in table.column_names]
            for i in range(table.num_rows):
                yield {n: c[i] for n, c in zip(table.column_names, columns)}


def rows_per_s(source: Any, workers: int) -> float:
    best = 0.0
    with fastq.Prefetcher(source, batch_size=256, workers=workers, seed=0) as pf:
        for _ in pf:  # started, slots sized
            pass
        for _ in range(3):
            t0 = time.perf_counter()
            n = sum(len(b["id"]) for b in pf)
            best = max(best, n / (time.perf_counter() - t0))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=400_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        eight = write(folder, 8, args.rows)
        two = write(folder, 2, args.rows)
        results = {
            "ParquetRows, 8 files": rows_per_s(fastq.ParquetRows(eight), args.workers),
            "ParquetRows, 2 files": rows_per_s(fastq.ParquetRows(two), args.workers),
            "whole files, 8 files": rows_per_s(WholeFiles(eight), args.workers),
            "whole files, 2 files": rows_per_s(WholeFiles(two), args.workers),
        }
    base = results["ParquetRows, 8 files"]
    for name, rate in results.items():
        print(f"{name:24s} {rate:12,.0f} rows/s  {rate / base:5.2f}x")


if __name__ == "__main__":
    main()
