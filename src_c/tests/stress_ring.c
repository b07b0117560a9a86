/*
 * stress_ring: threaded stress test of the fq ring protocol (fq_ring.h).
 *
 * Threads stand in for processes: the region is an anonymous MAP_SHARED
 * mapping, the same kind of memory and the same process-shared futexes the
 * real workers use. P producer threads follow the worker loop (pop FREE,
 * claim a task, fill the slot, push READY); one consumer thread follows the
 * Prefetcher (pop READY, reorder window, ordered delivery, leases released
 * to FREE, sometimes late). Everything the consumer reads is checked against
 * what the task number says the producer wrote, so a slot handed to two
 * parties, a torn publish or a lost or duplicated task is caught, and the
 * sanitizer builds (TSan, ASan+UBSan) see every access.
 *
 * Then two wake tests with deadlines: fq_close wakes every sleeper of FREE
 * and of the control word, fq_alert wakes the consumer's READY sleep.
 *
 * Usage: stress_ring [--short | --long] [-r rounds] [-t tasks] [-p producers]
 *                    [-s max_slots] [-b slot_bytes] [-S seed]
 *        stress_ring --efull-repro
 * Exit 0: no violation; 1: a violation (each printed on stderr); 2: usage;
 * 3: a thread hung past the watchdog.
 */
#define _GNU_SOURCE
#include "../fq_ring.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_SLOTS 64
#define MAX_PRODUCERS 64
#define MS 1000000ll
#define SEC 1000000000ll

/* Producer slices are long on purpose: a lost wakeup then shows up as a
 * stall the consumer's watchdog reports, instead of hiding inside a short
 * slice that happens to end in time. Close wakes them anyway. */
#define PRODUCER_SLICE_NS (20 * SEC)
#define CONSUMER_SLICE_NS (100 * MS)
/* The consumer's READY wait is stalled when nothing came for this long
 * although FREE held a slot: some producer should have taken it. Far above
 * any scheduling delay of a loaded machine, far below the producer slice. */
#define STALL_NS (5 * SEC)
#define WATCHDOG_NS (240 * SEC)
#define WAKE_DEADLINE_NS (1 * SEC)

/* ------------------------------------------------------------- reporting */

/* Counted by every thread; any nonzero value fails the run. */
static _Atomic unsigned violations;

static void violation(const char *fmt, ...) {
    /* Printing only the first few keeps a cascade readable. */
    if (atomic_fetch_add(&violations, 1) >= 20) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("VIOLATION: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static const char *status_name(int rc) {
    switch (rc) {
    case FQ_OK: return "FQ_OK";
    case FQ_EMPTY: return "FQ_EMPTY";
    case FQ_TIMEOUT: return "FQ_TIMEOUT";
    case FQ_CLOSED: return "FQ_CLOSED";
    case FQ_ALERT: return "FQ_ALERT";
    case FQ_EINTR: return "FQ_EINTR";
    case FQ_EINVAL: return "FQ_EINVAL";
    case FQ_EFULL: return "FQ_EFULL";
    case FQ_EBADMAGIC: return "FQ_EBADMAGIC";
    case FQ_EVERSION: return "FQ_EVERSION";
    case FQ_ESMALL: return "FQ_ESMALL";
    case FQ_ESYS: return "FQ_ESYS";
    default: return "unknown status";
    }
}

/* ------------------------------------------------- determinism and delays */

static uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *s) { return mix64(*s += 0x9e3779b97f4a7c15ull); }

/* Small random delays move the threads' relative timing around so that
 * many interleavings of pops and pushes occur, including a producer
 * stalled while holding its slot. */
static void jitter(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    switch (r & 15) {
    case 0: {
        volatile unsigned sink = 0;
        for (unsigned i = (unsigned)((r >> 8) % 2000); i > 0; i--) sink += i;
        break;
    }
    case 1: sched_yield(); break;
    case 2:
        if (((r >> 8) & 63) == 0) {
            struct timespec ts = {0, (long)(20000 + (r >> 16) % 200000)};
            nanosleep(&ts, NULL);
        }
        break;
    default: break;
    }
}

static void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------- the slot content */

/* Everything a producer writes is a function of the task number, so the
 * consumer can recompute it bit for bit. */
static uint64_t pattern_words(uint64_t task, uint64_t slot_bytes) {
    return 1 + mix64(task ^ 0x5eedull) % (slot_bytes / 8);
}

static uint64_t pattern_word(uint64_t task, uint64_t i) {
    return mix64(task * 0x100000001b3ull + i);
}

