/* fq_ring: implementation of the protocol documented in fq_ring.h: the
 * region's layout, the two queues and task claims. The control block's
 * flags are in fq_flags.c; how waiters sleep, in fq_wait.h. */
#define _GNU_SOURCE
#include "fq_ring.h"

#include "fq_wait.h"

#include <sched.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define fq_cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define fq_cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define fq_cpu_relax() ((void)0)
#endif

/* Cross-process atomics must not fall back to a lock inside one process's
 * address space (libatomic's lock table): the other processes would not
 * see it. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
_Static_assert(ATOMIC_LONG_LOCK_FREE == 2 || sizeof(long) < 8,
               "64-bit atomics must be lock-free");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

/* ---------------------------------------------------------------- helpers */

/* x rounded up to a multiple of align (a power of two); 0 if that does not
 * fit in 64 bits. */
static uint64_t round_up(uint64_t x, uint64_t align) {
    if (x > UINT64_MAX - (align - 1)) return 0;
    return (x + align - 1) & ~(align - 1);
}

static uint32_t next_pow2(uint32_t x) {
    uint32_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

uint64_t fq_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ----------------------------------------------------------------- layout */

uint64_t fq_layout(const fq_geometry *g, fq_ctrl *c) {
    if (g->nslots == 0 || g->nslots > FQ_MAX_SLOTS || g->nworkers == 0 ||
        g->nworkers > FQ_MAX_WORKERS || g->slot_bytes == 0 ||
        g->page_size == 0 || (g->page_size & (g->page_size - 1)) != 0 ||
        g->page_size < FQ_CACHE_LINE)
        return 0;
    /* The control part is bounded by FQ_MAX_SLOTS and FQ_MAX_WORKERS (tens
     * of megabytes), so only the data part can overflow. */
    uint32_t capacity = next_pow2(g->nslots);
    uint64_t cells = round_up(sizeof(fq_ctrl), FQ_CACHE_LINE);
    uint64_t headers =
        round_up(cells + 2ull * capacity * sizeof(fq_cell), FQ_CACHE_LINE);
    uint64_t workers =
        round_up(headers + (uint64_t)g->nslots * sizeof(fq_slot_header),
                 FQ_CACHE_LINE);
    uint64_t data =
        round_up(workers + (uint64_t)g->nworkers * sizeof(fq_worker_entry),
                 g->page_size);
    uint64_t stride = round_up(g->slot_bytes, g->page_size);
    if (stride == 0 || stride > (UINT64_MAX - data) / g->nslots) return 0;
    uint64_t total = data + stride * g->nslots;
    if (c) {
        c->nslots = g->nslots;
        c->nworkers = g->nworkers;
        c->capacity = capacity;
        c->slot_bytes = g->slot_bytes;
        c->slot_stride = stride;
        c->cells_offset = cells;
        c->headers_offset = headers;
        c->workers_offset = workers;
        c->data_offset = data;
        c->region_bytes = total;
        c->spin_ns = g->spin_ns;
    }
    return total;
}

static void bind(void *base, fq_ring *r) {
    uint8_t *b = (uint8_t *)base;
    fq_ctrl *c = (fq_ctrl *)base;
    r->ctrl = c;
    r->cells[FQ_FREE] = (fq_cell *)(b + c->cells_offset);
    r->cells[FQ_READY] = r->cells[FQ_FREE] + c->capacity;
    r->headers = (fq_slot_header *)(b + c->headers_offset);
    r->workers = (fq_worker_entry *)(b + c->workers_offset);
    r->data = b + c->data_offset;
}

int fq_init(void *base, uint64_t len, const fq_geometry *g, fq_ring *out) {
    if (base == NULL || out == NULL || g == NULL) return FQ_EINVAL;
    fq_ctrl layout;
    memset(&layout, 0, sizeof layout);
    uint64_t need = fq_layout(g, &layout);
    if (need == 0) return FQ_EINVAL;
    if (len < need) return FQ_ESMALL;
    fq_ctrl *c = (fq_ctrl *)base;
    /* The region is fresh and private to this process until workers start,
     * so plain initialisation is enough; process creation orders it. */
    memcpy(c, &layout, sizeof layout);
    c->magic = FQ_MAGIC;
    c->version = FQ_VERSION;
    bind(base, out);
    for (int q = 0; q < 2; q++) {
        for (uint32_t i = 0; i < c->capacity; i++)
            atomic_init(&out->cells[q][i].seq, i);
        atomic_init(&c->queues[q].head, 0);
        atomic_init(&c->queues[q].tail, 0);
        atomic_init(&c->queues[q].wake_seq, 0);
        atomic_init(&c->queues[q].waiters, 0);
    }
    for (uint32_t w = 0; w < c->nworkers; w++) {
        atomic_init(&out->workers[w].batches, 0);
        atomic_init(&out->workers[w].busy_ns, 0);
        atomic_init(&out->workers[w].wait_ns, 0);
        atomic_init(&out->workers[w].pid, 0);
    }
    atomic_init(&c->closed, 0);
    atomic_init(&c->alert, 0);
    atomic_init(&c->control, 0);
    atomic_init(&c->pass, 0);
    atomic_init(&c->plan_waiters, 0);
    atomic_init(&c->active, c->nworkers);
    atomic_init(&c->planned, 0);
    atomic_init(&c->next_task, 0);
    for (uint32_t s = 0; s < c->nslots; s++) {
        atomic_init(&out->headers[s].task, FQ_NO_TASK);
        atomic_init(&out->headers[s].owner, FQ_OWNER(FQ_OWNER_FREE, 0));
        /* Cannot be busy: no popper exists yet. */
        int rc = fq_try_push(out, FQ_FREE, s, FQ_OWNER(FQ_OWNER_FREE, 0));
        if (rc != FQ_OK) return FQ_EINVAL;
    }
    return FQ_OK;
}

int fq_attach(void *base, uint64_t len, fq_ring *out) {
    if (base == NULL || out == NULL || len < sizeof(fq_ctrl)) return FQ_ESMALL;
    fq_ctrl *c = (fq_ctrl *)base;
    if (c->magic != FQ_MAGIC) return FQ_EBADMAGIC;
    if (c->version != FQ_VERSION) return FQ_EVERSION;
    if (c->region_bytes > len) return FQ_ESMALL;
    bind(base, out);
    return FQ_OK;
}

/* --------------------------------------------------------- fault points */

/* Process-local: each process arms its own (tests only). */
static _Atomic int fault_point = FQ_FAULT_NONE;
static _Atomic uint32_t fault_countdown;
static int fault_signal;

void fq_set_fault(fq_fault_point point, uint32_t countdown, int signum) {
    fault_signal = signum;
    atomic_store(&fault_countdown, countdown ? countdown : 1);
    atomic_store(&fault_point, (int)point);
}

static void fault_check(int point) {
    /* relaxed: a test arms it before the operations it aims at. */
    if (__builtin_expect(atomic_load_explicit(&fault_point,
                                              memory_order_relaxed) != point,
                         1))
        return;
    if (atomic_fetch_sub(&fault_countdown, 1) != 1) return;
    atomic_store(&fault_point, FQ_FAULT_NONE);
    raise(fault_signal);
}

static const int push_fault[2] = {FQ_FAULT_PUSH_FREE, FQ_FAULT_PUSH_READY};
static const int pop_fault[2] = {FQ_FAULT_POP_FREE, FQ_FAULT_POP_READY};

/* ----------------------------------------------------------------- queues */

/* One try at claiming queue q's next enqueue cell. FQ_OK: *cell_out is
 * ours at position *pos_out. FQ_EBUSY: the cell still holds the previous
 * lap's item, claimed by a popper (tail CAS) that has not released it yet.
 * With only nslots <= capacity indices in existence the queue cannot be
 * full, so that is the only way to find such a cell; the cell's acquire
 * load is exact where a tail read could be stale. */
static int claim_push_cell(fq_ring *r, fq_queue_id qid, fq_cell **cell_out,
                           uint64_t *pos_out) {
    fq_queue *q = &r->ctrl->queues[qid];
    fq_cell *cells = r->cells[qid];
    uint64_t mask = r->ctrl->capacity - 1;
    uint64_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
    for (;;) {
        fq_cell *cell = &cells[pos & mask];
        /* acquire: the popper of this cell's previous round is done with it
         * before we overwrite cell->slot. */
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - pos);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(
                    &q->head, &pos, pos + 1, memory_order_relaxed,
                    memory_order_relaxed)) {
                *cell_out = cell;
                *pos_out = pos;
                return FQ_OK;
            }
        } else if (dif < 0) {
            return FQ_EBUSY;
        } else {
            pos = atomic_load_explicit(&q->head, memory_order_relaxed);
        }
    }
}

