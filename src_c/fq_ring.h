/*
 * fq_ring: a ring of preallocated batch slots in one shared-memory region,
 * handed between processes through two bounded lock-free queues of slot
 * indices. C11, no Python.h. The region's layout, drawn and pinned, is in
 * fq_layout.h.
 *
 * Protocol. N = nslots. Every slot index is, at any instant, in exactly one
 * of these places:
 *
 *   FREE queue --(worker pops)--> WORKER --(worker pushes)--> READY queue
 *        ^                                                         |
 *        |                                              (consumer pops)
 *        +--(lease released)-- CONSUMER (reorder window or user) <-+
 *
 *   1. A worker pops slot s from FREE (fq_pop; waits while FREE is empty).
 *   2. It claims task t = fetch_add(ctrl.next_task, 1) and records it in
 *      header[s].task (fq_claim_task). Claiming after owning a slot means
 *      every claimed task already holds a slot: the consumer's next task is
 *      either in production or not yet claimed.
 *   3. It writes the batch into slot s's data and fills header[s] with plain
 *      stores (kind, rows, ...).
 *   4. It pushes s on READY. The push's release store on the cell sequence
 *      publishes every plain store of step 3; the consumer's acquire load in
 *      its pop makes them visible. No other fence is needed for the data.
 *   5. The consumer pops s from READY, orders by header[s].task, hands out a
 *      lease; when the lease is released the consumer pushes s on FREE. The
 *      consumer never writes a slot's data, so reuse needs no extra fence:
 *      the FREE push/pop pair orders the consumer's last reads before the
 *      next worker's writes.
 *
 *   A batch a worker made before the ring existed (to infer the slots'
 *   layout from) is delivered without being made again: the consumer does
 *   steps 1 and 2 for that worker, popping a slot as WORKER(w) and claiming
 *   the run's first task, before any worker has the ring; w then does 3
 *   and 4. Passing w the ring's descriptor orders those stores before w's
 *   reads, and the task, like any claimed one, holds a slot.
 *
 * Census. header[s].owner says where slot s is: FQ_OWNER_FREE, WORKER(w),
 * READY(w) or CONSUMER. Each queue operation writes it while it holds the
 * slot's cell exclusively (a push between its head CAS and its cell
 * release, a pop between its tail CAS and its cell release), so the word
 * changes hands together with the slot: a slot whose owner is CONSUMER is
 * the consumer's to account for, one whose owner is WORKER(w) or READY(w)
 * was last handled by worker w. header[s].task is FQ_NO_TASK from a
 * worker's pop until its claim. The one exception is a process that dies
 * inside a queue operation before its census store: the word keeps its
 * last value, and the unreleased cell (see Queues) is what shows where the
 * slot went. Any death is fatal to the ring, so the census only has to
 * name what it can; the consumer's own slots are always exact.
 *
* Queues: Dmitry Vyukov's bounded MPMC queue. capacity is a power of two
 * >= N, and only N indices exist, so a queue never holds more than N items.
 * Its cells can still all be taken: a popper stalled between its tail CAS
 * and its cell release keeps that cell while the others lap the queue, and
 * the next push to reach the cell must wait for the release. The popper may
 * be preempted (microseconds), stopped (SIGSTOP, a debugger, a throttled
 * cgroup: as long as it stays stopped) or dead (forever). So a push never
 * reports a full queue: fq_try_push answers FQ_EBUSY at once and leaves
 * nothing changed (the consumer keeps such a slot and retries later, so a
 * paused worker that comes back costs nothing), and fq_push waits within
 * its caller's slice, stopping on the closed and alert flags (workers).
 *   head (enqueue position): CAS, relaxed; the cell's seq is the real fence.
 *   tail (dequeue position): CAS, relaxed; ditto.
 *   cell.seq: acquire load / release store: publishes cell.slot, the
 *             slot's census word and, through the producer's program order,
 *             the slot's header and data.
 *
 * Waiting: an event count per queue. A waiter does
 *     waiters += 1 (seq_cst); key = wake_seq (seq_cst); fence(seq_cst);
 *     retry the pop; if still empty and nothing to abort on: futex_wait(
 *     wake_seq, key, slice)
 * and a pusher does
 *     push; fence(seq_cst); if (waiters > 0) { wake_seq += 1; futex_wake }.
 * The two seq_cst fences forbid the interleaving in which the pusher reads
 * waiters == 0 while the waiter's retry misses the pushed cell (Dekker), so a
 * wake is never lost; and no system call happens unless someone sleeps.
 * Before sleeping, a waiter spins for ctrl.spin_ns, re-trying the pop: a
 * sleep and a cross-CPU wake cost tens of microseconds, more than a batch.
 * Every sleep is bounded by the caller's slice, so waiters re-check flags,
 * peers' liveness and signals; close and alert bump every wake_seq and wake
 * all.
 *
 * Flags (all in ctrl, all seq_cst, written rarely):
 *   closed:  0 -> 1 once, by the consumer's close; every waiter aborts.
 *   alert:   0 -> nonzero, sticky, set by the consumer's death watcher;
 *            READY waiters abort so the consumer can look at what happened
 *            (a death is fatal to the ring, so it is never cleared).
 *   control: event count bumped when the consumer starts a new pass over a
 *            callable source (pass), raises `planned` while a worker waits
 *            for a plan, changes `active`, or closes; workers between passes
 *            and parked workers wait on it.
 *   active:  workers numbered below it take slots; the others are parked
 *            (workers="auto"). A worker reads it before taking a slot, so a
 *            parked worker holds no slot and no task: the consumer's next
 *            batch is still in production or unclaimed. The consumer stores
 *            it, then bumps control; a parker reads control, then active
 *            (both seq_cst), so a change is never slept through.
 *
 * Planned sources (a sampler the consumer runs, as DataLoader does): the
 * consumer writes task t's plan (its sample indices, in the region's plan
 * area outside this block) and then raises `planned` past t. A worker that
 * claimed t reads the plan once planned > t:
 *   planned: seq_cst store by the consumer, then a seq_cst load of
 *            plan_waiters; a waiter increments plan_waiters (seq_cst) and
 *            reads `control` before re-reading `planned`. The same Dekker
 *            pair as the queues: a raise is never missed, and no system call
 *            happens unless a worker sleeps.
 *   A plan entry is reused for task t + K once t is done; an abandoned
 *   epoch's task still in flight may find its entry reused, so entries are
 *   a seqlock (fq_plan_*): the entry's task word is cleared before and set
 *   (release) after the indices are written, and a reader re-checks it
 *   after copying them (acquire fence).
 *
 * Turns (a stream in order, as DataLoader's in_order delivers an
 * IterableDataset's batches: from the workers in turn, skipping those whose
 * stream has ended). Worker w of W makes its k-th item of pass p as task
 *     (p << 40) + k * W + w
 * instead of claiming one (fq_record_task records it), so the consumer's
 * order by task is round-robin, whichever worker is quicker. Such a task
 * is claimed per worker, not in increasing order, so the argument above
 * no longer holds by itself: worker w's next task may be the one the
 * consumer waits for while the other workers fill every slot with later
 * tasks. The `planned` counter is the consumer's grant instead:
 *   - a worker waits (fq_wait_planned) until planned > its task BEFORE it
 *     takes a slot, so it holds no slot while it waits, and at most one
 *     slot per granted task;
 *   - the consumer raises planned only as far as the tasks granted and
 *     not yet handed out, of workers still in their stream, number at most
 *     nslots minus the slots its user holds (a hand-out moves one from one
 *     count to the other; a release only lowers the second), and never
 *     past its next task + the window's size (a power of two >= nslots),
 *     so tasks in flight keep distinct window positions.
 * So when the consumer waits for task t, t is granted (it grants before
 * waiting while the user holds fewer than nslots; holding all of them is
 * the "holds every slot" report), and the slots held by the user and by
 * every other granted task number at most nslots - 1: one is free or on
 * its way back (an abandoned pass's batch, which the consumer drops as it
 * arrives), and no other worker can take more than its granted tasks'
 * share, so t's worker gets one. The consumer steps over the tasks of a
 * worker past its end marker, and of a worker's turns used before the
 * ring existed. A new pass starts at (p << 40): above every task before
 * it, so its grants wake workers still waiting in the last pass.
 *
 * A process that dies inside a push or pop leaves its cell half-written and
 * the queue stuck at that position. fastq treats any worker death as fatal
 * to the ring (the consumer raises WorkerDied and tears down), so the ring
 * never needs repair; the census names what the dead worker held.
 *
 * Fault injection (tests only): fq_set_fault makes this process raise a
 * signal at one named step of its queue operations (between a CAS and its
 * cell release, or between a claim and its record), so that deaths and
 * stops inside them are tested for real. Unset, it costs one load of a
 * process-local word per operation.
 */
