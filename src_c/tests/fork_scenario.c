/* fork_scenario: a scenario's children and their supervision (see
 * fork_scenario.h). */
#define _GNU_SOURCE
#include "fork_scenario.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

const char *const phase_names[] = {"start", "pop", "claim", "fill",
                                   "push"};

const char *const point_names[] = {"NONE",      "PUSH_FREE",
                                   "PUSH_READY", "POP_FREE",
                                   "POP_READY", "CLAIM"};

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


void install_alarm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
}

void scenario_init(scenario *sc, fq_fault_point point,
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

/* ------------------------------------------------------- the worker child */

static void set_phase(worker_rec *rec, int phase) {
    atomic_store_explicit(&rec->phase_ns, fq_now_ns(), memory_order_relaxed);
    atomic_store_explicit(&rec->phase, phase, memory_order_relaxed);
}

/* Children start together, once all are there: a victim that starts late
 * could find the work done before its countdown runs out. */
void await_go(scenario *sc) {
    while (!atomic_load(&sc->b->go)) sleep_ns(50 * 1000);
}

_Noreturn void child_exit(worker_rec *rec, int how) {
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

int scenario_open(scenario *sc) {
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
void scenario_start(scenario *sc, int with_consumer) {
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

int wait_exited(child *k, uint64_t until) {
    while (!atomic_load(&k->exited)) {
        if (fq_now_ns() > until) return 0;
        sleep_ns(MS / 2);
    }
    return 1;
}

/* Orderly end: close, then every child must leave within the grace
 * period (a child still there did not stop on the closed flag: killed,
 * and reported). Returns the slowest exit after close, in ns. */
uint64_t scenario_stop(scenario *sc) {
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

void scenario_close(scenario *sc) {
    alarm(0);
    munmap(sc->b, sc->board_len);
    region_close(&sc->g);
}

int killed_by(const child *k, int sig) {
    return WIFSIGNALED(k->status) && WTERMSIG(k->status) == sig;
}

/* A live child must have ended cleanly, in one of the ways listed. */
void expect_clean_exit(scenario *sc, const child *k,
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
uint32_t stuck_pops(const fq_ring *r, fq_queue_id q, uint64_t *pos) {
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
int stuck_push(const fq_ring *r, fq_queue_id q) {
    uint64_t cap = r->ctrl->capacity;
    uint64_t tail = atomic_load(&r->ctrl->queues[q].tail);
    uint64_t head = atomic_load(&r->ctrl->queues[q].head);
    return head > tail &&
           atomic_load(&r->cells[q][tail & (cap - 1)].seq) == tail;
}

/* Whether the next push on q lands on a cell a popper still holds. */
int head_meets_stuck_pop(const fq_ring *r, fq_queue_id q) {
    uint64_t cap = r->ctrl->capacity;
    uint64_t head = atomic_load(&r->ctrl->queues[q].head);
    return head >= cap &&
           atomic_load(&r->cells[q][head & (cap - 1)].seq) == head - cap + 1;
}

/* The slot whose census is `owner`, if exactly one has it. */
uint32_t slot_owned_by(const fq_ring *r, uint32_t owner, uint32_t *n) {
    uint32_t found = NO_SLOT;
    *n = 0;
    for (uint32_t s = 0; s < r->ctrl->nslots; s++)
        if (fq_slot_owner(r, s) == owner) {
            found = s;
            (*n)++;
        }
    return found;
}