static uint32_t header_tag(uint64_t task) {
    return (uint32_t)(task * 2654435761u) ^ 0xa5a5a5a5u;
}

static void fill_slot(fq_ring *r, uint32_t slot, uint64_t task, int worker,
                      uint32_t round) {
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    uint64_t *w = (uint64_t *)fq_slot_data(r, slot);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        w[i] = pattern_word(task, i);
        sum = mix64(sum ^ w[i]);
    }
    fq_slot_header *h = &r->headers[slot];
    h->task = task;
    h->rows = n;
    h->payload_bytes = sum;
    h->pass = round;
    h->worker = worker;
    h->kind = FQ_SLOT_BATCH;
    h->sample = header_tag(task);
}

/* Returns 1 when slot's header and data are exactly what task `task`
 * produces; otherwise reports what differs. */
static int check_slot(fq_ring *r, uint32_t slot, uint64_t task, uint32_t round,
                      const char *when) {
    const fq_slot_header *h = &r->headers[slot];
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    if (h->task != task || h->kind != FQ_SLOT_BATCH || h->rows != n ||
        h->pass != round || h->sample != header_tag(task)) {
        violation("%s: slot %u header task=%" PRIu64 " kind=%u rows=%" PRIu64
                  " pass=%u tag=%08x, expected task %" PRIu64 " rows %" PRIu64,
                  when, slot, h->task, h->kind, h->rows, h->pass, h->sample,
                  task, n);
        return 0;
    }
    const uint64_t *w = (const uint64_t *)fq_slot_data(r, slot);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (w[i] != pattern_word(task, i)) {
            violation("%s: slot %u task %" PRIu64 " word %" PRIu64
                      " is %016" PRIx64 ", expected %016" PRIx64,
                      when, slot, task, i, w[i], pattern_word(task, i));
            return 0;
        }
        sum = mix64(sum ^ w[i]);
    }
    if (sum != h->payload_bytes) {
        violation("%s: slot %u task %" PRIu64 " checksum mismatch", when, slot,
                  task);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------- ownership */

/* owner[s]: 0 while slot s sits in a queue, else 1 + the id of the thread
 * holding it (the consumer is MAX_PRODUCERS). Set right after a pop and
 * cleared right before a push, with a CAS that must find the expected
 * value: two parties owning one slot at once fail it. seq_cst, but it
 * publishes nothing: the ring's own acquire/release must carry the data,
 * or TSan reports the slot accesses. */
static _Atomic int owner[MAX_SLOTS];

static void take(uint32_t slot, int who, const char *queue) {
    int expected = 0;
    if (!atomic_compare_exchange_strong(&owner[slot], &expected, who + 1))
        violation("thread %d popped slot %u from %s while thread %d owns it",
                  who, slot, queue, expected - 1);
}

static void give(uint32_t slot, int who, const char *queue) {
    int expected = who + 1;
    if (!atomic_compare_exchange_strong(&owner[slot], &expected, 0))
        violation("thread %d pushes slot %u on %s but the owner is %d", who,
                  slot, queue, expected - 1);
}

/* ------------------------------------------------------------ ring setup */

typedef struct region {
    void *base;
    size_t len;
    fq_ring ring;
} region;

static int region_open(region *g, uint32_t nslots, uint32_t nworkers,
                       uint64_t slot_bytes, uint64_t spin_ns) {
    fq_geometry geo = {nslots, nworkers, slot_bytes,
                       (uint64_t)sysconf(_SC_PAGESIZE), spin_ns};
    uint64_t len = fq_layout(&geo, NULL);
    if (len == 0) return FQ_EINVAL;
    /* MAP_SHARED anonymous memory is zeroed, like the real memfd. */
    void *base = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return FQ_ESYS;
    g->base = base;
    g->len = (size_t)len;
    int rc = fq_init(base, len, &geo, &g->ring);
    if (rc != FQ_OK) munmap(base, (size_t)len);
    for (uint32_t s = 0; s < MAX_SLOTS; s++) atomic_store(&owner[s], 0);
    return rc;
}

static void region_close(region *g) { munmap(g->base, g->len); }

/* ------------------------------------------------------------ the stress */

typedef struct shared_run {
    fq_ring *ring;
    uint32_t nslots;
    uint32_t nproducers;
    uint64_t ntasks;
    uint32_t round;
    uint64_t seed;
    int hold_all;        /* the consumer may lease every slot */
    uint8_t *seen;       /* [ntasks]: written by the consumer only */
    uint8_t *seen_end;   /* [nproducers]: end markers, by the consumer only */
    /* Stats, each written by one thread and read after the joins. */
    uint64_t timeouts;   /* consumer slices that ran out */
    uint64_t holds;      /* leases held past delivery */
    uint64_t detections; /* "consumer holds every slot" found */
    uint64_t max_window;
} shared_run;

typedef struct producer_arg {
    shared_run *run;
    int id;
    uint64_t timeouts; /* read after join */
} producer_arg;

static void *producer_main(void *p) {
    producer_arg *a = p;
    shared_run *run = a->run;
    fq_ring *r = run->ring;
    uint64_t rng = run->seed ^ mix64((uint64_t)a->id + 1);
    for (;;) {
        uint32_t slot;
        uint64_t t0 = fq_now_ns();
        int rc = fq_pop(r, FQ_FREE, &slot, PRODUCER_SLICE_NS, FQ_ABORT_ON_CLOSE);
        if (rc == FQ_TIMEOUT || rc == FQ_EINTR) {
            a->timeouts++;
            continue;
        }
        if (rc == FQ_CLOSED) break;
        if (rc != FQ_OK) {
            violation("producer %d: fq_pop(FREE) returned %s", a->id,
                      status_name(rc));
            break;
        }
        if (slot >= run->nslots) {
            violation("producer %d popped slot %u of %u", a->id, slot,
                      run->nslots);
            break;
        }
        take(slot, a->id, "FREE");
        /* After the slot, as the protocol demands: see fq_ring.h step 2. */
        uint64_t task = fq_claim_task(r);
        fq_worker_set_task(r, (uint32_t)a->id, (int64_t)task);
        jitter(&rng);
        if (task >= run->ntasks) {
            /* Tasks are spent: publish an end marker and stop, as a worker
             * whose iterator ended. */
            fq_slot_header *h = &r->headers[slot];
            h->task = task;
            h->kind = FQ_SLOT_END;
            h->worker = a->id;
            h->pass = run->round;
            give(slot, a->id, "READY");
            rc = fq_push(r, FQ_READY, slot);
            if (rc != FQ_OK)
                violation("producer %d: fq_push(READY) returned %s", a->id,
                          status_name(rc));
            break;
        }
        fill_slot(r, slot, task, a->id, run->round);
        jitter(&rng);
        fq_worker_done(r, (uint32_t)a->id, 0, fq_now_ns() - t0);
        give(slot, a->id, "READY");
        rc = fq_push(r, FQ_READY, slot);
        if (rc != FQ_OK) {
            violation("producer %d: fq_push(READY, %u) returned %s", a->id,
                      slot, status_name(rc));
            break;
        }
    }
    return NULL;
}

typedef struct lease {
    uint32_t slot;
    uint64_t task;
    unsigned ttl; /* consumer iterations until release */
} lease;

#define CONSUMER_ID MAX_PRODUCERS

static void release_slot(shared_run *run, uint32_t slot) {
    give(slot, CONSUMER_ID, "FREE");
    int rc = fq_push(run->ring, FQ_FREE, slot);
    if (rc != FQ_OK)
        violation("consumer: fq_push(FREE, %u) returned %s", slot,
                  status_name(rc));
}

static void release_lease(shared_run *run, lease *l) {
    /* A slot reused while leased would have changed under the user. */
    check_slot(run->ring, l->slot, l->task, run->round, "at release");
    release_slot(run, l->slot);
}

static void *consumer_main(void *p) {
    shared_run *run = p;
    fq_ring *r = run->ring;
    const uint32_t n = run->nslots;
    uint64_t rng = run->seed ^ 0xc0ffeeull;
    /* window[t % n]: 1 + the slot holding task t, for expected < t <
     * expected + n (at most n tasks are in flight). */
    uint32_t window[MAX_SLOTS] = {0};
    uint32_t in_window = 0;
    lease leases[MAX_SLOTS];
    uint32_t held = 0;
    uint64_t expected = 0;
    uint64_t last_item = fq_now_ns();
    const uint32_t max_held = run->hold_all ? n : n - 1;

    while (expected < run->ntasks && atomic_load(&violations) == 0) {
        for (uint32_t i = 0; i < held;) {
            if (leases[i].ttl-- == 0) {
                release_lease(run, &leases[i]);
                leases[i] = leases[--held];
            } else {
                i++;
            }
        }
        /* The deadlock DESIGN.md section 3 promises to detect: with every
         * slot here and the next task not among them, no worker can ever
         * produce it. The argument says the window is then empty. */
        if (held + in_window == n && window[expected % n] == 0) {
            if (in_window != 0)
                violation("consumer holds every slot with %u in the window "
                          "but task %" PRIu64 " missing: a claimed task has "
                          "no slot",
                          in_window, expected);
            run->detections++;
            /* The user's fix: give one back. */
            release_lease(run, &leases[0]);
            leases[0] = leases[--held];
        }

        uint32_t slot;
        int rc = fq_pop(r, FQ_READY, &slot, CONSUMER_SLICE_NS,
                        FQ_ABORT_ON_ALERT | FQ_ABORT_ON_CLOSE);
        if (rc == FQ_TIMEOUT || rc == FQ_EINTR) {
            run->timeouts++;
            if (fq_now_ns() - last_item > (uint64_t)STALL_NS &&
                fq_depth(r, FQ_FREE) > 0) {
                violation("consumer waited %.1f s on READY while FREE held "
                          "%u slots: a producer missed its wakeup",
                          (double)(fq_now_ns() - last_item) / SEC,
                          fq_depth(r, FQ_FREE));
                break;
            }
            continue;
        }
        if (rc != FQ_OK) {
            violation("consumer: fq_pop(READY) returned %s", status_name(rc));
            break;
        }
        last_item = fq_now_ns();
        if (slot >= n) {
            violation("consumer popped slot %u of %u", slot, n);
            break;
        }
        take(slot, CONSUMER_ID, "READY");
        const fq_slot_header *h = &r->headers[slot];
        uint64_t task = h->task;
        if (h->kind == FQ_SLOT_END) {
            if (task < run->ntasks || task >= run->ntasks + run->nproducers ||
                run->seen_end[task - run->ntasks]++)
                violation("end marker with task %" PRIu64 " (tasks %" PRIu64
                          ", producers %u) or seen twice",
                          task, run->ntasks, run->nproducers);
            release_slot(run, slot);
            continue;
        }
        if (!check_slot(r, slot, task, run->round, "at pop")) break;
        if (task < expected || task >= expected + n) {
            violation("task %" PRIu64 " arrived while expecting %" PRIu64
                      " with %u slots: %s",
                      task, expected, n,
                      task < expected ? "duplicate" : "beyond the window");
            break;
        }
        if (window[task % n] != 0) {
            violation("task %" PRIu64 " twice in the window", task);
            break;
        }
        window[task % n] = slot + 1;
        in_window++;
        if (in_window > run->max_window) run->max_window = in_window;

        /* Ordered delivery: hand out tasks in sequence from the window. */
        while (window[expected % n] != 0) {
            uint32_t s = window[expected % n] - 1;
            window[expected % n] = 0;
            in_window--;
            if (!check_slot(r, s, expected, run->round, "at delivery")) break;
            if (run->seen[expected]++)
                violation("task %" PRIu64 " delivered twice", expected);
            uint64_t roll = rng_next(&rng);
            if (held < max_held && (roll & 3) == 0) {
                leases[held].slot = s;
                leases[held].task = expected;
                leases[held].ttl = (unsigned)((roll >> 8) % 16);
                held++;
                run->holds++;
            } else {
                release_slot(run, s);
            }
            expected++;
        }
    }
    while (held > 0) release_lease(run, &leases[--held]);
    if (in_window != 0 && atomic_load(&violations) == 0)
        violation("%u tasks left in the window at the end", in_window);
    /* Producers blocked on FREE must wake: close is what a real consumer
     * does at the end, whatever state they are in. */
    fq_close(r);
    return NULL;
}

/* Joins t, or gives up at the deadline: a hung ring must not hang CI. */
static void join_or_die(pthread_t t, uint64_t deadline, const char *what) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = fq_now_ns();
    int64_t left = deadline > now ? (int64_t)(deadline - now) : 0;
    ts.tv_sec += (time_t)(left / SEC);
    ts.tv_nsec += (long)(left % SEC);
    if (ts.tv_nsec >= SEC) {
        ts.tv_sec++;
        ts.tv_nsec -= SEC;
    }
    if (pthread_timedjoin_np(t, NULL, &ts) != 0) {
        fprintf(stderr, "HANG: %s did not finish before the watchdog\n", what);
        fflush(stderr);
        _exit(3);
    }
}