#ifndef FQ_RING_H
#define FQ_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fq_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: defined once, mapped to exceptions in one Cython function. */
typedef enum fq_status {
    FQ_OK = 0,
    FQ_EMPTY = 1,     /* try-pop found nothing (not an error) */
    FQ_TIMEOUT = 2,   /* a bounded wait ran out of its slice (not an error) */
    FQ_CLOSED = 3,    /* the ring was closed while waiting (not an error) */
    FQ_ALERT = 4,     /* the consumer was alerted while waiting (not an error) */
    FQ_EINTR = 5,     /* a signal interrupted the sleep (not an error) */
    FQ_EBUSY = 6,     /* try-push met a stalled popper's cell: nothing was
                         pushed (not an error; retry later) */
    FQ_EINVAL = -1,   /* bad argument */
    FQ_EBADMAGIC = -3,/* the region does not hold an fq ring */
    FQ_EVERSION = -4, /* the region was made by another fq version */
    FQ_ESMALL = -5,   /* the region is smaller than the geometry needs */
    FQ_ESYS = -6      /* an unexpected system call failure (errno is set) */
} fq_status;


/* What pops wait for besides an item. */
enum {
    FQ_ABORT_ON_CLOSE = 1u,
    FQ_ABORT_ON_ALERT = 2u,
    FQ_NO_SPIN = 4u /* fq_pop: the caller has just spun; sleep at once */
};

