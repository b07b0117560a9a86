"""The decode stage's thread, on a fake GPU that records the thread of
every call the stage makes: nothing of the decode runs on the loop's
thread (it only makes its stream wait and takes the batch), a slow file
does not hold the loop back while decoded batches are ready, a Ctrl+C
in next() loses no batch, close() with a decode in progress stops and
joins the thread, and a `break` then a new epoch leaves one thread
taking batches."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("PIL")

from torch_helpers import encoded_images  # noqa: E402
from torch_helpers.encoded_images import (  # noqa: E402
    OnFakeGpu,
    baseline,
    image_files,
    loader_on,
)
from torch_helpers.pinning import wait_until  # noqa: E402

from fastq.errors import ConfigError  # noqa: E402
from fastq.torch import DataLoader, _decode_stage  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]

# The shared fixtures, taken by name.
files = encoded_images.files
fake_gpu = encoded_images.fake_gpu

STAGE_THREAD = "fastq-decode-stage"


def _progressive(files: list[tuple[str, int, int]]) -> tuple[str, int, int]:
    [f] = [f for f in files if "progressive" in f[0]]
    return f


def _stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == STAGE_THREAD]


class SlowFile:
    """Decodes one file (by its size in bytes) with Pillow only once the
    test releases it; the other files at once. Records the thread of every
    Pillow decode; ``on_start`` runs as the slow decode begins."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
        with open(path, "rb") as f:
            self.nbytes = len(f.read())
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.threads: list[str] = []
        self.on_start: Any = None
        decode = _decode_stage.decode_with_pil

        def slow(data: Any, box: Any) -> Any:
            self.threads.append(threading.current_thread().name)
            if len(data) == self.nbytes and not self.started.is_set():
                self.started.set()
                if self.on_start is not None:
                    self.on_start()
                # Bounded: on a loop's own thread nothing would release it.
                self.release.wait(10.0)
                self.finished.set()
            return decode(data, box)

        monkeypatch.setattr(_decode_stage, "decode_with_pil", slow)


def _with_slow_batch(
    files: list[tuple[str, int, int]], batch: int, batch_size: int = 2
) -> list[tuple[str, int, int]]:
    """Baseline files, with the progressive one (decoded with Pillow) as
    the first file of batch ``batch``."""
    base = baseline(files) * 3
    at = batch * batch_size
    return [*base[:at], _progressive(files), *base[at:]]


def _labels(dataset: Any, batch: int, batch_size: int = 2) -> list[int]:
    rows = dataset.samples[batch * batch_size : (batch + 1) * batch_size]
    return [label for _, label in rows]


