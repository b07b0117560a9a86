"""Module-level sources for tests (picklable under spawn and forkserver)."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

import fastq

IMAGE_SHAPE = (3, 5, 7)


def process_state(pid: int) -> str:
    """The one-letter state of a process in /proc ("R", "S", "T", "Z"...),
    or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running or sleeping, not a zombie (a forkserver worker is not our
    child, so a reaped-or-not check by waitpid would not do)."""
    return process_state(pid) not in ("", "Z")


def expected_image(i: int) -> np.ndarray[Any, Any]:
    """Sample i's image: every byte depends on i, so any mix-up shows."""
    base = np.arange(np.prod(IMAGE_SHAPE), dtype=np.int64).reshape(IMAGE_SHAPE)
    return ((base * 31 + i * 7919) % 251).astype(np.uint8)


class PatternDataset:
    """Sample i = (image(i), i, float(i) / 2): checkable bit for bit."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return expected_image(i), np.int64(i), np.float32(i) / 2


class DictDataset(PatternDataset):
    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        return {"image": expected_image(i), "index": i}


class ArrayDataset(PatternDataset):
    """A single array per sample (no tuple)."""

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        return np.full(4, i, dtype=np.int32)


class BatchedDataset(PatternDataset):
    """Offers __getitems__, the whole-batch path (list of samples)."""

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        return [self[i] for i in indices]


class FillDataset(PatternDataset):
    """Offers fill_batch, the zero-copy path: writes into the slot."""

    def fill_batch(self, indices: np.ndarray[Any, Any], out: tuple[Any, ...]) -> None:
        image, index, half = out
        for j, i in enumerate(indices):
            image[j] = expected_image(int(i))
        index[:] = indices
        half[:] = indices.astype(np.float32) / 2


def worker_info() -> fastq.WorkerInfo:
    """This worker's info; raises outside a worker, where a dataset that
    draws from ``get_worker_info().rng`` would fail."""
    info = fastq.get_worker_info()
    if info is None:
        raise RuntimeError("the dataset ran outside a fastq worker")
    return info


class RandomDataset:
    """Uses every source of randomness a worker offers (and runs only in
    workers: the training process never calls it)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        rng = worker_info().rng
        return (np.random.rand(2), np.float64(rng.random()), i)


class Augmented:
    """Sample i = (i, two draws of the batch's rng, one of `random`, one of
    `np.random`): runs only in a worker, as the augmentation of
    docs/usage.md does."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        rng = worker_info().rng
        return np.int64(i), rng.random(2), random.random(), np.random.random()


class AugmentedItems(Augmented):
    """The same samples through __getitems__."""

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        return [self[i] for i in indices]


class AugmentedFill(Augmented):
    """The same fields through fill_batch, drawn per batch."""

    def fill_batch(self, indices: np.ndarray[Any, Any], out: tuple[Any, ...]) -> None:
        index, draws, py, npr = out
        n = len(indices)
        index[:] = indices
        draws[:] = worker_info().rng.random((n, 2))
        py[:] = [random.random() for _ in range(n)]
        npr[:] = np.random.random(n)


class CallLog(PatternDataset):
    """PatternDataset that leaves a file in `directory` per call, naming
    the call, its sample indices, the calling process and thread, and the
    epoch of the batch being made (-1 outside a worker, where it then
    raises): a count of calls made in other processes. Read it with
    `calls()`."""

    def __init__(self, n: int, directory: str) -> None:
        super().__init__(n)
        self.directory = directory

    def log(self, what: str, indices: Any) -> None:
        info = fastq.get_worker_info()
        epoch = -1 if info is None else info.epoch
        keys = "_".join(str(int(i)) for i in indices)
        where = f"{os.getpid()}+{threading.get_ident()}+{epoch}"
        name = f"{what}+{keys}+{where}+{uuid.uuid4().hex}"
        with open(os.path.join(self.directory, name), "x"):
            pass
        worker_info().rng.random()  # as an augmentation draws

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        self.log("getitem", [i])
        return super().__getitem__(i)


class CallLogItems(CallLog):
    def __getitems__(self, indices: list[int]) -> list[tuple[Any, ...]]:
        self.log("getitems", indices)
        return [PatternDataset.__getitem__(self, i) for i in indices]


class CallLogFill(CallLog, FillDataset):
    def fill_batch(self, indices: np.ndarray[Any, Any], out: tuple[Any, ...]) -> None:
        self.log("fill", indices)
        super().fill_batch(indices, out)


class FillOnly:
    """fill_batch and no __getitem__: no sample to infer a spec from."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def fill_batch(self, indices: np.ndarray[Any, Any], out: tuple[Any, ...]) -> None:
        index, half = out
        index[:] = indices
        half[:] = indices.astype(np.float32) / 2


