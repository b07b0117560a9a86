"""Plans of planned sources: the sample indices of each task, written by
the consumer (which runs the sampler, as DataLoader's main process does) into
a table in the region and read by the worker that claims the task.

The table has ``entries`` entries; task t uses entry ``t % entries``. The
consumer plans task t only once task ``t - entries`` is done with, and
raises the ring's ``planned`` count after writing, so a worker waits for
nothing but a plan not yet written. An abandoned epoch's task still in
flight may find its entry reused; the entry's task word is a seqlock (see
src_c/fq_ring.h), so such a worker sees that and skips the task.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._ring import Ring

# task, epoch, batch in epoch, count, kind, payload bytes
_HEADER = 6
_ENTRY_ALIGN = 64
_INTS = 0  # payload: `count` int64 indices
_PICKLED = 1  # payload: a pickled list of `count` indices of any type
# Room for indices that are not ints (keys, tuples), however small the batch.
_MIN_PAYLOAD = 16 * 1024


@dataclass(frozen=True)
class PlanLayout:
    """Where the plan table lies in the region and how big it is."""

    offset: int
    entries: int
    payload_bytes: int

    @staticmethod
    def for_batches(offset: int, entries: int, max_rows: int) -> PlanLayout:
        payload = max(8 * max_rows, _MIN_PAYLOAD)
        return PlanLayout(offset, entries, -(-payload // 8) * 8)

    @property
    def entry_bytes(self) -> int:
        raw = 8 * _HEADER + self.payload_bytes
        return -(-raw // _ENTRY_ALIGN) * _ENTRY_ALIGN

    @property
    def nbytes(self) -> int:
        return self.entries * self.entry_bytes


@dataclass(frozen=True)
class Plan:
    """One task's plan: which batch of which epoch, and its indices."""

    task: int
    epoch: int
    batch: int
    indices: Sequence[Any]


class PlanTable:
    """The consumer's writer and the worker's reader of the table."""

    def __init__(self, ring: Ring, mapping: Any, layout: PlanLayout) -> None:
        self.ring = ring
        self.layout = layout
        area = np.frombuffer(
            mapping, dtype=np.uint8, count=layout.nbytes, offset=layout.offset
        )
        step = layout.entry_bytes
        # Per entry: its header words and its payload, viewed once.
        self._headers = [
            area[e * step : e * step + 8 * _HEADER].view(np.int64)
            for e in range(layout.entries)
        ]
        self._payloads = [
            area[e * step + 8 * _HEADER : (e + 1) * step] for e in range(layout.entries)
        ]

    def _offset(self, task: int) -> int:
        return (
            self.layout.offset + (task % self.layout.entries) * self.layout.entry_bytes
        )

    # ------------------------------------------------------------ consumer

    def write(self, task: int, epoch: int, batch: int, indices: Any) -> None:
        """Writes task's plan; the caller raises ``ring.planned`` after."""
        e = task % self.layout.entries
        payload = self._payloads[e]
        header = self._headers[e]
        ints = _as_int_indices(indices)
        offset = self._offset(task)
        if ints is not None and 8 * len(ints) <= len(payload):
            count, kind, nbytes = len(ints), _INTS, 8 * len(ints)
            self.ring.plan_begin_write(offset)
            payload[:nbytes].view(np.int64)[:] = ints
        else:
            items = list(indices)
            data = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            if len(data) > len(payload):
                raise ConfigError(
                    f"the sampler's batch {batch} of epoch {epoch} has "
                    f"{len(items)} indices taking {len(data)} bytes, more than "
                    f"the {len(payload)} a plan entry holds; pass a larger "
                    "max_batch_size= (it sizes the entries), or yield int indices"
                )
            count, kind, nbytes = len(items), _PICKLED, len(data)
            self.ring.plan_begin_write(offset)
            payload[:nbytes] = np.frombuffer(data, dtype=np.uint8)
        header[1:] = (epoch, batch, count, kind, nbytes)
        self.ring.plan_end_write(offset, task)

    # -------------------------------------------------------------- worker

    def read(self, task: int) -> Plan | None:
        """Task's plan once it is planned; None if the ring closed, or if
        the entry was reused (an abandoned epoch's task: skip it)."""
        ring = self.ring
        if ring.planned <= task and not ring.wait_planned(task):
            return None
        offset = self._offset(task)
        if ring.plan_task(offset) != task:
            return None
        e = task % self.layout.entries
        _, epoch, batch, count, kind, nbytes = (int(x) for x in self._headers[e])
        raw = self._payloads[e][:nbytes]
        if kind == _INTS:
            indices: Any = raw.view(np.int64).tolist()
        else:
            indices = raw.tobytes()
        if ring.plan_recheck(offset) != task:
            return None
        if kind != _INTS:
            indices = pickle.loads(indices)
        assert len(indices) == count
        return Plan(task, epoch, batch, indices)


def _as_int_indices(indices: Any) -> np.ndarray[Any, Any] | None:
    """The indices as int64, or None if they are not all ints."""
    if isinstance(indices, np.ndarray):
        arr = indices
    else:
        try:
            arr = np.asarray(indices)
        except (TypeError, ValueError):
            return None
    if arr.ndim != 1 or (
        arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f")
    ):
        return None
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        return None
    return arr.astype(np.int64, copy=False)


__all__ = ["Plan", "PlanLayout", "PlanTable"]
