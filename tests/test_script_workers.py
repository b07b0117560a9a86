"""A training script run as a file, with workers that do not fork: its
top-level classes reach the workers by name, and the workers run the
script again, as DataLoader's do, so module-level values are the script's
as imported, beside torch's DataLoader with the same result; a script
without a main guard ends with the fix, naming itself, whatever its
dataset's size. (A __main__ without a file is in
tests/test_main_without_file.py.)"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
# Each starts a fresh interpreter (with torch) per worker: the long route,
# so forkserver's runs by default and spawn's with FASTQ_SLOW_TESTS=1.
PICKLING_METHODS = [
    pytest.param(m, marks=pytest.mark.slow) if m == "spawn" else m
    for m in ("spawn", "forkserver")
    if m in mp.get_all_start_methods()
]

# Both loaders over a dataset class of this script, with a collate_fn of
# it, after main() changed a module-level value; prints one JSON line.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.utils.data
    import fastq.torch

    SETTINGS = {"scale": 0}

    class Scaled(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i * SETTINGS["scale"]

    def collate(batch):
        return torch.tensor(batch) + 100 * SETTINGS["scale"]

    def main():
        SETTINGS["scale"] = 5  # after import: workers that re-import see 0
        out = {}
        for name, cls in (("torch", torch.utils.data.DataLoader),
                          ("fastq", fastq.torch.DataLoader)):
            loader = cls(Scaled(), batch_size=2, num_workers=1,
                         collate_fn=collate, multiprocessing_context=sys.argv[1])
            out[name] = [b.tolist() for b in loader]

        # Defined where a worker's run of the script never goes: DataLoader's
        # workers cannot find it; fastq's get it by value.
        class Local(torch.utils.data.Dataset):
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return i + SETTINGS["scale"]

        loader = fastq.torch.DataLoader(Local(), batch_size=2, num_workers=1,
                                        multiprocessing_context=sys.argv[1])
        out["local"] = [b.tolist() for b in loader]
        print(json.dumps(out), flush=True)

    if __name__ == "__main__":
        main()
    """
)

# No main guard: every worker runs the loop again while it starts. The
# dataset's pickle (a million paths), or the first batch's indices (a
# batch of 50000), is more than a pipe holds.
UNGUARDED = textwrap.dedent(
    """
    import sys
    import torch.utils.data
    from fastq.torch import DataLoader

    class Paths(torch.utils.data.Dataset):
        def __init__(self, n):
            self.paths = [f"/data/{i:07d}.jpg" for i in range(n)]

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            return i

    size, batch = int(sys.argv[1]), int(sys.argv[2])
    for batch in DataLoader(Paths(size), batch_size=batch, num_workers=1,
                            multiprocessing_context="spawn"):
        break
    """
)


def _run(script: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=script.parent,
    )


@pytest.mark.parametrize("method", PICKLING_METHODS)
def test_module_level_values_as_dataloader_workers_see_them(
    method: str, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = _run(script, method, timeout=100)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["fastq"] == out["torch"] == [[0, 0], [0, 0]]
    assert out["local"] == [[5, 6], [7, 8]]


@pytest.mark.parametrize(("size", "batch"), [(10**6, 8), (50_000, 50_000)])
def test_unguarded_script_ends_naming_itself(
    size: int, batch: int, tmp_path: Path
) -> None:
    """It used to hang in multiprocessing's write of the worker's start
    data (NOTE [ The pickle beside the pipe ] in fastq/_workers/_shared_arrays.py)."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    done = _run(script, str(size), str(batch), timeout=100)
    assert done.returncode != 0
    assert "fastq.errors.WorkerDied" in done.stderr, done.stderr
    fix = [line for line in done.stderr.splitlines() if line.startswith("fastq: ")]
    assert fix, done.stderr
    assert f"({script})" in fix[0]
    assert '`if __name__ == "__main__":`' in fix[0]