typedef struct totals {
    uint64_t tasks, producer_timeouts, consumer_timeouts, holds, detections,
        max_window;
} totals;

static void stress_round(uint32_t round, uint32_t nslots, uint32_t nproducers,
                         uint64_t ntasks, uint64_t slot_bytes, uint64_t seed,
                         totals *tot) {
    static const uint64_t spins[] = {0, 2000, 100000};
    region g;
    int rc = region_open(&g, nslots, nproducers, slot_bytes,
                         spins[mix64(seed + round) % 3]);
    if (rc != FQ_OK) {
        violation("round %u: ring setup failed: %s", round, status_name(rc));
        return;
    }
    shared_run run;
    memset(&run, 0, sizeof run);
    run.ring = &g.ring;
    run.nslots = nslots;
    run.nproducers = nproducers;
    run.ntasks = ntasks;
    run.round = round;
    run.seed = mix64(seed ^ round);
    run.hold_all = (round % 3) == 2;
    run.seen = calloc(ntasks, 1);
    run.seen_end = calloc(nproducers, 1);
    if (!run.seen || !run.seen_end) {
        violation("out of memory");
        return;
    }
    producer_arg args[MAX_PRODUCERS];
    pthread_t threads[MAX_PRODUCERS], consumer;
    for (uint32_t i = 0; i < nproducers; i++) {
        args[i].run = &run;
        args[i].id = (int)i;
        args[i].timeouts = 0;
        pthread_create(&threads[i], NULL, producer_main, &args[i]);
    }
    pthread_create(&consumer, NULL, consumer_main, &run);

    uint64_t deadline = fq_now_ns() + WATCHDOG_NS;
    join_or_die(consumer, deadline, "the consumer");
    for (uint32_t i = 0; i < nproducers; i++) {
        join_or_die(threads[i], fq_now_ns() + 10 * SEC, "a producer");
        tot->producer_timeouts += args[i].timeouts;
    }

    for (uint64_t t = 0; t < ntasks; t++) {
        if (run.seen[t] != 1) {
            violation("round %u (%u slots, %u producers): task %" PRIu64
                      " seen %u times",
                      round, nslots, nproducers, t, run.seen[t]);
            break;
        }
    }
    uint64_t claimed = atomic_load(&g.ring.ctrl->next_task);
    if (claimed < ntasks || claimed > ntasks + nproducers)
        violation("round %u: next_task is %" PRIu64 " after %" PRIu64
                  " tasks and %u producers",
                  round, claimed, ntasks, nproducers);
    /* Every slot is back in a queue, each exactly once. */
    unsigned count[MAX_SLOTS] = {0};
    uint32_t s, total = 0;
    for (int q = 0; q < 2; q++)
        while (fq_try_pop(&g.ring, (fq_queue_id)q, &s) == FQ_OK) {
            if (s < nslots) count[s]++;
            total++;
        }
    for (uint32_t i = 0; i < nslots; i++)
        if (count[i] != 1 || atomic_load(&owner[i]) != 0)
            violation("round %u: slot %u found %u times in the queues, "
                      "owner %d",
                      round, i, count[i], atomic_load(&owner[i]) - 1);
    if (total != nslots)
        violation("round %u: %u indices in the queues for %u slots", round,
                  total, nslots);

    tot->tasks += ntasks;
    tot->consumer_timeouts += run.timeouts;
    tot->holds += run.holds;
    tot->detections += run.detections;
    if (run.max_window > tot->max_window) tot->max_window = run.max_window;
    free(run.seen);
    free(run.seen_end);
    region_close(&g);
}

