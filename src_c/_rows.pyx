# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
"""The producer's copies into a slot, in C.

A map-style source or a sample stream makes a batch one sample at a time,
so the per-sample cost of the loader is paid hundreds of times per batch.
Here each leaf that already matches the spec (a C-contiguous array of the
field's shape and an equivalent dtype, or a scalar of the field's own
native type) costs one memcpy; anything else goes through the spec's
checked Python path, which converts it or raises the SpecError that names
the field. Whole batches (a batch stream) get the same treatment per field.
What a sample's leaves are checked against (each field's dtype, row shape,
scalar type) is resolved once per spec, and where each field's rows lie
once per batch, so a sample costs its call, its checks and its copies.
"""

cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_FromLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcmp, memcpy, memset

import numpy as np

from ..errors import SpecError

cdef extern from "Python.h":
    object PyObject_CallOneArg(object func, object arg)

cdef extern from "fq_stream.h" nogil:
    void fq_stream_copy(void *dst, const void *src, size_t n)

cnp.import_array()

# Copies this large let go of the GIL: any other thread of the worker (a
# user's reader thread, the consumer watch) runs while the bytes move.
DEF NOGIL_BYTES = 1 << 20
# A sample's arrays are written with non-temporal stores (fq_stream.h) when
# the batch is larger than a last-level cache's share, and the array is
# large enough that the fence after it costs nothing.
STREAM_BATCH_BYTES = 8 << 20
DEF STREAM_ROW_BYTES = 4096

cdef enum ScalarKind:
    NOT_SCALAR = 0
    NUMPY_SCALAR = 1  # the field's own numpy scalar type, native byte order
    INT64 = 2  # also takes a Python int that fits
    FLOAT64 = 3  # also takes a Python float


cdef inline void _move(char *dst, const char *src, size_t n, bint stream) noexcept nogil:
    if stream:
        fq_stream_copy(dst, src, n)
    else:
        memcpy(dst, src, n)


cdef inline void _copy(char *dst, const char *src, size_t n,
                       bint stream=False) noexcept:
    """memcpy, or non-temporal stores with `stream` (fq_stream.h)."""
    if n >= NOGIL_BYTES:
        with nogil:
            _move(dst, src, n, stream)
    else:
        _move(dst, src, n, stream)


