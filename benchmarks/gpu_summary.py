"""The GPU check's summary: each target of GPU decode's acceptance with the
figure measured by benchmarks/gpu_check.sh's parts, and pass, fail, or
why it was not measured. Reads the parts' files under OUT (named for the
GPU) and writes summary-GPU.txt and summary-GPU.json beside them.

    python benchmarks/gpu_summary.py OUT GPU
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The targets (GPU decode's acceptance). The engine's rate is held to the
# low end of the rates the GPU-timeline model plans for (7,000 images/s of
# ImageNet-sized files on an H200).
ENGINE_RATE_LOW = 7000.0
CEILING_SHARE = 0.90
WORKER_CPU_SHARE = 0.25
FIRST_BATCH_SLACK_S = 0.1
NVIMGCODEC_ROW = "GPU decode: nvImageCodec"
TORCHVISION_ROW = "GPU decode: torchvision"
ENGINE_ROWS = (
    "hw-whole",
    "hw-boxes",
    "all-boxes",
    "split-0.9",
    "split-0.75",
    "split-0.5",
    "split-0.75-4t",
    "adaptive",
    "two-decoders",
    "two-threads",
)


@dataclass
class Target:
    target: str
    measured: str
    verdict: str  # "pass", "fail" or "not measured"


def _load(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def _first_line(path: str, needle: str) -> str | None:
    try:
        with open(path) as f:
            return next((line.strip() for line in f if needle in line), None)
    except OSError:
        return None


def preflight(out: str, gpu: str) -> Target:
    line = _first_line(os.path.join(out, f"preflight-{gpu}.txt"), "preflight ")
    if line is None:
        return Target(
            "nvImageCodec backend opens", "no preflight output", "not measured"
        )
    return Target(
        "nvImageCodec backend opens", line, "pass" if "preflight ok" in line else "fail"
    )


def engine(out: str, gpu: str) -> list[Target]:
    report = _load(os.path.join(out, f"engine-{gpu}.json"))
    name = f"engine rate >= {ENGINE_RATE_LOW:,.0f} images/s (the model's low rate)"
    if not report:
        return [Target(name, "no engine output", "not measured")]
    rows = {r["name"]: r for r in report.get("rows", [])}
    nv = [rows[n] for n in ENGINE_ROWS if n in rows and rows[n].get("images")]
    if not nv:
        why = "; ".join(
            f"{n}: {rows[n].get('error') or rows[n].get('skipped')}"
            for n in ENGINE_ROWS
            if n in rows
        )
        return [Target(name, why or "no nvImageCodec row", "fail")]
    best = max(nv, key=lambda r: r["images_per_s"])
    each = ", ".join(f"{r['name']} {r['images_per_s']:,.0f}" for r in nv)
    tv = rows.get("torchvision", {})
    tv_rate = f"; torchvision {tv['images_per_s']:,.0f}" if tv.get("images") else ""
    verdict = "pass" if best["images_per_s"] >= ENGINE_RATE_LOW else "fail"
    return [Target(name, f"best {best['name']} ({each}{tv_rate})", verdict)]


# A run's progress line (fastq._bench.train.describe), for a bench cut short
# before it wrote its JSON.
_PROGRESS = re.compile(
    r"train resnet18 w=\d+ (?P<label>.+?): (?P<rate>[\d,]+) images/s, .*?"
    r"(?:first batch (?P<first>[\d.]+) s, )?workers' CPU (?P<cpu>[\d,]+) us/image"
)
_LABELS = {"ceiling: one batch, reused": "ceiling"}


def _train_rows(out: str, gpu: str) -> dict[str, dict[str, Any]]:
    report = _load(os.path.join(out, f"resnet18-{gpu}.json"))
    if report:
        return {
            r["config"]["loader"]: r
            for r in report.get("results", [])
            if r.get("section") == "train" and not r.get("error")
        }
    rows: dict[str, dict[str, Any]] = {}
    try:
        with open(os.path.join(out, f"resnet18-{gpu}.txt")) as f:
            lines = f.readlines()
    except OSError:
        return rows
    for line in lines:
        m = _PROGRESS.search(line)
        if m is None:
            continue
        label = _LABELS.get(m["label"], m["label"])
        rows[label] = {
            "images_per_s": float(m["rate"].replace(",", "")),
            "first_batch_s": float(m["first"]) if m["first"] else None,
            "worker_cpu_us": float(m["cpu"].replace(",", "")),
        }
    return rows


def training(out: str, gpu: str) -> list[Target]:
    rows = _train_rows(out, gpu)
    nv, base, ceiling = (
        rows.get(NVIMGCODEC_ROW),
        rows.get("DataLoader"),
        rows.get("ceiling"),
    )
    share_name = f"ResNet-18 input-bound >= {CEILING_SHARE:.2f} of the ceiling"
    cpu_name = f"workers' CPU per image <= {WORKER_CPU_SHARE:.2f} of DataLoader's"
    first_name = f"first batch within {FIRST_BATCH_SLACK_S:g} s of DataLoader's"
    if nv is None:
        why = "no nvImageCodec row in resnet18 output"
        return [
            Target(n, why, "not measured") for n in (share_name, cpu_name, first_name)
        ]
    out_rows = []
    if ceiling:
        share = nv["images_per_s"] / ceiling["images_per_s"]
        tv = rows.get(TORCHVISION_ROW)
        tv_note = (
            f"; torchvision {tv['images_per_s'] / ceiling['images_per_s']:.2f}"
            if tv
            else ""
        )
        if nv.get("decode_gpu_ms") is not None:
            tv_note += f"; decode stage GPU {nv['decode_gpu_ms']:.2f} ms/batch"
        out_rows.append(
            Target(
                share_name,
                f"{share:.2f} ({nv['images_per_s']:,.0f} of "
                f"{ceiling['images_per_s']:,.0f} images/s{tv_note})",
                "pass" if share >= CEILING_SHARE else "fail",
            )
        )
    else:
        out_rows.append(Target(share_name, "no ceiling row", "not measured"))
    if base and base.get("worker_cpu_us"):
        ratio = nv.get("worker_cpu_us", 0.0) / base["worker_cpu_us"]
        out_rows.append(
            Target(
                cpu_name,
                f"{ratio:.2f} ({nv.get('worker_cpu_us', 0):,.0f} against "
                f"{base['worker_cpu_us']:,.0f} us/image)",
                "pass" if ratio <= WORKER_CPU_SHARE else "fail",
            )
        )
    else:
        out_rows.append(Target(cpu_name, "no DataLoader row", "not measured"))
    if base and base.get("first_batch_s") and nv.get("first_batch_s"):
        late = nv["first_batch_s"] - base["first_batch_s"]
        out_rows.append(
            Target(
                first_name,
                f"{late:+.3f} s ({nv['first_batch_s']:.3f} against "
                f"{base['first_batch_s']:.3f} s)",
                "pass" if late <= FIRST_BATCH_SLACK_S else "fail",
            )
        )
    else:
        out_rows.append(Target(first_name, "no first batch of both", "not measured"))
    return out_rows


def pixels(out: str, gpu: str) -> Target:
    report = _load(os.path.join(out, f"pixels-{gpu}.json"))
    name = "decoded boxes against Pillow (decode_box_pixels.py's bounds)"
    if not report:
        return Target(name, "no pixels output", "not measured")
    if report.get("error"):
        return Target(name, report["error"], "fail")
    return Target(
        name,
        f"{report['samples']} samples: mean {report['mean_abs_diff']}, worst "
        f"{report['worst_mean_abs_diff']}, border "
        f"{report['worst_edge_mean_abs_diff']}, max {report['max_abs_diff']}; "
        f"{report['out_of_bound']} out of bound",
        "pass" if report.get("ok") else "fail",
    )


def _host_figures(node: Any, path: str = "") -> list[str]:
    """ "path value" of each number under a key naming host us per image."""
    found: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{path}.{k}" if path else str(k)
            if "host_us" in str(k) and isinstance(v, (int, float)):
                found.append(f"{where} {v:.1f}")
            else:
                found.extend(_host_figures(v, where))
    elif isinstance(node, list):
        for k, v in enumerate(node):
            found.extend(_host_figures(v, f"{path}[{k}]"))
    return found


def stage(out: str, gpu: str) -> Target:
    path = os.path.join(out, f"stage-host-{gpu}.txt")
    name = "the stage's host time per image (decode_stage_host.py)"
    line = _first_line(path, "")
    if line is None:
        return Target(name, "no stage output", "not measured")
    if line.startswith("skipped"):
        return Target(name, line, "not measured")
    figures = _host_figures(_load(os.path.join(out, f"stage-host-{gpu}.json")))
    if figures:
        return Target(name, "; ".join(figures[:6]), "measured")
    with open(path) as f:
        last = [s.strip() for s in f if s.strip()][-1:]
    return Target(
        name, f"see stage-host-{gpu}.txt ({last[0] if last else ''})", "measured"
    )


def summarize(out: str, gpu: str) -> list[Target]:
    return [
        preflight(out, gpu),
        *engine(out, gpu),
        pixels(out, gpu),
        stage(out, gpu),
        *training(out, gpu),
    ]


def render(targets: Sequence[Target], gpu: str) -> str:
    lines = [f"GPU decode's targets on {gpu}:"]
    for t in targets:
        lines.append(f"  [{t.verdict:>12}] {t.target}: {t.measured}")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, gpu = argv
    targets = summarize(out, gpu)
    text = render(targets, gpu)
    print(text)
    with open(os.path.join(out, f"summary-{gpu}.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, f"summary-{gpu}.json"), "w") as f:
        json.dump([asdict(t) for t in targets], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