/* Who holds a slot: header.owner = kind | who << 8 (who: a worker id). */
typedef enum fq_owner_kind {
    FQ_OWNER_FREE = 0,     /* on the FREE queue (or being pushed there) */
    FQ_OWNER_WORKER = 1,   /* taken from FREE by worker `who` */
    FQ_OWNER_READY = 2,    /* pushed on READY by worker `who` */
    FQ_OWNER_CONSUMER = 3  /* taken from READY by the consumer */
} fq_owner_kind;
#define FQ_OWNER(kind, who) ((uint32_t)(kind) | ((uint32_t)(who) << 8))
#define FQ_OWNER_KIND(owner) ((owner)&0xffu)
#define FQ_OWNER_WHO(owner) ((owner) >> 8)
#define FQ_NO_TASK UINT64_MAX

/* Steps of this process's queue operations where fq_set_fault can raise a
 * signal: inside a push or pop, after the CAS that claims a cell and
 * before the cell is released; in fq_claim_task, after the fetch_add and
 * before the task is recorded. */
typedef enum fq_fault_point {
    FQ_FAULT_NONE = 0,
    FQ_FAULT_PUSH_FREE = 1,
    FQ_FAULT_PUSH_READY = 2,
    FQ_FAULT_POP_FREE = 3,
    FQ_FAULT_POP_READY = 4,
    FQ_FAULT_CLAIM = 5
} fq_fault_point;

/* What a published slot holds. */
typedef enum fq_slot_kind {
    FQ_SLOT_BATCH = 0, /* rows of batch data */
    FQ_SLOT_ERROR = 1, /* payload_bytes of an error report in the data */
    FQ_SLOT_END = 2    /* the worker's iterator ended its pass (no data) */
} fq_slot_kind;


typedef struct fq_geometry {
    uint32_t nslots;
    uint32_t nworkers;
    uint64_t slot_bytes;
    uint64_t page_size;
    uint64_t spin_ns;
} fq_geometry;

/* Process-local view of a mapped region: pointers, no shared state. */
typedef struct fq_ring {
    fq_ctrl *ctrl;
    fq_cell *cells[2];
    fq_slot_header *headers;
    fq_worker_entry *workers;
    uint8_t *data;
} fq_ring;

/* Fills *g's derived layout into *ctrl_out (may be NULL) and returns the
 * region size in bytes, or 0 if the geometry is invalid. */
uint64_t fq_layout(const fq_geometry *g, fq_ctrl *ctrl_out);

/* Formats a zeroed region of `len` bytes: FREE holds every slot. */
int fq_init(void *base, uint64_t len, const fq_geometry *g, fq_ring *out);

/* Validates a region formatted by fq_init and fills *out. */
int fq_attach(void *base, uint64_t len, fq_ring *out);

/* Pushes `slot` on queue q, recording `owner` in its census word, and
 * wakes one sleeper if any. FQ_OK, or FQ_EBUSY (nothing pushed) if the
 * cell it must use is still held by a popper stalled inside its pop. */
int fq_try_push(fq_ring *r, fq_queue_id q, uint32_t slot, uint32_t owner);

/* As fq_try_push, but waits up to timeout_ns for a stalled popper: FQ_OK,
 * FQ_TIMEOUT, or FQ_CLOSED / FQ_ALERT when `abort` asks for them. */
int fq_push(fq_ring *r, fq_queue_id q, uint32_t slot, uint32_t owner,
            int64_t timeout_ns, unsigned abort);

/* Pops without waiting, recording `owner` in the slot's census word:
 * FQ_OK or FQ_EMPTY. */
int fq_try_pop(fq_ring *r, fq_queue_id q, uint32_t *slot, uint32_t owner);

