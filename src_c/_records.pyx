# cython: language_level=3, embedsignature=True
"""The compiled half of fastq.shared_records: the encoding of plain records
and the read path, record i decoded straight from the shared buffer without
a Python frame or a slice in between. The layout, and why it is so: NOTE
[ Records in shared memory ] in fastq/_workers/_shared_records.py."""

cimport cython
from cpython.buffer cimport PyBUF_READ
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_SetItem
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.number cimport PyNumber_AsSsize_t
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.slice cimport PySlice_Check
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_New
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcpy

import marshal
import pickle


cdef extern from "marshal.h":
    object PyMarshal_ReadObjectFromString(const char *data, Py_ssize_t size)


cdef extern from "Python.h":
    dict _PyDict_NewPresized(Py_ssize_t minused)
    object PyUnicode_DecodeUTF8(const char *data, Py_ssize_t size, const char *errors)
    bint PyUnicode_IS_ASCII(object)
    double PyFloat_AS_DOUBLE(object)
    object PyFloat_FromDouble(double)
    object PyLong_FromLongLong(long long)
    bint PyLong_CheckExact(object)
    bint PyFloat_CheckExact(object)
    bint PyComplex_CheckExact(object)
    bint PyUnicode_CheckExact(object)
    bint PyBytes_CheckExact(object)
    bint PyTuple_CheckExact(object)
    bint PyList_CheckExact(object)
    bint PyDict_CheckExact(object)
    bint PyAnySet_CheckExact(object)


cdef object _pickle_loads = pickle.loads
cdef object _marshal_dumps = marshal.dumps

# The byte before each record's bytes: how they are to be read.
cdef enum:
    _PICKLED = 0  # pickle: any picklable record
    _ENCODED = 1  # a plain record, encoded here
    _FIRST_KEY_SET = 2  # a dict: its store's key set (tag - 2), then its values
    _KEY_SETS = 254  # the most key sets a store names (the tag is one byte)

PICKLED = _PICKLED
ENCODED = _ENCODED
FIRST_KEY_SET = _FIRST_KEY_SET
KEY_SETS = _KEY_SETS

# The byte before each value of a plain record. The values a record holds
# most (None, bools, ints, floats, strings, bytes and the containers) are
# laid out here; what else marshal gives back equal and of the same type
# (an int past 64 bits, a complex, a set, a frozenset, a string past 4 GiB)
# is marshalled in place.
cdef enum:
    _NONE = 1
    _TRUE = 2
    _FALSE = 3
    _INT = 4  # int64
    _FLOAT = 5  # the double's 8 bytes: NaN payloads and -0.0 stay
    _ASCII = 6  # uint32 length, the characters
    _UTF8 = 7  # uint32 length, UTF-8 (lone surrogates passed through)
    _BYTES = 8  # uint32 length, the bytes
    _LIST = 9  # uint32 count, the items
    _TUPLE = 10  # uint32 count, the items
    _DICT = 11  # uint32 count, key and value of each item, in order
    _MARSHAL = 12  # uint32 length, marshal's bytes

cdef enum:
    _DEPTH = 100
cdef Py_ssize_t _MAX_LENGTH = 0xFFFFFFFF


# ------------------------------------------------------------ encoding


