"""Results as text tables (with ratios to memcpy and to both pickled
queues), as JSON, and as a plot of GB/s per transport per shape."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence
from typing import Any

from .measure import Result, Side
from .transports import TRANSPORTS
from .workloads import WORKLOADS

MEMCPY, SEED, QUEUE = "memcpy", "queue-seed", "queue"
Column = tuple[str, int, Any]  # heading, width, cell function


def machine() -> str:
    cpus = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count()
    )
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (
                    ln.split(":", 1)[1].strip()
                    for ln in f
                    if ln.startswith("model name")
                ),
                "",
            )
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{model or platform.machine()}, {cpus} CPUs{mem}, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def _key(r: Result) -> str:
    return str(r.case["transport"])


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    return format(value, spec)


def _cpu(side: Side) -> str:
    # /proc's CPU times tick every 10 ms: below that per window, say so.
    return "-" if side.cpu_us == 0 and side.minflt == 0 else f"{side.cpu_us:.0f}"


def _ratio(r: Result, base: Result | None) -> str:
    if base is None or base.error or r.error or not base.batches_per_s:
        return "-"
    x = r.batches_per_s / base.batches_per_s
    return f"{x:.2f}" if x < 10 else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _render(rows: Sequence[Result], columns: Sequence[Column]) -> str:
    head = "  ".join(
        h.rjust(w) if i else h.ljust(w) for i, (h, w, _) in enumerate(columns)
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(
                f"{r.label.ljust(columns[0][1])}  {r.error.split(': ', 1)[-1]}"
            )
            continue
        cells = [str(fn(r)) for _, _, fn in columns]
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, (_, w, _)) in enumerate(zip(cells, columns))
            )
        )
    return "\n".join(lines)


def throughput_table(results: Sequence[Result]) -> str:
    """One group of results (same shape and workers) with ratios."""
    by = {_key(r): r for r in results}
    memcpy, seed, queue = by.get(MEMCPY), by.get(SEED), by.get(QUEUE)
    perf = any(r.consumer.syscalls is not None for r in results)
    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("batches/s", 10, lambda r: _fmt(r.batches_per_s, ".1f")),
        ("GB/s", 6, lambda r: _fmt(r.gb_per_s, ".2f")),
        ("us/batch", 9, lambda r: _fmt(r.us_per_batch, ".1f")),
        ("x memcpy", 8, lambda r: _ratio(r, memcpy)),
        ("x seed q", 8, lambda r: _ratio(r, seed)),
        ("x queue", 7, lambda r: _ratio(r, queue)),
        ("cons CPU us/b", 13, lambda r: _fmt(r.consumer.cpu_us, ".0f")),
        ("prod CPU us/b", 13, lambda r: _cpu(r.producers)),
        (
            "faults/b c+p",
            12,
            lambda r: _fmt(r.consumer.minflt + r.producers.minflt, ".1f"),
        ),
    ]
    if perf:
        cols.append(
            (
                "syscalls/b c+p",
                14,
                lambda r: (
                    "-"
                    if r.consumer.syscalls is None
                    else f"{r.consumer.syscalls:.1f}+{r.producers.syscalls or 0:.1f}"
                ),
            )
        )
    cols += [
        ("PSS MB", 7, lambda r: _fmt(r.pss_bytes / 1e6, ".0f")),
        ("1st batch s", 11, lambda r: _fmt(r.first_batch_s, ".2f")),
        ("spread", 6, lambda r: _fmt(r.spread, ".2f")),
    ]
    if any(len(r.repeats) > 1 for r in results):
        cols.append(("runs spread", 11, _run_spread))
    return _render(results, cols)


def _run_spread(r: Result) -> str:
    """(max - min) / median of the repeated runs' rates."""
    if len(r.repeats) < 2 or not r.batches_per_s:
        return "-"
    return f"{(max(r.repeats) - min(r.repeats)) / r.batches_per_s:.2f}"