/* Pops as fq_try_pop, spinning (unless FQ_NO_SPIN) then sleeping for at
 * most timeout_ns (< 0: one sleep of unbounded length, which callers
 * avoid). Returns FQ_OK, FQ_TIMEOUT, FQ_EINTR, or FQ_CLOSED / FQ_ALERT when
 * `abort` asks for them. */
int fq_pop(fq_ring *r, fq_queue_id q, uint32_t *slot, uint32_t owner,
           int64_t timeout_ns, unsigned abort);

/* Items in queue q now (a snapshot for statistics). */
uint32_t fq_depth(const fq_ring *r, fq_queue_id q);

/* Claims the next task number for the slot the caller holds and records
 * it in the slot's census. */
uint64_t fq_claim_task(fq_ring *r, uint32_t slot);

/* Turns (see above): records the task the caller's turn names, granted
 * before it took the slot, in the slot's census. */
void fq_record_task(fq_ring *r, uint32_t slot, uint64_t task);

/* Whether slot i sits published in queue q (a snapshot, for diagnostics:
 * a dead worker's slot marked READY was either published or lost inside
 * its push). */
int fq_queued(const fq_ring *r, fq_queue_id q, uint32_t i);

/* The next task number a claim would get (a snapshot). */
uint64_t fq_next_task(const fq_ring *r);

/* The census word and task of slot i (relaxed snapshots). */
uint32_t fq_slot_owner(const fq_ring *r, uint32_t i);
uint64_t fq_slot_task(const fq_ring *r, uint32_t i);

/* Raises next_task to at least `task` (never lowers it); returns the value
 * it now has. Used to skip the rest of an abandoned epoch. */
uint64_t fq_skip_tasks_to(fq_ring *r, uint64_t task);

/* Marks the ring closed and wakes every waiter of every kind. */
void fq_close(fq_ring *r);
int fq_is_closed(const fq_ring *r);

/* Wakes the consumer's READY wait with FQ_ALERT. */
void fq_alert(fq_ring *r);

/* Starts pass `pass` for callable sources and wakes workers between passes. */
void fq_set_pass(fq_ring *r, uint32_t pass);
uint32_t fq_get_pass(const fq_ring *r);

/* Planned sources: raises the count of planned tasks (never lowers it) and
 * wakes workers waiting for a plan; fq_wait_planned sleeps until task is
 * planned (FQ_OK), the ring closes (FQ_CLOSED), or timeout_ns / a signal
 * ends the slice (FQ_TIMEOUT, FQ_EINTR). */
void fq_set_planned(fq_ring *r, uint64_t planned);
uint64_t fq_planned(const fq_ring *r);
int fq_wait_planned(fq_ring *r, uint64_t task, int64_t timeout_ns);

/* Plan entries as a seqlock over their first word (see above). */
void fq_plan_begin_write(void *entry);
void fq_plan_end_write(void *entry, uint64_t task);
uint64_t fq_plan_task(const void *entry);
uint64_t fq_plan_recheck(const void *entry);

/* Workers numbered `active` and above park before their next slot; at
 * least 1, at most nworkers. Wakes every parked worker to look again. */
void fq_set_active(fq_ring *r, uint32_t active);
uint32_t fq_active(const fq_ring *r);

/* Sleeps while ctrl.control equals `seen`, for at most timeout_ns. Returns
 * FQ_CLOSED, FQ_TIMEOUT, FQ_EINTR, or FQ_OK when woken (control has
 * usually moved; callers re-read it, as a wake can be spurious). */
int fq_wait_control(fq_ring *r, uint32_t seen, int64_t timeout_ns);
uint32_t fq_control(const fq_ring *r);

/* Worker table access: each entry is written only by its worker, with
 * relaxed atomics (diagnostics and counters, never synchronisation). */
typedef struct fq_worker_stats {
    uint64_t batches;
    uint64_t busy_ns;
    uint64_t wait_ns;
    int32_t pid;
} fq_worker_stats;

void fq_worker_set_pid(fq_ring *r, uint32_t w, int32_t pid);
/* Counts a batch about to be published. */
void fq_worker_done(fq_ring *r, uint32_t w, uint64_t busy_ns,
                    uint64_t wait_ns);
void fq_worker_read(const fq_ring *r, uint32_t w, fq_worker_stats *out);

/* Tests only: raise `signum` in this process the `countdown`-th time it
 * reaches `point` (FQ_FAULT_NONE disarms). Process-local. */
void fq_set_fault(fq_fault_point point, uint32_t countdown, int signum);

/* Pointer to slot i's data (slot_bytes usable). */
static inline uint8_t *fq_slot_data(const fq_ring *r, uint32_t i) {
    return r->data + (uint64_t)i * r->ctrl->slot_stride;
}

/* CLOCK_MONOTONIC in nanoseconds (vDSO: no system call). */
uint64_t fq_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* FQ_RING_H */
