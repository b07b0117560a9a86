"""A bench run's session: runs its cases one after another, each with a
progress line, and keeps every result for the tables and --json."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import procstat
from .isolated import run_isolated
from .measure import Budget, Options, Result, run
from .transports import AUTO, TRANSPORTS, Case


class Session:
    """Runs cases one after another with a progress line each."""

    def __init__(self, args: argparse.Namespace, budget: Budget, total: int) -> None:
        self.budget = budget
        self.in_process = bool(args.in_process)
        self.repeat = max(1, int(args.repeat))
        self.quiet = float(args.quiet)
        self.total = total
        self.done = 0
        self.records: list[dict[str, Any]] = []
        self.skipped: set[str] = set()

    def run(
        self,
        section: str,
        case: Case,
        options: Options | None = None,
        budget: Budget | None = None,
    ) -> Result:
        options = options or Options()
        budget = budget or self.budget
        self.done += 1
        t = TRANSPORTS[case.transport]
        print(
            f"[{self.done:3}/{self.total}] {section:10} {case.workload:8} "
            f"w={'auto' if case.transport == AUTO else case.workers} {t.label:28}",
            end=" ",
            flush=True,
            file=sys.stderr,
        )
        missing = t.missing()
        if missing:
            result = run(case, budget, options)  # records the reason only
            self.skipped.add(missing)
        else:
            # Start-up runs are repeated as cases of their own: one run each.
            runs = [
                self._once(case, budget, options)
                for _ in range(1 if options.first_only else self.repeat)
            ]
            ok = sorted((r for r in runs if not r.error), key=lambda r: r.batches_per_s)
            result = ok[len(ok) // 2] if ok else runs[0]
            result.repeats = [r.batches_per_s for r in ok]
        print(_progress(result), file=sys.stderr, flush=True)
        self.records.append({"section": section, **result.to_json()})
        return result

    def _once(self, case: Case, budget: Budget, options: Options) -> Result:
        busy = procstat.wait_for_quiet(self.quiet) if self.quiet > 0 else None
        if self.in_process and options.spin_us is None:
            result = run(case, budget, options)
        else:
            result = run_isolated(case, budget, options)
        result.busy_before = busy
        return result


def _progress(r: Result) -> str:
    if r.error:
        return r.error.split(": ", 1)[-1]
    if not r.batches:
        return f"first batch {r.first_batch_s:.3f} s"
    text = (
        f"{r.batches_per_s:10.1f} batches/s {r.gb_per_s:7.2f} GB/s  "
        f"first batch {r.first_batch_s:.2f} s"
    )
    if r.latency_us:
        text += f"  latency p50 {r.latency_us['p50']:.1f} us"
    if len(r.repeats) > 1:
        text += f"  (median of {len(r.repeats)} runs)"
    if r.busy_before is not None:
        text += f"  [machine {100 * r.busy_before:.0f}% busy before]"
    return text
