# cython: language_level=3, embedsignature=True
"""Per-batch seeds for a worker's global generators, compiled: the mixing
and the calls cost next to nothing beside the two Mersenne Twister
initialisations themselves."""

from libc.stdint cimport uint64_t

import random as _random_module

import numpy as np

cdef object _py_inst = _random_module._inst
cdef object _py_seed = type(_py_inst).__mro__[1].seed  # _random.Random.seed
cdef object _np_seed = np.random.seed


cdef inline uint64_t _mix(uint64_t h, uint64_t w) noexcept nogil:
    # splitmix64's finaliser per word: a good 64-bit hash of the words.
    h ^= w
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL
    return h ^ (h >> 31)


def mix_seed(*words):
    """A 64-bit seed from integers (each taken modulo 2**64)."""
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL
    for w in words:
        h = _mix(h, <uint64_t>(w & 0xFFFFFFFFFFFFFFFF))
    return h


def seed_python_and_numpy(uint64_t seed, uint64_t epoch, uint64_t task):
    """Reseeds `random` and `np.random` from (seed, epoch, task), as
    ``random.seed`` and ``np.random.seed`` would with the mixed value."""
    cdef uint64_t h = _mix(_mix(_mix(0x9E3779B97F4A7C15ULL, seed), epoch), task)
    # The C seed of random.Random (what random.seed calls for an int),
    # without the Python-level wrapper; the wrapper's one other effect is
    # dropping the cached Gaussian.
    _py_seed(_py_inst, h)
    _py_inst.gauss_next = None
    _np_seed(<unsigned long>(h & 0xFFFFFFFFULL))