class Call(NamedTuple):
    what: str
    indices: list[int]
    pid: int
    thread: int
    epoch: int


def calls(directory: str) -> list[Call]:
    """The calls a CallLog recorded."""
    out = []
    for name in os.listdir(directory):
        what, keys, pid, thread, epoch, _ = name.split("+")
        indices = [int(k) for k in keys.split("_")]
        out.append(Call(what, indices, int(pid), int(thread), int(epoch)))
    return out


class NeedsArgs(Exception):
    """Its __init__ takes two arguments: plain unpickling would fail."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


class Unpicklable(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle this exception")


def make_exception(kind: str, i: int) -> BaseException:
    if kind == "needs-args":
        return NeedsArgs(3, f"bad sample {i}")
    if kind == "unpicklable":
        return Unpicklable(f"bad sample {i}")
    return ValueError(f"bad sample {i}")


class FailingDataset(PatternDataset):
    """Raises an exception of `kind` for one sample index."""

    def __init__(self, n: int, bad: int, kind: str = "value") -> None:
        super().__init__(n)
        self.bad = bad
        self.kind = kind

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        if i == self.bad:
            raise make_exception(self.kind, i)
        return super().__getitem__(i)


class WrongShapeDataset(PatternDataset):
    def __getitem__(self, i: int) -> tuple[Any, ...]:
        image, index, half = super().__getitem__(i)
        if i == 5:
            image = image[:, :2]
        return image, index, half


class WrongDtypeDataset(PatternDataset):
    def __getitem__(self, i: int) -> tuple[Any, ...]:
        image, index, half = super().__getitem__(i)
        if i == 5:
            half = np.float64(half)
        return image, index, half


class SlowDataset(PatternDataset):
    def __init__(self, n: int, delay: float) -> None:
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        time.sleep(self.delay)
        return super().__getitem__(i)


class StuckDataset(PatternDataset):
    """Never returns sample `stuck`: user code hung (a dead NFS mount, a lock)."""

    def __init__(self, n: int, stuck: int) -> None:
        super().__init__(n)
        self.stuck = stuck

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        if i == self.stuck:
            while True:
                time.sleep(3600)
        return super().__getitem__(i)


class SuicideDataset(PatternDataset):
    """Kills its own worker at one sample: a worker dying mid-batch."""

    def __init__(self, n: int, bad: int, signum: int) -> None:
        super().__init__(n)
        self.bad = bad
        self.signum = signum

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        if i == self.bad:
            os.kill(os.getpid(), self.signum)
            time.sleep(10)
        return super().__getitem__(i)


def expected_batch(indices: Any) -> tuple[Any, ...]:
    idx = np.asarray(indices, dtype=np.int64)
    return (
        np.stack([expected_image(int(i)) for i in idx]),
        idx,
        idx.astype(np.float32) / 2,
    )


class CountingBatches:
    """Callable source: each worker yields `per_worker` batches whose rows
    are (worker id, running number), then stops."""

    def __init__(self, per_worker: int, rows: int = 4, endless: bool = False) -> None:
        self.per_worker = per_worker
        self.rows = rows
        self.endless = endless

    def __call__(self) -> Iterator[tuple[Any, ...]]:
        info = fastq.get_worker_info()
        wid = -1 if info is None else info.id
        k = 0
        while self.endless or k < self.per_worker:
            ids = np.full(self.rows, wid, dtype=np.int64)
            nums = np.arange(k * self.rows, (k + 1) * self.rows, dtype=np.int64)
            yield ids, nums
            k += 1


def assert_whole_loop(got: list[Any], want_map_style: list[Any] | None) -> None:
    """Check the batches a loop gave, bit for bit: `want_map_style` when
    the source was map-style, else (None) the whole stream of each of two
    `CountingBatches(3)` workers, in any order of worker."""
    if want_map_style is not None:
        want = want_map_style
    else:  # each worker's stream whole; which task a worker took may vary
        got = sorted(got, key=lambda b: (int(b[0][0]), int(b[1][0])))
        want = [
            (np.full(4, w), np.arange(k * 4, k * 4 + 4))
            for w in range(2)
            for k in range(3)
        ]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert all(
            a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
            for a, b in zip(g, w)
        ), (g, w)


class ChecksumDataset:
    """Sample i = (a (8, 16) uint8 block filled with i % 251, i), with an
    occasional short random delay: cheap to produce and to verify."""

    def __init__(self, n: int, delay_every: int = 97, delay: float = 0.0005) -> None:
        self.n = n
        self.delay_every = delay_every
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        if self.delay and (i * 2654435761) % self.delay_every == 0:
            time.sleep(self.delay)
        return np.full((8, 16), i % 251, np.uint8), i


def checksum_ok(batch: tuple[Any, ...]) -> bool:
    block, index = batch
    return bool((block == (index % 251).astype(np.uint8)[:, None, None]).all())


class ShardedFiles:
    """Callable source that shards itself the natural way, with no None
    check: it works only where get_worker_info() answers. Each batch also
    carries the pid that made it."""

    def __init__(self, files: int, rows: int = 3) -> None:
        self.files = files
        self.rows = rows

    def __call__(self) -> Iterator[tuple[Any, ...]]:
        info = fastq.get_worker_info()
        for f in range(self.files)[info.id :: info.num_workers]:  # type: ignore[union-attr]
            yield (
                np.full(self.rows, f, dtype=np.int64),
                np.full(self.rows, os.getpid(), dtype=np.int64),
            )


class FailsAtOnce:
    """Callable source whose iterator raises before its first batch."""

    def __call__(self) -> Iterator[Any]:
        raise KeyError("no such shard")
        yield  # a generator function


class NoBatches:
    def __call__(self) -> Iterator[Any]:
        return iter(())


class DiesAtOnce:
    """Callable source whose worker is killed before its first batch."""

    def __call__(self) -> Iterator[Any]:
        os.kill(os.getpid(), 9)
        yield


# ------------------------------------------------------- process life


def ignore_sigterm(worker_id: int) -> None:
    """worker_init of user code that shields its worker from SIGTERM."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class SignalState(PatternDataset):
    """Sample i = the worker's signal state: (SIGTERM and SIGUSR2 at their
    default action, SIGINT ignored, SIGPIPE ignored as Python starts, the
    number of blocked signals)."""

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        import signal

        return np.array(
            [
                signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL,
                signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
                signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
                len(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
            ],
            dtype=np.int64,
        )


# Calls of a source in this process (each worker process has its own).
_source_calls = [0]


class FailsAtSecondBatch:
    """Callable source: worker `bad` raises at its second batch, in its
    first pass only (or in every pass when `recurring`)."""

    def __init__(self, per_worker: int, bad: int = 1, recurring: bool = False) -> None:
        self.per_worker = per_worker
        self.bad = bad
        self.recurring = recurring

    def __call__(self) -> Iterator[tuple[Any, ...]]:
        info = fastq.get_worker_info()
        wid = -1 if info is None else info.id
        _source_calls[0] += 1
        first_pass = _source_calls[0] == 1
        for k in range(self.per_worker):
            if wid == self.bad and k == 1 and (self.recurring or first_pass):
                raise OSError(f"the shard of worker {wid} is unreadable")
            yield np.full(4, wid, np.int64), np.arange(4 * k, 4 * k + 4)


class BrokenState(PatternDataset):
    """Pickles, but cannot be rebuilt in a worker: its __setstate__ raises."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("cannot reopen the database")


class BrokenStateBatches(CountingBatches):
    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("cannot reopen the database")


def prefetcher_in_this_process(conn: Any) -> None:
    """Process target: tries to make a Prefetcher here and sends back what
    came of it."""
    try:
        with fastq.Prefetcher(
            PatternDataset(8), batch_size=4, workers=1, start_method="fork"
        ) as pf:
            conn.send(("ok", str(len(list(pf)))))
    except Exception as exc:
        conn.send((type(exc).__name__, str(exc)))
    conn.close()


class Texts(PatternDataset):
    """Samples with a string label whose length varies."""

    def __getitem__(self, i: int) -> tuple[Any, ...]:  # type: ignore[override]
        return expected_image(i), "label-" + "x" * (i % 5)


class MixedByteOrder(PatternDataset):
    """Numeric leaves in big-endian byte order (every other sample)."""

    def __getitem__(self, i: int) -> tuple[Any, ...]:  # type: ignore[override]
        order = ">" if i % 2 else "<"
        return (
            np.arange(3, dtype=f"{order}i4") + i,
            np.array(i / 2, dtype=">f8"),
        )


class HoldsArrays:
    """A map-style source over arrays it holds (as attributes, in a list and
    in a dict, and one of them twice). Sample i reports, from the worker:
    row i of `big`, whether `big` there is backed by a mapping of shared
    memory, whether its second reference is the same object, and after
    `write_at` (a sample index) whether the worker's own write to `big`
    stayed its own."""

    def __init__(self, big: np.ndarray, small: np.ndarray, write_at: int = -1) -> None:
        self.big = big
        self.nested = {"lists": [small, big]}
        self.write_at = write_at

    def __len__(self) -> int:
        return len(self.big)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import mmap

        base: Any = self.big
        while isinstance(base, np.ndarray):
            base = base.base
        small = self.nested["lists"][0]
        if i == self.write_at:
            self.big[i] = -1  # this worker's copy only
        return {
            "row": np.ascontiguousarray(self.big[i]),
            "small": small[i % len(small)],
            "mapped": np.int64(isinstance(base, mmap.mmap)),
            "same": np.int64(self.nested["lists"][1] is self.big),
            "inode": np.int64(mapping_inode(self.big)),
        }


def mapping_inode(arr: np.ndarray) -> int:
    """The inode of the file mapped where arr's data lies (0: none)."""
    address = arr.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return int(fields[4])
    return 0


def make_record(i: int) -> Any:
    """Record i of a list a dataset holds: every kind of plain value, nested,
    each depending on i (a tuple record at every third index)."""
    record = {
        "id": i,
        "big": (1 << 70) + i,
        "score": i / 7,
        "nan": float("nan") if i % 5 == 0 else -0.0,
        "name": f"images/{i:06d}-é€.jpg",
        "raw": bytes([i % 256, 0, 255]),
        "none": None,
        "flag": i % 2 == 0,
        "box": [i, i + 0.5, [True, None], (b"", "")],
        "meta": {"tags": ("a", i), "nested": {"depth": [[i]]}},
    }
    return (i, f"{i}", record) if i % 3 == 0 else record


class HoldsRecords:
    """A map-style source over a list of records (make_record's) it holds.
    Sample i reports, from the worker: whether record i reads back as
    make_record(first + i) does (types included: `records` is a slice
    from `first`), and the inode of the file the records' bytes lie in (0:
    not a shared store). Sample `kill_at` kills its worker with SIGKILL."""

    def __init__(self, records: Any, first: int = 0, kill_at: int = -1) -> None:
        self.records = records
        self.first = first
        self.kill_at = kill_at

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i == self.kill_at:
            os.kill(os.getpid(), 9)
            time.sleep(10)
        data = getattr(self.records, "_data", None)
        return {
            "same": np.int64(
                repr(self.records[i]) == repr(make_record(self.first + i))
            ),
            "inode": np.int64(0 if data is None else mapping_inode(data)),
        }


class ReadsRecords:
    """Sample i: the id of record i (a dict), read whole."""

    def __init__(self, records: Any) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> np.int64:
        record = self.records[i]
        return np.int64(record["id"] + len(record["name"]))


def annotation(i: int) -> dict[str, Any]:
    """A record as a COCO-style manifest holds one (about 650 bytes of
    Python objects)."""
    return {
        "id": i,
        "image_id": i // 7,
        "name": f"train2017/{i:012d}.jpg",
        "bbox": [i * 0.5, i * 0.25, 32.5, 48.25],
        "category_id": i % 80,
        "area": 1560.0 + i,
        "iscrowd": i % 50 == 0,
        "caption": "a photo of " + "xy" * (i % 20),
    }
