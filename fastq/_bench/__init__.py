"""The side-by-side benchmark behind `python -m fastq bench`."""
