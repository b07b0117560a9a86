# The C layer's contract, as Cython sees it. fq_ring.h holds the protocol
# and the shared structs' layout (drawn, and pinned by static asserts);
# Cython takes the layout from there, so the structs below name, in the
# header's order, only the fields this layer reads or writes. Each shared
# field says who writes it and why it exists.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t


cdef extern from "fq_ring.h" nogil:
    ctypedef enum fq_status:
        FQ_OK          # success
        FQ_EMPTY       # try-pop found nothing
        FQ_TIMEOUT     # a bounded wait ran out of its slice
        FQ_CLOSED      # the ring was closed while waiting
        FQ_ALERT       # the consumer's death watcher raised the alert
        FQ_EINTR       # a signal interrupted the sleep
        FQ_EBUSY       # try-push met a stalled popper's cell; nothing pushed
        FQ_EINVAL      # bad argument
        FQ_EBADMAGIC   # the region does not hold a ring
        FQ_EVERSION    # the region was made by another version
        FQ_ESMALL      # the region is smaller than its geometry
        FQ_ESYS        # a system call failed (errno is set)

    ctypedef enum fq_queue_id:
        FQ_FREE        # slots the consumer returned; workers take them
        FQ_READY       # slots workers filled; the consumer takes them

    enum:
        FQ_ABORT_ON_CLOSE
        FQ_ABORT_ON_ALERT
        FQ_NO_SPIN     # fq_pop: sleep without spinning first
        FQ_MAX_SLOTS
        FQ_MAX_WORKERS

    ctypedef enum fq_owner_kind:
        FQ_OWNER_FREE      # on the FREE queue
        FQ_OWNER_WORKER    # taken from FREE by worker `who`
        FQ_OWNER_READY     # pushed on READY by worker `who`
        FQ_OWNER_CONSUMER  # taken from READY by the consumer

    uint32_t FQ_OWNER(uint32_t kind, uint32_t who)
    uint32_t FQ_OWNER_KIND(uint32_t owner)
    uint32_t FQ_OWNER_WHO(uint32_t owner)
    uint64_t FQ_NO_TASK

    ctypedef enum fq_fault_point:
        FQ_FAULT_NONE
        FQ_FAULT_PUSH_FREE   # consumer: between head CAS and cell release
        FQ_FAULT_PUSH_READY  # worker: between head CAS and cell release
        FQ_FAULT_POP_FREE    # worker: between tail CAS and cell release
        FQ_FAULT_POP_READY   # consumer: between tail CAS and cell release
        FQ_FAULT_CLAIM       # worker: between task fetch_add and its record

    ctypedef enum fq_slot_kind:
        FQ_SLOT_BATCH  # rows of batch data
        FQ_SLOT_ERROR  # an error report in the slot's data
        FQ_SLOT_END    # the worker's iterator ended its pass

    ctypedef struct fq_ctrl:
        uint32_t nslots        # fq_init: slots in the ring
        uint32_t nworkers      # fq_init: entries in the worker table
        uint64_t slot_bytes    # fq_init: usable bytes per slot
        uint64_t slot_stride   # fq_init: bytes between slot starts (pages)
        uint64_t headers_offset  # fq_init: where the slot headers start
        uint64_t data_offset   # fq_init: where slot 0 starts
        uint64_t region_bytes  # fq_init: bytes the layout needs
        uint64_t spin_ns       # fq_init: spin before sleeping in a pop

    ctypedef struct fq_slot_header:
        uint64_t task           # the worker's claim: task number (atomic)
        uint32_t owner          # each queue operation: census word (atomic)
        uint32_t pass_ "pass"   # the worker: pass of a callable source
        uint64_t rows           # the worker: batch rows written
        uint64_t payload_bytes  # the worker: bytes of an error report
        int32_t worker          # the worker: its id
        uint32_t kind           # the worker: fq_slot_kind
        uint32_t sample         # the worker: failing sample's position

    ctypedef struct fq_geometry:
        uint32_t nslots
        uint32_t nworkers
        uint64_t slot_bytes
        uint64_t page_size
        uint64_t spin_ns

    ctypedef struct fq_ring:
        fq_ctrl *ctrl               # the region's control block
        fq_slot_header *headers     # one per slot
        uint8_t *data               # slot 0's data

    uint64_t fq_layout(const fq_geometry *g, fq_ctrl *ctrl_out)
    int fq_init(void *base, uint64_t len, const fq_geometry *g, fq_ring *out)
    int fq_attach(void *base, uint64_t len, fq_ring *out)
    int fq_try_push(fq_ring *r, fq_queue_id q, uint32_t slot, uint32_t owner)
    int fq_push(fq_ring *r, fq_queue_id q, uint32_t slot, uint32_t owner,
                int64_t timeout_ns, unsigned abort)
    int fq_try_pop(fq_ring *r, fq_queue_id q, uint32_t *slot, uint32_t owner)
    int fq_pop(fq_ring *r, fq_queue_id q, uint32_t *slot, uint32_t owner,
               int64_t timeout_ns, unsigned abort)
    uint32_t fq_depth(const fq_ring *r, fq_queue_id q)
    uint64_t fq_claim_task(fq_ring *r, uint32_t slot)
    void fq_record_task(fq_ring *r, uint32_t slot, uint64_t task)
    int fq_queued(const fq_ring *r, fq_queue_id q, uint32_t i)
    uint64_t fq_next_task(const fq_ring *r)
    uint32_t fq_slot_owner(const fq_ring *r, uint32_t i)
    uint64_t fq_slot_task(const fq_ring *r, uint32_t i)
    uint64_t fq_skip_tasks_to(fq_ring *r, uint64_t task)
    void fq_close(fq_ring *r)
    int fq_is_closed(const fq_ring *r)
    void fq_alert(fq_ring *r)
    void fq_set_pass(fq_ring *r, uint32_t p)
    uint32_t fq_get_pass(const fq_ring *r)
    void fq_set_active(fq_ring *r, uint32_t active)
    uint32_t fq_active(const fq_ring *r)
    int fq_wait_control(fq_ring *r, uint32_t seen, int64_t timeout_ns)
    uint32_t fq_control(const fq_ring *r)
    void fq_set_planned(fq_ring *r, uint64_t planned)
    uint64_t fq_planned(const fq_ring *r)
    int fq_wait_planned(fq_ring *r, uint64_t task, int64_t timeout_ns)
    void fq_plan_begin_write(void *entry)
    void fq_plan_end_write(void *entry, uint64_t task)
    uint64_t fq_plan_task(const void *entry)
    uint64_t fq_plan_recheck(const void *entry)
    uint8_t *fq_slot_data(const fq_ring *r, uint32_t i)
    uint64_t fq_now_ns()

    ctypedef struct fq_worker_stats:
        uint64_t batches   # the worker: batches published
        uint64_t busy_ns   # the worker: time producing
        uint64_t wait_ns   # the worker: time waiting for a free slot
        int32_t pid        # the worker: its pid once started

    void fq_worker_set_pid(fq_ring *r, uint32_t w, int32_t pid)
    void fq_worker_done(fq_ring *r, uint32_t w, uint64_t busy_ns,
                         uint64_t wait_ns)
    void fq_worker_read(const fq_ring *r, uint32_t w, fq_worker_stats *out)
    void fq_set_fault(fq_fault_point point, uint32_t countdown, int signum)
