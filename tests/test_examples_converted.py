"""Scripts from pytorch/examples, converted to fastq as the README says: the
DataLoader import line, and nothing else, becomes
``from fastq.torch import DataLoader``.

The scripts are vendored in tests/examples_converted/ (adapted to run here
on fake data made locally; each names its original). The conversion is
done here, textually, and the diff must be that one line. Each converted
script runs to its end through its own command line, fastq's workers
making every sample of the fake datasets, its printed metrics must be
sane, and no process or shared memory may be left. The default run
has a short form (one epoch each, under a minute); FASTQ_SLOW_TESTS=1 runs
more epochs, MNIST and ImageNet also unconverted (with a fixed seed, every
printed loss and accuracy must be the same), and ImageNet under torchrun.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from pathlib import Path

import pytest
from tagged_runs import launch

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch]

EXAMPLES = Path(__file__).resolve().parent / "examples_converted"
TORCH_LINE = "from torch.utils.data import DataLoader"
FASTQ_LINE = "from fastq.torch import DataLoader"


def convert(name: str, out_dir: Path) -> Path:
    """The vendored script with its DataLoader import line changed, written
    into out_dir."""
    original = (EXAMPLES / name).read_text()
    lines = original.splitlines(keepends=True)
    assert [ln.rstrip("\n") for ln in lines].count(TORCH_LINE) == 1, name
    converted = "".join(
        FASTQ_LINE + "\n" if ln.rstrip("\n") == TORCH_LINE else ln for ln in lines
    )
    changed = [
        ln
        for ln in difflib.unified_diff(
            original.splitlines(), converted.splitlines(), lineterm="", n=0
        )
        if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
    ]
    assert changed == [f"-{TORCH_LINE}", f"+{FASTQ_LINE}"]
    path = out_dir / name
    path.write_text(converted)
    return path


def run(
    script: Path,
    *args: str,
    cwd: Path,
    fake_len: int = 0,
    nproc: int = 0,
    timeout: float = 100,
) -> str:
    """Runs a script (under torchrun with `nproc` processes), its fake
    datasets cut to `fake_len` samples; its output."""
    cmd = [sys.executable]
    if nproc:
        cmd += ["-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={nproc}"]
    cmd += [str(script), *args]
    env = {"EXAMPLES_FAKE_LEN": str(fake_len)} if fake_len else {}
    if script.parent != EXAMPLES:
        env["EXAMPLES_IN_FASTQ"] = "1"  # converted: fastq's workers make every sample
    return launch(cmd, cwd, timeout, path=(EXAMPLES,), env=env)


def both(
    tmp_path: Path, name: str, *args: str, fake_len: int, timeout: float = 150
) -> tuple[str, str]:
    """(the original's output, the converted script's output), each run in
    a directory of its own (the scripts write checkpoints)."""
    outs = []
    for kind in ("torch", "fastq"):
        cwd = tmp_path / kind
        cwd.mkdir()
        script = EXAMPLES / name if kind == "torch" else convert(name, cwd)
        outs.append(run(script, *args, cwd=cwd, fake_len=fake_len, timeout=timeout))
    return outs[0], outs[1]


# --------------------------------------------------------------------- MNIST

MNIST_TRAIN = re.compile(r"Train Epoch: (\d+) \[(\d+)/(\d+) \((\d+)%\)\]\tLoss: (\S+)")
MNIST_TEST = re.compile(
    r"Test set: Average loss: (\S+), Accuracy: (\d+)/(\d+) \((\d+)%\)"
)


def check_mnist(out: str, epochs: int, n: int) -> list[str]:
    """Sane metrics for `epochs` epochs over train and test sets of n
    samples each; the metric lines."""
    train = MNIST_TRAIN.findall(out)
    assert {int(e) for e, *_ in train} == set(range(1, epochs + 1)), out[-3000:]
    for _, done, total, percent, loss in train:
        assert int(total) == n and 0 <= int(done) < n and int(percent) <= 100
        assert math.isfinite(float(loss)) and float(loss) >= 0
    tests = MNIST_TEST.findall(out)
    assert len(tests) == epochs, out[-3000:]
    for loss, correct, total, percent in tests:
        assert int(total) == n, "Accuracy's N is not len(test dataset)"
        assert 0 <= int(correct) <= n
        assert int(percent) == round(100 * int(correct) / n) <= 100
        assert math.isfinite(float(loss)) and float(loss) >= 0
    return [
        m.group(0)
        for m in re.finditer(f"{MNIST_TRAIN.pattern}|{MNIST_TEST.pattern}", out)
    ]


@pytest.mark.timeout(120)
def test_mnist_short(tmp_path: Path) -> None:
    script = convert("mnist_main.py", tmp_path)
    args = ["--epochs", "1", "--test-batch-size", "128", "--log-interval", "2"]
    check_mnist(run(script, *args, cwd=tmp_path, fake_len=256), epochs=1, n=256)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_mnist_same_as_torch(tmp_path: Path) -> None:
    args = ["--epochs", "2", "--test-batch-size", "256", "--log-interval", "3"]
    original, converted = both(tmp_path, "mnist_main.py", *args, fake_len=1024)
    assert check_mnist(converted, 2, 1024) == check_mnist(original, 2, 1024)


# ------------------------------------------------------------------ ImageNet

INET_STEP = re.compile(r"Epoch: \[(\d+)\]\[\s*(\d+)/(\d+)\]")
INET_SUMMARY = re.compile(r" \*   Acc@1 (\S+) Acc@5 (\S+)")
INET_METRICS = re.compile(r"(Loss|Acc@1|Acc@5) +(\S+) \(\s*(\S+)\)")


def check_imagenet(out: str, epochs: int, n: int, batch: int) -> list[str]:
    """Sane metrics; every loss and accuracy printed, in order (the times
    are left out)."""
    steps = INET_STEP.findall(out)
    assert {int(e) for e, _, _ in steps} == set(range(epochs)), out[-3000:]
    assert {int(total) for _, _, total in steps} == {math.ceil(n / batch)}
    summaries = INET_SUMMARY.findall(out)
    assert len(summaries) == epochs, out[-3000:]
    for top1, top5 in summaries:
        assert 0 <= float(top1) <= float(top5) <= 100
    metrics = INET_METRICS.findall(out)
    assert metrics, out[-3000:]
    for name, value, average in metrics:
        assert math.isfinite(float(value)) and math.isfinite(float(average))
        if name != "Loss":
            assert 0 <= float(value) <= 100 and 0 <= float(average) <= 100
    return [" ".join(m) for m in metrics] + [" ".join(s) for s in summaries]


@pytest.mark.timeout(120)
def test_imagenet_dummy_short(tmp_path: Path) -> None:
    script = convert("imagenet_main.py", tmp_path)
    args = ["--dummy", "-j", "2", "-b", "16", "--epochs", "1", "-p", "2", "--seed", "0"]
    out = run(script, *args, cwd=tmp_path, fake_len=64)
    check_imagenet(out, epochs=1, n=64, batch=16)
    assert (tmp_path / "checkpoint.pth.tar").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_imagenet_dummy_same_as_torch(tmp_path: Path) -> None:
    args = ["--dummy", "-j", "2", "-b", "16", "--epochs", "2", "-p", "1", "--seed", "0"]
    original, converted = both(tmp_path, "imagenet_main.py", *args, fake_len=192)
    expected = check_imagenet(original, 2, 192, 16)
    assert check_imagenet(converted, 2, 192, 16) == expected


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_imagenet_dummy_torchrun(tmp_path: Path) -> None:
    """Two ranks through the script's own env:// path: DistributedSampler,
    a validation sampler with drop_last, and the extra loader over the
    Subset it leaves out (101 samples: one is left to it)."""
    script = convert("imagenet_main.py", tmp_path)
    args = ["--dummy", "-j", "1", "-b", "16", "--epochs", "2", "-p", "1", "--seed", "0"]
    args += ["--dist-url", "env://", "--dist-backend", "gloo"]
    out = run(script, *args, cwd=tmp_path, fake_len=101, nproc=2, timeout=300)
    # Each rank: ceil(51 / 16) train steps; both print the summary.
    steps = INET_STEP.findall(out)
    assert {int(total) for _, _, total in steps} == {4}
    assert len(INET_SUMMARY.findall(out)) == 2 * 2
    for top1, top5 in INET_SUMMARY.findall(out):
        assert 0 <= float(top1) <= float(top5) <= 100


# ------------------------------------------------------ DDP tutorial (torchrun)

DDP_EPOCH = re.compile(r"\[GPU(\d+)\] Epoch (\d+) \| Batchsize: (\d+) \| Steps: (\d+)")


def check_ddp(out: str, epochs: int, batch: int, nproc: int = 2) -> None:
    seen = DDP_EPOCH.findall(out)
    assert sorted((int(r), int(e)) for r, e, _, _ in seen) == [
        (r, e) for r in range(nproc) for e in range(epochs)
    ], out[-3000:]
    steps = math.ceil(2048 / nproc / batch)  # MyTrainDataset(2048), sharded
    assert {(int(b), int(s)) for _, _, b, s in seen} == {(batch, steps)}
    assert f"Epoch {epochs - 1} | Training snapshot saved at snapshot.pt" in out


@pytest.mark.timeout(150)
def test_ddp_tutorial_torchrun_short(tmp_path: Path) -> None:
    script = convert("multigpu_torchrun.py", tmp_path)
    out = run(script, "1", "1", "--batch_size", "64", cwd=tmp_path, nproc=2)
    check_ddp(out, epochs=1, batch=64)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ddp_tutorial_torchrun(tmp_path: Path) -> None:
    script = convert("multigpu_torchrun.py", tmp_path)
    args = ["3", "2", "--batch_size", "32"]
    out = run(script, *args, cwd=tmp_path, nproc=2, timeout=300)
    check_ddp(out, epochs=3, batch=32)
