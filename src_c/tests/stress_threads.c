/* stress_threads: the threaded stress (stress_ring.c's header says what it
 * checks): producer threads and one consumer thread over one ring. */
#define _GNU_SOURCE
#include "stress_threads.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

void stall_in_pop(int sig) {
    (void)sig;
    int saved = errno; /* the interrupted code may be about to read it */
    uint64_t r = mix64(atomic_load(&stall_rng));
    struct timespec ts = {0, (long)(20000 + r % 280000)};
    nanosleep(&ts, NULL);
    arm_next_stall();
    errno = saved;
}

void stress_round(uint32_t round, uint32_t nslots, uint32_t nproducers,
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
