"""What the instruction-counting benchmarks share: a child run of a script
under valgrind's callgrind, in an environment that starts no idle thread,
and its total instruction count."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable


def quiet_env() -> dict[str, str]:
    """This environment, with numpy's BLAS kept from starting idle threads
    the counts would include, and hashing fixed so runs repeat."""
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    env["PYTHONHASHSEED"] = "0"
    return env


def instructions(script: str, args: list[str], out: str) -> int:
    """Instructions ``python script *args`` executes, counted by callgrind;
    its output file is left at ``out``."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    cmd += [sys.executable, os.path.abspath(script), *args]
    subprocess.run(cmd, env=quiet_env(), check=True, capture_output=True)
    with open(out) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def run_steps(
    setup: Callable[[str, str], Callable[[int], None]],
    shape: str,
    variant: str,
    batches: int,
) -> None:
    """The counted child: ``batches`` steps of ``setup(shape, variant)``."""
    step = setup(shape, variant)
    for t in range(batches):
        step(t)


def step_instructions(
    script: str, shape: str, variant: str, batches: int, tmp: str
) -> int:
    """Instructions of ``script``'s child (``--child shape variant
    batches``, which calls run_steps), its output file left in ``tmp``."""
    out = os.path.join(tmp, f"cg.{shape}.{variant}.{batches}")
    return instructions(script, ["--child", shape, variant, str(batches)], out)
