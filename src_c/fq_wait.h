/* fq_wait: how the ring's waiters sleep and are woken, across processes
 * (futexes on Linux). Internal to fq_ring.c and fq_flags.c. */
#ifndef FQ_WAIT_H
#define FQ_WAIT_H

#include "fq_ring.h"

#include <errno.h>
#include <time.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Sleeps while *word == expected, for at most timeout_ns (< 0: unbounded).
 * Returns FQ_OK on a wake or a changed word, FQ_TIMEOUT, or FQ_EINTR. The
 * futex is process-shared (no FUTEX_PRIVATE_FLAG): waiters live in several
 * processes mapping the same memfd. */
static inline int fq_wait_word(_Atomic uint32_t *word, uint32_t expected,
                               int64_t timeout_ns) {
#ifdef __linux__
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000);
        ts.tv_nsec = (long)(timeout_ns % 1000000000);
        tsp = &ts;
    }
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, tsp,
                      NULL, 0);
    if (rc == 0) return FQ_OK;
    if (errno == EAGAIN) return FQ_OK; /* the word moved before we slept */
    if (errno == ETIMEDOUT) return FQ_TIMEOUT;
    if (errno == EINTR) return FQ_EINTR;
    return FQ_ESYS;
#else
    /* Fallback for systems without futexes: a bounded nap. It is bounded by
     * the caller's slice and only entered after the spin phase, so it costs
     * latency, never correctness. */
    struct timespec nap = {0, 200000};
    if (timeout_ns >= 0 && timeout_ns < 200000) nap.tv_nsec = (long)timeout_ns;
    if (atomic_load(word) != expected) return FQ_OK;
    nanosleep(&nap, NULL);
    return atomic_load(word) != expected ? FQ_OK : FQ_TIMEOUT;
#endif
}

static inline void fq_wake_word(_Atomic uint32_t *word, int count) {
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, count, NULL, NULL, 0);
#else
    (void)word;
    (void)count;
#endif
}

/* Bumps a queue's event count and wakes `count` sleepers. */
static inline void fq_signal_queue(fq_queue *q, int count) {
    /* seq_cst: a sleeper that read the old value sees the change in the
     * futex call and does not sleep. */
    atomic_fetch_add(&q->wake_seq, 1);
    fq_wake_word(&q->wake_seq, count);
}

#endif /* FQ_WAIT_H */
