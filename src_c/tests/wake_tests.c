/* wake_tests: close wakes every FREE and control sleeper, alert the READY
 * sleeper, each within its deadline. */
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
double test_close_wakes_all(uint32_t nproducers, uint64_t spin_ns) {
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
double test_alert(void) {
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
