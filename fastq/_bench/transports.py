"""The transports compared, by key: what each one is, which package it
needs, and how to open it on a case. Each opener is a context manager that
starts the producers and yields a Feed; leaving it tears everything down."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Callable

from .workloads import WORKLOADS, ProducerConfig, Workload


@dataclass(frozen=True)
class Case:
    """One measurement: a transport moving one workload's batches."""

    transport: str
    workload: str
    workers: int = 1
    slots: int = 2  # batches in flight ahead of the consumer
    pace_s: float = 0.0  # producer's minimum interval between batches
    start_method: str | None = None  # None: the transport's own default

    @property
    def shape(self) -> Workload:
        return WORKLOADS[self.workload]

    def producer(self, holds: int = 0) -> ProducerConfig:
        """Producer settings for a transport that keeps references to up to
        `holds` handed-over batches per producer after the hand-over returns
        (mp.Queue's feeder thread and DataLoader's worker pickle later).
        Those producers rotate through holds + 2 buffers, so that no batch
        is overwritten before it is sent; a transport that copies the batch
        before the hand-over returns (fastq, faster-fifo, memcpy) reuses one.
        The work per batch is the same either way."""
        return ProducerConfig(
            self.shape, pool=holds + 2 if holds else 1, pace_s=self.pace_s
        )


@dataclass
class Feed:
    """A started transport: an endless iterator of batches in this process."""

    batches: Iterator[Any]
    stats: Callable[[], dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)


Opener = Callable[[Case], AbstractContextManager[Feed]]


@dataclass(frozen=True)
class Transport:
    key: str
    label: str
    role: str  # "limit" (memcpy), "fastq", or "peer"
    target: str  # "module:function" in this package, imported on use
    requires: str | None = None
    pip: str | None = None
    about: str = ""

    def missing(self) -> str | None:
        """Why this transport cannot run here, or None."""
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return (
                f"{self.label}: skipped, {self.requires} is not installed "
                f"(pip install {self.pip or self.requires})"
            )
        return None

    def resolve(self) -> Opener:
        """The opener, its module (and the package it wraps) imported."""
        module, func = self.target.split(":")
        opener: Opener = getattr(
            importlib.import_module(f"{__package__}.{module}"), func
        )
        return opener

    def open(self, case: Case) -> AbstractContextManager[Feed]:
        return self.resolve()(case)