static void finish_push(fq_ring *r, fq_queue_id qid, fq_cell *cell,
                        uint64_t pos, uint32_t slot, uint32_t owner) {
    fault_check(push_fault[qid]);
    /* The census changes hands with the cell: relaxed, published by the
     * release store below together with cell->slot. */
    atomic_store_explicit(&r->headers[slot].owner, owner,
                          memory_order_relaxed);
    cell->slot = slot;
    /* release: publishes cell->slot, the census word and everything this
     * process wrote into the slot (header, data) before the push. */
    atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
    /* seq_cst fence, paired with the waiter's: either we see its waiters
     * increment, or its retry sees our cell. */
    atomic_thread_fence(memory_order_seq_cst);
    fq_queue *q = &r->ctrl->queues[qid];
    if (atomic_load_explicit(&q->waiters, memory_order_relaxed) != 0)
        fq_signal_queue(q, 1);
}

int fq_try_push(fq_ring *r, fq_queue_id qid, uint32_t slot, uint32_t owner) {
    fq_cell *cell;
    uint64_t pos;
    int rc = claim_push_cell(r, qid, &cell, &pos);
    if (rc == FQ_OK) finish_push(r, qid, cell, pos, slot, owner);
    return rc;
}

static int abort_reason(const fq_ctrl *c, unsigned abort);

