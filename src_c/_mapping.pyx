# cython: language_level=3
"""A shared mapping of a file at an address aligned to a huge page.

The kernel maps a file's huge page with one page-table entry only where the
mapping's address and the file offset agree modulo the huge page size, and
it aligns a shared-memory file's address itself only where shmem huge pages
are enabled system-wide. Python's mmap cannot choose the address, so this
maps the file into an aligned hole of a larger reservation: then a file
whose pages were made huge (MADV_COLLAPSE, which works whatever
shmem_enabled says) is mapped huge in every process that maps it so.

AlignedMapping behaves as Python's mmap does where fastq uses it: a
writable buffer of `size` bytes, unmapped when the last reference to it
(or to a buffer exported from it) goes, `madvise(advice)` over all of it,
and `close()` refused while buffers are exported.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from libc.errno cimport errno
from libc.stdint cimport uintptr_t


cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int madvise(void *addr, size_t length, int advice)
    void *MAP_FAILED
    int PROT_NONE, PROT_READ, PROT_WRITE
    int MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED, MAP_NORESERVE
    int MAP_POPULATE


cdef class AlignedMapping:
    cdef char *base
    cdef size_t size
    cdef Py_ssize_t exports

    def __cinit__(self, int fd, size_t size, size_t align, bint populate=True):
        if size == 0 or align == 0 or align & (align - 1):
            raise ValueError(f"size {size} and a power-of-two align {align} needed")
        cdef size_t span = size + align
        cdef char *hole = <char *>mmap(
            NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0
        )
        if <void *>hole == MAP_FAILED:
            raise OSError(errno, "mmap: no address space for the region")
        cdef char *start = <char *>((<uintptr_t>hole + align - 1) & ~(<uintptr_t>align - 1))
        # Give back the reservation around the aligned range.
        if start > hole:
            munmap(hole, start - hole)
        if hole + span > start + size:
            munmap(start + size, (hole + span) - (start + size))
        cdef int flags = MAP_SHARED | MAP_FIXED | (MAP_POPULATE if populate else 0)
        cdef void *got = mmap(start, size, PROT_READ | PROT_WRITE, flags, fd, 0)
        if got == MAP_FAILED:
            err = errno
            munmap(start, size)
            raise OSError(err, "mmap of the shared region failed")
        self.base = start
        self.size = size

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL

    def __len__(self):
        return self.size

    @property
    def address(self):
        return <uintptr_t>self.base

    def madvise(self, int advice, size_t start=0, size_t length=0):
        """madvise(2) over `length` bytes from `start` (all of the mapping
        by default), without holding the GIL: populating or collapsing a
        large range takes long. OSError on failure."""
        if self.base == NULL:
            raise ValueError("mapping closed")
        if length == 0:
            length = self.size - start if start < self.size else 0
        if start > self.size or length > self.size - start:
            raise ValueError(f"range {start}+{length} outside {self.size} bytes")
        cdef int rc, err = 0
        cdef char *at = self.base + start
        with nogil:
            rc = madvise(at, length, advice)
            if rc != 0:
                err = errno
        if rc != 0:
            raise OSError(err, f"madvise({advice})")

    def close(self):
        if self.exports:
            raise BufferError("cannot close a mapping while buffers of it exist")
        if self.base != NULL:
            munmap(self.base, self.size)
            self.base = NULL

    @property
    def closed(self):
        return self.base == NULL

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.base == NULL:
            raise ValueError("mapping closed")
        PyBuffer_FillInfo(view, self, self.base, self.size, 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1
