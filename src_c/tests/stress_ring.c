/*
 * stress_ring: stress and fault tests of the fq ring protocol (fq_ring.h).
 *
 * Modes, and what each checks:
 *
 *   (default) / --short / --long   threaded stress. Threads stand in for
 *     processes: the region is anonymous MAP_SHARED memory, the same kind of
 *     memory and the same process-shared futexes the real workers use. P
 *     producer threads follow the worker loop (pop FREE as WORKER(w), claim
 *     a task into the slot's census, fill the slot, push READY as
 *     READY(w)); one consumer thread follows _consumer.pxi (pop READY as
 *     CONSUMER, reorder window, ordered delivery, leases released to FREE
 *     with fq_try_push, a release that meets FQ_EBUSY kept and retried
 *     before each wait). fq_set_fault stalls a popper inside its pop now
 *     and then (a signal handler sleeps there), so that the deferral runs
 *     on every run. Checked: everything the consumer reads against what
 *     the task number says the producer wrote (a slot handed to two
 *     parties, a torn publish, a lost or duplicated task); the census (a
 *     producer's slot says WORKER(w) and, once claimed, its task; a slot
 *     says CONSUMER exactly while the consumer's books hold it); every slot
 *     back in one queue at the end. Then wake tests with deadlines: close
 *     wakes every FREE and control sleeper, alert wakes the READY sleeper.
 *     The sanitizer builds (TSan, ASan+UBSan) see every access.
 *
 *   --stalled-popper   a popper held inside the real fq_try_pop, between its
 *     tail CAS and its cell release (fq_set_fault raising a signal whose
 *     handler waits), on FREE and on READY: a push that laps onto its cell
 *     gets FQ_EBUSY from fq_try_push with nothing changed, FQ_TIMEOUT from
 *     fq_push within its timeout, and then, from an fq_push waiting in
 *     another thread: FQ_OK once the popper resumes, FQ_ALERT after
 *     fq_alert, FQ_CLOSED after fq_close.
 *
 *   --fork-kills   worker processes (fork) and the parent as consumer, with
 *     a death watcher thread per child calling fq_alert as the real pool
 *     does. One worker SIGKILLs itself at a fault point (POP_FREE, CLAIM,
 *     PUSH_READY) after a countdown; a consumer child dies at POP_READY or
 *     PUSH_FREE while a worker goes on. Checked: the death is seen, every
 *     waiter ends (consumer by alert, workers by close), the census says
 *     exactly what each fault point leaves, every slot and every claimed
 *     task is accounted for once, delivery was in order with no
 *     duplicate, and a push that meets the dead process's cell returns
 *     (FQ_EBUSY, FQ_TIMEOUT, FQ_CLOSED) instead of blocking. In
 *     fork_kills.c.
 *
 *   --stop-cont   as --fork-kills, but the worker SIGSTOPs itself at the
 *     fault point and is continued ~200 ms later: no alert, no error, the
 *     releases that met its cell are deferred and all go through, every
 *     task delivered once, every slot back in a queue. In fork_stops.c.
 *
 * Usage: stress_ring [--short | --long] [-r rounds] [-t tasks] [-p producers]
 *                    [-s max_slots] [-b slot_bytes] [-S seed]
 *        stress_ring --stalled-popper
 *        stress_ring --fork-kills | --stop-cont [--long] [-r sweeps] [-S seed]
 *        stress_ring --stop-cont -c countdown   every stop at that count of
 *          its point (a count past the run's tasks checks that a stop never
 *          reached fails the sweep)
 * Exit 0: no violation; 1: a violation (each printed on stderr); 2: usage;
 * 3: something hung past the watchdog.
 */
#define _GNU_SOURCE
#include "stress_threads.h"

#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--short|--long] [-r rounds] [-t tasks] [-p producers]"
            " [-s max_slots] [-b slot_bytes] [-S seed]\n"
            "       %s --stalled-popper\n"
            "       %s --fork-kills|--stop-cont [--long] [-r sweeps] "
            "[-S seed] [-c stop_countdown]\n",
            argv0, argv0, argv0);
}

