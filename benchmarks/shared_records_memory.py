"""Memory of a dataset that holds a list of dict records, read by forked
workers over one shuffled epoch; and what reading one record costs.

    PYTHONPATH=. python benchmarks/shared_records_memory.py [--records 1000000]
        [--workers 4 15] [--cases ...] [--skip-reads]

Memory: each case runs in a fresh interpreter. It builds the records (a
COCO-style annotation each: ids, a file name, a box, an area, a flag),
measures what they take (the process's PSS before and after), builds the
loader, and takes the total PSS of the process and its workers at the
first batch and at the last one (before the loader ends its epoch, so the
workers are still there). Shared records are read once here first: a page
of shared memory counts in PSS from the first process that maps it, and
this counts the store's one copy from the start, as the list's is. "added"
is the growth between the two, in copies of the records' list: what the
workers copied while they read. Cases:

- torch-list: torch's DataLoader over the plain list (fork);
- torch-list-frozen: the same after gc.freeze() (the garbage collector no
  longer writes the records' headers; their reference counts still are);
- fastq-dataloader-list: fastq.torch.DataLoader over the plain list;
- fastq-dataloader-shared: fastq.torch.DataLoader over
  fastq.shared_records(list), the list dropped;
- fastq-shared: fastq.Prefetcher over the shared records;
- torch-shared: torch's DataLoader over the shared records;
- fastq-dataloader-none, fastq-none: fastq.torch.DataLoader and the
  Prefetcher over no records (sample i is i): each loader's own growth
  over the epoch, the floor.

Reads: in this process, the cost of record i in a shuffled order, from the
list and from each candidate store (shared records; marshal in the same
layout; an Arrow table, a row at a time), alone and with every field read;
and, for context, the list read in a freshly forked process over its first
pass (what a worker pays in copy-on-write faults beyond the read itself).
"""

from __future__ import annotations

import argparse
import gc
import json
import marshal
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from case_process import case_in_fresh_process
from records_fork_model import annotation

from fastq._bench.procstat import pss_bytes, total_pss

CASES = [
    "torch-list",
    "torch-list-frozen",
    "fastq-dataloader-list",
    "fastq-dataloader-shared",
    "fastq-shared",
    "torch-shared",
    "fastq-dataloader-none",
    "fastq-none",
]
BATCH = 500


class Reads:
    """Sample i: record i's id (the record read whole, as a dataset would)."""

    def __init__(self, records: Any, n: int) -> None:
        self.records = records
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.records is None:
            return np.int64(i)
        record = self.records[i]
        return np.int64(record["id"] + record["category_id"])


# ------------------------------------------------------------ memory


def run_case(case: str, n: int, workers: int) -> dict[str, Any]:
    import torch.utils.data

    import fastq
    from fastq.torch import DataLoader

    before = pss_bytes(os.getpid())
    records: Any = None
    if not case.endswith("-none"):
        records = [annotation(i) for i in range(n)]
    list_bytes = pss_bytes(os.getpid()) - before
    shared_bytes = 0
    if case.endswith("-shared"):
        records = fastq.shared_records(records)
        shared_bytes = records.nbytes
        gc.collect()
        # A page of shared memory counts in PSS once a process maps it: read
        # here, the store's one copy counts from the start, as a list does.
        for _record in records:
            pass
    if case.endswith("-frozen"):
        gc.freeze()
    dataset = Reads(records, n)
    del records
    torch.manual_seed(0)
    if case.startswith("torch"):
        loader: Any = torch.utils.data.DataLoader(
            dataset, batch_size=BATCH, shuffle=True, num_workers=workers
        )
    elif case.startswith("fastq-dataloader"):
        loader = DataLoader(
            dataset, batch_size=BATCH, shuffle=True, num_workers=workers
        )
    else:
        loader = fastq.Prefetcher(
            dataset, batch_size=BATCH, shuffle=True, workers=workers, seed=0
        )
    batches = len(loader)
    first = last = 0
    t0 = time.perf_counter()
    for k, _batch in enumerate(loader):
        if k == 0:
            first = total_pss(os.getpid())
        if k == batches - 1:  # before the loader ends its workers
            last = total_pss(os.getpid())
    epoch_s = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    return {
        "case": case,
        "list_bytes": list_bytes,
        "shared_bytes": shared_bytes,
        "first_pss": first,
        "last_pss": last,
        "epoch_s": epoch_s,
    }


def launch(case: str, n: int, workers: int) -> dict[str, Any]:
    return case_in_fresh_process(
        __file__, case, ["--records", str(n), "--workers", str(workers)]
    )


def memory(cases: list[str], n: int, workers_list: list[int]) -> None:
    mib = 1 << 20
    list_bytes = 0
    for workers in workers_list:
        print(f"\n{n:,} records, {workers} workers, one shuffled epoch, ", end="")
        print(f"batch_size={BATCH}")
        print(
            f"{'loader':<25} {'records (MiB)':>13} {'shared (MiB)':>12} "
            f"{'PSS first':>10} {'PSS last':>9} {'added (MiB)':>11} "
            f"{'added (copies)':>14} {'epoch (s)':>9}"
        )
        for case in cases:
            row = launch(case, n, workers)
            if not case.endswith("-none"):  # -none: the others' records
                list_bytes = row["list_bytes"]
            added = row["last_pss"] - row["first_pss"]
            print(
                f"{case:<25} {row['list_bytes'] / mib:>13.0f} "
                f"{row['shared_bytes'] / mib:>12.0f} {row['first_pss'] / mib:>10.0f} "
                f"{row['last_pss'] / mib:>9.0f} {added / mib:>11.0f} "
                f"{added / max(list_bytes, 1):>14.2f} {row['epoch_s']:>9.1f}",
                flush=True,
            )


