"""The decoded box against Pillow's crop of the same file: its shape, and
its pixels' mean and largest absolute difference, over the whole box and
over its 2-pixel border (where region decode with fancy upsampling goes
wrong with nvJPEG older than 13.2), for samples of the training bench's
files. Exits 1, naming the worst samples, where any is out of bound.

The boxes are RandomResizedCrop's; every fourth is moved into the image's
top-left corner and every fourth into its bottom-right one, so that the
image's own edges are in the boxes too. Decoded by fastq's nvImageCodec
backend (``--decoder fastq``, what the decode stage calls) or by
nvImageCodec directly (``--decoder direct``; on ``--device cpu``, its CPU
backend).

    python benchmarks/decode_box_pixels.py [--device cuda|cpu] [--samples 512]
        [--decoder fastq|direct] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from decode_engine import Sample, load_samples

from fastq._bench import train_data

# NOTE [ Bounds against Pillow ]
# Two JPEG decoders differ by their IDCT's rounding and their chroma
# upsampling; torchvision's tests hold nvJPEG to a mean absolute difference
# under 2 against libjpeg (test_decode_jpeg_cuda), and so does this, per
# box. A box's border is held to twice that: it is where a region decode
# that upsamples chroma without the pixels outside the box goes wrong. The
# largest difference of one pixel is bounded loosely, to flag a wrong block
# or a shifted box rather than rounding; the run prints the figures
# measured, so that a bound can be tightened from them.
MEAN_BOUND = 2.0
EDGE_MEAN_BOUND = 4.0
MAX_BOUND = 96
EDGE = 2  # the border's width, pixels


@dataclass
class Check:
    index: int
    box: tuple[int, int, int, int]
    shape_ok: bool = False
    decoded: bool = False
    mean: float = 0.0
    edge_mean: float = 0.0
    max: int = 0

    def ok(self) -> bool:
        return (
            self.decoded
            and self.shape_ok
            and self.mean <= MEAN_BOUND
            and self.edge_mean <= EDGE_MEAN_BOUND
            and self.max <= MAX_BOUND
        )


def with_corner_boxes(samples: Sequence[Sample]) -> list[Sample]:
    """Every fourth box moved to the top-left corner, every fourth (from
    the third) to the bottom-right corner."""
    from fastq.vision import image_header

    out = []
    for i, s in enumerate(samples):
        _, _, h, w = s.box
        if i % 4 == 1:
            s = replace(s, box=(0, 0, h, w))
        elif i % 4 == 3:
            height, width, _ = image_header(s.data)
            s = replace(s, box=(height - h, width - w, h, w))
        out.append(s)
    return out


def pillow_box(s: Sample) -> np.ndarray[Any, Any]:
    """Pillow's crop of the file, (h, w, 3) uint8, as ImageFolder loads it."""
    import io

    from PIL import Image

    top, left, h, w = s.box
    with Image.open(io.BytesIO(s.data.tobytes())) as f:
        rgb = f.convert("RGB")
    return np.asarray(rgb.crop((left, top, left + w, top + h)))


def compare(i: int, s: Sample, got: np.ndarray[Any, Any] | None) -> Check:
    c = Check(i, s.box)
    if got is None:
        return c
    c.decoded = True
    ref = pillow_box(s)
    c.shape_ok = tuple(got.shape) == tuple(ref.shape)
    if not c.shape_ok:
        return c
    diff = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    c.mean = float(diff.mean())
    c.max = int(diff.max())
    border = np.ones(diff.shape[:2], dtype=bool)
    border[EDGE:-EDGE, EDGE:-EDGE] = False
    c.edge_mean = float(diff[border].mean())
    return c


