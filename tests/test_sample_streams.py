"""Sample streams: a stream source with batch_size yields samples. Each
worker iterates its own copy (sharding itself with get_worker_info()) and
writes every sample straight into its row of a slot; the stream ends when
every worker's has; each worker's last batch may be short, and drop_last
drops those. A shuffle buffer mixes each worker's samples, reproducibly."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastq

pytestmark = pytest.mark.timeout(60)

SAMPLES = 50
BATCH = 4


def sample(i: int) -> tuple[np.int64, np.ndarray]:
    return np.int64(i), np.full(3, i, dtype=np.float32)


class Sharded:
    """An iterable object: each worker takes every num_workers-th sample of
    range(n) (a generator function does the same: see `sharded`)."""

    def __init__(self, n: int = SAMPLES) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[np.int64, np.ndarray]]:
        info = fastq.get_worker_info()
        assert info is not None
        for i in range(info.id, self.n, info.num_workers):
            yield sample(i)


def sharded() -> Iterator[tuple[np.int64, np.ndarray]]:
    return iter(Sharded())


def ids_of(pf: fastq.Prefetcher) -> list[list[int]]:
    """One pass, as each batch's sample ids; the rows checked bit for bit."""
    batches = []
    for ids, rows in pf:
        np.testing.assert_array_equal(rows, np.repeat(ids, 3).reshape(-1, 3))
        batches.append(ids.tolist())
    return batches


def per_worker(batches: list[list[int]], workers: int) -> dict[int, list[int]]:
    """Each worker's samples in the order delivered (worker = id % workers
    for `Sharded`)."""
    out: dict[int, list[int]] = collections.defaultdict(list)
    for batch in batches:
        assert len({i % workers for i in batch}) == 1, "a batch mixes workers"
        out[batch[0] % workers].extend(batch)
    return out


@pytest.mark.parametrize("source", [Sharded(), sharded], ids=["iterable", "callable"])
def test_every_sample_once_in_rows_each_workers_in_order(
    started_by: dict[str, str], source: Any
) -> None:
    workers = 2
    with fastq.Prefetcher(
        source, batch_size=BATCH, workers=workers, **started_by
    ) as pf:
        batches = ids_of(pf)
        assert pf.spec.rows == BATCH
    streams = per_worker(batches, workers)
    for w in range(workers):
        assert streams[w] == list(range(w, SAMPLES, workers))
    # 25 samples a worker: six full batches and a short one of 1 each.
    assert sorted(len(b) for b in batches) == [1, 1] + [BATCH] * 12


def test_drop_last_drops_each_workers_short_batch_only(
    started_by: dict[str, str],
) -> None:
    with fastq.Prefetcher(
        Sharded(), batch_size=BATCH, workers=2, drop_last=True, **started_by
    ) as pf:
        batches = ids_of(pf)
    assert [len(b) for b in batches] == [BATCH] * 12
    streams = per_worker(batches, 2)
    assert streams[0] == list(range(0, 48, 2)) and streams[1] == list(range(1, 48, 2))


def test_every_pass_is_the_whole_stream_again() -> None:
    with fastq.Prefetcher(Sharded(), batch_size=BATCH, workers=2) as pf:
        first = sorted(i for b in ids_of(pf) for i in b)
        for k, _ in enumerate(pf):
            if k == 2:
                break
        again = sorted(i for b in ids_of(pf) for i in b)
    assert first == again == list(range(SAMPLES))


class Uneven:
    """Worker 0's stream is empty (the spec comes from another worker's
    first sample); worker 1 has everything."""

    def __iter__(self) -> Iterator[tuple[np.int64, np.ndarray]]:
        info = fastq.get_worker_info()
        assert info is not None
        if info.id == 1:
            yield from (sample(i) for i in range(SAMPLES))


def test_a_stream_that_ends_early_in_one_worker(started_by: dict[str, str]) -> None:
    with fastq.Prefetcher(Uneven(), batch_size=BATCH, workers=2, **started_by) as pf:
        first = [i for b in ids_of(pf) for i in b]
        second = [i for b in ids_of(pf) for i in b]
    assert first == second == list(range(SAMPLES))


