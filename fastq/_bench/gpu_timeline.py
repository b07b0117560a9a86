"""The training loop behind `python -m fastq bench --case gpu-model`
(fastq/_bench/gpu_model_case.py): an H200 with a 16-vCPU host, simulated
(fastq/_bench/event_sim.py), so that its figures depend on its inputs
(fastq/_bench/decode_model.py) and never on the machine that computes them.

What is simulated, each a resource that work waits for and holds:

- the GIL, one for the loop's thread and the decode stage's thread: the
  loop's CPU per step and the stage's host work per image hold it (and a
  core) in slices, as two threads trading it do;
- the host's cores: the workers' processes, nvImageCodec's CPU threads,
  Pillow on the stage's thread, and the two Python threads share them;
- the JPEG engines (all together, at the row's rate), the SMs (the step's
  kernels and the stage's), the copy engine (the encoded bytes, and the
  pixels decoded on a CPU);
- a stream per decoder: with one Decoder, nvImageCodec's hardware path
  waits for its previous batch before it submits the next, so the engines
  idle while a batch is submitted; two Decoders in turn each wait only for
  their own.

The loop runs ahead of the GPU by the launch queue (LAUNCH_AHEAD pieces of
steps). A row's images/s is what the GPU finishes over the measured steps;
each resource's busy share over the same span says what bounds it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import decode_model as dm
from .event_sim import Event, Process, Queue, Resource, Simulation

# A step's CPU and GPU work in this many pieces, each piece's kernels
# launched after its share of the loop's CPU.
PIECES = 16
# CUDA's launch queue (1,024 kernels) over ResNet-18's ~200 kernels a step:
# about five steps ahead.
LAUNCH_AHEAD = 5 * PIECES
# Work that holds the GIL is done in slices of at most this much, the GIL
# passing to the other thread between slices if it waits: torch's bindings
# let go of it inside each op's call, so hand-overs are finer than
# CPython's switch interval (5 ms, the worst). Coarser slices favour the
# stage as it is today (fewer hand-overs, docs/performance.md gives how
# much). A thread holding the GIL that waits for a core keeps it, as one
# the kernel has descheduled does.
GIL_SLICE_S = 0.5e-3
# A process's or a thread's CPU work without the GIL, in slices a core is
# held for, as the kernel's scheduler shares cores among runnable threads.
CPU_SLICE_S = 4e-3
# A resource this busy over the measured steps is what bounds the row.
BOUND_SHARE = 0.95
LOOKAHEAD = 2  # decoded batches the stage keeps ready (fastq.torch's)
RING_BATCHES = 2 * dm.WORKERS  # batches the workers may be ahead
CEILING = "ceiling"
CPU_LOADERS = ("DataLoader", "fastq.torch.DataLoader")
GPU_DECODE = "GPU decode"


@dataclass(frozen=True)
class Row:
    """One simulated run: the model's step, who decodes (``loader``: the
    ceiling, a CPU loader, or GPU_DECODE with ``stage``), at ``engine_rate``
    images/s of the JPEG engines."""

    model: str
    loader: str
    stage: dm.Stage | None = None
    engine_rate: float | None = None
    steps: int = 160
    warmup: int = 40

    @property
    def name(self) -> str:
        if self.stage is not None:
            return f"{GPU_DECODE}, {self.stage.name}"
        if self.loader == CEILING:
            return "ceiling: one batch, reused"
        return f"{self.loader} (the workers decode with Pillow)"


@dataclass
class Result:
    row: Row
    images_per_s: float
    of_ceiling: float
    busy: dict[str, float]  # each resource's busy share over the measured steps
    bound_by: str
    engine_idle_ms_per_batch: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Host:
    """The resources of one run, and the work that holds them."""

    def __init__(self, threads: int) -> None:
        self.sim = Simulation()
        self.gil = Resource(self.sim, "GIL")
        self.cores = Resource(self.sim, "cores", dm.H200_CORES)
        self.engines = Resource(self.sim, "JPEG engines")
        self.sms = Resource(self.sim, "SMs")
        self.copy = Resource(self.sim, "copy engine")
        self.cpu_threads = Resource(self.sim, "nvImageCodec threads", threads)
        self.cpu_s: dict[str, float] = {}  # CPU seconds by who did them

    def work(self, who: str, seconds: float, gil: bool) -> Process:
        """``seconds`` of CPU on a core, holding the GIL if ``gil``."""
        piece = GIL_SLICE_S if gil else CPU_SLICE_S
        left = seconds
        while left > 1e-12:
            s = min(piece, left)
            if gil:
                asked = self.sim.now
                yield self.gil.request()
                waited = f"{who} waits for the GIL"
                self.cpu_s[waited] = self.cpu_s.get(waited, 0.0) + self.sim.now - asked
            yield self.cores.request()
            yield self.sim.timeout(s)
            self.cores.release()
            if gil:
                self.gil.release()
            self.cpu_s[who] = self.cpu_s.get(who, 0.0) + s
            left -= s


class Stream:
    """A CUDA stream: its items run in order, each on a resource once the
    one before it is done and the events it was told to wait for have
    happened. ``launch`` returns the item's done event (its value: when)."""

    def __init__(self, host: Host, resource: Resource) -> None:
        self.host = host
        self.resource = resource
        self.tail: Event | None = None

    def launch(self, seconds: float, after: Sequence[Event | None] = ()) -> Event:
        sim = self.host.sim
        done = sim.event()
        waits = [e for e in (self.tail, *after) if e is not None]

        def item() -> Process:
            for e in waits:  # noqa: UP028 (each resumes with a value, sent in)
                yield e
            yield from self.resource.hold(seconds)
            done.succeed(sim.now)

        sim.process(item())
        self.tail = done
        return done


