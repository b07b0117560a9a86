"""A stream resumed on another number of ranks, where fastq controls the
split (the rank and worker its get_worker_info() reports, which a source
such as fastq.ParquetRows shards by): the states every rank saved at one
step, loaded as a list by each new rank, deal the old ranks' workers'
streams out to the new ranks, and the rest of the pass comes once across
them. Ranks here are Prefetchers given rank= and world_size=, one after
the other, as each rank of a job would make its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastq

SHARDS = 12
STOP = 3  # batches each rank delivers before the checkpoint


def length(shard: int) -> int:
    return 2 + (shard * 5) % 7


def every_sample() -> list[int]:
    return [s * 100 + k for s in range(SHARDS) for k in range(length(s))]


def samples() -> Iterator[np.ndarray]:
    """Shard s of SHARDS is read by worker (rank, id) when s = rank *
    num_workers + id modulo every worker of every rank."""
    info = fastq.get_worker_info()
    assert info is not None
    share = info.rank * info.num_workers + info.id
    for s in range(share, SHARDS, info.world_size * info.num_workers):
        for k in range(length(s)):
            yield np.array([s * 100 + k])


def rank(
    source: Any, r: int, world: int, workers: int, state: Any = None
) -> fastq.Prefetcher:
    return fastq.Prefetcher(
        source,
        batch_size=2,
        workers=workers,
        rank=r,
        world_size=world,
        seed=3,
        state=state,
        copy=True,
    )


def ids(batches: list[Any]) -> list[int]:
    return [int(i) for b in batches for i in np.asarray(b).reshape(-1)]


def until_checkpoint(pf: fastq.Prefetcher) -> tuple[list[int], dict[str, Any]]:
    it = iter(pf)
    got = [next(it) for _ in range(STOP)]
    state = json.loads(json.dumps(pf.state_dict()))
    del it
    return ids(got), state


def test_two_ranks_resume_on_one() -> None:
    before, states = [], []
    for r in range(2):
        with rank(samples, r, 2, 2) as pf:
            got, state = until_checkpoint(pf)
        before += got
        states.append(state)
    with rank(samples, 0, 1, 3, states) as pf:
        rest = ids(list(pf))
        whole = ids(list(pf))  # the next pass: every old rank's streams
    assert sorted(before + rest) == sorted(every_sample())
    assert sorted(whole) == sorted(every_sample())


def test_one_rank_resumes_on_two() -> None:
    with rank(samples, 0, 1, 2) as pf:
        before, state = until_checkpoint(pf)
    rests = []
    for r in range(2):
        with rank(samples, r, 2, 1, [state]) as pf:
            rests.append(ids(list(pf)))
    assert rests[0] and rests[1]
    assert sorted(before + rests[0] + rests[1]) == sorted(every_sample())
    with pytest.raises(fastq.ConfigError, match=r"world_size'\]=1.*world_size=2"):
        rank(samples, 0, 2, 1, state)


def test_parquet_rows_resume_from_two_ranks_on_one(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    files = []
    for f in range(3):
        table = pa.table({"id": np.arange(f * 100, f * 100 + 30, dtype=np.int64)})
        files.append(str(tmp_path / f"{f}.parquet"))
        pq.write_table(table, files[-1], row_group_size=10)
    source = fastq.ParquetRows(files)
    before, states = [], []
    for r in range(2):
        with rank(source, r, 2, 2) as pf:
            it = iter(pf)
            before += [int(i) for _ in range(STOP) for i in next(it)["id"]]
            states.append(pf.state_dict())
            del it
    with rank(source, 0, 1, 2, states) as pf:
        rest = [int(i) for b in pf for i in b["id"]]
    want = [f * 100 + k for f in range(3) for k in range(30)]
    assert sorted(before + rest) == want


def test_states_that_miss_a_rank_are_refused_naming_it() -> None:
    with rank(samples, 0, 2, 2) as pf:
        _, state = until_checkpoint(pf)
    with pytest.raises(fastq.ConfigError, match=r"lack lanes \[\[1, 0\], \[1, 1\]\]"):
        rank(samples, 0, 1, 2, [state])
