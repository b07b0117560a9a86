/*
 * What the threaded modes (stress_threads.h) and the forked-process fault
 * modes (fork_scenario.h) of the ring stress test share, in
 * stress_common.c: reporting, seeded randomness, the slot content every
 * consumer recomputes, and the region.
 */
#ifndef STRESS_RING_H
#define STRESS_RING_H

#include "../fq_ring.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_SLOTS 64
#define MAX_PRODUCERS 64
#define MS 1000000ll
#define SEC 1000000000ll
/* How soon a waiter must return once close or alert asks it to. */
#define WAKE_DEADLINE_NS (1 * SEC)
/* The real consumer's slice while releases wait for a stalled popper
 * (_consumer.pxi, DEFERRED_RETRY_NS): it must come back to retry them. */
#define DEFERRED_RETRY_NS (1 * MS)

/* Counted in every thread of a process; a nonzero count fails the run. A
 * forked child turns its own count into its exit status. */
extern _Atomic unsigned violations;
void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *status_name(int rc);
/* "WORKER(3)", "CONSUMER", ...: for messages; buf needs 32 bytes. */
const char *owner_name(uint32_t owner, char *buf);

/* The census words of a slot the consumer holds, and of one on FREE. */
#define CONSUMER_OWNER FQ_OWNER(FQ_OWNER_CONSUMER, 0)
#define FREE_OWNER FQ_OWNER(FQ_OWNER_FREE, 0)

/* A census check that does not look at the task word. */
#define ANY_TASK (FQ_NO_TASK - 1)
/* Checks slot's census word (and task, unless ANY_TASK) where the caller
 * knows them exactly: it holds the slot, so nobody else writes them. */
void expect_census(const fq_ring *r, uint32_t slot, uint32_t owner,
                   uint64_t task, const char *when);

uint64_t mix64(uint64_t x);
uint64_t rng_next(uint64_t *s);
void jitter(uint64_t *rng);
void sleep_ns(int64_t ns);

/* Everything a producer writes is a function of the task number. */
void fill_slot(fq_ring *r, uint32_t slot, uint64_t task, int worker,
               uint32_t round);
int check_slot(fq_ring *r, uint32_t slot, uint64_t task, uint32_t round,
               const char *when);

typedef struct region {
    void *base;
    size_t len;
    fq_ring ring;
} region;

/* A fresh ring in anonymous MAP_SHARED memory: shared with threads, and
 * with children forked after it is made. */
int region_open(region *g, uint32_t nslots, uint32_t nworkers,
                uint64_t slot_bytes, uint64_t spin_ns);
void region_close(region *g);
/* Joins t, or gives up at the deadline (exit 3): a hung ring must not hang
 * CI. */
void join_or_die(pthread_t t, uint64_t deadline, const char *what);

/* The forked-process modes (fork_kills.c, fork_stops.c); each returns the
 * exit status. */
typedef struct fork_opts {
    uint32_t sweeps; /* times through the scenario list */
    uint64_t seed;
    uint32_t stop_countdown; /* --stop-cont: every case's (0: its own) */
} fork_opts;
int fork_kills_main(const fork_opts *o);
int stop_cont_main(const fork_opts *o);

#endif /* STRESS_RING_H */
