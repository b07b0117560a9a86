"""`python -m fastq bench [...]`: the side-by-side benchmark."""

from __future__ import annotations

import sys

USAGE = """usage: python -m fastq bench [options]

  Throughput of fastq next to a pickled multiprocessing.Queue, PyTorch's
  DataLoader, faster-fifo, SPDL, torchdata's ParallelMapper and a plain
  memcpy of the same bytes, as a table with ratios; a training loop fed by
  each loader (--case train); `python -m fastq bench --help` lists the
  options."""


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "bench":
        print(USAGE, file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    from ._bench.runner import main as bench

    return bench(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
