"""The side-by-side benchmark behind `python -m fastq bench` and
benchmarks/: fastq next to the pickled queue, DataLoader, faster-fifo and
memcpy, with the same producer work per batch for every transport."""