cdef class RowWriter:
    """Writes samples into the rows of a slot's field arrays for one spec.

    `row` is the row being produced, set before user code runs for it, so
    that an error can name its sample.
    """

    cdef public Py_ssize_t row
    cdef object spec
    cdef Py_ssize_t nfields
    cdef bint single  # the spec is one bare array, not a structure
    cdef bint flat  # a flat tuple of leaves needs no flattening
    cdef readonly bint stream  # large batches: rows in non-temporal stores
    cdef list dtypes  # owns what descr points to
    cdef list scalar_types  # owns what scalar_type points to
    cdef int *ndim
    cdef cnp.npy_intp **dims
    cdef size_t *row_bytes
    cdef ScalarKind *scalar
    cdef bint *jagged  # a variable-length field (values plus offsets)
    cdef int64_t *max_len  # a jagged field's bound per sample
    cdef PyObject **descr  # the field's dtype: an identical descr matches at once
    cdef PyTypeObject **scalar_type  # the field's own numpy scalar type
    # Where a scalar of that type keeps its value inside the object (numpy's
    # `obval`), found and checked once; -1: ask numpy each time.
    cdef Py_ssize_t *value_at
    # Each fixed field's row 0 and row stride in the arrays of the current
    # call, resolved once per batch (the arrays live in the caller's list).
    cdef char **dst
    cdef Py_ssize_t *stride
    # write_exact's record of where each sample's array leaves lay, field
    # by field (0: not an array), for the call's `seen_rows` samples.
    cdef uintptr_t *seen
    cdef Py_ssize_t seen_rows

    def __cinit__(self):
        self.seen = NULL
        self.ndim = NULL
        self.dims = NULL
        self.row_bytes = NULL
        self.scalar = NULL
        self.jagged = NULL
        self.max_len = NULL
        self.descr = NULL
        self.scalar_type = NULL
        self.value_at = NULL
        self.dst = NULL
        self.stride = NULL

    def __init__(self, spec):
        cdef Py_ssize_t i, k
        fields = spec.fields
        self.spec = spec
        self.row = 0
        self.nfields = len(fields)
        self.single = spec.structure is None
        self.flat = bool(spec.flat)
        self.stream = spec.slot_bytes >= STREAM_BATCH_BYTES
        self.dtypes = [f.dtype for f in fields]
        self.scalar_types = [f.dtype.type for f in fields]
        n = max(1, self.nfields)
        self.ndim = <int *>PyMem_Malloc(n * sizeof(int))
        self.dims = <cnp.npy_intp **>PyMem_Malloc(n * sizeof(cnp.npy_intp *))
        self.row_bytes = <size_t *>PyMem_Malloc(n * sizeof(size_t))
        self.scalar = <ScalarKind *>PyMem_Malloc(n * sizeof(ScalarKind))
        self.jagged = <bint *>PyMem_Malloc(n * sizeof(bint))
        self.max_len = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
        self.descr = <PyObject **>PyMem_Malloc(n * sizeof(PyObject *))
        self.scalar_type = <PyTypeObject **>PyMem_Malloc(n * sizeof(PyTypeObject *))
        self.value_at = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
        self.dst = <char **>PyMem_Malloc(n * sizeof(char *))
        self.stride = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
        if not (self.ndim and self.dims and self.row_bytes and self.scalar
                and self.jagged and self.max_len and self.descr
                and self.scalar_type and self.value_at and self.dst
                and self.stride):
            raise MemoryError()
        for i in range(self.nfields):
            self.dims[i] = NULL
            self.dst[i] = NULL
            self.stride[i] = 0
        for i, f in enumerate(fields):
            self.ndim[i] = len(f.shape)
            self.row_bytes[i] = f.row_bytes
            self.dims[i] = <cnp.npy_intp *>PyMem_Malloc(
                max(1, len(f.shape)) * sizeof(cnp.npy_intp))
            if not self.dims[i]:
                raise MemoryError()
            for k, d in enumerate(f.shape):
                self.dims[i][k] = d
            self.jagged[i] = f.jagged is not None
            self.max_len[i] = f.jagged.max_len if self.jagged[i] else 0
            self.scalar[i] = NOT_SCALAR if self.jagged[i] else _scalar_kind(f.shape, f.dtype)
            self.descr[i] = <PyObject *>self.dtypes[i]
            self.scalar_type[i] = <PyTypeObject *>self.scalar_types[i]
            self.value_at[i] = -1
            if self.scalar[i] != NOT_SCALAR:
                self.value_at[i] = _value_offset(f.dtype)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.dims != NULL:
            for i in range(self.nfields):
                PyMem_Free(self.dims[i])
        PyMem_Free(self.dims)
        PyMem_Free(self.ndim)
        PyMem_Free(self.row_bytes)
        PyMem_Free(self.scalar)
        PyMem_Free(self.jagged)
        PyMem_Free(self.max_len)
        PyMem_Free(self.descr)
        PyMem_Free(self.scalar_type)
        PyMem_Free(self.value_at)
        PyMem_Free(self.dst)
        PyMem_Free(self.stride)

    def write_samples(self, get, list keys, list views):
        """Row j of each field array in `views` = leaf of get(keys[j])."""
        cdef Py_ssize_t j
        self._check_rows(views, len(keys))
        for j in range(len(keys)):
            self.row = j
            self._write_sample(j, PyObject_CallOneArg(get, keys[j]), views)

    def write_indices(self, get, cnp.ndarray indices, list views):
        """Row j of each field array in `views` = leaf of get(int(indices[j]))
        for a 1-d int64 array of indices, as write_samples with
        ``indices.tolist()`` (each key a Python int) without the list."""
        cdef Py_ssize_t j, n
        cdef char *at
        cdef Py_ssize_t step
        cdef int64_t v
        if (cnp.PyArray_NDIM(indices) != 1
                or cnp.PyArray_TYPE(indices) != cnp.NPY_INT64
                or not cnp.PyArray_ISNOTSWAPPED(indices)):
            self.write_samples(get, indices.tolist(), views)
            return
        n = cnp.PyArray_DIMS(indices)[0]
        self._check_rows(views, n)
        at = <char *>cnp.PyArray_DATA(indices)
        step = cnp.PyArray_STRIDES(indices)[0]
        for j in range(n):
            memcpy(&v, at + j * step, sizeof(v))
            self.row = j
            self._write_sample(j, PyObject_CallOneArg(get, PyLong_FromLongLong(v)), views)

    def write_exact(self, get, list keys, list views, list kept, tuple leaf_types):
        """Row j of each field array in `views` = leaf of get(keys[j]), each
        sample appended to `kept`, while every leaf is of its field's type
        in `leaf_types` exactly and is copied as it is (no conversion):
        the rows written, len(keys) unless sample `kept[-1]` did not fit
        (its row and those after it are then not written); -1 with every
        row written, where two samples' arrays of one field lay at one
        address (a buffer the dataset reuses). What a caller
        that must reproduce another collate bit for bit writes with: a
        sample that would need a conversion is left to that collate."""
        cdef Py_ssize_t j, n = len(keys)
        if len(leaf_types) != self.nfields:
            raise ValueError(f"{len(leaf_types)} leaf types for {self.nfields} fields")
        self._check_rows(views, n)
        # Where each array leaf's bytes lay: a buffer the dataset hands out
        # again and again (the same array, or a view of it) would be
        # stacked by that collate as its last contents, every time.
        self.seen = <uintptr_t *>PyMem_Calloc(max(1, n * self.nfields), sizeof(uintptr_t))
        if self.seen == NULL:
            raise MemoryError()
        self.seen_rows = n
        try:
            for j in range(n):
                self.row = j
                sample = PyObject_CallOneArg(get, keys[j])
                kept.append(sample)
                if not self._write_exact(j, sample, leaf_types):
                    return j
            return -1 if self._buffer_repeats(n) else n
        finally:
            PyMem_Free(self.seen)
            self.seen = NULL

    cdef bint _write_exact(self, Py_ssize_t j, object sample, tuple leaf_types) except -1:
        cdef Py_ssize_t i, nf = self.nfields
        cdef object leaves
        if self.single:
            return self._put_exact(0, j, sample, leaf_types)
        if self.flat and (type(sample) is tuple or type(sample) is list):
            if len(sample) != nf:
                return False
            leaves = sample
        else:
            try:
                leaves = self.spec.flatten(sample, "a sample")
            except SpecError:
                return False
        for i in range(nf):
            if not self._put_exact(i, j, leaves[i], leaf_types):
                return False
        return True

    cdef inline bint _put_exact(self, Py_ssize_t i, Py_ssize_t j, object leaf,
                                tuple leaf_types) noexcept:
        if self.jagged[i] or type(leaf) is not <object>PyTuple_GET_ITEM(leaf_types, i):
            return False
        if cnp.PyArray_CheckExact(leaf):
            self.seen[i * self.seen_rows + j] = <uintptr_t>cnp.PyArray_DATA(<cnp.ndarray>leaf)
        return self._put_fast(i, self.dst[i] + j * self.stride[i], leaf)

    cdef bint _buffer_repeats(self, Py_ssize_t n) except -1:
        """Whether two samples' array leaves of one field lay at the same
        address: each field's addresses go into a small open-addressing
        set (a few instructions each; a sort cost 100,000 for a batch)."""
        cdef Py_ssize_t i, j, bits = 1, size
        cdef uintptr_t p
        cdef uintptr_t *at
        cdef uintptr_t *table
        cdef size_t h, mask
        while (<Py_ssize_t>1 << bits) < 2 * n:
            bits += 1
        size = <Py_ssize_t>1 << bits
        mask = <size_t>size - 1
        table = <uintptr_t *>PyMem_Malloc(size * sizeof(uintptr_t))
        if table == NULL:
            raise MemoryError()
        try:
            for i in range(self.nfields):
                at = self.seen + i * n
                if n == 0 or at[0] == 0:
                    continue  # not arrays (a field's leaves share one type)
                memset(table, 0, size * sizeof(uintptr_t))
                for j in range(n):
                    p = at[j]
                    # Fibonacci hashing: the product's top bits.
                    h = <size_t>((p >> 4) * <uintptr_t>0x9E3779B97F4A7C15
                                 >> (8 * sizeof(uintptr_t) - bits)) & mask
                    while table[h] != 0:
                        if table[h] == p:
                            return True
                        h = (h + 1) & mask
                    table[h] = p
            return False
        finally:
            PyMem_Free(table)

    def write_stream(self, it, Py_ssize_t first, Py_ssize_t rows, list views):
        """Rows first.. of each field array in `views` = leaves of next(it),
        until `rows` rows are full or `it` ends: the rows now full. A
        sample stream's batch, written with no intermediate batch."""
        cdef Py_ssize_t j
        self._check_rows(views, rows)
        for j in range(first, rows):
            self.row = j
            try:
                sample = next(it)
            except StopIteration:
                return j
            self._write_sample(j, sample, views)
        return rows

    cdef int _check_rows(self, list views, Py_ssize_t rows) except -1:
        """Checks that `views` holds `rows` rows of each field, and resolves
        where each fixed field's rows lie."""
        cdef Py_ssize_t i
        cdef cnp.ndarray view
        if len(views) != self.nfields:
            raise ValueError(f"{len(views)} field arrays for {self.nfields} fields")
        for i in range(self.nfields):
            if self.jagged[i]:
                if len(views[i]) < rows:
                    raise ValueError(f"jagged field {i} has fewer than {rows} samples")
                continue
            view = views[i]
            if cnp.PyArray_NDIM(view) < 1 or cnp.PyArray_DIMS(view)[0] < rows:
                raise ValueError(f"field array {i} has fewer than {rows} rows")
            self.dst[i] = <char *>cnp.PyArray_DATA(view)
            self.stride[i] = cnp.PyArray_STRIDES(view)[0]
        return 0

    cdef int _write_sample(self, Py_ssize_t j, object sample, list views) except -1:
        cdef Py_ssize_t i, nf = self.nfields
        if self.single:
            return self._put_leaf(0, j, sample, views)
        if self.flat and type(sample) is tuple and PyTuple_GET_SIZE(sample) == nf:
            for i in range(nf):
                self._put_leaf(i, j, <object>PyTuple_GET_ITEM(sample, i), views)
            return 0
        leaves = self.spec.flatten(sample, "a sample")
        for i in range(nf):
            self._put_leaf(i, j, leaves[i], views)
        return 0

    cdef inline int _put_leaf(self, Py_ssize_t i, Py_ssize_t j, object leaf,
                              list views) except -1:
        if self.jagged[i]:
            return self._put_jagged(i, j, leaf, views[i], self.dtypes[i])
        if self._put_fast(i, self.dst[i] + j * self.stride[i], leaf):
            return 0
        # Converts what numpy can assign, or raises naming the field.
        views[i][j] = self.spec.check_row(i, leaf)
        return 0

    cdef inline bint _put_fast(self, Py_ssize_t i, char *dst, object leaf) noexcept:
        """Copies leaf into dst when it needs no conversion: True if done."""
        cdef ScalarKind kind = self.scalar[i]
        cdef cnp.ndarray a
        cdef int k, overflow = 0
        cdef cnp.npy_intp *have
        cdef int64_t v
        cdef double d
        cdef PyObject *descr
        if cnp.PyArray_CheckExact(leaf):
            a = <cnp.ndarray>leaf
            if cnp.PyArray_NDIM(a) != self.ndim[i] or not cnp.PyArray_IS_C_CONTIGUOUS(a):
                return False
            have = cnp.PyArray_DIMS(a)
            for k in range(self.ndim[i]):
                if have[k] != self.dims[i][k]:
                    return False
            descr = <PyObject *>cnp.PyArray_DESCR(a)
            if descr != self.descr[i] and not cnp.PyArray_EquivTypes(
                    <object>cnp.PyArray_DESCR(a), <object>self.descr[i]):
                return False
            _copy(dst, <const char *>cnp.PyArray_DATA(a), self.row_bytes[i],
                  self.stream and self.row_bytes[i] >= STREAM_ROW_BYTES)
            return True
        if kind == NOT_SCALAR:
            return False
        if Py_TYPE(leaf) == self.scalar_type[i]:
            if self.value_at[i] >= 0:
                memcpy(dst, <char *><PyObject *>leaf + self.value_at[i],
                       self.row_bytes[i])
            else:
                cnp.PyArray_ScalarAsCtype(leaf, dst)
            return True
        if kind == INT64 and type(leaf) is int:
            v = PyLong_AsLongLongAndOverflow(leaf, &overflow)
            if overflow:
                return False
            memcpy(dst, &v, sizeof(v))
            return True
        if kind == FLOAT64 and type(leaf) is float:
            d = PyFloat_AS_DOUBLE(leaf)
            memcpy(dst, &d, sizeof(d))
            return True
        return False

    cdef int _put_jagged(self, Py_ssize_t i, Py_ssize_t j, object leaf,
                         object out, object dtype) except -1:
        """Sample j's rows of jagged field i, after samples 0..j-1 of the
        batch: one memcpy for an array of the field's row shape and dtype
        within the bounds; the spec's checked path (and its SpecError)
        otherwise."""
        cdef cnp.ndarray a, values, offsets
        cdef int64_t *off
        cdef int64_t start, n
        cdef int k, nd = self.ndim[i]
        cdef cnp.npy_intp *have
        if cnp.PyArray_CheckExact(leaf):
            a = <cnp.ndarray>leaf
            if cnp.PyArray_NDIM(a) == nd + 1 and cnp.PyArray_IS_C_CONTIGUOUS(a):
                have = cnp.PyArray_DIMS(a)
                for k in range(nd):
                    if have[k + 1] != self.dims[i][k]:
                        break
                else:
                    descr = <object>cnp.PyArray_DESCR(a)
                    n = have[0]
                    if n <= self.max_len[i] and (
                        descr is dtype or cnp.PyArray_EquivTypes(descr, dtype)
                    ):
                        values = out.values
                        offsets = out.offsets
                        off = <int64_t *>cnp.PyArray_DATA(offsets)
                        if j == 0:
                            off[0] = 0
                        start = off[j]
                        if 0 <= start and start + n <= cnp.PyArray_DIMS(values)[0]:
                            _copy(<char *>cnp.PyArray_DATA(values)
                                  + start * self.row_bytes[i],
                                  <const char *>cnp.PyArray_DATA(a),
                                  n * self.row_bytes[i])
                            off[j + 1] = start + n
                            return 0
        self.spec.put_jagged(i, j, leaf, out)
        return 0


