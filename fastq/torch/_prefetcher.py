"""TorchPrefetcher: batches as tensors over the ring's slots, a page-locked
ring with copies to the GPU on a side stream."""

from __future__ import annotations

import inspect
import os
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .._jagged import Jagged, JaggedArray
from .._prefetcher import Prefetcher
from ..errors import ConfigError, SharedMemoryError, SpecError

__all__ = ["TorchPrefetcher"]

# cudaHostRegisterPortable: the ring counts as pinned in every CUDA context
# of the process, not only the current device's (torch pins shared memory
# with the same flag).
_HOST_REGISTER_PORTABLE = 1

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


def _slot_owner(leaf: np.ndarray[Any, Any]) -> Any:
    """The object at the end of a slot view's base chain: its SlotLease."""
    owner: Any = leaf
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner


class _Cuda:
    """The CUDA side of a TorchPrefetcher: the ring's page-locked
    registration, the copy stream, and slots waiting on GPU work.

    A slot whose bytes a queued copy still has to read stays leased until
    that copy's event has completed: ``pending`` holds (event, lease
    holder) in the order the events were recorded. It never references the
    prefetcher, so batch finalizers keep nothing else alive.
    """

    def __init__(self, device: torch.device, copy_stream: bool) -> None:
        self.device = device
        self.pending: deque[tuple[torch.cuda.Event, Any]] = deque()
        self.closed = False
        self._host: np.ndarray[Any, Any] | None = None
        with torch.cuda.device(device):
            self.stream = (
                torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
                if copy_stream
                else None
            )

    # ------------------------------------------------------------ pinning

    def register(self, mapping: Any) -> None:
        """Page-locks the whole ring once, so copies from any slot are DMA
        transfers with no staging copy."""
        # The array keeps the mapping exported (it cannot be closed) for as
        # long as it is registered.
        host = np.frombuffer(mapping, dtype=np.uint8)
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.device):
            err = int(
                cudart.cudaHostRegister(
                    host.ctypes.data, host.nbytes, _HOST_REGISTER_PORTABLE
                )
            )
        if err != 0:
            raise SharedMemoryError(
                f"pin_memory=True: cudaHostRegister could not page-lock the "
                f"{host.nbytes}-byte ring ({torch.cuda.CudaError(err)}). Lower "
                "slots= or batch_size=, or pass pin_memory=False (copies then "
                "go through CUDA's staging buffers)"
            )
        self._host = host

    @property
    def registered(self) -> bool:
        return self._host is not None

    # -------------------------------------------------------------- slots

    def reap(self) -> None:
        """Returns the slots whose GPU work is done (events complete in the
        order they were recorded on one stream, so the oldest goes first)."""
        pending = self.pending
        while pending and pending[0][0].query():  # type: ignore[no-untyped-call]
            pending.popleft()

    def wait_oldest(self) -> None:
        if self.pending:
            self.pending[0][0].synchronize()
            self.reap()

    def to_device(self, leaves: Sequence[np.ndarray[Any, Any]]) -> list[torch.Tensor]:
        """Queues the leaves' copies to the device on the copy stream; the
        consumer's stream waits for them, and the slot stays leased until
        they are done."""
        self.reap()
        consumer = torch.cuda.current_stream(self.device)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            out = [
                torch.from_numpy(a).to(self.device, non_blocking=True) for a in leaves
            ]
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        consumer.wait_event(done)
        for t in out:
            # Allocated on the copy stream, used on the consumer's: the
            # allocator must not hand their memory to the next copy while
            # the consumer's queued work still reads it.
            t.record_stream(consumer)
        self.pending.append((done, leaves))
        return out

    def pinned_tensors(
        self, leaves: Sequence[np.ndarray[Any, Any]], offsets: Sequence[int]
    ) -> list[torch.Tensor]:
        """CPU tensors over the page-locked slot. When the last of them is
        garbage the slot is not freed at once: an event is recorded on the
        current stream, so a non_blocking copy queued from them finishes
        reading before a worker may overwrite the slot."""
        self.reap()
        owner = _slot_owner(leaves[0])
        # One array over the slot that every leaf views: its finalizer
        # runs when the last tensor (hence the last leaf) is garbage.
        whole = np.frombuffer(owner, dtype=np.uint8)
        views = [
            np.ndarray(a.shape, a.dtype, buffer=whole, offset=off)
            for a, off in zip(leaves, offsets)
        ]
        fin = weakref.finalize(whole, _defer_release, self, owner)
        fin.atexit = False
        return [torch.from_numpy(v) for v in views]

    # ---------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Waits for every queued copy from the ring, then unpins it."""
        self.closed = True
        try:
            if self.registered or self.pending:
                # Copies the user queued from pinned batches are not all in
                # `pending` yet (their tensors may be alive): the ring must
                # not be unpinned under a DMA in flight.
                torch.cuda.synchronize(self.device)
        finally:
            self.pending.clear()
            host, self._host = self._host, None
            if host is not None:
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                err = int(cudart.cudaHostUnregister(host.ctypes.data))
                if err != 0:
                    raise SharedMemoryError(
                        f"cudaHostUnregister failed on the ring "
                        f"({torch.cuda.CudaError(err)})"
                    )