class FailsAt:
    """Worker 1 raises at its sample `at`; worker 0 runs to its end."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __iter__(self) -> Iterator[tuple[np.int64, np.ndarray]]:
        info = fastq.get_worker_info()
        assert info is not None
        for k, i in enumerate(range(info.id, SAMPLES, 2)):
            if info.id == 1 and k == self.at:
                raise ValueError(f"unreadable record {i}")
            yield sample(i)


def test_an_exception_arrives_at_its_batch_naming_the_sample(
    started_by: dict[str, str],
) -> None:
    """Sample 6 of worker 1 is row 2 of its second batch: every batch before
    it arrives whole, then the error, naming the place, closes the
    Prefetcher (as any worker's exception does)."""
    with fastq.Prefetcher(FailsAt(6), batch_size=BATCH, workers=2, **started_by) as pf:
        seen: list[int] = []
        with pytest.raises(fastq.WorkerError) as caught:
            for ids, _ in pf:
                seen.extend(ids.tolist())
        assert pf.closed
    assert "unreadable record 13" in str(caught.value)
    assert "sample 6 of worker 1's stream" in str(caught.value)
    assert [i for i in seen if i % 2] == [1, 3, 5, 7]
    zeros = [i for i in seen if i % 2 == 0]
    assert zeros == list(range(0, 2 * len(zeros), 2))


class OneOdd:
    """Sample 5 alone has another shape."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for k in range(10):
            yield {"x": np.zeros(4 if k == 5 else 3, dtype=np.float32)}


@pytest.mark.parametrize("worker_method", ["process", "thread"])
def test_through_a_shuffle_buffer_an_error_names_the_streams_own_place(
    worker_method: str,
) -> None:
    """The place named is in the worker's stream, not in the shuffled order
    out: the sample the stream failed to make, or the one that did not
    fit, wherever the buffer put it."""
    kw: dict[str, Any] = {"shuffle_buffer": 8, "seed": 1}
    kw["worker_method"] = worker_method
    with fastq.Prefetcher(FailsAt(6), batch_size=BATCH, workers=2, **kw) as pf:
        with pytest.raises(fastq.WorkerError, match="sample 6 of worker 1's stream"):
            for _ in pf:
                pass
    with fastq.Prefetcher(OneOdd(), batch_size=2, workers=1, **kw) as pf:
        with pytest.raises(fastq.SpecError, match="sample 5 of worker 0's stream"):
            for _ in pf:
                pass


class ChangesShape:
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for k in range(10):
            yield {"x": np.zeros(3 if k < 5 else 4, dtype=np.float32)}


def test_a_sample_unlike_the_first_names_the_field(
    started_by: dict[str, str],
) -> None:
    with fastq.Prefetcher(ChangesShape(), batch_size=2, workers=1, **started_by) as pf:
        with pytest.raises(fastq.SpecError, match=r"'x'.*\(3,\).*\(4,\)") as caught:
            for _ in pf:
                pass
    assert "sample 5 of worker 0's stream" in str(caught.value)


def test_a_declared_spec_sizes_the_rows_without_a_first_sample() -> None:
    with fastq.Prefetcher(
        Sharded(),
        batch_size=BATCH,
        workers=2,
        spec=[((), np.int64), ((3,), np.float32)],
    ) as pf:
        assert pf.spec.rows == BATCH
        assert sorted(i for b in ids_of(pf) for i in b) == list(range(SAMPLES))


# ------------------------------------------------------------ shuffle buffer


def shuffled(seed: int, workers: int = 2, **kw: Any) -> list[list[list[int]]]:
    """Two passes through a shuffle buffer of 8, as batches of sample ids."""
    with fastq.Prefetcher(
        Sharded(), batch_size=BATCH, workers=workers, shuffle_buffer=8, seed=seed, **kw
    ) as pf:
        return [ids_of(pf), ids_of(pf)]


def test_a_shuffle_buffer_delivers_every_sample_once_mixed(
    started_by: dict[str, str],
) -> None:
    first, second = shuffled(7, **started_by)
    for batches in (first, second):
        streams = per_worker(batches, 2)
        for w in (0, 1):
            mine = list(range(w, SAMPLES, 2))
            assert sorted(streams[w]) == mine and streams[w] != mine
    # Another pass, another shuffle of each worker's samples.
    assert per_worker(first, 2) != per_worker(second, 2)


def test_a_shuffle_is_the_same_for_the_same_seed_and_workers() -> None:
    """Whatever the worker method or start: each worker's order is a
    function of (seed, pass, rank, worker id)."""
    a = shuffled(7, start_method="fork")
    b = shuffled(7, worker_method="thread")
    assert [per_worker(p, 2) for p in a] == [per_worker(p, 2) for p in b]
    c = shuffled(8, start_method="fork")
    assert per_worker(a[0], 2) != per_worker(c[0], 2)


def test_a_buffer_larger_than_the_stream_still_ends() -> None:
    with fastq.Prefetcher(
        Sharded(), batch_size=BATCH, workers=2, shuffle_buffer=1000, seed=1
    ) as pf:
        assert sorted(i for b in ids_of(pf) for i in b) == list(range(SAMPLES))


# -------------------------------------------------------------------- state


@pytest.mark.parametrize("shuffle_buffer", [None, 8])
def test_a_state_resumes_the_rest_of_the_pass_with_any_batch_size(
    shuffle_buffer: int | None,
) -> None:
    """Stopped in the second pass, resumed with another batch size: each
    worker's samples are those of a run that never stopped, in its order
    (with a shuffle buffer: the second pass's shuffle, drawn again)."""
    kw: dict[str, Any] = {"workers": 2, "shuffle_buffer": shuffle_buffer, "seed": 3}
    with fastq.Prefetcher(Sharded(), batch_size=BATCH, **kw) as pf:
        ids_of(pf)
        never_stopped = per_worker(ids_of(pf), 2)
    with fastq.Prefetcher(Sharded(), batch_size=BATCH, **kw) as pf:
        ids_of(pf)
        seen: list[int] = []
        for k, (ids, _) in enumerate(pf):
            seen.extend(ids.tolist())
            if k == 4:
                break
        state = json.loads(json.dumps(pf.state_dict()))
    assert state["unit"] == "samples" and state["pass"] == 1
    assert sum(state["items"]) == len(seen)
    with fastq.Prefetcher(Sharded(), batch_size=3, state=state, **kw) as pf:
        rest = [i for b in ids_of(pf) for i in b]
    for w in (0, 1):
        mine = [i for i in seen if i % 2 == w] + [i for i in rest if i % 2 == w]
        assert mine == never_stopped[w]


def late_worker_1(worker_id: int) -> None:
    if worker_id == 1:
        time.sleep(1.0)  # the consumer breaks and starts pass 1 meanwhile


@pytest.mark.parametrize("worker_method", ["process", "thread"])
@pytest.mark.parametrize(
    ("shuffle_buffer", "items"),
    [(None, None), (8, None), (None, [4, 4]), (8, [4, 4])],
    ids=["plain", "shuffled", "resumed", "shuffled-resumed"],
)
def test_a_worker_that_starts_after_a_break_joins_the_new_pass_whole(
    worker_method: str, shuffle_buffer: int | None, items: list[int] | None
) -> None:
    """Worker 1 starts after the consumer broke out of pass 0: its first
    sample and a state's items belong to pass 0, so pass 1 is its whole
    stream, in pass 1's order (a shuffle buffer's order for pass 1)."""
    kw: dict[str, Any] = {
        "batch_size": BATCH,
        "workers": 2,
        "shuffle_buffer": shuffle_buffer,
        "seed": 3,
        "worker_method": worker_method,
    }
    with fastq.Prefetcher(Sharded(), **kw) as pf:
        state = pf.state_dict()
        ids_of(pf)
        never_stopped = per_worker(ids_of(pf), 2)
    if items is not None:
        state["items"] = items
    with fastq.Prefetcher(
        Sharded(), state=state, worker_init=late_worker_1, **kw
    ) as pf:
        for _ in pf:
            break
        assert per_worker(ids_of(pf), 2) == never_stopped


def test_a_state_of_whole_batches_is_refused_by_a_sample_stream() -> None:
    def batches() -> Iterator[np.ndarray]:
        yield np.zeros((BATCH, 3), dtype=np.float32)

    with fastq.Prefetcher(batches, workers=1, worker_method="thread") as pf:
        state = pf.state_dict()
    with pytest.raises(
        fastq.ConfigError, match=r"state\['unit'\]='batches'.*batch_size"
    ):
        fastq.Prefetcher(Sharded(), batch_size=BATCH, workers=1, state=state)


def test_a_state_needs_the_same_shuffle_buffer_and_seed() -> None:
    with fastq.Prefetcher(
        Sharded(), batch_size=BATCH, workers=2, shuffle_buffer=8, seed=3
    ) as pf:
        state = pf.state_dict()
    for kw, named in (
        ({"shuffle_buffer": 9, "seed": 3}, r"state\['shuffle_buffer'\]=8.*=9"),
        ({"shuffle_buffer": 8, "seed": 4}, r"state\['seed'\]=3.*seed=4"),
    ):
        with pytest.raises(fastq.ConfigError, match=named):
            fastq.Prefetcher(Sharded(), batch_size=BATCH, workers=2, state=state, **kw)


# ------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"source": sharded()},
            r"is an iterator.*source=make_batches, not make_batches\(\)",
        ),
        ({"source": sharded, "shuffle": True}, r"shuffle=True.*shuffle_buffer=N"),
        ({"source": sharded, "drop_last": True}, r"drop_last=True.*batch_size=B"),
        ({"source": sharded, "shuffle_buffer": 8}, r"shuffle_buffer=8.*batch_size=B"),
        (
            {"source": sharded, "batch_size": 4, "shuffle_buffer": 0},
            r"shuffle_buffer=0",
        ),
        ({"source": 42, "batch_size": 4}, r"expected a map-style dataset"),
    ],
)
def test_what_cannot_make_a_stream_is_refused_naming_the_fix(
    kw: dict[str, Any], match: str
) -> None:
    with pytest.raises(fastq.ConfigError, match=match):
        fastq.Prefetcher(workers=1, **kw)