cdef ScalarKind _scalar_kind(tuple shape, object dtype):
    if shape or not dtype.isnative or dtype.hasobject:
        return NOT_SCALAR
    if dtype.kind == "i" and dtype.itemsize == 8:
        return INT64
    if dtype.kind == "f" and dtype.itemsize == 8:
        return FLOAT64
    if dtype.kind in "biufc":
        return NUMPY_SCALAR
    return NOT_SCALAR


cdef Py_ssize_t _value_offset(object dtype):
    """Where a scalar of dtype's own type keeps its value inside the object
    (numpy's `obval`, after the object header), found by matching scalars
    made from two known byte patterns; -1 where none matches both."""
    cdef Py_ssize_t size = dtype.itemsize, step = max(1, dtype.alignment)
    cdef Py_ssize_t at, end
    cdef bytes a = bytes([k + 1 for k in range(size)])
    cdef bytes b = bytes([size - k for k in range(size)])
    if dtype.kind == "b":
        a = b = b"\x01"
    x = np.frombuffer(a, dtype)[0]
    y = np.frombuffer(b, dtype)[0]
    if type(x) is not dtype.type or type(y) is not dtype.type:
        return -1
    end = Py_TYPE(x).tp_basicsize - size
    at = (<Py_ssize_t>sizeof(PyObject) + step - 1) // step * step
    while at <= end:
        if (memcmp(<char *><PyObject *>x + at, <const char *>a, size) == 0
                and memcmp(<char *><PyObject *>y + at, <const char *>b, size) == 0):
            return at
        at += step
    return -1


