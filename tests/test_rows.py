"""The producer's copies into slot rows (fastq._layout._rows) give exactly what the
spec's checked Python path gives (check the leaf, then numpy assignment),
on the memcpy fast paths and on every fallback: the same bytes for what the
spec accepts, the same SpecError, naming the field, for what it refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import fastq
from fastq._layout._rows import STREAM_BATCH_BYTES, RowWriter, copy_rows
from fastq._layout._spec import BatchSpec
from fastq.errors import SpecError

pytestmark = pytest.mark.timeout(60)

ROWS = 6


def spec_of(fields: list[tuple[str, tuple[int, ...], Any]]) -> BatchSpec:
    structure = ("tuple", len(fields), tuple(None for _ in fields))
    return BatchSpec(structure, fields, ROWS)


def written(spec: BatchSpec, samples: list[Any]) -> list[np.ndarray[Any, Any]]:
    views = spec.views(bytearray(spec.slot_bytes), ROWS)
    for v in views:
        v[...] = (
            np.frombuffer(b"\xa5" * v.nbytes, np.uint8).view(v.dtype).reshape(v.shape)
        )
    RowWriter(spec).write_samples(samples.__getitem__, list(range(len(samples))), views)
    return views


def checked_path(spec: BatchSpec, leaf: Any) -> np.ndarray[Any, Any] | Exception:
    """Row 0 of field 0 as the spec's Python path writes `leaf`, or the
    exception it raises."""
    view = spec.views(bytearray(spec.slot_bytes), ROWS)[0]
    try:
        view[0] = spec.check_row(0, leaf)
    except Exception as exc:
        return exc
    return view[0]


LEAVES = {
    # field dtype and row shape -> leaves, accepted or refused by the spec
    ("uint8", (2, 3)): [
        np.arange(6, dtype=np.uint8).reshape(2, 3),  # matching: one memcpy
        np.arange(6, dtype=np.uint8).reshape(3, 2).T,  # not contiguous
        np.arange(6, dtype=np.int64).reshape(2, 3),  # other dtype: refused
        np.zeros((3, 2), np.uint8),  # other shape: refused
        [[1, 2, 3], [4, 5, 6]],  # a list
    ],
    ("int64", ()): [
        np.int64(-7),  # the field's own scalar
        -(2**63),  # a Python int at the edge
        np.int32(5),  # another scalar type
        np.array(9, np.int64),  # a 0-d array
        True,
        "7",
    ],
    ("float64", ()): [1.5, np.float64(-0.25), 3, np.float32(0.1)],
    ("float32", ()): [0.1, np.float32(2.5), 7],
    (">i4", ()): [np.dtype(">i4").type(-3), 12],  # not native: never raw bytes
    ("uint8", ()): [np.uint8(255), 17],
    ("complex64", (2,)): [np.array([1 + 2j, 3 - 4j], np.complex64)],
    ("bool", ()): [np.bool_(True), False],
}


@pytest.mark.parametrize("dtype,shape", list(LEAVES))
def test_every_kind_of_leaf_lands_as_the_checked_path_writes_it(
    dtype: str, shape: tuple[int, ...]
) -> None:
    spec = spec_of([("x", shape, dtype)])
    for leaf in LEAVES[(dtype, shape)]:
        want = checked_path(spec, leaf)
        if isinstance(want, Exception):
            with pytest.raises(type(want), match="field 'x'"):
                written(spec, [(leaf,)])
        else:
            got = written(spec, [(leaf,)])[0][0]
            assert got.tobytes() == want.tobytes(), leaf


# Every numeric scalar type numpy has, as the field's own scalar: its value
# is read straight out of the scalar object, and must be the bytes numpy's
# assignment writes (longdouble's padding aside, which numpy leaves too).
SCALAR_DTYPES = [t for t in np.sctypeDict.values() if np.dtype(t).kind in "biufc"]


@pytest.mark.parametrize(
    "dtype", sorted({np.dtype(t).str for t in SCALAR_DTYPES}), ids=str
)
def test_every_numeric_scalar_type_lands_as_numpy_assigns_it(dtype: str) -> None:
    dt = np.dtype(dtype).newbyteorder("=")
    spec = spec_of([("x", (), dt)])
    raw = np.frombuffer(bytes(range(7, 7 + dt.itemsize * ROWS)), dt)
    if dt.kind == "b":
        raw = np.arange(ROWS) % 2 == 1
    leaves = [raw[j] for j in range(ROWS)]
    assert all(type(leaf) is dt.type for leaf in leaves)
    got = written(spec, [(leaf,) for leaf in leaves])[0]
    want = np.empty(ROWS, dt)
    for j, leaf in enumerate(leaves):
        want[j] = leaf
    if np.dtype(dt).type in (np.longdouble, np.clongdouble):  # padding aside
        np.testing.assert_array_equal(got, want)
    else:
        assert got.tobytes() == want.tobytes()


def test_indices_array_gives_what_its_list_gives() -> None:
    spec = spec_of([("x", (2,), "float32"), ("label", (), "int64")])
    seen: list[list[Any]] = [[], []]

    def sample(i: int) -> Any:
        seen[-1].append((type(i), i))
        return np.full(2, i, np.float32), np.int64(i * 3)

    indices = np.array([5, 2**40, -1, 0, 7, 3], np.int64)
    views_a = spec.views(bytearray(spec.slot_bytes), ROWS)
    views_b = spec.views(bytearray(spec.slot_bytes), ROWS)
    RowWriter(spec).write_samples(sample, indices.tolist(), views_a)
    seen.append([])
    RowWriter(spec).write_indices(sample, indices, views_b)
    assert seen[1] == seen[2]
    for a, b in zip(views_a, views_b):
        assert a.tobytes() == b.tobytes()
    # Other index arrays (another dtype, strided) take the list's path.
    seen.append([])
    small = indices.astype(np.int32)
    RowWriter(spec).write_indices(sample, small, views_b)
    assert seen[3] == [(int, i) for i in small.tolist()]
    seen.append([])
    RowWriter(spec).write_indices(sample, np.repeat(indices, 2)[::2], views_b)
    assert seen[4] == seen[1]


def test_an_error_in_write_indices_names_its_row() -> None:
    spec = spec_of([("label", (), "int64")])
    views = spec.views(bytearray(spec.slot_bytes), ROWS)
    writer = RowWriter(spec)

    def sample(i: int) -> Any:
        if i == 4:
            raise KeyError(i)
        return (np.int64(i),)

    with pytest.raises(KeyError):
        writer.write_indices(sample, np.arange(ROWS, dtype=np.int64) + 2, views)
    assert writer.row == 2


def test_single_array_and_dict_structures() -> None:
    single = BatchSpec(None, [("batch", (4,), "float32")], ROWS)
    samples = [np.full(4, j, np.float32) for j in range(ROWS)]
    got = written(single, samples)[0]
    np.testing.assert_array_equal(got, np.stack(samples))

    nested = BatchSpec.from_sample({"a": np.zeros(3, np.int16), "b": (1.0, 2)}, ROWS)
    samples2 = [{"a": np.full(3, j, np.int16), "b": (j / 2, j)} for j in range(ROWS)]
    views = written(nested, samples2)
    np.testing.assert_array_equal(views[0], [[j] * 3 for j in range(ROWS)])
    np.testing.assert_array_equal(views[1], [j / 2 for j in range(ROWS)])
    np.testing.assert_array_equal(views[2], list(range(ROWS)))


def test_a_wrong_leaf_raises_spec_error_naming_the_field_and_the_row() -> None:
    spec = spec_of([("image", (2, 3), "uint8"), ("label", (), "int64")])
    writer = RowWriter(spec)
    views = spec.views(bytearray(spec.slot_bytes), ROWS)
    good = (np.zeros((2, 3), np.uint8), 1)
    bad = (np.zeros((3, 2), np.uint8), 1)
    samples = [good, good, bad]
    with pytest.raises(SpecError, match=r"field 'image'.*shape \(3, 2\)"):
        writer.write_samples(samples.__getitem__, [0, 1, 2], views)
    assert writer.row == 2


def test_a_python_int_out_of_range_is_numpys_error() -> None:
    spec = spec_of([("label", (), "int64")])
    with pytest.raises(OverflowError):
        written(spec, [(2**63,)])


def test_an_error_in_user_code_leaves_the_row_that_failed() -> None:
    spec = spec_of([("label", (), "int64")])
    writer = RowWriter(spec)
    views = spec.views(bytearray(spec.slot_bytes), ROWS)

    def get(k: int) -> tuple[int]:
        if k == 4:
            raise KeyError(k)
        return (k,)

    with pytest.raises(KeyError):
        writer.write_samples(get, [0, 1, 2, 3, 4, 5], views)
    assert writer.row == 4


def test_more_keys_than_rows_is_refused() -> None:
    spec = spec_of([("label", (), "int64")])
    views = spec.views(bytearray(spec.slot_bytes), ROWS)
    with pytest.raises(ValueError, match="fewer than"):
        RowWriter(spec).write_samples(lambda k: (k,), list(range(ROWS + 1)), views)


@pytest.mark.parametrize(
    "src",
    [
        np.arange(12, dtype=np.float32).reshape(4, 3),  # one memcpy
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # not contiguous
        np.arange(12, dtype=np.float64).reshape(4, 3),  # cast
        np.arange(3, dtype=np.float32),  # broadcast, as numpy does
    ],
)
def test_copy_rows_is_numpys_slice_assignment(src: np.ndarray[Any, Any]) -> None:
    dst = np.full((ROWS, 3), -1, np.float32)
    ref = dst.copy()
    copy_rows(dst, src, 4)
    ref[:4] = src
    np.testing.assert_array_equal(dst, ref)


# A large batch of rows whose size is no multiple of 16: rows start at every
# alignment, so the streaming copy's unaligned head and tail are exercised.
BIG_ROW = (3, 227, 227)
BIG_ROWS = 64


class BigRows:
    def __len__(self) -> int:
        return 3 * BIG_ROWS

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        rng = np.random.default_rng(i)
        return rng.integers(0, 256, BIG_ROW, dtype=np.uint8), i


def test_rows_of_a_large_batch_are_streamed_bit_for_bit() -> None:
    fields = [("image", BIG_ROW, np.dtype(np.uint8)), ("label", (), np.dtype(np.int64))]
    spec = BatchSpec(("tuple", 2, (None, None)), fields, BIG_ROWS)
    assert spec.slot_bytes >= STREAM_BATCH_BYTES
    writer = RowWriter(spec)
    assert writer.stream
    views = spec.views(bytearray(spec.slot_bytes), BIG_ROWS)
    ds = BigRows()
    writer.write_samples(ds.__getitem__, list(range(BIG_ROWS)), views)
    assert np.array_equal(views[0], np.stack([ds[i][0] for i in range(BIG_ROWS)]))
    assert views[1].tolist() == list(range(BIG_ROWS))


def test_streamed_rows_reach_the_consumer_whole() -> None:
    """Across processes: the fence after the non-temporal stores comes
    before the slot is published, so the consumer reads every byte."""
    ds = BigRows()
    with fastq.Prefetcher(ds, batch_size=BIG_ROWS, workers=2) as pf:
        for _ in range(2):
            for b, (images, labels) in enumerate(pf):
                rows = range(b * BIG_ROWS, (b + 1) * BIG_ROWS)
                assert labels.tolist() == list(rows)
                assert np.array_equal(images, np.stack([ds[i][0] for i in rows]))