# ------------------------------------------------------------ reads


def reads(n: int) -> None:
    import fastq

    records = [annotation(i) for i in range(n)]
    order = np.random.default_rng(0).permutation(n)[:200_000].tolist()
    shared = fastq.shared_records(records)
    marshalled = _marshalled(records)
    stores: dict[str, Any] = {"list": records, "shared_records": shared}
    stores["marshal (same layout)"] = marshalled
    try:
        import pyarrow as pa

        table = pa.Table.from_pylist(records)
        stores["arrow, a row (slice.to_pylist)"] = _ArrowRows(table)
    except ImportError:
        print("pyarrow is not installed: its row is skipped", file=sys.stderr)
    print(f"\nreading record i of {n:,}, in a shuffled order, this process")
    print(
        f"{'store':<32} {'read (ns)':>10} {'vs list':>8} "
        f"{'read + fields (ns)':>19} {'vs list':>8}"
    )
    base = base_fields = 0.0
    for name, store in stores.items():
        alone = _per_read(store, order)
        fields = _per_read(store, order, _touch)
        if name == "list":
            base, base_fields = alone, fields
        print(
            f"{name:<32} {alone:>10.0f} {alone / base:>7.1f}x {fields:>19.0f} "
            f"{fields / base_fields:>7.1f}x",
            flush=True,
        )
    forked = _first_pass_in_a_fork(records, order)
    print(
        f"{'(context) list, fork, 1st pass':<32} {forked:>10.0f} "
        f"{forked / base:>7.1f}x  (a worker's first pass, mean)",
        flush=True,
    )
    t0 = time.perf_counter()
    fastq.shared_records(records)
    print(f"\nshared_records(list of {n:,}): {time.perf_counter() - t0:.2f} s")
    _walks(records)


def _first_pass_in_a_fork(records: list[Any], order: list[int]) -> float:
    """Nanoseconds a read of the list in a freshly forked process, over its
    first pass of the order: each page a read writes a reference count on
    is copied then, as in a DataLoader's worker. The mean, not the least:
    the first pass happens once."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        t0 = time.perf_counter()
        _read_each(records, order)
        per_read = (time.perf_counter() - t0) / len(order) * 1e9
        os.write(write_end, repr(per_read).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        per_read = float(pipe.read())
    os.waitpid(pid, 0)
    return per_read


def _read_each(store: Any, order: list[int], then: Any = None) -> None:
    """Each record in turn, dropped once read (a dataset's way: a list of
    them kept would time the allocator too)."""
    get = store.__getitem__
    if then is None:
        for i in order:
            get(i)
    else:
        for i in order:
            then(get(i))


def _touch(record: dict[str, Any]) -> int:
    """What a dataset does with its record: reads every field."""
    for _value in record.values():
        pass
    return len(record)


def _per_read(store: Any, order: list[int], then: Any = None) -> float:
    """Nanoseconds a read, the least over runs of _CHUNK reads (on a shared
    machine, a run that nothing interrupted)."""
    best = float("inf")
    for _ in range(5):
        for k in range(0, len(order), _CHUNK):
            chunk = order[k : k + _CHUNK]
            t0 = time.perf_counter()
            _read_each(store, chunk, then)
            best = min(best, (time.perf_counter() - t0) / len(chunk))
    return best * 1e9


_CHUNK = 2_000


def _least_ms(run: Any) -> float:
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


class _Marshalled:
    def __init__(self, data: bytes, offsets: np.ndarray) -> None:
        self.data = memoryview(data)
        self.starts = memoryview(offsets[:-1])
        self.ends = memoryview(offsets[1:])

    def __getitem__(self, i: int) -> Any:
        return marshal.loads(self.data[self.starts[i] : self.ends[i]])


def _marshalled(records: list[Any]) -> _Marshalled:
    pieces = [marshal.dumps(r) for r in records]
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pieces], out=offsets[1:])
    return _Marshalled(b"".join(pieces), offsets)


class _ArrowRows:
    def __init__(self, table: Any) -> None:
        self.table = table

    def __getitem__(self, i: int) -> Any:
        return self.table.slice(i, 1).to_pylist()[0]


def _walks(records: list[Any]) -> None:
    """The start-up walk that looks for containers workers would copy."""
    from fastq._workers._copied_objects import copied_objects

    class Holds:
        def __init__(self, **attrs: Any) -> None:
            self.__dict__.update(attrs)

    small = Holds(files=[f"{i}.jpg" for i in range(100)], meta={"a": 1}, n=5)
    bounded = Holds(records=records[:127], more=[records[:127]] * 4)
    for name, dataset in [
        (f"a list of {len(records):,} records", Holds(records=records)),
        ("no large container", small),
        ("containers just under the sampling size", bounded),
    ]:
        t = _least_ms(lambda d=dataset: copied_objects({"source": d}))
        print(f"start-up walk, dataset holding {name}: {t:.2f} ms")


# ------------------------------------------------------------ main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, nargs="+", default=[4, 15])
    p.add_argument("--cases", default=",".join(CASES), help=f"of {','.join(CASES)}")
    p.add_argument("--skip-reads", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_case(args.one, args.records, args.workers[0])), flush=True)
        return
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs"
    )
    if not args.skip_memory:
        memory(args.cases.split(","), args.records, args.workers)
    if not args.skip_reads:
        reads(args.records)


if __name__ == "__main__":
    main()