def _defer_release(cuda: _Cuda, owner: Any) -> None:
    """Finalizer of a pinned batch: keeps its slot until the GPU work queued
    so far on the current stream has run. Runs in whichever thread dropped
    the last tensor; never raises."""
    if cuda.closed:
        return  # close() synchronised the device; dropping `owner` frees it
    try:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(cuda.device))
    except Exception:  # interpreter or CUDA shutting down: nothing to wait for
        return
    cuda.pending.append((event, owner))


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
    """A :class:`fastq.Prefetcher` that yields torch tensors: CPU tensors
    over the ring's slots (no copy), page-locked when ``pin_memory=True``,
    or tensors already on a CUDA device.

    Every argument of :class:`fastq.Prefetcher` is accepted as there.
    Batches keep the source's structure (a tensor, a tuple or a dict of
    tensors).

    Parameters
    ----------
    source, batch_size, *args, **kwargs
        As for :class:`fastq.Prefetcher`.
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
        **kwargs: Any,
    ) -> None:
        # Everything that can be refused is refused before a worker starts.
        self._cuda: _Cuda | None = None
        arguments = _bind_prefetcher_args((source, batch_size, *args), kwargs)
        jagged = _first_jagged(arguments.get("spec"))
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
        self._offsets = [f.offset for f in self._spec.fields]
        try:
            self._check_dtypes()
            if dev is not None or pin:
                # CUDA is touched only now, after the workers have started.
                if dev is None or dev.index is None:
                    cuda_dev = torch.device("cuda", torch.cuda.current_device())
                else:
                    cuda_dev = dev
                if dev is not None:
                    self.device = cuda_dev
                self._cuda = _Cuda(cuda_dev, copy_stream=dev is not None)
                if pin:
                    assert self._region is not None
                    self._cuda.register(self._region.mapping)
        except BaseException:
            self.close()
            raise

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

    # ------------------------------------------------------------ batches

    def _make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        cuda = self._cuda
        if cuda is None:
            # The tensors keep the numpy views alive, and with them the
            # lease: the slot returns when the last tensor is garbage.
            tensors = [_cpu_tensor(a) for a in arrays]
        elif self.device is not None:
            tensors = cuda.to_device(arrays)
        else:
            tensors = cuda.pinned_tensors(arrays, self._offsets)
        return self._spec.unflatten(tensors)

    def _reclaim_slots(self) -> None:
        cuda = self._cuda
        if cuda is not None:
            cuda.reap()
            # Slots that only wait for GPU work would make the core report
            # SlotsExhausted; wait for that work instead, oldest first.
            c = self._feed.consumer
            while cuda.pending and c.held + c.in_window >= self._ring.nslots:
                cuda.wait_oldest()

    # ---------------------------------------------------------- lifecycle

    def _stop_engine(self) -> None:
        if self._cuda is not None:
            self._cuda.close()  # copies from the old ring done, then unpinned

    def _engine_started(self) -> None:
        old = self._cuda
        if old is not None:
            self._cuda = _Cuda(old.device, copy_stream=old.stream is not None)
            if self.pin_memory:
                assert self._region is not None
                self._cuda.register(self._region.mapping)

    def close(self) -> None:
        """As :meth:`fastq.Prefetcher.close`; with pin_memory or a device,
        first waits for the copies queued from the ring, then unpins it."""
        cuda = getattr(self, "_cuda", None)
        if cuda is None or self._closed or os.getpid() != self._pid:
            super().close()
            return
        try:
            cuda.close()
        finally:
            super().close()
