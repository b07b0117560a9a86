"""A run of fastq.vision's dataset resumed mid-epoch on another number of
workers makes the crops the uninterrupted run made: boxes, flips and
pixels are functions of (seed, epoch, index), not of which worker or how
many make them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import vision_fixtures as vf

import fastq
from fastq.vision import ImageFiles, ImageFolder

pytestmark = pytest.mark.timeout(120)
BATCH = 4
EPOCHS = 2
SAVED_AFTER = 3  # batches of the second epoch


def dataset(root: str, encoded: bool) -> ImageFiles:
    # The fixture files three times over: 27 samples, each its own index
    # and so its own crop.
    files = ImageFolder(root, vf.train_transform()).samples
    out = ImageFiles(files * 3, vf.train_transform())
    out.decode_on_gpu(encoded)
    return out


def make(data: ImageFiles, workers: int, state: Any = None) -> fastq.Prefetcher:
    spec = data.encoded_spec(BATCH) if data.encoded else None
    return fastq.Prefetcher(
        data,
        batch_size=BATCH,
        workers=workers,
        shuffle=True,
        seed=None if state else 19,
        spec=spec,
        state=state,
    )


def owned(batch: Any) -> Any:
    """The batch's crops, copied out of its slot."""
    if isinstance(batch, dict):
        out = {k: np.array(v) for k, v in batch.items() if k != "data"}
        out["data"] = [row.tobytes() for row in batch["data"]]
        return out
    return tuple(np.array(v) for v in batch)


def same(a: list[Any], b: list[Any]) -> bool:
    def equal(x: Any, y: Any) -> bool:
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(equal(p, q) for p, q in zip(x, y))
        return bool(np.array_equal(x, y))

    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("encoded", [False, True], ids=["decoded", "encoded"])
def test_a_resumed_run_on_two_workers_crops_as_the_run_on_three(
    tmp_path: Any, encoded: bool
) -> None:
    vf.write_folder(str(tmp_path))
    with make(dataset(str(tmp_path), encoded), workers=3) as pf:
        whole = [[owned(b) for b in pf] for _ in range(EPOCHS)]

    with make(dataset(str(tmp_path), encoded), workers=3) as pf:
        first = [owned(b) for b in pf]
        it = iter(pf)
        second = [owned(next(it)) for _ in range(SAVED_AFTER)]
        state = json.loads(json.dumps(pf.state_dict()))
        del it  # its last batch's slot, mapped while it lives
    assert state["epoch"] == 1 and state["batches_done"] == SAVED_AFTER
    with make(dataset(str(tmp_path), encoded), workers=2, state=state) as pf:
        rest = [owned(b) for b in pf]

    assert same(first, whole[0])
    assert same(second + rest, whole[1])
    if encoded:  # each crop is its (seed, epoch, index)'s
        plan = dataset(str(tmp_path), encoded).decode_plan
        assert plan is not None
        for epoch, batches in enumerate(whole):
            for batch in batches:
                for index, size, box in zip(
                    batch["index"], batch["size"], batch["box"]
                ):
                    crop = plan.crop(19, epoch, int(index), *(int(v) for v in size))
                    assert tuple(box) == crop[0]