class _Held:
    """The ceiling's source: the same batch, always there."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def get(self) -> Event:
        return self.sim.event().succeed(None)


def _workers(host: Host, ring: Queue, us_per_batch: float) -> None:
    def worker(k: int) -> Process:
        while True:
            yield from host.work("workers", us_per_batch / 1e6, gil=False)
            yield ring.put(k)

    for k in range(dm.WORKERS):
        host.sim.process(worker(k))


def _cpu_loader(host: Host, row: Row) -> Queue:
    """The workers decode; the loop's batch is copied from the pinned ring."""
    ring = Queue(host.sim, RING_BATCHES)
    _workers(host, ring, dm.BATCH * dm.worker_us(row.loader))
    ready = Queue(host.sim, 1)
    copies = Stream(host, host.copy)

    def copier() -> Process:
        while True:
            yield ring.get()
            yield ready.put(
                copies.launch(dm.BATCH * dm.IMAGE_BYTES / dm.COPY_BYTES_PER_S)
            )

    host.sim.process(copier())
    return ready


@dataclass
class Split:
    """Where a batch's images go, on average."""

    pixels: float  # decoded by the workers
    hardware: float  # to the engines
    cpu: float  # to nvImageCodec's CPU threads, or Pillow on the stage thread

    @classmethod
    def of(cls, stage: dm.Stage) -> Split:
        pixels = dm.BATCH * stage.worker_share
        encoded = dm.BATCH - pixels
        other = encoded * dm.OTHER_SHARE
        takes = encoded - other
        hybrid = takes * stage.hybrid_share if stage.backend == "nvimgcodec" else 0.0
        return cls(pixels, takes - hybrid, other + hybrid)


def capacities(row: Row) -> dict[str, float]:
    """Each resource's images/s if it were the only limit, in closed form:
    what no simulated row may pass (the simulation adds the waits between
    them)."""
    batch = dm.BATCH
    loop_s = dm.step_cpu_ms(row.model) / 1e3
    hand_out = dm.HAND_OUT_US_PER_BATCH / 1e6 if row.loader != CEILING else 0.0
    gpu_s = dm.step_gpu_ms(row.model) / 1e3
    gil_s = loop_s * dm.LOOP_GIL_SHARE + hand_out  # a batch's GIL seconds
    cpu_s = loop_s + hand_out  # a batch's CPU seconds, all threads
    worker_s = 0.0
    caps: dict[str, float] = {}
    stage = row.stage
    if stage is None:
        if row.loader in CPU_LOADERS:
            worker_s = batch * dm.worker_us(row.loader) / 1e6
    else:
        split = Split.of(stage)
        host_s = batch * stage.host_us / 1e6
        gil_s += host_s
        cpu_s += host_s + split.hardware * stage.submit_us / 1e6
        cpu_s += split.cpu * dm.CPU_DECODE_US_PER_IMAGE / 1e6
        worker_s = (
            split.pixels * dm.worker_us("fastq.torch.DataLoader")
            + (batch - split.pixels) * dm.ENCODED_US_PER_IMAGE * dm.XEON_OVER_AMD
        ) / 1e6
        gpu_s += batch * dm.POST_US_PER_IMAGE / 1e6
        if split.hardware and row.engine_rate:
            caps["JPEG engines"] = batch * row.engine_rate / split.hardware
    caps["SMs"] = batch / gpu_s
    caps["GIL"] = batch / gil_s
    caps["cores"] = batch * dm.H200_CORES / (cpu_s + worker_s)
    if worker_s:
        caps["workers"] = batch * dm.WORKERS / worker_s
    return caps


