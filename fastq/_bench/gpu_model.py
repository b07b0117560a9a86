"""A model of a GPU's timeline that stands in for ``torch.cuda`` wherever
fastq and torch's DataLoader use it (streams, events, cudaHostRegister,
page-locked blocks, ``non_blocking`` copies), so that the pinned path can be
measured on a machine without a GPU, against the same code that runs on
one. It runs in wall time, so it shows behaviour (who waits for the GPU,
which copies are staged), not figures: the gpu-model case's figures come
from the simulation in fastq/_bench/gpu_timeline.py.

What it models, and what it assumes (docs/performance.md lists these beside
the figures):

- Each stream runs its queued work in order, for the work's duration; two
  streams run at once, as a copy engine beside the compute engine does. The
  timeline is computed as work is queued, so no thread of this process
  (and no hold on the GIL) can delay the GPU.
- Launching is bounded: at most ``launch_queue`` items are queued, all
  streams together, and a launch past that blocks the launching thread, as
  CUDA's launch queue does; so the loop runs ahead of the GPU by that much.
- An event completes when its stream passes it; ``synchronize`` sleeps until
  then, and is counted per thread, so what waited for the GPU shows.
- A copy from page-locked memory (the ring once registered, or a block from
  the model's caching host allocator) is queued work at COPY_BYTES_PER_S. A
  copy from pageable memory is a memcpy on the calling thread into a staging
  buffer, then the same queued work.
- The caching host allocator (what ``Tensor.pin_memory()`` takes from, as
  torch's CachingHostAllocator) reuses a block only once the events of the
  copies queued from it have completed.
- A device tensor is a 'meta' tensor of the right shape: nothing is
  computed, only timed.
- The GPU's JPEG decoder (``jpeg_engine``) is one queue of its own beside
  the compute and copy engines, as NVJPG is its own silicon: a batch of n
  images takes n / rate once its input has been copied, in the order the
  batches were queued. What a backend runs on the SMs around it (resize,
  normalize) is launched by the caller on a stream, as compute.

Everything is patched into torch by ``install`` in a process of its own (the
bench runs each loader in a fresh interpreter); nothing here is imported by
fastq itself.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np

# A host-to-device copy from page-locked memory: PCIe 4.0 x16, about what
# H100 machines measure (tests/test_torch_cuda.py measures it on a GPU).
COPY_BYTES_PER_S = 25e9


class ModelEvent:
    """torch.cuda.Event on the model: complete once the GPU's clock passes
    the end of the work queued on its stream before it; an event never
    recorded counts as complete, as CUDA's does."""

    def __init__(self, gpu: ModelGpu) -> None:
        self._gpu = gpu
        self.at = 0.0  # perf_counter() time the GPU passes it

    def record(self, stream: Any = None) -> None:
        stream = self._gpu.current_stream() if stream is None else stream
        self.at = self._gpu.record(stream)

    @property
    def done(self) -> bool:
        return time.perf_counter() >= self.at

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self._gpu.wait_until(self.at, "sync")

    def wait(self, stream: Any = None) -> None:
        stream = self._gpu.current_stream() if stream is None else stream
        stream.wait_event(self)


class ModelStream:
    """torch.cuda.Stream on the model: its work runs in order, each item
    starting when the one before it ends (and after any event it was told
    to wait for)."""

    def __init__(self, gpu: ModelGpu) -> None:
        self._gpu = gpu
        self.tail = 0.0  # when the last item queued on it ends

    def wait_event(self, event: ModelEvent) -> None:
        with self._gpu.changed:
            self.tail = max(self.tail, event.at)

    def record_event(self, event: ModelEvent | None = None) -> ModelEvent:
        event = ModelEvent(self._gpu) if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        self._gpu.wait_until(self.tail, "sync")

    def query(self) -> bool:
        return time.perf_counter() >= self.tail


class ModelJpegEngine:
    """The GPU's JPEG decoder on the model: a queue of its own, decoding
    ``images_per_s`` images a second whatever the streams do (its own
    engine), each batch after the event it is told to wait for (the copy
    of its bytes)."""

    def __init__(self, gpu: ModelGpu, images_per_s: float) -> None:
        if images_per_s <= 0:
            raise ValueError(f"images_per_s={images_per_s}: must be positive")
        self._gpu = gpu
        self.images_per_s = images_per_s
        self.queue = gpu.new_stream()
        self.images = 0  # decoded, all batches
        self.busy_s = 0.0

    def decode(self, images: int, after: ModelEvent | None = None) -> ModelEvent:
        """Queues a batch of ``images`` after ``after``; the event the
        decoded batch is ready at."""
        if after is not None:
            self.queue.wait_event(after)
        seconds = images / self.images_per_s
        self._gpu.launch(self.queue, seconds)
        self.images += images
        self.busy_s += seconds
        return self.queue.record_event()