/* ------------------------------------------------------------ wake tests */

typedef struct waiter_arg {
    fq_ring *ring;
    int kind; /* 0: pop FREE, 1: wait_control, 2: pop READY */
    unsigned abort;
    int64_t timeout_ns;
    int rc;
    uint64_t returned_ns;
    _Atomic int started; /* publishes nothing: a start flag */
} waiter_arg;

static void *waiter_main(void *p) {
    waiter_arg *a = p;
    atomic_store(&a->started, 1);
    uint32_t slot;
    if (a->kind == 1)
        a->rc = fq_wait_control(a->ring, fq_control(a->ring), a->timeout_ns);
    else
        a->rc = fq_pop(a->ring, a->kind == 0 ? FQ_FREE : FQ_READY, &slot,
                       a->timeout_ns, a->abort);
    a->returned_ns = fq_now_ns();
    return NULL;
}

/* Waits (bounded) until `want` threads are inside queue q's slow path. */
static int await_sleepers(fq_ring *r, fq_queue_id q, uint32_t want) {
    uint64_t until = fq_now_ns() + 5 * SEC;
    while (atomic_load(&r->ctrl->queues[q].waiters) < want) {
        if (fq_now_ns() > until) return 0;
        sleep_ns(MS);
    }
    /* waiters counts them before their futex call: give them time to
     * reach it, so the test covers real sleepers, not just late checkers.
     * Missing it only makes the test weaker, never wrong. */
    sleep_ns(20 * MS);
    return 1;
}

