"""What the image decode stage's tests share: a folder of small image files
of every kind the stage meets (baseline, progressive, grayscale and CMYK
JPEGs, a PNG, a truncated JPEG), a dataset of them in fastq.vision's two
modes (its encoded samples, or decoded ones as the workers make them), the
CPU reference a decoded image is checked against, and a GPU whose events
complete only when the test says, with a decoder that decodes with
Pillow on it."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import vision_fixtures as vf

from fastq.torch import DataLoader
from fastq.torch._decoders import decode_with_pil
from fastq.vision import KIND_HW_JPEG, KIND_OTHER, ImageFiles, decode_on_cpu
from torch_helpers.pinning import FakeCuda, FakeEvent, FakeGpu

SIZE = (24, 32)  # the training plan's output (h, w)


def _picture(h: int, w: int, seed: int) -> np.ndarray[Any, Any]:
    """A smooth picture (JPEG keeps it well): gradients and a blob."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    rng = np.random.default_rng(seed)
    cy, cx = rng.uniform(0, h), rng.uniform(0, w)
    blob = 120 * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / (0.1 * h * w))
    r = 40 + 150 * x / w + blob
    g = 60 + 120 * y / h + 0.5 * blob
    b = 200 - 100 * (x + y) / (h + w)
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def make_files(root: Path, count: int = 12) -> list[tuple[str, int, int]]:
    """(path, label, kind) of ``count`` files of varied sizes: mostly
    baseline JPEGs, then one each of progressive, grayscale, CMYK and PNG."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    out = []
    others = ["progressive", "gray", "cmyk", "png"]
    for i in range(count):
        h, w = 48 + 8 * (i % 5), 64 + 12 * (i % 3)
        img = Image.fromarray(_picture(h, w, i))
        kind_name = others[i - (count - 4)] if i >= count - 4 else "baseline"
        path = root / f"{i:03d}_{kind_name}.{'png' if kind_name == 'png' else 'jpg'}"
        if kind_name == "baseline":
            img.save(path, quality=95)
        elif kind_name == "progressive":
            img.save(path, quality=95, progressive=True)
        elif kind_name == "gray":
            img.convert("L").save(path, quality=95)
        elif kind_name == "cmyk":
            img.convert("CMYK").save(path, quality=95)
        else:
            img.save(path)
        kind = KIND_HW_JPEG if kind_name == "baseline" else KIND_OTHER
        out.append((str(path), i % 3, kind))
    return out


def truncate(path: str) -> None:
    """Cuts a file to a third of its bytes: its header still reads, its
    scan does not decode."""
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 3])


def image_size(data: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.height, img.width


def image_files(
    files: list[tuple[str, int, int]], repeat: int = 1, validation: bool = False
) -> ImageFiles:
    """fastq.vision's dataset of ``files`` (``repeat`` times over), with
    ImageNet's training pipeline at SIZE (or its validation one)."""
    transform = vf.val_transform(40, 32) if validation else vf.train_transform(SIZE)
    return ImageFiles([(p, label) for p, label, _ in files] * repeat, transform, seed=7)


def encoded_sample(dataset: ImageFiles, i: int) -> dict[str, Any]:
    """Sample ``i`` encoded, with the crop it gets outside workers."""
    was = dataset.encoded
    dataset.decode_on_gpu(True)
    try:
        return dataset[i]  # type: ignore[no-any-return]
    finally:
        dataset.decode_on_gpu(was)


def reference(dataset: ImageFiles, indices: Any) -> torch.Tensor:
    """fastq.vision.decode_on_cpu's images for ``indices``, with the crops
    they get outside workers (a loader without workers gives them too)."""
    out = []
    for i in indices:
        s = encoded_sample(dataset, i)
        image = decode_on_cpu(s["data"], s["box"], s["flip"], dataset.decode_plan)
        out.append(torch.from_numpy(image))
    return torch.stack(out)


def psnr(a: Any, b: Any, std: Any = vf.STD) -> float:
    """In the 0-1 pixel range (normalization undone)."""
    scale = torch.tensor(std)[:, None, None]
    x = torch.as_tensor(a).float() * scale
    y = torch.as_tensor(b).float() * scale
    mse = F.mse_loss(x, y).item()
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


# ------------------------------------------------------------- fake GPU


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)


