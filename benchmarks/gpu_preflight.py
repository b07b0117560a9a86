"""Does fastq's nvImageCodec backend open here, and decode a box right?
One line, and exit 1 where it does not: the GPU check stops before it
measures rows that would have no decoder behind them.

It asks ``python -m fastq doctor --json`` first (its backends ->
nvimgcodec -> opens and probe_ok); where fastq has no doctor command, it
opens the backend itself (``fastq.torch._decoders.open_decoder``) and
decodes the box of a probe JPEG, against Pillow's crop.

    python benchmarks/gpu_preflight.py [--device cuda|cpu] [--doctor-timeout S]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# The probe's box, (top, left, height, width), inside a 96 x 64 picture and
# touching its right edge.
PROBE_BOX = (8, 40, 40, 56)
PROBE_MEAN_BOUND = 2.0  # as NOTE [ Bounds against Pillow ] (decode_box_pixels.py)


def doctor_verdict(payload: Any, device: str = "cuda") -> tuple[bool, str] | None:
    """(ok, why) from the doctor's JSON, or None where it holds no answer
    for nvImageCodec. ``opens`` may be one flag or one per place (the GPU,
    the CPU backend): the one of ``device`` is asked."""
    if not isinstance(payload, dict) or not isinstance(payload.get("backends"), dict):
        return None
    entry = payload["backends"].get("nvimgcodec")
    if not isinstance(entry, dict) or "opens" not in entry:
        return None
    opens = entry["opens"]
    if isinstance(opens, dict):
        keys = ("gpu", "cuda", "device") if device == "cuda" else ("cpu",)
        key = next((k for k in keys if k in opens), None)
        opens = opens[key] if key else all(opens.values())
    ok = bool(opens) and bool(entry.get("probe_ok"))
    version = entry.get("version", "?")
    why = entry.get("why") or ""
    return ok, (
        f"doctor: nvimgcodec {version}, opens={entry['opens']}, "
        f"probe_ok={entry.get('probe_ok')}" + (f", why: {why}" if why else "")
    )


def ask_doctor(timeout: float, device: str) -> tuple[bool, str] | None:
    """The doctor's verdict, or None where this fastq has no doctor (or it
    gives no answer within ``timeout``)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fastq", "doctor", "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return None  # opened here instead, in the time left
    start = done.stdout.find("{")
    try:
        payload = json.loads(done.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        payload = None
    return doctor_verdict(payload, device)  # None: the usage text, no doctor here


def probe_jpeg() -> bytes:
    """A 96 x 64 baseline JPEG of smooth colour ramps."""
    from PIL import Image

    y, x = np.mgrid[0:64, 0:96]
    rgb = np.stack([x * 2, y * 3, 255 - x - y], axis=-1).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(out, format="JPEG", quality=92)
    return out.getvalue()


def unpack_opened(opened: Any) -> tuple[Any, str]:
    """open_decoder's answer as (decoder or None, why not): it gives a
    (decoder, why) pair, or the decoder alone and raises where it cannot."""
    if isinstance(opened, tuple):
        return opened[0], str(opened[1])
    return opened, ""


def open_and_probe(device: str) -> tuple[bool, str]:
    import torch
    from PIL import Image

    from fastq.torch import _decoders

    where = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    try:
        decoder, why = unpack_opened(_decoders.open_decoder("nvimgcodec", where))
    except Exception as exc:
        return False, f"open_decoder('nvimgcodec'): {type(exc).__name__}: {exc}"
    if decoder is None:
        return False, f"open_decoder('nvimgcodec'): {why}"
    data = probe_jpeg()
    stream = (
        torch.cuda.current_stream()
        if device == "cuda"
        else types.SimpleNamespace(cuda_stream=0)
    )
    top, left, h, w = PROBE_BOX
    try:
        out = decoder.decode(
            [np.frombuffer(data, np.uint8)], np.array([PROBE_BOX]), stream
        )
    except Exception as exc:
        return False, f"{type(decoder).__name__}.decode: {type(exc).__name__}: {exc}"
    if not out or out[0] is None:
        return False, f"{type(decoder).__name__}.decode returned None for the probe"
    if out[0].device.type != where.type:
        return False, f"the probe's box was decoded to {out[0].device}, not {where}"
    got = out[0].permute(1, 2, 0).cpu().numpy()
    if not getattr(decoder, "crops", True):
        got = got[top : top + h, left : left + w]
    with Image.open(io.BytesIO(data)) as f:
        ref = np.asarray(f.convert("RGB").crop((left, top, left + w, top + h)))
    if got.shape != ref.shape:
        return False, f"the probe's box is {got.shape}, Pillow's {ref.shape}"
    diff = float(np.abs(got.astype(np.int16) - ref.astype(np.int16)).mean())
    if diff > PROBE_MEAN_BOUND:
        return False, f"the probe's box differs from Pillow's by {diff:.2f} on average"
    return True, (
        f"{type(decoder).__name__} opens on {where} and decodes the probe's box "
        f"(mean difference to Pillow {diff:.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--doctor-timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    sys.path.insert(0, ROOT)
    verdict = (
        ask_doctor(args.doctor_timeout, args.device)
        if args.doctor_timeout > 0
        else None
    )
    if verdict is None:
        verdict = open_and_probe(args.device)
    ok, why = verdict
    print(f"preflight {'ok' if ok else 'FAILED'}: {why}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
