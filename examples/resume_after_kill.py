"""A training run killed mid-epoch resumes from its last checkpoint and
goes on exactly as if it had never stopped: the same samples in the same
order, the same weights at the end, bit for bit.

    python examples/resume_after_kill.py

runs Lightning three times in child processes: once without a stop; once
killed with SIGKILL at step 11 (the last checkpoint was written at step 8,
in the middle of the first epoch); once more from that checkpoint. Then it
compares the runs.

The only fastq line is the import: fastq.torch.DataLoader has
``state_dict()`` / ``load_state_dict()``, so Lightning saves the loader's
place (the epoch, the batches delivered, the base seed, the shuffle's
generator state) in every checkpoint and loads it when it resumes, as it
does for torchdata's StatefulDataLoader. A hand-written loop does the
same: ``torch.save({"model": ..., "loader": loader.state_dict()})``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fastq.torch import DataLoader  # the one changed line

SAMPLES, BATCH, EPOCHS, EVERY = 96, 8, 2, 4  # 12 steps per epoch


class Noisy(torch.utils.data.Dataset):
    """Each sample is its index, a fixed input and fresh noise from the
    worker's generator (an augmentation), so order and randomness show."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, np.ndarray]:
        x = np.random.default_rng(i).standard_normal(16).astype(np.float32)
        return i, x + 0.1 * np.random.standard_normal(16).astype(np.float32)


class Regression(L.LightningModule):
    def __init__(self, log: Path, kill_at: int | None) -> None:
        super().__init__()
        self.net = nn.Linear(16, 1)
        self.log_path, self.kill_at = log, kill_at

    def training_step(self, batch: list[torch.Tensor], _: int) -> torch.Tensor:
        index, x = batch
        step = self.global_step + 1
        with self.log_path.open("a") as f:
            f.write(json.dumps({"step": step, "samples": index.tolist()}) + "\n")
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, with no goodbye
        return (self.net(x).squeeze(1) - x.sum(1)).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def train(out: Path, kill_at: int | None, resume: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(0, verbose=False)
    loader = DataLoader(Noisy(), batch_size=BATCH, shuffle=True, num_workers=2)
    model = Regression(out / "steps.jsonl", kill_at)
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        default_root_dir=out,
        callbacks=[ModelCheckpoint(out, every_n_train_steps=EVERY, save_top_k=-1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = None
    if resume:
        last = max(out.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    trainer.fit(model, loader, ckpt_path=last)
    torch.save(model.state_dict(), out / "final.pt")


def steps(out: Path) -> dict[int, list[int]]:
    lines = (out / "steps.jsonl").read_text().splitlines()
    return {r["step"]: r["samples"] for r in map(json.loads, lines)}


def run(out: Path, *flags: str) -> int:
    """One training run in a child process; its output shows if it fails."""
    cmd = [sys.executable, __file__, "--out", str(out), *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    child = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if child.returncode not in (0, -signal.SIGKILL):
        sys.stderr.write(child.stdout + child.stderr)
    return child.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="(a child run's directory)")
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    if args.out is not None:
        train(args.out, args.kill_at, args.resume)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        whole, broken = Path(tmp, "whole"), Path(tmp, "broken")
        assert run(whole) == 0
        code = run(broken, "--kill-at", "11")
        saved = sorted(int(p.stem.split("step=")[1]) for p in broken.glob("*.ckpt"))
        print(f"killed at step 11 (exit {code}); checkpoints at steps {saved}")
        before = steps(broken)
        (broken / "steps.jsonl").unlink()
        assert run(broken, "--resume") == 0
        after, want = steps(broken), steps(whole)
        first = min(after)
        print(f"resumed at step {first}; {len(after)} steps to the end")
        same_data = all(after[s] == want[s] for s in after)
        per_epoch = SAMPLES // BATCH
        seen = [i for s in range(1, first) for i in before[s]]
        seen += [i for s in range(first, per_epoch + 1) for i in after[s]]
        every_once = sorted(seen) == list(range(SAMPLES))
        a = torch.load(whole / "final.pt")
        b = torch.load(broken / "final.pt")
        same_weights = all(torch.equal(a[k], b[k]) for k in a)
    print(f"same samples, in the same order, at every step: {same_data}")
    print(f"the interrupted epoch saw every sample once: {every_once}")
    print(f"final weights bit-identical to the run that never stopped: {same_weights}")
    return 0 if same_data and every_once and same_weights else 1


if __name__ == "__main__":
    sys.exit(main())
