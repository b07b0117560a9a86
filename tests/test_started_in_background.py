"""The README's test command started in the background (`cmd &`, nohup),
which leaves SIGINT ignored: the tests that send SIGINT still see it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)

# One test of each kind that sends SIGINT: to this process, to a worker
# being started, and to a victim process the test starts.
SENDERS = [
    "test_process_life.py::test_ctrl_c_while_a_worker_starts_is_raised_once_it_has",
    "test_dataloader_errors.py::test_ctrl_c_while_waiting_then_running_the_cell_again",
    "test_faults.py::test_ctrl_c_during_close_still_reaps_every_worker",
    "feed/test_feed_interrupts.py::test_an_interrupt_anywhere_in_next_costs_a_pass_no_item",
]


def ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(240)
def test_the_ctrl_c_tests_pass_with_sigint_ignored_at_start() -> None:
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider"]
        + [os.path.join(HERE, s) for s in SENDERS],
        cwd=os.path.dirname(HERE),
        preexec_fn=ignore_sigint,  # what `cmd &` gives a background job
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary
