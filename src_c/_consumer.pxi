# The consumer's side of a Ring, process-local: the reorder window, the
# batch being handed out, leases and their releases. Included by _ring.pyx.
#
# Every slot the consumer pops is filed (window, pending or released) by
# compiled code before any Python code or signal handler can run, and the
# only way out of the consumer is a push on FREE that either completes or is
# kept for a retry. So no exception can lose a slot, and the shared census
# (header.owner == CONSUMER) always matches a local state here.

cdef extern from "<pthread.h>" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil,
                       void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

# Bumped in every child a fork makes (pthread_atfork: os.fork, a fork from
# C, multiprocessing's fork alike). A Consumer records the value of the
# process that made it; in any other process its leases are inert, so a
# forked child that drops an inherited batch cannot free the parent's slot.
cdef unsigned long _fork_generation = 0

cdef void _count_fork() noexcept nogil:
    global _fork_generation
    _fork_generation += 1

pthread_atfork(NULL, NULL, _count_fork)

# Local state of a slot in the consumer process.
DEF L_NONE = 0      # not the consumer's: in a queue or with a worker
DEF L_WINDOW = 1    # popped from READY, waiting for its turn
DEF L_PENDING = 2   # taken as the next batch, not handed out yet
DEF L_LEASED = 3    # handed out (or dropped): freed with its last lease
DEF L_DEFERRED = 4  # freed, but its FREE push waits for a stalled popper

# While releases are deferred, waits come back this often to retry them.
DEF DEFERRED_RETRY_NS = 1_000_000

LOCAL_NONE = L_NONE
LOCAL_WINDOW = L_WINDOW
LOCAL_PENDING = L_PENDING
LOCAL_LEASED = L_LEASED
LOCAL_DEFERRED = L_DEFERRED


@cython.no_gc_clear
cdef class Consumer:
    """The consumer process's side of a Ring.

    ``take`` moves the next batch among tasks [lo, hi) into ``pending``
    (ordered: task ``next_task``; unordered: the first to arrive); earlier
    tasks go back to FREE and later ones wait in the window. ``wait`` pops
    one slot, waiting without the GIL, and files it the same way. ``lease``
    gives SlotLeases over the pending slot; assigning ``pending = -1``
    hands it out (an attribute store: no signal handler can run between it
    and the caller's return). A method call is no such place: CPython runs
    signal handlers as a call returns, so a batch handed out inside a call
    would be lost with its return value; ``hand_out_ready`` leaves its batch
    pending too. A pending batch that was never handed out, because an
    exception interrupted the hand-out, is taken again by the next
    ``take``, and made again; what a hand-out counts (the stats, its
    worker's items, an unordered epoch's task) is counted once, when it
    happens. A slot goes back to FREE when it is no longer pending and
    its last lease is garbage.
    """

    cdef readonly Ring ring
    cdef uint8_t *state        # per slot: L_*
    cdef uint32_t *refs        # per slot: live SlotLeases
    cdef int32_t *by_task      # window: task & mask -> slot, or -1
    cdef uint32_t *deferred    # slots whose FREE push waits
    cdef uint64_t mask
    cdef uint32_t nslots
    cdef readonly uint32_t in_window  # slots in the window
    cdef readonly uint32_t held       # slots pending or leased
    cdef readonly uint32_t ndeferred  # slots whose release waits
    cdef int64_t _pending             # the pending slot, or -1
    # What the pending batch counts for when it is handed out, recorded
    # when it is made (the same again if it is made again): its bytes as
    # delivered (-1: not made), and whether it is an item of its worker's
    # stream.
    cdef int64_t _made_bytes
    cdef bint _made_item
    # Unordered epochs: the tasks of the epoch handed out (its cursor's
    # set, which a saved state reads), each joined by its hand-out; None
    # otherwise.
    cdef public set handed_tasks
    cdef public uint64_t next_task    # the task ordered mode hands out next
    cdef public uint32_t pass_        # callable sources: the current pass
    cdef readonly uint64_t handed     # batches handed out (or dropped)
    cdef readonly uint64_t ends       # end markers of the current pass seen
    cdef unsigned long fork_gen
    # Batches handed out (not dropped), their bytes, the ready batches
    # (READY and window) summed at each, and when the first went: stats.
    cdef readonly uint64_t delivered
    cdef readonly uint64_t delivered_bytes
    cdef readonly uint64_t occupancy
    cdef readonly int64_t t_first_ns  # CLOCK_MONOTONIC, as time.monotonic_ns
    # Stream sources: each worker's items handed out in the current pass
    # (batches, or rows of a sample stream with count_rows), for the state.
    cdef uint64_t *items
    cdef uint32_t nitems
    cdef public bint count_rows

    def __cinit__(self, Ring ring):
        cdef uint32_t n = ring.ring.ctrl.nslots
        cdef uint32_t cap = 1
        while cap < n:
            cap <<= 1
        self.ring = ring
        self.nslots = n
        self.mask = cap - 1
        self.state = <uint8_t *>malloc(n)
        self.refs = <uint32_t *>malloc(n * sizeof(uint32_t))
        self.by_task = <int32_t *>malloc(cap * sizeof(int32_t))
        self.deferred = <uint32_t *>malloc(n * sizeof(uint32_t))
        self.nitems = ring.ring.ctrl.nworkers
        self.items = <uint64_t *>calloc(self.nitems or 1, sizeof(uint64_t))
        if (self.state == NULL or self.refs == NULL or self.by_task == NULL
                or self.deferred == NULL or self.items == NULL):
            raise MemoryError()
        cdef uint32_t i
        for i in range(n):
            self.state[i] = L_NONE
            self.refs[i] = 0
        for i in range(cap):
            self.by_task[i] = -1
        self._pending = -1
        self._made_bytes = -1
        self.fork_gen = _fork_generation

    def __dealloc__(self):
        free(self.state)
        free(self.refs)
        free(self.by_task)
        free(self.deferred)
        free(self.items)

    # ------------------------------------------------------------ taking

    def take(self, uint64_t lo, uint64_t hi, bint ordered):
        """True when a batch is pending (taken now, or left pending by an
        interrupted hand-out); False if it has not arrived yet."""
        return self._take(lo, hi, ordered)

    cdef bint _take(self, uint64_t lo, uint64_t hi, bint ordered) except -1:
        cdef uint32_t s
        cdef int32_t w
        cdef uint64_t t
        if self._pending >= 0:
            return True
        if self.ndeferred:
            self._flush_deferred()
        if self.in_window:
            if ordered:
                w = self.by_task[self.next_task & self.mask]
                if w >= 0:
                    t = fq_slot_task(&self.ring.ring, <uint32_t>w)
                    if t == self.next_task and lo <= t < hi:
                        self._unwindow(<uint32_t>w, t)
                        self._make_pending(<uint32_t>w, t)
                        return True
            else:
                # Only around an epoch's end does the window hold anything
                # in unordered mode, so this scan is off the steady path.
                for s in range(self.nslots):
                    if self.state[s] == L_WINDOW:
                        t = fq_slot_task(&self.ring.ring, s)
                        if lo <= t < hi:
                            self._unwindow(s, t)
                            self._make_pending(s, t)
                            return True
        while fq_try_pop(&self.ring.ring, FQ_READY, &s,
                         FQ_OWNER(FQ_OWNER_CONSUMER, 0)) == FQ_OK:
            if self._file(s, lo, hi, ordered):
                return True
        return False

    def wait(self, uint64_t lo, uint64_t hi, bint ordered, double timeout,
             bint spin=True):
        """Waits (without the GIL) at most `timeout` seconds, capped at one
        slice, for a slot on READY and files it: 0, or TIMEOUT (also after
        a signal, whose handler has run), CLOSED or ALERT. Signal handlers
        run only while no slot is in hand."""
        cdef Wait w = queue_wait(&self.ring.ring, FQ_READY, 0,
                                 FQ_OWNER(FQ_OWNER_CONSUMER, 0),
                                 FQ_ABORT_ON_CLOSE | FQ_ABORT_ON_ALERT)
        if not spin:
            w.abort |= FQ_NO_SPIN
        cdef int rc = wait_in_slices(
            _pop_slice, &w, timeout,
            DEFERRED_RETRY_NS if self.ndeferred else WAIT_SLICE_NS, True)
        if rc == FQ_OK:
            self._file(w.slot, lo, hi, ordered)
            return 0
        return -rc

    cdef bint _file(self, uint32_t s, uint64_t lo, uint64_t hi,
                    bint ordered) except -1:
        """Files a slot just popped from READY: released if its task is
        behind us, pending if it is the one wanted, else in the window."""
        cdef uint64_t t = fq_slot_task(&self.ring.ring, s)
        cdef uint64_t j
        if t < lo or (ordered and t < self.next_task):
            self._free(s)
            return False
        if (not ordered or t == self.next_task) and t < hi:
            self._make_pending(s, t)
            return True
        j = t & self.mask
        if self.by_task[j] >= 0:
            # At most nslots tasks are in flight past the oldest one the
            # window can hold, so two of them cannot share a position.
            self.state[s] = L_WINDOW
            self.in_window += 1
            raise RingError(
                f"slots {self.by_task[j]} and {s} both claim window position "
                f"{j} (task {t}): the ring protocol was broken")
        self.by_task[j] = <int32_t>s
        self.state[s] = L_WINDOW
        self.in_window += 1
        return False

    cdef void _unwindow(self, uint32_t s, uint64_t t) noexcept:
        self.by_task[t & self.mask] = -1
        self.in_window -= 1

    cdef void _make_pending(self, uint32_t s, uint64_t t) noexcept:
        self.state[s] = L_PENDING
        self.held += 1
        self._pending = s
        self._made_bytes = -1
        self._made_item = False
        self.next_task = t + 1

    def drop_below(self, uint64_t task):
        """Frees the window's slots of tasks before `task` (an abandoned
        epoch)."""
        cdef uint32_t s
        cdef uint64_t t
        for s in range(self.nslots):
            if self.state[s] == L_WINDOW:
                t = fq_slot_task(&self.ring.ring, s)
                if t < task:
                    self._unwindow(s, t)
                    self._free(s)

    # ---------------------------------------------------------- handing out

    @property
    def pending(self):
        """The slot taken as the next batch and not handed out yet, or -1.
        Assign -1 once it is handed out (or to drop it)."""
        return self._pending

    @pending.setter
    def pending(self, int64_t value):
        if value != -1:
            raise ValueError("pending can only be set to -1 (handed out)")
        self._hand_out_pending()

    cdef void _hand_out_pending(self) noexcept:
        cdef int64_t s = self._pending
        if s < 0:
            return
        cdef fq_slot_header *h = &self.ring.ring.headers[s]
        # Counted here, in the same attribute store that hands the batch
        # out, so that progress and hand-out cannot be split by a signal.
        self.handed += 1
        if h.kind == FQ_SLOT_END and h.pass_ == self.pass_:
            self.ends += 1
        if self._made_bytes >= 0:
            self._count_delivery(<uint64_t>self._made_bytes)
        if self.handed_tasks is not None:
            self.handed_tasks.add(fq_slot_task(&self.ring.ring, <uint32_t>s))
        # An abandoned pass's batch, made before an interrupt and dropped
        # now, is no item of this one.
        if (self._made_item and h.pass_ == self.pass_
                and <uint32_t>h.worker < self.nitems):
            self.items[h.worker] += h.rows if self.count_rows else 1
        self._made_bytes = -1
        self._made_item = False
        self._pending = -1
        self.state[s] = L_LEASED
        if self.refs[s] == 0:
            self.held -= 1
            self._free(<uint32_t>s)

    def lease(self):
        """A SlotLease over the pending slot; its header fields come with
        it. The slot stays the consumer's while any lease of it lives."""
        return self._lease()

    cdef SlotLease _lease(self):
        if self._pending < 0:
            raise RingError("no batch is pending")
        cdef uint32_t s = <uint32_t>self._pending
        cdef SlotLease v = SlotLease.__new__(SlotLease)
        cdef fq_slot_header *h = &self.ring.ring.headers[s]
        v.consumer = self
        v.slot = s
        v.task = fq_slot_task(&self.ring.ring, s)
        v.kind = h.kind
        v.rows = h.rows
        v.pass_ = h.pass_
        v.worker = h.worker
        v.sample = h.sample
        v.payload_bytes = h.payload_bytes
        self.refs[s] += 1
        return v

    def hand_out_ready(self, uint64_t lo, uint64_t hi, bint ordered,
                       BatchViews views, bint this_pass, frozenset skip=None):
        """The next batch among tasks [lo, hi), taken and made by ``views``
        in one compiled call, when it is already here and is a batch (of
        the current pass, with ``this_pass``; not in ``skip``); else None,
        with whatever was taken left pending for the full path (which
        waits, and raises errors, counts end markers and drops stale
        batches). The batch stays pending:
        the caller hands it out (``pending = -1``) and returns it, so that
        an interrupt raised as this call returns leaves it to be made
        again, not lost."""
        if not self._take(lo, hi, ordered):
            return None
        cdef uint32_t s = <uint32_t>self._pending
        cdef fq_slot_header *h = &self.ring.ring.headers[s]
        cdef uint64_t task = fq_slot_task(&self.ring.ring, s)
        if h.kind != FQ_SLOT_BATCH or (this_pass and h.pass_ != self.pass_):
            return None
        if skip and task in skip:
            return None
        cdef SlotLease lease = self._lease()
        batch = views.make(lease, fq_slot_data(&self.ring.ring, s),
                           <cnp.npy_intp>h.rows)
        self._made_bytes = <int64_t>(h.rows * views.row_bytes)
        self._made_item = True
        return batch

    def count_delivery(self, uint64_t nbytes):
        """The pending batch, which the full path has made, counts as
        delivered (``nbytes``; stats) when it is handed out."""
        if self._pending >= 0:
            self._made_bytes = <int64_t>nbytes

    cdef void _count_delivery(self, uint64_t nbytes) noexcept:
        cdef timespec now
        if self.delivered == 0:
            clock_gettime(CLOCK_MONOTONIC, &now)
            self.t_first_ns = now.tv_sec * 1_000_000_000 + now.tv_nsec
        self.delivered += 1
        self.delivered_bytes += nbytes
        self.occupancy += fq_depth(&self.ring.ring, FQ_READY) + self.in_window

    @property
    def items(self):
        """Each worker's items handed out in the current pass (a list)."""
        return [self.items[i] for i in range(self.nitems)]

    @items.setter
    def items(self, values):
        if len(values) != self.nitems:
            raise ValueError(f"{len(values)} counts for {self.nitems} workers")
        cdef uint32_t i
        for i in range(self.nitems):
            self.items[i] = values[i]

    def count_item(self):
        """The pending batch counts as an item of its worker's stream (a
        batch, or its rows) when the full path hands it out."""
        if self._pending >= 0:
            self._made_item = True

    cdef void _drop_ref(self, uint32_t s) noexcept:
        if self.fork_gen != _fork_generation:
            return  # an inherited copy in a forked child: not ours to free
        self.refs[s] -= 1
        if self.refs[s] == 0 and self.state[s] == L_LEASED:
            self.held -= 1
            self._free(s)

    # ------------------------------------------------------------ freeing

    cdef void _free(self, uint32_t s) noexcept:
        """Pushes s on FREE; past a popper stalled inside its pop, keeps it
        for a retry instead (never waits here: this runs in finalizers, with
        the GIL)."""
        if fq_try_push(&self.ring.ring, FQ_FREE, s,
                       FQ_OWNER(FQ_OWNER_FREE, 0)) == FQ_OK:
            self.state[s] = L_NONE
        else:
            self.state[s] = L_DEFERRED
            self.deferred[self.ndeferred] = s
            self.ndeferred += 1

    cdef void _flush_deferred(self) noexcept:
        cdef uint32_t i, s, kept = 0
        for i in range(self.ndeferred):
            s = self.deferred[i]
            if fq_try_push(&self.ring.ring, FQ_FREE, s,
                           FQ_OWNER(FQ_OWNER_FREE, 0)) == FQ_OK:
                self.state[s] = L_NONE
            else:
                self.deferred[kept] = s
                kept += 1
        self.ndeferred = kept

    # ------------------------------------------------------------- census

    def local_states(self):
        """This process's state of every slot (LOCAL_*), as bytes."""
        return bytes([self.state[i] for i in range(self.nslots)])

    def audit(self):
        """Checks the shared census against this process's states: (slots
        the census gives the consumer, first slot where the two disagree or
        -1). Run before the consumer sleeps: O(nslots), no allocation."""
        cdef uint32_t s, kind
        cdef uint32_t mine = 0
        cdef int64_t odd = -1
        for s in range(self.nslots):
            kind = FQ_OWNER_KIND(fq_slot_owner(&self.ring.ring, s))
            if kind == FQ_OWNER_CONSUMER:
                mine += 1
                if self.state[s] == L_NONE and odd < 0:
                    odd = s
            elif self.state[s] != L_NONE and odd < 0:
                odd = s
        return mine, odd


