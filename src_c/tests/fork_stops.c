/* fork_stops: --stop-cont (stress_ring.c's header says what it checks). */
#define _GNU_SOURCE
#include "fork_scenario.h"

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define STOP_NS (200 * MS)
#define STOP_TASKS 3000u


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
                uint32_t countdown = o->stop_countdown ? o->stop_countdown
                                                       : cases[i].countdown;
                scenario_init(&sc, cases[i].point, countdown,
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
