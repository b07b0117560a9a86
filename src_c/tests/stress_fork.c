/*
 * stress_fork: the forked-process fault modes of stress_ring (--fork-kills,
 * --stop-cont; stress_ring.c's header says what each checks).
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
 *
 * What a death at each fault point leaves (fq_ring.c; each is asserted):
 *   POP_FREE   (worker, after its FREE tail CAS): the FREE cell stays
 *              claimed (seq == pos + 1, pos < tail) holding the slot, whose
 *              census still says FREE with its previous task: the census
 *              does not name the dead worker. FREE pops go on; the FREE
 *              push that laps onto the cell gets FQ_EBUSY for good.
 *   CLAIM      (worker, after next_task's fetch_add): the slot says
 *              WORKER(w) with FQ_NO_TASK, and one claimed task is in no
 *              slot: the ordered consumer waits for it until the alert.
 *   PUSH_READY (worker, after its READY head CAS): the slot says WORKER(w)
 *              with its task and complete data; READY's cell at the tail
 *              stays unpublished (seq == tail < head), so the batches
 *              published after it are unreachable: READY pops find nothing
 *              although fq_depth counts them.
 *   POP_READY  (consumer, after its READY tail CAS): the READY cell stays
 *              claimed, its slot still says READY(w) with an undelivered
 *              task. Once a stand-in consumer (the parent) recycles slots,
 *              a worker's publish laps onto the cell and waits there until
 *              close. (With the one real consumer it cannot: nothing is
 *              recycled, and nslots - 1 slots cannot lap capacity cells.)
 *   PUSH_FREE  (consumer, after its FREE head CAS): the slot says
 *              CONSUMER (its task delivered); FREE's cell at the tail stays
 *              unpublished, so workers find FREE empty (although fq_depth
 *              says otherwise) until close.
 */
#define _GNU_SOURCE
#include "stress_ring.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
#define STOP_NS (200 * MS)
/* A child that has sat in one phase this long, with the white-box check
 * saying why, is stuck rather than slow. */
#define STUCK_NS (50 * MS)
#define STALL_NS (5 * SEC)
#define KILL_TASKS 65536u /* never reached: a kill scenario ends by a death */
#define STOP_TASKS 3000u

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
static const char *const phase_names[] = {"start", "pop", "claim", "fill",
                                          "push"};

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

/* For the alarm handler: async-signal-safe reads only. */
static pid_t alarm_pids[MAX_CHILDREN];
static volatile sig_atomic_t alarm_npids;
static char alarm_what[128];

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "HANG: the watchdog fired in scenario ";
    ssize_t rc = write(2, msg, sizeof msg - 1);
    rc = write(2, alarm_what, strlen(alarm_what));
    rc = write(2, "\n", 1);
    (void)rc;
    for (int i = 0; i < alarm_npids; i++) kill(alarm_pids[i], SIGKILL);
    _exit(3);
}

/* ------------------------------------------------------- the worker child */

static void set_phase(worker_rec *rec, int phase) {
    atomic_store_explicit(&rec->phase_ns, fq_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&rec->phase, phase, memory_order_relaxed);
}

/* Children start together, once all are there: a victim that starts late
 * could find the work done before its countdown runs out. */
static void await_go(scenario *sc) {
    while (!atomic_load(&sc->b->go)) sleep_ns(50 * 1000);
}

static _Noreturn void child_exit(worker_rec *rec, int how) {
    if (rec) atomic_store(&rec->how, how);
    _exit(atomic_load(&violations) ? 1 : 0);
}

/* The worker loop of _worker.py with Ring.publish's waits; the victim arms
 * its fault first. */
static _Noreturn void worker_child(scenario *sc, uint32_t w) {
    fq_ring *r = sc->ring;
    worker_rec *rec = &sc->b->w[w];
    const uint32_t me = FQ_OWNER(FQ_OWNER_WORKER, w);
    const uint32_t pub = FQ_OWNER(FQ_OWNER_READY, w);
    uint64_t rng = sc->seed ^ mix64((uint64_t)w + 1);
    fq_worker_set_pid(r, w, (int32_t)getpid());
    await_go(sc);
    if (!sc->consumer_fault && w == sc->victim)
        fq_set_fault(sc->point, sc->countdown, sc->signum);
    for (;;) {
        if (fq_is_closed(r)) child_exit(rec, EX_CLOSED_IDLE);
        set_phase(rec, PH_POP);
        uint32_t slot;
        int rc = fq_pop(r, FQ_FREE, &slot, me, WORKER_SLICE_NS,
                        FQ_ABORT_ON_CLOSE);
        if (rc == FQ_TIMEOUT || rc == FQ_EINTR) continue;
        if (rc == FQ_CLOSED) child_exit(rec, EX_CLOSED_POP);
        if (rc != FQ_OK || slot >= sc->nslots) {
            violation("worker %u: fq_pop(FREE) returned %s, slot %u", w,
                      status_name(rc), slot);
            child_exit(rec, EX_ERROR);
        }
        atomic_store(&rec->slot, slot);
        expect_census(r, slot, me, FQ_NO_TASK, "worker after its pop");
        set_phase(rec, PH_CLAIM);
        uint64_t t = fq_claim_task(r, slot);
        atomic_store(&rec->task, t);
        expect_census(r, slot, me, t, "worker after its claim");
        set_phase(rec, PH_FILL);
        jitter(&rng);
        if (t >= sc->ntasks) {
            fq_slot_header *h = &r->headers[slot];
            h->kind = FQ_SLOT_END;
            h->worker = (int32_t)w;
            h->pass = 0;
        } else {
            fill_slot(r, slot, t, (int)w, 0);
        }
        jitter(&rng);
        set_phase(rec, PH_PUSH);
        rc = fq_try_push(r, FQ_READY, slot, pub);
        while (rc == FQ_EBUSY || rc == FQ_TIMEOUT)
            rc = fq_push(r, FQ_READY, slot, pub, WORKER_SLICE_NS,
                         FQ_ABORT_ON_CLOSE);
        if (rc == FQ_CLOSED) child_exit(rec, EX_CLOSED_PUSH);
        if (rc != FQ_OK) {
            violation("worker %u: publishing slot %u: %s", w, slot,
                      status_name(rc));
            child_exit(rec, EX_ERROR);
        }
        atomic_store(&rec->slot, NO_SLOT);
        atomic_store(&rec->task, FQ_NO_TASK);
        if (t >= sc->ntasks) {
            /* As a worker between passes: it stays until close, so that
             * any exit before close is a death. */
            while (fq_wait_control(r, fq_control(r), WORKER_SLICE_NS) !=
                   FQ_CLOSED) {
            }
            child_exit(rec, EX_END);
        }
    }
}

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

