/*
 * fork_scenario: what the forked-process fault modes of stress_ring
 * (--fork-kills in fork_kills.c, --stop-cont in fork_stops.c) share: a
 * scenario's ring, board and children, their supervision, the consumer
 * the parent (or a consumer child) plays, and the white-box checks and
 * accounting run once every child is gone (stress_ring.c's header says
 * what each mode checks).
 *
 * Real processes, because the faults are process faults: a SIGKILL leaves
 * a queue cell claimed and never released, a SIGSTOP freezes every thread
 * of the process. The ring lives in anonymous MAP_SHARED memory made
 * before fork; so does the board, where each child leaves what the
 * supervisor needs after its death (its phase, the slot and task it
 * holds, how it ended; a consumer child's books and deliveries). Children
 * are forked before any thread starts, run no thread, and leave with
 * _exit: nothing inherited is flushed or torn down twice.
 *
 * The parent plays the real consumer process: one watcher thread per
 * child waits for it (waitpid) and calls fq_alert on a death, as the
 * pool's watcher does; the main thread is the consumer, with
 * _consumer.pxi's deferral of releases that meet FQ_EBUSY. Every wait is
 * bounded: the consumer's by its scenario deadline, the children's by
 * fq_close plus a grace period, and all of it by an alarm that kills the
 * children and exits 3.
 */
#ifndef FORK_SCENARIO_H
#define FORK_SCENARIO_H

#include "stress_ring.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_CHILDREN 8
#define NO_SLOT UINT32_MAX
/* Workers' waits are long so that only close can be what ends them. */
#define WORKER_SLICE_NS (20 * SEC)
#define CONSUMER_SLICE_NS (100 * MS)
/* A scenario reports a hang past this (then the alarm is the backstop). */
#define SCENARIO_NS (20 * SEC)
#define WATCHDOG_S 60
/* Children must have left this soon after close. */
#define EXIT_GRACE_NS (2 * SEC)
/* A child that has sat in one phase this long, with the white-box check
 * saying why, is stuck rather than slow. */
#define STUCK_NS (50 * MS)
#define STALL_NS (5 * SEC)

/* -------------------------------------------------------------- the board */

enum phase { PH_START, PH_POP, PH_CLAIM, PH_FILL, PH_PUSH };
enum exit_how {
    EX_RUNNING,
    EX_END,          /* published its end marker */
    EX_CLOSED_IDLE,  /* saw the closed flag between batches */
    EX_CLOSED_POP,   /* its FREE wait ended with FQ_CLOSED */
    EX_CLOSED_PUSH,  /* its READY publish ended with FQ_CLOSED: holds a slot */
    EX_ERROR
};

/* A consumer's books: B_RELEASING from the start of a FREE push to its end,
 * so a consumer that dies inside one names the slot. */
enum { B_NONE, B_WINDOW, B_RELEASING, B_DEFERRED };

typedef struct worker_rec {
    _Atomic int phase;
    _Atomic uint64_t phase_ns;
    _Atomic uint32_t slot; /* held, or NO_SLOT */
    _Atomic uint64_t task; /* claimed, or FQ_NO_TASK */
    _Atomic int how;       /* exit_how */
} worker_rec;

typedef struct board {
    worker_rec w[MAX_CHILDREN];
    uint8_t books[MAX_SLOTS]; /* a consumer child's */
    uint64_t expected;        /* a consumer child's next ordered task */
    _Atomic int go;           /* set once every child is forked and watched */
    uint8_t seen[];           /* per task: deliveries, by any consumer */
} board;

/* ------------------------------------------------------------- scenarios */

typedef struct child {
    pid_t pid;
    int is_consumer;
    uint32_t id;         /* worker id */
    int64_t stop_for_ns; /* a stop is held this long, then continued */
    _Atomic int exited;
    _Atomic uint64_t cont_ns; /* when the watcher continued it */
    _Atomic unsigned stops;
    int status;
    uint64_t exit_ns;
    pthread_t watcher;
    struct scenario *sc;
} child;

typedef struct scenario {
    char name[96];
    fq_fault_point point;
    uint32_t countdown;
    int signum;         /* SIGKILL or SIGSTOP */
    int consumer_fault; /* the fault is in a forked consumer */
    uint32_t nslots, nworkers, victim;
    uint64_t ntasks, seed, spin_ns;
    region g;
    fq_ring *ring;
    board *b;
    size_t board_len;
    child kids[MAX_CHILDREN];
    uint32_t nkids;
    _Atomic int stopping; /* set before an orderly close: exits are expected */
    uint64_t close_ns;
} scenario;

extern const char *const phase_names[];
extern const char *const point_names[];

/* ------------------------------------------------------------ a consumer */

/* _consumer.pxi's window, releases and deferral, over books that may live
 * on the board (a consumer child's) or in this process. */
typedef struct fconsumer {
    fq_ring *r;
    uint32_t n, nworkers;
    uint64_t ntasks;
    int ordered;
    uint8_t *books;
    uint8_t *seen;
    uint64_t *expected; /* next ordered task (on the board for a child) */
    uint32_t window[MAX_SLOTS]; /* 1 + slot of task t at t % n */
    uint32_t in_window;
    uint32_t deferred[MAX_SLOTS];
    uint32_t ndeferred;
    uint8_t seen_end[MAX_CHILDREN];
    /* When the stopped worker was continued (0: not yet), or NULL. */
    _Atomic uint64_t *cont_ns;
    uint64_t deferred_ns[MAX_SLOTS]; /* when each release was deferred */
    const uint8_t *predecessor; /* a dead consumer's books: its slots */
    uint64_t delivered, ebusy, max_deferred, last_item_ns;
    /* Releases deferred before the stopped worker was continued that went
     * through after: they waited the stop out. */
    uint64_t waited_out;
} fconsumer;

/* ---------------------------------------------- fork_scenario.c: set-up */

void install_alarm(void);
void scenario_init(scenario *sc, fq_fault_point point, uint32_t countdown,
                   uint32_t nslots, uint32_t nworkers, uint64_t seed,
                   int signum, uint64_t ntasks);
/* Maps the ring and the board and arms the watchdog; 0 (reported) if not. */
int scenario_open(scenario *sc);
void scenario_start(scenario *sc, int with_consumer);
uint64_t scenario_stop(scenario *sc);
void scenario_close(scenario *sc);
int wait_exited(child *k, uint64_t until);
int killed_by(const child *k, int sig);
void expect_clean_exit(scenario *sc, const child *k, unsigned allowed);
/* For a child: wait for the start, and leave with how it ended. */
void await_go(scenario *sc);
_Noreturn void child_exit(worker_rec *rec, int how);

/* White-box reads of the queues (every child gone, or stuck). */
uint32_t stuck_pops(const fq_ring *r, fq_queue_id q, uint64_t *pos);
int stuck_push(const fq_ring *r, fq_queue_id q);
int head_meets_stuck_pop(const fq_ring *r, fq_queue_id q);
uint32_t slot_owned_by(const fq_ring *r, uint32_t owner, uint32_t *n);

/* --------------------------------------------- fork_consumer.c: consumer */

void fc_init(fconsumer *c, scenario *sc, uint8_t *books, uint64_t *expected,
             int ordered);
void fc_flush(fconsumer *c);
int fc_wait(fconsumer *c, int64_t slice_ns, unsigned abort);
_Noreturn void consumer_child(scenario *sc);
uint64_t account(scenario *sc, const fconsumer *cons, const uint8_t *dead_books,
                 uint32_t dead, int dead_counts, uint32_t lost);

#endif /* FORK_SCENARIO_H */