@cython.no_gc_clear
cdef class SlotLease:
    """A handed-out slot: exports its bytes through the buffer protocol,
    carries its header, and keeps the slot the consumer's while it lives.
    (no_gc_clear: in a reference cycle it still reaches its Consumer when
    the collector frees it, so the slot returns.)"""

    cdef readonly Consumer consumer
    cdef readonly uint32_t slot
    cdef readonly uint64_t task
    cdef readonly uint32_t kind
    cdef readonly uint64_t rows
    cdef readonly uint32_t pass_
    cdef readonly int32_t worker
    cdef readonly uint32_t sample
    cdef readonly uint64_t payload_bytes
    cdef bint released

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self,
                          fq_slot_data(&self.consumer.ring.ring, self.slot),
                          <Py_ssize_t>self.consumer.ring.ring.ctrl.slot_bytes,
                          0, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __len__(self):
        return self.consumer.ring.ring.ctrl.slot_bytes

    def release(self):
        """Lets the slot go now rather than when this lease is garbage.
        Only safe when no view of it is alive (copy=True)."""
        if not self.released and self.consumer is not None:
            self.released = True
            self.consumer._drop_ref(self.slot)

    def __dealloc__(self):
        if not self.released and self.consumer is not None:
            self.released = True
            self.consumer._drop_ref(self.slot)