class FastqDecoder:
    """fastq's nvImageCodec backend, as the decode stage opens it."""

    def __init__(self, device: str) -> None:
        import torch

        from fastq.torch import _decoders

        self._torch = torch
        self._device = (
            torch.device("cuda", 0) if device == "cuda" else torch.device(device)
        )
        opened = _decoders.open_decoder("nvimgcodec", self._device)
        # open_decoder gives (decoder, why not), or the decoder and raises
        # where it cannot open.
        decoder, why = opened if isinstance(opened, tuple) else (opened, "")
        if decoder is None:
            raise RuntimeError(f"fastq's nvImageCodec backend does not open: {why}")
        self._decoder = decoder
        self._stream = (
            torch.cuda.current_stream()
            if device == "cuda"
            else types.SimpleNamespace(cuda_stream=0)
        )

    def decode(self, batch: Sequence[Sample]) -> list[np.ndarray[Any, Any] | None]:
        boxes = np.array([s.box for s in batch], dtype=np.int64)
        out = self._decoder.decode([s.data for s in batch], boxes, self._stream)
        if self._device.type == "cuda":
            self._torch.cuda.synchronize()
        result: list[np.ndarray[Any, Any] | None] = []
        for s, t in zip(batch, out):
            if t is None:
                result.append(None)
                continue
            hwc = t.permute(1, 2, 0).cpu().numpy()
            if not getattr(self._decoder, "crops", True):  # whole: the stage crops
                top, left, h, w = s.box
                hwc = hwc[top : top + h, left : left + w]
            result.append(hwc)
        return result


class DirectDecoder:
    """nvImageCodec's own batched call, by box."""

    def __init__(self, device: str) -> None:
        from nvidia import nvimgcodec as nv

        self._nv = nv
        if device == "cuda":
            kinds = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU", "CPU_ONLY")
            self._decoder = nv.Decoder(
                device_id=0,
                backends=[nv.Backend(getattr(nv.BackendKind, k)) for k in kinds],
            )
        else:
            self._decoder = nv.Decoder(
                device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            )
        self._params = nv.DecodeParams(
            color_spec=nv.ColorSpec.SRGB, apply_exif_orientation=False
        )

    def decode(self, batch: Sequence[Sample]) -> list[np.ndarray[Any, Any] | None]:
        nv = self._nv
        sources = []
        for s in batch:
            top, left, h, w = s.box
            region = nv.Region(top, left, top + h, left + w)
            sources.append(nv.CodeStream(s.data).get_sub_code_stream(region=region))
        images = self._decoder.decode(sources, params=self._params)
        return [None if im is None else np.asarray(im.cpu()) for im in images]


def run(samples: Sequence[Sample], decoder: Any, batch: int) -> list[Check]:
    checks = []
    for start in range(0, len(samples), batch):
        part = samples[start : start + batch]
        for k, (s, got) in enumerate(zip(part, decoder.decode(part))):
            checks.append(compare(start + k, s, got))
    return checks


def summary(checks: Sequence[Check]) -> dict[str, Any]:
    decoded = [c for c in checks if c.decoded and c.shape_ok]
    bad = [c for c in checks if not c.ok()]
    worst = sorted(bad, key=lambda c: (c.decoded, c.shape_ok, -c.mean))[:10]
    return {
        "samples": len(checks),
        "not_decoded": sum(not c.decoded for c in checks),
        "wrong_shape": sum(c.decoded and not c.shape_ok for c in checks),
        "mean_abs_diff": float(np.mean([c.mean for c in decoded])) if decoded else None,
        "worst_mean_abs_diff": max((c.mean for c in decoded), default=None),
        "worst_edge_mean_abs_diff": max((c.edge_mean for c in decoded), default=None),
        "max_abs_diff": max((c.max for c in decoded), default=None),
        "bounds": {"mean": MEAN_BOUND, "edge_mean": EDGE_MEAN_BOUND, "max": MAX_BOUND},
        "out_of_bound": len(bad),
        "worst": [asdict(c) for c in worst],
        "ok": not bad and bool(checks),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--files", type=int, default=2048, help="drawn from the first N")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--decoder", choices=("fastq", "direct"), default="fastq")
    p.add_argument("--data", default=train_data.default_dir())
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    files = max(args.files, args.samples)
    every = load_samples(args.data, files)
    step = max(1, len(every) // args.samples)
    samples = with_corner_boxes(every[::step][: args.samples])
    try:
        decoder = (FastqDecoder if args.decoder == "fastq" else DirectDecoder)(
            args.device
        )
        checks = run(samples, decoder, args.batch)
        result = summary(checks)
    except Exception as exc:  # the backend failing is this check's answer
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result.update(device=args.device, decoder=args.decoder)
    print(json.dumps({k: v for k, v in result.items() if k != "worst"}, indent=1))
    for c in result.get("worst", []):
        print(f"out of bound: {c}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not result["ok"]:
        why = result.get("error") or "boxes out of NOTE [ Bounds against Pillow ]"
        print(f"FAIL: {why}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