/* Every producer asleep on an empty FREE, and a thread between passes on
 * the control word, must return FQ_CLOSED promptly after fq_close. */
static double test_close_wakes_all(uint32_t nproducers, uint64_t spin_ns) {
    region g;
    if (region_open(&g, 2, nproducers, 4096, spin_ns) != FQ_OK) {
        violation("close test: ring setup failed");
        return 0;
    }
    uint32_t s;
    /* The consumer holds every slot, so FREE is empty. */
    while (fq_try_pop(&g.ring, FQ_FREE, &s) == FQ_OK) {
    }
    waiter_arg w[MAX_PRODUCERS + 1];
    pthread_t t[MAX_PRODUCERS + 1];
    uint32_t n = nproducers + 1;
    for (uint32_t i = 0; i < n; i++) {
        w[i].ring = &g.ring;
        w[i].kind = i == nproducers ? 1 : 0;
        w[i].abort = FQ_ABORT_ON_CLOSE;
        w[i].timeout_ns = 30 * SEC;
        w[i].rc = -100;
        atomic_init(&w[i].started, 0);
        pthread_create(&t[i], NULL, waiter_main, &w[i]);
    }
    if (!await_sleepers(&g.ring, FQ_FREE, nproducers))
        violation("close test: producers never reached the FREE wait");
    for (uint32_t i = 0; i < n; i++)
        while (!atomic_load(&w[i].started)) sched_yield();
    sleep_ns(5 * MS);
    uint64_t t0 = fq_now_ns();
    fq_close(&g.ring);
    double worst = 0;
    for (uint32_t i = 0; i < n; i++) {
        join_or_die(t[i], t0 + 10 * SEC, "a waiter after close");
        double ms = (double)(w[i].returned_ns - t0) / MS;
        if (ms > worst) worst = ms;
        if (w[i].rc != FQ_CLOSED)
            violation("close test: %s waiter %u returned %s, expected "
                      "FQ_CLOSED",
                      w[i].kind == 1 ? "control" : "FREE", i,
                      status_name(w[i].rc));
        if (w[i].returned_ns < t0 ||
            w[i].returned_ns - t0 > (uint64_t)WAKE_DEADLINE_NS)
            violation("close test: waiter %u returned %.1f ms after close",
                      i, ms);
    }
    region_close(&g);
    return worst;
}

