/*
 * stress_ring: stress and fault tests of the fq ring protocol (fq_ring.h).
 *
 * Modes, and what each checks:
 *
 *   (default) / --short / --long   threaded stress. Threads stand in for
 *     processes: the region is anonymous MAP_SHARED memory, the same kind of
 *     memory and the same process-shared futexes the real workers use. P
 *     producer threads follow the worker loop (pop FREE as WORKER(w), claim
 *     a task into the slot's census, fill the slot, push READY as
 *     READY(w)); one consumer thread follows _consumer.pxi (pop READY as
 *     CONSUMER, reorder window, ordered delivery, leases released to FREE
 *     with fq_try_push, a release that meets FQ_EBUSY kept and retried
 *     before each wait). fq_set_fault stalls a popper inside its pop now
 *     and then (a signal handler sleeps there), so that the deferral runs
 *     on every run. Checked: everything the consumer reads against what
 *     the task number says the producer wrote (a slot handed to two
 *     parties, a torn publish, a lost or duplicated task); the census (a
 *     producer's slot says WORKER(w) and, once claimed, its task; a slot
 *     says CONSUMER exactly while the consumer's books hold it); every slot
 *     back in one queue at the end. Then wake tests with deadlines: close
 *     wakes every FREE and control sleeper, alert wakes the READY sleeper.
 *     The sanitizer builds (TSan, ASan+UBSan) see every access.
 *
 *   --stalled-popper   a popper held inside the real fq_try_pop, between its
 *     tail CAS and its cell release (fq_set_fault raising a signal whose
 *     handler waits), on FREE and on READY: a push that laps onto its cell
 *     gets FQ_EBUSY from fq_try_push with nothing changed, FQ_TIMEOUT from
 *     fq_push within its timeout, and then, from an fq_push waiting in
 *     another thread: FQ_OK once the popper resumes, FQ_ALERT after
 *     fq_alert, FQ_CLOSED after fq_close.
 *
 *   --fork-kills   worker processes (fork) and the parent as consumer, with
 *     a death watcher thread per child calling fq_alert as the real pool
 *     does. One worker SIGKILLs itself at a fault point (POP_FREE, CLAIM,
 *     PUSH_READY) after a countdown; a consumer child dies at POP_READY or
 *     PUSH_FREE while a worker goes on. Checked: the death is seen, every
 *     waiter ends (consumer by alert, workers by close), the census says
 *     exactly what each fault point leaves, every slot and every claimed
 *     task is accounted for once, delivery was in order with no
 *     duplicate, and a push that meets the dead process's cell returns
 *     (FQ_EBUSY, FQ_TIMEOUT, FQ_CLOSED) instead of blocking. In
 *     stress_fork.c.
 *
 *   --stop-cont   as --fork-kills, but the worker SIGSTOPs itself at the
 *     fault point and is continued ~200 ms later: no alert, no error, the
 *     releases that met its cell are deferred and all go through, every
 *     task delivered once, every slot back in a queue. In stress_fork.c.
 *
 * Usage: stress_ring [--short | --long] [-r rounds] [-t tasks] [-p producers]
 *                    [-s max_slots] [-b slot_bytes] [-S seed]
 *        stress_ring --stalled-popper
 *        stress_ring --fork-kills | --stop-cont [--long] [-r sweeps] [-S seed]
 * Exit 0: no violation; 1: a violation (each printed on stderr); 2: usage;
 * 3: something hung past the watchdog.
 */
#define _GNU_SOURCE
#include "stress_ring.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

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

/* ------------------------------------------------------------- reporting */

_Atomic unsigned violations;