/* How a push waits for a stalled popper: spin (the popper was preempted
 * two instructions from its release), then yield the CPU to it, then nap
 * with a growing interval (it is stopped or dead, and a nap costs nothing
 * then). This path runs only while a popper is stalled, never per batch,
 * and every nap is bounded by the caller's slice. */
#define FQ_RELEASE_SPINS 64u
#define FQ_RELEASE_YIELDS 64u
#define FQ_RELEASE_NAP_MAX_NS 1000000ull

int fq_push(fq_ring *r, fq_queue_id qid, uint32_t slot, uint32_t owner,
            int64_t timeout_ns, unsigned abort) {
    uint64_t deadline = 0, nap = 1000;
    for (unsigned tries = 0;; tries++) {
        int rc = fq_try_push(r, qid, slot, owner);
        if (rc != FQ_EBUSY) return rc;
        int why = abort_reason(r->ctrl, abort);
        if (why != FQ_OK) return why;
        if (tries < FQ_RELEASE_SPINS) {
            fq_cpu_relax();
            continue;
        }
        uint64_t now = fq_now_ns();
        if (deadline == 0)
            deadline = timeout_ns < 0 ? UINT64_MAX : now + (uint64_t)timeout_ns;
        if (now >= deadline) return FQ_TIMEOUT;
        if (tries < FQ_RELEASE_SPINS + FQ_RELEASE_YIELDS) {
            sched_yield();
            continue;
        }
        if (nap > deadline - now) nap = deadline - now;
        struct timespec ts = {(time_t)(nap / 1000000000ull),
                              (long)(nap % 1000000000ull)};
        nanosleep(&ts, NULL);
        if (nap < FQ_RELEASE_NAP_MAX_NS) nap *= 2;
    }
}

int fq_try_pop(fq_ring *r, fq_queue_id qid, uint32_t *slot, uint32_t owner) {
    fq_queue *q = &r->ctrl->queues[qid];
    fq_cell *cells = r->cells[qid];
    uint64_t mask = r->ctrl->capacity - 1;
    uint64_t pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
    fq_cell *cell;
    for (;;) {
        cell = &cells[pos & mask];
        /* acquire: pairs with the pusher's release; makes the slot's header
         * and data visible. */
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)(seq - (pos + 1));
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(
                    &q->tail, &pos, pos + 1, memory_order_relaxed,
                    memory_order_relaxed))
                break;
        } else if (dif < 0) {
            return FQ_EMPTY;
        } else {
            pos = atomic_load_explicit(&q->tail, memory_order_relaxed);
        }
    }
    uint32_t s = (uint32_t)cell->slot;
    fault_check(pop_fault[qid]);
    /* The census changes hands with the cell (relaxed: the release below
     * orders it before the cell's next push). A worker's pop also clears
     * the task until its claim records the new one. */
    fq_slot_header *h = &r->headers[s];
    /* Task first: a death between the two stores must not pair this
     * worker with the previous holder's (already delivered) task. */
    if (FQ_OWNER_KIND(owner) == FQ_OWNER_WORKER)
        atomic_store_explicit(&h->task, FQ_NO_TASK, memory_order_relaxed);
    atomic_store_explicit(&h->owner, owner, memory_order_relaxed);
    *slot = s;
    /* release: our read of cell->slot happens before the next round's
     * pusher overwrites it. */
    atomic_store_explicit(&cell->seq, pos + mask + 1, memory_order_release);
    return FQ_OK;
}

static int abort_reason(const fq_ctrl *c, unsigned abort) {
    if ((abort & FQ_ABORT_ON_CLOSE) && atomic_load(&c->closed))
        return FQ_CLOSED;
    if ((abort & FQ_ABORT_ON_ALERT) && atomic_load(&c->alert))
        return FQ_ALERT;
    return FQ_OK;
}