/* fq_alert wakes the consumer asleep on READY with FQ_ALERT, leaves FREE
 * sleepers alone, and stays raised; items still come out first. */
static double test_alert(void) {
    region g;
    if (region_open(&g, 2, 1, 4096, 0) != FQ_OK) {
        violation("alert test: ring setup failed");
        return 0;
    }
    fq_ring *r = &g.ring;
    uint32_t held[2];
    fq_try_pop(r, FQ_FREE, &held[0]);
    fq_try_pop(r, FQ_FREE, &held[1]);
    waiter_arg w[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        w[i].ring = r;
        w[i].kind = i == 0 ? 2 : 0;
        w[i].abort = i == 0 ? FQ_ABORT_ON_ALERT | FQ_ABORT_ON_CLOSE
                            : FQ_ABORT_ON_CLOSE;
        /* The FREE sleeper's slice outlasts the alert check below. */
        w[i].timeout_ns = i == 0 ? 30 * SEC : 300 * MS;
        w[i].rc = -100;
        atomic_init(&w[i].started, 0);
        pthread_create(&t[i], NULL, waiter_main, &w[i]);
    }
    if (!await_sleepers(r, FQ_READY, 1) || !await_sleepers(r, FQ_FREE, 1))
        violation("alert test: waiters never slept");
    uint64_t t0 = fq_now_ns();
    fq_alert(r);
    join_or_die(t[0], t0 + 10 * SEC, "the consumer after alert");
    double ms = (double)(w[0].returned_ns - t0) / MS;
    if (w[0].rc != FQ_ALERT)
        violation("alert test: READY waiter returned %s", status_name(w[0].rc));
    if (w[0].returned_ns - t0 > (uint64_t)WAKE_DEADLINE_NS)
        violation("alert test: READY waiter woke %.1f ms after alert", ms);
    join_or_die(t[1], t0 + 10 * SEC, "the FREE waiter after alert");
    if (w[1].rc != FQ_TIMEOUT)
        violation("alert test: FREE waiter returned %s, expected FQ_TIMEOUT: "
                  "the alert is for the consumer only",
                  status_name(w[1].rc));
    uint32_t s;
    if (fq_pop(r, FQ_READY, &s, 10 * MS, FQ_ABORT_ON_ALERT) != FQ_ALERT)
        violation("alert test: the alert is not sticky");
    fq_push(r, FQ_READY, held[0]);
    if (fq_pop(r, FQ_READY, &s, 10 * MS, FQ_ABORT_ON_ALERT) != FQ_OK ||
        s != held[0])
        violation("alert test: a published slot did not come out first");
    region_close(&g);
    return ms;
}

