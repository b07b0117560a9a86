/*
 * fork_kills: --fork-kills (stress_ring.c's header says what it checks).
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
#include "fork_scenario.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#define KILL_TASKS 65536u /* never reached: a kill scenario ends by a death */

/* --------------------------------------------------------- kill scenarios */

typedef struct kill_stats {
    unsigned deaths[FQ_FAULT_CLAIM + 1];
    unsigned worker_stuck_on_dead; /* publishes that met a dead popper */
    unsigned starved;              /* ... or found no slot to publish */
    uint64_t delivered, ebusy, max_exit_ns;
} kill_stats;

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
