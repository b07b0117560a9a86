"""fastq.torch.StatefulDataLoader: torchdata's StatefulDataLoader's name and
signature over fastq.torch.DataLoader, whose state needs no snapshots."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
import torch.utils.data

from .._faces._arguments import as_int
from ..errors import ConfigError
from ._dataloader import DataLoader
from ._decode_stage import DECODE_LOOKAHEAD
from ._decoders import DEFAULT_BACKEND

__all__ = ["StatefulDataLoader"]

_T_co = TypeVar("_T_co", covariant=True)


class StatefulDataLoader(DataLoader[_T_co]):
    """``torchdata.stateful_dataloader.StatefulDataLoader`` with fastq's
    workers: fastq.torch.DataLoader under that name, taking its extra
    argument, so that a StatefulDataLoader script moves by its import line.

    ``state_dict()`` / ``load_state_dict()`` are fastq.torch.DataLoader's:
    the state is computed from the epoch, the batches delivered and the
    seed, and the states of Stateful samplers and datasets travel with
    each batch, so there is nothing to snapshot, and a state resumes on any
    number of workers. The differences from torchdata's are rows of the
    migration table in ``docs/dataloader.md``. Its parameters are
    fastq.torch.DataLoader's, and:

    Parameters
    ----------
    snapshot_every_n_steps : int or None
        Accepted for torchdata's signature (default 1) and kept as an
        attribute; it changes nothing here: every ``state_dict()`` is
        exact, whatever its value, and costs the same.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset[_T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | None = None,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        slots: int | None = None,
        slot_bytes: int | None = None,
        max_batch_size: int | None = None,
        worker_threads: int | None = 1,
        decode_backend: Any = DEFAULT_BACKEND,
        decode_dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        decode_lookahead: int = DECODE_LOOKAHEAD,
        even_batches: str | None = "drop",
    ) -> None:
        steps = as_int(snapshot_every_n_steps)
        if snapshot_every_n_steps is not None and (steps is None or steps < 0):
            raise ConfigError(
                f"snapshot_every_n_steps={snapshot_every_n_steps!r}: expected "
                "an int >= 0 or None (fastq's state needs no snapshots: any "
                "value resumes exactly)"
            )
        self.snapshot_every_n_steps = snapshot_every_n_steps
        super().__init__(
            dataset,
            batch_size,
            shuffle,
            sampler,
            batch_sampler,
            num_workers,
            collate_fn,
            pin_memory,
            drop_last,
            timeout,
            worker_init_fn,
            multiprocessing_context,
            generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            slots=slots,
            slot_bytes=slot_bytes,
            max_batch_size=max_batch_size,
            worker_threads=worker_threads,
            decode_backend=decode_backend,
            decode_dtype=decode_dtype,
            channels_last=channels_last,
            decode_lookahead=decode_lookahead,
            even_batches=even_batches,
        )