/* ------------------------------------------------------------ EFULL repro */

/*
 * A popper preempted between its tail CAS and its cell release leaves the
 * cell's seq one lap behind. Once the other slots have gone round the
 * queue, the next push lands on that cell; it must wait for the release
 * (fq_ring.h, "Queues"), not report FQ_EFULL as a full queue, which with
 * nslots indices cannot exist. This drives that interleaving by hand, doing
 * fq_try_pop's two halves on the real cells (white box: keep it in step
 * with fq_try_pop), and exits 1 if the push fails. The late popper is
 * released after 200 ms, so a push that waits cannot hang the test.
 */
typedef struct late_popper {
    fq_ring *ring;
    _Atomic int stage; /* 1: tail claimed; 2: may release the cell */
    uint32_t slot;
} late_popper;

static void *late_popper_main(void *p) {
    late_popper *lp = p;
    fq_ring *r = lp->ring;
    fq_queue *q = &r->ctrl->queues[FQ_FREE];
    fq_cell *cells = r->cells[FQ_FREE];
    uint64_t mask = r->ctrl->capacity - 1;
    uint64_t pos = atomic_load(&q->tail);
    fq_cell *cell = &cells[pos & mask];
    if (atomic_load_explicit(&cell->seq, memory_order_acquire) != pos + 1 ||
        !atomic_compare_exchange_strong(&q->tail, &pos, pos + 1)) {
        violation("efull repro: could not claim the head cell");
        atomic_store(&lp->stage, 1);
        return NULL;
    }
    lp->slot = (uint32_t)cell->slot;
    atomic_store(&lp->stage, 1);
    while (atomic_load(&lp->stage) != 2) sched_yield();
    atomic_store_explicit(&cell->seq, pos + mask + 1, memory_order_release);
    return NULL;
}

typedef struct pusher {
    fq_ring *ring;
    uint32_t slot;
    _Atomic int rc_plus; /* 0: still pushing; else 1 + the status + 100 */
} pusher;

static void *pusher_main(void *p) {
    pusher *pu = p;
    int rc = fq_push(pu->ring, FQ_FREE, pu->slot);
    atomic_store(&pu->rc_plus, rc + 101);
    return NULL;
}

static int efull_repro(void) {
    region g;
    /* Two slots, a power of two: capacity == nslots, the tightest case;
     * any nslots shows it once enough pushes went round. */
    if (region_open(&g, 2, 2, 4096, 0) != FQ_OK) {
        fprintf(stderr, "efull repro: ring setup failed\n");
        return 1;
    }
    fq_ring *r = &g.ring;
    late_popper lp = {r, 0, 0};
    pthread_t tp, tq;
    pthread_create(&tp, NULL, late_popper_main, &lp);
    while (atomic_load(&lp.stage) != 1) sched_yield();
    /* The other slot goes round once: worker, READY, consumer, FREE. */
    uint32_t s, s2;
    int rc = fq_pop(r, FQ_FREE, &s, 100 * MS, FQ_ABORT_ON_CLOSE);
    if (rc == FQ_OK) rc = fq_push(r, FQ_READY, s);
    if (rc == FQ_OK) rc = fq_pop(r, FQ_READY, &s2, 100 * MS, 0);
    if (rc != FQ_OK) {
        fprintf(stderr, "efull repro: cycling the other slot: %s\n",
                status_name(rc));
        atomic_store(&lp.stage, 2);
        pthread_join(tp, NULL);
        return 1;
    }
    pusher pu = {r, s2, 0};
    pthread_create(&tq, NULL, pusher_main, &pu);
    uint64_t until = fq_now_ns() + 200 * MS;
    while (atomic_load(&pu.rc_plus) == 0 && fq_now_ns() < until) sleep_ns(MS);
    int early = atomic_load(&pu.rc_plus);
    atomic_store(&lp.stage, 2);
    pthread_join(tp, NULL);
    pthread_join(tq, NULL);
    rc = atomic_load(&pu.rc_plus) - 101;
    region_close(&g);
    if (rc == FQ_EFULL) {
        printf("efull repro: FAIL: fq_push(FREE) returned FQ_EFULL with 1 of "
               "2 slots in hand, because a popper had claimed the tail but "
               "not yet released its cell\n");
        return 1;
    }
    if (rc != FQ_OK) {
        printf("efull repro: fq_push(FREE) returned %s\n", status_name(rc));
        return 1;
    }
    printf("efull repro: OK: the push %s\n",
           early ? "succeeded at once" : "waited for the late popper");
    return 0;
}