void violation(const char *fmt, ...) {
    /* Printing only the first few keeps a cascade readable. */
    if (atomic_fetch_add(&violations, 1) >= 20) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("VIOLATION: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

const char *status_name(int rc) {
    switch (rc) {
    case FQ_OK: return "FQ_OK";
    case FQ_EMPTY: return "FQ_EMPTY";
    case FQ_TIMEOUT: return "FQ_TIMEOUT";
    case FQ_CLOSED: return "FQ_CLOSED";
    case FQ_ALERT: return "FQ_ALERT";
    case FQ_EINTR: return "FQ_EINTR";
    case FQ_EBUSY: return "FQ_EBUSY";
    case FQ_EINVAL: return "FQ_EINVAL";
    case FQ_EBADMAGIC: return "FQ_EBADMAGIC";
    case FQ_EVERSION: return "FQ_EVERSION";
    case FQ_ESMALL: return "FQ_ESMALL";
    case FQ_ESYS: return "FQ_ESYS";
    default: return "unknown status";
    }
}

const char *owner_name(uint32_t owner, char *buf) {
    static const char *const kinds[] = {"FREE", "WORKER", "READY", "CONSUMER"};
    uint32_t kind = FQ_OWNER_KIND(owner);
    if (kind > FQ_OWNER_CONSUMER)
        snprintf(buf, 32, "?%08x", owner);
    else if (kind == FQ_OWNER_WORKER || kind == FQ_OWNER_READY)
        snprintf(buf, 32, "%s(%u)", kinds[kind], FQ_OWNER_WHO(owner));
    else
        snprintf(buf, 32, "%s", kinds[kind]);
    return buf;
}

void expect_census(const fq_ring *r, uint32_t slot, uint32_t owner,
                          uint64_t task, const char *when) {
    uint32_t o = fq_slot_owner(r, slot);
    uint64_t t = fq_slot_task(r, slot);
    if (o != owner || (task != ANY_TASK && t != task)) {
        char a[32], b[32];
        violation("%s: slot %u census says %s task %" PRId64 ", expected %s"
                  " task %" PRId64,
                  when, slot, owner_name(o, a), (int64_t)t,
                  owner_name(owner, b), (int64_t)task);
    }
}

/* ------------------------------------------------- determinism and delays */

uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_next(uint64_t *s) { return mix64(*s += 0x9e3779b97f4a7c15ull); }

/* Small random delays move the threads' relative timing around so that
 * many interleavings of pops and pushes occur, including a producer
 * stalled while holding its slot. */
void jitter(uint64_t *rng) {
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

void sleep_ns(int64_t ns) {
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

/* The task itself is in the header already: fq_claim_task recorded it. */
void fill_slot(fq_ring *r, uint32_t slot, uint64_t task, int worker,
               uint32_t round) {
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    uint64_t *w = (uint64_t *)fq_slot_data(r, slot);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        w[i] = pattern_word(task, i);
        sum = mix64(sum ^ w[i]);
    }
    fq_slot_header *h = &r->headers[slot];
    h->rows = n;
    h->payload_bytes = sum;
    h->pass = round;
    h->worker = worker;
    h->kind = FQ_SLOT_BATCH;
    h->sample = header_tag(task);
}

/* Returns 1 when slot's header and data are exactly what task `task`
 * produces; otherwise reports what differs. */
int check_slot(fq_ring *r, uint32_t slot, uint64_t task, uint32_t round,
               const char *when) {
    const fq_slot_header *h = &r->headers[slot];
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    uint64_t ht = fq_slot_task(r, slot);
    if (ht != task || h->kind != FQ_SLOT_BATCH || h->rows != n ||
        h->pass != round || h->sample != header_tag(task)) {
        violation("%s: slot %u header task=%" PRIu64 " kind=%u rows=%" PRIu64
                  " pass=%u tag=%08x, expected task %" PRIu64 " rows %" PRIu64,
                  when, slot, ht, h->kind, h->rows, h->pass, h->sample, task,
                  n);
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
 * value: two parties owning one slot at once fail it. This is the test's
 * own record, independent of the ring's census word. seq_cst, but it
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

int region_open(region *g, uint32_t nslots, uint32_t nworkers,
                uint64_t slot_bytes, uint64_t spin_ns) {
    fq_geometry geo = {nslots, nworkers, slot_bytes,
                       (uint64_t)sysconf(_SC_PAGESIZE), spin_ns};
    uint64_t len = fq_layout(&geo, NULL);
    if (len == 0) return FQ_EINVAL;
    /* MAP_SHARED anonymous memory is zeroed, like the real memfd, and
     * children forked later share it. */
    void *base = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return FQ_ESYS;
    g->base = base;
    g->len = (size_t)len;
    int rc = fq_init(base, len, &geo, &g->ring);
    if (rc != FQ_OK) munmap(base, (size_t)len);
    return rc;
}

void region_close(region *g) { munmap(g->base, g->len); }

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
    uint64_t ebusy;      /* releases that met a stalled popper's cell */
    uint64_t max_deferred;
} shared_run;

typedef struct producer_arg {
    shared_run *run;
    int id;
    uint64_t timeouts;   /* read after join */
    uint64_t ready_busy; /* publishes that met the consumer inside its pop */
} producer_arg;

/* The worker's publish (_ring.pyx, Ring.publish): one try, then waits in
 * slices for a consumer stalled inside its READY pop, stopping on close. */
static int publish(producer_arg *a, uint32_t slot) {
    fq_ring *r = a->run->ring;
    uint32_t me = FQ_OWNER(FQ_OWNER_READY, a->id);
    int rc = fq_try_push(r, FQ_READY, slot, me);
    if (rc == FQ_EBUSY) a->ready_busy++;
    while (rc == FQ_EBUSY || rc == FQ_TIMEOUT)
        rc = fq_push(r, FQ_READY, slot, me, PRODUCER_SLICE_NS,
                     FQ_ABORT_ON_CLOSE);
    return rc;
}

static void *producer_main(void *p) {
    producer_arg *a = p;
    shared_run *run = a->run;
    fq_ring *r = run->ring;
    const uint32_t me = FQ_OWNER(FQ_OWNER_WORKER, a->id);
    uint64_t rng = run->seed ^ mix64((uint64_t)a->id + 1);
    for (;;) {
        uint32_t slot;
        uint64_t t0 = fq_now_ns();
        int rc = fq_pop(r, FQ_FREE, &slot, me, PRODUCER_SLICE_NS,
                        FQ_ABORT_ON_CLOSE);
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
        expect_census(r, slot, me, FQ_NO_TASK, "producer after its pop");
        /* After the slot, as the protocol demands: see fq_ring.h step 2. */
        uint64_t task = fq_claim_task(r, slot);
        expect_census(r, slot, me, task, "producer after its claim");
        jitter(&rng);
        fq_slot_header *h = &r->headers[slot];
        if (task >= run->ntasks) {
            /* Tasks are spent: publish an end marker and stop, as a worker
             * whose iterator ended. */
            h->kind = FQ_SLOT_END;
            h->worker = a->id;
            h->pass = run->round;
            give(slot, a->id, "READY");
            rc = publish(a, slot);
            if (rc != FQ_OK)
                violation("producer %d: publishing its end marker: %s", a->id,
                          status_name(rc));
            break;
        }
        fill_slot(r, slot, task, a->id, run->round);
        jitter(&rng);
        fq_worker_done(r, (uint32_t)a->id, 0, fq_now_ns() - t0);
        /* Nobody else may have touched the census while we held it. */
        expect_census(r, slot, me, task, "producer before its publish");
        give(slot, a->id, "READY");
        rc = publish(a, slot);
        if (rc != FQ_OK) {
            violation("producer %d: publishing slot %u: %s", a->id, slot,
                      status_name(rc));
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
#define CONSUMER_OWNER FQ_OWNER(FQ_OWNER_CONSUMER, 0)
#define FREE_OWNER FQ_OWNER(FQ_OWNER_FREE, 0)

/* What the consumer holds, as _consumer.pxi keeps it: `mine` is set from
 * its READY pop until its FREE push goes through; `deferred` lists the
 * releases that met a stalled popper's cell. */
typedef struct books {
    uint8_t mine[MAX_SLOTS];
    uint32_t deferred[MAX_SLOTS];
    uint32_t ndeferred;
} books;

/* _consumer.pxi's _free: never waits (the real one runs in finalizers),
 * so a push that meets a stalled popper is kept for a retry. */
static void release_slot(shared_run *run, books *b, uint32_t slot) {
    fq_ring *r = run->ring;
    expect_census(r, slot, CONSUMER_OWNER, ANY_TASK, "consumer releasing");
    give(slot, CONSUMER_ID, "FREE");
    int rc = fq_try_push(r, FQ_FREE, slot, FREE_OWNER);
    if (rc == FQ_OK) {
        b->mine[slot] = 0;
        return;
    }
    /* Not pushed, so no one else can have taken it meanwhile. */
    take(slot, CONSUMER_ID, "its deferred releases");
    if (rc != FQ_EBUSY)
        violation("consumer: fq_try_push(FREE, %u) returned %s", slot,
                  status_name(rc));
    b->deferred[b->ndeferred++] = slot;
    run->ebusy++;
    if (b->ndeferred > run->max_deferred) run->max_deferred = b->ndeferred;
}

/* _consumer.pxi's _flush_deferred: run before every wait. */
static void flush_deferred(shared_run *run, books *b) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < b->ndeferred; i++) {
        uint32_t s = b->deferred[i];
        give(s, CONSUMER_ID, "FREE");
        int rc = fq_try_push(run->ring, FQ_FREE, s, FREE_OWNER);
        if (rc == FQ_OK) {
            b->mine[s] = 0;
            continue;
        }
        take(s, CONSUMER_ID, "its deferred releases");
        if (rc != FQ_EBUSY)
            violation("consumer: retrying fq_try_push(FREE, %u): %s", s,
                      status_name(rc));
        b->deferred[kept++] = s;
    }
    b->ndeferred = kept;
}

/* _consumer.pxi's audit, run before the consumer sleeps: the census says
 * CONSUMER exactly for the slots the books hold. Exact, not a snapshot:
 * only this thread writes CONSUMER, and only this thread overwrites it. */
static void audit(shared_run *run, const books *b) {
    for (uint32_t s = 0; s < run->nslots; s++) {
        uint32_t o = fq_slot_owner(run->ring, s);
        int census = FQ_OWNER_KIND(o) == FQ_OWNER_CONSUMER;
        if (census != b->mine[s]) {
            char buf[32];
            violation("consumer audit: slot %u census %s, books %s", s,
                      owner_name(o, buf), b->mine[s] ? "hold it" : "do not");
        }
    }
}

static void release_lease(shared_run *run, books *b, lease *l) {
    /* A slot reused while leased would have changed under the user. */
    check_slot(run->ring, l->slot, l->task, run->round, "at release");
    release_slot(run, b, l->slot);
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
    books b;
    memset(&b, 0, sizeof b);
    uint64_t expected = 0;
    uint64_t last_item = fq_now_ns();
    const uint32_t max_held = run->hold_all ? n : n - 1;

    while (expected < run->ntasks && atomic_load(&violations) == 0) {
        for (uint32_t i = 0; i < held;) {
            if (leases[i].ttl-- == 0) {
                release_lease(run, &b, &leases[i]);
                leases[i] = leases[--held];
            } else {
                i++;
            }
        }
        /* The deadlock DESIGN.md section 3 promises to detect: with every
         * slot here and the next task not among them, no worker can ever
         * produce it. The argument says the window is then empty. Deferred
         * releases are not "here": a paused popper will let them go. */
        if (held + in_window == n && window[expected % n] == 0) {
            if (in_window != 0)
                violation("consumer holds every slot with %u in the window "
                          "but task %" PRIu64 " missing: a claimed task has "
                          "no slot",
                          in_window, expected);
            run->detections++;
            /* The user's fix: give one back. */
            release_lease(run, &b, &leases[0]);
            leases[0] = leases[--held];
        }

        if (b.ndeferred) flush_deferred(run, &b);
        audit(run, &b);
        uint32_t slot;
        int rc = fq_pop(r, FQ_READY, &slot, CONSUMER_OWNER,
                        b.ndeferred ? DEFERRED_RETRY_NS : CONSUMER_SLICE_NS,
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
        if (b.mine[slot])
            violation("consumer popped slot %u its books already hold", slot);
        b.mine[slot] = 1;
        expect_census(r, slot, CONSUMER_OWNER, ANY_TASK, "consumer's pop");
        const fq_slot_header *h = &r->headers[slot];
        uint64_t task = fq_slot_task(r, slot);
        if (h->kind == FQ_SLOT_END) {
            if (task < run->ntasks || task >= run->ntasks + run->nproducers ||
                run->seen_end[task - run->ntasks]++)
                violation("end marker with task %" PRIu64 " (tasks %" PRIu64
                          ", producers %u) or seen twice",
                          task, run->ntasks, run->nproducers);
            release_slot(run, &b, slot);
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
                release_slot(run, &b, s);
            }
            expected++;
        }
    }
    while (held > 0) release_lease(run, &b, &leases[--held]);
    /* A stalled popper is a preempted producer thread: it comes back. */
    uint64_t until = fq_now_ns() + 10 * SEC;
    while (b.ndeferred && fq_now_ns() < until) {
        flush_deferred(run, &b);
        if (b.ndeferred) sleep_ns(100 * 1000);
    }
    if (b.ndeferred)
        violation("%u releases still deferred 10 s after the last task",
                  b.ndeferred);
    if (in_window != 0 && atomic_load(&violations) == 0)
        violation("%u tasks left in the window at the end", in_window);
    /* Producers blocked on FREE must wake: close is what a real consumer
     * does at the end, whatever state they are in. */
    fq_close(r);
    return NULL;
}

/* Stalls inside pops. fq_set_fault raises SIGUSR2 in the popping thread
 * between its tail CAS and its cell release; the handler sleeps there, as
 * a thread preempted at that instruction would, then arms the next stall,
 * FREE or READY. So the consumer's releases meet FQ_EBUSY and are
 * deferred on every run, instead of only when the scheduler happens to
 * preempt there. The handler is the only one that re-arms, so arms never
 * overlap. */
static _Atomic uint64_t stall_rng;

static void arm_next_stall(void) {
    uint64_t r = mix64(atomic_fetch_add(&stall_rng, 0x9e3779b97f4a7c15ull));
    fq_set_fault((r >> 32) & 1 ? FQ_FAULT_POP_FREE : FQ_FAULT_POP_READY,
                 1 + (uint32_t)((r >> 40) % 96), SIGUSR2);
}

static void stall_in_pop(int sig) {
    (void)sig;
    int saved = errno; /* the interrupted code may be about to read it */
    uint64_t r = mix64(atomic_load(&stall_rng));
    struct timespec ts = {0, (long)(20000 + r % 280000)};
    nanosleep(&ts, NULL);
    arm_next_stall();
    errno = saved;
}

typedef struct totals {
    uint64_t tasks, producer_timeouts, consumer_timeouts, holds, detections,
        max_window, ebusy, ready_busy, max_deferred;
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
    for (uint32_t s = 0; s < MAX_SLOTS; s++) atomic_store(&owner[s], 0);
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
    atomic_store(&stall_rng, run.seed);
    arm_next_stall();
    for (uint32_t i = 0; i < nproducers; i++) {
        memset(&args[i], 0, sizeof args[i]);
        args[i].run = &run;
        args[i].id = (int)i;
        pthread_create(&threads[i], NULL, producer_main, &args[i]);
    }
    pthread_create(&consumer, NULL, consumer_main, &run);

    uint64_t deadline = fq_now_ns() + WATCHDOG_NS;
    join_or_die(consumer, deadline, "the consumer");
    for (uint32_t i = 0; i < nproducers; i++) {
        join_or_die(threads[i], fq_now_ns() + 10 * SEC, "a producer");
        tot->producer_timeouts += args[i].timeouts;
        tot->ready_busy += args[i].ready_busy;
    }
    fq_set_fault(FQ_FAULT_NONE, 0, 0); /* the checks below pop too */

    for (uint64_t t = 0; t < ntasks; t++) {
        if (run.seen[t] != 1) {
            violation("round %u (%u slots, %u producers): task %" PRIu64
                      " seen %u times",
                      round, nslots, nproducers, t, run.seen[t]);
            break;
        }
    }
    uint64_t claimed = fq_next_task(&g.ring);
    if (claimed < ntasks || claimed > ntasks + nproducers)
        violation("round %u: next_task is %" PRIu64 " after %" PRIu64
                  " tasks and %u producers",
                  round, claimed, ntasks, nproducers);
    /* Every slot is back in exactly one queue, and its census says which:
     * FREE, or READY(w) for an end marker published after the last task. */
    for (uint32_t i = 0; i < nslots; i++) {
        int qf = fq_queued(&g.ring, FQ_FREE, i);
        int qr = fq_queued(&g.ring, FQ_READY, i);
        uint32_t o = fq_slot_owner(&g.ring, i);
        uint32_t want = qf ? FREE_OWNER
                           : FQ_OWNER(FQ_OWNER_READY,
                                      (uint32_t)g.ring.headers[i].worker);
        if (qf + qr != 1 || o != want) {
            char buf[32];
            violation("round %u: slot %u queued in FREE %d, READY %d, "
                      "census %s",
                      round, i, qf, qr, owner_name(o, buf));
        }
    }
    unsigned count[MAX_SLOTS] = {0};
    uint32_t s, total = 0;
    for (int q = 0; q < 2; q++)
        while (fq_try_pop(&g.ring, (fq_queue_id)q, &s, CONSUMER_OWNER) ==
               FQ_OK) {
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
    tot->ebusy += run.ebusy;
    if (run.max_window > tot->max_window) tot->max_window = run.max_window;
    if (run.max_deferred > tot->max_deferred)
        tot->max_deferred = run.max_deferred;
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
    else if (a->kind == 0)
        a->rc = fq_pop(a->ring, FQ_FREE, &slot, FQ_OWNER(FQ_OWNER_WORKER, 0),
                       a->timeout_ns, a->abort);
    else
        a->rc = fq_pop(a->ring, FQ_READY, &slot, CONSUMER_OWNER,
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
    while (fq_try_pop(&g.ring, FQ_FREE, &s, CONSUMER_OWNER) == FQ_OK) {
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
    fq_try_pop(r, FQ_FREE, &held[0], FQ_OWNER(FQ_OWNER_WORKER, 0));
    fq_try_pop(r, FQ_FREE, &held[1], FQ_OWNER(FQ_OWNER_WORKER, 0));
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
    if (fq_pop(r, FQ_READY, &s, CONSUMER_OWNER, 10 * MS, FQ_ABORT_ON_ALERT) !=
        FQ_ALERT)
        violation("alert test: the alert is not sticky");
    fq_try_push(r, FQ_READY, held[0], FQ_OWNER(FQ_OWNER_READY, 0));
    if (fq_pop(r, FQ_READY, &s, CONSUMER_OWNER, 10 * MS, FQ_ABORT_ON_ALERT) !=
            FQ_OK ||
        s != held[0])
        violation("alert test: a published slot did not come out first");
    region_close(&g);
    return ms;
}

/* --------------------------------------------------------- stalled popper */

/*
 * A popper stalled between its tail CAS and its cell release keeps that
 * cell; once the other slot has gone round the queue, the next push lands
 * on it (fq_ring.h, "Queues"). The stall is real: fq_set_fault raises
 * SIGUSR1 at that step of the real fq_try_pop and the handler holds the
 * popping thread there until the test lets it go (raise() runs the handler
 * in the raising thread before it returns, TSan included). Two slots, a
 * power of two: capacity == nslots, the tightest case.
 */
static _Atomic int stall_stage; /* 1: stalled inside the pop; 2: let go */

static void stall_handler(int sig) {
    (void)sig;
    int saved = errno;
    atomic_store(&stall_stage, 1);
    struct timespec ts = {0, 100000};
    while (atomic_load(&stall_stage) != 2) nanosleep(&ts, NULL);
    errno = saved;
}

typedef struct popper_arg {
    fq_ring *ring;
    fq_queue_id q;
    uint32_t owner;
    uint32_t slot;
    int rc;
} popper_arg;

static void *stalled_popper_main(void *p) {
    popper_arg *a = p;
    /* Process-wide, but no other thread pops until this one has stalled,
     * and it disarms itself as it fires. */
    fq_set_fault(a->q == FQ_FREE ? FQ_FAULT_POP_FREE : FQ_FAULT_POP_READY, 1,
                 SIGUSR1);
    a->rc = fq_try_pop(a->ring, a->q, &a->slot, a->owner);
    return NULL;
}

typedef struct pusher_arg {
    fq_ring *ring;
    fq_queue_id q;
    uint32_t slot, owner;
    _Atomic int rc_plus; /* 0: still pushing; else status + 100 */
    uint64_t returned_ns;
} pusher_arg;

static void *pusher_main(void *p) {
    pusher_arg *a = p;
    int rc = fq_push(a->ring, a->q, a->slot, a->owner, 30 * SEC,
                     FQ_ABORT_ON_CLOSE | FQ_ABORT_ON_ALERT);
    a->returned_ns = fq_now_ns();
    atomic_store(&a->rc_plus, rc + 100);
    return NULL;
}

enum { END_RESUME, END_ALERT, END_CLOSE };

/* One queue, one way for the waiting push to end. Returns how long that
 * push took to return after the event, in ms. */
static double stalled_popper_case(fq_queue_id q, int how) {
    static const char *const qname[] = {"FREE", "READY"};
    static const char *const hname[] = {"resume", "alert", "close"};
    char what[64];
    snprintf(what, sizeof what, "stalled %s popper, %s", qname[q], hname[how]);
    region g;
    if (region_open(&g, 2, 2, 4096, 0) != FQ_OK) {
        violation("%s: ring setup failed", what);
        return 0;
    }
    fq_ring *r = &g.ring;
    /* FREE: a worker stalls in its pop and the consumer's release meets
     * it. READY: the consumer stalls in its pop and a worker's publish
     * meets it. */
    uint32_t push_owner = q == FQ_FREE ? FREE_OWNER
                                       : FQ_OWNER(FQ_OWNER_READY, 0);
    uint32_t pop_owner = q == FQ_FREE ? FQ_OWNER(FQ_OWNER_WORKER, 1)
                                      : CONSUMER_OWNER;
    uint32_t a, b;
    if (q == FQ_READY) {
        fq_try_pop(r, FQ_FREE, &a, FQ_OWNER(FQ_OWNER_WORKER, 0));
        fq_try_push(r, FQ_READY, a, push_owner);
    }
    atomic_store(&stall_stage, 0);
    popper_arg pa = {r, q, pop_owner, UINT32_MAX, -100};
    pthread_t tp, tq;
    pthread_create(&tp, NULL, stalled_popper_main, &pa);
    uint64_t until = fq_now_ns() + 5 * SEC;
    while (atomic_load(&stall_stage) != 1) {
        if (fq_now_ns() > until) {
            fprintf(stderr, "HANG: %s: the popper never stalled\n", what);
            _exit(3);
        }
        sched_yield();
    }
    /* The other slot goes round until a push lands on the stalled cell. */
    if (fq_try_pop(r, FQ_FREE, &b, FQ_OWNER(FQ_OWNER_WORKER, 0)) != FQ_OK)
        violation("%s: no second slot", what);
    int rc = FQ_OK;
    for (int laps = 0; laps < 8 && rc == FQ_OK; laps++) {
        if (q == FQ_FREE) break;
        rc = fq_try_push(r, FQ_READY, b, push_owner);
        if (rc == FQ_OK &&
            fq_try_pop(r, FQ_READY, &b, CONSUMER_OWNER) != FQ_OK)
            violation("%s: the other slot did not come back", what);
    }
    fq_queue *qq = &r->ctrl->queues[q];
    uint64_t head = atomic_load(&qq->head);
    fq_cell *cell = &r->cells[q][head & (r->ctrl->capacity - 1)];
    uint64_t seq = atomic_load(&cell->seq), cslot = cell->slot;
    uint32_t bo = fq_slot_owner(r, b);
    uint64_t bt = fq_slot_task(r, b);

    /* 1. fq_try_push: FQ_EBUSY at once, nothing changed. */
    rc = fq_try_push(r, q, b, push_owner);
    if (rc != FQ_EBUSY)
        violation("%s: fq_try_push returned %s, expected FQ_EBUSY", what,
                  status_name(rc));
    if (atomic_load(&qq->head) != head || atomic_load(&cell->seq) != seq ||
        cell->slot != cslot || fq_slot_owner(r, b) != bo ||
        fq_slot_task(r, b) != bt)
        violation("%s: a push that answered FQ_EBUSY changed the queue or "
                  "the census",
                  what);
    /* 2. fq_push waits out its timeout and says so. */
    uint64_t t0 = fq_now_ns();
    rc = fq_push(r, q, b, push_owner, 50 * MS,
                 FQ_ABORT_ON_CLOSE | FQ_ABORT_ON_ALERT);
    uint64_t took = fq_now_ns() - t0;
    if (rc != FQ_TIMEOUT || took < (uint64_t)(50 * MS) ||
        took > (uint64_t)(50 * MS + WAKE_DEADLINE_NS))
        violation("%s: fq_push(50 ms) returned %s after %.1f ms", what,
                  status_name(rc), (double)took / MS);
    /* 3. A push waiting in another thread ends by the event. */
    pusher_arg pu = {r, q, b, push_owner, 0, 0};
    pthread_create(&tq, NULL, pusher_main, &pu);
    sleep_ns(20 * MS);
    if (atomic_load(&pu.rc_plus) != 0)
        violation("%s: the push returned %s before the event", what,
                  status_name(atomic_load(&pu.rc_plus) - 100));
    t0 = fq_now_ns();
    if (how == END_RESUME) atomic_store(&stall_stage, 2);
    if (how == END_ALERT) fq_alert(r);
    if (how == END_CLOSE) fq_close(r);
    join_or_die(tq, t0 + 10 * SEC, "a push after the event");
    double ms = (double)(pu.returned_ns - t0) / MS;
    static const int want[] = {FQ_OK, FQ_ALERT, FQ_CLOSED};
    rc = atomic_load(&pu.rc_plus) - 100;
    if (rc != want[how] || pu.returned_ns - t0 > (uint64_t)WAKE_DEADLINE_NS)
        violation("%s: the waiting push returned %s after %.1f ms, expected "
                  "%s",
                  what, status_name(rc), ms, status_name(want[how]));
    if (how == END_CLOSE) {
        /* The flags end a push only when it asks for them. */
        rc = fq_push(r, q, b, push_owner, 30 * MS, 0);
        if (rc != FQ_TIMEOUT)
            violation("%s: fq_push without abort flags returned %s after "
                      "close, expected FQ_TIMEOUT",
                      what, status_name(rc));
    }
    if (how != END_RESUME) {
        if (fq_try_push(r, q, b, push_owner) != FQ_EBUSY)
            violation("%s: the cell came free without the popper", what);
        atomic_store(&stall_stage, 2);
        join_or_die(tp, fq_now_ns() + 10 * SEC, "the stalled popper");
        rc = fq_try_push(r, q, b, push_owner);
        if (rc != FQ_OK)
            violation("%s: fq_try_push after the popper resumed returned %s",
                      what, status_name(rc));
    } else {
        join_or_die(tp, fq_now_ns() + 10 * SEC, "the stalled popper");
    }
    /* The popper finished its pop as if nothing happened. */
    if (pa.rc != FQ_OK || pa.slot == b)
        violation("%s: the stalled pop returned %s, slot %u", what,
                  status_name(pa.rc), pa.slot);
    else
        expect_census(r, pa.slot, pop_owner, ANY_TASK, what);
    expect_census(r, b, push_owner, ANY_TASK, what);
    if (!fq_queued(r, q, b))
        violation("%s: the pushed slot is not in the queue", what);
    region_close(&g);
    return ms;
}

/* A push that waits forever where it should answer FQ_EBUSY hangs the
 * main thread itself, so no join deadline can catch it. */
static void stalled_alarm(int sig) {
    (void)sig;
    static const char msg[] = "HANG: the stalled-popper test hit its "
                              "watchdog: a push did not come back\n";
    ssize_t rc = write(2, msg, sizeof msg - 1);
    (void)rc;
    _exit(3);
}

static int stalled_popper(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stall_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = stalled_alarm;
    sigaction(SIGALRM, &sa, NULL);
    alarm(60);
    double worst = 0;
    for (int q = 0; q < 2; q++)
        for (int how = END_RESUME; how <= END_CLOSE; how++) {
            double ms = stalled_popper_case((fq_queue_id)q, how);
            if (ms > worst) worst = ms;
        }
    unsigned v = atomic_load(&violations);
    printf("stalled popper: %s: FREE and READY x resume/alert/close: "
           "FQ_EBUSY at once, FQ_TIMEOUT after its 50 ms, the waiting push "
           "ended %.2f ms after the event at worst, violations=%u\n",
           v ? "FAIL" : "OK", worst, v);
    return v ? 1 : 0;
}

/* ------------------------------------------------------------------ main */

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--short|--long] [-r rounds] [-t tasks] [-p producers]"
            " [-s max_slots] [-b slot_bytes] [-S seed]\n"
            "       %s --stalled-popper\n"
            "       %s --fork-kills|--stop-cont [--long] [-r sweeps] "
            "[-S seed]\n",
            argv0, argv0, argv0);
}

int main(int argc, char **argv) {
    /* --short is the default: what CI runs under every sanitizer. */
    uint32_t rounds = 32, max_producers = 4, max_slots = 16;
    uint64_t tasks = 3000, slot_bytes = 8192, seed = 12345;
    int mode = 0, is_long = 0, rounds_given = 0; /* 0 threaded, 1 kills,
                                                    2 stop/continue */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--short")) {
            rounds = 32; tasks = 3000; max_producers = 4; max_slots = 16;
            is_long = 0;
        } else if (!strcmp(a, "--long")) {
            rounds = 96; tasks = 20000; max_producers = 8; max_slots = 16;
            is_long = 1;
        } else if (!strcmp(a, "--stalled-popper")) {
            setvbuf(stdout, NULL, _IOLBF, 0);
            return stalled_popper();
        } else if (!strcmp(a, "--fork-kills")) {
            mode = 1;
        } else if (!strcmp(a, "--stop-cont")) {
            mode = 2;
        } else if (v && !strcmp(a, "-r")) {
            rounds = (uint32_t)strtoul(v, NULL, 0); i++;
            rounds_given = 1;
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
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mode != 0) {
        /* The fork modes' --long is more sweeps over the same scenarios,
         * each with its own seed. */
        fork_opts o = {rounds_given ? rounds : (is_long ? 40u : 2u), seed};
        if (o.sweeps == 0) {
            usage(argv[0]);
            return 2;
        }
        return mode == 1 ? fork_kills_main(&o) : stop_cont_main(&o);
    }
    if (rounds == 0 || tasks == 0 || max_producers == 0 ||
        max_producers > MAX_PRODUCERS || max_slots == 0 ||
        max_slots > MAX_SLOTS || slot_bytes < 8) {
        fprintf(stderr, "bad arguments: producers 1..%d, slots 1..%d, "
                        "slot_bytes >= 8\n",
                MAX_PRODUCERS, MAX_SLOTS);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stall_in_pop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
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
    /* Over this many rounds, the stalls cannot all have missed. (Publishes
     * never meet a stalled READY pop: with one READY popper, nothing is
     * recycled while it stalls, and the other nslots - 1 slots cannot lap
     * READY's capacity >= nslots cells, so ready_ebusy stays 0.) */
    if (rounds >= 16 && max_slots >= 2 && max_producers >= 2 &&
        tot.ebusy == 0)
        violation("no release met a stalled FREE popper: the deferral went "
                  "untested");
    unsigned v = atomic_load(&violations);
    printf("stress_ring: %s rounds=%u tasks=%" PRIu64 " slots=1..%u "
           "producers<=%u holds=%" PRIu64 " all-held-detected=%" PRIu64
           " max_window=%" PRIu64 " free_ebusy=%" PRIu64
           " max_deferred=%" PRIu64 " ready_ebusy=%" PRIu64
           " timeouts=%" PRIu64 "/%" PRIu64
           " close_wake_max_ms=%.2f alert_wake_ms=%.2f violations=%u"
           " elapsed=%.2fs\n",
           v ? "FAIL" : "OK", rounds, tot.tasks, max_slots, max_producers,
           tot.holds, tot.detections, tot.max_window, tot.ebusy,
           tot.max_deferred, tot.ready_busy, tot.producer_timeouts,
           tot.consumer_timeouts, close_ms, alert_ms, v,
           (double)(fq_now_ns() - start) / SEC);
    return v ? 1 : 0;
}
