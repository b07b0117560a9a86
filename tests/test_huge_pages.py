"""The ring in huge pages where the system offers them: hugetlb pages when
enough are free, else shared memory's transparent huge pages (at once where
shmem_enabled says always, MADV_HUGEPAGE where it says advise, MADV_COLLAPSE
where it says never), else base pages; every process maps them whole at an
aligned address. Never an error where a feature is missing; stats() says
which was used and how much of the ring this process maps huge. The system
settings are changed (and restored) only where this process may write
them."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastq
from fastq._core import _shm
from fastq._core._mapping import AlignedMapping

pytestmark = pytest.mark.timeout(60)

HUGE = _shm.huge_page_size()
ROWS = 64
# A batch of 3 MiB: the ring is several huge pages.
SHAPE = (ROWS, 3, 128, 128)


class Images:
    def __len__(self) -> int:
        return 4 * ROWS

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(SHAPE[1:], i % 251, dtype=np.uint8)


def settled_pages(pf: fastq.Prefetcher) -> dict[str, Any]:
    """stats()["pages"] once the ring's pages are made huge and mapped
    here, which a thread does after the ring is handed over."""
    region = pf._engine.region
    assert region is not None and region.wait_settled(30)
    pages: dict[str, Any] = pf.stats()["pages"]
    assert pages["settled"]
    return pages


def check_epoch(pf: fastq.Prefetcher) -> None:
    seen = []
    for batch in pf:
        for row in batch:
            seen.append(int(row[0, 0, 0]))
            assert (row == row[0, 0, 0]).all()
    assert seen == [i % 251 for i in range(4 * ROWS)]


@contextlib.contextmanager
def system_setting(path: str, value: str) -> Iterator[None]:
    """Writes a kernel setting for the test, restoring it after; skips
    where this process may not."""
    try:
        with open(path) as f:
            old = f.read().strip()
        with open(path, "w") as f:
            f.write(value)
    except OSError as exc:
        pytest.skip(f"cannot set {path} here ({exc.strerror})")
    try:
        yield
    finally:
        if "[" in old:  # shmem_enabled shows every choice, the current in []
            old = old[old.index("[") + 1 : old.index("]")]
        with open(path, "w") as f:
            f.write(old)


def test_stats_say_what_backs_the_ring() -> None:
    with fastq.Prefetcher(Images(), batch_size=ROWS, workers=1) as pf:
        check_epoch(pf)
        pages = settled_pages(pf)
    assert pages["kind"] in (_shm.PAGES_HUGETLB, _shm.PAGES_THP, _shm.PAGES_BASE)
    assert 0 <= pages["huge_bytes"] <= pages["bytes"]
    if pages["kind"] == _shm.PAGES_BASE:
        assert pages["huge_bytes"] == 0


def test_a_small_region_keeps_its_size_and_base_pages() -> None:
    region = _shm.Region.create(HUGE // 2)
    try:
        assert region.size == HUGE // 2 and region.pages == _shm.PAGES_BASE
    finally:
        region.close()


def test_transparent_huge_pages_are_asked_for_where_shmem_says_advise() -> None:
    with system_setting(_shm._THP_SHMEM, "advise"):
        with fastq.Prefetcher(Images(), batch_size=ROWS, workers=2) as pf:
            check_epoch(pf)
            pages = settled_pages(pf)
    assert pages["kind"] == _shm.PAGES_THP
    assert pages["bytes"] % HUGE == 0
    assert pages["huge_bytes"] == pages["bytes"]


def test_hugetlb_pages_are_used_when_enough_are_free() -> None:
    with system_setting("/proc/sys/vm/nr_hugepages", "64"):
        if _shm.meminfo().get("HugePages_Free", 0) * HUGE < 32 * HUGE:
            pytest.skip("the kernel could not reserve hugetlb pages")
        with fastq.Prefetcher(Images(), batch_size=ROWS, workers=2) as pf:
            check_epoch(pf)
            pages = settled_pages(pf)
    assert pages["kind"] == _shm.PAGES_HUGETLB
    assert pages["huge_bytes"] == pages["bytes"]


def test_free_pages_that_cannot_be_had_fall_back_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc/meminfo claims free hugetlb pages that the kernel then refuses
    (taken meanwhile by another process): ordinary pages, no error."""
    real = _shm.meminfo

    def claims_plenty() -> dict[str, Any]:
        return {**real(), "HugePages_Free": 1 << 20}

    monkeypatch.setattr(_shm, "meminfo", claims_plenty)
    if real().get("HugePages_Free", 0):
        pytest.skip("this system has free hugetlb pages: nothing to refuse")
    region = _shm.Region.create(4 * HUGE)
    try:
        assert region.pages != _shm.PAGES_HUGETLB
        with memoryview(region.mapping) as view:
            view[:4] = b"ring"
            assert view[:4] == b"ring"
    finally:
        region.close()


