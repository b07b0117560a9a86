"""The C ring's stress and fault tests (src_c/tests/, stress_ring.c's
header says what each mode checks), built plain, under ThreadSanitizer and under
AddressSanitizer + UBSan, and run: the threaded stress, a push meeting a
popper stalled inside its pop, and worker and consumer processes killed
(SIGKILL) or paused (SIGSTOP) at each fault point of the queue operations."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC_C = Path(__file__).resolve().parent.parent / "src_c"
TESTS_C = SRC_C / "tests"
# The stress program's files and the ring's (the Makefile's SRC).
SOURCES = [*sorted(TESTS_C.glob("*.c")), SRC_C / "fq_ring.c", SRC_C / "fq_flags.c"]
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
# The forked modes run plain and under ASan+UBSan, not TSan: TSan sees one
# address space (the other processes' accesses are invisible to it) and
# does not support fork in its multithreaded runtime (see the Makefile).
FORK_VARIANTS = ["plain", "asan"]

pytestmark = [
    pytest.mark.skipif(CC is None, reason="no C compiler (cc or gcc) found"),
]


def tsan_warning_flags() -> list[str]:
    """GCC 11+ warns (-Wtsan) that TSan does not model atomic_thread_fence,
    which fq_ring.c uses for atomics only; silenced where the compiler has
    the option, as the Makefile does."""
    probe = [str(CC), "-Werror", "-Wno-tsan", "-fsanitize=thread", "-x", "c"]
    probe += ["-c", os.devnull, "-o", os.devnull]
    proc = subprocess.run(probe, capture_output=True, timeout=60)
    return ["-Wno-tsan"] if proc.returncode == 0 else []


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The three builds, in a directory removed afterwards."""
    out = tmp_path_factory.mktemp("stress_ring")
    built = {}
    try:
        for name, flags in VARIANTS.items():
            exe = out / f"stress_ring_{name}"
            extra = tsan_warning_flags() if name == "tsan" else []
            cmd = [str(CC), *COMMON, *extra, *flags, "-o", str(exe)]
            cmd += map(str, SOURCES)
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
def test_push_meets_stalled_popper(binaries: dict[str, Path], variant: str) -> None:
    """A push that laps onto the cell of a popper stalled inside its pop:
    fq_try_push says FQ_EBUSY and changes nothing, fq_push says FQ_TIMEOUT
    at its timeout, and a waiting fq_push ends with FQ_OK when the popper
    resumes, FQ_ALERT on alert and FQ_CLOSED on close (it once reported a
    full queue, FQ_EFULL, about one run in three of the TSan short form)."""
    run_stress(
        binaries[variant], ["--stalled-popper"], timeout=30, expect="stalled popper: OK"
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", FORK_VARIANTS)
def test_fork_kills(binaries: dict[str, Path], variant: str) -> None:
    """Worker processes SIGKILLed inside their FREE pop, their claim and
    their READY push, and a consumer process inside its READY pop and its
    FREE push: the death is seen, nothing hangs, and the census accounts
    for every slot and task. A few seconds; the watchdog inside exits 3."""
    out = run_stress(
        binaries[variant], ["--fork-kills"], timeout=100, expect="fork kills: OK"
    )
    print(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", FORK_VARIANTS)
def test_stop_continue(binaries: dict[str, Path], variant: str) -> None:
    """A worker SIGSTOPped inside a queue operation for 200 ms and then
    continued costs nothing: no alert, the releases that met its cell are
    deferred and go through, every task is delivered once."""
    out = run_stress(
        binaries[variant], ["--stop-cont"], timeout=100, expect="stop/continue: OK"
    )
    print(out)


@pytest.mark.timeout(60)
def test_a_stop_point_never_reached_fails_the_sweep(binaries: dict[str, Path]) -> None:
    """The stop/continue sweep's own coverage check can fail: with every
    stop point past the run's tasks, the first case is tried with 8 seeds,
    none stops, and the sweep fails naming it (a run kept from its stop
    point by a loaded machine is retried the same way, and passes once one
    stops)."""
    cmd = [str(binaries["plain"]), "--stop-cont", "-r", "1", "-c", "100000"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "in 8 tries the victim never stopped at its point" in out, out
    assert "stop/continue: FAIL" in out and "retried=8 " in out, out


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_stress_long(binaries: dict[str, Path], variant: str) -> None:
    out = run_stress(binaries[variant], ["--long"], timeout=1500)
    print(out)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "mode,expect",
    [("--fork-kills", "fork kills: OK"), ("--stop-cont", "stop/continue: OK")],
)
def test_fork_faults_long(binaries: dict[str, Path], mode: str, expect: str) -> None:
    """The forked fault modes with forty sweeps, each with its own seeds."""
    out = run_stress(binaries["plain"], [mode, "--long"], timeout=800, expect=expect)
    print(out)