cdef class Encoder:
    """The bytes of a plain record (one of None, bools, ints, floats,
    complex numbers, strings, bytes, and lists, tuples, dicts, sets and
    frozensets of them, each exactly of its type), or None for any other:
    what marshal, pickle's fast path and this encoding would change (a
    bytearray or a numpy scalar to bytes, an int subclass to int) is
    pickled instead, so every record reads back of the types it had."""

    cdef char *buf
    cdef size_t size
    cdef size_t capacity

    def __dealloc__(self):
        PyMem_Free(self.buf)

    def plain(self, record):
        """A plain record's bytes, or None."""
        self.size = 0
        if not self._value(record, _DEPTH):
            return None
        return PyBytes_FromStringAndSize(self.buf, self.size)

    def values(self, dict record):
        """The bytes of a dict's values, in order, where its keys are all
        exactly strings and its values plain; else None."""
        self.size = 0
        for key, value in record.items():
            if not PyUnicode_CheckExact(key) or not self._value(value, _DEPTH - 1):
                return None
        return PyBytes_FromStringAndSize(self.buf, self.size)

    cdef bint _value(self, object obj, int depth) except -1:
        cdef int overflow = 0
        cdef long long whole
        cdef double real
        if obj is None:
            self._tag(_NONE)
        elif obj is True:
            self._tag(_TRUE)
        elif obj is False:
            self._tag(_FALSE)
        elif PyLong_CheckExact(obj):
            whole = PyLong_AsLongLongAndOverflow(obj, &overflow)
            if overflow:
                return self._marshalled(obj)
            self._tag(_INT)
            self._put(&whole, 8)
        elif PyFloat_CheckExact(obj):
            real = PyFloat_AS_DOUBLE(obj)
            self._tag(_FLOAT)
            self._put(&real, 8)
        elif PyUnicode_CheckExact(obj):
            if PyUnicode_IS_ASCII(obj) and PyUnicode_GET_LENGTH(obj) <= _MAX_LENGTH:
                self._tag(_ASCII)
                self._sized(<const char *>PyUnicode_DATA(obj), PyUnicode_GET_LENGTH(obj))
            else:
                utf8 = (<str>obj).encode("utf-8", "surrogatepass")
                if PyBytes_GET_SIZE(utf8) > _MAX_LENGTH:
                    return self._marshalled(obj)
                self._tag(_UTF8)
                self._sized(PyBytes_AS_STRING(utf8), PyBytes_GET_SIZE(utf8))
        elif PyBytes_CheckExact(obj):
            if PyBytes_GET_SIZE(obj) > _MAX_LENGTH:
                return self._marshalled(obj)
            self._tag(_BYTES)
            self._sized(PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj))
        elif PyComplex_CheckExact(obj):
            return self._marshalled(obj)
        elif depth == 0:
            return False  # too deep, or a container that holds itself
        elif PyList_CheckExact(obj) or PyTuple_CheckExact(obj):
            self._tag(_LIST if PyList_CheckExact(obj) else _TUPLE)
            self._count(len(obj))
            for item in obj:
                if not self._value(item, depth - 1):
                    return False
        elif PyDict_CheckExact(obj):
            self._tag(_DICT)
            self._count(len(<dict>obj))
            for key, value in (<dict>obj).items():
                if not (self._value(key, depth - 1) and self._value(value, depth - 1)):
                    return False
        elif PyAnySet_CheckExact(obj):
            for item in obj:
                if not _marshals_exactly(item):
                    return False
            return self._marshalled(obj)
        else:
            return False
        return True

    cdef bint _marshalled(self, object obj) except -1:
        data = _marshal_dumps(obj)
        if PyBytes_GET_SIZE(data) > _MAX_LENGTH:
            return False  # pickle can
        self._tag(_MARSHAL)
        self._sized(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
        return True

    cdef int _tag(self, char tag) except -1:
        return self._put(&tag, 1)

    cdef int _count(self, Py_ssize_t count) except -1:
        if count > _MAX_LENGTH:
            raise OverflowError(f"a container of {count} items")
        cdef uint32_t n = <uint32_t>count
        return self._put(&n, 4)

    cdef int _sized(self, const char *data, Py_ssize_t size) except -1:
        self._count(size)
        return self._put(data, size)

    cdef int _put(self, const void *data, size_t size) except -1:
        cdef size_t need = self.size + size
        cdef size_t capacity = 2 * self.capacity if self.capacity else 256
        cdef char *grown
        if need > self.capacity:
            if capacity < need:
                capacity = need
            grown = <char *>PyMem_Realloc(self.buf, capacity)
            if grown == NULL:
                raise MemoryError()
            self.buf = grown
            self.capacity = capacity
        memcpy(self.buf + self.size, data, size)
        self.size = need
        return 0


cdef bint _marshals_exactly(object obj) except -1:
    # What a set holds: hashable, so no list or dict; a tuple may nest.
    if (
        obj is None or obj is True or obj is False or PyLong_CheckExact(obj)
        or PyFloat_CheckExact(obj) or PyUnicode_CheckExact(obj)
        or PyBytes_CheckExact(obj) or PyComplex_CheckExact(obj)
    ):
        return True
    if PyTuple_CheckExact(obj) or type(obj) is frozenset:
        for item in obj:
            if not _marshals_exactly(item):
                return False
        return True
    return False


# ------------------------------------------------------------ reading


cdef class RecordReader:
    """Record i of a store: ``data`` holds the records end to end, record i
    from ``starts[i]`` to ``ends[i]`` (int64 arrays, any stride), each
    after its tag; ``key_sets`` the keys of the dicts stored by values."""

    cdef readonly object _data
    cdef readonly object _starts
    cdef readonly object _ends
    cdef readonly tuple _key_sets
    cdef const unsigned char[::1] _bytes
    cdef const int64_t[:] _start_at
    cdef const int64_t[:] _end_at

    def __init__(self, data, starts, ends, tuple key_sets):
        self._data = data
        self._starts = starts
        self._ends = ends
        self._key_sets = key_sets
        self._bytes = data
        self._start_at = starts
        self._end_at = ends

    def __len__(self):
        return self._start_at.shape[0]

    def __getitem__(self, index):
        if PySlice_Check(index):
            return type(self)(
                self._data, self._starts[index], self._ends[index], self._key_sets
            )
        cdef Py_ssize_t n = self._start_at.shape[0]
        cdef Py_ssize_t i = PyNumber_AsSsize_t(index, IndexError)
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError(f"record index {index} out of range for {n} records")
        return self._read(i)

    def __iter__(self):
        cdef Py_ssize_t i
        for i in range(self._start_at.shape[0]):
            yield self._read(i)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef object _read(self, Py_ssize_t i):
        # i is in range (the callers check it); the offsets and the bytes
        # were written by shared_records, each record its tag and more.
        cdef int64_t start = self._start_at[i]
        cdef Py_ssize_t size = self._end_at[i] - start - 1
        cdef const char *at = <const char *>&self._bytes[start]
        cdef unsigned char tag = <unsigned char>at[0]
        at += 1
        if tag >= _FIRST_KEY_SET:
            return _dict_of(
                <tuple>PyTuple_GET_ITEM(self._key_sets, tag - _FIRST_KEY_SET), &at
            )
        if tag == _ENCODED:
            return _value(&at)
        # The memoryview lives no longer than the call, and the store no
        # shorter: self holds it.
        return _pickle_loads(PyMemoryView_FromMemory(<char *>at, size, PyBUF_READ))


cdef dict _dict_of(tuple keys, const char **at):
    # Copying a dict of the keys and replacing its values measured no
    # cheaper: a replacement costs an insertion.
    cdef Py_ssize_t k, n = PyTuple_GET_SIZE(keys)
    cdef dict record = _PyDict_NewPresized(n)
    for k in range(n):
        PyDict_SetItem(record, <object><PyObject *>PyTuple_GET_ITEM(keys, k), _value(at))
    return record


cdef inline uint32_t _length(const char **at) noexcept:
    cdef uint32_t n
    memcpy(&n, at[0], 4)
    at[0] += 4
    return n


cdef object _value(const char **at):
    cdef char tag = at[0][0]
    cdef int64_t whole
    cdef double real
    cdef uint32_t n, k
    at[0] += 1
    if tag == _NONE:
        return None
    if tag == _TRUE:
        return True
    if tag == _FALSE:
        return False
    if tag == _INT:
        memcpy(&whole, at[0], 8)
        at[0] += 8
        return PyLong_FromLongLong(whole)
    if tag == _FLOAT:
        memcpy(&real, at[0], 8)
        at[0] += 8
        return PyFloat_FromDouble(real)
    if tag == _ASCII:
        n = _length(at)
        text = PyUnicode_New(n, 127)
        memcpy(PyUnicode_DATA(text), at[0], n)
        at[0] += n
        return text
    if tag == _UTF8:
        n = _length(at)
        text = PyUnicode_DecodeUTF8(at[0], n, "surrogatepass")
        at[0] += n
        return text
    if tag == _BYTES:
        n = _length(at)
        data = PyBytes_FromStringAndSize(at[0], n)
        at[0] += n
        return data
    if tag == _LIST:
        n = _length(at)
        items = PyList_New(n)
        for k in range(n):
            item = _value(at)
            Py_INCREF(item)  # SET_ITEM steals it
            PyList_SET_ITEM(items, k, item)
        return items
    if tag == _TUPLE:
        n = _length(at)
        members = PyTuple_New(n)
        for k in range(n):
            item = _value(at)
            Py_INCREF(item)
            PyTuple_SET_ITEM(members, k, item)
        return members
    if tag == _DICT:
        n = _length(at)
        mapping = _PyDict_NewPresized(n)
        for k in range(n):
            key = _value(at)
            PyDict_SetItem(mapping, key, _value(at))
        return mapping
    if tag == _MARSHAL:
        n = _length(at)
        value = PyMarshal_ReadObjectFromString(at[0], n)
        at[0] += n
        return value
    raise ValueError(f"shared records: unknown value tag {tag}")
