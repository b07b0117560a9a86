"""The image decode stage: a batch of encoded files (fastq.vision's
encoded mode) decoded on the GPU on a stream of its own, cropped to each
sample's box, resized, flipped, normalized and cast, fenced by an event
the training loop's stream waits on; batch k+1 decodes while step k
computes, and the loop's thread never waits for the GPU."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ImageError
from ..vision._decode import decode_error
from ._cuda import Event
from ._decode_cuda import DecodeCuda
from ._decoders import KIND_HW_JPEG, Decoder, decode_with_pil
from ._pinned import CudaRing

# The most decoded batches the stage's thread keeps ready ahead of the loop
# (NOTE [ The decode stage's thread ] in fastq/torch/_decode_thread.py).
DECODE_LOOKAHEAD = 2

# NOTE [ A batch's bytes wait for its decode ]
#
# The decoder reads a batch's files from their slot after the call that
# queued it has returned (nvImageCodec decodes on the stage's stream; its
# hardware engine copies the bytes when it runs), and its decoded images
# are buffers the GPU still reads. The stage records an event on its stream
# after the batch's last kernel and hands the slot's batch and those
# buffers to the ring's returner thread (CudaRing.release_after), which
# drops them once the GPU has passed the event: the slot goes back to the
# workers then, never earlier, and the loop's thread never waits for it.
# The loop's stream waits for the same event before it reads the images
# (wait_event: a wait on the GPU, not on the thread). A slot the stage
# holds for its decode is counted as waiting on device work, as a pinned
# batch's slot is (NOTE [ Slots waiting on device work ] in _pinned.py).


class _Plan:
    """What the stage reads of a fastq.vision DecodePlan."""

    def __init__(self, plan: Any) -> None:
        size = plan.size
        self.size = (
            (int(size), int(size)) if np.ndim(size) == 0 else tuple(map(int, size))
        )
        self.mean = tuple(float(m) for m in plan.mean)
        self.std = tuple(float(s) for s in plan.std)
        self.antialias = bool(getattr(plan, "antialias", True))


class _Decoded:
    """One batch issued to the GPU: its output and the event that fences
    it, or the error it raises at its turn."""

    __slots__ = ("done", "error", "images", "labels", "nbytes", "place")

    def __init__(
        self,
        images: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        done: Event | None = None,
        nbytes: int = 0,
        error: BaseException | None = None,
    ) -> None:
        self.images = images
        self.labels = labels
        self.done = done
        self.nbytes = nbytes
        self.error = error
        self.place: Any = None  # the loader's place once it is handed out


class DecodeStage:
    """Decodes batches of encoded images on the GPU for one loader.

    ``decoder`` is the GPU backend (None: every file through Pillow, then
    uploaded); ``path_of(index)`` names a sample's file in errors;
    ``dtype`` and ``channels_last`` are what the step wants; ``lookahead``
    is how many decoded batches its thread keeps ready ahead of the loop
    (NOTE [ The decode stage's thread ]). ``attach`` gives it the ring
    whose returner keeps slots until their decode has run; without one it
    makes its own.
    """

    def __init__(
        self,
        plan: Any,
        decoder: Decoder | None,
        cuda: DecodeCuda,
        *,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        path_of: Callable[[int], str] = str,
        lookahead: int = DECODE_LOOKAHEAD,
    ) -> None:
        self.plan = _Plan(plan)
        self.lookahead = lookahead
        # The epoch whose thread takes batches now (one at a time).
        self._live: Any = None  # its _decode_thread.Ahead
        # stats() reads what the thread counts.
        self._counting = threading.Lock()
        self.decoder = decoder
        self.cuda = cuda
        self.dtype = dtype
        self.memory_format = (
            torch.channels_last if channels_last else torch.contiguous_format
        )
        self.path_of = path_of
        self.stream: Any = None  # made at the first batch, after the workers fork
        self.ring: CudaRing | None = None
        self._own_ring: CudaRing | None = None
        self._scale: torch.Tensor | None = None
        self._shift: torch.Tensor | None = None
        # (event, bytes) of each batch whose decode the GPU may not have run.
        self._in_flight: list[tuple[Event, int]] = []
        # Counters for stats().
        self.batches = 0
        self.images = 0
        self.per_image = 0  # files decoded with Pillow (other kinds, rejected)
        self.rejected = 0  # files the GPU backend was given and rejected
        self.bytes_now = 0
        self.peak_bytes = 0
        self.peak_in_flight = 0

    # -------------------------------------------------------------- setup

    def attach(self, ring: CudaRing | None) -> None:
        """The ring whose returner keeps each batch's slot until its decode
        has run (the engine's); None: a returner of the stage's own (a
        loader without workers, whose batches are not in a ring)."""
        if ring is None:
            if self._own_ring is None or self._own_ring.closed:
                self._own_ring = CudaRing(
                    self.cuda.tensor_device, False, pin=False, cuda=self.cuda
                )
            ring = self._own_ring
        self.ring = ring

    def _start(self) -> None:
        cuda = self.cuda
        self.stream = cuda.decode_stream()
        mean = torch.tensor(self.plan.mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.plan.std, dtype=torch.float32).view(1, 3, 1, 1)
        # (x / 255 - mean) / std, as ToTensor then Normalize: one multiply-add.
        with cuda.on_stream(self.stream):
            self._scale = cuda.upload(1.0 / (255.0 * std))
            self._shift = cuda.upload(mean / std)

    # ------------------------------------------------------------ batches

    def issue(self, batch: Any) -> _Decoded:
        """Queues ``batch``'s decode on the stage's stream and returns at
        once; a file that cannot be decoded makes the batch's error, raised
        by ``hand_out``."""
        if self.stream is None:
            self._start()
        if self.ring is None:
            self.attach(None)
        assert self.ring is not None
        kept: list[Any] = [batch]  # the slot's bytes and the decoded buffers
        files = _Files(batch)
        del batch
        with self.cuda.on_stream(self.stream):
            try:
                decoded = self._decode(files, kept)
            except Exception as exc:  # a file no decoder can read
                decoded = _Decoded(error=exc)
            done = self.cuda.event()
            done.record(self.stream)
        decoded.done = done
        error: BaseException | None = decoded.error
        for _ in range(4):  # the error, Pillow's under it, and theirs
            if error is None:
                break
            # The frames of their tracebacks must not keep the slot's bytes
            # while the loop holds the error.
            traceback.clear_frames(error.__traceback__)
            error = error.__cause__ or error.__context__
        # NOTE [ A batch's bytes wait for its decode ]
        self.ring.release_after(done, kept)
        del kept, files
        with self._counting:
            self._account(done, decoded.nbytes)
            self.batches += 1
        return decoded

    def _decode(self, files: _Files, kept: list[Any]) -> _Decoded:
        n = len(files)
        pixels: list[torch.Tensor | None] = [None] * n
        cropped = [False] * n
        decoder = self.decoder
        if decoder is not None:
            on_gpu = (
                list(range(n))
                if decoder.takes_other_kinds
                else np.flatnonzero(files.kind == KIND_HW_JPEG).tolist()
            )
            if on_gpu:
                out = decoder.decode(
                    [files.data(i) for i in on_gpu], files.box[on_gpu], self.stream
                )
                kept.append(out)
                for i, t in zip(on_gpu, out):
                    if t is None:
                        self.rejected += 1
                    else:
                        pixels[i], cropped[i] = t, decoder.crops
        nbytes = 0
        crops: list[torch.Tensor] = []
        boxes = files.box.tolist()  # Python ints once, not n numpy scalars
        for i in range(n):
            t = pixels[i]
            top, left, height, width = boxes[i]
            if t is None:
                # Other kinds, and what the backend rejected: Pillow, then
                # up (page-locked staging, no wait).
                self.per_image += 1
                try:
                    host = decode_with_pil(files.data(i), boxes[i])
                except Exception as exc:
                    raise _named(exc, int(files.index[i]), self.path_of) from exc
                t = self.cuda.upload(host)
                kept.append(t)
            else:
                if t.device != self.cuda.tensor_device:
                    # A backend that decoded this one on its CPU path.
                    t = self.cuda.upload(t)
                    kept.append(t)
                if not cropped[i]:
                    t = t[:, top : top + height, left : left + width]
            nbytes += t.numel()
            crops.append(t)
        batch = self._resize(crops)
        flips = files.flip.astype(bool)
        flipped = bool(flips.any())
        if flipped:
            # The batch's flips in two kernels, not one per flipped image.
            mask = self.cuda.upload(torch.from_numpy(flips)).view(-1, 1, 1, 1)
            batch = torch.where(mask, batch.flip(-1), batch)
        assert self._scale is not None and self._shift is not None
        batch.mul_(self._scale).sub_(self._shift)
        images = batch.to(dtype=self.dtype, memory_format=self.memory_format)
        labels = self.cuda.upload(
            torch.from_numpy(files.label.astype(np.int64, copy=False))
        )
        nbytes += batch.numel() * 4 * (2 if flipped else 1)
        nbytes += images.numel() * images.element_size()
        self.images += n
        return _Decoded(images, labels, nbytes=nbytes)

    def _resize(self, crops: list[torch.Tensor]) -> torch.Tensor:
        """The crops resized to the plan's size, as one float batch: the
        crops of one shape in one call (each image is resized on its own in
        that call, so it equals a call per image), the others one by one
        (a padded batch would blend the padding into the edges)."""
        size = self.plan.size
        out = torch.empty(
            (len(crops), 3, *size), dtype=torch.float32, device=crops[0].device
        )
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, t in enumerate(crops):
            groups.setdefault(tuple(t.shape), []).append(i)
        for rows in groups.values():
            alone = len(rows) == 1
            x = (
                crops[rows[0]].unsqueeze(0)
                if alone
                else torch.stack([crops[i] for i in rows])
            )
            x = x.float()
            x = F.interpolate(
                x,
                size=size,
                mode="bilinear",
                align_corners=False,
                antialias=self.plan.antialias,
            )
            if alone:
                out[rows[0]] = x[0]
            else:
                where = self.cuda.upload(torch.tensor(rows))  # staged: no wait
                out.index_copy_(0, where, x)
        return out

    def hand_out(self, decoded: _Decoded) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch, on the device: the current stream waits for its
        decode (on the GPU: this thread does not wait). Raises the batch's
        error at its turn."""
        if decoded.error is not None:
            error, decoded.error = decoded.error, None
            raise error
        assert decoded.images is not None and decoded.labels is not None
        assert decoded.done is not None
        self.cuda.hand_over([decoded.images, decoded.labels], decoded.done)
        return decoded.images, decoded.labels

    def _account(self, done: Event | None = None, nbytes: int = 0) -> None:
        """The stage's device memory: what the batches whose decode the GPU
        has not passed hold (asked with query(), which never waits)."""
        live = [(e, b) for e, b in self._in_flight if not e.query()]
        if done is not None:
            live.append((done, nbytes))
        self._in_flight = live
        self.bytes_now = sum(b for _, b in live)
        self.peak_bytes = max(self.peak_bytes, self.bytes_now)
        self.peak_in_flight = max(self.peak_in_flight, len(live))

    # --------------------------------------------------------- lifecycle

    def stats(self) -> dict[str, Any]:
        """``backend``; ``batches`` and ``images`` decoded; ``per_image``:
        files decoded with Pillow (other kinds, and the ``rejected`` ones
        the GPU backend was given); ``gpu_bytes`` and ``peak_gpu_bytes``:
        the device memory of the batches in flight (decoded files, the
        resized batch, the output); ``in_flight`` and its peak."""
        with self._counting:
            self._account()
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        return {
            "backend": "cpu" if self.decoder is None else self.decoder.name,
            "batches": self.batches,
            "images": self.images,
            "per_image": self.per_image,
            "rejected": self.rejected,
            "gpu_bytes": self.bytes_now,
            "peak_gpu_bytes": self.peak_bytes,
            "in_flight": len(self._in_flight),
            "peak_in_flight": self.peak_in_flight,
        }

    def adopt(self, ahead: Any) -> None:
        """``ahead``'s thread is the one that takes batches now: the one
        before it is stopped and joined first."""
        self.stop_epoch()
        self._live = ahead

    def stop_epoch(self, wait: bool = True) -> None:
        """Stops the thread of the epoch in progress (before a new epoch
        takes batches, or the loader closes); joins it if ``wait``. Without
        ``wait`` it stops at its next batch: the engine's close wakes it if
        it waits for one."""
        live = self._live
        if live is not None:
            live.stop(wait)
            if wait:
                self._live = None

    def close(self) -> None:
        """Stops and joins the stage's thread, drops what it gave the ring
        after the ring closed, then stops its own returner (the engine
        closes its ring)."""
        self.stop_epoch()
        if self.ring is not None:
            # The batch the thread finished as the engine closed its ring.
            self.ring.drop_late()
        own, self._own_ring = self._own_ring, None
        self._in_flight = []
        if own is not None:
            own.close()


class _Files:
    """A host batch of fastq.vision's encoded samples, as numpy: the files'
    bytes (a jagged field, or a DataLoader's values and offsets) and the
    fixed fields."""

    def __init__(self, batch: Any) -> None:
        data = batch["data"]
        if hasattr(data, "values") and hasattr(data, "offsets"):  # fastq.Jagged
            self._values = np.asarray(data.values)
            self._offsets = np.asarray(data.offsets)
        else:
            self._values = np.asarray(data)
            self._offsets = np.asarray(batch["data_offsets"])
        self.label = np.asarray(batch["label"]).reshape(-1)
        self.index = np.asarray(batch["index"]).reshape(-1)
        self.box = np.asarray(batch["box"]).reshape(-1, 4)
        self.flip = np.asarray(batch["flip"]).reshape(-1)
        self.kind = np.asarray(batch["kind"]).reshape(-1)

    def __len__(self) -> int:
        return len(self.label)

    def data(self, i: int) -> np.ndarray[Any, Any]:
        return self._values[int(self._offsets[i]) : int(self._offsets[i + 1])]


def _named(exc: Exception, index: int, path_of: Callable[[int], str]) -> ImageError:
    """``exc`` as the ImageError a worker decoding the file raises (its
    path and dataset index), as a DataLoader's worker would raise it."""
    try:
        path = path_of(index)
    except Exception:
        path = "?"
    error = decode_error(path, index, exc)
    # The batch is spent, as one a worker's error ends: a loader's count of
    # batches delivered includes it (_loader_iterator.py).
    error.fastq_batch_spent = True  # type: ignore[attr-defined]
    error.__cause__ = exc
    return error


def collate_encoded(samples: list[dict[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    """A DataLoader's batch of encoded samples: the files' bytes back to
    back with their offsets (two arrays, whatever the batch size), the
    fixed fields stacked."""
    data = [np.asarray(s["data"], dtype=np.uint8).reshape(-1) for s in samples]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    batch = {
        "data": np.concatenate(data) if data else np.zeros(0, np.uint8),
        "data_offsets": offsets,
    }
    for key in ("label", "index", "size", "box", "flip", "kind"):
        batch[key] = np.stack([np.asarray(s[key]) for s in samples])
    return batch
