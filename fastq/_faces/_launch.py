"""How a Prefetcher's engine starts: the ring first and the workers over it
when the spec is known, else the workers first, the first item any of them
makes for the spec, then the ring (NOTE [ The kept first batch ] in
fastq/_faces/_first_batch.py); the feed at the point a state resumes from."""

from __future__ import annotations

from typing import Any, Callable

from .._core._plan import Plan
from .._core._ring import BatchViews, Ring
from .._core._turns import Turns
from .._layout._spec import BatchSpec
from .._loop._autotune import AUTO_START
from .._loop._engine import Engine, PlainBatches, SlotPinning, in_main_thread
from .._make._state import Resume, StreamResume, resume_turn
from .._workers._config import WorkerConfig
from ._arguments import Settings
from ._first_batch import claim_kept, first_plans, receive_map_spec

# Room in every slot for an error report, however small the batch.
MIN_SLOT_BYTES = 64 * 1024


def launch(
    s: Settings,
    resume: Resume | None,
    stream: StreamResume | None,
    *,
    pid: int,
    batches: Callable[[BatchSpec, Engine], PlainBatches],
    pinning: Callable[[], SlotPinning] | None,
) -> tuple[Engine, BatchSpec]:
    """A started engine and its spec; with ``resume``, the workers begin at
    its first batch (the skipped ones are never made), with ``stream``,
    each passes over the items it delivered. ``batches`` makes what the
    face hands out, once the spec is known. Whatever started is stopped if
    the start fails."""
    engine = Engine(pinning)
    try:
        spec = _start(engine, s, resume, stream, pid)
        maker = batches(spec, engine)
        feed = engine.open_feed(
            spec,
            s.sampler,
            maker,
            ordered=s.ordered,
            timeout=s.timeout,
            copy=s.copy,
            sample_stream=bool(s.stream_rows),
            views=_views(s, spec, maker),
            streams=0 if s.is_map else s.streams,
        )
        if stream is not None:
            feed.passes.resume_at(stream)
        if _in_turns(s):
            rows = s.stream_rows
            first = [0] * s.streams if stream is None else stream.items
            feed.turns = Turns(
                feed.ring, feed.consumer, [resume_turn(n, rows) for n in first]
            )
        if s.auto:
            engine.autotune(s.workers)
    except BaseException:
        engine.close()
        raise
    return engine, spec


def _views(s: Settings, spec: BatchSpec, maker: PlainBatches) -> BatchViews | None:
    """How the consumer makes a plain batch in compiled code; None where
    each batch takes the full path (copied out, jagged)."""
    if s.copy or spec.jagged:
        return None
    if type(maker) is PlainBatches:
        return spec.batch_views(None)
    return spec.batch_views(maker.make_batch)


def _start(
    engine: Engine,
    s: Settings,
    resume: Resume | None,
    stream: StreamResume | None,
    pid: int,
) -> BatchSpec:
    def config(w: int, region: Any, size: int) -> WorkerConfig:
        return WorkerConfig(
            worker_id=w,
            num_workers=s.workers,
            source=s.source,
            is_map=s.is_map,
            spec=s.spec,
            sampler=s.sampler,
            seed=s.seed,
            rank=s.rank,
            world_size=s.world_size,
            worker_init=s.worker_init,
            region=region,
            region_size=size,
            consumer_pid=pid,
            threads=s.worker_threads,
            death_signal=in_main_thread(),
            stream_rows=s.stream_rows,
            drop_last=s.drop_last,
            shuffle_buffer=s.shuffle_buffer,
            streams=s.streams,
            lane_ids=s.lanes.ids,
            lane_workers=s.lanes.workers,
            lane_world=s.lanes.world,
            resume_items=None if stream is None else list(stream.items),
            first_pass=0 if stream is None else stream.pass_,
            turns=_in_turns(s),
        )

    if s.spec is not None:
        spec = s.spec
        ring = _build_ring(engine, s, spec)
        assert engine.region is not None
        if resume is not None:
            assert s.sampler is not None
            ring.skip_tasks_to(
                resume.epoch * s.sampler.batches_per_epoch + resume.first
            )
        if s.auto:  # before any worker can take a slot
            ring.set_active(AUTO_START)
        share, size = engine.region.share(), engine.region.size
        engine.start_workers(s.ctx, [config(w, share, size) for w in range(s.workers)])
        return spec
    # No spec=: a map-style source's workers all begin their first batch
    # at once, and the first spec found sizes the ring (NOTE [ The kept
    # first batch ] in fastq/_faces/_first_batch.py); an iterable's worker 0
    # infers it from its first item.
    plans: list[Plan] = []
    if s.is_map:
        assert s.sampler is not None
        # A fill_batch reads one sample apart to lay out its arrays: once
        # per run, by one worker.
        starting = min(s.workers, engine.ring_slots(s.slots))
        if getattr(s.source, "fill_batch", None) is not None:
            starting = 1
        plans = first_plans(s.sampler, resume, starting)
    configs = [config(w, None, 0) for w in range(s.workers)]
    for cfg, plan in zip(configs, plans):
        cfg.first_plan = plan
    pool = engine.start_workers(s.ctx, configs)
    if plans:
        spec = receive_map_spec(pool, plans, s.timeout)
    else:
        spec = pool.receive_spec(s.timeout, "sample" if s.stream_rows else "batch")
    ring = _build_ring(engine, s, spec)
    assert engine.region is not None
    kept = [(w, plan.task) for w, plan in enumerate(plans)]
    claim_kept(ring, kept)
    if s.auto:  # before any worker can take a slot
        ring.set_active(AUTO_START)
    pool.send_region(
        engine.region, engine.region.size, spec, ring, kept=[t for _, t in kept]
    )
    return spec


def _in_turns(s: Settings) -> bool:
    """An ordered stream's batches come from its lanes in turn (NOTE [ A
    stream's lanes ] in fastq/_workers/_lanes.py): the order is then the
    same on any number of worker processes, and a state resumes it."""
    return not s.is_map and s.ordered and s.streams > 1


def _build_ring(engine: Engine, s: Settings, spec: BatchSpec) -> Ring:
    slot_bytes = max(spec.slot_bytes, MIN_SLOT_BYTES)
    # A count per process and per lane (a stream's items count by lane).
    counts = s.workers if s.is_map else max(s.workers, s.streams)
    return engine.build_ring(engine.ring_slots(s.slots), counts, slot_bytes)