def _decode_stage(host: Host, row: Row) -> Queue:
    """Workers send encoded files (and ``worker_share`` decoded); the
    stage's thread decodes each batch and hands the loop its done event."""
    stage = row.stage
    assert stage is not None and row.engine_rate is not None
    rate = row.engine_rate
    split = Split.of(stage)
    per_batch = (
        split.pixels * dm.worker_us("fastq.torch.DataLoader")
        + (dm.BATCH - split.pixels) * dm.ENCODED_US_PER_IMAGE * dm.XEON_OVER_AMD
    )
    ring = Queue(host.sim, RING_BATCHES)
    _workers(host, ring, per_batch)
    ready = Queue(host.sim, LOOKAHEAD)
    sim = host.sim
    copies = Stream(host, host.copy)
    post = Stream(host, host.sms)
    decoders = [Stream(host, host.engines) for _ in range(stage.decoders)]
    last: list[Event | None] = [None] * stage.decoders

    def on_cpu_threads(images: float) -> Process:
        """The call's files for the CPU, over its threads; returns when all
        are decoded (the call returns then)."""
        # A file is one thread's: a batch's few files take as many threads
        # as there are files, each a whole file's time.
        threads = min(stage.cpu_threads, math.ceil(images))
        each = images / threads
        jobs = []
        for _ in range(threads):

            def job() -> Process:
                yield host.cpu_threads.request()
                yield from host.work(
                    "nvImageCodec threads",
                    each * dm.CPU_DECODE_US_PER_IMAGE / 1e6,
                    False,
                )
                host.cpu_threads.release()

            jobs.append(sim.process(job()))
        for j in jobs:  # noqa: UP028 (as above)
            yield j

    def phase(name: str, since: float) -> None:
        key = f"stage: {name}"
        host.cpu_s[key] = host.cpu_s.get(key, 0.0) + sim.now - since

    def submit(decoder: Stream) -> Process:
        """The decode call's own host work, then the batch's bytes copied
        and decoded on the engines; returns the decode's done event."""
        t = sim.now
        yield from host.work("stage", split.hardware * stage.submit_us / 1e6, False)
        phase("submits", t)
        copied = copies.launch(split.hardware * dm.ENCODED_BYTES / dm.COPY_BYTES_PER_S)
        return decoder.launch(split.hardware / rate, [copied])

    def thread() -> Process:
        k = 0
        while True:
            yield ring.get()
            t = sim.now
            yield from host.work("stage", dm.BATCH * stage.host_us / 1e6, gil=True)
            phase("host work", t)
            d = k % stage.decoders
            t = sim.now
            if stage.backend == "nvimgcodec":
                previous = last[d]
                if previous is not None:
                    yield previous  # cudaEventSynchronize, without the GIL
                phase("waits for its previous batch", t)
                hw = yield from submit(decoders[d])
                last[d] = hw
                t = sim.now
                if split.cpu:
                    yield sim.process(on_cpu_threads(split.cpu))
                phase("waits for the CPU threads", t)
            else:  # torchvision: Pillow for the other files, then a blocking call
                pillow_s = split.cpu * dm.CPU_DECODE_US_PER_IMAGE / 1e6
                yield from host.work("stage", pillow_s, gil=False)
                phase("Pillow", t)
                hw = yield from submit(decoders[d])
                t = sim.now
                yield hw
                phase("waits for the engines", t)
            pixels = copies.launch(
                (split.pixels + split.cpu) * dm.IMAGE_BYTES / dm.COPY_BYTES_PER_S
            )
            out = post.launch(dm.BATCH * dm.POST_US_PER_IMAGE / 1e6, [hw, pixels])
            yield ready.put(out)
            k += 1

    sim.process(thread())
    return ready