def copy_rows(cnp.ndarray dst, object src, Py_ssize_t rows):
    """dst[:rows] = src: one memcpy when src is a C-contiguous array of
    dst's row shape and an equivalent dtype; numpy's assignment otherwise."""
    cdef cnp.ndarray a
    cdef int k, nd = cnp.PyArray_NDIM(dst)
    if (
        cnp.PyArray_CheckExact(src)
        and cnp.PyArray_IS_C_CONTIGUOUS(dst)
        and nd >= 1
        and 0 <= rows <= cnp.PyArray_DIMS(dst)[0]
    ):
        a = <cnp.ndarray>src
        if (
            cnp.PyArray_NDIM(a) == nd
            and cnp.PyArray_IS_C_CONTIGUOUS(a)
            and cnp.PyArray_DIMS(a)[0] == rows
        ):
            for k in range(1, nd):
                if cnp.PyArray_DIMS(a)[k] != cnp.PyArray_DIMS(dst)[k]:
                    break
            else:
                if cnp.PyArray_EquivTypes(<object>cnp.PyArray_DESCR(a),
                                          <object>cnp.PyArray_DESCR(dst)):
                    _copy(<char *>cnp.PyArray_DATA(dst),
                          <const char *>cnp.PyArray_DATA(a),
                          cnp.PyArray_NBYTES(a))
                    return
    dst[:rows] = src