def test_a_map_style_source_is_shuffled_whole_not_through_a_buffer() -> None:
    with pytest.raises(fastq.ConfigError, match=r"shuffle_buffer=8.*shuffle=True"):
        fastq.Prefetcher([sample(0)] * 8, batch_size=2, workers=1, shuffle_buffer=8)


# -------------------------------------------------------------------- torch


def test_a_torch_iterable_dataset_shards_itself_as_under_dataloader() -> None:
    """torch.utils.data.get_worker_info() answers in process workers."""
    torch_data = pytest.importorskip("torch.utils.data")

    class TorchSharded(torch_data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[tuple[np.int64, np.ndarray]]:
            info = torch_data.get_worker_info()
            assert info is not None
            for i in range(info.id, SAMPLES, info.num_workers):
                yield sample(i)

        def __len__(self) -> int:
            return SAMPLES

    with fastq.Prefetcher(
        TorchSharded(), batch_size=BATCH, workers=2, start_method="fork"
    ) as pf:
        assert sorted(i for b in ids_of(pf) for i in b) == list(range(SAMPLES))


def test_torch_worker_info_seed_is_each_workers_own() -> None:
    """As under DataLoader: torch's WorkerInfo.seed is the worker's
    torch.initial_seed(), another in each worker."""
    torch = pytest.importorskip("torch")

    class Seeds(torch.utils.data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[np.ndarray]:
            info = torch.utils.data.get_worker_info()
            yield np.array([info.id, info.seed, torch.initial_seed()], dtype=np.int64)

    with fastq.Prefetcher(Seeds(), batch_size=1, workers=2, start_method="fork") as pf:
        rows = {int(b[0, 0]): b[0, 1:].tolist() for b in pf}
    assert sorted(rows) == [0, 1]
    assert all(seed == initial for seed, initial in rows.values())
    assert rows[0][0] != rows[1][0]


def test_a_torch_iterable_dataset_is_refused_to_several_thread_workers() -> None:
    """torch's get_worker_info() is None in a thread: every thread would
    yield the whole dataset. One thread worker is a whole stream, once."""
    torch_data = pytest.importorskip("torch.utils.data")

    class Whole(torch_data.IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[tuple[np.int64, np.ndarray]]:
            return iter(Sharded())

    with pytest.raises(
        fastq.ConfigError,
        match=r"worker_method='thread' with workers=2.*Whole.*worker_method='process'",
    ):
        fastq.Prefetcher(Whole(), batch_size=BATCH, workers=2, worker_method="thread")
    with fastq.Prefetcher(
        Whole(), batch_size=BATCH, workers=1, worker_method="thread"
    ) as pf:
        assert [i for b in ids_of(pf) for i in b] == list(range(SAMPLES))
