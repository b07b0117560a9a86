"""What DataLoader's round-robin assignment of map-style batches would cost
fastq, whose workers take the next batch when free: an exact event model
(no processes, no noise) of W workers, each holding up to `prefetch`
batches, on a dataset where some batches are slow (a skewed decode: a few
large images, a cold file). The loop takes batches in order and spends
`step` seconds on each. Prints the epoch's time under each policy.

    python benchmarks/round_robin_cost.py
"""

from __future__ import annotations

import heapq
import random


def epoch_time(
    costs: list[float], workers: int, prefetch: int, step: float, round_robin: bool
) -> float:
    """When the loop has consumed every batch, in order."""
    n = len(costs)
    ready = [0.0] * n
    free_at = [0.0] * workers
    # Round-robin: batch i is worker i % W's, queued up to `prefetch` ahead
    # of the loop; next-free: batch i goes to whichever worker frees first,
    # within a window of W * prefetch batches ahead of the loop.
    window = workers * prefetch
    done_at = 0.0  # when the loop finished batch i - window (frees its slot)
    consumed = [0.0] * n
    heap = [(0.0, w) for w in range(workers)]
    t_loop = 0.0
    for i in range(n):
        slot_free = consumed[i - window] if i >= window else 0.0
        if round_robin:
            w = i % workers
            start = max(free_at[w], slot_free)
            free_at[w] = start + costs[i]
            ready[i] = free_at[w]
        else:
            t, w = heapq.heappop(heap)
            start = max(t, slot_free)
            ready[i] = start + costs[i]
            heapq.heappush(heap, (ready[i], w))
        t_loop = max(t_loop, ready[i]) + step
        consumed[i] = t_loop
        done_at = t_loop
    return done_at


def main() -> None:
    rng = random.Random(0)
    batches, workers, prefetch, step = 2000, 8, 2, 0.010
    for slow_share, slow_factor in ((0.0, 1.0), (0.05, 10.0), (0.02, 30.0), (0.2, 4.0)):
        costs = [
            0.060 * (slow_factor if rng.random() < slow_share else 1.0)
            for _ in range(batches)
        ]
        nf = epoch_time(costs, workers, prefetch, step, round_robin=False)
        rr = epoch_time(costs, workers, prefetch, step, round_robin=True)
        print(
            f"{slow_share:4.0%} of batches {slow_factor:4.0f}x slower: next free "
            f"{nf:7.2f} s, round-robin {rr:7.2f} s ({rr / nf:5.2f}x)"
        )


if __name__ == "__main__":
    main()
