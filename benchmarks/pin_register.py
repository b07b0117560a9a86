"""What page-locking a ring costs, and how long a first copy from its first
slot waits behind it: the whole ring registered in one cudaHostRegister
call (as fastq did) against slot by slot, first slot first, as the pinned
ring does now (NOTE [ Page-locking the ring slot by slot ] in
fastq/torch/_pinned.py).

On a GPU: seconds per GiB of cudaHostRegister, whole and in pieces; the
time to the first piece; and, with registration running on a thread, how
long a non_blocking copy of the first slot (issued once that slot is
page-locked, or at once for the whole ring) takes to complete. Without a
GPU: mlock() per GiB, the host side of page-locking alone (pinning the
pages; CUDA also maps them for the device, which needs a GPU to time).

    python benchmarks/pin_register.py [--gib 1] [--slot-mb 19.3]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fastq.torch._pinned import register_pieces


def shared_region(nbytes: int) -> mmap.mmap:
    """A shared mapping like the ring's, every page touched."""
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED)
    np.frombuffer(region, dtype=np.uint8)[:: mmap.PAGESIZE] = 1
    return region


def slot_ranges(nbytes: int, slot_bytes: int) -> list[tuple[int, int]]:
    header = mmap.PAGESIZE
    count = (nbytes - header) // slot_bytes
    return [(header + k * slot_bytes, slot_bytes) for k in range(count)]


def mlock_s_per_gib(region: mmap.mmap) -> float:
    libc = ctypes.CDLL(None, use_errno=True)
    host = np.frombuffer(region, dtype=np.uint8)
    address, nbytes = ctypes.c_void_p(host.ctypes.data), ctypes.c_size_t(host.nbytes)
    t0 = time.perf_counter()
    if libc.mlock(address, nbytes) != 0:
        raise OSError(ctypes.get_errno(), "mlock (RLIMIT_MEMLOCK?)")
    took = time.perf_counter() - t0
    libc.munlock(address, nbytes)
    return took / (host.nbytes / 2**30)


def cuda_figures(region: mmap.mmap, slots: Sequence[tuple[int, int]]) -> str:
    import torch

    cudart = torch.cuda.cudart()
    host = np.frombuffer(region, dtype=np.uint8)
    base, total = host.ctypes.data, host.nbytes
    gib = total / 2**30
    torch.zeros(1, device="cuda")  # the context, outside the timings
    lines = []
    for label, pieces in (
        ("whole", [(0, total)]),
        ("slot by slot", register_pieces(total, slots)),
    ):
        t0 = time.perf_counter()
        first = None
        for offset, nbytes in pieces:
            assert cudart.cudaHostRegister(base + offset, nbytes, 1) == 0
            first = first or time.perf_counter() - t0
        took = time.perf_counter() - t0
        for offset, _ in pieces:
            cudart.cudaHostUnregister(base + offset)
        lines.append(
            f"cudaHostRegister {label}: {len(pieces)} call(s), {took / gib:.3f} "
            f"s/GiB, first piece after {first * 1e3:.1f} ms"
        )
        lines.append(
            f"first copy of slot 0, {label}: {first_copy_s(host, pieces, slots):.3f} s"
        )
    return "\n".join(lines)


def first_copy_s(
    host: np.ndarray,
    pieces: Sequence[tuple[int, int]],
    slots: Sequence[tuple[int, int]],
) -> float:
    """Registration on a thread; from its start to the completion of a
    non_blocking copy of slot 0 issued as soon as slot 0 is registered."""
    import torch

    cudart = torch.cuda.cudart()
    base = host.ctypes.data
    offset, nbytes = slots[0]
    first_done = threading.Event()

    def register() -> None:
        for k, (at, size) in enumerate(pieces):
            cudart.cudaHostRegister(base + at, size, 1)
            if k == 0:
                first_done.set()

    t0 = time.perf_counter()
    thread = threading.Thread(target=register)
    thread.start()
    first_done.wait()
    slot0 = torch.from_numpy(host[offset : offset + nbytes])
    slot0.to("cuda", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    took = time.perf_counter() - t0
    thread.join()
    for at, _ in pieces:
        cudart.cudaHostUnregister(base + at)
    return took


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="the region's size")
    p.add_argument(
        "--slot-mb",
        type=float,
        default=128 * 3 * 224 * 224 / 1e6,
        help="a slot's size (default: a batch of 128 224-pixel uint8 images)",
    )
    args = p.parse_args(argv)
    nbytes = int(args.gib * 2**30)
    region = shared_region(nbytes)
    slots = slot_ranges(nbytes, int(args.slot_mb * 1e6))
    print(f"region {args.gib:g} GiB, {len(slots)} slots of {args.slot_mb:g} MB")
    try:
        print(f"mlock (host side only): {mlock_s_per_gib(region):.3f} s/GiB")
    except OSError as exc:
        print(f"mlock: {exc}")
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        print(cuda_figures(region, slots))
    else:
        print("no CUDA device: cudaHostRegister and the first copy need a GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
