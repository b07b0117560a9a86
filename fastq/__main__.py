"""`python -m fastq bench [...]`: the side-by-side benchmark."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "bench":
        print("usage: python -m fastq bench [--help]", file=sys.stderr)
        return 2
    from ._bench.runner import main as bench

    return bench(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