def latency_table(results: Sequence[Result]) -> str:
    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("p50 us", 9, lambda r: _fmt(r.latency_us.get("p50"), ".1f")),
        ("p90 us", 9, lambda r: _fmt(r.latency_us.get("p90"), ".1f")),
        ("p99 us", 9, lambda r: _fmt(r.latency_us.get("p99"), ".1f")),
        ("max us", 9, lambda r: _fmt(r.latency_us.get("max"), ".0f")),
        ("cons CPU us/b", 13, lambda r: _fmt(r.consumer.cpu_us, ".1f")),
    ]
    return _render(results, cols)


def handover_table(results: Sequence[Result]) -> str:
    """Time inside next() with the batch already waiting, per shape, with
    the ratio of each median to memcpy's and the blocking queue's."""

    def p50(key: str, shape: str) -> float | None:
        for r in results:
            if r.case["transport"] == key and r.case["workload"] == shape:
                return r.next_us.get("p50")
        return None

    def ratio(r: Result, key: str) -> str:
        mine, theirs = r.next_us.get("p50"), p50(key, r.case["workload"])
        return f"{mine / theirs:.2f}" if mine and theirs else "-"

    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("shape", 7, lambda r: r.case["workload"]),
        ("next() p50 us", 13, lambda r: _fmt(r.next_us.get("p50"), ".2f")),
        ("p90 us", 8, lambda r: _fmt(r.next_us.get("p90"), ".2f")),
        ("x memcpy", 9, lambda r: ratio(r, MEMCPY)),
        ("x queue", 8, lambda r: ratio(r, QUEUE)),
        ("calls", 7, lambda r: _fmt(r.next_us.get("calls"), ".0f")),
    ]
    return _render(results, cols)


