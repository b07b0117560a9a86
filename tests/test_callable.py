"""Callable sources: each worker iterates source(); the stream ends when
every worker's iterator ends; endless ones run until close()."""

from __future__ import annotations

import collections
import os
import time
from typing import Any

import numpy as np
import pytest
from helpers import (
    CountingBatches,
    DiesAtOnce,
    FailsAtOnce,
    NoBatches,
    ShardedFiles,
)

import fastq

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("ordered", [True, False])
def test_every_worker_batch_arrives_once(
    started_by: dict[str, str], ordered: bool
) -> None:
    workers, per_worker = 3, 40
    with fastq.Prefetcher(
        CountingBatches(per_worker),
        workers=workers,
        slots=2,
        ordered=ordered,
        **started_by,
    ) as pf:
        seen = collections.defaultdict(list)
        for ids, nums in pf:
            assert len(set(ids.tolist())) == 1
            seen[int(ids[0])].append(nums.copy())
    assert sorted(seen) == list(range(workers))
    for batches in seen.values():
        got = np.concatenate(batches)
        np.testing.assert_array_equal(got, np.arange(per_worker * 4))  # in order


def test_each_for_loop_is_a_new_pass() -> None:
    with fastq.Prefetcher(CountingBatches(5), workers=2, start_method="fork") as pf:
        assert sum(1 for _ in pf) == 10
        assert sum(1 for _ in pf) == 10


def test_breaking_a_pass_restarts_the_iterators() -> None:
    with fastq.Prefetcher(
        CountingBatches(50), workers=2, slots=3, start_method="fork"
    ) as pf:
        for k, _ in enumerate(pf):
            if k == 3:
                break
        firsts = collections.Counter()
        total = 0
        for ids, nums in pf:
            total += 1
            if nums[0] == 0:
                firsts[int(ids[0])] += 1
        assert total == 100
        assert firsts == {0: 1, 1: 1}


def test_endless_source_runs_until_close() -> None:
    pf = fastq.Prefetcher(
        CountingBatches(0, endless=True), workers=2, start_method="fork"
    )
    with pf:
        for k, _ in enumerate(pf):
            if k == 500:
                break
    assert pf.closed


def test_smaller_batches_are_allowed() -> None:
    def shrinking():  # type: ignore[no-untyped-def]
        for rows in (4, 3, 1):
            yield np.zeros((rows, 2), np.float32)

    with fastq.Prefetcher(shrinking, workers=1, start_method="fork") as pf:
        assert [b.shape[0] for b in pf] == [4, 3, 1]


def test_bigger_batch_than_the_first_is_a_spec_error() -> None:
    def growing():  # type: ignore[no-untyped-def]
        for rows in (2, 3):
            yield np.zeros((rows, 2), np.float32)

    with fastq.Prefetcher(growing, workers=1, start_method="fork") as pf:
        with pytest.raises(fastq.SpecError, match="3 rows, more than the 2"):
            list(pf)


def test_len_is_undefined_for_callables() -> None:
    with fastq.Prefetcher(CountingBatches(1), workers=1, start_method="fork") as pf:
        with pytest.raises(TypeError):
            len(pf)


def test_a_callable_source_never_runs_in_the_consumer(start_method: str) -> None:
    """Without spec=, the spec comes from worker 0's first batch, which is
    delivered; source() never runs in this process, so a generator that
    shards itself with get_worker_info() (never None there) just works."""
    with fastq.Prefetcher(ShardedFiles(10), workers=3, start_method=start_method) as pf:
        for _ in range(2):
            files, pids = zip(*((int(f[0]), int(p[0])) for f, p in pf))
            assert sorted(files) == list(range(10)), "a batch was lost or repeated"
            assert os.getpid() not in pids


def test_a_failure_before_the_first_batch_is_raised_at_construction() -> None:
    with pytest.raises(fastq.WorkerError, match="no such shard") as info:
        fastq.Prefetcher(FailsAtOnce(), workers=2, start_method="forkserver")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(fastq.ConfigError, match="yielded no item in any worker"):
        fastq.Prefetcher(NoBatches(), workers=2, start_method="forkserver")
    with pytest.raises(fastq.WorkerDied, match="worker 0 .* SIGKILL"):
        fastq.Prefetcher(DiesAtOnce(), workers=2, start_method="fork")


class _SlowFirstBatch:
    def __call__(self) -> Any:
        time.sleep(30)
        yield np.zeros(2)


def _failing_init(worker_id: int) -> None:
    raise OSError(f"cannot open the shard of worker {worker_id}")


def test_construction_waits_for_the_first_batch_within_timeout() -> None:
    t0 = time.monotonic()
    with pytest.raises(fastq.FetchTimeout, match="worker 0 made no first batch"):
        fastq.Prefetcher(_SlowFirstBatch(), workers=1, timeout=0.5, start_method="fork")
    assert time.monotonic() - t0 < 5


def test_worker_init_failing_in_worker_0_is_raised_at_construction() -> None:
    with pytest.raises(fastq.WorkerError, match="cannot open the shard of worker 0"):
        fastq.Prefetcher(
            ShardedFiles(4), workers=2, worker_init=_failing_init, start_method="fork"
        )


def fails_at_worker_1s_third_batch() -> Any:
    info = fastq.get_worker_info()
    assert info is not None
    for k in range(5):
        if info.id == 1 and k == 2:
            raise ValueError("corrupt shard")
        yield np.full((2, 3), info.id * 10 + k, dtype=np.int32)


def test_a_stream_error_names_the_batch_in_the_workers_own_stream(
    started_by: dict[str, str],
) -> None:
    """Not the ring's count of batches, which depends on timing: the
    place in the failing worker's own stream."""
    source = fails_at_worker_1s_third_batch
    with fastq.Prefetcher(source, workers=2, **started_by) as pf:
        seen = []
        with pytest.raises(fastq.WorkerError) as caught:
            for batch in pf:
                seen.append(int(batch[0, 0]))
    where = "batch 2 of worker 1's stream in this pass: corrupt shard"
    assert where in str(caught.value)
    assert caught.value.worker == 1 and caught.value.task == -1
    assert [k for k in seen if k >= 10] == [10, 11]
