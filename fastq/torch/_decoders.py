"""The image decoders the decode stage can use, behind one seam: NVIDIA's
nvImageCodec (the ``gpu`` extra), torchvision's ``decode_jpeg`` on CUDA,
and Pillow, one image at a time, for what the GPU backends leave."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import ConfigError
from ..vision import KIND_HW_JPEG, KIND_OTHER
from ..vision._decode import load_rgb

__all__ = ["KIND_HW_JPEG", "KIND_OTHER", "Decoder", "decode_with_pil"]

# The backends "auto" tries, in this order: the first that imports is used.
BACKENDS = ("nvimgcodec", "torchvision")

# The decode_backend= default. It awaits the GPU figures: the training bench
# measures nvImageCodec and torchvision's decode_jpeg side by side on one
# H200 (benchmarks/gpu_check.sh), and the faster becomes the default here.
# Until then "auto": the first of BACKENDS that imports.
DEFAULT_BACKEND = "auto"


class Decoder(Protocol):
    """A batch decoder on the GPU.

    ``crops``: it decodes only each image's box (region-of-interest decode);
    else it decodes whole images and the stage crops them.
    ``takes_other_kinds``: it is given every file, not only KIND_HW_JPEG
    ones (it has paths of its own for progressive, grayscale, ...).
    """

    name: str
    crops: bool
    takes_other_kinds: bool

    def decode(
        self,
        data: Sequence[np.ndarray[Any, Any]],
        boxes: np.ndarray[Any, Any],
        stream: Any,
    ) -> list[torch.Tensor | None]:
        """Each file's pixels as a uint8 (3, h, w) tensor on the device
        (the box's if ``crops``, else the whole image's), its work queued on
        ``stream`` (the current stream), or None for a file it rejects:
        the stage decodes that one with Pillow. ``boxes`` is int (n, 4):
        (top, left, height, width). Never fails the batch for one file."""
        ...


# ----------------------------------------------------------------- Pillow


def decode_with_pil(data: np.ndarray[Any, Any], box: Sequence[int]) -> torch.Tensor:
    """One file's box as a uint8 (3, h, w) CPU tensor, decoded as
    torchvision's ImageFolder loads it (Pillow, then RGB: grayscale, CMYK
    and palette files made RGB; no EXIF rotation). Raises Pillow's error for
    a file it cannot read (truncated, corrupt)."""
    top, left, height, width = (int(v) for v in box)
    rgb = load_rgb(memoryview(data))  # loads it: a truncated file raises here
    crop = rgb.crop((left, top, left + width, top + height))
    pixels = np.array(crop, dtype=np.uint8)  # (h, w, 3), writable
    return torch.from_numpy(pixels).permute(2, 0, 1)


# ------------------------------------------------------------ nvImageCodec


class NvImageCodecDecoder:
    """nvImageCodec's batched decode: the hardware JPEG engine where the
    file suits it, its CUDA and CPU paths for the rest, the box alone
    decoded (a Region) unless ``regions`` is False, on the stage's stream.

    Its decoded images are the library's own buffers (read through
    DLPack): the stage keeps them until its batch's event has passed."""

    name = "nvimgcodec"
    takes_other_kinds = True

    def __init__(self, device: torch.device, regions: bool = True) -> None:
        from nvidia import nvimgcodec

        self._nv = nvimgcodec
        self.crops = regions
        self._decoder = nvimgcodec.Decoder(
            device_id=device.index or 0,
            backend_kinds=[
                nvimgcodec.BackendKind.HW_GPU_ONLY,
                nvimgcodec.BackendKind.GPU_ONLY,
                nvimgcodec.BackendKind.HYBRID_CPU_GPU,
                nvimgcodec.BackendKind.CPU_ONLY,
            ],
        )
        # As ImageFolder's Pillow loader: RGB, and no EXIF rotation (the
        # worker's box is drawn on the stored orientation).
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False,
            color_spec=nvimgcodec.ColorSpec.RGB,
            allow_any_depth=False,
        )

    def decode(
        self,
        data: Sequence[np.ndarray[Any, Any]],
        boxes: np.ndarray[Any, Any],
        stream: Any,
    ) -> list[torch.Tensor | None]:
        nv = self._nv
        sources = []
        for d, (top, left, height, width) in zip(data, boxes.tolist()):
            region = (
                nv.Region(top, left, top + height, left + width) if self.crops else None
            )
            try:
                sources.append(nv.DecodeSource(d, region))
            except TypeError:  # a read-only view it does not take: a copy
                sources.append(nv.DecodeSource(d.tobytes(), region))
        images = self._decoder.decode(
            sources, params=self._params, cuda_stream=stream.cuda_stream
        )
        out: list[torch.Tensor | None] = []
        for img in images:
            if img is None:
                out.append(None)
                continue
            # (h, w, 3) interleaved, on the current (decode) stream: DLPack
            # orders it after the decode.
            out.append(torch.from_dlpack(img).permute(2, 0, 1))
        return out