def startup_table(results: Sequence[Result]) -> str:
    """Results of repeated runs per transport: median time to first batch."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(_key(r), []).append(r)
    rows = []
    for runs in groups.values():
        ok = sorted((r for r in runs if not r.error), key=lambda r: r.first_batch_s)
        rows.append(ok[len(ok) // 2] if ok else runs[0])
    spreads = {
        _key(r): sorted(x.first_batch_s for x in groups[_key(r)] if not x.error)
        for r in rows
    }
    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("first batch s", 13, lambda r: f"{r.first_batch_s:.3f}"),
        ("runs (s)", 24, lambda r: " ".join(f"{x:.2f}" for x in spreads[_key(r)])),
    ]
    return _render(rows, cols)


def steady_table(results: Sequence[Result]) -> str:
    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("shape", 8, lambda r: str(r.case["workload"])),
        ("regime", 12, lambda r: r.notes[-1] if r.notes else ""),
        ("batches/s", 10, lambda r: _fmt(r.batches_per_s, ".0f")),
        ("ready", 5, lambda r: _fmt(r.mean_ready, ".1f")),
        ("cons sys/b", 10, lambda r: _fmt(r.consumer.syscalls, ".3f")),
        ("cons futex/b", 12, lambda r: _fmt(r.consumer.futex, ".3f")),
        ("cons faults/b", 13, lambda r: _fmt(r.consumer.minflt, ".3f")),
        ("prod sys/b", 10, lambda r: _fmt(r.producers.syscalls, ".3f")),
        ("prod faults/b", 13, lambda r: _fmt(r.producers.minflt, ".3f")),
        ("cons CPU us/b", 13, lambda r: _fmt(r.consumer.cpu_us, ".1f")),
    ]
    return _render(results, cols)


def compute_table(results: Sequence[Result], ideal: dict[int, float]) -> str:
    def x_ideal(r: Result) -> str:
        i = ideal.get(int(r.case["workers"]))
        return f"{r.batches_per_s / i:.2f}" if i else "-"

    def workers(r: Result) -> str:
        if r.autotune:  # how many ran, of how many started
            return f"{r.autotune['workers']}/{r.autotune['pool']}"
        return str(r.case["workers"])

    cols: list[Column] = [
        ("transport", 28, lambda r: r.label),
        ("workers", 7, workers),
        ("batches/s", 10, lambda r: _fmt(r.batches_per_s, ".2f")),
        ("x ideal", 7, x_ideal),
        ("cons CPU us/b", 13, lambda r: _fmt(r.consumer.cpu_us, ".0f")),
        ("prod CPU ms/b", 13, lambda r: _fmt(r.producers.cpu_us / 1e3, ".1f")),
        ("PSS MB", 7, lambda r: _fmt(r.pss_bytes / 1e6, ".0f")),
    ]
    text = _render(results, cols)
    verdict = auto_verdict(results)
    return f"{text}\n{verdict}" if verdict else text


def auto_verdict(results: Sequence[Result]) -> str | None:
    """workers="auto" against the best hand-picked count of the same
    per-sample source, or None where either is missing."""
    auto = [r for r in results if r.autotune and not r.error]
    picked = [
        r for r in results if r.case["transport"] == "fastq-samples" and not r.error
    ]
    if not auto or not picked:
        return None
    a = auto[0]
    best = max(picked, key=lambda r: r.batches_per_s)
    if not best.batches_per_s:
        return None
    return (
        f"workers='auto' ran {a.autotune['workers']} of {a.autotune['pool']} "  # type: ignore[index]
        f"workers: {a.batches_per_s:.2f} batches/s, "
        f"{a.batches_per_s / best.batches_per_s:.2f}x the best hand-picked "
        f"count ({best.label}, {best.case['workers']} workers: "
        f"{best.batches_per_s:.2f} batches/s)" + "".join(f"; {n}" for n in a.notes)
    )


def heading(workload: str, workers: int, slots: int) -> str:
    w = WORKLOADS[workload]
    return f"{workload}: {w.describe()}; workers={workers}, {slots} batches in flight"


def legend() -> str:
    lines = ["Transports:"]
    for t in TRANSPORTS.values():
        lines.append(f"  {t.label:28} {t.about}")
    return "\n".join(lines)


def write_json(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)


def plot(results: Sequence[Result], path: str) -> str | None:
    """GB/s per transport per shape, one panel per worker count; returns why
    not, if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot: matplotlib is not installed (pip install matplotlib)"
    ok = [r for r in results if not r.error and r.batches_per_s > 0]
    workers = sorted({int(r.case["workers"]) for r in ok})
    shapes = [s for s in WORKLOADS if any(r.case["workload"] == s for r in ok)]
    keys = [k for k in TRANSPORTS if any(_key(r) == k for r in ok)]
    if not ok:
        return "--plot: no results to draw"
    fig, axes = plt.subplots(
        len(workers),
        1,
        squeeze=False,
        figsize=(max(8, 1.9 * len(shapes) + 3), 4.2 * len(workers)),
    )
    width = 0.8 / max(1, len(keys))
    cmap = plt.get_cmap("tab10")
    for ax, w in zip(axes[:, 0], workers):
        for i, k in enumerate(keys):
            xs, ys = [], []
            for j, s in enumerate(shapes):
                r = next(
                    (
                        r
                        for r in ok
                        if _key(r) == k
                        and r.case["workload"] == s
                        and int(r.case["workers"]) == w
                    ),
                    None,
                )
                if r is not None:
                    xs.append(j + (i - (len(keys) - 1) / 2) * width)
                    ys.append(r.gb_per_s)
            hatch = "//" if TRANSPORTS[k].role == "limit" else None
            ax.bar(
                xs,
                ys,
                width,
                label=TRANSPORTS[k].label,
                color=cmap(i % 10),
                hatch=hatch,
                edgecolor="white" if hatch else None,
            )
        ax.set_yscale("log")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(
            [f"{s}\n{WORKLOADS[s].batch_bytes / 1e6:.3g} MB" for s in shapes]
        )
        ax.set_ylabel("GB/s delivered (log)")
        ax.set_title(f"{w} worker{'s' if w > 1 else ''}")
        ax.grid(axis="y", which="both", alpha=0.3)
    # Below the panels: inside one, the legend would hide its bars.
    handles, labels = axes[0, 0].get_legend_handles_labels()
    rows_of_legend = -(-len(keys) // 5)
    fig.legend(handles, labels, fontsize=8, ncol=5, loc="lower center")
    fig.suptitle(f"fastq bench: {machine()}", fontsize=9)
    fig.tight_layout(rect=(0, 0.035 * rows_of_legend, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