TRANSPORTS = {
    t.key: t
    for t in (
        Transport(
            "memcpy-hot",
            "memcpy, 1 buffer (hot)",
            "limit",
            "via_memcpy:hot",
            about="one process copies each batch into one destination: "
            "it stays in cache, an upper bound, not a fair limit",
        ),
        Transport(
            "memcpy",
            "memcpy (1 process)",
            "limit",
            "via_memcpy:ring",
            about="one process copies each batch into as many "
            "destinations as the ring has slots: the physical limit",
        ),
        Transport(
            "fastq",
            "fastq, whole batches",
            "fastq",
            "via_fastq:batches",
            about="callable source: each yielded batch is copied into a slot",
        ),
        Transport(
            "fastq-samples",
            "fastq, per-sample",
            "fastq",
            "via_fastq:samples",
            about="map-style source: each sample written into its row",
        ),
        Transport(
            "fastq-stream",
            "fastq, sample stream",
            "fastq",
            "via_fastq:sample_stream",
            about="stream source with batch_size (an IterableDataset): "
            "each yielded sample written into its row",
        ),
        Transport(
            "fastq-threads",
            "fastq, per-sample, threads",
            "fastq",
            "via_fastq:samples_in_threads",
            about="as per-sample, with worker_method='thread': no process, "
            "no pickling; pays where producers release the GIL",
        ),
        Transport(
            "fastq-auto",
            "fastq, per-sample, auto",
            "fastq",
            "via_fastq:samples_auto",
            about="as per-sample, with workers='auto': fastq picks how many "
            "run (compute-bound cases only, measured once it has settled)",
        ),
        Transport(
            "fastq-fill",
            "fastq, zero-copy fill",
            "fastq",
            "via_fastq:fill",
            about="map-style source with fill_batch(indices, out): the "
            "producer writes straight into the slot",
        ),
        Transport(
            "fastq-dataloader",
            "fastq.torch.DataLoader",
            "fastq",
            "via_fastq_torch:samples",
            requires="torch",
            pip="torch==2.13.0",
            about="DataLoader's arguments (batch_size=rows, default collate); "
            "the one-line migration",
        ),
        Transport(
            "queue-seed",
            "mp.Queue, seed (poll+sleep)",
            "peer",
            "via_queue:seed",
            about="Keras' GeneratorEnqueuer with get_batch's consumer: "
            "poll empty(), sleep 10 ms",
        ),
        Transport(
            "queue",
            "mp.Queue, blocking get",
            "peer",
            "via_queue:blocking",
            about="the strongest form: consumer blocks in get()",
        ),
        Transport(
            "dataloader",
            "DataLoader, per-sample",
            "peer",
            "via_torch:samples",
            requires="torch",
            pip="torch==2.13.0",
            about="batch_size=rows, default collate",
        ),
        Transport(
            "dataloader-batches",
            "DataLoader, batch_size=None",
            "peer",
            "via_torch:batches",
            requires="torch",
            pip="torch==2.13.0",
            about="dataset items are whole batches",
        ),
        Transport(
            "faster-fifo",
            "faster-fifo",
            "peer",
            "via_fifo:queue",
            requires="faster_fifo",
            pip="faster-fifo",
            about="shared-memory circular buffer of pickled messages",
        ),
        Transport(
            "spdl-threads",
            "SPDL pipeline, threads",
            "peer",
            "via_spdl:threads",
            requires="spdl",
            pip="spdl==0.8.0",
            about="PipelineBuilder: source of batch numbers, a pipe stage "
            "making each batch, a sink; the consumer gets the producer's own "
            "buffer (nothing is copied)",
        ),
        Transport(
            "spdl-shm",
            "SPDL SharedMemorySegmentPool",
            "peer",
            "via_spdl:segment_pool",
            requires="spdl",
            pip="spdl==0.8.0",
            about="iterate_in_subprocess with a SharedMemorySegmentPool arena: "
            "each batch copied into a preallocated shared segment, read in place",
        ),
        Transport(
            "torchdata-threads",
            "torchdata nodes, threads",
            "peer",
            "via_torchdata:threads",
            requires="torchdata",
            pip="torchdata==0.11.0 torch==2.13.0",
            about="nodes.ParallelMapper(method='thread') over batch numbers; the "
            "consumer gets the producer's own buffer (nothing is copied)",
        ),
        Transport(
            "torchdata-processes",
            "torchdata nodes, processes",
            "peer",
            "via_torchdata:processes",
            requires="torchdata",
            pip="torchdata==0.11.0 torch==2.13.0",
            about="nodes.ParallelMapper(method='process') over batch numbers: "
            "each batch pickled through a multiprocessing queue",
        ),
    )
}
# Chooses its own number of workers: measured in the compute-bound
# sections alone, next to the hand-picked counts.
AUTO = "fastq-auto"
DEFAULT_TRANSPORTS = tuple(TRANSPORTS)
FASTQ = tuple(k for k, t in TRANSPORTS.items() if t.role == "fastq")
PEERS = tuple(k for k, t in TRANSPORTS.items() if t.role == "peer")


def ring_slots(slots: int) -> int:
    """Slots in a fastq ring asked for `slots` prefetched batches: one more,
    for the batch the consumer's loop body holds."""
    return slots + 1


def first_leaf(batch: Any) -> Any:
    """The first field of a batch, as something with the buffer protocol."""
    while isinstance(batch, (tuple, list)):
        batch = batch[0]
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if hasattr(batch, "numpy") and not hasattr(batch, "__array_interface__"):
        batch = batch.numpy()  # a torch tensor: a view, no copy
    return batch