int fq_pop(fq_ring *r, fq_queue_id qid, uint32_t *slot, uint32_t owner,
           int64_t timeout_ns, unsigned abort) {
    fq_ctrl *c = r->ctrl;
    fq_queue *q = &c->queues[qid];
    if (fq_try_pop(r, qid, slot, owner) == FQ_OK) return FQ_OK;
    int why = abort_reason(c, abort);
    if (why != FQ_OK) return why;

    uint64_t start = fq_now_ns();
    uint64_t deadline =
        timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
    uint64_t spin_until = (abort & FQ_NO_SPIN) ? start : start + c->spin_ns;
    if (spin_until > deadline) spin_until = deadline;
    /* Spin phase: bounded by spin_ns; reads the clock every 64 tries. */
    for (unsigned i = 1; spin_until > start; i++) {
        if (fq_try_pop(r, qid, slot, owner) == FQ_OK) return FQ_OK;
        if ((i & 63) == 0) {
            if (fq_now_ns() >= spin_until) break;
            why = abort_reason(c, abort);
            if (why != FQ_OK) return why;
        }
        fq_cpu_relax();
    }

    /* Sleep phase: the event-count protocol of fq_ring.h. */
    for (;;) {
        atomic_fetch_add(&q->waiters, 1);
        uint32_t key = atomic_load(&q->wake_seq);
        atomic_thread_fence(memory_order_seq_cst);
        int rc;
        if (fq_try_pop(r, qid, slot, owner) == FQ_OK) {
            rc = FQ_OK;
        } else if ((rc = abort_reason(c, abort)) == FQ_OK) {
            uint64_t now = fq_now_ns();
            if (now >= deadline) {
                rc = FQ_TIMEOUT;
            } else {
                int64_t left =
                    deadline == UINT64_MAX ? -1 : (int64_t)(deadline - now);
                rc = fq_wait_word(&q->wake_seq, key, left);
                /* Woken, or a short sleep ended (the non-futex fallback naps
                 * in slices): go round; the deadline check above ends it. */
                if (rc == FQ_OK || rc == FQ_TIMEOUT) rc = FQ_EMPTY;
            }
        }
        uint32_t others = atomic_fetch_sub(&q->waiters, 1) - 1;
        if (rc == FQ_OK && others != 0 && fq_depth(r, qid) != 0) {
            /* Pass the wake on: a pusher's wake may have been spent on us
             * while a stalled earlier push held the head of the queue, and
             * another sleeper could now miss the item left behind. */
            fq_signal_queue(q, 1);
        }
        if (rc != FQ_EMPTY) return rc;
    }
}

uint32_t fq_depth(const fq_ring *r, fq_queue_id qid) {
    const fq_queue *q = &r->ctrl->queues[qid];
    uint64_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    return head > tail ? (uint32_t)(head - tail) : 0;
}

/* ------------------------------------------------------------ task & flags */

uint64_t fq_claim_task(fq_ring *r, uint32_t slot) {
    /* relaxed: the counter only hands out distinct numbers; the slot a task
     * is written into is published by the READY push. */
    uint64_t t = atomic_fetch_add_explicit(&r->ctrl->next_task, 1,
                                           memory_order_relaxed);
    fault_check(FQ_FAULT_CLAIM);
    /* relaxed: the census is read for diagnostics while we hold the slot;
     * the consumer reads the task after its acquiring pop. */
    atomic_store_explicit(&r->headers[slot].task, t, memory_order_relaxed);
    return t;
}

void fq_record_task(fq_ring *r, uint32_t slot, uint64_t task) {
    fault_check(FQ_FAULT_CLAIM);
    /* relaxed, as in fq_claim_task: the READY push publishes it. */
    atomic_store_explicit(&r->headers[slot].task, task, memory_order_relaxed);
}

int fq_queued(const fq_ring *r, fq_queue_id qid, uint32_t i) {
    const fq_queue *q = &r->ctrl->queues[qid];
    const fq_cell *cells = r->cells[qid];
    uint64_t mask = r->ctrl->capacity - 1;
    uint64_t head = atomic_load_explicit(&q->head, memory_order_acquire);
    uint64_t pos = atomic_load_explicit(&q->tail, memory_order_acquire);
    for (; pos < head; pos++) {
        const fq_cell *cell = &cells[pos & mask];
        if (atomic_load_explicit(&cell->seq, memory_order_acquire) == pos + 1 &&
            cell->slot == i)
            return 1;
    }
    return 0;
}

uint64_t fq_next_task(const fq_ring *r) {
    return atomic_load_explicit(&r->ctrl->next_task, memory_order_relaxed);
}

uint32_t fq_slot_owner(const fq_ring *r, uint32_t i) {
    return atomic_load_explicit(&r->headers[i].owner, memory_order_relaxed);
}

uint64_t fq_slot_task(const fq_ring *r, uint32_t i) {
    return atomic_load_explicit(&r->headers[i].task, memory_order_relaxed);
}

uint64_t fq_skip_tasks_to(fq_ring *r, uint64_t task) {
    uint64_t cur = atomic_load(&r->ctrl->next_task);
    while (cur < task &&
           !atomic_compare_exchange_weak(&r->ctrl->next_task, &cur, task)) {
    }
    return cur < task ? task : cur;
}
