/* stalled_popper: --stalled-popper (stress_ring.c's header says what it
 * checks). */
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

int stalled_popper(void) {
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