static void fc_init(fconsumer *c, scenario *sc, uint8_t *books,
                    uint64_t *expected, int ordered) {
    memset(c, 0, sizeof *c);
    c->r = sc->ring;
    c->n = sc->nslots;
    c->nworkers = sc->nworkers;
    c->ntasks = sc->ntasks;
    c->ordered = ordered;
    c->books = books;
    c->seen = sc->b->seen;
    c->expected = expected;
    c->last_item_ns = fq_now_ns();
    memset(books, B_NONE, MAX_SLOTS);
    *expected = 0;
}

static void fc_release(fconsumer *c, uint32_t s) {
    expect_census(c->r, s, FQ_OWNER(FQ_OWNER_CONSUMER, 0), ANY_TASK,
                  "consumer releasing");
    c->books[s] = B_RELEASING;
    int rc = fq_try_push(c->r, FQ_FREE, s, FQ_OWNER(FQ_OWNER_FREE, 0));
    if (rc == FQ_OK) {
        c->books[s] = B_NONE;
        return;
    }
    if (rc != FQ_EBUSY)
        violation("consumer: fq_try_push(FREE, %u) returned %s", s,
                  status_name(rc));
    c->books[s] = B_DEFERRED;
    c->deferred[c->ndeferred++] = s;
    c->ebusy++;
    c->deferred_ns[s] = fq_now_ns();
    if (c->ndeferred > c->max_deferred) c->max_deferred = c->ndeferred;
}

static void fc_flush(fconsumer *c) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < c->ndeferred; i++) {
        uint32_t s = c->deferred[i];
        c->books[s] = B_RELEASING;
        int rc = fq_try_push(c->r, FQ_FREE, s, FQ_OWNER(FQ_OWNER_FREE, 0));
        if (rc == FQ_OK) {
            c->books[s] = B_NONE;
            uint64_t cont = c->cont_ns ? atomic_load(c->cont_ns) : 0;
            if (cont && c->deferred_ns[s] < cont) c->waited_out++;
            continue;
        }
        if (rc != FQ_EBUSY)
            violation("consumer: retrying fq_try_push(FREE, %u): %s", s,
                      status_name(rc));
        c->books[s] = B_DEFERRED;
        c->deferred[kept++] = s;
    }
    c->ndeferred = kept;
}

/* Before each sleep, as Prefetcher.check_census: the census says CONSUMER
 * exactly for the books' slots (a stand-in consumer's or its dead
 * predecessor's), and waiting can end (a slot is elsewhere, or a release
 * waits for a popper that may come back). */
static void fc_audit(fconsumer *c) {
    uint32_t mine = 0;
    for (uint32_t s = 0; s < c->n; s++) {
        uint32_t o = fq_slot_owner(c->r, s);
        int census = FQ_OWNER_KIND(o) == FQ_OWNER_CONSUMER;
        int books = c->books[s] != B_NONE;
        mine += (uint32_t)books;
        if (!books && c->predecessor) books = c->predecessor[s] != B_NONE;
        if (census != books) {
            char buf[32];
            violation("consumer audit: slot %u census %s, books %d", s,
                      owner_name(o, buf), c->books[s]);
        }
    }
    if (mine == c->n && c->ndeferred == 0)
        violation("consumer holds all %u slots: no batch can come", c->n);
}

static void fc_deliver(fconsumer *c, uint32_t s, uint64_t t) {
    if (!check_slot(c->r, s, t, 0, "at delivery")) return;
    if (c->seen[t]++) violation("task %" PRIu64 " delivered twice", t);
    c->delivered++;
    fc_release(c, s);
}

/* Files a slot just popped from READY, as Consumer._file. */
static void fc_file(fconsumer *c, uint32_t s) {
    fq_ring *r = c->r;
    c->last_item_ns = fq_now_ns();
    if (s >= c->n) {
        violation("consumer popped slot %u of %u", s, c->n);
        return;
    }
    if (c->books[s] != B_NONE)
        violation("consumer popped slot %u its books hold (%d)", s,
                  c->books[s]);
    c->books[s] = B_WINDOW;
    expect_census(r, s, FQ_OWNER(FQ_OWNER_CONSUMER, 0), ANY_TASK,
                  "consumer's pop");
    uint64_t t = fq_slot_task(r, s);
    if (r->headers[s].kind == FQ_SLOT_END) {
        if (t < c->ntasks || t >= c->ntasks + c->nworkers ||
            c->seen_end[t - c->ntasks]++)
            violation("end marker with task %" PRIu64 " or seen twice", t);
        fc_release(c, s);
        return;
    }
    if (t >= c->ntasks) {
        violation("batch of task %" PRIu64 " past the %" PRIu64 " tasks", t,
                  c->ntasks);
        return;
    }
    if (!c->ordered) {
        fc_deliver(c, s, t);
        return;
    }
    uint64_t e = *c->expected;
    if (t < e || t >= e + c->n || c->window[t % c->n]) {
        violation("task %" PRIu64 " arrived while expecting %" PRIu64
                  " with %u slots: a duplicate or beyond the window",
                  t, e, c->n);
        return;
    }
    c->window[t % c->n] = s + 1;
    c->in_window++;
    while (c->window[e % c->n]) {
        uint32_t w = c->window[e % c->n] - 1;
        c->window[e % c->n] = 0;
        c->in_window--;
        fc_deliver(c, w, e);
        *c->expected = ++e;
    }
}

/* One wait of the consumer loop: retry deferred releases, audit, pop. */
static int fc_wait(fconsumer *c, int64_t slice_ns, unsigned abort) {
    if (c->ndeferred) fc_flush(c);
    fc_audit(c);
    uint32_t s;
    int rc = fq_pop(c->r, FQ_READY, &s, FQ_OWNER(FQ_OWNER_CONSUMER, 0),
                    c->ndeferred ? DEFERRED_RETRY_NS : slice_ns, abort);
    if (rc == FQ_OK) fc_file(c, s);
    return rc;
}

/* The consumer child: runs until its fault kills it. */
static _Noreturn void consumer_child(scenario *sc) {
    fconsumer c;
    fc_init(&c, sc, sc->b->books, &sc->b->expected, 1);
    await_go(sc);
    fq_set_fault(sc->point, sc->countdown, sc->signum);
    uint64_t until = fq_now_ns() + SCENARIO_NS;
    while (fq_now_ns() < until && !atomic_load(&violations)) {
        int rc = fc_wait(&c, CONSUMER_SLICE_NS, FQ_ABORT_ON_CLOSE);
        if (rc == FQ_CLOSED) break;
    }
    violation("consumer child: its fault never fired");
    child_exit(NULL, EX_ERROR);
}

/* ----------------------------------------------------------- supervision */

/* As the pool's watcher thread: wait for the child; a death while the
 * ring is in use alerts the consumer. A stop is no death: the test holds
 * it for stop_for_ns, as a debugger or a frozen cgroup would, then
 * continues the child. */
