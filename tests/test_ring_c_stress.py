"""The C ring's threaded stress test (src_c/tests/stress_ring.c), built plain,
under ThreadSanitizer and under AddressSanitizer + UBSan, and run."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC_C = Path(__file__).resolve().parent.parent / "src_c"
SOURCES = [SRC_C / "tests" / "stress_ring.c", SRC_C / "fq_ring.c"]
CC = shutil.which("cc") or shutil.which("gcc")

# Mirrors src_c/tests/Makefile: keep the two in step.
COMMON = ["-std=c11", "-g", "-Wall", "-Wextra", "-Werror", "-pthread"]
VARIANTS = {
    "plain": ["-O2"],
    "tsan": ["-O1", "-fsanitize=thread"],
    "asan": [
        "-O1",
        "-fno-omit-frame-pointer",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=undefined",
    ],
}
SANITIZER_ENV = {
    "TSAN_OPTIONS": "halt_on_error=1 second_deadlock_stack=1",
    "ASAN_OPTIONS": "detect_leaks=1",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) found")


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The three builds, in a directory removed afterwards."""
    out = tmp_path_factory.mktemp("stress_ring")
    built = {}
    try:
        for name, flags in VARIANTS.items():
            exe = out / f"stress_ring_{name}"
            cmd = [str(CC), *COMMON, *flags, "-o", str(exe), *map(str, SOURCES)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, (
                f"building the {name} variant failed:\n{' '.join(cmd)}\n"
                f"{proc.stdout}{proc.stderr}"
            )
            built[name] = exe
        yield built
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_stress(
    exe: Path, args: list[str], timeout: float, expect: str = "stress_ring: OK"
) -> str:
    """Runs one build; fails with its whole output unless it exits 0."""
    env = {**os.environ, **SANITIZER_ENV}
    cmd = [str(exe), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = proc.stdout + proc.stderr
    # TSan maps its shadow memory at fixed addresses; on kernels whose mmap
    # randomisation uses more bits than its runtime expects it cannot start.
    # Without ASLR it can, and that changes nothing the test checks.
    if proc.returncode != 0 and "unexpected memory mapping" in out:
        cmd = ["setarch", platform.machine(), "-R", *cmd]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env
        )
        out = "(rerun under setarch -R)\n" + proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out}"
    assert expect in out, out
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_stress_short(binaries: dict[str, Path], variant: str) -> None:
    out = run_stress(binaries[variant], ["--short"], timeout=150)
    print(out)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_push_waits_for_late_popper(binaries: dict[str, Path], variant: str) -> None:
    """A FREE push that meets a cell still held by a preempted popper waits
    for it instead of reporting FQ_EFULL (it once did, about one run in
    three of the TSan short form)."""
    run_stress(binaries[variant], ["--efull-repro"], timeout=30, expect="repro: OK")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_stress_long(binaries: dict[str, Path], variant: str) -> None:
    out = run_stress(binaries[variant], ["--long"], timeout=1500)
    print(out)