def stack_rows(cnp.ndarray dst, list arrays):
    """dst[j] = arrays[j] for each j, as np.stack(arrays, out=dst) would;
    True once done, False (nothing written) unless every array is an exact
    C-contiguous ndarray of dst's row shape and an equivalent dtype. Rows of
    a large batch go in non-temporal stores, as RowWriter writes them."""
    cdef Py_ssize_t j, n = len(arrays)
    cdef int k, nd = cnp.PyArray_NDIM(dst)
    cdef cnp.ndarray a
    cdef object descr = <object>cnp.PyArray_DESCR(dst)
    cdef size_t row_bytes
    cdef bint stream
    if nd < 1 or not cnp.PyArray_IS_C_CONTIGUOUS(dst) or cnp.PyArray_DIMS(dst)[0] != n:
        return False
    row_bytes = cnp.PyArray_NBYTES(dst) // n if n else 0
    for j in range(n):
        if not cnp.PyArray_CheckExact(arrays[j]):
            return False
        a = <cnp.ndarray>arrays[j]
        if cnp.PyArray_NDIM(a) != nd - 1 or not cnp.PyArray_IS_C_CONTIGUOUS(a):
            return False
        for k in range(1, nd):
            if cnp.PyArray_DIMS(a)[k - 1] != cnp.PyArray_DIMS(dst)[k]:
                return False
        if not cnp.PyArray_EquivTypes(<object>cnp.PyArray_DESCR(a), descr):
            return False
    stream = (cnp.PyArray_NBYTES(dst) >= STREAM_BATCH_BYTES
              and row_bytes >= STREAM_ROW_BYTES)
    cdef char *out = <char *>cnp.PyArray_DATA(dst)
    for j in range(n):
        a = <cnp.ndarray>arrays[j]
        _copy(out + j * row_bytes, <const char *>cnp.PyArray_DATA(a), row_bytes,
              stream)
    return True
