/*
 * stress_threads: the threaded modes of stress_ring (the stress rounds,
 * the wake tests, the stalled popper; stress_ring.c's header says what
 * each checks): their timing, and what main runs of them.
 */
#ifndef STRESS_THREADS_H
#define STRESS_THREADS_H

#include "stress_ring.h"

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

typedef struct totals {
    uint64_t tasks, producer_timeouts, consumer_timeouts, holds, detections,
        max_window, ebusy, ready_busy, max_deferred;
} totals;

/* stress_threads.c: one round of the threaded stress, and the SIGUSR2
 * handler that stalls a popper inside its pop. */
void stress_round(uint32_t round, uint32_t nslots, uint32_t nproducers,
                  uint64_t ntasks, uint64_t slot_bytes, uint64_t seed,
                  totals *tot);
void stall_in_pop(int sig);

/* wake_tests.c: each returns its slowest wake, in ms. */
double test_close_wakes_all(uint32_t nproducers, uint64_t spin_ns);
double test_alert(void);

/* stalled_popper.c: --stalled-popper; returns the exit status. */
int stalled_popper(void);

#endif /* STRESS_THREADS_H */
