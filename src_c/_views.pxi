# A batch's arrays over its slot, made in compiled code: the consumer's
# hand-out of a plain batch builds each field's ndarray (its base the lease,
# which keeps the slot the consumer's while any view lives) and the batch's
# structure without a Python-level call. Included by _ring.pyx.

from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

cimport numpy as cnp

cnp.import_array()

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    # Steals a reference to descr.
    object PyArray_NewFromDescr(PyTypeObject *subtype, cnp.dtype descr,
                                int nd, cnp.npy_intp *dims,
                                cnp.npy_intp *strides, void *data, int flags,
                                PyObject *obj)

# What a batch is, made of its field arrays.
DEF FORM_ARRAY = 0  # the one field's array
DEF FORM_TUPLE = 1  # a flat tuple of them
DEF FORM_DICT = 2   # a flat dict of them
DEF FORM_CALL = 3   # finish(list of them): a nested structure, or tensors

# Dimensions a field may have, the batch's included (numpy's own limit).
DEF MAX_DIMS = 64

BATCH_ARRAY = FORM_ARRAY
BATCH_TUPLE = FORM_TUPLE
BATCH_DICT = FORM_DICT
BATCH_CALL = FORM_CALL


@cython.final
cdef class BatchViews:
    """How the consumer makes a batch of fixed-shape fields from a lease.

    ``fields``: (byte offset in the slot, sample shape, numpy dtype) per
    field; ``form``: BATCH_ARRAY, BATCH_TUPLE, BATCH_DICT (``keys``, one per
    field) or BATCH_CALL (``finish`` takes the list of arrays);
    ``row_bytes``: one row of every field, for the byte count.
    """

    cdef Py_ssize_t nfields
    cdef list dtypes
    cdef Py_ssize_t *offsets
    cdef int *ndims
    cdef cnp.npy_intp *dims  # MAX_DIMS per field; dims[0] is set per batch
    cdef int form
    cdef tuple keys
    cdef object finish
    cdef readonly uint64_t row_bytes

    def __cinit__(self, fields, int form, keys=None, finish=None,
                  uint64_t row_bytes=0):
        cdef Py_ssize_t i, k
        self.nfields = len(fields)
        if self.nfields == 0 or (form == FORM_ARRAY and self.nfields != 1):
            raise ValueError(f"{self.nfields} fields for form {form}")
        if form == FORM_DICT and (keys is None or len(keys) != self.nfields):
            raise ValueError("a dict batch needs one key per field")
        if form == FORM_CALL and not callable(finish):
            raise ValueError("a called batch needs finish(arrays)")
        self.offsets = <Py_ssize_t *>malloc(self.nfields * sizeof(Py_ssize_t))
        self.ndims = <int *>malloc(self.nfields * sizeof(int))
        self.dims = <cnp.npy_intp *>malloc(
            self.nfields * MAX_DIMS * sizeof(cnp.npy_intp))
        if self.offsets == NULL or self.ndims == NULL or self.dims == NULL:
            raise MemoryError()
        self.dtypes = []
        for i, (offset, shape, dtype) in enumerate(fields):
            if len(shape) + 1 > MAX_DIMS:
                raise ValueError(f"field {i} has {len(shape)} sample dimensions")
            self.offsets[i] = offset
            self.ndims[i] = len(shape) + 1
            self.dims[i * MAX_DIMS] = 0
            for k in range(len(shape)):
                self.dims[i * MAX_DIMS + 1 + k] = shape[k]
            self.dtypes.append(cnp.dtype(dtype))
        self.form = form
        self.keys = None if keys is None else tuple(keys)
        self.finish = finish
        self.row_bytes = row_bytes

    def __dealloc__(self):
        free(self.offsets)
        free(self.ndims)
        free(self.dims)

    cdef object make(self, SlotLease lease, uint8_t *data, cnp.npy_intp rows):
        """The batch of `rows` rows in the slot at `data`, held by `lease`."""
        cdef Py_ssize_t i, n = self.nfields
        cdef tuple batch
        cdef dict named
        cdef list arrays
        if self.form == FORM_ARRAY:
            return self._view(0, lease, data, rows)
        if self.form == FORM_TUPLE:
            batch = PyTuple_New(n)
            for i in range(n):
                view = self._view(i, lease, data, rows)
                Py_INCREF(view)  # PyTuple_SET_ITEM steals it
                PyTuple_SET_ITEM(batch, i, view)
            return batch
        if self.form == FORM_DICT:
            named = {}
            for i in range(n):
                named[self.keys[i]] = self._view(i, lease, data, rows)
            return named
        arrays = [self._view(i, lease, data, rows) for i in range(n)]
        return self.finish(arrays)

    cdef object _view(self, Py_ssize_t i, SlotLease lease, uint8_t *data,
                      cnp.npy_intp rows):
        cdef cnp.npy_intp *dims = &self.dims[i * MAX_DIMS]
        cdef cnp.dtype descr = <cnp.dtype>self.dtypes[i]
        dims[0] = rows
        Py_INCREF(descr)  # PyArray_NewFromDescr steals it
        view = PyArray_NewFromDescr(
            &PyArray_Type, descr, self.ndims[i], dims, NULL,
            data + self.offsets[i], cnp.NPY_ARRAY_CARRAY, NULL)
        cnp.set_array_base(view, lease)
        return view
