"""TorchPrefetcher: batches as tensors over the ring's slots, a page-locked
ring with copies to the GPU on a side stream."""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import torch
import torch.utils.data

from .._faces._arguments import positive_int
from .._faces._prefetcher import Prefetcher
from .._layout._jagged import Jagged, JaggedArray
from .._layout._spec import BatchSpec
from .._loop._engine import Engine, PlainBatches
from ..errors import ConfigError, SpecError
from . import _image_decode
from ._decode_stage import DECODE_LOOKAHEAD
from ._decode_thread import DecodedEpoch
from ._decoders import DEFAULT_BACKEND
from ._even_ranks import EvenBatches, ranks_group
from ._image_decode import ImageDecode
from ._pinned import CudaRing

__all__ = ["TorchPrefetcher"]

_PREFETCHER_SIGNATURE = inspect.signature(Prefetcher.__init__)


def _bind_prefetcher_args(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """Prefetcher's arguments by name; TypeError before any process starts
    if they do not fit its signature."""
    bound = _PREFETCHER_SIGNATURE.bind(None, *args, **kwargs)
    return dict(bound.arguments)


def _resolve_device(
    device: Any, pin_memory: bool | None
) -> tuple[torch.device | None, bool]:
    """(CUDA device or None for CPU tensors, whether to page-lock the ring),
    or ConfigError naming the option and the fix."""
    dev: torch.device | None = None
    if device is not None:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"device={device!r}: not a torch device ({exc}); use 'cuda', "
                "'cuda:1', a torch.device, or None for CPU tensors"
            ) from None
        if dev.type == "cpu":
            dev = None
        elif dev.type != "cuda":
            raise ConfigError(
                f"device={device!r}: fastq copies batches to CUDA devices only; "
                "use device='cuda' (or 'cuda:N'), or leave device=None and move "
                "the CPU tensors yourself"
            )
    if pin_memory is not None and not isinstance(pin_memory, bool):
        raise ConfigError(f"pin_memory={pin_memory!r}: expected True, False or None")
    pin = dev is not None if pin_memory is None else pin_memory
    if dev is None and not pin:
        return None, False
    if not torch.cuda.is_available():
        option = f"device={device!r}" if dev is not None else "pin_memory=True"
        name = "device" if dev is not None else "pin_memory"
        why = (
            f"this torch build ({torch.__version__}) has no CUDA support"
            if torch.version.cuda is None
            else "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        )
        raise ConfigError(
            f"{option} needs CUDA, but torch.cuda.is_available() is False: {why}. "
            f"Leave {name} unset to get CPU tensors straight from the ring (they "
            "need no pinning), or run on a machine with a GPU and a CUDA build "
            "of torch"
        )
    count = torch.cuda.device_count()
    if dev is not None and dev.index is not None and dev.index >= count:
        raise ConfigError(
            f"device={device!r}: this process sees {count} "
            "CUDA device(s); use an index below that (under torchrun, usually "
            "device=f'cuda:{LOCAL_RANK}')"
        )
    return dev, pin


def _first_jagged(spec: Any, path: str = "") -> str | None:
    """The name of the first fastq.Jagged field declared in spec=, if any."""
    if isinstance(spec, Jagged):
        return path or "batch"
    if isinstance(spec, dict):
        items: Any = spec.items()
    elif isinstance(spec, (tuple, list)):
        items = enumerate(spec)
    else:
        return None
    for key, value in items:
        name = _first_jagged(value, f"{path}.{key}" if path else str(key))
        if name is not None:
            return name
    return None


def _names_cuda(device: Any) -> bool:
    try:
        return device is not None and torch.device(device).type == "cuda"
    except (RuntimeError, TypeError, ValueError):
        return False  # _resolve_device names what is wrong with it


def _cpu_tensor(a: Any) -> torch.Tensor:
    """A field's tensor over the slot: a jagged field's as a nested tensor
    with the jagged layout (values and offsets, no copy)."""
    if type(a) is JaggedArray:
        return torch.nested.nested_tensor_from_jagged(
            torch.from_numpy(a.values), torch.from_numpy(a.offsets)
        )
    return torch.from_numpy(a)


class TorchPrefetcher(Prefetcher):
    """A ``fastq.Prefetcher`` that yields torch tensors: CPU tensors
    over the ring's slots (no copy), page-locked when ``pin_memory=True``,
    or tensors already on a CUDA device.

    Every argument of ``fastq.Prefetcher`` is accepted as there.
    Batches keep the source's structure (a tensor, a tuple or a dict of
    tensors).

    Parameters
    ----------
    source, batch_size, *args, **kwargs
        As for ``fastq.Prefetcher``.
    pin_memory : bool or None
        Page-lock the whole ring once (``cudaHostRegister``), so CPU batches
        are pinned and ``.to('cuda', non_blocking=True)`` copies them by DMA
        straight from their slot. A slot is freed only after the work queued
        on the current CUDA stream when its last tensor was dropped has run.
        Default (None): True when ``device`` is a CUDA device, else False.
    device : str or torch.device, optional
        ``'cuda'``, ``'cuda:N'`` or a torch.device: yield batches already on
        that GPU, copied asynchronously on a side stream. The current stream
        waits for the copy, and the slot is freed once the copy's event has
        completed. None or ``'cpu'``: CPU tensors.
    decode_backend, decode_dtype, channels_last, decode_lookahead
        For a dataset of encoded images (``fastq.vision.ImageFolder``, one
        with a ``decode_plan``) and a CUDA ``device``: as
        ``fastq.torch.DataLoader``'s. Batches are then ``(images, labels)``
        on the device, decoded there while the previous step computes
        (``spec=`` defaults to the dataset's ``encoded_spec``); without a
        GPU decoder the workers decode, with one warning.

    Raises
    ------
    ConfigError
        As Prefetcher; also ``pin_memory=True`` or a CUDA ``device`` without
        CUDA, a non-CUDA device, or ``copy=True`` with either of them.
    SpecError
        A field's dtype has no torch equivalent.
    SharedMemoryError
        As Prefetcher; also the ring cannot be page-locked.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int | None = None,
        *args: Any,
        pin_memory: bool | None = None,
        device: str | torch.device | None = None,
        decode_backend: Any = DEFAULT_BACKEND,
        decode_dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        decode_lookahead: int = DECODE_LOOKAHEAD,
        **kwargs: Any,
    ) -> None:
        # Everything that can be refused is refused before a worker starts.
        arguments = _bind_prefetcher_args((source, batch_size, *args), kwargs)
        lookahead = positive_int(
            "decode_lookahead", decode_lookahead, "e.g. 2 (the default)"
        )
        self._images: ImageDecode | None = None
        self._decoding: weakref.ref[DecodedEpoch] | None = None
        if getattr(source, "decode_plan", None) is not None and _names_cuda(device):
            images = ImageDecode(
                source,
                decode_backend,
                decode_dtype,
                channels_last,
                cuda=_image_decode.cuda_available(),
                face="fastq.torch.TorchPrefetcher",
                lookahead=lookahead,
            )
            if images.on_gpu:
                self._images = images
                if "spec" not in arguments:
                    kwargs["spec"] = source.encoded_spec(batch_size or 1)
                    arguments["spec"] = kwargs["spec"]
        jagged = _first_jagged(arguments.get("spec"))
        if self._images is not None:
            jagged = None  # the files' bytes go to the decode stage, not the device
        if jagged is not None and (pin_memory or _names_cuda(device)):
            option = "pin_memory=True" if pin_memory else f"device={device!r}"
            raise ConfigError(
                f"{option} with the jagged field {jagged!r}: jagged fields are "
                "handed out on the CPU, as nested tensors over the slot; drop "
                f"{option.split('=')[0]}= and move each batch with "
                ".to(device, non_blocking=True)"
            )
        dev, pin = _resolve_device(device, pin_memory)
        if (dev is not None or pin) and arguments.get("copy", False):
            option = f"device={device!r}" if dev is not None else "pin_memory=True"
            raise ConfigError(
                f"copy=True with {option}: copies are made outside the ring, so "
                "they are neither pinned nor needed (GPU batches never alias a "
                "slot); drop copy=True"
            )
        self.device = dev
        self.pin_memory = pin
        super().__init__(source, batch_size, *args, **kwargs)
        try:
            self._check_dtypes()
        except BaseException:
            self.close()
            raise

    def _pinning(self) -> Callable[[], CudaRing] | None:
        if self._images is not None:
            return functools.partial(
                _image_decode.decode_ring, self.pin_memory, self.device
            )
        if self.device is None and not self.pin_memory:
            return None
        return self._cuda_ring

    def _cuda_ring(self) -> CudaRing:
        """Made as the feed opens, once the workers have started (NOTE [ The
        ring is pinned after its workers start ] in fastq/_loop/_engine.py)."""
        dev = self.device
        if dev is None or dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        copy_stream = self.device is not None
        if copy_stream:
            self.device = dev
        return CudaRing(dev, copy_stream=copy_stream, pin=self.pin_memory)

    @property
    def _cuda(self) -> CudaRing | None:
        return self._engine.pinning  # type: ignore[return-value]

    @_cuda.setter
    def _cuda(self, ring: CudaRing) -> None:
        self._engine.pinning = ring

    def _check_dtypes(self) -> None:
        for f in self._spec.fields:
            try:
                torch.from_numpy(np.empty(0, dtype=f.dtype))
            except TypeError:
                raise SpecError(
                    f"field {f.name!r}: dtype {f.dtype} has no torch equivalent; "
                    "produce a numeric dtype torch supports (e.g. float32, "
                    "int64, uint8, bool), or use fastq.Prefetcher for numpy "
                    "batches"
                ) from None

    def _batches(self, spec: BatchSpec, engine: Engine) -> PlainBatches:
        if self._images is not None:
            # The slot's views, for the decode stage to read and keep until
            # its decode has run.
            return PlainBatches(spec)
        return _TensorBatches(spec, engine)

    def __iter__(self) -> Iterator[Any]:
        """As Prefetcher's; a stream's pass under torch.distributed with
        several ranks ends on every rank at the batch the shortest rank
        ends at, so a DDP step never waits on a rank with none left (NOTE
        [ Even batches across ranks ] in fastq/torch/_even_ranks.py)."""
        if self._images is not None:
            # The last epoch's decode thread takes no batch once this begins.
            self._images.stop_epoch()
        batches = super().__iter__()
        if self._images is None:
            group = None if self._settings.is_map else ranks_group()
            return batches if group is None else EvenBatches(batches, group)
        place = self._feed.epoch_place if self._settings.is_map else None
        epoch = self._images.epoch(
            batches, self.device, ring_of=self._decode_ring, place=place
        )
        self._decoding = weakref.ref(epoch)
        return epoch

    def _decode_ring(self) -> CudaRing | None:
        return self._engine.pinning  # type: ignore[return-value]

    def _epoch_place(self) -> tuple[int, int, list[int] | None]:
        # The decode stage's thread takes batches ahead of the loop: a state
        # saved now resumes after the batch handed to the loop last, not
        # after the last the thread took (the loader's own place).
        live = None if self._decoding is None else self._decoding()
        if live is not None and live.running and live.place is not None:
            epoch, done, above = live.place
            return epoch, done, above
        return super()._epoch_place()

    def stats(self) -> dict[str, Any]:
        """As Prefetcher's; with images decoded on the GPU, ``decode`` is the
        decode stage's (as ``fastq.torch.DataLoader.stats()``'s)."""
        stats = super().stats()
        decode = None if self._images is None else self._images.stats()
        if decode is not None:
            stats["decode"] = decode
        return stats

    def close(self) -> None:
        try:
            if getattr(self, "_images", None) is not None:
                self._images.stop_epoch(wait=False)  # type: ignore[union-attr]
            super().close()
        finally:
            if getattr(self, "_images", None) is not None:
                self._images.close()  # type: ignore[union-attr]


class _TensorBatches(PlainBatches):
    """A TorchPrefetcher's batch: CPU tensors over the slot, pinned ones
    over a page-locked ring, or copies on the device."""

    def __init__(self, spec: BatchSpec, engine: Engine) -> None:
        super().__init__(spec)
        self._engine = weakref.proxy(engine)  # its owner: no cycle
        self._offsets = [f.offset for f in spec.fields]

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        cuda: CudaRing | None = self._engine.pinning
        if cuda is None:
            # The tensors keep the numpy views alive, and with them the
            # lease: the slot returns when the last tensor is garbage.
            tensors = [_cpu_tensor(a) for a in arrays]
        elif cuda.stream is not None:  # device=
            tensors = cuda.to_device(arrays)
        else:
            tensors = cuda.pinned_tensors(arrays, self._offsets)
        return self.spec.unflatten(tensors)
