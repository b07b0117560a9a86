"""What forked readers of a list of dict records copy, under any CPython
(standard library only, so that interpreters without numpy or fastq run it):
the "immortal or frozen before fork" candidate for shared records.

    python benchmarks/records_fork_model.py [--records 1000000] [--workers 4]

The training process builds the records, then forks the workers; each reads
its batches of one shuffled epoch (batch i goes to worker i % workers, as a
DataLoader deals them) and reads two fields of each record, as a dataset
would. "added" is the growth of the total PSS of the process and its
workers from just after the fork to the end of the reads, in copies of the
records. Stores:

- list: the plain list;
- list, gc.freeze(): frozen before the fork, so the garbage collector never
  writes the records' headers (on 3.12 and newer, objects such as None and
  interned strings are immortal, and their counts are never written; no
  public API makes a dict or a list immortal, in 3.12 or 3.13);
- pickled: each record pickled, end to end in one anonymous shared mapping
  with an array of offsets (fastq.shared_records' layout).
"""

from __future__ import annotations

import argparse
import array
import gc
import mmap
import os
import pickle
import random
import sys

BATCH = 500


def annotation(i: int) -> dict[str, object]:
    """A COCO-style annotation, as json.load gives it (its keys one object
    for all records, as json's memo makes them)."""
    return {
        "id": i,
        "image_id": i // 7,
        "file_name": f"train2017/{i // 7:012d}.jpg",
        "bbox": [(i % 640) * 0.5, (i % 480) * 0.25, 32.5, 48.25],
        "category_id": i % 80,
        "area": 1560.0 + i,
        "iscrowd": i % 50 == 0,
    }


def pss(pid: int) -> int:
    # fastq._bench.procstat.pss_bytes, written again: this script imports
    # nothing beyond the standard library.
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Pickled:
    def __init__(self, records: list[object]) -> None:
        pieces = [pickle.dumps(r, pickle.HIGHEST_PROTOCOL) for r in records]
        size = sum(len(p) for p in pieces)
        self.data = mmap.mmap(-1, max(size, 1))
        self.offsets = array.array("q", [0])
        for p in pieces:
            self.data.write(p)
            self.offsets.append(self.data.tell())
        self.view = memoryview(self.data)

    def __getitem__(self, i: int) -> object:
        return pickle.loads(self.view[self.offsets[i] : self.offsets[i + 1]])


def read_share(
    records: object, order: array.array[int], worker: int, workers: int
) -> None:
    get = records.__getitem__  # type: ignore[attr-defined]
    for b in range(worker, -(-len(order) // BATCH), workers):
        for i in order[b * BATCH : (b + 1) * BATCH]:
            record = get(i)
            record["id"] + record["category_id"]


def run(store: str, n: int, workers: int) -> tuple[int, int]:
    """(bytes of the list, bytes the workers added)."""
    before = pss(os.getpid())
    records: object = [annotation(i) for i in range(n)]
    list_bytes = pss(os.getpid()) - before
    if store == "pickled":
        records = Pickled(records)  # type: ignore[arg-type]
        gc.collect()
    shuffled = list(range(n))
    random.Random(0).shuffle(shuffled)
    # Not a list: the workers would copy its ints as they read them.
    order = array.array("q", shuffled)
    del shuffled
    if store.endswith("gc.freeze()"):
        gc.freeze()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pids = []
    for w in range(workers):
        pid = os.fork()
        if pid == 0:
            os.read(go_r, 1)
            read_share(records, order, w, workers)
            os.write(done_w, b"x")
            os.read(go_r, 1)  # stay, mapped, until measured
            os._exit(0)
        pids.append(pid)
    start = pss(os.getpid()) + sum(pss(p) for p in pids)
    os.write(go_w, b"x" * workers)
    for _ in range(workers):
        os.read(done_r, 1)
    end = pss(os.getpid()) + sum(pss(p) for p in pids)
    os.write(go_w, b"x" * workers)
    for pid in pids:
        os.waitpid(pid, 0)
    return list_bytes, end - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, nargs="+", default=[4])
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        list_bytes, added = run(args.one, args.records, args.workers[0])
        print(list_bytes, added)
        return
    import subprocess

    mib = 1 << 20
    print(f"# CPython {sys.version.split()[0]}, {args.records:,} records")
    print(f"{'store':<20} {'workers':>7} {'records (MiB)':>13} {'added (copies)':>14}")
    for workers in args.workers:
        for store in ("list", "list, gc.freeze()", "pickled"):
            command = [sys.executable, __file__, "--one", store]
            command += ["--records", str(args.records), "--workers", str(workers)]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            list_bytes, added = (int(x) for x in out.stdout.split())
            print(
                f"{store:<20} {workers:>7} {list_bytes / mib:>13.0f} "
                f"{added / list_bytes:>14.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
