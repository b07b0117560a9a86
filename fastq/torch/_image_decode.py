"""Where a loader's images decode: on the GPU, in the training process
(fastq.vision's encoded mode and the decode stage), or in the workers
with Pillow (its decoded mode) where there is no CUDA device or no GPU
decoder, with one warning saying why. Both faces of fastq.torch ask here."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ConfigError
from ._decode_cuda import DecodeCuda, TorchDecodeCuda
from ._decode_stage import DECODE_LOOKAHEAD, DecodeStage
from ._decode_thread import DecodedEpoch
from ._decoders import BACKENDS, Decoder, check_backend, open_decoder
from ._pinned import CudaRing


def cuda_available() -> bool:
    """Whether this process can use a CUDA device (tests pretend)."""
    return bool(torch.cuda.is_available())


def current_device() -> torch.device:
    """The device a DataLoader decodes on: the current CUDA device, as
    DataLoader's pin_memory pins for the current accelerator."""
    return torch.device("cuda", torch.cuda.current_device())


def make_cuda(device: torch.device) -> DecodeCuda:
    """The stage's CUDA seam on ``device`` (tests put a fake GPU here)."""
    return TorchDecodeCuda(device)


def decode_ring(pin: bool, device: torch.device | None = None) -> CudaRing:
    """The ring of a loader whose images decode on the GPU (NOTE [ A
    batch's bytes wait for its decode ] in fastq/torch/_decode_stage.py),
    page-locked off the first batch's path if ``pin``."""
    if device is None or device.index is None:
        device = current_device()
    return CudaRing(device, False, pin=pin, register_later=pin, holds_slots=False)


def _installed(name: str) -> bool:
    module = "nvidia.nvimgcodec" if name == "nvimgcodec" else name
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # its parent package is missing
        return False


def gpu_decode_refusal(
    dataset: Any, backend: str | Decoder, cuda: bool, collate_fn: Any = None
) -> str | None:
    """Why ``dataset``'s images cannot decode on the GPU, or None if they
    can; never imports a backend (nor initializes CUDA)."""
    if isinstance(backend, str) and backend == "cpu":
        return "decode_backend='cpu'"
    if collate_fn is not None:
        return (
            f"collate_fn={collate_fn!r} is given, and the decode stage collates "
            "the files itself; drop collate_fn= to decode on the GPU"
        )
    if not cuda:
        why = (
            f"this torch build ({torch.__version__}) has no CUDA support"
            if torch.version.cuda is None
            else "no CUDA device is visible"
        )
        return f"no GPU to decode on: {why}"
    if isinstance(backend, str):
        names = BACKENDS if backend == "auto" else (backend,)
        if not any(_installed(n) for n in names):
            return (
                f"no GPU decoder is installed (tried {', '.join(names)}); "
                "pip install 'fastq-ring[gpu]' for nvImageCodec"
            )
    return None


# The most a DataLoader's slot holds by default for a batch of encoded files:
# a batch's files sized by the largest file would reserve gigabytes (one
# large photo among ImageNet's) for batches of a few megabytes (about 110 KB
# a file); this leaves twice an ImageNet batch of 256 files. A batch past it
# fails with an error naming slot_bytes=.
_ENCODED_SLOT_CAP = 64 << 20


def encoded_slot_bytes(dataset: Any, batch_size: int | None) -> int | None:
    """A DataLoader's slot for ``batch_size`` encoded files: room for the
    dataset's budget per batch (its ``encoded_spec``: by default its
    ``batch_size`` largest files), up to _ENCODED_SLOT_CAP; None (sized from
    the first batch) if it says none."""
    rows = batch_size or 1
    try:
        files = dataset.encoded_spec(rows)["data"]
        budget = files.budget if files.budget is not None else rows * files.max_len
    except Exception:  # no spec, or none of that form: sized as any batch
        return None
    # The files' bytes, then the fixed fields and the packed record's
    # structure, a few dozen bytes a sample.
    need = int(budget) + rows * 64 + (64 << 10)
    return min(need, _ENCODED_SLOT_CAP)