def test_shmem_always_needs_no_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shm, "shmem_thp_mode", lambda: "always")
    monkeypatch.setattr(_shm, "meminfo", lambda: {"Hugepagesize": HUGE // 1024})
    region = _shm.Region.create(HUGE + 1)
    try:
        assert region.pages == _shm.PAGES_THP and region.size == 2 * HUGE
    finally:
        region.close()


def test_the_settings_are_read_whatever_the_kernel_offers() -> None:
    assert _shm.shmem_thp_mode() in (
        "always",
        "within_size",
        "advise",
        "never",
        "deny",
        "force",
    )
    assert os.sysconf("SC_PAGE_SIZE") <= HUGE


def ring_huge_bytes(pid: int) -> int:
    """Bytes of the ring that process `pid` maps with huge pages."""
    total, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                inside = "memfd:fastq-ring" in line
            elif inside and line.startswith("ShmemPmdMapped:"):
                total += int(line.split()[1]) * 1024
    return total


def test_where_shmem_says_never_the_pages_are_collapsed_for_every_worker() -> None:
    """shmem_enabled=never, most systems' default: the ring's pages are made
    huge with MADV_COLLAPSE, and each worker, mapping it aligned, maps them
    huge too."""
    with system_setting(_shm._THP_SHMEM, "never"):
        with fastq.Prefetcher(Images(), batch_size=ROWS, workers=2) as pf:
            check_epoch(pf)
            # Until each worker has made a batch: it has mapped the ring.
            for _ in range(100):
                if all(w["batches"] for w in pf.stats()["workers"]):
                    break
                check_epoch(pf)
            pages = settled_pages(pf)
            if pages["kind"] == _shm.PAGES_BASE:
                pytest.skip("this kernel cannot collapse shared memory (before 6.1)")
            # Each worker maps its pages huge on a thread of its own.
            for _ in range(300):
                workers = [ring_huge_bytes(pid) for pid in pf._pool.pids]
                if workers == [pages["bytes"]] * 2:
                    break
                time.sleep(0.05)
    assert pages["kind"] == _shm.PAGES_THP
    assert pages["huge_bytes"] == pages["bytes"]
    assert workers == [pages["bytes"]] * 2


def test_an_aligned_mapping_is_a_writable_buffer_freed_with_its_last_user() -> None:
    fd = os.memfd_create("aligned")
    try:
        os.ftruncate(fd, 2 * HUGE)
        mapping = AlignedMapping(fd, 2 * HUGE, HUGE)
        assert mapping.address % HUGE == 0 and len(mapping) == 2 * HUGE
        view = memoryview(mapping)
        view[-4:] = b"ring"
        with pytest.raises(BufferError):
            mapping.close()
        arr = np.frombuffer(mapping, dtype=np.uint8)
        del mapping, view  # the array keeps it mapped
        assert bytes(arr[-4:]) == b"ring"
        assert os.pread(fd, 4, 2 * HUGE - 4) == b"ring"
        del arr
        with open("/proc/self/maps") as f:
            assert "/memfd:aligned" not in f.read()
    finally:
        os.close(fd)


def test_huge_pages_can_be_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    """FASTQ_HUGE_PAGES=0: base pages, whatever the system offers."""
    monkeypatch.setattr(_shm, "_HUGE_PAGES", False)
    region = _shm.Region.create(4 * HUGE)
    try:
        assert region.pages == _shm.PAGES_BASE
        assert _shm.huge_bytes_mapped(region.mapping) == 0
    finally:
        region.close()


def test_a_collapse_the_kernel_refuses_leaves_base_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """shmem_enabled=never and a kernel that refuses the collapse (an advice
    it does not know, as before Linux 6.1: EINVAL for real): base pages, all
    reserved, no error."""
    monkeypatch.setattr(_shm, "shmem_thp_mode", lambda: "never")
    monkeypatch.setattr(_shm, "meminfo", lambda: {"Hugepagesize": HUGE // 1024})
    monkeypatch.setattr(_shm, "_MADV_COLLAPSE", 9999)
    region = _shm.Region.create(4 * HUGE)
    try:
        assert region.wait_settled(30)
        assert region.pages == _shm.PAGES_BASE and region.size == 4 * HUGE
        assert region.huge_bytes() == 0
        assert os.fstat(region.fd).st_blocks * 512 >= region.size  # reserved
        with memoryview(region.mapping) as view:
            view[-4:] = b"ring"
            assert view[-4:] == b"ring"
    finally:
        region.close()
