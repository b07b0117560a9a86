/* fq_flags: the control block's flags and counters: close and alert,
 * passes, the plan and its grants, the active-worker count, the control
 * event count, and the per-worker table (the protocol is in fq_ring.h).
 * The queues and task claims are in fq_ring.c. */
#define _GNU_SOURCE
#include "fq_ring.h"
#include "fq_wait.h"

void fq_close(fq_ring *r) {
    fq_ctrl *c = r->ctrl;
    /* seq_cst store before the bumps: a waiter that misses the bump sees the
     * flag in its check before sleeping. */
    atomic_store(&c->closed, 1);
    atomic_fetch_add(&c->control, 1);
    fq_wake_word(&c->control, 0x7fffffff);
    fq_signal_queue(&c->queues[FQ_FREE], 0x7fffffff);
    fq_signal_queue(&c->queues[FQ_READY], 0x7fffffff);
}

int fq_is_closed(const fq_ring *r) { return atomic_load(&r->ctrl->closed) != 0; }

void fq_alert(fq_ring *r) {
    atomic_store(&r->ctrl->alert, 1);
    fq_signal_queue(&r->ctrl->queues[FQ_READY], 0x7fffffff);
}

void fq_set_pass(fq_ring *r, uint32_t pass) {
    /* seq_cst: a worker that sees the new control value sees the pass. */
    atomic_store(&r->ctrl->pass, pass);
    atomic_fetch_add(&r->ctrl->control, 1);
    fq_wake_word(&r->ctrl->control, 0x7fffffff);
}

uint32_t fq_get_pass(const fq_ring *r) { return atomic_load(&r->ctrl->pass); }

void fq_set_active(fq_ring *r, uint32_t active) {
    fq_ctrl *c = r->ctrl;
    if (active < 1) active = 1;
    if (active > c->nworkers) active = c->nworkers;
    /* seq_cst: a worker that sees the new control value sees `active`. */
    atomic_store(&c->active, active);
    atomic_fetch_add(&c->control, 1);
    fq_wake_word(&c->control, 0x7fffffff);
}

uint32_t fq_active(const fq_ring *r) { return atomic_load(&r->ctrl->active); }

void fq_set_planned(fq_ring *r, uint64_t planned) {
    fq_ctrl *c = r->ctrl;
    uint64_t cur = atomic_load(&c->planned);
    while (cur < planned &&
           !atomic_compare_exchange_weak(&c->planned, &cur, planned)) {
    }
    /* seq_cst, after the seq_cst raise: pairs with a waiter's increment. */
    if (atomic_load(&c->plan_waiters) > 0) {
        atomic_fetch_add(&c->control, 1);
        fq_wake_word(&c->control, 0x7fffffff);
    }
}

uint64_t fq_planned(const fq_ring *r) { return atomic_load(&r->ctrl->planned); }

int fq_wait_planned(fq_ring *r, uint64_t task, int64_t timeout_ns) {
    fq_ctrl *c = r->ctrl;
    if (atomic_load(&c->planned) > task) return FQ_OK;
    atomic_fetch_add(&c->plan_waiters, 1);
    uint32_t key = atomic_load(&c->control);
    atomic_thread_fence(memory_order_seq_cst);
    int rc;
    if (atomic_load(&c->planned) > task) {
        rc = FQ_OK;
    } else if (atomic_load(&c->closed)) {
        rc = FQ_CLOSED;
    } else {
        rc = fq_wait_word(&c->control, key, timeout_ns);
        if (atomic_load(&c->closed)) {
            rc = FQ_CLOSED;
        } else if (atomic_load(&c->planned) > task) {
            rc = FQ_OK;
        } else if (rc == FQ_OK) {
            rc = FQ_TIMEOUT; /* woken for something else: the caller retries */
        }
    }
    atomic_fetch_sub(&c->plan_waiters, 1);
    return rc;
}

void fq_plan_begin_write(void *entry) {
    atomic_store_explicit((_Atomic uint64_t *)entry, FQ_NO_TASK,
                          memory_order_relaxed);
    /* The clear is visible before any index written after it. */
    atomic_thread_fence(memory_order_release);
}

void fq_plan_end_write(void *entry, uint64_t task) {
    atomic_store_explicit((_Atomic uint64_t *)entry, task, memory_order_release);
}

uint64_t fq_plan_task(const void *entry) {
    return atomic_load_explicit((_Atomic uint64_t *)entry, memory_order_acquire);
}

uint64_t fq_plan_recheck(const void *entry) {
    /* The copied indices are read before this load. */
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit((_Atomic uint64_t *)entry, memory_order_relaxed);
}

uint32_t fq_control(const fq_ring *r) { return atomic_load(&r->ctrl->control); }

int fq_wait_control(fq_ring *r, uint32_t seen, int64_t timeout_ns) {
    if (atomic_load(&r->ctrl->closed)) return FQ_CLOSED;
    if (atomic_load(&r->ctrl->control) != seen) return FQ_OK;
    int rc = fq_wait_word(&r->ctrl->control, seen, timeout_ns);
    if (atomic_load(&r->ctrl->closed)) return FQ_CLOSED;
    if (rc == FQ_OK || atomic_load(&r->ctrl->control) != seen) return FQ_OK;
    return rc;
}

/* ----------------------------------------------------------- worker table */

void fq_worker_set_pid(fq_ring *r, uint32_t w, int32_t pid) {
    atomic_store_explicit(&r->workers[w].pid, pid, memory_order_relaxed);
}

void fq_worker_done(fq_ring *r, uint32_t w, uint64_t busy_ns,
                     uint64_t wait_ns) {
    fq_worker_entry *e = &r->workers[w];
    atomic_fetch_add_explicit(&e->batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->busy_ns, busy_ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->wait_ns, wait_ns, memory_order_relaxed);
}

void fq_worker_read(const fq_ring *r, uint32_t w, fq_worker_stats *out) {
    fq_worker_entry *e = &r->workers[w];
    out->batches = atomic_load_explicit(&e->batches, memory_order_relaxed);
    out->busy_ns = atomic_load_explicit(&e->busy_ns, memory_order_relaxed);
    out->wait_ns = atomic_load_explicit(&e->wait_ns, memory_order_relaxed);
    out->pid = atomic_load_explicit(&e->pid, memory_order_relaxed);
}
