# cython: language_level=3, embedsignature=True, boundscheck=False, wraparound=False
"""The producer's copies into a slot, in C.

A map-style source or a sample stream makes a batch one sample at a time,
so the per-sample cost of the loader is paid hundreds of times per batch.
Here each leaf that already matches the spec (a C-contiguous array of the
field's shape and an equivalent dtype, or a scalar of the field's own
native type) costs one memcpy; anything else goes through the spec's
checked Python path, which converts it or raises the SpecError that names
the field. Whole batches (a batch stream) get the same treatment per field.
"""

cimport numpy as cnp
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int64_t
from libc.string cimport memcpy

cnp.import_array()

# Copies this large let go of the GIL: any other thread of the worker (a
# user's reader thread, the consumer watch) runs while the bytes move.
DEF NOGIL_BYTES = 1 << 20

cdef enum ScalarKind:
    NOT_SCALAR = 0
    NUMPY_SCALAR = 1  # the field's own numpy scalar type, native byte order
    INT64 = 2  # also takes a Python int that fits
    FLOAT64 = 3  # also takes a Python float


cdef inline bint _matches(cnp.ndarray a, object dtype, int ndim,
                          const cnp.npy_intp *dims):
    """a has the field's dtype and row shape and can be copied as bytes."""
    cdef int k
    if cnp.PyArray_NDIM(a) != ndim or not cnp.PyArray_IS_C_CONTIGUOUS(a):
        return False
    cdef cnp.npy_intp *have = cnp.PyArray_DIMS(a)
    for k in range(ndim):
        if have[k] != dims[k]:
            return False
    descr = <object>cnp.PyArray_DESCR(a)
    return descr is dtype or cnp.PyArray_EquivTypes(descr, dtype)


cdef inline void _copy(char *dst, const char *src, size_t n) noexcept:
    if n >= NOGIL_BYTES:
        with nogil:
            memcpy(dst, src, n)
    else:
        memcpy(dst, src, n)


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
    cdef list dtypes
    cdef list scalar_types
    cdef int *ndim
    cdef cnp.npy_intp **dims
    cdef size_t *row_bytes
    cdef ScalarKind *scalar
    cdef bint *jagged  # a variable-length field (values plus offsets)
    cdef int64_t *max_len  # a jagged field's bound per sample

    def __cinit__(self):
        self.ndim = NULL
        self.dims = NULL
        self.row_bytes = NULL
        self.scalar = NULL
        self.jagged = NULL
        self.max_len = NULL

    def __init__(self, spec):
        cdef Py_ssize_t i, k
        fields = spec.fields
        self.spec = spec
        self.row = 0
        self.nfields = len(fields)
        self.single = spec.structure is None
        self.flat = bool(spec.flat)
        self.dtypes = [f.dtype for f in fields]
        n = max(1, self.nfields)
        self.ndim = <int *>PyMem_Malloc(n * sizeof(int))
        self.dims = <cnp.npy_intp **>PyMem_Malloc(n * sizeof(cnp.npy_intp *))
        self.row_bytes = <size_t *>PyMem_Malloc(n * sizeof(size_t))
        self.scalar = <ScalarKind *>PyMem_Malloc(n * sizeof(ScalarKind))
        self.jagged = <bint *>PyMem_Malloc(n * sizeof(bint))
        self.max_len = <int64_t *>PyMem_Malloc(n * sizeof(int64_t))
        if not (self.ndim and self.dims and self.row_bytes and self.scalar
                and self.jagged and self.max_len):
            raise MemoryError()
        for i in range(self.nfields):
            self.dims[i] = NULL
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
        self.scalar_types = [f.dtype.type for f in fields]

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

    def write_samples(self, get, list keys, list views):
        """Row j of each field array in `views` = leaf of get(keys[j])."""
        cdef Py_ssize_t j
        self._check_rows(views, len(keys))
        for j in range(len(keys)):
            self.row = j
            self._write_sample(j, get(keys[j]), views)

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
        return 0

    cdef int _write_sample(self, Py_ssize_t j, object sample, list views) except -1:
        cdef Py_ssize_t i, nf = self.nfields
        cdef list dtypes = self.dtypes
        if self.single:
            leaves = (sample,)
        elif self.flat and type(sample) is tuple and len(<tuple>sample) == nf:
            leaves = sample
        else:
            leaves = self.spec.flatten(sample, "a sample")
        for i in range(nf):
            if self.jagged[i]:
                self._put_jagged(i, j, leaves[i], views[i], dtypes[i])
            else:
                self._put(i, j, leaves[i], views[i], dtypes[i])
        return 0

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

    cdef int _put(self, Py_ssize_t i, Py_ssize_t j, object leaf,
                  cnp.ndarray view, object dtype) except -1:
        cdef char *dst = (<char *>cnp.PyArray_DATA(view)
                          + j * cnp.PyArray_STRIDES(view)[0])
        cdef ScalarKind kind = self.scalar[i]
        cdef int overflow = 0
        cdef int64_t v
        cdef double d
        if cnp.PyArray_CheckExact(leaf):
            if _matches(<cnp.ndarray>leaf, dtype, self.ndim[i], self.dims[i]):
                _copy(dst, <const char *>cnp.PyArray_DATA(<cnp.ndarray>leaf),
                      self.row_bytes[i])
                return 0
        elif kind != NOT_SCALAR:
            if type(leaf) is self.scalar_types[i]:
                cnp.PyArray_ScalarAsCtype(leaf, dst)
                return 0
            if kind == INT64 and type(leaf) is int:
                v = PyLong_AsLongLongAndOverflow(leaf, &overflow)
                if not overflow:
                    memcpy(dst, &v, sizeof(v))
                    return 0
            elif kind == FLOAT64 and type(leaf) is float:
                d = PyFloat_AS_DOUBLE(leaf)
                memcpy(dst, &d, sizeof(d))
                return 0
        # Converts what numpy can assign, or raises naming the field.
        view[j] = self.spec.check_row(i, leaf)
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