class HostBlock:
    """A page-locked block of the model's caching host allocator."""

    __slots__ = ("events", "memory")

    def __init__(self, nbytes: int) -> None:
        self.memory = np.empty(nbytes, dtype=np.uint8)
        self.events: list[ModelEvent] = []


class ModelGpu:
    """The device: its streams, launch queue, page-locked ranges and
    caching host allocator, and what it counts.

    The timeline is computed, not run: an item's end is known when it is
    launched (its stream's tail, or the event it waits for, plus its
    duration), so the GPU needs no thread, and no Python thread's hold on
    the GIL can slow it down, as none can slow a real GPU."""

    def __init__(self, launch_queue: int) -> None:
        self.changed = threading.Lock()
        self.launch_queue = launch_queue
        self._ends: list[float] = []  # heap: queued items' end times
        self._local = threading.local()
        self._streams: list[ModelStream] = []
        self._registered: dict[int, int] = {}  # address -> bytes
        self._blocks: dict[int, HostBlock] = {}  # address -> block
        self._free_blocks: dict[int, list[HostBlock]] = defaultdict(list)
        self.host_bytes = 0  # page-locked bytes the allocator holds
        self.registered_bytes = 0
        # Per "thread why": how many times, and how long, a thread waited
        # for the GPU, why being "sync" (an event, a stream, the device, a
        # blocking copy) or "launch" (the launch queue was full).
        self.waits: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        self.staged_bytes = 0  # pageable copies, memcpy'd by their thread
        self.busy_s = 0.0  # work queued, all streams
        self.default = self.new_stream()

    # -------------------------------------------------------------- work

    def new_stream(self) -> ModelStream:
        stream = ModelStream(self)
        self._streams.append(stream)
        return stream

    def jpeg_engine(self, images_per_s: float) -> ModelJpegEngine:
        """The device's JPEG decoder, decoding ``images_per_s`` images a
        second."""
        return ModelJpegEngine(self, images_per_s)

    def current_stream(self) -> ModelStream:
        stream: ModelStream | None = getattr(self._local, "stream", None)
        return self.default if stream is None else stream

    @contextlib.contextmanager
    def use_stream(self, stream: ModelStream | None) -> Iterator[None]:
        before = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def launch(self, stream: ModelStream, seconds: float) -> None:
        """Queues ``seconds`` of work on ``stream``; first waits while the
        launch queue is full, as a CUDA launch blocks."""
        ends = self._ends
        while True:
            with self.changed:
                now = time.perf_counter()
                while ends and ends[0] <= now:
                    heapq.heappop(ends)
                if len(ends) < self.launch_queue:
                    end = max(now, stream.tail) + seconds
                    stream.tail = end
                    heapq.heappush(ends, end)
                    self.busy_s += seconds
                    return
                room_at = ends[0]
            self.wait_until(room_at, "launch")

    def record(self, stream: ModelStream) -> float:
        """When the GPU passes an event recorded now on ``stream``."""
        with self.changed:
            return max(time.perf_counter(), stream.tail)

    def wait_until(self, at: float, why: str) -> None:
        """Sleeps until the GPU's clock reaches ``at``, counting the wait
        for the calling thread."""
        now = time.perf_counter()
        if now >= at:
            return
        t0 = now
        while now < at:
            time.sleep(at - now)
            now = time.perf_counter()
        tally = self.waits[f"{threading.current_thread().name} {why}"]
        tally[0] += 1
        tally[1] += now - t0

    def synchronize(self) -> None:
        self.wait_until(max(s.tail for s in self._streams), "sync")

    # ------------------------------------------------------------ memory

    def register(self, address: int, nbytes: int) -> int:
        self._registered[address] = nbytes
        self.registered_bytes += nbytes
        return 0

    def unregister(self, address: int) -> int:
        self.registered_bytes -= self._registered.pop(address, 0)
        return 0

    def _pinned_block(self, address: int, nbytes: int) -> HostBlock | bool | None:
        """The allocator's block holding [address, address + nbytes), True
        inside a registered range, else None."""
        for start, size in self._registered.items():
            if start <= address and address + nbytes <= start + size:
                return True
        for start, block in self._blocks.items():
            if start <= address and address + nbytes <= start + block.memory.nbytes:
                return block
        return None

    def is_pinned(self, address: int, nbytes: int) -> bool:
        return self._pinned_block(address, nbytes) is not None

    def host_empty(self, nbytes: int) -> np.ndarray[Any, Any]:
        """A page-locked buffer from the caching allocator: a block whose
        queued copies have all run, or a new one. It goes back to the
        allocator when the returned array is garbage."""
        free = self._free_blocks[nbytes]
        block = None
        for i, candidate in enumerate(free):
            if all(e.done for e in candidate.events):
                block = free.pop(i)
                block.events.clear()
                break
        if block is None:
            block = HostBlock(nbytes)
            self._blocks[block.memory.ctypes.data] = block
            self.host_bytes += nbytes
        view = block.memory[:]
        weakref.finalize(view, free.append, block)
        return view

    def copy_to_device(self, address: int, nbytes: int, host: Any) -> None:
        """A copy of ``nbytes`` at ``address`` (``host``: a uint8 array over
        them) queued on the current stream, staged by this thread first if
        the memory is pageable."""
        stream = self.current_stream()
        block = self._pinned_block(address, nbytes)
        if block is None:
            staging = np.empty(nbytes, dtype=np.uint8)
            np.copyto(staging, host)
            self.staged_bytes += nbytes
        self.launch(stream, nbytes / COPY_BYTES_PER_S)
        if isinstance(block, HostBlock):
            # As torch's CachingHostAllocator records an event on a block a
            # non_blocking copy reads: the block is reused after it.
            event = ModelEvent(self)
            event.record(stream)
            block.events.append(event)

    def summary(self) -> dict[str, Any]:
        return {
            "waits": {k: {"n": v[0], "s": v[1]} for k, v in self.waits.items()},
            "host_bytes": self.host_bytes,
            "registered_bytes": self.registered_bytes,
            "staged_bytes": self.staged_bytes,
        }


