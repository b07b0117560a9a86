"""fastq.vision's samples under worker processes: read from records in
shared memory made as the workers start, never from the list, which stays
torchvision's for the user; the copied-data warning does not name it; the
store lives as long as the dataset."""

from __future__ import annotations

import gc
import os
import pickle
import warnings
from typing import Any

import numpy as np
import pytest
from process_checks import ring_mappings

import fastq
from fastq._workers import _copied_objects
from fastq.vision import ImageFiles

pytestmark = pytest.mark.timeout(120)
N = 64


class OwnerOnly(list):  # type: ignore[type-arg]
    """A list that only the process that made it may index: a worker that
    reads the dataset's list, rather than its records, fails the test."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.owner = os.getpid()

    def __getitem__(self, index: Any) -> Any:
        if os.getpid() != self.owner:
            raise AssertionError(f"a worker read samples[{index!r}]")
        return super().__getitem__(index)


def number_in(path: str) -> np.int64:
    """The stand-in for an image: the number in its (fake) file name."""
    return np.int64(int(os.path.basename(path).split(".")[0]))


def fake_files(n: int = N) -> ImageFiles:
    dataset = ImageFiles(
        [(f"class/{i}.jpg", i % 7) for i in range(n)], loader=number_in
    )
    dataset.samples = OwnerOnly(dataset.samples)
    return dataset


def read_back(loader: Any) -> list[tuple[int, int]]:
    out = []
    for images, labels in loader:
        out += zip(np.asarray(images).tolist(), np.asarray(labels).tolist())
    return out


def expected(dataset: ImageFiles) -> list[tuple[int, int]]:
    return [(int(number_in(path)), label) for path, label in list(dataset.samples)]


def records_mapped() -> list[str]:
    return [line for line in ring_mappings() if "fastq-shared-records" in line]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_prefetcher_workers_read_the_records_with_the_users_edits(
    start_method: str,
) -> None:
    dataset = fake_files()
    # Edits made before iterating, in place and by a new list.
    dataset.samples[3] = ("class/1003.jpg", 5)
    more = [("class/2000.jpg", 6)]
    dataset.samples = OwnerOnly(dataset.samples + more)  # a new list
    with fastq.Prefetcher(
        dataset, batch_size=8, workers=2, start_method=start_method
    ) as pf:
        got = read_back(pf)
    assert got == expected(dataset)
    assert len(got) == N + 1


def test_dataloader_workers_see_edits_between_epochs() -> None:
    """Without persistent workers, each epoch's start makes the store again
    where the list changed since the last one, and only there."""
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    dataset = fake_files()
    loader = DataLoader(dataset, batch_size=8, num_workers=2)
    assert read_back(loader) == expected(dataset)
    store = dataset._records
    assert read_back(loader) == expected(dataset)
    assert dataset._records is store  # the same list: kept
    dataset.samples[5] = ("class/777.jpg", 3)
    del dataset.samples[0]
    got = read_back(loader)
    assert got == expected(dataset)
    assert got[4] == (777, 3)


def test_persistent_dataloader_workers_read_the_records() -> None:
    pytest.importorskip("torch")
    from fastq.torch import DataLoader

    dataset = fake_files()
    loader = DataLoader(
        dataset, batch_size=8, num_workers=2, persistent_workers=True, shuffle=True
    )
    for _ in range(2):
        assert sorted(read_back(loader)) == sorted(expected(dataset))
    loader.close()


def test_the_list_stays_torchvisions_outside_the_workers() -> None:
    dataset = fake_files()
    with fastq.Prefetcher(dataset, batch_size=8, workers=1) as pf:
        read_back(pf)
    assert dataset._records is not None
    # Read here, the list is the truth, whatever the store holds.
    dataset.samples[0] = ("class/999.jpg", 4)
    assert dataset[0] == (999, 4)
    assert type(dataset.samples * 2) is list and len(dataset.samples * 2) == 2 * N
    assert dataset.imgs is not None and dataset.targets[:3] == [0, 1, 2]


def test_the_warning_names_samples_only_where_workers_read_the_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_copied_objects, "_warned", set())
    monkeypatch.setattr(_copied_objects, "WARN_AT_BYTES", 1 << 20)

    class ReadsTheList(ImageFiles):
        def __getitem__(self, index: int) -> Any:
            path, label = self.samples[index]
            return number_in(path), label

    samples = [(f"images/train/class/{i:08d}.jpg", i % 1000) for i in range(20_000)]
    named = {}
    for kind in (ImageFiles, ReadsTheList):
        dataset = kind(samples, loader=number_in)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with fastq.Prefetcher(dataset, batch_size=8, workers=1) as pf:
                next(iter(pf))
        named[kind] = [
            str(w.message).split(" is ")[0]
            for w in caught
            if issubclass(w.category, fastq.CopiedDataWarning)
        ]
    assert named[ImageFiles] == []
    assert named[ReadsTheList] == ["source.samples"]  # a subclass's own read


def test_the_store_lives_as_long_as_the_dataset() -> None:
    dataset = fake_files()
    with fastq.Prefetcher(dataset, batch_size=8, workers=1) as pf:
        read_back(pf)
    assert records_mapped() != []
    del dataset, pf
    gc.collect()
    assert records_mapped() == []


def test_pickled_for_a_worker_it_leaves_the_lists_to_the_records() -> None:
    """A spawned worker gets the store's shared memory, not the lists it
    holds; it rebuilds one only if it reads it."""
    from multiprocessing import context

    dataset = ImageFiles([(f"class/{i}.jpg", i % 7) for i in range(N)])
    dataset._fastq_before_workers(fastq.shared_records)
    popen = context.get_spawning_popen()
    context.set_spawning_popen(object())  # type: ignore[arg-type]
    try:
        payload = pickle.dumps(dataset)
    finally:
        context.set_spawning_popen(popen)
    copy = pickle.loads(payload)
    left_out = {"samples", "imgs", "targets"} & set(copy.__dict__)
    assert left_out == set() and len(copy) == N
    assert copy.samples == dataset.samples and copy.imgs is copy.samples
    assert copy.targets == dataset.targets
    # Pickled otherwise, it holds the lists and no store.
    plain = pickle.loads(pickle.dumps(dataset))
    assert plain.samples == dataset.samples and plain._records is None
    del dataset, copy, plain
    gc.collect()
    assert records_mapped() == []
