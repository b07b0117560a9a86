/*
 * fq_layout: the shared region's layout, the contract between the
 * processes that map it (fq_ring.h has the protocol over it).
 *
 * Region layout (every offset computed by fq_layout; "CL" = 64-byte line):
 *
 *   +-------------------------------+ 0
 *   | fq_ctrl (640 B = 10 CL)       |  geometry, flags, task counter, and the
 *   |   free  queue head/tail/wait  |  two queues' positions and event counts,
 *   |   ready queue head/tail/wait  |  each hot word on its own cache line
 *   +-------------------------------+ cells_offset (= 640)
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
 * Inside the shared structs (byte offsets from the struct's start):
 *
 *   fq_ctrl          0 magic         8 version       12 nslots
 *   (640 B,         16 nworkers     20 capacity      24 slot_bytes
 *    CL-aligned)    32 slot_stride  40 cells_offset  48 headers_offset
 *                   56 workers_offset  64 data_offset  72 region_bytes
 *                   80 spin_ns                    (the geometry, 2 CL)
 *                  128 closed  132 alert  136 control  140 pass
 *                  144 plan_waiters  148 active  152 planned  (1 CL)
 *                  192 next_task                              (1 CL)
 *                  256 queues[FQ_FREE]   448 queues[FQ_READY]
 *   fq_queue         0 head   64 tail   128 wake_seq   132 waiters
 *   (192 B, 3 CL)    (enqueuers, dequeuers and sleepers never share a line)
 *   fq_cell          0 seq     8 slot                         (16 B)
 *   fq_slot_header   0 task    8 owner  12 pass   16 rows   24 payload_bytes
 *   (64 B = 1 CL)   32 worker 36 kind   40 sample
 *   fq_worker_entry  0 batches 8 busy_ns 16 wait_ns 24 pid    (64 B = 1 CL)
 *
 * Every number in these two drawings is pinned by a _Static_assert after
 * the structs. The layout is a contract between processes and with what
 * reads the region by offset (a test forges a census word at byte 8 of a
 * header), and its cache-line separations keep the workers' hot words off
 * the consumer's; so a field moved by accident (an edit, another compiler
 * or ABI) fails the build rather than a run on another machine. Moving one
 * on purpose changes the drawing, the assert and FQ_VERSION together.
 */
#ifndef FQ_LAYOUT_H
#define FQ_LAYOUT_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FQ_MAGIC 0x66617374715f7231ULL /* "fastq_r1" */
#define FQ_VERSION 4u
#define FQ_CACHE_LINE 64
#define FQ_MAX_SLOTS (1u << 20)
#define FQ_MAX_WORKERS 4096u

typedef enum fq_queue_id { FQ_FREE = 0, FQ_READY = 1 } fq_queue_id;

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
    _Atomic uint32_t plan_waiters; /* workers waiting for a task's plan */
    _Atomic uint32_t active;  /* workers below it take slots; others park */
    _Atomic uint64_t planned; /* planned sources: tasks below it have a plan;
                                 turns: tasks below it are granted */
    alignas(FQ_CACHE_LINE) _Atomic uint64_t next_task; /* fetch_add by workers */

    fq_queue queues[2]; /* FQ_FREE, FQ_READY */
} fq_ctrl;

/* What the batch in a slot is, and who holds the slot. The plain fields
 * are written by the worker that owns the slot and published by its READY
 * push; owner and task are atomics that the consumer also reads while a
 * worker holds the slot (census, diagnostics). */
typedef struct fq_slot_header {
    alignas(FQ_CACHE_LINE) _Atomic uint64_t task; /* claimed task number;
                              FQ_NO_TASK from a worker's pop to its claim */
    _Atomic uint32_t owner; /* census: FQ_OWNER(kind, who), written inside
                               the queue operation that hands the slot on */
    uint32_t pass;          /* callable sources: the pass it belongs to */
    uint64_t rows;          /* batch rows filled (<= the spec's capacity) */
    uint64_t payload_bytes; /* FQ_SLOT_ERROR: bytes of the report */
    int32_t worker;         /* id of the worker that wrote it */
    uint32_t kind;          /* fq_slot_kind */
    uint32_t sample;        /* FQ_SLOT_ERROR: position of the failing sample */
} fq_slot_header;

/* Each written only by its worker (relaxed: diagnostics, not
 * synchronisation); read by the consumer for stats. What a worker holds is
 * in the slot census, not here. */
typedef struct fq_worker_entry {
    alignas(FQ_CACHE_LINE) _Atomic uint64_t batches; /* batches published */
    _Atomic uint64_t busy_ns; /* time producing batches */
    _Atomic uint64_t wait_ns; /* time waiting for a free slot */
    _Atomic int32_t pid;      /* the worker's pid, once started */
} fq_worker_entry;