static void *watcher_main(void *p) {
    child *k = p;
    for (;;) {
        int st;
        pid_t rc = waitpid(k->pid, &st, WUNTRACED);
        if (rc < 0) {
            if (errno == EINTR) continue;
            violation("waitpid(%d): %s", (int)k->pid, strerror(errno));
            st = 0;
        } else if (WIFSTOPPED(st)) {
            atomic_fetch_add(&k->stops, 1);
            sleep_ns(k->stop_for_ns);
            atomic_store(&k->cont_ns, fq_now_ns());
            kill(k->pid, SIGCONT);
            continue;
        }
        k->status = st;
        k->exit_ns = fq_now_ns();
        atomic_store(&k->exited, 1);
        if (!atomic_load(&k->sc->stopping)) fq_alert(k->sc->ring);
        return NULL;
    }
}

static int scenario_open(scenario *sc) {
    int rc = region_open(&sc->g, sc->nslots, sc->nworkers, 4096, sc->spin_ns);
    if (rc != FQ_OK) {
        violation("%s: ring setup failed: %s", sc->name, status_name(rc));
        return 0;
    }
    sc->ring = &sc->g.ring;
    sc->board_len = sizeof(board) + sc->ntasks;
    void *m = mmap(NULL, sc->board_len, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        violation("%s: board mmap failed", sc->name);
        region_close(&sc->g);
        return 0;
    }
    sc->b = m;
    for (uint32_t w = 0; w < MAX_CHILDREN; w++) {
        atomic_init(&sc->b->w[w].slot, NO_SLOT);
        atomic_init(&sc->b->w[w].task, FQ_NO_TASK);
    }
    snprintf(alarm_what, sizeof alarm_what, "%s", sc->name);
    alarm_npids = 0;
    alarm(WATCHDOG_S);
    return 1;
}

/* Forks workers 0..nworkers-1 and, if asked, a consumer child; then starts
 * a watcher per child (threads only after every fork). */