int main(int argc, char **argv) {
    /* --short is the default: what CI runs under every sanitizer. */
    uint32_t rounds = 32, max_producers = 4, max_slots = 16;
    uint64_t tasks = 3000, slot_bytes = 8192, seed = 12345;
    uint32_t stop_countdown = 0; /* --stop-cont: the cases' own */
    int mode = 0, is_long = 0, rounds_given = 0; /* 0 threaded, 1 kills,
                                                    2 stop/continue */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--short")) {
            rounds = 32; tasks = 3000; max_producers = 4; max_slots = 16;
            is_long = 0;
        } else if (!strcmp(a, "--long")) {
            rounds = 96; tasks = 20000; max_producers = 8; max_slots = 16;
            is_long = 1;
        } else if (!strcmp(a, "--stalled-popper")) {
            setvbuf(stdout, NULL, _IOLBF, 0);
            return stalled_popper();
        } else if (!strcmp(a, "--fork-kills")) {
            mode = 1;
        } else if (!strcmp(a, "--stop-cont")) {
            mode = 2;
        } else if (v && !strcmp(a, "-r")) {
            rounds = (uint32_t)strtoul(v, NULL, 0); i++;
            rounds_given = 1;
        } else if (v && !strcmp(a, "-t")) {
            tasks = strtoull(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-p")) {
            max_producers = (uint32_t)strtoul(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-s")) {
            max_slots = (uint32_t)strtoul(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-b")) {
            slot_bytes = strtoull(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-S")) {
            seed = strtoull(v, NULL, 0); i++;
        } else if (v && !strcmp(a, "-c")) {
            stop_countdown = (uint32_t)strtoul(v, NULL, 0); i++;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mode != 0) {
        /* The fork modes' --long is more sweeps over the same scenarios,
         * each with its own seed. */
        fork_opts o = {rounds_given ? rounds : (is_long ? 40u : 2u), seed,
                       stop_countdown};
        if (o.sweeps == 0) {
            usage(argv[0]);
            return 2;
        }
        return mode == 1 ? fork_kills_main(&o) : stop_cont_main(&o);
    }
    if (rounds == 0 || tasks == 0 || max_producers == 0 ||
        max_producers > MAX_PRODUCERS || max_slots == 0 ||
        max_slots > MAX_SLOTS || slot_bytes < 8) {
        fprintf(stderr, "bad arguments: producers 1..%d, slots 1..%d, "
                        "slot_bytes >= 8\n",
                MAX_PRODUCERS, MAX_SLOTS);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stall_in_pop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    uint64_t start = fq_now_ns();
    totals tot;
    memset(&tot, 0, sizeof tot);
    for (uint32_t round = 0; round < rounds && !atomic_load(&violations);
         round++) {
        /* Sweep every ring size, and pair each with varying producer
         * counts so that 1 slot / many producers and many slots / 1
         * producer both occur. */
        uint32_t nslots = 1 + round % max_slots;
        uint32_t nproducers = 1 + (uint32_t)(mix64(seed + round) % max_producers);
        stress_round(round, nslots, nproducers, tasks, slot_bytes, seed, &tot);
    }
    double close_ms = 0, alert_ms = 0;
    for (uint32_t i = 0; i < 6 && !atomic_load(&violations); i++) {
        /* Half with a long spin phase, so close also lands on spinners. */
        double ms = test_close_wakes_all(1 + i % max_producers,
                                         (i & 1) ? 200 * 1000 : 0);
        if (ms > close_ms) close_ms = ms;
    }
    if (!atomic_load(&violations)) alert_ms = test_alert();
    /* Over this many rounds, the stalls cannot all have missed. (Publishes
     * never meet a stalled READY pop: with one READY popper, nothing is
     * recycled while it stalls, and the other nslots - 1 slots cannot lap
     * READY's capacity >= nslots cells, so ready_ebusy stays 0.) */
    if (rounds >= 16 && max_slots >= 2 && max_producers >= 2 &&
        tot.ebusy == 0)
        violation("no release met a stalled FREE popper: the deferral went "
                  "untested");
    unsigned v = atomic_load(&violations);
    printf("stress_ring: %s rounds=%u tasks=%" PRIu64 " slots=1..%u "
           "producers<=%u holds=%" PRIu64 " all-held-detected=%" PRIu64
           " max_window=%" PRIu64 " free_ebusy=%" PRIu64
           " max_deferred=%" PRIu64 " ready_ebusy=%" PRIu64
           " timeouts=%" PRIu64 "/%" PRIu64
           " close_wake_max_ms=%.2f alert_wake_ms=%.2f violations=%u"
           " elapsed=%.2fs\n",
           v ? "FAIL" : "OK", rounds, tot.tasks, max_slots, max_producers,
           tot.holds, tot.detections, tot.max_window, tot.ebusy,
           tot.max_deferred, tot.ready_busy, tot.producer_timeouts,
           tot.consumer_timeouts, close_ms, alert_ms, v,
           (double)(fq_now_ns() - start) / SEC);
    return v ? 1 : 0;
}