/* The layout drawn at the top of this file, pinned (see there). */
#define FQ_PIN_AT(type, field, offset)                                  \
    _Static_assert(offsetof(type, field) == (offset),                   \
                   #type "." #field " must sit at byte " #offset        \
                   " (see the drawing in fq_layout.h; bump FQ_VERSION)")
#define FQ_PIN_SIZE(type, bytes)                                        \
    _Static_assert(sizeof(type) == (bytes),                             \
                   #type " must be " #bytes " bytes (see the drawing "  \
                   "in fq_layout.h; bump FQ_VERSION)")

FQ_PIN_AT(fq_ctrl, magic, 0);
FQ_PIN_AT(fq_ctrl, version, 8);
FQ_PIN_AT(fq_ctrl, nslots, 12);
FQ_PIN_AT(fq_ctrl, nworkers, 16);
FQ_PIN_AT(fq_ctrl, capacity, 20);
FQ_PIN_AT(fq_ctrl, slot_bytes, 24);
FQ_PIN_AT(fq_ctrl, slot_stride, 32);
FQ_PIN_AT(fq_ctrl, cells_offset, 40);
FQ_PIN_AT(fq_ctrl, headers_offset, 48);
FQ_PIN_AT(fq_ctrl, workers_offset, 56);
FQ_PIN_AT(fq_ctrl, data_offset, 64);
FQ_PIN_AT(fq_ctrl, region_bytes, 72);
FQ_PIN_AT(fq_ctrl, spin_ns, 80);
FQ_PIN_AT(fq_ctrl, closed, 128);
FQ_PIN_AT(fq_ctrl, alert, 132);
FQ_PIN_AT(fq_ctrl, control, 136);
FQ_PIN_AT(fq_ctrl, pass, 140);
FQ_PIN_AT(fq_ctrl, plan_waiters, 144);
FQ_PIN_AT(fq_ctrl, active, 148);
FQ_PIN_AT(fq_ctrl, planned, 152);
FQ_PIN_AT(fq_ctrl, next_task, 192);
FQ_PIN_AT(fq_ctrl, queues, 256);
_Static_assert(offsetof(fq_ctrl, queues) + FQ_READY * sizeof(fq_queue) == 448,
               "fq_ctrl.queues[FQ_READY] must sit at byte 448 (see the "
               "drawing in fq_layout.h; bump FQ_VERSION)");
FQ_PIN_SIZE(fq_ctrl, 640);
_Static_assert(alignof(fq_ctrl) == FQ_CACHE_LINE,
               "fq_ctrl starts on a cache line, so its lines are the "
               "region's");

/* Enqueuers (head), dequeuers (tail) and sleepers (wake_seq, waiters)
 * each on their own line, in each queue: no false sharing between the
 * workers' and the consumer's ends of a queue. */
FQ_PIN_AT(fq_queue, head, 0);
FQ_PIN_AT(fq_queue, tail, 64);
FQ_PIN_AT(fq_queue, wake_seq, 128);
FQ_PIN_AT(fq_queue, waiters, 132);
FQ_PIN_SIZE(fq_queue, 192);
_Static_assert(alignof(fq_queue) == FQ_CACHE_LINE,
               "each fq_queue starts on a cache line");

FQ_PIN_AT(fq_cell, seq, 0);
FQ_PIN_AT(fq_cell, slot, 8);
FQ_PIN_SIZE(fq_cell, 16); /* the cell tables' stride */

/* One cache line per slot (the table's stride), so a worker's header
 * stores never share a line with another slot's. */
FQ_PIN_AT(fq_slot_header, task, 0);
FQ_PIN_AT(fq_slot_header, owner, 8);
FQ_PIN_AT(fq_slot_header, pass, 12);
FQ_PIN_AT(fq_slot_header, rows, 16);
FQ_PIN_AT(fq_slot_header, payload_bytes, 24);
FQ_PIN_AT(fq_slot_header, worker, 32);
FQ_PIN_AT(fq_slot_header, kind, 36);
FQ_PIN_AT(fq_slot_header, sample, 40);
FQ_PIN_SIZE(fq_slot_header, 64);

/* One cache line per worker: each entry is written by its worker only. */
FQ_PIN_AT(fq_worker_entry, batches, 0);
FQ_PIN_AT(fq_worker_entry, busy_ns, 8);
FQ_PIN_AT(fq_worker_entry, wait_ns, 16);
FQ_PIN_AT(fq_worker_entry, pid, 24);
FQ_PIN_SIZE(fq_worker_entry, 64);

#undef FQ_PIN_AT
#undef FQ_PIN_SIZE

#endif /* FQ_LAYOUT_H */