def simulate(row: Row) -> Result:
    """Runs ``row`` to the end of its measured steps, in simulated time."""
    stage = row.stage
    host = Host(stage.cpu_threads if stage is not None else 1)
    sim = host.sim
    source: Any
    if row.loader == CEILING:
        source = _Held(sim)
    elif row.loader in CPU_LOADERS:
        source = _cpu_loader(host, row)
    elif row.loader == GPU_DECODE:
        source = _decode_stage(host, row)
    else:
        raise ValueError(
            f"loader={row.loader!r}: choose from {(CEILING, *CPU_LOADERS, GPU_DECODE)}"
        )
    compute = Stream(host, host.sms)
    gpu_s = dm.step_gpu_ms(row.model) / 1e3 / PIECES
    cpu_s = dm.step_cpu_ms(row.model) / 1e3 / PIECES
    hand_out = dm.HAND_OUT_US_PER_BATCH / 1e6 if row.loader != CEILING else 0.0
    marks: dict[str, dict[str, float]] = {}
    resources = (host.gil, host.cores, host.engines, host.sms, host.copy)

    def mark(name: str) -> None:
        marks[name] = {r.name: r.held_s() for r in resources}
        marks[name].update({f"cpu {k}": v for k, v in host.cpu_s.items()})
        marks[name]["at"] = sim.now

    def loop() -> Process:
        pending: deque[Event] = deque()
        last: Event | None = None
        for i in range(row.warmup + row.steps):
            batch = yield source.get()
            if i == row.warmup and last is not None:
                # The measured span starts as the GPU ends the last warm-up
                # step; the loop runs on meanwhile.
                last.then(lambda e: mark("start"))
            yield from host.work("loop", hand_out, gil=True)
            for p in range(PIECES):
                yield from host.work("loop", cpu_s * dm.LOOP_GIL_SHARE, gil=True)
                yield from host.work("loop", cpu_s * (1 - dm.LOOP_GIL_SHARE), gil=False)
                while len(pending) >= LAUNCH_AHEAD:
                    yield pending.popleft()
                last = compute.launch(gpu_s, [batch] if p == 0 else ())
                pending.append(last)
        assert last is not None
        yield last
        mark("end")

    sim.run(sim.process(loop()))
    a, b = marks["start"], marks["end"]
    span = b["at"] - a["at"]
    images_per_s = row.steps * dm.BATCH / span
    busy = {
        "GIL": (b["GIL"] - a["GIL"]) / span,
        "cores": (b["cores"] - a["cores"]) / (span * dm.H200_CORES),
        "JPEG engines": (b["JPEG engines"] - a["JPEG engines"]) / span,
        "SMs": (b["SMs"] - a["SMs"]) / span,
        "copy engine": (b["copy engine"] - a["copy engine"]) / span,
        "workers": (b.get("cpu workers", 0) - a.get("cpu workers", 0))
        / (span * dm.WORKERS),
    }
    phases = {
        k.removeprefix("cpu stage: "): (b[k] - a.get(k, 0.0)) / span
        for k in b
        if k.startswith("cpu stage: ")
    }
    gil_wait = "cpu stage waits for the GIL"
    if gil_wait in b:
        phases["waits for the GIL"] = (b[gil_wait] - a.get(gil_wait, 0.0)) / span
        phases["host work"] -= phases["waits for the GIL"]
    busy["stage thread"] = sum(phases.values())
    bound = max(busy, key=lambda k: busy[k])
    if bound == "stage thread" or busy[bound] < BOUND_SHARE:
        busiest = {k: v for k, v in busy.items() if k != "stage thread"}
        top = max(busiest, key=lambda k: busiest[k])
        if busiest[top] >= BOUND_SHARE:
            bound = top
        elif phases:
            bound = "stage thread: " + max(phases, key=lambda k: phases[k])
    idle_ms = (1 - busy["JPEG engines"]) * span / row.steps * 1e3
    return Result(
        row,
        images_per_s,
        images_per_s / dm.ceiling(row.model),
        busy,
        bound,
        idle_ms,
        {
            "loop CPU ms/step": (b["cpu loop"] - a["cpu loop"]) / row.steps * 1e3,
            "stage thread": phases,
        },
    )
