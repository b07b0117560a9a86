"""One training run through a trainer, for tests/test_trainers.py and
benchmarks/trainers_first_batch.py: each rank records what its training
steps saw into OUT_DIR/<route>-rank<r>.json.

    python trainer_routes.py ROUTES OUT_DIR [--devices N] [--loader fastq|torch]
                             [--epochs E] [--no-val]

Routes: ``lightning-hook`` (the loaders come from the module's
``*_dataloader`` hooks), ``lightning-toplevel`` (built before the Trainer and
passed to ``fit``), both with ``--devices 2`` for DDP on CPU (Lightning's
launcher re-runs this script for rank 1); ``accelerate-prepare`` (the loader
goes through ``accelerator.prepare``), ``accelerate-skip`` (that, and the
second epoch through ``accelerator.skip_first_batches(loader, 2)``, as a
resumed run does), ``accelerate-uneven`` (60 samples: accelerate's
``even_batches`` fills the last batches from the start), ``accelerate-sampler``
(only the model and optimizer are prepared; the loader gets a
DistributedSampler), and
``accelerate-prefetcher`` (a TorchPrefetcher, which shards itself),
``accelerate-iterable`` (``fastq.torch.IterableDataset(...).loader()``,
which shards itself too, kept out of ``prepare``) and
``accelerate-iterable-prepare`` (that loader given to ``prepare``, which
wraps it with one process and refuses it with several: the refusal is
recorded). The accelerate routes run under torchrun for two processes
(``accelerate launch
--cpu --num_processes 2`` starts one). ``transformers`` trains a model
defined here with transformers' ``Trainer`` (its own torch DataLoader, two
workers, on the CPU), with ``fastq.torch.install()`` for ``--loader
fastq``, recording each step's loss. Several routes run one after another
in the same processes. ``--loader torch`` swaps in torch's DataLoader (and
no install()).

Sample i is (features(i), i, producer, fastq epoch): the producer says which
kind of process made it (2: a fastq worker, 1: a torch DataLoader worker,
0: the training process), and the fastq epoch is the one its worker was
producing (-1 outside fastq).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# This script's folder holds a datasets.py of its own, which would hide
# Hugging Face's `datasets` from transformers.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402
import torch.utils.data  # noqa: E402

import fastq  # noqa: E402


def _loader_flag(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--loader" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--loader="):
            return arg.split("=", 1)[1]
    return "fastq"


if _loader_flag(sys.argv) == "fastq":
    # At the top, as a training script moved to fastq imports its loader.
    import fastq.torch

    if "transformers" in sys.argv[1].split(","):
        fastq.torch.install()  # the one line before a Trainer

N = 64  # a multiple of world size x batch size: no padding, no partial batch
BATCH = 8
FEATURES = 6
VAL_N = 32
UNEVEN_N = 60  # not a multiple of world size x batch size

T0 = time.perf_counter()  # the script's start, for wall_s


class Labeled(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i = (features(i), i, producer, fastq epoch)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int, int]:
        i = int(i)
        x = torch.sin(torch.arange(FEATURES, dtype=torch.float32) * (i + 1) / 7)
        info = fastq.get_worker_info()
        if info is not None:
            return x, i, 2, info.epoch
        if torch.utils.data.get_worker_info() is not None:
            return x, i, 1, -1
        return x, i, 0, -1


class Record:
    """What this rank's steps saw, written as JSON at the end."""

    def __init__(self) -> None:
        self.train: dict[int, list[int]] = {}
        self.fastq_epochs: dict[int, list[int]] = {}
        self.val: dict[int, list[int]] = {}
        self.producers: set[int] = set()
        self.first_batch_s: float | None = None
        self.fit_start: float | None = None
        self.loader_types: set[str] = set()
        self.times: list[float] = []  # each training batch, from the start
        self.refused: str | None = None  # the error a route was refused with
        self.ends: list[bool] = []  # accelerate's end_of_dataloader, per batch
        self.devices: set[str] = set()  # where the batches arrived
        self.losses: list[float] = []  # each training step's loss

    def start(self) -> None:
        self.fit_start = time.perf_counter()

    def batch(self, epoch: int, batch: Any, val: bool = False) -> None:
        _, labels, producers, fq_epochs = batch
        if not val and self.fit_start is not None:
            self.times.append(round(time.perf_counter() - self.fit_start, 3))
        if not val and self.first_batch_s is None and self.fit_start is not None:
            self.first_batch_s = time.perf_counter() - self.fit_start
        target = self.val if val else self.train
        target.setdefault(epoch, []).extend(int(i) for i in labels)
        self.producers.update(int(p) for p in producers)
        if not val:
            seen = self.fastq_epochs.setdefault(epoch, [])
            seen.extend(sorted({int(e) for e in fq_epochs} - set(seen)))

    def write(self, out_dir: Path, route: str, rank: int, world_size: int) -> None:
        data = {
            "route": route,
            "rank": rank,
            "world_size": world_size,
            "train": self.train,
            "fastq_epochs": self.fastq_epochs,
            "val": self.val,
            "producers": sorted(self.producers),
            "loader_types": sorted(self.loader_types),
            "refused": self.refused,
            "ends": self.ends,
            "devices": sorted(self.devices),
            "losses": self.losses,
            "first_batch_s": self.first_batch_s,
            "batch_times_s": self.times,
            "cpu_s": round(time.process_time(), 2),
            "wall_s": round(time.perf_counter() - T0, 2),
            "pid": os.getpid(),
        }
        path = out_dir / f"{route}-rank{rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


