"""The side-by-side benchmark behind `python -m fastq bench` and
benchmarks/: fastq next to the pickled queue, DataLoader, faster-fifo, SPDL,
torchdata and memcpy, with the same producer work per batch for every one."""
