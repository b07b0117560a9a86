"""Packed slots: a batch of any structure in one slot, for sources whose
batches are not fixed-shape fields (a DataLoader's collate_fn output).

The worker pickles the batch with its array leaves replaced by references:
each leaf's bytes go into the slot's arena (from the slot's start, 64-byte
aligned), and the pickle of everything else (structure, types, strings,
numbers, None) goes at the slot's end. The consumer unpickles that small
record, and each reference becomes an array (or tensor) viewing the slot, so
array bytes are written once and never copied on the consumer's side. A
leaf that already lies in the slot (a collate that stacked straight into the
arena) is referenced where it is, with no copy at all.

Leaf kinds other than numpy arrays (torch tensors) plug in through
``LeafKind``; fastq.torch registers its own.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import SpecError

ALIGN = 64
# Headroom for the pickled record, beyond what the first batch needed.
_MIN_RECORD_BYTES = 64 * 1024


@dataclass(frozen=True)
class PackedSpec:
    """What the consumer needs to size a ring of packed slots: the bytes one
    slot holds. Inferred by a worker from its first batch (scaled to the
    largest batch the sampler plans) or given by the user."""

    slot_bytes: int
    first_arena_bytes: int = 0
    first_record_bytes: int = 0

    @staticmethod
    def sized(arena_bytes: int, record_bytes: int, scale: float) -> PackedSpec:
        record = max(_MIN_RECORD_BYTES, 4 * record_bytes)
        arena = -(-int(arena_bytes * scale) // ALIGN) * ALIGN
        return PackedSpec(arena + record, arena_bytes, record_bytes)

    # Feed's statistics count a packed batch's arena bytes as its rows.
    row_bytes = 1

    def describe(self) -> str:
        return f"packed slots of {self.slot_bytes} bytes"


class LeafKind:
    """How one type of array leaf is laid into a slot and rebuilt from it.

    ``place(obj, arena)`` writes obj's bytes into the arena (unless they
    already lie there) and returns the reference that stands for it in the
    record, ``(tag, offset, ...)``, or None to pickle obj as an ordinary
    object; ``rebuild(reference, slot)`` turns it into the leaf again, a
    view of the slot.
    """

    def __init__(
        self,
        tag: str,
        types: tuple[type, ...],
        place: Callable[[Any, Arena], tuple[Any, ...] | None],
        rebuild: Callable[[tuple[Any, ...], np.ndarray[Any, Any]], Any],
    ) -> None:
        self.tag = tag  # first item of every reference place() returns
        self.types = types
        self.place = place
        self.rebuild = rebuild


class Arena:
    """The slot being packed: a uint8 array over it and a bump cursor."""

    def __init__(self, slot: np.ndarray[Any, Any], count_only: bool = False) -> None:
        self.slot = slot
        self.base = slot.ctypes.data if slot.size else 0
        self.limit = slot.size
        self.used = 0
        self.count_only = count_only
        self.leaves = 0
        # (batch, its record): what pack() writes for that very batch
        # without pickling it, where its maker knows the record already
        # (a batch laid out as the one before: NOTE [ Rows written as
        # fetched ] in fastq/torch/_row_collate.py).
        self.known: tuple[Any, bytes] | None = None

    def alloc(self, nbytes: int, what: str) -> int:
        """The offset of `nbytes` fresh bytes; SpecError if they do not fit."""
        off = -(-self.used // ALIGN) * ALIGN
        if not self.count_only and off + nbytes > self.limit:
            raise SpecError(
                f"array leaf #{self.leaves} of the batch ({what}, {nbytes} bytes) "
                f"does not fit: the slot holds {self.limit} bytes and "
                f"{off} are taken by the leaves before it. Batches were sized "
                "from the first one; pass slot_bytes= with room for the "
                "largest batch (or make batches the same size, e.g. pad "
                "sequences to a fixed length)"
            )
        self.used = off + nbytes
        self.leaves += 1
        return off

    def try_alloc(self, nbytes: int) -> int:
        """Like alloc, but -1 instead of an error when there is no room."""
        off = -(-self.used // ALIGN) * ALIGN
        if self.count_only or off + nbytes > self.limit:
            return -1
        self.used = off + nbytes
        # Not a leaf yet: pack() claims it when it meets the leaf.
        return off

    def owns(self, address: int, nbytes: int) -> int:
        """The offset of [address, address+nbytes) if it lies in this slot
        past the bytes already handed out, else -1."""
        if self.count_only or not self.base:
            return -1
        off = address - self.base
        if off >= 0 and off + nbytes <= self.limit and off % ALIGN == 0:
            return off
        return -1

    def claim(self, off: int, nbytes: int) -> None:
        """Marks a leaf the collate wrote in place as used."""
        self.used = max(self.used, off + nbytes)
        self.leaves += 1


def _place_ndarray(arr: np.ndarray[Any, Any], arena: Arena) -> tuple[Any, ...] | None:
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        return None  # Python objects or records: pickled as they are
    dtype = arr.dtype.newbyteorder("=")
    what = f"shape {arr.shape} dtype {dtype}"
    if arena.count_only:
        arena.alloc(arr.nbytes, what)
        return ("n", 0, arr.shape, dtype.str)
    off = -1
    if arr.flags.c_contiguous and arr.dtype.isnative:
        off = arena.owns(arr.ctypes.data, arr.nbytes)
    if off >= 0:
        arena.claim(off, arr.nbytes)
    else:
        off = arena.alloc(arr.nbytes, what)
        dst = np.ndarray(arr.shape, dtype, buffer=arena.slot, offset=off)
        np.copyto(dst, arr, casting="no" if arr.dtype.isnative else "equiv")
    return ("n", off, arr.shape, dtype.str)


def _rebuild_ndarray(tag: tuple[Any, ...], slot: np.ndarray[Any, Any]) -> Any:
    _, off, shape, dtype = tag
    return np.ndarray(shape, np.dtype(dtype), buffer=slot, offset=off)


NDARRAY = LeafKind("n", (np.ndarray,), _place_ndarray, _rebuild_ndarray)


class _Packer(pickle.Pickler):
    def __init__(self, file: Any, arena: Arena, kinds: dict[type, LeafKind]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.arena = arena
        self.kinds = kinds

    def persistent_id(self, obj: Any) -> Any:
        kind = self.kinds.get(type(obj))
        if kind is None:
            return None
        return kind.place(obj, self.arena)


class Codec:
    """The leaf kinds of one source, indexed both ways."""

    def __init__(self, kinds: list[LeafKind]) -> None:
        self.kinds = kinds
        self.by_type = {t: k for k in kinds for t in k.types}
        self.by_tag = {k.tag: k.rebuild for k in kinds}

    def __reduce__(self) -> Any:
        return (Codec, (self.kinds,))


def pack(
    batch: Any, slot: np.ndarray[Any, Any], codec: Codec, arena: Arena | None = None
) -> tuple[int, int]:
    """Packs batch into slot (a uint8 array): (arena bytes, record bytes).
    The record ends at the slot's end. `arena`: the slot's arena if the
    batch was made into it already (a collate that stacked in place)."""
    if arena is None:
        arena = Arena(slot)
    known = arena.known
    if known is not None and known[0] is batch:
        record: Any = known[1]
    else:
        record = record_of(batch, codec, arena)
    end = slot.size
    if arena.used + len(record) > end:
        raise SpecError(
            f"the batch's arrays take {arena.used} bytes and the rest of it "
            f"(structure, strings, numbers) {len(record)} bytes pickled: "
            f"more than the slot's {end}. Pass slot_bytes= with room for the "
            "largest batch, or return fewer Python objects from collate_fn"
        )
    slot[end - len(record) : end] = np.frombuffer(record, dtype=np.uint8)
    return arena.used, len(record)


def record_of(batch: Any, codec: Codec, arena: Arena) -> Any:
    """The batch's record: its pickle, each array leaf laid into the arena
    (or claimed there) and referenced."""
    buf = io.BytesIO()
    _Packer(buf, arena, codec.by_type).dump(batch)
    return buf.getbuffer()


def measure(batch: Any, codec: Codec) -> tuple[int, int]:
    """(arena bytes, record bytes) the batch would take, without a slot."""
    arena = Arena(np.empty(0, dtype=np.uint8), count_only=True)
    buf = io.BytesIO()
    _Packer(buf, arena, codec.by_type).dump(batch)
    return arena.used, len(buf.getbuffer())


class _Unpacker(pickle.Unpickler):
    def __init__(
        self, file: Any, slot: np.ndarray[Any, Any], rebuild: dict[str, Any]
    ) -> None:
        super().__init__(file)
        self.slot = slot
        self.rebuilders = rebuild

    def persistent_load(self, pid: Any) -> Any:
        return self.rebuilders[pid[0]](pid, self.slot)


def unpack(slot: np.ndarray[Any, Any], record_bytes: int, codec: Codec) -> Any:
    """The batch packed in slot (a uint8 array viewing the lease, which
    every rebuilt leaf keeps alive)."""
    end = slot.size
    record = slot[end - record_bytes : end].tobytes()
    return _Unpacker(io.BytesIO(record), slot, codec.by_tag).load()
