# cython: language_level=3, embedsignature=True
"""Thin Cython layer over fq_ring: a Ring over a mapping (the queues, the
worker's side, the census), and the consumer's side in _consumer.pxi."""

cimport cython
from cpython.buffer cimport (
    PyBUF_WRITABLE,
    PyBuffer_FillInfo,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.exc cimport PyErr_CheckSignals, PyErr_SetFromErrno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from fq_ring cimport *

from fastq.errors import RingError

# Every blocking call sleeps at most this long before coming back for the
# GIL (NOTE [ Waiting in slices ]).
DEF WAIT_SLICE_NS = 100_000_000

FREE = FQ_FREE
READY = FQ_READY
SLOT_BATCH = FQ_SLOT_BATCH
SLOT_ERROR = FQ_SLOT_ERROR
SLOT_END = FQ_SLOT_END
# Negative results of the pop and wait methods: why no slot came back.
TIMEOUT = -FQ_TIMEOUT
CLOSED = -FQ_CLOSED
ALERT = -FQ_ALERT
MAX_SLOTS = FQ_MAX_SLOTS
MAX_WORKERS = FQ_MAX_WORKERS
# Census kinds (Ring.census): where each slot is.
OWNER_FREE = FQ_OWNER_FREE
OWNER_WORKER = FQ_OWNER_WORKER
OWNER_READY = FQ_OWNER_READY
OWNER_CONSUMER = FQ_OWNER_CONSUMER
NO_TASK = FQ_NO_TASK

_FAULT_POINTS = {
    "push_free": FQ_FAULT_PUSH_FREE,
    "push_ready": FQ_FAULT_PUSH_READY,
    "pop_free": FQ_FAULT_POP_FREE,
    "pop_ready": FQ_FAULT_POP_READY,
    "claim": FQ_FAULT_CLAIM,
}


cdef int check(int rc) except -1:
    """The one place where C status codes become exceptions."""
    if rc >= 0:
        return rc
    if rc == FQ_EINVAL:
        raise ValueError("invalid ring geometry or argument")
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


# NOTE [ Waiting in slices ]
# Every blocking call runs through wait_in_slices: it drops the GIL, sleeps
# in C for at most one slice (WAIT_SLICE_NS, or less: the time its timeout
# has left, or a caller's shorter bound), then takes the GIL back to run
# signal handlers (PyErr_CheckSignals, as CPython's semlock_acquire does
# after EINTR), so that Ctrl+C raises from inside the wait. A slice ended
# by a signal (FQ_EINTR) or by its time (FQ_TIMEOUT) is not an answer: a
# call that loops sleeps again until the C wait answers or its deadline
# has passed; a call of one slice answers FQ_TIMEOUT, so that its Python
# caller can look at the workers' liveness and its own deadline before it
# waits again. Signal handlers never run once the C wait has answered: a
# popped slot is then in hand, and must be filed before Python code runs.

# The arguments of one C wait, which a slice call passes on.
cdef struct Wait:
    fq_ring *ring
    fq_queue_id queue  # pops and pushes: which queue
    uint32_t slot      # pops: the slot taken; pushes: the slot to push
    uint32_t owner     # pops and pushes: the census word to record
    unsigned abort     # pops and pushes: FQ_ABORT_* and FQ_NO_SPIN
    uint64_t word      # fq_wait_planned: the task; fq_wait_control: seen

cdef inline Wait queue_wait(fq_ring *ring, fq_queue_id queue, uint32_t slot,
                            uint32_t owner, unsigned abort) noexcept:
    return Wait(ring=ring, queue=queue, slot=slot, owner=owner, abort=abort,
                word=0)

cdef inline Wait word_wait(fq_ring *ring, uint64_t word) noexcept:
    return Wait(ring=ring, queue=FQ_FREE, slot=0, owner=0, abort=0, word=word)

# One slice of a C wait, at most slice_ns long, without the GIL.
ctypedef int (*slice_call)(Wait *w, int64_t slice_ns) noexcept nogil

cdef int _pop_slice(Wait *w, int64_t slice_ns) noexcept nogil:
    return fq_pop(w.ring, w.queue, &w.slot, w.owner, slice_ns, w.abort)

cdef int _push_slice(Wait *w, int64_t slice_ns) noexcept nogil:
    return fq_push(w.ring, w.queue, w.slot, w.owner, slice_ns, w.abort)

cdef int _planned_slice(Wait *w, int64_t slice_ns) noexcept nogil:
    return fq_wait_planned(w.ring, w.word, slice_ns)

cdef int _control_slice(Wait *w, int64_t slice_ns) noexcept nogil:
    return fq_wait_control(w.ring, <uint32_t>w.word, slice_ns)


cdef inline int wait_in_slices(slice_call call, Wait *w, double timeout,
                               int64_t max_slice_ns, bint one_slice) except -1:
    """Runs `call` in slices of at most max_slice_ns (NOTE [ Waiting in
    slices ]) until it answers, or `timeout` seconds (< 0: no limit) have
    passed, or after one slice with `one_slice`. Returns its answer (an
    error raised through check) or FQ_TIMEOUT; raises what a signal handler
    raises."""
    cdef int rc
    cdef int64_t slice_ns = max_slice_ns
    cdef uint64_t now, deadline = 0
    if timeout >= 0:
        if timeout * 1e9 < slice_ns:
            slice_ns = <int64_t>(timeout * 1e9)
        if not one_slice:
            deadline = fq_now_ns() + <uint64_t>(timeout * 1e9)
    while True:
        with nogil:
            rc = call(w, slice_ns)
        if rc != FQ_EINTR and rc != FQ_TIMEOUT:
            return check(rc)
        PyErr_CheckSignals()
        if one_slice:
            return FQ_TIMEOUT
        if timeout >= 0:
            now = fq_now_ns()
            if now >= deadline:
                if rc == FQ_TIMEOUT:
                    return FQ_TIMEOUT
                slice_ns = 0
            elif deadline - now < <uint64_t>max_slice_ns:
                slice_ns = <int64_t>(deadline - now)
            else:
                slice_ns = max_slice_ns


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


def inject_fault(str point, uint32_t countdown, int signum):
    """Tests only: this process raises `signum` the `countdown`-th time it
    reaches `point` of a queue operation ("push_free", "push_ready",
    "pop_free", "pop_ready": between the CAS and the cell release;
    "claim": between the task's fetch_add and its record). "none" disarms."""
    if point == "none":
        fq_set_fault(FQ_FAULT_NONE, 0, 0)
        return
    if point not in _FAULT_POINTS:
        raise ValueError(f"point={point!r}: expected one of "
                         f"{sorted(_FAULT_POINTS)} or 'none'")
    fq_set_fault(<fq_fault_point>_FAULT_POINTS[point], countdown, signum)


@cython.no_gc_clear
cdef class Ring:
    """A ring inside a writable buffer (an mmap) shared between processes.

    The Ring keeps the buffer exported for its whole life, so the mapping
    cannot be closed under it; views, leases and the Consumer keep the Ring
    alive. (no_gc_clear: a lease in a reference cycle still reaches the
    ring through its Consumer when it is finally freed.)
    """

    cdef fq_ring ring
    cdef Py_buffer buf
    cdef bint have_buf
    cdef readonly object owner

    def __cinit__(self):
        self.have_buf = False

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

    # ------------------------------------------------------ worker's side

    def pop_free(self, uint32_t worker, double timeout=-1.0):
        """Worker `worker` takes a slot: its index, or CLOSED / TIMEOUT."""
        self._check_worker(worker)
        cdef Wait w = queue_wait(&self.ring, FQ_FREE, 0,
                                 FQ_OWNER(FQ_OWNER_WORKER, worker),
                                 FQ_ABORT_ON_CLOSE)
        cdef int rc = wait_in_slices(_pop_slice, &w, timeout, WAIT_SLICE_NS,
                                     False)
        if rc == FQ_OK:
            return <int>w.slot
        return -rc

    def claim_task(self, uint32_t slot):
        """The next task number, recorded in the census of `slot` (which
        the caller holds)."""
        self._check_slot(slot)
        return fq_claim_task(&self.ring, slot)

    def record_task(self, uint32_t slot, uint64_t task):
        """Records `task` (a turn's, granted before the slot was taken) in
        the census of `slot`, which the caller holds."""
        self._check_slot(slot)
        fq_record_task(&self.ring, slot, task)

    # ------------------------------------------------------- planned tasks

    @property
    def planned(self):
        """Tasks below this number have a plan (planned sources), or are
        granted (turns)."""
        return fq_planned(&self.ring)

    def set_planned(self, uint64_t planned):
        """Raises the planned count and wakes workers waiting for a plan."""
        fq_set_planned(&self.ring, planned)

    def wait_planned(self, uint64_t task):
        """A worker waits until `task` is planned: True, or False once the
        ring is closed. Slices of WAIT_SLICE_NS let signals through."""
        cdef Wait w = word_wait(&self.ring, task)
        return wait_in_slices(_planned_slice, &w, -1.0, WAIT_SLICE_NS,
                              False) == FQ_OK

    cdef void *_plan_entry(self, uint64_t offset, uint64_t nbytes) except NULL:
        if offset % 8 or offset + nbytes > <uint64_t>self.buf.len:
            raise ValueError(f"plan entry at {offset} lies outside the region")
        return <void *>(<char *>self.buf.buf + offset)

    def plan_begin_write(self, uint64_t offset):
        """Seqlock of the plan entry at `offset`: clears its task word."""
        fq_plan_begin_write(self._plan_entry(offset, 8))

    def plan_end_write(self, uint64_t offset, uint64_t task):
        """Publishes the entry for `task` (release)."""
        fq_plan_end_write(self._plan_entry(offset, 8), task)

    def plan_task(self, uint64_t offset):
        """The entry's task word (acquire); NO_TASK while being written."""
        return fq_plan_task(self._plan_entry(offset, 8))

    def plan_recheck(self, uint64_t offset):
        """The entry's task word again, after the caller copied its data."""
        return fq_plan_recheck(self._plan_entry(offset, 8))

    def publish(self, uint32_t slot, uint32_t kind, uint64_t rows,
                uint32_t pass_, uint32_t worker, uint32_t sample=0,
                uint64_t payload_bytes=0):
        """A worker fills the slot's header and pushes it on READY. True,
        or False if the ring closed while a stalled consumer pop held the
        cell (the wait runs without the GIL, in slices)."""
        self._check_slot(slot)
        self._check_worker(worker)
        cdef fq_slot_header *h = &self.ring.headers[slot]
        h.kind = kind
        h.rows = rows
        h.pass_ = pass_
        h.worker = <int32_t>worker
        h.sample = sample
        h.payload_bytes = payload_bytes
        cdef uint32_t owner = FQ_OWNER(FQ_OWNER_READY, worker)
        if fq_try_push(&self.ring, FQ_READY, slot, owner) == FQ_OK:
            return True
        cdef Wait w = queue_wait(&self.ring, FQ_READY, slot, owner,
                                 FQ_ABORT_ON_CLOSE)
        return wait_in_slices(_push_slice, &w, -1.0, WAIT_SLICE_NS,
                              False) != FQ_CLOSED

    def slot_view(self, uint32_t slot):
        """A writable buffer over the slot's data for a worker's writes."""
        self._check_slot(slot)
        cdef SlotView v = SlotView.__new__(SlotView)
        v._bind(self, slot)
        return v

    # ------------------------------------------------------------- census

    def census(self):
        """Where every slot is: a list of (owner kind, worker id, task),
        task NO_TASK where none is recorded. A relaxed snapshot: exact for
        the slots the calling process holds."""
        cdef uint32_t i, o
        out = []
        for i in range(self.ring.ctrl.nslots):
            o = fq_slot_owner(&self.ring, i)
            out.append((FQ_OWNER_KIND(o), FQ_OWNER_WHO(o),
                        fq_slot_task(&self.ring, i)))
        return out

    def queued(self, int queue, uint32_t slot):
        """Whether `slot` sits published in FREE or READY (diagnostics)."""
        self._check_slot(slot)
        return fq_queued(&self.ring, FQ_READY if queue == FQ_READY else FQ_FREE,
                         slot) != 0

    @property
    def headers_offset(self):
        """Where the slot headers start in the region (one cache line
        each; see fq_ring.h)."""
        return self.ring.ctrl.headers_offset

    @property
    def next_task(self):
        """The task number the next claim gets (a snapshot)."""
        return fq_next_task(&self.ring)

    def depth(self, int queue):
        """Items in FREE or READY right now (a snapshot)."""
        return fq_depth(&self.ring, FQ_READY if queue == FQ_READY else FQ_FREE)

    cdef int _check_slot(self, uint32_t slot) except -1:
        if slot >= self.ring.ctrl.nslots:
            raise IndexError(f"slot {slot} out of range "
                             f"(ring has {self.ring.ctrl.nslots})")
        return 0

    # ---------------------------------------------------- tasks and flags

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
    def active(self):
        """Workers numbered below it take slots; the others are parked."""
        return fq_active(&self.ring)

    def set_active(self, uint32_t n):
        """Parks workers numbered n and above (n is kept in 1..nworkers),
        and wakes every parked worker to look again."""
        fq_set_active(&self.ring, n)

    @property
    def control(self):
        return fq_control(&self.ring)

    def wait_control(self, uint32_t seen, double timeout):
        """Waits for a new pass or close, one slice at most; True if control
        moved or closed."""
        cdef Wait w = word_wait(&self.ring, seen)
        return wait_in_slices(_control_slice, &w, timeout, WAIT_SLICE_NS,
                              True) != FQ_TIMEOUT

    # ------------------------------------------------------- worker table

    def set_worker_pid(self, uint32_t w, int pid):
        self._check_worker(w)
        fq_worker_set_pid(&self.ring, w, pid)

    def batch_done(self, uint32_t w, uint64_t busy_ns, uint64_t wait_ns):
        self._check_worker(w)
        fq_worker_done(&self.ring, w, busy_ns, wait_ns)

    def worker_stats(self, uint32_t w):
        """(batches, busy_ns, wait_ns, pid)."""
        self._check_worker(w)
        cdef fq_worker_stats s
        fq_worker_read(&self.ring, w, &s)
        return (s.batches, s.busy_ns, s.wait_ns, s.pid)

    cdef int _check_worker(self, uint32_t w) except -1:
        if w >= self.ring.ctrl.nworkers:
            raise IndexError(f"worker {w} out of range "
                             f"(ring has {self.ring.ctrl.nworkers})")
        return 0


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


include "_views.pxi"
include "_consumer.pxi"