/* ------------------------------------------------------------------ main */

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--short|--long] [-r rounds] [-t tasks] [-p producers]"
            " [-s max_slots] [-b slot_bytes] [-S seed]\n"
            "       %s --efull-repro\n",
            argv0, argv0);
}

int main(int argc, char **argv) {
    /* --short is the default: what CI runs under every sanitizer. */
    uint32_t rounds = 32, max_producers = 4, max_slots = 16;
    uint64_t tasks = 3000, slot_bytes = 8192, seed = 12345;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--short")) {
            rounds = 32; tasks = 3000; max_producers = 4; max_slots = 16;
        } else if (!strcmp(a, "--long")) {
            rounds = 96; tasks = 20000; max_producers = 8; max_slots = 16;
        } else if (!strcmp(a, "--efull-repro")) {
            return efull_repro();
        } else if (v && !strcmp(a, "-r")) {
            rounds = (uint32_t)strtoul(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-t")) {
            tasks = strtoull(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-p")) {
            max_producers = (uint32_t)strtoul(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-s")) {
            max_slots = (uint32_t)strtoul(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-b")) {
            slot_bytes = strtoull(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-S")) {
            seed = strtoull(v, NULL, 0); i++;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    if (rounds == 0 || tasks == 0 || max_producers == 0 ||
        max_producers > MAX_PRODUCERS || max_slots == 0 ||
        max_slots > MAX_SLOTS || slot_bytes < 8) {
        fprintf(stderr, "bad arguments: producers 1..%d, slots 1..%d, "
                        "slot_bytes >= 8\n",
                MAX_PRODUCERS, MAX_SLOTS);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t start = fq_now_ns();
    totals tot;
    memset(&tot, 0, sizeof tot);
    for (uint32_t round = 0; round < rounds && !atomic_load(&violations);
         round++) {
        /* Sweep every ring size, and pair each with varying producer
         * counts so that 1 slot / many producers and many slots / 1
         * producer both occur. */
        uint32_t nslots = 1 + round % max_slots;
        uint32_t nproducers = 1 + (uint32_t)(mix64(seed + round) % max_producers);
        stress_round(round, nslots, nproducers, tasks, slot_bytes, seed, &tot);
    }
    double close_ms = 0, alert_ms = 0;
    for (uint32_t i = 0; i < 6 && !atomic_load(&violations); i++) {
        /* Half with a long spin phase, so close also lands on spinners. */
        double ms = test_close_wakes_all(1 + i % max_producers,
                                         (i & 1) ? 200 * 1000 : 0);
        if (ms > close_ms) close_ms = ms;
    }
    if (!atomic_load(&violations)) alert_ms = test_alert();
    unsigned v = atomic_load(&violations);
    printf("stress_ring: %s rounds=%u tasks=%" PRIu64 " slots=1..%u "
           "producers<=%u holds=%" PRIu64 " all-held-detected=%" PRIu64
           " max_window=%" PRIu64 " timeouts=%" PRIu64 "/%" PRIu64
           " close_wake_max_ms=%.2f alert_wake_ms=%.2f violations=%u"
           " elapsed=%.2fs\n",
           v ? "FAIL" : "OK", rounds, tot.tasks, max_slots, max_producers,
           tot.holds, tot.detections, tot.max_window, tot.producer_timeouts,
           tot.consumer_timeouts, close_ms, alert_ms, v,
           (double)(fq_now_ns() - start) / SEC);
    return v ? 1 : 0;
}