class _Cudart:
    """torch.cuda.cudart() on the model: host registration only."""

    def __init__(self, gpu: ModelGpu) -> None:
        self._gpu = gpu

    def cudaHostRegister(self, address: int, nbytes: int, flags: int) -> int:
        return self._gpu.register(address, nbytes)

    def cudaHostUnregister(self, address: int) -> int:
        return self._gpu.unregister(address)


def _host_bytes(t: Any) -> tuple[int, int, Any]:
    nbytes = t.numel() * t.element_size()
    flat = t.detach().contiguous().reshape(-1).view(__import__("torch").uint8)
    return t.data_ptr(), nbytes, flat.numpy()


def _names_cuda(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    import torch

    for a in (*args, kwargs.get("device")):
        if isinstance(a, torch.device) and a.type == "cuda":
            return True
        if isinstance(a, str) and a.startswith("cuda"):
            return True
    return False


def install(launch_queue: int) -> ModelGpu:
    """Makes torch.cuda (and torch.accelerator) the model, in this
    process, for good."""
    import torch

    gpu = ModelGpu(launch_queue)
    cuda: Any = torch.cuda
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.device = lambda device=None: contextlib.nullcontext()
    cuda.Stream = lambda device=None, **kw: gpu.new_stream()
    cuda.stream = gpu.use_stream
    cuda.current_stream = lambda device=None: gpu.current_stream()
    cuda.Event = lambda *a, **kw: ModelEvent(gpu)
    cuda.synchronize = lambda device=None: gpu.synchronize()
    cuda.cudart = lambda: _Cudart(gpu)
    # torch.manual_seed (which every DataLoader worker calls) seeds the
    # CUDA generators when CUDA says it is initialized. On a CUDA build the
    # real generators were never made (the model stands in for CUDA), so
    # seeding them would fail: the model has no generators to seed.
    for seeding in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
        setattr(cuda, seeding, lambda *args: None)
    accelerator: Any = torch.accelerator
    accelerator.is_available = lambda: True
    accelerator.current_accelerator = lambda *a, **kw: torch.device("cuda")
    accelerator.current_device_index = lambda: 0
    accelerator.set_device_index = lambda index: None

    to = torch.Tensor.to
    tensor: Any = torch.Tensor

    def to_device(t: Any, *args: Any, **kwargs: Any) -> Any:
        if t.device.type != "cpu" or not _names_cuda(args, kwargs):
            return to(t, *args, **kwargs)
        address, nbytes, host = _host_bytes(t)
        gpu.copy_to_device(address, nbytes, host)
        if not kwargs.get("non_blocking", False):
            gpu.synchronize()
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    def is_pinned(t: Any, device: Any = None) -> bool:
        return t.device.type == "cpu" and gpu.is_pinned(
            t.data_ptr(), t.numel() * t.element_size()
        )

    def pin_memory(t: Any, device: Any = None) -> Any:
        if is_pinned(t):
            return t
        _, nbytes, host = _host_bytes(t)
        block = gpu.host_empty(nbytes)
        np.copyto(block, host)
        return torch.from_numpy(block).view(t.dtype).reshape(t.shape)

    tensor.to = to_device
    tensor.is_pinned = is_pinned
    tensor.pin_memory = pin_memory
    tensor.record_stream = lambda t, stream: None
    return gpu
