# cython: language_level=3, embedsignature=True
"""Thin Cython layer over fq_ring: a Ring over a mapping, and slot leases."""

from cpython.buffer cimport (
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.exc cimport PyErr_CheckSignals, PyErr_SetFromErrno
from libc.stdint cimport int64_t, uint32_t, uint64_t

from fq_ring cimport *

from fastq.errors import RingError

# Every blocking call sleeps at most this long before coming back for the
# GIL: to run signal handlers (Ctrl+C) and let the caller re-check liveness.
DEF WAIT_SLICE_NS = 100_000_000

FREE = FQ_FREE
READY = FQ_READY
SLOT_BATCH = FQ_SLOT_BATCH
SLOT_ERROR = FQ_SLOT_ERROR
SLOT_END = FQ_SLOT_END
# Negative results of the pop methods: why no slot came back.
TIMEOUT = -FQ_TIMEOUT
CLOSED = -FQ_CLOSED
ALERT = -FQ_ALERT
MAX_SLOTS = FQ_MAX_SLOTS
MAX_WORKERS = FQ_MAX_WORKERS


cdef int check(int rc) except -1:
    """The one place where C status codes become exceptions."""
    if rc >= 0:
        return rc
    if rc == FQ_EINVAL:
        raise ValueError("invalid ring geometry or argument")
    if rc == FQ_EFULL:
        raise RingError("slot queue overflow: the ring protocol was broken "
                        "(a slot was returned twice)")
    if rc == FQ_EBADMAGIC:
        raise RingError("the shared region does not hold a fastq ring")
    if rc == FQ_EVERSION:
        raise RingError("the shared region was made by another fastq version")
    if rc == FQ_ESMALL:
        raise RingError("the shared region is smaller than its ring needs")
    if rc == FQ_ESYS:
        PyErr_SetFromErrno(OSError)
        return -1
    raise RingError(f"unknown ring status {rc}")


def region_size(uint32_t nslots, uint32_t nworkers, uint64_t slot_bytes,
                uint64_t page_size):
    """Bytes a ring of this geometry needs; ValueError if it is invalid."""
    cdef fq_geometry g
    g.nslots = nslots
    g.nworkers = nworkers
    g.slot_bytes = slot_bytes
    g.page_size = page_size
    g.spin_ns = 0
    cdef uint64_t n = fq_layout(&g, NULL)
    if n == 0:
        check(FQ_EINVAL)
    return n


cdef class Ring:
    """A ring inside a writable buffer (an mmap) shared between processes.

    The Ring keeps the buffer exported for its whole life, so the mapping
    cannot be closed under it; leases and slot views keep the Ring alive.
    """

    cdef fq_ring ring
    cdef Py_buffer buf
    cdef bint have_buf
    cdef readonly object owner
    cdef readonly Py_ssize_t leased  # leases alive in this process

    def __cinit__(self):
        self.have_buf = False
        self.leased = 0

    def __dealloc__(self):
        if self.have_buf:
            PyBuffer_Release(&self.buf)

    cdef _bind(self, object owner):
        PyObject_GetBuffer(owner, &self.buf, PyBUF_WRITABLE)
        self.have_buf = True
        self.owner = owner

    @staticmethod
    def create(object owner, uint32_t nslots, uint32_t nworkers,
               uint64_t slot_bytes, uint64_t page_size, uint64_t spin_ns):
        """Formats a fresh zeroed buffer; every slot starts on FREE."""
        cdef Ring self = Ring.__new__(Ring)
        cdef fq_geometry g
        g.nslots = nslots
        g.nworkers = nworkers
        g.slot_bytes = slot_bytes
        g.page_size = page_size
        g.spin_ns = spin_ns
        self._bind(owner)
        check(fq_init(self.buf.buf, <uint64_t>self.buf.len, &g, &self.ring))
        return self

    @staticmethod
    def attach(object owner):
        """Binds to a buffer that fq_init formatted in another process."""
        cdef Ring self = Ring.__new__(Ring)
        self._bind(owner)
        check(fq_attach(self.buf.buf, <uint64_t>self.buf.len, &self.ring))
        return self

    @property
    def nslots(self):
        return self.ring.ctrl.nslots

    @property
    def nworkers(self):
        return self.ring.ctrl.nworkers

    @property
    def slot_bytes(self):
        return self.ring.ctrl.slot_bytes

    @property
    def closed(self):
        return fq_is_closed(&self.ring) != 0

    # -------------------------------------------------------------- queues

    cdef int _pop(self, fq_queue_id q, double timeout, unsigned abort) except -1000:
        cdef uint32_t slot = 0
        cdef int rc
        cdef int64_t slice_ns
        cdef uint64_t now = fq_now_ns()
        cdef uint64_t deadline = 0
        if timeout >= 0:
            deadline = now + <uint64_t>(timeout * 1e9)
        while True:
            slice_ns = WAIT_SLICE_NS
            if timeout >= 0:
                if now >= deadline:
                    slice_ns = 0
                elif deadline - now < <uint64_t>slice_ns:
                    slice_ns = <int64_t>(deadline - now)
            with nogil:
                rc = fq_pop(&self.ring, q, &slot, slice_ns, abort)
            if rc == FQ_OK:
                return <int>slot
            if rc == FQ_CLOSED or rc == FQ_ALERT:
                return -rc
            if rc == FQ_EINTR or rc == FQ_TIMEOUT:
                PyErr_CheckSignals()
                now = fq_now_ns()
                if rc == FQ_TIMEOUT and timeout >= 0 and now >= deadline:
                    return -FQ_TIMEOUT
                continue
            check(rc)

    def pop_free(self, double timeout=-1.0):
        """A worker takes a slot: its index, or CLOSED / TIMEOUT."""
        return self._pop(FQ_FREE, timeout, FQ_ABORT_ON_CLOSE)

    def pop_ready(self, double timeout=-1.0):
        """The consumer takes a filled slot: its index, or CLOSED / ALERT /
        TIMEOUT. timeout < 0 waits until one of those happens."""
        return self._pop(FQ_READY, timeout, FQ_ABORT_ON_CLOSE | FQ_ABORT_ON_ALERT)

    def try_pop_ready(self):
        """A filled slot's index without waiting, or -1."""
        cdef uint32_t slot
        if fq_try_pop(&self.ring, FQ_READY, &slot) == FQ_OK:
            return <int>slot
        return -1

    def push_free(self, uint32_t slot):
        """Returns a slot whose batch the consumer no longer needs."""
        self._check_slot(slot)
        check(fq_push(&self.ring, FQ_FREE, slot))

    def publish(self, uint32_t slot, uint64_t task, uint32_t kind,
                uint64_t rows, uint32_t pass_, int worker,
                uint32_t sample=0, uint64_t payload_bytes=0):
        """A worker fills the slot's header and pushes it on READY."""
        self._check_slot(slot)
        cdef fq_slot_header *h = &self.ring.headers[slot]
        h.task = task
        h.kind = kind
        h.rows = rows
        h.pass_ = pass_
        h.worker = worker
        h.sample = sample
        h.payload_bytes = payload_bytes
        check(fq_push(&self.ring, FQ_READY, slot))

    def header(self, uint32_t slot):
        """(task, kind, rows, pass, worker, sample, payload_bytes)."""
        self._check_slot(slot)
        cdef fq_slot_header *h = &self.ring.headers[slot]
        return (h.task, h.kind, h.rows, h.pass_, h.worker, h.sample,
                h.payload_bytes)

    def depth(self, int queue):
        """Items in FREE or READY right now (a snapshot)."""
        return fq_depth(&self.ring, FQ_READY if queue == FQ_READY else FQ_FREE)

    cdef int _check_slot(self, uint32_t slot) except -1:
        if slot >= self.ring.ctrl.nslots:
            raise IndexError(f"slot {slot} out of range "
                             f"(ring has {self.ring.ctrl.nslots})")
        return 0

    # ---------------------------------------------------- tasks and flags

    def claim_task(self):
        return fq_claim_task(&self.ring)

    def skip_tasks_to(self, uint64_t task):
        return fq_skip_tasks_to(&self.ring, task)

    def close(self):
        """Sets the closed flag and wakes every waiter in every process."""
        fq_close(&self.ring)

    def alert(self):
        """Wakes the consumer's READY wait with ALERT (sticky)."""
        fq_alert(&self.ring)

    @property
    def pass_(self):
        return fq_get_pass(&self.ring)

    def set_pass(self, uint32_t p):
        fq_set_pass(&self.ring, p)

    @property
    def control(self):
        return fq_control(&self.ring)

    def wait_control(self, uint32_t seen, double timeout):
        """Waits for a new pass or close; True if control moved or closed."""
        cdef int rc
        cdef int64_t t = WAIT_SLICE_NS
        if 0 <= timeout * 1e9 < WAIT_SLICE_NS:
            t = <int64_t>(timeout * 1e9)
        with nogil:
            rc = fq_wait_control(&self.ring, seen, t)
        if rc == FQ_EINTR:
            PyErr_CheckSignals()
            return False
        if rc == FQ_TIMEOUT:
            return False
        check(rc)
        return True

    # ------------------------------------------------------- worker table

    def set_worker_pid(self, uint32_t w, int pid):
        self._check_worker(w)
        fq_worker_set_pid(&self.ring, w, pid)

    def set_worker_task(self, uint32_t w, int64_t task):
        self._check_worker(w)
        fq_worker_set_task(&self.ring, w, task)

    def batch_done(self, uint32_t w, uint64_t busy_ns, uint64_t wait_ns):
        self._check_worker(w)
        fq_worker_done(&self.ring, w, busy_ns, wait_ns)

    def worker_stats(self, uint32_t w):
        """(task in hand or -1, batches, busy_ns, wait_ns, pid)."""
        self._check_worker(w)
        cdef fq_worker_stats s
        fq_worker_read(&self.ring, w, &s)
        return (s.task, s.batches, s.busy_ns, s.wait_ns, s.pid)

    cdef int _check_worker(self, uint32_t w) except -1:
        if w >= self.ring.ctrl.nworkers:
            raise IndexError(f"worker {w} out of range "
                             f"(ring has {self.ring.ctrl.nworkers})")
        return 0

    # -------------------------------------------------------------- slots

    def slot_view(self, uint32_t slot):
        """A writable buffer over the slot's data for a worker's writes."""
        self._check_slot(slot)
        cdef SlotView v = SlotView.__new__(SlotView)
        v._bind(self, slot)
        return v

    def lease(self, uint32_t slot):
        """Hands the slot's data to the consumer; when the lease is garbage
        (every view of it dropped, from any thread), the slot goes back on
        FREE."""
        self._check_slot(slot)
        cdef SlotLease v = SlotLease.__new__(SlotLease)
        v._bind(self, slot)
        self.leased += 1
        return v

    cdef void _release(self, uint32_t slot) noexcept:
        self.leased -= 1
        # A failed push means the ring was already broken by a dead worker;
        # the Prefetcher has reported that, and a dealloc must not raise.
        fq_push(&self.ring, FQ_FREE, slot)


cdef class SlotView:
    """Exports one slot's bytes through the buffer protocol and keeps the
    Ring (hence the mapping) alive while any array views it."""

    cdef readonly Ring ring
    cdef readonly uint32_t slot

    cdef _bind(self, Ring ring, uint32_t slot):
        self.ring = ring
        self.slot = slot

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self,
                          fq_slot_data(&self.ring.ring, self.slot),
                          <Py_ssize_t>self.ring.ring.ctrl.slot_bytes,
                          0, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __len__(self):
        return self.ring.ring.ctrl.slot_bytes


cdef class SlotLease(SlotView):
    """A slot on loan to the consumer; returns it when garbage-collected."""

    cdef bint released

    def release(self):
        """Returns the slot now. Only safe when no view of it is alive."""
        if not self.released:
            self.released = True
            self.ring._release(self.slot)

    def __dealloc__(self):
        if not self.released and self.ring is not None:
            self.released = True
            self.ring._release(self.slot)
