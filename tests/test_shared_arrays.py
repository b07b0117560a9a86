"""Large numpy arrays reach spawn and forkserver workers (and the default
start method's once CUDA is initialised) as shared pages of one memfd, not
as pickled bytes; fastq.shared_array keeps data in shared
memory from the start. Checked from inside the workers."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from helpers import HoldsArrays, mapping_inode

import fastq
from fastq._workers._shared_arrays import SHARE_AT_BYTES

PICKLING = [
    m
    for m in ("forkserver", "spawn")
    if m in __import__("multiprocessing").get_all_start_methods()
]
ROWS = 32
COLS = SHARE_AT_BYTES // 8 // ROWS * 2  # 2 x the threshold, float64


def big_array() -> np.ndarray:
    return np.arange(ROWS * COLS, dtype=np.float64).reshape(ROWS, COLS)


def run(source: Any, start_method: str | None, **kw: Any) -> list[dict[str, Any]]:
    with fastq.Prefetcher(
        source, batch_size=4, workers=2, start_method=start_method, **kw
    ) as pf:
        return [{k: np.array(v) for k, v in b.items()} for b in pf]


def column(batches: list[dict[str, Any]], name: str) -> np.ndarray:
    return np.concatenate([b[name] for b in batches])


@pytest.mark.parametrize("start_method", PICKLING)
def test_a_large_array_arrives_mapped_and_equal(start_method: str) -> None:
    big, small = big_array(), np.arange(5)
    batches = run(HoldsArrays(big, small), start_method)
    assert np.array_equal(column(batches, "row"), big)
    assert column(batches, "mapped").all()
    assert column(batches, "same").all()  # one object, referenced twice
    assert column(batches, "small").tolist() == [i % 5 for i in range(ROWS)]


def test_a_small_array_is_pickled_by_value() -> None:
    small = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4)
    batches = run(HoldsArrays(small, np.arange(3)), "spawn")
    assert np.array_equal(column(batches, "row"), small)
    assert not column(batches, "mapped").any()


def test_a_workers_write_stays_its_own() -> None:
    """Copy-on-write, as under fork: the parent's array and the other
    workers' view are untouched."""
    big = big_array()
    want = big.copy()
    batches = run(HoldsArrays(big, np.arange(3), write_at=5), "forkserver")
    rows = column(batches, "row")
    assert (rows[5] == -1).all()  # the writer saw its write
    assert np.array_equal(np.delete(rows, 5, 0), np.delete(want, 5, 0))
    assert np.array_equal(big, want)


@pytest.mark.parametrize(
    "layout",
    [
        lambda a: a[:, ::3],  # not contiguous
        lambda a: np.asfortranarray(a),
        lambda a: a[::-1],  # negative strides
        lambda a: a.astype(np.dtype(">f8")),  # big-endian
    ],
    ids=["strided", "fortran", "reversed", "big-endian"],
)
def test_any_layout_arrives_equal(layout: Any) -> None:
    arr = layout(big_array())
    batches = run(HoldsArrays(arr, np.arange(3)), "forkserver")
    assert np.array_equal(column(batches, "row"), arr)


@pytest.mark.parametrize("start_method", [*PICKLING, "fork"])
def test_a_shared_array_is_mapped_not_copied(start_method: str) -> None:
    big = fastq.shared_array(big_array())
    view = big[ROWS // 2 :]  # a view reaches workers as a view of the memory
    batches = run(HoldsArrays(view, fastq.shared_array(np.arange(7))), start_method)
    assert np.array_equal(column(batches, "row"), big[ROWS // 2 :])
    assert column(batches, "mapped").all()


@pytest.mark.parametrize("start_method", [*PICKLING, "fork"])
def test_workers_map_the_shared_arrays_own_memory(start_method: str) -> None:
    """The same file as here, not a copy of it: writes made here reach
    workers that have not written the page themselves."""
    big = fastq.shared_array(big_array())
    batches = run(HoldsArrays(big, np.arange(3)), start_method)
    assert set(column(batches, "inode").tolist()) == {mapping_inode(big)}
    assert mapping_inode(big) != 0


def test_shared_array_takes_paths_and_refuses_objects() -> None:
    paths = fastq.shared_array(["images/0.jpg", "images/10.jpg"])
    assert paths.tolist() == ["images/0.jpg", "images/10.jpg"]
    with pytest.raises(fastq.ConfigError, match="dtype object.*Python objects"):
        fastq.shared_array([{"a": 1}, None])


def test_a_shared_array_frees_its_memory_with_its_last_view() -> None:
    def memfds() -> list[str]:
        with open("/proc/self/maps") as f:
            return [line for line in f if "fastq-shared-array" in line]

    before = len(memfds())
    a = fastq.shared_array(np.zeros(1000))
    view = a[10:]
    del a
    gc.collect()
    assert len(memfds()) == before + 1  # the view keeps it
    del view
    gc.collect()
    assert len(memfds()) == before


def test_the_copied_arrays_memory_is_released_at_close() -> None:
    """The pool's memfd of copies is closed with the pool; the workers'
    mappings went with them (the clean_world fixture checks both)."""
    big = big_array()
    batches = run(HoldsArrays(big, np.arange(3)), "spawn")
    assert len(batches) == ROWS // 4
    with open("/proc/self/maps") as f:
        assert not [line for line in f if "fastq-dataset-arrays" in line]


LIMITED = """
import resource, sys
import numpy as np
import fastq
from helpers import HoldsArrays

# Files of this process, memfds included, may not grow past 4 MiB (the
# ring fits): the kernel refuses the shared copy of an 8 MiB array.
resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
big = np.zeros((32, 32768))  # 8 MiB
try:
    fastq.shared_array(big)
except fastq.SharedMemoryError as e:
    print("shared_array:", e)
if __name__ == "__main__":
    try:
        fastq.Prefetcher(HoldsArrays(big, np.arange(3)), batch_size=1, workers=1,
                         slots=1, start_method="spawn")  # a ring under 1 MiB
    except fastq.SharedMemoryError as e:
        print("prefetcher:", e)
    from process_checks import ring_mappings
    print("left:", ring_mappings())
"""


def test_memory_refused_for_the_shared_copy_is_a_clear_error(tmp_path: Any) -> None:
    """A real refusal by the kernel (a file-size limit), not a mock: both
    routes raise SharedMemoryError naming the bytes and the limit, and
    leave nothing."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    script = tmp_path / "limited.py"
    script.write_text(LIMITED)
    env = {"PYTHONPATH": f"{tests}:{tests.parent}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(
        line.startswith("shared_array: no room for fastq-shared-array")
        and "8388608 bytes" in line
        and "ulimit -f" in line
        for line in lines
    ), proc.stdout
    assert any(
        line.startswith("prefetcher: no room for fastq-dataset-arrays")
        for line in lines
    ), proc.stdout
    assert "left: []" in lines