# ------------------------------------------------------------- torchvision

# torchvision keeps one nvJPEG decoder per process: calls from two threads
# (two loaders' stages) take turns.
_TORCHVISION_LOCK = threading.Lock()


class TorchvisionDecoder:
    """torchvision's ``decode_jpeg(list, device="cuda")``: one batched
    nvJPEG call for the batch's baseline JPEGs, whole images (the stage
    crops them). It synchronizes its own stream before it returns, so the
    thread that calls it waits for the decode (not for the step in
    flight). One bad file fails its whole call: the batch is then decoded
    one file at a time, and only the files that fail alone go to Pillow."""

    name = "torchvision"
    crops = False
    takes_other_kinds = False

    def __init__(self, device: torch.device) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg

        self._decode_jpeg = decode_jpeg
        self._rgb = ImageReadMode.RGB
        self._device = device

    def decode(
        self,
        data: Sequence[np.ndarray[Any, Any]],
        boxes: np.ndarray[Any, Any],
        stream: Any,
    ) -> list[torch.Tensor | None]:
        files = [_cpu_bytes(d) for d in data]
        with _TORCHVISION_LOCK:
            try:
                return list(self._decode(files))
            except RuntimeError:
                pass
            out: list[torch.Tensor | None] = []
            for f in files:
                try:
                    out.append(self._decode([f])[0])
                except RuntimeError:
                    out.append(None)
            return out

    def _decode(self, files: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self._decode_jpeg(files, mode=self._rgb, device=self._device))


def _cpu_bytes(d: np.ndarray[Any, Any]) -> torch.Tensor:
    with warnings.catch_warnings():
        # A slot's bytes may be a read-only view; nothing writes to them.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(d)


# ----------------------------------------------------------------- choice


def check_backend(backend: Any) -> str | Decoder:
    """decode_backend=, checked: a backend's name, or a Decoder object."""
    names = ("auto", "cpu", *BACKENDS)
    if isinstance(backend, str):
        if backend in names:
            return backend
    elif callable(getattr(backend, "decode", None)):
        return backend  # type: ignore[no-any-return]
    raise ConfigError(
        f"decode_backend={backend!r}: expected one of {', '.join(map(repr, names))} "
        "or a decoder object with a decode(data, boxes, stream) method; 'auto' "
        "takes the first backend installed, 'cpu' decodes in the workers"
    )


def open_decoder(
    backend: str | Decoder, device: torch.device
) -> tuple[Decoder | None, str]:
    """(the decoder, "") for ``backend`` on ``device``, or (None, why not),
    the reason said in the warning that the workers decode instead."""
    if not isinstance(backend, str):
        return backend, ""
    if backend == "cpu":
        return None, "decode_backend='cpu'"
    tried = []
    for name in BACKENDS if backend == "auto" else (backend,):
        try:
            return _open(name, device), ""
        except Exception as exc:  # not installed, or not built for this CUDA
            tried.append(f"{name}: {type(exc).__name__}: {exc}")
    fix = (
        "pip install 'fastq-ring[gpu]' for nvImageCodec, or a torchvision built "
        "with CUDA"
    )
    return None, f"no GPU decoder could be opened ({'; '.join(tried)}); {fix}"


def _open(name: str, device: torch.device) -> Decoder:
    if name == "nvimgcodec":
        return NvImageCodecDecoder(device)
    return TorchvisionDecoder(device)
