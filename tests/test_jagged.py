"""Variable-length fields: declared with fastq.Jagged (a bound per sample,
a budget per batch), written by every kind of source, delivered in place
as values plus offsets (torch's jagged layout), bit for bit; a sample over
its bound or a batch over its budget is a SpecError naming the field, the
length, the limit and the fix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastq

pytestmark = pytest.mark.timeout(60)

N, BATCH, MAX_LEN = 37, 8, 23
SPEC = {
    "audio": fastq.Jagged("float32", max_len=MAX_LEN),
    "boxes": fastq.Jagged("int32", max_len=5, inner=(4,)),
    "label": ((), "int64"),
}


def clip(i: int) -> dict[str, Any]:
    """Sample i: an audio clip of 1..23 values and 0..5 boxes."""
    n, b = (i * 7) % MAX_LEN + 1, i % 6
    return {
        "audio": np.arange(n, dtype=np.float32) + i,
        "boxes": np.full((b, 4), i, dtype=np.int32),
        "label": np.int64(i),
    }


class Clips:
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, Any]:
        return clip(i)


class ClipsGetitems(Clips):
    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [clip(i) for i in indices]


class ClipsFill(Clips):
    """fill_batch writes each jagged field's values and offsets itself."""

    def fill_batch(self, indices: Any, out: dict[str, Any]) -> None:
        for field in ("audio", "boxes"):
            jag = out[field]
            jag.offsets[0] = 0
            for k, i in enumerate(indices):
                rows = clip(int(i))[field]
                start = jag.offsets[k]
                jag.values[start : start + len(rows)] = rows
                jag.offsets[k + 1] = start + len(rows)
        out["label"][:] = indices


def clip_stream() -> Iterator[dict[str, Any]]:
    info = fastq.get_worker_info()
    assert info is not None
    return (clip(i) for i in range(info.id, N, info.num_workers))


def check(batch: dict[str, Any]) -> list[int]:
    """A batch's samples equal clip(label), bit for bit; their labels."""
    labels = batch["label"].tolist()
    for field in ("audio", "boxes"):
        jag = batch[field]
        assert isinstance(jag, fastq.JaggedArray) and len(jag) == len(labels)
        assert jag.offsets[0] == 0 and jag.offsets[-1] == len(jag.values)
        for k, i in enumerate(labels):
            np.testing.assert_array_equal(jag[k], clip(i)[field])
    return labels


@pytest.mark.parametrize("source", [Clips, ClipsGetitems, ClipsFill])
def test_every_map_path_writes_jagged_fields_bit_for_bit(
    started_by: dict[str, str], source: type[Clips]
) -> None:
    with fastq.Prefetcher(
        source(),
        batch_size=BATCH,
        workers=2,
        spec=SPEC,
        shuffle=True,
        seed=1,
        **started_by,
    ) as pf:
        batches = [check(b) for b in pf]
    assert sorted(i for b in batches for i in b) == list(range(N))
    assert [len(b) for b in batches] == [8, 8, 8, 8, 5]  # the short last one too


def test_a_sample_stream_writes_jagged_fields(started_by: dict[str, str]) -> None:
    with fastq.Prefetcher(
        clip_stream, batch_size=BATCH, workers=2, spec=SPEC, **started_by
    ) as pf:
        got = [i for b in pf for i in check(b)]
    assert sorted(got) == list(range(N))


def whole_batches() -> Iterator[dict[str, Any]]:
    """Whole batches: a jagged field as a list of samples or a JaggedArray."""
    for start in range(0, N, BATCH):
        samples = [clip(i) for i in range(start, min(N, start + BATCH))]
        audio = [s["audio"] for s in samples]
        lengths = [len(s["boxes"]) for s in samples]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        boxes = fastq.JaggedArray(
            np.concatenate([s["boxes"] for s in samples]), offsets
        )
        labels = np.array([s["label"] for s in samples])
        yield {"audio": audio, "boxes": boxes, "label": labels}


def test_a_stream_of_whole_batches_writes_jagged_fields() -> None:
    spec = dict(SPEC, label=((BATCH,), "int64"))
    with fastq.Prefetcher(whole_batches, workers=1, spec=spec) as pf:
        got = [i for b in pf for i in check(b)]
    assert got == list(range(N))


