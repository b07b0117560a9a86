"""Worker process entry point (spawn-safe): set up
(fastq/_workers/_worker_setup.py), attach to the ring, then run the loop for
its kind of source (fastq/_workers/_worker_loops.py) until closed. Its
configuration: fastq/_workers/_config.py."""

from __future__ import annotations

import os
from typing import Any

from .._core._plan import PlanTable
from .._core._ring import Ring
from .._core._shm import Region
from .._make._worker_info import WorkerInfo
from ._config import WorkerConfig
from ._stream_loops import BatchStream, PackedStream, SampleStream
from ._worker_loops import First, MapBatches, PlannedBatches, Producer
from ._worker_setup import await_ring, set_up

__all__ = ["worker_main"]


def worker_main(cfg: WorkerConfig) -> None:
    """Runs in the worker process (or thread); returns when the ring
    closes."""
    info, init_error = set_up(cfg)
    first: First = None
    if cfg.region is None:
        first = await_ring(cfg, info, init_error)
        if first is None:
            return
    assert cfg.region is not None
    region = Region.attach(cfg.region, cfg.region_size)
    ring = Ring.attach(region.mapping)
    ring.set_worker_pid(cfg.worker_id, os.getpid())
    producer = producer_for(ring, region.mapping, cfg, info)
    if init_error is not None:
        producer.report_and_stop(init_error)
        return
    producer.run(first)


def producer_for(
    ring: Ring, mapping: Any, cfg: WorkerConfig, info: WorkerInfo
) -> Producer:
    """The loop for the worker's kind of source."""
    if cfg.plan is not None:
        return PlannedBatches(ring, cfg, info, PlanTable(ring, mapping, cfg.plan))
    kind: type[Producer]
    if cfg.is_map:
        kind = MapBatches
    elif cfg.packed:
        kind = PackedStream
    elif cfg.stream_rows:
        kind = SampleStream
    else:
        kind = BatchStream
    return kind(ring, cfg, info)
