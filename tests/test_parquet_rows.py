"""fastq.ParquetRows: fewer parquet files than workers leave no worker idle
(row groups, then row ranges, are dealt out), every row comes once, and a
state resumes on other numbers of workers, passing over the delivered rows
without reading them; a source that cannot split its shards is named in
one warning with both counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastq

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

ROWS = 40  # per file


def write(folder: Path, files: int, row_group: int = ROWS) -> list[str]:
    paths = []
    for f in range(files):
        ids = np.arange(f * 1000, f * 1000 + ROWS, dtype=np.int64)
        table = pa.table({"id": ids, "x": ids.astype(np.float32) / 2})
        path = folder / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(str(path))
    return paths


def all_ids(files: int) -> list[int]:
    return [f * 1000 + k for f in range(files) for k in range(ROWS)]


def test_two_files_are_split_among_eight_workers(tmp_path: Path) -> None:
    rows = fastq.ParquetRows(write(tmp_path, 2))
    units = rows.units(8)
    assert len(units) == 8
    assert sum(stop - start for _, _, start, stop in units) == 2 * ROWS
    with fastq.Prefetcher(rows, batch_size=4, workers=8, seed=0) as pf:
        seen = [int(i) for b in pf for i in b["id"]]
        made = [w["batches"] for w in pf.stats()["workers"]]
    assert sorted(seen) == all_ids(2)
    assert all(n > 0 for n in made), f"idle workers: {made}"


def test_as_many_files_as_workers_are_read_whole(tmp_path: Path) -> None:
    rows = fastq.ParquetRows(write(tmp_path, 4, row_group=10), columns=["id"])
    assert rows.units(4) == [(f, -1, 0, -1) for f in range(4)]
    with fastq.Prefetcher(rows, batch_size=4, workers=2, seed=0, copy=True) as pf:
        batches = list(pf)
    assert set(batches[0]) == {"id"}
    assert sorted(int(i) for b in batches for i in b["id"]) == all_ids(4)


def test_a_state_resumes_on_other_worker_counts(tmp_path: Path) -> None:
    rows = fastq.ParquetRows(write(tmp_path, 2, row_group=10))

    def run(workers: int, state: Any = None, stop: int = -1) -> tuple[list[Any], Any]:
        out = []
        with fastq.Prefetcher(
            rows, batch_size=3, workers=workers, seed=1, state=state
        ) as pf:
            for b in pf:
                out.append([int(i) for i in b["id"]])
                if len(out) == stop:
                    return out, json.loads(json.dumps(pf.state_dict()))
        return out, None

    full, _ = run(3)
    head, state = run(3, stop=5)
    assert head == full[:5]
    for workers in (2, 4):
        assert run(workers, state)[0] == full[5:]


def test_an_hf_dataset_of_fewer_shards_than_workers_is_named_once(
    tmp_path: Path,
) -> None:
    datasets = pytest.importorskip("datasets")
    torch = pytest.importorskip("torch")
    from fastq.torch import DataLoader

    data = datasets.Dataset.from_dict({"id": list(range(12))})
    stream = data.to_iterable_dataset(num_shards=2)
    loader = DataLoader(stream, batch_size=2, num_workers=4)
    with pytest.warns(UserWarning, match=r"2 shards for 4 workers"):
        seen = sorted(int(i) for b in loader for i in b["id"])
    assert seen == list(range(12))
    del torch
