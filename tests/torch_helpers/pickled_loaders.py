"""A fastq.torch.DataLoader handed, mid-epoch, to the launchers that copy it
into new processes, for tests/test_dataloader_pickle.py:

    python pickled_loaders.py spawn|notebook OUT_DIR [--persistent]

``spawn``: torch.multiprocessing.spawn(fn, args=(loader, ...), nprocs=2)
pickles the loader; ``notebook``: accelerate's notebook_launcher with two
CPU processes (it forks them with the loader). Each child trains two
epochs on its copy and writes OUT_DIR/child<i>.json; the parent then ends
its own epoch and writes OUT_DIR/parent.json. Sample i is (i, who made it:
2 a fastq worker, 1 a torch DataLoader worker, 0 the process itself).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.utils.data

import fastq
import fastq.torch

N, BATCH = 32, 4


class Marked(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[int, int]:
        if fastq.get_worker_info() is not None:
            return int(i), 2
        return int(i), 1 if torch.utils.data.get_worker_info() is not None else 0


def consume(loader: Any, epochs: int) -> dict[str, Any]:
    seen: dict[int, list[int]] = {}
    producers: list[int] = []
    for epoch in range(epochs):
        for index, made_by in loader:
            seen.setdefault(epoch, []).extend(int(i) for i in index)
            producers.extend(int(p) for p in made_by)
    return {"seen": seen, "producers": producers, "pid": os.getpid()}


def child(i: int, loader: Any, out: str) -> None:
    Path(out, f"child{i}.json").write_text(json.dumps(consume(loader, 2)))
    loader.close()


def notebook_child(loader: Any, out: str) -> None:
    child(int(os.environ["LOCAL_RANK"]), loader, out)


def main() -> None:
    mode, out = sys.argv[1], sys.argv[2]
    loader = fastq.torch.DataLoader(
        Marked(),
        batch_size=BATCH,
        shuffle=True,
        num_workers=2,
        persistent_workers="--persistent" in sys.argv,
    )
    it = iter(loader)
    first = next(it)  # mid-epoch: the workers run
    first = [t.clone() for t in first]  # not held in the ring while children run
    if mode == "spawn":
        torch.multiprocessing.spawn(child, args=(loader, out), nprocs=2)
    else:
        from accelerate import notebook_launcher

        notebook_launcher(notebook_child, args=(loader, out), num_processes=2)
    seen, producers = [], set()
    for index, made_by in [first, *it]:
        seen.extend(int(i) for i in index)
        producers.update(int(p) for p in made_by)
    parent = {"seen": sorted(seen), "producers": sorted(producers)}
    Path(out, "parent.json").write_text(json.dumps(parent))
    loader.close()


if __name__ == "__main__":
    main()
