"""A training run over an IterableDataset that checkpoints its loader every
CHECKPOINT batches and is killed with SIGKILL mid-epoch (mode "first"), or
resumes from its last checkpoint to the end of the epoch (mode "resume").
Writes into OUT: the ids each run delivered (delivered-<mode>.txt), each
checkpoint (state.json, replaced atomically, with the batches before it),
and, from the workers, every sample they made (made-<mode>-<pid>.txt)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from torch_helpers.stream_sources import KeepsItsPlace

CHECKPOINT = 4
KILL_AFTER = 10  # batches
BATCH = 2


class Logged(KeepsItsPlace):
    """KeepsItsPlace, noting in a file of its worker's every sample made."""

    def __init__(self, out: Path, mode: str) -> None:
        super().__init__()
        self.out, self.mode = out, mode

    def __iter__(self) -> Iterator[torch.Tensor]:
        with open(self.out / f"made-{self.mode}-{os.getpid()}.txt", "a") as log:
            for sample in super().__iter__():
                log.write(f"{int(sample[0])}\n")
                log.flush()
                yield sample


def main(out: Path, mode: str, workers: int) -> None:
    from fastq.torch import DataLoader

    loader = DataLoader(Logged(out, mode), batch_size=BATCH, num_workers=workers)
    delivered = []
    if mode == "resume":
        loader.load_state_dict(json.loads((out / "state.json").read_text())["state"])
    with open(out / f"delivered-{mode}.txt", "w") as log:
        for n, batch in enumerate(loader, 1):
            for sample in batch[:, 0].tolist():
                log.write(f"{sample}\n")
                delivered.append(sample)
            log.flush()
            if n % CHECKPOINT == 0:
                record = {"state": loader.state_dict(), "delivered": delivered}
                tmp = out / "state.json.tmp"
                tmp.write_text(json.dumps(record))
                os.replace(tmp, out / "state.json")
            if mode == "first" and n == KILL_AFTER:
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