def test_nothing_of_the_decode_runs_on_the_loops_thread(
    fake_gpu: OnFakeGpu,
    files: list[tuple[str, int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every kind of file: the stream made current for the kernels, the
    uploads, the events, the GPU backend's calls and the Pillow decodes run
    on the stage's thread; the loop's thread only hands each batch over
    (its stream waits for the batch's event)."""
    slow = SlowFile(monkeypatch, _progressive(files)[0])
    slow.release.set()
    dataset = image_files(files, repeat=2)  # 24 files, every kind
    loader = loader_on(dataset, fake_gpu, batch_size=4)
    loop = threading.current_thread().name
    got = [labels.tolist() for _, labels in loader]
    assert len(got) == 6
    calls = fake_gpu.cuda.calls
    assert {thread for what, thread in calls if what == "hand_over"} == {loop}
    decode = {(what, thread) for what, thread in calls if what != "hand_over"}
    assert {what for what, _ in decode} >= {"on_stream", "upload", "event"}
    assert {thread for _, thread in decode} == {STAGE_THREAD}
    assert set(fake_gpu.decoder.threads) == {STAGE_THREAD}
    assert slow.threads and set(slow.threads) == {STAGE_THREAD}
    fake_gpu.gpu.run_all()
    loader.close()
    assert _stage_threads() == []


def test_a_slow_file_does_not_hold_the_loop_back_while_batches_are_ready(
    fake_gpu: OnFakeGpu,
    files: list[tuple[str, int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batch 2 holds a file decoded with Pillow that takes as long as the
    test says: the loop gets batches 0 and 1 while it is still decoding
    (the thread runs ahead of the loop), then batch 2 once it is done."""
    slow = SlowFile(monkeypatch, _progressive(files)[0])
    dataset = image_files(_with_slow_batch(files, 2))
    loader = loader_on(dataset, fake_gpu, batch_size=2)
    it = iter(loader)
    try:
        for k in range(2):
            _, labels = next(it)
            assert labels.tolist() == _labels(dataset, k)
        wait_until(slow.started.is_set)
        # The slow decode is still running: the loop did not wait for it.
        assert not slow.finished.is_set()
        slow.release.set()
        _, labels = next(it)
        assert labels.tolist() == _labels(dataset, 2)
    finally:
        slow.release.set()
        fake_gpu.gpu.run_all()
        del it
        loader.close()
    assert _stage_threads() == []


def test_ctrl_c_in_next_loses_no_batch(
    fake_gpu: OnFakeGpu,
    files: list[tuple[str, int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl+C arrives while the loop waits in next() for batch 0, whose
    file decodes slowly: next() raises KeyboardInterrupt, and the loop
    that goes on gets batch 0, then every other, in order."""
    slow = SlowFile(monkeypatch, _progressive(files)[0])
    loop = threading.main_thread()
    assert threading.current_thread() is loop

    def ctrl_c() -> None:
        # Once the loop waits (it is in next() now), whatever thread this is.
        if threading.current_thread() is not loop:
            threading.Event().wait(0.2)
        signal.pthread_kill(loop.ident, signal.SIGINT)  # type: ignore[arg-type]

    slow.on_start = ctrl_c
    dataset = image_files(_with_slow_batch(files, 0))
    loader = loader_on(dataset, fake_gpu, batch_size=2)
    it = iter(loader)
    try:
        with pytest.raises(KeyboardInterrupt):
            next(it)
        slow.release.set()
        got = []
        for _, labels in it:
            got.append(labels.tolist())
            fake_gpu.gpu.run_all()  # the slots come back to the workers
        want = [_labels(dataset, k) for k in range(len(loader))]
        assert got == want
    finally:
        slow.release.set()
        fake_gpu.gpu.run_all()
        del it
        loader.close()
    assert _stage_threads() == []


def test_close_with_a_decode_in_progress_stops_and_joins_the_thread(
    fake_gpu: OnFakeGpu,
    files: list[tuple[str, int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() while the stage's thread decodes a slow file (the loop holds
    batch 0): it returns once that decode ends, and leaves no thread,
    worker or mapping (the conftest checks the last two)."""
    slow = SlowFile(monkeypatch, _progressive(files)[0])
    dataset = image_files(_with_slow_batch(files, 1))
    loader = loader_on(dataset, fake_gpu, batch_size=2, persistent_workers=True)
    it = iter(loader)
    images, labels = next(it)
    wait_until(slow.started.is_set)  # batch 1 decodes on the stage's thread
    [thread] = _stage_threads()

    timer = threading.Timer(0.2, slow.release.set)
    timer.start()
    try:
        loader.close()
        assert not thread.is_alive()
    finally:
        timer.join()
        slow.release.set()
    assert labels.tolist() == _labels(dataset, 0)
    del images, labels, it
    fake_gpu.gpu.run_all()
    assert _stage_threads() == []


def test_break_then_a_new_epoch(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """A `break` after one batch with persistent workers, then a whole
    epoch: the first epoch's thread is stopped before the second takes a
    batch, one thread decodes at a time, and the second epoch is whole
    and in order."""
    dataset = image_files(baseline(files), repeat=3)  # 24 files
    loader = loader_on(dataset, fake_gpu, batch_size=4, persistent_workers=True)
    for _, labels in loader:
        assert labels.tolist() == [dataset.samples[i][1] for i in range(4)]
        wait_until(lambda: len(_stage_threads()) == 1)
        first = _stage_threads()[0]
        break
    got = []
    for k, (_, labels) in enumerate(loader):
        assert not first.is_alive()
        assert len(_stage_threads()) <= 1
        fake_gpu.gpu.run_all()
        got.append(labels.tolist())
        assert got[-1] == [dataset.samples[i][1] for i in range(4 * k, 4 * k + 4)]
    assert len(got) == len(loader) == 6
    assert set(fake_gpu.decoder.threads) == {STAGE_THREAD}
    fake_gpu.gpu.run_all()
    loader.close()
    assert _stage_threads() == []


def test_decode_lookahead_bounds_the_batches_decoded_ahead(
    fake_gpu: OnFakeGpu, files: list[tuple[str, int, int]]
) -> None:
    """decode_lookahead=1: when the loop has batch k, the thread has decoded
    batch k+1 and no further (it waits for room in its queue)."""
    decoder = fake_gpu.decoder
    dataset = image_files(baseline(files), repeat=3)  # 24 files
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=1,
        decode_backend=decoder,
        decode_lookahead=1,
    )
    batches = len(loader)
    for k, _ in enumerate(loader):
        wait_until(lambda k=k: len(decoder.calls) >= min(k + 2, batches))
        threading.Event().wait(0.05)  # room for a batch too many, if any
        assert len(decoder.calls) == min(k + 2, batches)
        fake_gpu.gpu.run_all()
    loader.close()
    assert _stage_threads() == []
    with pytest.raises(ConfigError, match="decode_lookahead=0"):
        DataLoader(dataset, decode_lookahead=0)