class Converted(Clips):
    """Rows that take the checked path: a list of numbers, and values in
    the other byte order."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = clip(i)
        sample["audio"] = sample["audio"].tolist()
        sample["boxes"] = sample["boxes"].astype(">i4")
        return sample


def test_lists_and_the_other_byte_order_are_converted() -> None:
    with fastq.Prefetcher(Converted(), batch_size=BATCH, workers=1, spec=SPEC) as pf:
        got = [i for b in pf for i in check(b)]
    assert got == list(range(N))


def test_copies_outlive_the_slot() -> None:
    with fastq.Prefetcher(
        Clips(), batch_size=BATCH, workers=1, spec=SPEC, copy=True
    ) as pf:
        kept = list(pf)
    assert [i for b in kept for i in check(b)] == list(range(N))


def test_padded_gives_the_array_and_lengths_training_code_wants() -> None:
    with fastq.Prefetcher(Clips(), batch_size=BATCH, workers=1, spec=SPEC) as pf:
        batch = next(iter(pf))
        audio, lengths = batch["audio"].padded(pad_value=-1)
        boxes, box_lengths = batch["boxes"].padded(length=6)
    assert audio.shape == (BATCH, max(lengths)) and boxes.shape == (BATCH, 6, 4)
    for k, i in enumerate(batch["label"].tolist()):
        want = clip(i)["audio"]
        assert lengths[k] == len(want)
        np.testing.assert_array_equal(audio[k, : len(want)], want)
        assert (audio[k, len(want) :] == -1).all()
        assert (
            box_lengths[k] == len(clip(i)["boxes"])
            and (boxes[k, box_lengths[k] :] == 0).all()
        )
    with pytest.raises(ValueError, match="shorter than the longest"):
        batch["audio"].padded(length=1)


# ----------------------------------------------------------------- bounds


def epoch_raises(source: Clips, match: str, spec: dict[str, Any] = SPEC) -> None:
    """The epoch raises a SpecError matching `match` at the batch at fault."""
    with fastq.Prefetcher(source, batch_size=BATCH, workers=1, spec=spec) as pf:
        with pytest.raises(fastq.SpecError, match=match):
            list(pf)


class Long(Clips):
    def __getitem__(self, i: int) -> dict[str, Any]:
        sample = clip(i)
        if i == 3:
            sample["audio"] = np.zeros(MAX_LEN + 7, np.float32)
        return sample


def test_a_sample_over_its_bound_names_field_length_bound_and_fix() -> None:
    epoch_raises(
        Long(),
        r"field 'audio' of a sample: 30 rows, over its bound max_len=23; "
        r"raise max_len.*sample 3\)",
    )


def test_a_batch_over_its_budget_names_field_total_budget_and_fix() -> None:
    epoch_raises(
        Clips(),
        r"field 'audio': 4 samples of a batch have 46 rows together, over "
        r"its budget=40; raise budget=",
        dict(SPEC, audio=fastq.Jagged("float32", max_len=MAX_LEN, budget=40)),
    )


class AtTheBound(Clips):
    def __getitem__(self, i: int) -> dict[str, Any]:
        return dict(clip(i), audio=np.full(MAX_LEN, i, np.float32))


def test_the_default_budget_holds_every_sample_at_its_bound() -> None:
    with fastq.Prefetcher(AtTheBound(), batch_size=BATCH, workers=1, spec=SPEC) as pf:
        lengths = {int(n) for b in pf for n in b["audio"].lengths}
    assert lengths == {MAX_LEN}


class BadFill(Clips):
    def fill_batch(self, indices: Any, out: dict[str, Any]) -> None:
        out["audio"].offsets[:] = np.arange(len(indices) + 1) * 100  # over max_len


def test_a_fill_batch_that_writes_bad_offsets_is_refused() -> None:
    epoch_raises(BadFill(), r"field 'audio': fill_batch wrote offsets")


class WrongKind(Clips):
    def __getitem__(self, i: int) -> dict[str, Any]:
        return dict(clip(i), boxes=np.zeros((2, 4), np.float64))


def test_values_of_another_kind_are_refused_naming_the_field() -> None:
    epoch_raises(WrongKind(), r"field 'boxes'.*float64.*int32")


@pytest.mark.parametrize(
    ("jagged", "match"),
    [
        (fastq.Jagged("float32", max_len=0), r"'audio': Jagged max_len=0"),
        (fastq.Jagged("float32", max_len=4, budget=-1), r"Jagged budget=-1"),
        (fastq.Jagged("no such dtype", max_len=4), r"is not a numpy dtype"),
        (fastq.Jagged("float32", max_len=4, inner=(-1,)), r"Jagged inner=\(-1,\)"),
    ],
)
def test_a_bad_declaration_names_the_field_and_the_value(
    jagged: fastq.Jagged, match: str
) -> None:
    with pytest.raises(fastq.SpecError, match=match):
        fastq.Prefetcher(Clips(), batch_size=4, workers=1, spec={"audio": jagged})


def test_whole_batches_need_a_fixed_field_to_count_their_samples() -> None:
    with pytest.raises(fastq.SpecError, match="every field is jagged.*batch_size"):
        fastq.Prefetcher(
            whole_batches, workers=1, spec={"a": fastq.Jagged("float32", max_len=3)}
        )


# ------------------------------------------------------------------ torch


def test_torch_gets_nested_tensors_over_the_slot() -> None:
    torch = pytest.importorskip("torch")
    from fastq.torch import TorchPrefetcher

    with TorchPrefetcher(Clips(), BATCH, workers=1, spec=SPEC) as pf:
        batch = next(iter(pf))
        audio = batch["audio"]
        assert audio.is_nested and audio.layout == torch.jagged
        for k, i in enumerate(batch["label"].tolist()):
            assert torch.equal(audio[k], torch.from_numpy(clip(i)["audio"]))
        assert batch["boxes"].values().shape[1:] == (4,)


@pytest.mark.parametrize("gpu", [{"pin_memory": True}, {"device": "cuda:0"}])
def test_torch_refuses_jagged_fields_on_the_gpu_route_with_the_fix(
    gpu: dict[str, Any],
) -> None:
    """Refused before any worker starts, with or without a GPU here."""
    pytest.importorskip("torch")
    from fastq.torch import TorchPrefetcher

    with pytest.raises(fastq.ConfigError, match=r"jagged field 'audio'.*\.to\(device"):
        TorchPrefetcher(Clips(), BATCH, workers=1, spec=SPEC, **gpu)
