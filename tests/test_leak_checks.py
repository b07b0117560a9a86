"""The leak check itself (tests/process_checks.py): it finds fastq's own
nameless files and nothing else, wherever the checkout lies."""

from __future__ import annotations

import mmap
import os

from process_checks import is_fastq_file, ring_mappings

from fastq._core._memfd import anonymous_file


def test_a_library_under_a_checkout_named_for_the_distribution_is_no_ring(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    folder = tmp_path / "fastq-ring" / "fastq" / "_core"
    folder.mkdir(parents=True)
    lib = folder / "_ring.cpython-311-x86_64-linux-gnu.so"
    lib.write_bytes(b"\0" * mmap.PAGESIZE)
    with open(lib, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        try:
            assert ring_mappings() == []
        finally:
            mapped.close()


def test_a_fastq_memfd_mapped_or_open_is_found() -> None:
    fd = anonymous_file("fastq-ring")
    try:
        os.ftruncate(fd, mmap.PAGESIZE)
        mapped = mmap.mmap(fd, mmap.PAGESIZE)
        try:
            found = ring_mappings()
            assert any("/memfd:fastq-ring" in line for line in found), found
            assert any(line.startswith(f"fd {fd} ->") for line in found), found
        finally:
            mapped.close()
    finally:
        os.close(fd)
    assert ring_mappings() == []


def test_only_fastq_names_count() -> None:
    assert is_fastq_file("/memfd:fastq-ring (deleted)")
    assert is_fastq_file("/memfd:fastq-dataset-arrays (deleted)")
    assert not is_fastq_file("/memfd:other-ring (deleted)")
    assert not is_fastq_file("/home/me/fastq-ring/fastq/_core/_ring.so")
    assert not is_fastq_file("/srv/fastq-venv/lib/libtorch.so")
