"""The per-batch reseed of a worker's global generators (``random`` and
``np.random``), compiled, next to the same reseed written in Python and to
its floor, the two Mersenne Twister seedings alone. All three leave the
generators in the same state.

    pytest benchmarks/test_reseed.py --benchmark-only
"""

from __future__ import annotations

import _random
import random
from collections.abc import Callable

import numpy as np
import pytest

from fastq._make._seeding import mix_seed, seed_python_and_numpy

_MASK64 = (1 << 64) - 1


def python_mix(*words: int) -> int:
    h = 0x9E3779B97F4A7C15
    for w in words:
        h = (h ^ (w & _MASK64)) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h


def in_python(seed: int, epoch: int, task: int) -> None:
    h = python_mix(seed, epoch, task)
    random.seed(h)
    np.random.seed(h & 0xFFFFFFFF)


def twister_seedings_only(seed: int, epoch: int, task: int) -> None:
    _random.Random.seed(random._inst, 0x1234567890ABCDEF)  # type: ignore[attr-defined]
    np.random.mtrand._rand._bit_generator._legacy_seeding(0x12345678)


CASES: dict[str, Callable[[int, int, int], None]] = {
    "compiled (fastq)": seed_python_and_numpy,
    "python": in_python,
    "floor: the two seedings": twister_seedings_only,
}


def test_every_path_gives_the_same_state() -> None:
    assert mix_seed(7, 3, 11) == python_mix(7, 3, 11)
    seed_python_and_numpy(7, 3, 11)
    a = (random.random(), random.gauss(0, 1), np.random.rand())
    in_python(7, 3, 11)
    assert (random.random(), random.gauss(0, 1), np.random.rand()) == a


@pytest.mark.parametrize("path", list(CASES))
def test_reseed(benchmark: pytest.FixtureRequest, path: str) -> None:
    fn = CASES[path]
    task = iter(range(1 << 62))
    benchmark(lambda: fn(12345, 3, next(task)))  # type: ignore[operator]


def test_torch_reseed(benchmark: pytest.FixtureRequest) -> None:
    """What fastq.torch.DataLoader adds per batch in a worker: torch's CPU
    generator seeded from (seed, epoch, batch), beside random's and numpy's."""
    torch = pytest.importorskip("torch")
    gen = torch.default_generator
    task = iter(range(1 << 62))

    def reseed_all() -> None:
        t = next(task)
        seed_python_and_numpy(12345, 3, t)
        gen.manual_seed(mix_seed(12345, 3, t))

    benchmark(reseed_all)  # type: ignore[operator]
