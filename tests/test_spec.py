"""Spec: explicit and inferred; a wrong item names the field, the expected
and what came."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import IMAGE_SHAPE, PatternDataset, WrongDtypeDataset, WrongShapeDataset

import fastq
from fastq._layout._spec import BatchSpec

pytestmark = pytest.mark.timeout(60)


def test_inferred_spec_describes_every_field() -> None:
    spec = BatchSpec.from_sample(PatternDataset(3)[0], rows=8)
    assert [(f.name, f.shape, f.dtype) for f in spec.fields] == [
        ("[0]", IMAGE_SHAPE, np.dtype(np.uint8)),
        ("[1]", (), np.dtype(np.int64)),
        ("[2]", (), np.dtype(np.float32)),
    ]
    assert all(f.offset % 64 == 0 for f in spec.fields)


def test_explicit_spec_is_used() -> None:
    spec = {"image": (IMAGE_SHAPE, "uint8"), "index": ((), "int64")}
    with fastq.Prefetcher(
        DictOfPattern(12), batch_size=4, workers=1, spec=spec, start_method="fork"
    ) as pf:
        batch = next(iter(pf))
        assert set(batch) == {"image", "index"}
        assert batch["image"].shape == (4, *IMAGE_SHAPE)


class DictOfPattern(PatternDataset):
    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        image, index, _ = super().__getitem__(i)
        return {"image": image, "index": index}


@pytest.mark.parametrize(
    "dataset,field,got",
    [
        (WrongShapeDataset(10), "'[0]'", "shape (3, 2, 7)"),
        (WrongDtypeDataset(10), "'[2]'", "dtype float64"),
    ],
)
def test_a_wrong_sample_names_the_field(dataset, field, got) -> None:  # type: ignore[no-untyped-def]
    with fastq.Prefetcher(dataset, batch_size=2, workers=2, start_method="fork") as pf:
        with pytest.raises(fastq.SpecError) as info:
            list(pf)
    msg = str(info.value)
    assert f"field {field}" in msg and got in msg and "expected" in msg
    assert "sample 5" in msg
    assert pf.closed


def test_explicit_spec_mismatch_is_reported() -> None:
    with fastq.Prefetcher(
        PatternDataset(8),
        batch_size=2,
        workers=1,
        spec=(((3, 5, 7), "uint8"), ((), "int32"), ((), "float32")),
        start_method="fork",
    ) as pf:
        with pytest.raises(fastq.SpecError, match=r"field '\[1\]'.*dtype int32.*int64"):
            next(iter(pf))


def test_object_dtype_is_refused_with_the_field_name() -> None:
    class Objects(PatternDataset):
        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            return {"names": np.array(["a", None], dtype=object)}

    with pytest.raises(fastq.SpecError, match="field 'names'.*Python objects"):
        fastq.Prefetcher(Objects(4), batch_size=2, start_method="fork")


def test_structure_mismatch_is_a_spec_error() -> None:
    spec = BatchSpec.from_sample((np.zeros(2), 1), rows=2)
    with pytest.raises(fastq.SpecError, match="structure"):
        spec.flatten({"a": 1}, "a sample")


def test_bad_spec_argument_explains_the_format() -> None:
    with pytest.raises(fastq.SpecError, match="expected \\(shape, dtype\\)"):
        fastq.Prefetcher(
            PatternDataset(4), batch_size=2, spec={"x": 3}, start_method="fork"
        )
    with pytest.raises(fastq.SpecError, match="not a numpy dtype"):
        fastq.Prefetcher(
            PatternDataset(4),
            batch_size=2,
            spec={"x": ((2,), "nope")},
            start_method="fork",
        )
