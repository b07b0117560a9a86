/*
 * fq_ring: a ring of preallocated batch slots in one shared-memory region,
 * handed between processes through two bounded lock-free queues of slot
 * indices. C11, no Python.h.
 *
 * Region layout (every offset computed by fq_layout; "CL" = 64-byte line):
 *
 *   +-------------------------------+ 0
 *   | fq_ctrl                       |  geometry, flags, task counter, and the
 *   |   free  queue head/tail/wait  |  two queues' positions and event counts,
 *   |   ready queue head/tail/wait  |  each hot word on its own cache line
 *   +-------------------------------+ cells_offset
 *   | FREE  cells  [capacity] x 16B |  Vyukov cells: {seq, slot}
 *   | READY cells  [capacity] x 16B |
 *   +-------------------------------+ headers_offset
 *   | fq_slot_header [nslots] x CL  |  what the batch in each slot is
 *   +-------------------------------+ workers_offset
 *   | fq_worker_entry [nworkers]xCL |  per-worker diagnostics and counters
 *   +-------------------------------+ data_offset (page-aligned)
 *   | slot 0 data (slot_stride B)   |  slot_stride = slot_bytes rounded up to
 *   | slot 1 data                   |  a page, so every slot starts on a page
 *   | ...                           |
 *   +-------------------------------+ region_bytes
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
 *   2. It claims task t = fetch_add(ctrl.next_task, 1). Claiming after
 *      owning a slot means every claimed task already holds a slot: the
 *      consumer's next task is either in production or not yet claimed.
 *   3. It writes the batch into slot s's data and fills header[s] with plain
 *      stores (task, kind, rows, ...).
 *   4. It pushes s on READY. The push's release store on the cell sequence
 *      publishes every plain store of steps 3; the consumer's acquire load in
 *      its pop makes them visible. No other fence is needed for the data.
 *   5. The consumer pops s from READY, orders by header[s].task, hands out a
 *      lease; when the lease is released the consumer pushes s on FREE. The
 *      consumer never writes a slot's data, so reuse needs no extra fence:
 *      the FREE push/pop pair orders the consumer's last reads before the
 *      next worker's writes.
 *
 * Queues: Dmitry Vyukov's bounded MPMC queue. capacity is a power of two
 * >= N, and only N indices exist, so a queue never holds more than N items.
 * Its cells can still all be taken: a popper stalled between its tail CAS
 * and its cell release keeps that cell while the others lap the queue, and
 * the next push to reach the cell must wait for the release. fq_push waits
 * (spin, then yield; at most a second, and FQ_CLOSED once the ring is
 * closed); FQ_EFULL means the popper never came back (it died there) or the
 * protocol was broken.
 *   head (enqueue position): CAS, relaxed; the cell's seq is the real fence.
 *   tail (dequeue position): CAS, relaxed; ditto.
 *   cell.seq: acquire load / release store: publishes cell.slot and, through
 *             the producer's program order, the slot's header and data.
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
 *            callable source (pass), or closes; workers between passes wait
 *            on it.
 *
 * A process that dies inside a push or pop leaves its cell half-written and
 * the queue stuck at that position. fastq treats any worker death as fatal
 * to the ring (the consumer raises WorkerDied and tears down), so the ring
 * never needs repair.
 */
#ifndef FQ_RING_H
#define FQ_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FQ_MAGIC 0x66617374715f7231ULL /* "fastq_r1" */
#define FQ_VERSION 1u
#define FQ_CACHE_LINE 64
#define FQ_MAX_SLOTS (1u << 20)
#define FQ_MAX_WORKERS 4096u

/* Status codes: defined once, mapped to exceptions in one Cython function. */
typedef enum fq_status {
    FQ_OK = 0,
    FQ_EMPTY = 1,     /* try-pop found nothing (not an error) */
    FQ_TIMEOUT = 2,   /* a bounded wait ran out of its slice (not an error) */
    FQ_CLOSED = 3,    /* the ring was closed while waiting (not an error) */
    FQ_ALERT = 4,     /* the consumer was alerted while waiting (not an error) */
    FQ_EINTR = 5,     /* a signal interrupted the sleep (not an error) */
    FQ_EINVAL = -1,   /* bad argument */
    FQ_EFULL = -2,    /* push found the queue full: protocol broken */
    FQ_EBADMAGIC = -3,/* the region does not hold an fq ring */
    FQ_EVERSION = -4, /* the region was made by another fq version */
    FQ_ESMALL = -5,   /* the region is smaller than the geometry needs */
    FQ_ESYS = -6      /* an unexpected system call failure (errno is set) */
} fq_status;

typedef enum fq_queue_id { FQ_FREE = 0, FQ_READY = 1 } fq_queue_id;

/* What pops wait for besides an item. */
enum { FQ_ABORT_ON_CLOSE = 1u, FQ_ABORT_ON_ALERT = 2u };

/* What a published slot holds. */
typedef enum fq_slot_kind {
    FQ_SLOT_BATCH = 0, /* rows of batch data */
    FQ_SLOT_ERROR = 1, /* payload_bytes of an error report in the data */
    FQ_SLOT_END = 2    /* the worker's iterator ended its pass (no data) */
} fq_slot_kind;

