"""`python -m fastq bench --case train`, its CPU form at tiny sizes: every
loader hands the loop every image of its steps, with the right shape and
dtypes, across an epoch's end; the report has every column; the JPEG files
are made once, distinct and the same on every run. Behaviour only: the
figures themselves are the benchmark's business."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the training benchmark needs torch")
pytest.importorskip("PIL", reason="the training benchmark decodes JPEGs with Pillow")
pytest.importorskip(
    "matplotlib", reason="the training benchmark's pictures come with matplotlib"
)

from fastq._bench import runner, train, train_data
from fastq._bench.train_loop import LOADERS, Config, Run, _every_index

pytestmark = pytest.mark.torch

BATCH, SIDE, WARMUP, STEPS = 4, 32, 1, 3
# Three batches an epoch: the four batches of the run cross an epoch's end.
FILES = 3 * BATCH


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cpu_form_feeds_every_image_to_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train.json"
    argv = [
        "--case=train",
        "--device=cpu",
        "--model=tiny",
        "--workers=1",
        f"--batch-size={BATCH}",
        f"--image-size={SIDE}",
        f"--warmup-steps={WARMUP}",
        f"--steps={STEPS}",
        f"--images={FILES}",
        f"--data={tmp_path / 'data'}",
        f"--json={out}",
    ]
    assert runner.main(argv) == 0
    text = capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert sorted(r["config"]["loader"] for r in results) == sorted(LOADERS)
    for r in results:
        loader = r["config"]["loader"]
        assert r["error"] is None, (loader, r["error"])
        assert r["images"] == (WARMUP + STEPS) * BATCH, loader
        assert r["bad_batches"] == 0, loader
        assert r["batch_shape"] == [BATCH, 3, SIDE, SIDE], loader
        assert r["dtypes"] == ["torch.uint8", "torch.int64", "torch.int64"], loader
        # Each epoch's indices distinct: every image once per epoch.
        assert r["complete"] is (None if loader == "ceiling" else True), loader
        assert (r["first_batch_s"] is None) == (loader == "ceiling"), loader
        assert r["images_per_s"] > 0 and r["loop_cpu_ms"] > 0, loader
        assert 0 <= r["wait_share"] <= 1 and r["peak_pss"] > 0, loader
    for heading, _ in train.COLUMNS:
        assert heading in text
    rows = [line for line in text.splitlines() if line[:1].isalpha()]
    for loader in LOADERS:
        name = train.label(Config(**{**results[0]["config"], "loader": loader}))
        assert any(line.startswith(name + " ") for line in rows), name
    runs = [
        Run.from_json({k: v for k, v in r.items() if k != "section"}) for r in results
    ]
    assert "images/s, each run" in train.table(runs * 2, repeats=2)


def test_options_that_cannot_be_are_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = ["--case=train", f"--data={tmp_path}"]
    with pytest.raises(SystemExit, match="--pin-memory"):
        runner.main([*base, "--device=cpu", "--pin-memory"])
    with pytest.raises(SystemExit, match="--model vgg"):
        runner.main([*base, "--device=cpu", "--model=vgg"])
    with pytest.raises(SystemExit, match="--loader"):
        runner.main([*base, "--device=cpu", "--loader=Queue"])
    with pytest.raises(SystemExit, match="--images 2"):
        runner.main([*base, "--device=cpu", "--images=2", "--batch-size=4"])
    from fastq._bench import train_model

    monkeypatch.setattr(
        train_model, "torchvision_problem", lambda: "torchvision cannot be imported"
    )
    with pytest.raises(SystemExit, match="torchvision cannot be imported"):
        runner.main([*base, "--device=cpu", "--model=resnet18"])
    assert not os.listdir(tmp_path)


def test_an_index_twice_in_an_epoch_or_a_batch_short_is_caught() -> None:
    # Three batches of two over four files: an epoch is two batches.
    cfg = Config(
        loader="DataLoader",
        model="tiny",
        device="cpu",
        batch_size=2,
        workers=1,
        steps=2,
        warmup=1,
        images=4,
        image_size=SIDE,
        pin_memory=False,
        data="",
        threads=1,
    )
    assert _every_index([3, 0, 1, 2, 2, 1], cfg)
    assert not _every_index([3, 0, 1, 3, 2, 1], cfg)  # 3 twice in epoch 1
    assert not _every_index([3, 0, 1, 2, 2], cfg)  # an image short
    assert not _every_index([3, 0, 1, 4, 2, 1], cfg)  # no file 4


def _digests(paths: list[str]) -> list[str]:
    return [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]


def test_files_are_distinct_reproducible_and_made_once(tmp_path: Path) -> None:
    first = train_data.make_files(str(tmp_path / "a"), 6, SIDE)
    again = train_data.make_files(str(tmp_path / "b"), 6, SIDE)
    assert _digests(first) == _digests(again)
    assert len(set(_digests(first))) == 6
    stamps = [os.stat(p).st_mtime_ns for p in first]
    more = train_data.make_files(str(tmp_path / "a"), 8, SIDE)
    assert more[:6] == first
    assert [os.stat(p).st_mtime_ns for p in first] == stamps
    assert not [n for n in os.listdir(os.path.dirname(first[0])) if n.endswith("tmp")]


def test_a_sample_is_a_random_crop_as_uint8_chw(tmp_path: Path) -> None:
    paths = train_data.make_files(str(tmp_path), 3, SIDE)
    dataset = train_data.Images(paths, SIDE, classes=2)
    image, label, index = dataset[2]
    assert image.shape == (3, SIDE, SIDE) and image.dtype.name == "uint8"
    assert image.flags.c_contiguous
    assert (int(label), int(index)) == (0, 2)
    random.seed(0)
    for _ in range(200):
        width, height = random.randint(1, 900), random.randint(1, 900)
        top, left, h, w = train_data.crop_box(width, height)
        assert h > 0 and w > 0
        assert 0 <= top <= height - h and 0 <= left <= width - w


def test_the_models_take_a_step() -> None:
    import torch

    from fastq._bench import train_model

    for model in ("tiny", "cnn"):
        step = train_model.make_step(model, torch.device("cpu"))
        images = torch.randint(0, 256, (2, 3, SIDE, SIDE), dtype=torch.uint8)
        step(images, torch.tensor([0, 1]))


def test_a_gpu_decode_row_that_cannot_run_here_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the decode stage or its backend, the row is 'not available'
    with the reason, and nothing else is measured in its place."""
    from fastq._bench import train_decode, train_loop

    monkeypatch.setattr(
        train_decode, "problem", lambda loader, device: "no stage in this checkout"
    )
    cfg = train.plan(
        models=["tiny"],
        workers=[1],
        loaders=["GPU decode: nvImageCodec"],
        device="cpu",
        batch_size=BATCH,
        steps=1,
        warmup=1,
        images=FILES,
        image_size=SIDE,
        data=str(tmp_path),
    )
    assert [c.loader for c in cfg] == ["GPU decode: nvImageCodec"]
    run = train_loop.measure(cfg[0])
    assert run.error == "not available: no stage in this checkout"
    assert run.images == 0
    text = train.table([run])
    assert "GPU decode: nvImageCodec" in text and "not available" in text
    # On the CPU the GPU-decode rows run only when asked for.
    default = train.plan(models=["tiny"], device="cpu", data=str(tmp_path))
    assert not {c.loader for c in default} & set(train.DECODE_LOADERS)


def test_the_set_has_imagenets_shapes_and_a_few_files_a_gpu_engine_leaves(
    tmp_path: Path,
) -> None:
    """Sizes spread around 500 x 375 for 224-pixel crops (scaled to the
    side), mostly 4:3, and a few progressive and grayscale files, as
    NOTE [ An ImageNet-like set ] says."""
    from PIL import Image

    paths = train_data.make_files(str(tmp_path), 200, SIDE)
    longer, landscape, progressive, gray = [], 0, 0, 0
    for p in paths:
        with Image.open(p) as f:
            w, h = f.size
            longer.append(max(w, h))
            landscape += w > h
            progressive += bool(f.info.get("progressive"))
            gray += f.mode == "L"
    expected = SIDE * 500 / 224
    assert 0.8 * expected <= min(longer) and max(longer) <= 1.2 * expected
    assert landscape > len(paths) / 2
    assert 1 <= progressive <= len(paths) / 10
    assert 1 <= gray <= len(paths) / 10
