"""The ring in huge pages where the system offers them: hugetlb pages when
enough are free, else shared memory's transparent huge pages where
shmem_enabled allows them (MADV_HUGEPAGE where it says advise), else base
pages. Never an error where a feature is missing; stats() says which was
used and how much of the ring this process maps huge. The system settings
are changed (and restored) only where this process may write them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastq
from fastq import _shm

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
        pages = pf.stats()["pages"]
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
            pages = pf.stats()["pages"]
    assert pages["kind"] == _shm.PAGES_THP
    assert pages["bytes"] % HUGE == 0
    assert pages["huge_bytes"] == pages["bytes"]


def test_hugetlb_pages_are_used_when_enough_are_free() -> None:
    with system_setting("/proc/sys/vm/nr_hugepages", "64"):
        if _shm._meminfo().get("HugePages_Free", 0) * HUGE < 32 * HUGE:
            pytest.skip("the kernel could not reserve hugetlb pages")
        with fastq.Prefetcher(Images(), batch_size=ROWS, workers=2) as pf:
            check_epoch(pf)
            pages = pf.stats()["pages"]
    assert pages["kind"] == _shm.PAGES_HUGETLB
    assert pages["huge_bytes"] == pages["bytes"]


def test_free_pages_that_cannot_be_had_fall_back_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc/meminfo claims free hugetlb pages that the kernel then refuses
    (taken meanwhile by another process): ordinary pages, no error."""
    real = _shm._meminfo

    def claims_plenty() -> dict[str, Any]:
        return {**real(), "HugePages_Free": 1 << 20}

    monkeypatch.setattr(_shm, "_meminfo", claims_plenty)
    if real().get("HugePages_Free", 0):
        pytest.skip("this system has free hugetlb pages: nothing to refuse")
    region = _shm.Region.create(4 * HUGE)
    try:
        assert region.pages != _shm.PAGES_HUGETLB
        region.mapping[:4] = b"ring"
        assert region.mapping[:4] == b"ring"
    finally:
        region.close()


def test_shmem_always_needs_no_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shm, "shmem_thp_mode", lambda: "always")
    monkeypatch.setattr(_shm, "_meminfo", lambda: {"Hugepagesize": HUGE // 1024})
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