typedef struct fq_cell {
    _Atomic uint64_t seq; /* Vyukov sequence: release-published by the writer */
    uint64_t slot;        /* the slot index; plain, published by seq */
} fq_cell;

typedef struct fq_queue {
    alignas(FQ_CACHE_LINE) _Atomic uint64_t head; /* next enqueue position */
    alignas(FQ_CACHE_LINE) _Atomic uint64_t tail; /* next dequeue position */
    alignas(FQ_CACHE_LINE) _Atomic uint32_t wake_seq; /* futex word: bumped
                                                        to wake sleepers */
    _Atomic uint32_t waiters; /* how many are inside the slow path */
} fq_queue;

typedef struct fq_ctrl {
    /* Written once by fq_init before any other process maps the region. */
    uint64_t magic;
    uint32_t version;
    uint32_t nslots;
    uint32_t nworkers;
    uint32_t capacity; /* cells per queue: power of two >= nslots */
    uint64_t slot_bytes;   /* usable bytes per slot */
    uint64_t slot_stride;  /* slot_bytes rounded up to a page */
    uint64_t cells_offset;
    uint64_t headers_offset;
    uint64_t workers_offset;
    uint64_t data_offset;
    uint64_t region_bytes;
    uint64_t spin_ns; /* how long waiters spin before sleeping */

    alignas(FQ_CACHE_LINE) _Atomic uint32_t closed; /* 0 -> 1 by close */
    _Atomic uint32_t alert;   /* sticky: set by the consumer's death watcher */
    _Atomic uint32_t control; /* event count: new pass or close */
    _Atomic uint32_t pass;    /* current pass over a callable source */
    alignas(FQ_CACHE_LINE) _Atomic uint64_t next_task; /* fetch_add by workers */

    fq_queue queues[2]; /* FQ_FREE, FQ_READY */
} fq_ctrl;

/* Written by the worker that owns the slot, published by its READY push. */
typedef struct fq_slot_header {
    alignas(FQ_CACHE_LINE) uint64_t task; /* claimed task number */
    uint64_t rows;          /* batch rows filled (<= the spec's capacity) */
    uint64_t payload_bytes; /* FQ_SLOT_ERROR: bytes of the report */
    uint32_t pass;          /* callable sources: the pass it belongs to */
    int32_t worker;         /* id of the worker that wrote it */
    uint32_t kind;          /* fq_slot_kind */
    uint32_t sample;        /* FQ_SLOT_ERROR: position of the failing sample */
} fq_slot_header;

/* Each written only by its worker (relaxed: diagnostics, not
 * synchronisation); read by the consumer for errors and stats. */
typedef struct fq_worker_entry {
    alignas(FQ_CACHE_LINE) _Atomic int64_t task; /* task in hand, -1: none */
    _Atomic uint64_t batches; /* batches published */
    _Atomic uint64_t busy_ns; /* time producing batches */
    _Atomic uint64_t wait_ns; /* time waiting for a free slot */
    _Atomic int32_t pid;      /* the worker's pid, once started */
} fq_worker_entry;

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

/* Pushes `slot` on queue q and wakes one sleeper if any. FQ_OK; FQ_CLOSED
 * if the ring closed while a late popper held the cell; FQ_EFULL if that
 * popper never released it. */
int fq_push(fq_ring *r, fq_queue_id q, uint32_t slot);

/* Pops without waiting: FQ_OK or FQ_EMPTY. */
int fq_try_pop(fq_ring *r, fq_queue_id q, uint32_t *slot);

/* Pops, spinning then sleeping for at most timeout_ns (< 0: one sleep of
 * unbounded length, which callers avoid). Returns FQ_OK, FQ_TIMEOUT,
 * FQ_EINTR, or FQ_CLOSED / FQ_ALERT when `abort` asks for them. */
int fq_pop(fq_ring *r, fq_queue_id q, uint32_t *slot, int64_t timeout_ns,
           unsigned abort);

/* Items in queue q now (a snapshot for statistics). */
uint32_t fq_depth(const fq_ring *r, fq_queue_id q);

/* Claims the next task number. */
uint64_t fq_claim_task(fq_ring *r);

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

/* Sleeps while ctrl.control equals `seen`, for at most timeout_ns. Returns
 * FQ_CLOSED, FQ_TIMEOUT, FQ_EINTR, or FQ_OK when woken (control has
 * usually moved; callers re-read it, as a wake can be spurious). */
int fq_wait_control(fq_ring *r, uint32_t seen, int64_t timeout_ns);
uint32_t fq_control(const fq_ring *r);

/* Worker table access: each entry is written only by its worker, with
 * relaxed atomics (diagnostics and counters, never synchronisation). */
typedef struct fq_worker_stats {
    int64_t task;
    uint64_t batches;
    uint64_t busy_ns;
    uint64_t wait_ns;
    int32_t pid;
} fq_worker_stats;

void fq_worker_set_task(fq_ring *r, uint32_t w, int64_t task);
void fq_worker_set_pid(fq_ring *r, uint32_t w, int32_t pid);
/* Counts a published batch; the worker holds no task until its next claim. */
void fq_worker_done(fq_ring *r, uint32_t w, uint64_t busy_ns,
                    uint64_t wait_ns);
void fq_worker_read(const fq_ring *r, uint32_t w, fq_worker_stats *out);

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