static void scenario_start(scenario *sc, int with_consumer) {
    pid_t parent = getpid();
    uint32_t total = sc->nworkers + (with_consumer ? 1 : 0);
    fflush(NULL);
    for (uint32_t i = 0; i < total; i++) {
        child *k = &sc->kids[i];
        k->sc = sc;
        k->is_consumer = i == sc->nworkers;
        k->id = i;
        pid_t pid = fork();
        if (pid < 0) {
            violation("%s: fork: %s", sc->name, strerror(errno));
            break;
        }
        if (pid == 0) {
            /* Nothing must outlive a parent that died or was killed. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(9);
            signal(SIGALRM, SIG_DFL);
            alarm(0);
            if (k->is_consumer) consumer_child(sc);
            worker_child(sc, i);
        }
        k->pid = pid;
        alarm_pids[i] = pid;
        alarm_npids = (sig_atomic_t)(i + 1);
        sc->nkids = i + 1;
    }
    for (uint32_t i = 0; i < sc->nkids; i++)
        pthread_create(&sc->kids[i].watcher, NULL, watcher_main,
                       &sc->kids[i]);
    atomic_store(&sc->b->go, 1);
}

static int wait_exited(child *k, uint64_t until) {
    while (!atomic_load(&k->exited)) {
        if (fq_now_ns() > until) return 0;
        sleep_ns(MS / 2);
    }
    return 1;
}

/* Orderly end: close, then every child must leave within the grace
 * period (a child still there did not stop on the closed flag: killed,
 * and reported). Returns the slowest exit after close, in ns. */
static uint64_t scenario_stop(scenario *sc) {
    atomic_store(&sc->stopping, 1);
    sc->close_ns = fq_now_ns();
    fq_close(sc->ring);
    uint64_t worst = 0;
    for (uint32_t i = 0; i < sc->nkids; i++) {
        child *k = &sc->kids[i];
        if (!wait_exited(k, sc->close_ns + EXIT_GRACE_NS)) {
            worker_rec *rec = &sc->b->w[k->id];
            violation("%s: %s %u still running %.1f s after close (phase "
                      "%s): it did not stop on the closed flag",
                      sc->name, k->is_consumer ? "consumer" : "worker", k->id,
                      (double)EXIT_GRACE_NS / SEC,
                      phase_names[atomic_load(&rec->phase)]);
            kill(k->pid, SIGKILL);
            wait_exited(k, fq_now_ns() + 10 * SEC);
        }
        pthread_join(k->watcher, NULL);
        if (k->exit_ns > sc->close_ns && k->exit_ns - sc->close_ns > worst)
            worst = k->exit_ns - sc->close_ns;
    }
    alarm_npids = 0;
    return worst;
}

static void scenario_close(scenario *sc) {
    alarm(0);
    munmap(sc->b, sc->board_len);
    region_close(&sc->g);
}

static int killed_by(const child *k, int sig) {
    return WIFSIGNALED(k->status) && WTERMSIG(k->status) == sig;
}

/* A live child must have ended cleanly, in one of the ways listed. */
static void expect_clean_exit(scenario *sc, const child *k,
                              unsigned allowed) {
    int how = atomic_load(&sc->b->w[k->id].how);
    if (!WIFEXITED(k->status) || WEXITSTATUS(k->status) != 0 ||
        !(allowed & (1u << how)))
        violation("%s: worker %u ended with status %#x, exit kind %d",
                  sc->name, k->id, (unsigned)k->status, how);
}

/* ------------------------------------------------------- white-box checks */

/* Positions of queue q whose cell a popper claimed (tail CAS) and never
 * released: seq still pos + 1 behind the tail. Returns how many, and the
 * last one's position. */
static uint32_t stuck_pops(const fq_ring *r, fq_queue_id q, uint64_t *pos) {
    uint64_t cap = r->ctrl->capacity;
    uint64_t tail = atomic_load(&r->ctrl->queues[q].tail);
    uint32_t found = 0;
    for (uint64_t p = tail > cap ? tail - cap : 0; p < tail; p++)
        if (atomic_load(&r->cells[q][p & (cap - 1)].seq) == p + 1) {
            *pos = p;
            found++;
        }
    return found;
}

/* Whether queue q's tail cell was claimed by a pusher (head CAS) and
 * never published: seq still equals the tail, with head past it. */
static int stuck_push(const fq_ring *r, fq_queue_id q) {
    uint64_t cap = r->ctrl->capacity;
    uint64_t tail = atomic_load(&r->ctrl->queues[q].tail);
    uint64_t head = atomic_load(&r->ctrl->queues[q].head);
    return head > tail &&
           atomic_load(&r->cells[q][tail & (cap - 1)].seq) == tail;
}

/* Whether the next push on q lands on a cell a popper still holds. */
static int head_meets_stuck_pop(const fq_ring *r, fq_queue_id q) {
    uint64_t cap = r->ctrl->capacity;
    uint64_t head = atomic_load(&r->ctrl->queues[q].head);
    return head >= cap &&
           atomic_load(&r->cells[q][head & (cap - 1)].seq) == head - cap + 1;
}

/* The slot whose census is `owner`, if exactly one has it. */
static uint32_t slot_owned_by(const fq_ring *r, uint32_t owner, uint32_t *n) {
    uint32_t found = NO_SLOT;
    *n = 0;
    for (uint32_t s = 0; s < r->ctrl->nslots; s++)
        if (fq_slot_owner(r, s) == owner) {
            found = s;
            (*n)++;
        }
    return found;
}

/* -------------------------------------------------------------- accounting */

/* After every child is gone: each slot is in exactly one place (a queue,
 * the parent consumer's books, a dead consumer's books, a live worker that
 * ended holding it, or the dead process's `dead` slot) with the census
 * that place implies; and each claimed task is in exactly one (delivered,
 * in a window, in a published or held slot; the dead slot's task counts
 * when `dead_counts`), except that `lost` tasks (a death inside a claim)
 * are nowhere. Returns the lowest lost task, or FQ_NO_TASK. */
static uint64_t account(scenario *sc, const fconsumer *cons,
                        const uint8_t *dead_books, uint32_t dead,
                        int dead_counts, uint32_t lost) {
    fq_ring *r = sc->ring;
    const uint32_t n = sc->nslots;
    uint64_t next = fq_next_task(r);
    uint64_t lim = next < sc->ntasks ? next : sc->ntasks;
    uint8_t *cnt = calloc(lim + 1, 1);
    if (!cnt) {
        violation("out of memory");
        return FQ_NO_TASK;
    }
    for (uint64_t t = 0; t < lim; t++) cnt[t] = sc->b->seen[t];
    for (uint64_t t = lim; t < sc->ntasks; t++)
        if (sc->b->seen[t])
            violation("%s: task %" PRIu64 " delivered but never claimed",
                      sc->name, t);
    char buf[32];
    for (uint32_t s = 0; s < n; s++) {
        uint32_t o = fq_slot_owner(r, s);
        uint64_t t = fq_slot_task(r, s);
        const fq_slot_header *h = &r->headers[s];
        int qf = fq_queued(r, FQ_FREE, s), qr = fq_queued(r, FQ_READY, s);
        int mine = cons->books[s] != B_NONE;
        int theirs = dead_books && s != dead && dead_books[s] != B_NONE;
        int live = 0;
        uint32_t want = o;
        for (uint32_t w = 0; w < sc->nworkers; w++) {
            const worker_rec *rec = &sc->b->w[w];
            if (atomic_load(&rec->how) == EX_CLOSED_PUSH &&
                atomic_load(&rec->slot) == s) {
                live++;
                want = FQ_OWNER(FQ_OWNER_WORKER, w);
                if (t != atomic_load(&rec->task))
                    violation("%s: slot %u held by worker %u has task %" PRId64
                              ", the worker says %" PRId64,
                              sc->name, s, w, (int64_t)t,
                              (int64_t)atomic_load(&rec->task));
            }
        }
        int places = qf + qr + mine + theirs + live + (s == dead);
        if (places != 1) {
            violation("%s: slot %u is in %d places (FREE %d, READY %d, "
                      "consumer %d, dead consumer %d, live worker %d, dead "
                      "%d), census %s",
                      sc->name, s, places, qf, qr, mine, theirs, live,
                      s == dead, owner_name(o, buf));
            continue;
        }
        int counts = live || (s == dead && dead_counts);
        if (qf) {
            want = FQ_OWNER(FQ_OWNER_FREE, 0);
        } else if (qr) {
            want = FQ_OWNER(FQ_OWNER_READY, (uint32_t)h->worker);
            if (h->kind == FQ_SLOT_BATCH) {
                counts = check_slot(r, s, t, 0, "published, at the end");
            } else if (h->kind != FQ_SLOT_END || t < sc->ntasks) {
                violation("%s: slot %u in READY of kind %u task %" PRIu64,
                          sc->name, s, h->kind, t);
            }
        } else if (mine || theirs) {
            want = FQ_OWNER(FQ_OWNER_CONSUMER, 0);
            counts = (mine ? cons->books[s] : dead_books[s]) == B_WINDOW;
        }
        if (o != want) {
            char b2[32];
            violation("%s: slot %u census %s, expected %s", sc->name, s,
                      owner_name(o, buf), owner_name(want, b2));
        }
        if (counts) {
            if (t >= lim)
                violation("%s: slot %u holds task %" PRId64 ", unclaimed",
                          sc->name, s, (int64_t)t);
            else
                cnt[t]++;
        }
    }
    uint64_t first_lost = FQ_NO_TASK;
    uint32_t nlost = 0;
    for (uint64_t t = 0; t < lim; t++) {
        if (cnt[t] == 0 && nlost++ == 0) first_lost = t;
        if (cnt[t] > 1)
            violation("%s: task %" PRIu64 " found %u times (delivered %u)",
                      sc->name, t, cnt[t], sc->b->seen[t]);
    }
    if (nlost != lost)
        violation("%s: %u claimed tasks are nowhere (first %" PRId64
                  "), expected %u",
                  sc->name, nlost, (int64_t)first_lost, lost);
    free(cnt);
    return first_lost;
}

/* ------------------------------------------------ pushes that meet a dead */

/* A FREE push that laps onto a dead popper's cell must come back: FQ_EBUSY
 * with nothing changed, FQ_TIMEOUT at its timeout, FQ_CLOSED at once on a
 * closed ring. The parent drives the lap itself (every child is gone). */
static void check_push_meets_dead_popper(scenario *sc, fconsumer *c) {
    fq_ring *r = sc->ring;
    const uint32_t cons = FQ_OWNER(FQ_OWNER_CONSUMER, 0);
    const uint32_t free0 = FQ_OWNER(FQ_OWNER_FREE, 0);
    uint32_t s = NO_SLOT;
    if (c->ndeferred) {
        s = c->deferred[--c->ndeferred];
        c->books[s] = B_NONE;
    } else if (fq_try_pop(r, FQ_FREE, &s, cons) != FQ_OK &&
               fq_try_pop(r, FQ_READY, &s, cons) != FQ_OK) {
        violation("%s: no slot left to push on FREE", sc->name);
        return;
    }
    int rc = FQ_OK;
    for (uint32_t i = 0; i <= r->ctrl->capacity && rc == FQ_OK; i++) {
        rc = fq_try_push(r, FQ_FREE, s, free0);
        if (rc == FQ_OK && fq_try_pop(r, FQ_FREE, &s, cons) != FQ_OK) {
            violation("%s: a slot just pushed on FREE did not come back",
                      sc->name);
            return;
        }
    }
    if (rc != FQ_EBUSY || !head_meets_stuck_pop(r, FQ_FREE)) {
        violation("%s: FREE pushes lapped the queue and got %s, not FQ_EBUSY "
                  "at the dead popper's cell",
                  sc->name, status_name(rc));
        return;
    }
    uint64_t head = atomic_load(&r->ctrl->queues[FQ_FREE].head);
    uint32_t o = fq_slot_owner(r, s);
    if (fq_try_push(r, FQ_FREE, s, free0) != FQ_EBUSY ||
        atomic_load(&r->ctrl->queues[FQ_FREE].head) != head ||
        fq_slot_owner(r, s) != o)
        violation("%s: an FQ_EBUSY push changed the queue or the census",
                  sc->name);
    uint64_t t0 = fq_now_ns();
    rc = fq_push(r, FQ_FREE, s, free0, 30 * MS, 0);
    uint64_t took = fq_now_ns() - t0;
    if (rc != FQ_TIMEOUT || took < (uint64_t)(30 * MS) ||
        took > (uint64_t)(30 * MS + WAKE_DEADLINE_NS))
        violation("%s: fq_push(FREE, 30 ms) past a dead popper returned %s "
                  "after %.1f ms",
                  sc->name, status_name(rc), (double)took / MS);
    t0 = fq_now_ns();
    rc = fq_push(r, FQ_FREE, s, free0, WORKER_SLICE_NS, FQ_ABORT_ON_CLOSE);
    took = fq_now_ns() - t0;
    if (rc != FQ_CLOSED || took > (uint64_t)WAKE_DEADLINE_NS)
        violation("%s: fq_push(FREE) on the closed ring past a dead popper "
                  "returned %s after %.1f ms",
                  sc->name, status_name(rc), (double)took / MS);
}

/* Behind a dead pusher's unpublished READY cell, published batches are
 * unreachable: pops find nothing (fq_depth counts them), a wait ends by
 * the alert when asked, else by its timeout. */
static void check_ready_behind_dead_pusher(scenario *sc) {
    fq_ring *r = sc->ring;
    const uint32_t cons = FQ_OWNER(FQ_OWNER_CONSUMER, 0);
    uint32_t s;
    if (fq_depth(r, FQ_READY) < 1 ||
        fq_try_pop(r, FQ_READY, &s, cons) != FQ_EMPTY)
        violation("%s: READY behind the dead pusher: depth %u, pop not "
                  "empty",
                  sc->name, fq_depth(r, FQ_READY));
    uint64_t t0 = fq_now_ns();
    int rc = fq_pop(r, FQ_READY, &s, cons, 30 * MS, FQ_ABORT_ON_ALERT);
    if (rc != FQ_ALERT || fq_now_ns() - t0 > (uint64_t)WAKE_DEADLINE_NS)
        violation("%s: the READY wait returned %s, expected FQ_ALERT at once",
                  sc->name, status_name(rc));
    t0 = fq_now_ns();
    rc = fq_pop(r, FQ_READY, &s, cons, 30 * MS, FQ_NO_SPIN);
    uint64_t took = fq_now_ns() - t0;
    if (rc != FQ_TIMEOUT || took < (uint64_t)(30 * MS) ||
        took > (uint64_t)(30 * MS + WAKE_DEADLINE_NS))
        violation("%s: the READY wait without abort flags returned %s after "
                  "%.1f ms",
                  sc->name, status_name(rc), (double)took / MS);
}

/* --------------------------------------------------------- kill scenarios */

typedef struct kill_stats {
    unsigned deaths[FQ_FAULT_CLAIM + 1];
    unsigned worker_stuck_on_dead; /* publishes that met a dead popper */
    unsigned starved;              /* ... or found no slot to publish */
    uint64_t delivered, ebusy, max_exit_ns;
} kill_stats;

static const char *const point_names[] = {"NONE",      "PUSH_FREE",
                                          "PUSH_READY", "POP_FREE",
                                          "POP_READY", "CLAIM"};

/* One worker SIGKILLs itself at the fault point; the parent consumes until
 * the watcher's alert, closes, and checks what the death left. */
static void run_worker_kill(scenario *sc, kill_stats *st) {
    if (!scenario_open(sc)) return;
    scenario_start(sc, 0);
    fq_ring *r = sc->ring;
    fconsumer c;
    uint8_t books[MAX_SLOTS];
    uint64_t expected;
    fc_init(&c, sc, books, &expected, 1);
    uint64_t until = fq_now_ns() + SCENARIO_NS;
    for (;;) {
        int rc = fc_wait(&c, CONSUMER_SLICE_NS,
                         FQ_ABORT_ON_ALERT | FQ_ABORT_ON_CLOSE);
        if (rc == FQ_ALERT) break;
        if (rc != FQ_OK && rc != FQ_TIMEOUT && rc != FQ_EINTR) {
            violation("%s: the consumer's wait returned %s", sc->name,
                      status_name(rc));
            break;
        }
        if (fq_now_ns() > until || expected >= sc->ntasks) {
            violation("%s: no death reached the consumer (%" PRIu64
                      " tasks delivered)",
                      sc->name, expected);
            break;
        }
        if (atomic_load(&violations)) break;
    }
    uint64_t exit_ns = scenario_stop(sc);
    const child *vk = &sc->kids[sc->victim];
    if (!killed_by(vk, SIGKILL))
        violation("%s: the victim ended with status %#x, not by SIGKILL",
                  sc->name, (unsigned)vk->status);
    for (uint32_t i = 0; i < sc->nkids; i++)
        if (i != sc->victim)
            expect_clean_exit(sc, &sc->kids[i],
                              1u << EX_CLOSED_IDLE | 1u << EX_CLOSED_POP);

    const worker_rec *vr = &sc->b->w[sc->victim];
    int phase = atomic_load(&vr->phase);
    uint32_t nv;
    uint32_t dead = slot_owned_by(r, FQ_OWNER(FQ_OWNER_WORKER, sc->victim),
                                  &nv);
    uint64_t pos = 0, rpos = 0;
    uint32_t free_pops = stuck_pops(r, FQ_FREE, &pos);
    uint32_t ready_pops = stuck_pops(r, FQ_READY, &rpos);
    int free_push = stuck_push(r, FQ_FREE), ready_push = stuck_push(r, FQ_READY);
    int dead_counts = 0;
    uint32_t lost = 0;
    int ok = 1;
    switch (sc->point) {
    case FQ_FAULT_POP_FREE:
        ok = phase == PH_POP && nv == 0 && free_pops == 1 && !ready_pops &&
             !free_push && !ready_push;
        if (ok) {
            dead = (uint32_t)r->cells[FQ_FREE][pos & (r->ctrl->capacity - 1)]
                       .slot;
            uint64_t t = fq_slot_task(r, dead);
            /* The census never heard of the pop: its fault point comes
             * before the census store, so the slot still says FREE with
             * its previous (delivered) task, and only the cell says where
             * it went. Should fq_try_pop ever record the owner first, this
             * expectation becomes WORKER(victim) with FQ_NO_TASK. */
            ok = dead < sc->nslots &&
                 fq_slot_owner(r, dead) == FQ_OWNER(FQ_OWNER_FREE, 0) &&
                 (t == FQ_NO_TASK || (t < sc->ntasks && sc->b->seen[t] == 1));
        }
        break;
    case FQ_FAULT_CLAIM:
        ok = phase == PH_CLAIM && nv == 1 && dead == atomic_load(&vr->slot) &&
             fq_slot_task(r, dead) == FQ_NO_TASK && !free_pops &&
             !ready_pops && !free_push && !ready_push;
        lost = 1;
        break;
    case FQ_FAULT_PUSH_READY:
        ok = phase == PH_PUSH && nv == 1 && dead == atomic_load(&vr->slot) &&
             fq_slot_task(r, dead) == atomic_load(&vr->task) && ready_push &&
             !free_pops && !ready_pops && !free_push &&
             check_slot(r, dead, fq_slot_task(r, dead), 0,
                        "the dead worker's batch");
        dead_counts = 1;
        break;
    default:
        ok = 0;
    }
    if (!ok) {
        char buf[32];
        violation("%s: the death left phase %s, %u slots naming the victim "
                  "(slot %d, census %s, task %" PRId64 "), stuck cells: FREE "
                  "pops %u pushes %d, READY pops %u pushes %d",
                  sc->name, phase_names[phase], nv, (int)dead,
                  dead < sc->nslots ? owner_name(fq_slot_owner(r, dead), buf)
                                    : "-",
                  dead < sc->nslots ? (int64_t)fq_slot_task(r, dead) : -1,
                  free_pops, free_push, ready_pops, ready_push);
        dead = NO_SLOT;
    }
    uint64_t lost_task = account(sc, &c, NULL, dead, dead_counts, lost);
    /* Ordered delivery: exactly the tasks before `expected`, and a lost
     * task is one the consumer never got to. */
    for (uint64_t t = 0; t < expected; t++)
        if (sc->b->seen[t] != 1)
            violation("%s: task %" PRIu64 " before %" PRIu64 " delivered %u "
                      "times",
                      sc->name, t, expected, sc->b->seen[t]);
    if (lost && lost_task != FQ_NO_TASK && lost_task < expected)
        violation("%s: lost task %" PRIu64 " was before the delivered %" PRIu64,
                  sc->name, lost_task, expected);
    if (sc->point == FQ_FAULT_POP_FREE) check_push_meets_dead_popper(sc, &c);
    if (sc->point == FQ_FAULT_PUSH_READY) check_ready_behind_dead_pusher(sc);
    st->deaths[sc->point]++;
    st->delivered += c.delivered;
    st->ebusy += c.ebusy;
    if (exit_ns > st->max_exit_ns) st->max_exit_ns = exit_ns;
    scenario_close(sc);
}

/* A consumer child SIGKILLs itself at the fault point while one worker
 * goes on; the parent takes over as consumer until the worker is stuck on
 * what the death left, closes, and checks that the worker stopped on the
 * closed flag and what the death left. */
static void run_consumer_kill(scenario *sc, kill_stats *st) {
    if (!scenario_open(sc)) return;
    scenario_start(sc, 1);
    fq_ring *r = sc->ring;
    child *ck = &sc->kids[sc->nworkers], *wk = &sc->kids[0];
    const worker_rec *wr = &sc->b->w[0];
    fconsumer c;
    uint8_t books[MAX_SLOTS];
    uint64_t expected;
    /* Unordered: the dead consumer's window and its lost batch leave gaps
     * an ordered consumer would wait on forever. */
    fc_init(&c, sc, books, &expected, 0);
    c.predecessor = sc->b->books;
    enum { NOT_STUCK, AT_DEAD_POP, BEHIND_DEAD_PUSH, STARVED } stuck;
    stuck = NOT_STUCK;
    if (!wait_exited(ck, fq_now_ns() + SCENARIO_NS)) {
        violation("%s: the consumer child never died", sc->name);
    } else if (!killed_by(ck, SIGKILL)) {
        violation("%s: the consumer child ended with status %#x", sc->name,
                  (unsigned)ck->status);
    } else {
        uint64_t until = fq_now_ns() + SCENARIO_NS;
        while (!stuck && !atomic_load(&violations)) {
            /* The alert was for the dead consumer: not ours to stop on. */
            int rc = fc_wait(&c, 5 * MS, FQ_ABORT_ON_CLOSE);
            uint64_t now = fq_now_ns();
            int ph = atomic_load(&wr->phase);
            int long_there = now - atomic_load(&wr->phase_ns) >= STUCK_NS;
            if (atomic_load(&wk->exited))
                violation("%s: the worker died", sc->name);
            else if (rc != FQ_TIMEOUT || !long_there)
                ;
            else if (ph == PH_PUSH && head_meets_stuck_pop(r, FQ_READY))
                stuck = AT_DEAD_POP;
            else if (ph == PH_POP && stuck_push(r, FQ_FREE))
                stuck = BEHIND_DEAD_PUSH;
            else if (ph == PH_POP && fq_depth(r, FQ_FREE) == 0 &&
                     c.ndeferred == 0)
                stuck = STARVED; /* the other slots died with the consumer */
            if (now > until && !stuck) {
                violation("%s: the worker neither stopped on the dead "
                          "consumer's cell nor ran out of slots (phase %s)",
                          sc->name, phase_names[ph]);
                break;
            }
        }
    }
    uint64_t exit_ns = scenario_stop(sc);
    /* Which wait the worker was in, and that close ended it: its slice is
     * 20 s, so an exit within the grace period came from the flag. */
    if (stuck == AT_DEAD_POP) {
        expect_clean_exit(sc, wk, 1u << EX_CLOSED_PUSH);
        st->worker_stuck_on_dead++;
    } else if (stuck != NOT_STUCK) {
        expect_clean_exit(sc, wk, 1u << EX_CLOSED_POP);
        if (stuck == STARVED) st->starved++;
    }
    if ((sc->point == FQ_FAULT_POP_READY && stuck == BEHIND_DEAD_PUSH) ||
        (sc->point == FQ_FAULT_PUSH_FREE && stuck != BEHIND_DEAD_PUSH))
        violation("%s: the worker was stuck in the wrong place (%d)",
                  sc->name, stuck);
    uint64_t pos = 0, fpos = 0;
    uint32_t dead = NO_SLOT, ready_pops = stuck_pops(r, FQ_READY, &pos);
    int dead_counts = 0, ok = 0;
    if (sc->point == FQ_FAULT_POP_READY) {
        if (ready_pops == 1 && !stuck_pops(r, FQ_FREE, &fpos) &&
            !stuck_push(r, FQ_FREE) && !stuck_push(r, FQ_READY)) {
            dead = (uint32_t)r->cells[FQ_READY][pos & (r->ctrl->capacity - 1)]
                       .slot;
            uint64_t t = dead < sc->nslots ? fq_slot_task(r, dead) : 0;
            /* The census still says who published it; its batch was never
             * delivered. */
            ok = dead < sc->nslots &&
                 fq_slot_owner(r, dead) == FQ_OWNER(FQ_OWNER_READY, 0) &&
                 t < sc->ntasks && sc->b->seen[t] == 0 &&
                 sc->b->books[dead] == B_NONE;
            dead_counts = 1;
        }
    } else {
        uint32_t releasing = 0;
        for (uint32_t s = 0; s < sc->nslots; s++)
            if (sc->b->books[s] == B_RELEASING) {
                dead = s;
                releasing++;
            }
        /* The census says CONSUMER: the push died before its census
         * store; the batch in it was delivered. */
        ok = releasing == 1 && stuck_push(r, FQ_FREE) && !ready_pops &&
             fq_slot_owner(r, dead) == FQ_OWNER(FQ_OWNER_CONSUMER, 0) &&
             fq_slot_task(r, dead) < sc->ntasks &&
             sc->b->seen[fq_slot_task(r, dead)] == 1;
        uint32_t s;
        if (ok && (fq_depth(r, FQ_FREE) < 1 ||
                   fq_try_pop(r, FQ_FREE, &s, FQ_OWNER(FQ_OWNER_WORKER, 0)) !=
                       FQ_EMPTY))
            violation("%s: FREE behind the dead pusher is not empty to pops",
                      sc->name);
    }
    if (!ok) {
        violation("%s: the consumer's death left slot %d, READY stuck pops %u"
                  ", FREE stuck push %d",
                  sc->name, (int)dead, ready_pops, stuck_push(r, FQ_FREE));
        dead = NO_SLOT;
    }
    account(sc, &c, sc->b->books, dead, dead_counts, 0);
    for (uint64_t t = 0; t < sc->b->expected; t++)
        if (sc->b->seen[t] != 1)
            violation("%s: the dead consumer delivered task %" PRIu64
                      " %u times",
                      sc->name, t, sc->b->seen[t]);
    st->deaths[sc->point]++;
    st->delivered += c.delivered + sc->b->expected;
    if (exit_ns > st->max_exit_ns) st->max_exit_ns = exit_ns;
    scenario_close(sc);
}

static void install_alarm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
}

static void scenario_init(scenario *sc, fq_fault_point point,
                          uint32_t countdown, uint32_t nslots,
                          uint32_t nworkers, uint64_t seed, int signum,
                          uint64_t ntasks) {
    static const uint64_t spins[] = {0, 2000, 50000};
    memset(sc, 0, sizeof *sc);
    sc->point = point;
    sc->countdown = countdown;
    sc->nslots = nslots;
    sc->nworkers = nworkers;
    sc->seed = seed;
    sc->signum = signum;
    sc->ntasks = ntasks;
    sc->victim = (uint32_t)(seed % nworkers);
    sc->spin_ns = spins[(seed >> 8) % 3];
    sc->consumer_fault =
        point == FQ_FAULT_POP_READY || point == FQ_FAULT_PUSH_FREE;
    char who[24];
    if (sc->consumer_fault)
        snprintf(who, sizeof who, "consumer");
    else
        snprintf(who, sizeof who, "worker %u", sc->victim);
    snprintf(sc->name, sizeof sc->name,
             "%s %s at %s #%u (%u slots, %u workers, seed %" PRIu64 ")",
             signum == SIGKILL ? "kill" : "stop", who, point_names[point],
             countdown, nslots, nworkers, seed);
}

int fork_kills_main(const fork_opts *o) {
    static const fq_fault_point wpoints[] = {
        FQ_FAULT_POP_FREE, FQ_FAULT_CLAIM, FQ_FAULT_PUSH_READY};
    static const uint32_t wcounts[] = {1, 2, 3, 5, 11, 29};
    /* Power-of-two rings (capacity == nslots, the tightest laps) and
     * others; one to four workers. */
    static const uint32_t wcfg[][2] = {{2, 2}, {3, 2}, {4, 3},
                                       {8, 3}, {5, 4}, {16, 2}};
    static const fq_fault_point cpoints[] = {FQ_FAULT_POP_READY,
                                             FQ_FAULT_PUSH_FREE};
    static const uint32_t ccounts[] = {1, 2, 4, 13};
    install_alarm();
    uint64_t start = fq_now_ns();
    kill_stats st;
    memset(&st, 0, sizeof st);
    scenario sc;
    for (uint32_t sweep = 0; sweep < o->sweeps && !atomic_load(&violations);
         sweep++) {
        uint32_t idx = 0;
        for (size_t p = 0; p < sizeof wpoints / sizeof *wpoints; p++)
            for (size_t k = 0; k < sizeof wcounts / sizeof *wcounts; k++) {
                const uint32_t *cfg = wcfg[(k + p + sweep) % 6];
                uint64_t seed = mix64(o->seed ^ ((uint64_t)sweep << 32) ^ idx++);
                scenario_init(&sc, wpoints[p], wcounts[k], cfg[0], cfg[1],
                              seed, SIGKILL, KILL_TASKS);
                run_worker_kill(&sc, &st);
                if (atomic_load(&violations)) break;
            }
        for (size_t p = 0; p < sizeof cpoints / sizeof *cpoints; p++)
            for (size_t k = 0; k < sizeof ccounts / sizeof *ccounts; k++) {
                uint64_t seed = mix64(o->seed ^ ((uint64_t)sweep << 32) ^ idx++);
                scenario_init(&sc, cpoints[p], ccounts[k],
                              3 + (uint32_t)((k + sweep) % 4), 1, seed,
                              SIGKILL, KILL_TASKS);
                run_consumer_kill(&sc, &st);
                if (atomic_load(&violations)) break;
            }
    }
    unsigned v = atomic_load(&violations);
    printf("fork kills: %s sweeps=%u deaths: worker POP_FREE=%u CLAIM=%u "
           "PUSH_READY=%u, consumer POP_READY=%u PUSH_FREE=%u; "
           "tasks delivered=%" PRIu64 " releases deferred=%" PRIu64
           " workers stopped by close at a dead consumer's cell=%u "
           "(starved=%u) slowest exit after close=%.2f ms violations=%u "
           "elapsed=%.2fs\n",
           v ? "FAIL" : "OK", o->sweeps, st.deaths[FQ_FAULT_POP_FREE],
           st.deaths[FQ_FAULT_CLAIM], st.deaths[FQ_FAULT_PUSH_READY],
           st.deaths[FQ_FAULT_POP_READY], st.deaths[FQ_FAULT_PUSH_FREE],
           st.delivered, st.ebusy, st.worker_stuck_on_dead, st.starved,
           (double)st.max_exit_ns / MS, v,
           (double)(fq_now_ns() - start) / SEC);
    return v ? 1 : 0;
}

/* --------------------------------------------------------- stop scenarios */

typedef struct stop_stats {
    unsigned stops[FQ_FAULT_CLAIM + 1];
    uint64_t delivered, ebusy, waited_out, max_deferred;
    unsigned retried; /* runs that did not exercise their case */
} stop_stats;

/* A worker SIGSTOPs itself at the fault point and is continued STOP_NS
 * later: the run must end as if nothing happened. Returns whether the run
 * exercised what it is for: the victim stopped, and, at POP_FREE, a release
 * met its cell. A loaded machine can let the other workers drain every task
 * before the victim's countdown runs out, or leave the consumer unscheduled
 * for the whole stop: such a run checks the protocol all the same but is
 * retried with another seed (stop_cont_main). */
static bool run_stop(scenario *sc, stop_stats *st) {
    if (!scenario_open(sc)) return true;
    sc->kids[sc->victim].stop_for_ns = STOP_NS;
    scenario_start(sc, 0);
    fq_ring *r = sc->ring;
    fconsumer c;
    uint8_t books[MAX_SLOTS];
    uint64_t expected;
    fc_init(&c, sc, books, &expected, 1);
    c.cont_ns = &sc->kids[sc->victim].cont_ns;
    uint64_t until = fq_now_ns() + SCENARIO_NS;
    while (expected < sc->ntasks && !atomic_load(&violations)) {
        int rc = fc_wait(&c, CONSUMER_SLICE_NS,
                         FQ_ABORT_ON_ALERT | FQ_ABORT_ON_CLOSE);
        if (rc == FQ_OK) continue;
        if (rc != FQ_TIMEOUT && rc != FQ_EINTR) {
            violation("%s: the consumer's wait returned %s: a paused worker "
                      "was taken for a dead one",
                      sc->name, status_name(rc));
            break;
        }
        uint64_t now = fq_now_ns();
        if (now - c.last_item_ns > (uint64_t)STALL_NS || now > until) {
            violation("%s: nothing came for %.1f s (%" PRIu64 " of %" PRIu64
                      " delivered, %u releases deferred)",
                      sc->name, (double)(now - c.last_item_ns) / SEC, expected,
                      sc->ntasks, c.ndeferred);
            break;
        }
    }
    /* The popper is back: every deferred release goes through. */
    uint64_t flush_until = fq_now_ns() + 5 * SEC;
    while (c.ndeferred && fq_now_ns() < flush_until) {
        fc_flush(&c);
        if (c.ndeferred) sleep_ns(100 * 1000);
    }
    if (c.ndeferred)
        violation("%s: %u releases still deferred after the worker resumed",
                  sc->name, c.ndeferred);
    scenario_stop(sc);
    for (uint32_t i = 0; i < sc->nkids; i++)
        expect_clean_exit(sc, &sc->kids[i],
                          1u << EX_END | 1u << EX_CLOSED_IDLE |
                              1u << EX_CLOSED_POP);
    unsigned stops = atomic_load(&sc->kids[sc->victim].stops);
    if (stops > 1)
        violation("%s: the victim stopped %u times", sc->name, stops);
    if (atomic_load(&r->ctrl->alert))
        violation("%s: the alert was raised for a paused worker", sc->name);
    if (c.in_window)
        violation("%s: %u slots left in the window", sc->name, c.in_window);
    /* Everything delivered once; every slot back in a queue. */
    account(sc, &c, NULL, NO_SLOT, 0, 0);
    bool exercised =
        stops == 1 && (sc->point != FQ_FAULT_POP_FREE || c.waited_out > 0);
    st->stops[sc->point] += stops;
    st->delivered += c.delivered;
    st->ebusy += c.ebusy;
    st->waited_out += c.waited_out;
    if (c.max_deferred > st->max_deferred) st->max_deferred = c.max_deferred;
    scenario_close(sc);
    return exercised;
}

/* Tries of one case before a run that never exercises it is a failure. */
#define STOP_TRIES 8u

int stop_cont_main(const fork_opts *o) {
    static const struct {
        fq_fault_point point;
        uint32_t countdown, nslots, nworkers;
    } cases[] = {
        {FQ_FAULT_POP_FREE, 1, 4, 2},   {FQ_FAULT_POP_FREE, 7, 8, 3},
        {FQ_FAULT_POP_FREE, 12, 3, 2},  {FQ_FAULT_CLAIM, 5, 4, 3},
        {FQ_FAULT_PUSH_READY, 9, 5, 2},
    };
    install_alarm();
    uint64_t start = fq_now_ns();
    stop_stats st;
    memset(&st, 0, sizeof st);
    scenario sc;
    for (uint32_t sweep = 0; sweep < o->sweeps && !atomic_load(&violations);
         sweep++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            bool exercised = false;
            for (uint32_t try = 0; try < STOP_TRIES && !exercised; try++) {
                uint64_t seed = mix64(o->seed ^ ((uint64_t)sweep << 32) ^
                                      ((uint64_t)try << 16) ^ (i + 0x570b));
                scenario_init(&sc, cases[i].point, cases[i].countdown,
                              cases[i].nslots, cases[i].nworkers, seed,
                              SIGSTOP, STOP_TASKS);
                exercised = run_stop(&sc, &st);
                if (atomic_load(&violations)) break;
                if (!exercised) st.retried++;
            }
            if (!exercised && !atomic_load(&violations))
                violation("%s: in %u tries the victim never stopped at its "
                          "point with a release meeting its cell",
                          sc.name, STOP_TRIES);
            if (atomic_load(&violations)) break;
        }
    unsigned v = atomic_load(&violations);
    printf("stop/continue: %s sweeps=%u stops of %.0f ms: POP_FREE=%u "
           "CLAIM=%u PUSH_READY=%u; tasks delivered=%" PRIu64
           " (each once) releases deferred=%" PRIu64 " (%" PRIu64
           " waited out a stop, at most %" PRIu64
           " at once, all went through) alerts=0 retried=%u "
           "violations=%u elapsed=%.2fs\n",
           v ? "FAIL" : "OK", o->sweeps, (double)STOP_NS / MS,
           st.stops[FQ_FAULT_POP_FREE], st.stops[FQ_FAULT_CLAIM],
           st.stops[FQ_FAULT_PUSH_READY], st.delivered, st.ebusy,
           st.waited_out, st.max_deferred, st.retried, v,
           (double)(fq_now_ns() - start) / SEC);
    return v ? 1 : 0;
}