class ImageDecode:
    """A loader's image decoding: the mode it put its dataset in, and, on
    the GPU, its decode stage (made at the first batch: the decoder and the
    stream are the loader's process's own, never its workers')."""

    def __init__(
        self,
        dataset: Any,
        backend: Any,
        dtype: torch.dtype,
        channels_last: bool,
        *,
        cuda: bool,
        collate_fn: Any = None,
        face: str = "fastq.torch.DataLoader",
        lookahead: int = DECODE_LOOKAHEAD,
    ) -> None:
        self.lookahead = lookahead
        self.backend = check_backend(backend)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(
                f"decode_dtype={dtype!r}: expected a torch.dtype, e.g. "
                "torch.float32 (ToTensor's) or torch.bfloat16"
            )
        self.dtype = dtype
        self.channels_last = bool(channels_last)
        self.plan = getattr(dataset, "decode_plan", None)
        self._dataset = dataset
        self.stage: DecodeStage | None = None
        refusal = None
        if self.plan is not None:
            refusal = gpu_decode_refusal(dataset, self.backend, cuda, collate_fn)
        self.on_gpu = self.plan is not None and refusal is None
        if self.plan is not None:
            # Before any worker starts: the workers make what the mode says.
            dataset.decode_on_gpu(self.on_gpu)
        asked_cpu = isinstance(self.backend, str) and self.backend == "cpu"
        if refusal is not None and not asked_cpu:
            warnings.warn(
                f"{face}: the images of {type(dataset).__name__} are decoded in "
                f"the workers with Pillow, not on the GPU: {refusal}",
                RuntimeWarning,
                stacklevel=3,  # the line that made the loader
            )

    def epoch(
        self,
        batches: Iterator[Any],
        device: torch.device | None = None,
        ring_of: Callable[[], CudaRing | None] = lambda: None,
        place: Callable[[], Any] | None = None,
    ) -> DecodedEpoch:
        if device is None:
            device = current_device()
        # ``place()``, if given, is the loader's place in the epoch, kept
        # as each batch is taken and given back as it is handed out
        # (DecodedEpoch.place).
        return DecodedEpoch(self._stage(device), batches, ring_of, place)

    def _stage(self, device: torch.device) -> DecodeStage:
        if self.stage is None:
            decoder, why = open_decoder(self.backend, device)
            if decoder is None:
                warnings.warn(
                    f"no GPU decoder could be opened on {device} ({why}): every "
                    "image is decoded with Pillow in the training process, then "
                    "resized on the GPU (slow); pass decode_backend='cpu' to "
                    "decode in the workers",
                    RuntimeWarning,
                    stacklevel=4,
                )
            self.stage = DecodeStage(
                self.plan,
                decoder,
                make_cuda(device),
                dtype=self.dtype,
                channels_last=self.channels_last,
                path_of=self._path_of,
                lookahead=self.lookahead,
            )
        return self.stage

    def _path_of(self, index: int) -> str:
        samples = getattr(self._dataset, "samples", None)
        if samples is None:
            return f"index {index}"
        return str(samples[index][0])

    def stats(self) -> dict[str, Any] | None:
        return None if self.stage is None else self.stage.stats()

    def stop_epoch(self, wait: bool = True) -> None:
        """Stops the decode stage's thread of the epoch in progress (NOTE
        [ The decode stage's thread ] in fastq/torch/_decode_thread.py):
        before a new epoch takes batches, and first as the loader closes
        (``wait`` False: the engine's close wakes it; ``close`` joins it)."""
        if self.stage is not None:
            self.stage.stop_epoch(wait)

    def close(self) -> None:
        if self.stage is not None:
            self.stage.close()

    def __getstate__(self) -> dict[str, Any]:
        # A copy (a pickled loader) makes its own stage: a decoder and a
        # stream belong to the process that made them.
        state = self.__dict__.copy()
        state["stage"] = None
        return state