def loader_class(kind: str) -> Any:
    if kind == "torch":
        return torch.utils.data.DataLoader
    from fastq.torch import DataLoader

    return DataLoader


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 4)


def loss_of(net: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, labels, _, _ = batch
    return torch.nn.functional.cross_entropy(net(x), labels % 4)


# ----------------------------------------------------------------- Lightning


def run_lightning(route: str, args: argparse.Namespace) -> None:
    import lightning as L

    Loader = loader_class(args.loader)
    record = Record()

    def train_loader() -> Any:
        return Loader(Labeled(N), batch_size=BATCH, shuffle=True, num_workers=2)

    def val_loader() -> Any:
        return Loader(Labeled(VAL_N), batch_size=BATCH, num_workers=2)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def on_fit_start(self) -> None:
            record.start()  # after the launch and the process group's setup

        def on_train_epoch_start(self) -> None:
            record.loader_types.add(type(self.trainer.train_dataloader).__name__)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            record.batch(self.current_epoch, batch)
            return loss_of(self.net, batch)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            if not self.trainer.sanity_checking:
                record.batch(self.current_epoch, batch, val=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class FromHooks(Module):
        def train_dataloader(self) -> Any:
            return train_loader()

        def val_dataloader(self) -> Any:
            return val_loader() if args.val else []

    kwargs: dict[str, Any] = {}
    if args.devices > 1:
        kwargs["strategy"] = "ddp"
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1.0 if args.val else 0,
        **kwargs,
    )
    if route == "lightning-toplevel":
        trainer.fit(
            Module(),
            train_dataloaders=train_loader(),
            val_dataloaders=val_loader() if args.val else None,
        )
    elif route == "lightning-hook":
        trainer.fit(FromHooks())
    else:
        raise SystemExit(f"unknown route {route!r}")
    record.write(args.out_dir, route, trainer.global_rank, trainer.world_size)


# ---------------------------------------------------------------- accelerate


def run_accelerate(route: str, args: argparse.Namespace, accelerator: Any) -> None:
    rank, world = accelerator.process_index, accelerator.num_processes
    record = Record()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    record.start()
    Loader = loader_class(args.loader)
    if route in ("accelerate-prepare", "accelerate-skip", "accelerate-uneven"):
        n = UNEVEN_N if route == "accelerate-uneven" else N
        loader: Any = Loader(Labeled(n), batch_size=BATCH, shuffle=True, num_workers=2)
        net, opt, loader = accelerator.prepare(net, opt, loader)
    elif route == "accelerate-sampler":
        sampler = torch.utils.data.DistributedSampler(
            Labeled(N), num_replicas=world, rank=rank, shuffle=True
        )
        loader = Loader(Labeled(N), batch_size=BATCH, sampler=sampler, num_workers=2)
        net, opt = accelerator.prepare(net, opt)
    elif route == "accelerate-prefetcher":
        from fastq.torch import TorchPrefetcher

        loader = TorchPrefetcher(Labeled(N), batch_size=BATCH, shuffle=True, workers=2)
        net, opt = accelerator.prepare(net, opt)
    elif route in ("accelerate-iterable", "accelerate-iterable-prepare"):
        from fastq.torch import IterableDataset

        adapter = IterableDataset(Labeled(N), batch_size=BATCH, shuffle=True, workers=2)
        loader = adapter.loader()
        if route == "accelerate-iterable":
            net, opt = accelerator.prepare(net, opt)
        else:
            try:
                net, opt, loader = accelerator.prepare(net, opt, loader)
            except fastq.ConfigError as exc:
                record.refused = str(exc)
                record.write(args.out_dir, route, rank, world)
                return
    else:
        raise SystemExit(f"unknown route {route!r}")
    # What iterates: accelerate's DataLoaderShard wraps a new loader in
    # base_dataloader (and says it is that loader's class).
    inner = getattr(loader, "base_dataloader", loader)
    record.loader_types.add(type(loader).__name__)
    record.loader_types.add(f"{type(inner).__module__}.{type(inner).__name__}")
    for epoch in range(args.epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        epoch_loader = loader
        if route == "accelerate-skip" and epoch == 1:
            # A run resumed two steps into its second epoch.
            epoch_loader = accelerator.skip_first_batches(loader, 2)
            record.loader_types.add(type(epoch_loader).__name__)
        for batch in epoch_loader:
            record.batch(epoch, batch)
            record.ends.append(accelerator.gradient_state.end_of_dataloader)
            record.devices.add(str(batch[0].device))
            opt.zero_grad()
            accelerator.backward(loss_of(net, batch))
            opt.step()
    if hasattr(loader, "close"):
        loader.close()
    record.write(args.out_dir, route, rank, world)


# -------------------------------------------------------------- transformers


def run_transformers(route: str, args: argparse.Namespace) -> None:
    """transformers' Trainer on the CPU builds its own torch DataLoader over
    a dict dataset and hands it to accelerate; each step records its batch
    and loss."""
    from transformers import Trainer, TrainingArguments

    record = Record()

    class Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.labeled = Labeled(N)

        def __len__(self) -> int:
            return N

        def __getitem__(self, i: int) -> dict[str, Any]:
            x, label, producer, fq_epoch = self.labeled[i]
            return {"x": x, "labels": label, "producer": producer, "fq": fq_epoch}

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model()

        def forward(
            self,
            x: torch.Tensor,
            labels: torch.Tensor,
            producer: torch.Tensor,
            fq: torch.Tensor,
        ) -> dict[str, torch.Tensor]:
            loss = loss_of(self.net, (x, labels, producer, fq))
            if self.training:
                epoch = len(record.losses) // (N // BATCH)
                record.batch(epoch, (x, labels, producer, fq))
                record.losses.append(loss.item())
            return {"loss": loss}

    training_args = TrainingArguments(
        output_dir=str(args.out_dir / "trainer"),
        use_cpu=True,
        per_device_train_batch_size=BATCH,
        num_train_epochs=args.epochs,
        dataloader_num_workers=2,
        learning_rate=0.1,
        seed=0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=Tiny(), args=training_args, train_dataset=Samples())
    record.start()
    trainer.train()
    record.loader_types.add(type(trainer.get_train_dataloader()).__name__)
    record.write(args.out_dir, route, 0, 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("routes", help="comma-separated routes, run one after another")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--loader", choices=["fastq", "torch"], default="fastq")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--no-val", dest="val", action="store_false")
    args = p.parse_args()
    accelerator = None
    for route in args.routes.split(","):
        if route.startswith("lightning"):
            run_lightning(route, args)
            continue
        if route == "transformers":
            run_transformers(route, args)
            continue
        if accelerator is None:
            from accelerate import Accelerator

            accelerator = Accelerator(cpu=True)
        run_accelerate(route, args, accelerator)
    if accelerator is not None:
        accelerator.end_training()


if __name__ == "__main__":
    main()