class FakeDecodeCuda(FakeCuda):
    """fastq.torch._decode_cuda.DecodeCuda on a FakeGpu: tensors on the
    CPU, kernels run at once (their results are what a GPU would give),
    events complete only when the test runs the GPU past them; every
    synchronize() is recorded with its thread, and so is every call of the
    stage's (``calls``: (what, thread name)): the streams made current
    (the stage launches its kernels only inside), uploads, events, the
    hand-over. The current stream is each thread's own, as torch's is."""

    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__(gpu)
        self.consumer = FakeStream("consumer")
        self.streams: list[FakeStream] = []
        self._current = threading.local()
        self.uploads = 0
        self.handed: list[tuple[list[torch.Tensor], FakeEvent]] = []
        self.calls: list[tuple[str, str]] = []

    def _called(self, what: str) -> None:
        self.calls.append((what, threading.current_thread().name))

    @property
    def current(self) -> list[Any]:
        """This thread's streams made current, innermost last."""
        if not hasattr(self._current, "streams"):
            self._current.streams = []
        return self._current.streams  # type: ignore[no-any-return]

    def event(self) -> FakeEvent:
        self._called("event")
        return super().event()  # type: ignore[no-any-return]

    @property
    def tensor_device(self) -> torch.device:
        return torch.device("cpu")

    def decode_stream(self) -> FakeStream:
        self._called("decode_stream")
        stream = FakeStream(f"decode{len(self.streams)}")
        self.streams.append(stream)
        return stream

    def on_stream(self, stream: Any) -> Any:
        cuda = self

        class _On:
            def __enter__(self) -> None:
                cuda._called("on_stream")
                cuda.current.append(stream)

            def __exit__(self, *exc: Any) -> None:
                cuda.current.pop()

        return _On()

    def current_stream(self) -> Any:
        return self.current[-1] if self.current else self.consumer

    def upload(self, host: torch.Tensor) -> torch.Tensor:
        self._called("upload")
        self.uploads += 1
        return host.clone()

    def hand_over(self, tensors: Any, done: FakeEvent) -> None:
        self._called("hand_over")
        self.current_stream().wait_event(done)
        self.handed.append((list(tensors), done))

    def synchronize(self) -> None:
        self.gpu.synchronized_on.append(threading.current_thread().name)
        super().synchronize()


class PilDecoder:
    """A GPU backend stand-in: decodes with Pillow (whole images, or only
    the box with ``crops``), rejects the files whose dataset index is in
    ``reject``, and records each call: the indices it was given and the
    stream that was current."""

    name = "pil-fake"
    takes_other_kinds = False

    def __init__(self, cuda: FakeDecodeCuda, crops: bool = False) -> None:
        self.cuda = cuda
        self.crops = crops
        self.reject: set[int] = set()  # by file size: what the test names
        self.calls: list[tuple[int, Any]] = []  # (files, current stream)
        self.threads: list[str] = []  # the thread of each call
        # Called with the files' sizes in bytes before a call decodes them
        # (a test makes a batch slow to decode here).
        self.before: Any = None
        self.made: list[Any] = []  # weak references to what it returned

    def decode(self, data: Any, boxes: Any, stream: Any) -> list[Any]:
        import weakref

        assert self.cuda.current_stream() is stream, "decoded off the stage's stream"
        self.calls.append((len(data), stream))
        self.threads.append(threading.current_thread().name)
        if self.before is not None:
            self.before([len(d) for d in data])
        out: list[Any] = []
        for d, box in zip(data, boxes):
            if len(d) in self.reject:
                out.append(None)
                continue
            try:
                if self.crops:
                    t = decode_with_pil(d, box)
                else:
                    h, w = image_size(bytes(d))
                    t = decode_with_pil(d, (0, 0, h, w))
            except Exception:
                out.append(None)  # a GPU backend returns None for a bad file
                continue
            self.made.append(weakref.ref(t))
            out.append(t)
        return out


# ----------------------------------------------------- loaders on the fake


# The stage resizes with torch (bilinear, antialiased) and in float; the
# reference with Pillow, rounding to 8 bits: they differ by a little.
MIN_PSNR_DB = 35.0


class OnFakeGpu:
    """What a test on the fake GPU holds: the GPU, the stage's CUDA seam,
    the decoder, and the rings the loaders made."""

    def __init__(self, crops: bool = False) -> None:
        self.gpu = FakeGpu()
        self.cuda = FakeDecodeCuda(self.gpu)
        self.decoder = PilDecoder(self.cuda, crops=crops)
        self.rings: list[Any] = []

    def ring(self, pin: bool = False, device: Any = None) -> Any:
        from fastq.torch._pinned import CudaRing

        ring = CudaRing(
            torch.device("cpu"), False, pin=False, cuda=self.cuda, holds_slots=False
        )
        self.rings.append(ring)
        return ring


def on_fake_gpu(monkeypatch: Any) -> OnFakeGpu:
    """Both faces as on a CUDA machine with a GPU decoder, on a fake GPU."""
    from fastq.torch import _image_decode

    on = OnFakeGpu()
    monkeypatch.setattr(_image_decode, "cuda_available", lambda: True)
    monkeypatch.setattr(_image_decode, "current_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(_image_decode, "make_cuda", lambda device: on.cuda)
    monkeypatch.setattr(_image_decode, "decode_ring", on.ring)
    return on


# The decode tests' fixtures: a test module takes them by importing them.
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, int, int]]:
    return make_files(tmp_path_factory.mktemp("images"))


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> OnFakeGpu:
    return on_fake_gpu(monkeypatch)


def loader_on(dataset: Any, on: OnFakeGpu, **kwargs: Any) -> DataLoader[Any]:
    """A DataLoader (one worker unless told) decoding with the fake GPU's
    decoder."""
    kwargs.setdefault("num_workers", 1)
    return DataLoader(dataset, decode_backend=on.decoder, **kwargs)


def baseline(files: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """The baseline JPEGs among `files`, those the GPU backend takes."""
    return [f for f in files if f[2] == KIND_HW_JPEG]
