/*
 * fq_ring.pml: a model of the fq ring protocol (src_c/fq_ring.h) for spin.
 *
 * What is modelled: NSLOTS slots, 2 workers, 1 consumer and the death
 * watcher. FREE and READY are Vyukov queues of capacity CAP (the next power
 * of two >= NSLOTS, as fq_layout makes it). Each cell keeps its sequence as
 * what it means to the next position that reaches it: empty for that lap,
 * claimed by a pusher (head CAS done, release store not yet), full, or
 * claimed by a popper (tail CAS done, release not yet). That is exact,
 * not an approximation: with only NSLOTS <= CAP indices a pusher can meet
 * nothing but an empty cell or a popper's (asserted at every push), and a
 * claim is one step because its CAS succeeds only if neither the position
 * nor the cell moved since it read them (a stale read only costs a retry).
 * The queues' memory ordering is the stress test's job, under TSan; the
 * model is sequentially consistent.
 *
 * Every push and pop is two steps, the claim and the release, with the
 * census word (header.owner) written in the release step, so a worker can
 * stop or die holding a claimed cell. Every pop that may wait runs fq_pop's
 * event-count protocol step by step: try, check the abort flags, waiters +=
 * 1, key = wake_seq, try again, check the flags, then a futex sleep that
 * returns at once if wake_seq moved and otherwise until a futex wake picks
 * this sleeper. A push increments wake_seq and wakes ONE sleeper when it
 * reads waiters > 0; close and alert wake all. Sleeps have no timeout: the
 * model shows that progress never needs the real code's bounded slices.
 *
 * A worker: pop FREE, claim a task (the fetch_add, then its record in the
 * slot's header: two steps), push READY; past the last task it publishes
 * an end marker and stops. It may die before any step: between a claim
 * and its release inside either queue, between the fetch_add and the
 * record, between a push and its wake, at the top of a wait round, asleep
 * (dying just before sleeping is the same to everyone else). What it held
 * stays held forever, a claimed cell included; the watcher then raises the
 * sticky alert and wakes READY's sleepers.
 *
 * The consumer: at each fetch it stops if the alert is up (a death is
 * reported at the next fetch), retries its deferred releases, runs the
 * census check, then pops READY (aborting on alert or close) into its
 * reorder window and delivers in order. Each delivered batch is released at
 * once or kept as a lease the user gives back later. A release is
 * fq_try_push on FREE: if the cell it must use is still a popper's, the
 * slot is deferred (never lost, never waited for) and retried before the
 * next wait. The census check is check_census: the consumer's books must
 * match the census words (audit), and if every word says CONSUMER and no
 * release is deferred it reports "holds every slot" instead of waiting. At
 * the end (all tasks, alert or report) it closes the ring, gives back its
 * leases (or keeps some to the end) and its window, and stops. Its READY
 * pop is split like a worker's, so that "no push meets the consumer's
 * claimed cell" is checked rather than assumed; its FREE push is one step
 * (see try_push_free). It never dies: its death ends the ring.
 *
 * Checked, over every interleaving:
 *   - no slot is held twice (owner[] at every hand-over) and the census
 *     ghost: each slot is in exactly one place, a queue cell (full or
 *     claimed, by a live or dead process), a worker's hands (live or dead)
 *     or the consumer's books (window, lease, deferred), and the census
 *     words say CONSUMER for exactly the consumer's; at every census check
 *     and at the end;
 *   - with no death and no report, tasks 0..NTASKS-1 come out in order,
 *     each exactly once, each from a slot whose header names it;
 *   - the report "holds every slot" is only made when nothing is in
 *     production (empty window, no claimed task outstanding), and never
 *     while a release is deferred: a deferral means a popper holds a slot
 *     whose census is not the consumer's, so check_census's "or ndeferred"
 *     is a second guard, never the one that decides (asserted);
 *   - a worker's READY push never finds the consumer's cell still claimed
 *     (one popper cannot be lapped), so publish never waits in fq_push;
 *   - no invalid end state: nobody is left asleep, the consumer always
 *     finishes (all tasks, alert or report): a death always reaches it,
 *     close wakes every waiter, and a popper that is only slow always
 *     releases its cell, so deferred releases go out and no wait needs a
 *     timeout; at the end only the dead hold slots or claimed cells.
 * Every execution is finite (the tasks are), so "never waits forever" is
 * exactly "no invalid end state", which a safety search decides.
 *
 * Not modelled: fq_pop's passing on of a wake (this model shows that no
 * wake is lost without it: READY has one popper, FREE one pusher), the
 * spin phase, passes and epochs, the consumer's death.
 *
 * Broken variants, each of which spin must refute (the model can fail):
 *   -DBROKEN_WAKE       waiter sleeps without re-trying after waiters += 1
 *                       (the lost wakeup): invalid end state;
 *   -DBROKEN_CLOSE      close sets the flag but bumps no event count:
 *                       invalid end state;
 *   -DNO_HOLD_CHECK     the consumer waits even when it holds every slot:
 *                       invalid end state;
 *   -DCLAIM_FIRST       workers claim the task before owning a slot: the
 *                       hold report finds a task in the window;
 *   -DBROKEN_DEFER      a release that meets a popper's cell drops the slot
 *                       instead of deferring it: the census check finds a
 *                       slot nowhere (no death needed: a slow popper does);
 *   -DBROKEN_DEATH_WAIT a release that meets a popper's cell waits for it,
 *                       checking no flag: with a dead popper, an invalid
 *                       end state (with MAXDEATHS=0 it verifies: waiting
 *                       for a popper that is only slow is harmless).
 * -DREACH=n turns the n-th "this can happen" into an assertion, so that
 * spin shows the model does reach it (the checks above are not vacuous):
 *   1 a deferred release goes out later; 2 the consumer reports that it
 *   holds every slot; 3 a release is deferred past a dead popper's cell;
 *   4 the alert stops the consumer while a dead pusher's claimed cell
 *   blocks READY with a published cell behind it.
 *
 * Run (tests/test_ring_model.py does this for several sizes):
 *   spin -DNSLOTS=3 -DNTASKS=3 -DMAXDEATHS=0 -a fq_ring.pml
 *   gcc -w -Og -DSAFETY -DMEMLIM=4096 -o pan pan.c
 *   ./pan -m5000 -w25                  # "errors: 0" for the correct model
 *   spin -DNSLOTS=3 ... -t -p fq_ring.pml   # replays a counterexample
 * with the same -D flags on every spin call (add -DBROKEN_DEFER etc. for a
 * broken variant). -Og: -O1 takes longer to build pan.c than it saves.
 * Sizes (NSLOTS/NTASKS/MAXDEATHS, default 3/3/0): states stored and pan's
 * own seconds on a quiet 2-core machine (building pan adds about 4 s; a
 * busy machine can double the times):
 *   each test run:   3/3/0  4.8 M   8 s     2/3/1  9.1 M  13 s
 *   slow (-DCOLLAPSE, as the test builds them: 2 GB at most, 6 without):
 *                    3/4/0 14.1 M  30 s     3/2/1  8.5 M  17 s
 *                    2/4/1 18.9 M  37 s     2/3/2 12.2 M  26 s
 *                    3/3/1 34.2 M  70 s
 *   2/2/1 (3.4 M, 5 s) is the quickest size with a death. The broken
 *   variants and REACH points are refuted within 1.4 M states, seconds.
 * Several steps of one process are one atomic step where nobody else could
 * tell the difference (comments say why); a death point is the first
 * option of the step it precedes, which is the same as a step of its own
 * but adds no state to runs without deaths.
 */

#ifndef NSLOTS
#define NSLOTS 3
#endif
#ifndef NTASKS
#define NTASKS 3
#endif
#ifndef MAXDEATHS
#define MAXDEATHS 0
#endif
#ifndef REACH
#define REACH 0
#endif
#define REACHED(n) assert(REACH != n)

#if NSLOTS <= 2
#define CAP 2
#else
#define CAP 4
#endif

#define NWORKERS 2
#define CONSUMER 2          /* process index of the consumer */
#define FREE_Q 0
#define READY_Q 1
#define NOBODY 255
#define NO_TASK 255         /* FQ_NO_TASK */

/* fq_pop's results and abort flags */
#define R_NONE 0
#define R_OK 1
#define R_CLOSED 2
#define R_ALERT 3
#define AB_CLOSE 1
#define AB_ALERT 2

/* A cell's sequence, as the next position to reach the cell reads it */
#define CE 0                /* seq == pos: empty for this lap */
#define CPU 1               /* a pusher's head CAS took it, no release yet */
#define CF 2                /* seq == pos + 1: full */
#define CPO 3               /* a popper's tail CAS took it, no release yet */

/* The census word's kind (its `who` matters to diagnostics only). */
#define K_FREE 0
#define K_WORKER 1
#define K_READY 2
#define K_CONSUMER 3

/* The control block. */
byte next_task;             /* fetch_add by workers */
bit closed;                 /* 0 -> 1 by the consumer's close */
bit alert;                  /* set by the death watcher, sticky */
byte waiters[2];            /* per queue: processes inside the slow path */
/* The futex word wake_seq of each queue, kept as what matters about it:
 * whether it moved since each waiter read its key. keyq[p] = 1 + the queue
 * whose key process p holds, moved[p]: bumped since. Exact, unlike a
 * counter wrapping in a byte, and it keeps the state space finite. */
byte keyq[3];
bit moved[3];
byte asleep[3];             /* the kernel's futex queues: 1 + the queue */

/* The cells of queue q are q*CAP .. q*CAP+CAP-1; head and tail are
 * positions modulo CAP (laps are what the cell states encode). */
byte cst[2 * CAP];          /* CE, CPU, CF or CPO */
byte cslot[2 * CAP];        /* the slot; set at a push's claim, where the
                               real code stores it at the release: no
                               popper reads a claimed cell */
byte cown[2 * CAP];         /* ghost: who claimed a CPU or CPO cell */
byte head[2];
byte tail[2];

/* Slot headers: the census word and the task. */
byte cen[NSLOTS];
byte hdr_task[NSLOTS];

/* Every other place a slot can be, global so that one check sees them all:
 * what the real processes keep in local variables and the Consumer's
 * books. */
byte whold[NWORKERS];       /* 1 + the slot in a worker's hands, 0: none */
byte win[NTASKS];           /* the reorder window: 1 + slot of task t */
byte lease[NSLOTS];         /* slots the user holds, a stack */
byte nheld;
byte dfr;                   /* deferred releases: bit s for slot s */

/* Ghosts for the properties. */
byte owner[NSLOTS];         /* NOBODY while in a cell, else the process */
bit seen[NTASKS];
bit dead[NWORKERS];
byte deaths;
bit alerted;                /* the consumer stopped on the alert */
bit reported;               /* the consumer reported "holds every slot" */
byte delivered;             /* tasks the consumer handed out, in order */
byte running = NWORKERS + 1;

inline take(s, me) {
    assert(owner[s] == NOBODY);     /* nobody else holds it */
    owner[s] = me
}

inline give(s, me) {
    assert(owner[s] == me);
    owner[s] = NOBODY
}

/* key = wake_seq */
inline read_key(q, me) {
    keyq[me] = q + 1;
    moved[me] = 0
}

/* wake_seq += 1 */
inline bump(q) {
    atomic {
        if :: keyq[0] == q + 1 -> moved[0] = 1 :: else fi;
        if :: keyq[1] == q + 1 -> moved[1] = 1 :: else fi;
        if :: keyq[2] == q + 1 -> moved[2] = 1 :: else fi
    }
}

inline futex_wake_one(q) {
    atomic {
        if
        :: asleep[0] == q + 1 -> asleep[0] = 0
        :: asleep[1] == q + 1 -> asleep[1] = 0
        :: asleep[2] == q + 1 -> asleep[2] = 0
        :: else -> skip
        fi
    }
}

inline futex_wake_all(q) {
    atomic {
        if :: asleep[0] == q + 1 -> asleep[0] = 0 :: else fi;
        if :: asleep[1] == q + 1 -> asleep[1] = 0 :: else fi;
        if :: asleep[2] == q + 1 -> asleep[2] = 0 :: else fi
    }
}

inline signal_all(q) {
    bump(q);
    futex_wake_all(q)
}

/* A worker dies here: deaths are at most MAXDEATHS in all. Used as the
 * first thing of an atomic step, the death point before that step. The
 * dead are no longer running; what they hold is left where it is. */
inline may_die(mortal, me) {
    if
    :: mortal && deaths < MAXDEATHS ->
        deaths++; dead[me] = 1; running--; goto died
    :: true -> skip
    fi
}

/* A push's second half, after its release store and the seq_cst fence:
 * `flag` says whether there was a push. The read of waiters is a step of
 * its own, apart from the release, as in fq_push (BROKEN_WAKE shows what
 * the waiter's side of that Dekker pair is for). */
inline wake_if_waiters(q, flag, mortal, me) {
    if
    :: atomic { flag && waiters[q] > 0 -> may_die(mortal, me); flag = 0 };
       bump(q);
       futex_wake_one(q)
    :: atomic { !(flag && waiters[q] > 0) -> may_die(mortal, me); flag = 0 }
    fi
}

inline abort_check(ab, res) {
    if
    :: (ab & AB_CLOSE) && closed -> res = R_CLOSED
    :: (ab & AB_ALERT) && alert -> res = R_ALERT
    :: else -> skip
    fi
}

/* fq_try_pop's tail CAS: a full cell at the tail, or "empty" (an empty
 * cell, a pusher's claimed one, or the last lap's popper's). */
inline pop_claim(q, c, s, got, me) {
    c = q * CAP + tail[q];
    if
    :: cst[c] == CF ->
        cst[c] = CPO; cown[c] = me; s = cslot[c];
        tail[q] = (tail[q] + 1) % CAP;
        got = 1
    :: else -> got = 0; c = 0
    fi
}

/* The rest of fq_try_pop: the census word (and a worker's task cleared
 * until its claim), then the release store, as one step: what lies
 * between them is a death's business only, and a death there leaves the
 * same cell claimed (the census word's kind for a dead worker's slot is
 * for diagnostics, which decide nothing here). */
inline pop_release(q, c, s, me) {
    assert(cst[c] == CPO && cown[c] == me && cslot[c] == s);
    cst[c] = CE; cslot[c] = 0; cown[c] = NOBODY; c = 0;
    take(s, me);
    if
    :: me == CONSUMER -> cen[s] = K_CONSUMER
    :: else -> cen[s] = K_WORKER; hdr_task[s] = NO_TASK; whold[me] = s + 1
    fi
}

inline pop_finish(q, c, s, got, me, mortal) {
    if
    :: got -> atomic { may_die(mortal, me); pop_release(q, c, s, me) }
    :: else -> skip
    fi
}

/* fq_pop's first try and flag check: inside the caller's atomic step (the
 * slow path repeats both, so splitting them adds interleavings, not
 * outcomes). */
inline pop_first(q, c, s, got, res, ab, me) {
    res = R_NONE;
    pop_claim(q, c, s, got, me);
    if
    :: got -> res = R_OK
    :: else -> abort_check(ab, res)
    fi
}

/* The rest of fq_pop: the first try's release, then the slow path. */
inline pop_rest(q, c, s, got, res, ab, me, mortal) {
    pop_finish(q, c, s, got, me, mortal);
    do
    :: res != R_NONE -> break
    :: else ->
        /* waiters += 1 and key = wake_seq as one step: a bump between
         * them leaves the same key and the same retry. */
        atomic { may_die(mortal, me); waiters[q]++; read_key(q, me) };
        /* The retry's claim and the flag check as one step: whatever
         * lands between them is seen by the next round, which a bump
         * after it guarantees. The key stays read before both. */
        atomic {
#ifndef BROKEN_WAKE
            pop_claim(q, c, s, got, me);
#else
            got = 0;
#endif
            if
            :: got -> res = R_OK
            :: else -> abort_check(ab, res)
            fi
        };
        if
        :: got -> pop_finish(q, c, s, got, me, mortal)
        :: res == R_NONE ->
            atomic {
                may_die(mortal, me);
                /* FUTEX_WAIT compares and enqueues atomically: EAGAIN if
                 * the word moved since the key. */
                if
                :: !moved[me] -> asleep[me] = q + 1
                :: else -> skip
                fi
            };
            (asleep[me] == 0)
        :: else -> skip
        fi;
        atomic { waiters[q]--; keyq[me] = 0; moved[me] = 0 }
    od;
    got = 0
}

proctype worker(byte me) {
    byte s, t, res, c;
    bit got, pushed;
    do
    ::
#ifdef CLAIM_FIRST
        atomic { may_die(1, me); t = next_task; next_task++ };
#endif
        atomic { may_die(1, me); pop_first(FREE_Q, c, s, got, res, AB_CLOSE, me) };
        pop_rest(FREE_Q, c, s, got, res, AB_CLOSE, me, 1);
        if
        :: res == R_CLOSED -> break
        :: else -> assert(res == R_OK)
        fi;
#ifndef CLAIM_FIRST
        /* fetch_add after owning the slot: every claimed task has one. */
        atomic { may_die(1, me); t = next_task; next_task++ };
#endif
        /* fq_claim_task's record, after its fault point. The header's
         * plain stores are published by the push's release below. */
        atomic { may_die(1, me); hdr_task[s] = t };
        /* fq_try_push's head CAS. Only the consumer pops READY, and it
         * releases each cell before claiming the next, so a pusher can
         * only reach its cell with CAP + 1 slots in play. */
        atomic {
            may_die(1, me);
            c = READY_Q * CAP + head[READY_Q];
            assert(cst[c] == CE);
            cst[c] = CPU; cown[c] = me; cslot[c] = s;
            head[READY_Q] = (head[READY_Q] + 1) % CAP;
            give(s, me); whold[me] = 0
        };
        /* The census word, then the release store that publishes it with
         * the header (see pop_release for why one step). */
        atomic {
            may_die(1, me);
            cen[s] = K_READY; cst[c] = CF; cown[c] = NOBODY; c = 0;
            pushed = 1
        };
        wake_if_waiters(READY_Q, pushed, 1, me);
        if
        :: t >= NTASKS -> break     /* published its end marker */
        :: else -> t = 0; s = 0     /* dead values: keep states few */
        fi
    od;
    running--;
died:
    skip
}

proctype watcher() {
    /* The death watcher: notices a death and alerts the consumer. */
end_idle:
    (deaths > 0);
    alert = 1;
    signal_all(READY_Q)
}

/* The consumer's fq_try_push of slot s on FREE, claim and release as one
 * step: it does not die, and FREE has no other pusher, so the claimed
 * cell only looks empty to a popper, as it did just before. The header's
 * task is cleared only to keep states few (no one reads it before the
 * next worker's pop clears it). */
inline try_push_free(s, c, pushed) {
    c = FREE_Q * CAP + head[FREE_Q];
    if
    :: cst[c] == CE ->
        give(s, CONSUMER);
        cen[s] = K_FREE; hdr_task[s] = NO_TASK;
        cst[c] = CF; cslot[c] = s;
        head[FREE_Q] = (head[FREE_Q] + 1) % CAP;
        pushed = 1
    :: else ->
        /* FQ_EBUSY: never a full queue, only a popper inside its pop */
        assert(cst[c] == CPO);
        pushed = 0
    fi;
    c = 0
}

/* Consumer._free, inside the caller's atomic step; the caller then runs
 * wake_if_waiters. It never waits (it runs in finalizers): a slot whose
 * cell is still a popper's is deferred, still the consumer's. */
inline free_slot(s, c, pushed) {
#ifdef BROKEN_DEATH_WAIT
    (cst[FREE_Q * CAP + head[FREE_Q]] != CPO);
#endif
    try_push_free(s, c, pushed);
    if
    :: !pushed ->
        if
        :: dead[cown[FREE_Q * CAP + head[FREE_Q]]] -> REACHED(3)
        :: else -> skip
        fi;
#ifndef BROKEN_DEFER
        dfr = dfr | (1 << s)
#else
        give(s, CONSUMER)   /* forgotten: in no queue, not in the books */
#endif
    :: else -> skip
    fi;
    s = 0
}

/* Consumer._flush_deferred: each push wakes on its own. */
inline flush_deferred(i, c, pushed) {
    i = 0;
    do
    :: i < NSLOTS ->
        if
        :: dfr & (1 << i) ->
            atomic {
                try_push_free(i, c, pushed);
                if
                :: pushed -> REACHED(1); dfr = dfr & ~(1 << i)
                :: else -> skip
                fi
            };
            wake_if_waiters(FREE_Q, pushed, 0, CONSUMER)
        :: else -> skip
        fi;
        i++
    :: else -> break
    od;
    i = 0
}

/* The census ghost, and audit(): n counts the places outside the
 * consumer, m the consumer's books. Temporaries are zeroed after. */
inline census_check(i, j, n, m) {
    d_step {
        i = 0;
        do
        :: i < NSLOTS ->
            n = 0; m = 0;
            j = 0;
            do
            :: j < 2 * CAP ->
                if :: cst[j] != CE && cslot[j] == i -> n++ :: else fi;
                j++
            :: else -> break
            od;
            if :: whold[0] == i + 1 -> n++ :: else fi;
            if :: whold[1] == i + 1 -> n++ :: else fi;
            j = 0;
            do
            :: j < NTASKS ->
                if :: win[j] == i + 1 -> m++ :: else fi;
                j++
            :: else -> break
            od;
            j = 0;
            do
            :: j < nheld ->
                if :: lease[j] == i -> m++ :: else fi;
                j++
            :: else -> break
            od;
            if :: dfr & (1 << i) -> m++ :: else fi;
            assert(n + m == 1);
            assert((cen[i] == K_CONSUMER) == (m == 1));
            i++
        :: else -> break
        od;
        i = 0; j = 0; n = 0; m = 0
    }
}

proctype consumer() {
    byte s, t, res, c, expected, in_window, i, j, n, m;
    bit got, pushed;
    do
    :: atomic {
        /* Between two next() calls the user may give a lease back. */
        nheld > 0 && expected < NTASKS ->
        nheld--; s = lease[nheld]; lease[nheld] = 0;
        free_slot(s, c, pushed)
       };
       wake_if_waiters(FREE_Q, pushed, 0, CONSUMER)
    :: expected == NTASKS -> break
    :: expected < NTASKS ->
        if
        :: dfr != 0 -> flush_deferred(i, c, pushed)
        :: else -> skip
        fi;
        /* The alert, the census check and the first try of the pop as one
         * step: only the consumer makes a census word CONSUMER, so what
         * workers do meanwhile cannot turn the check's answer into a
         * report, and the pop's slow path re-reads the alert. */
        atomic {
            if
            :: alert -> alerted = 1; break
            :: else -> skip
            fi;
            census_check(i, j, n, m);
            d_step {
                m = 0; i = 0;
                do
                :: i < NSLOTS ->
                    if :: cen[i] == K_CONSUMER -> m++ :: else fi;
                    i++
                :: else -> break
                od;
                i = 0;
                assert(dfr == 0 || m < NSLOTS)
            };
#ifndef NO_HOLD_CHECK
            if
            :: m == NSLOTS && dfr == 0 ->
                /* No slot is left to produce `expected`: report it. A
                 * claimed task always holds a slot, so nothing is in
                 * production. */
                assert(in_window == 0 && next_task == expected);
                REACHED(2);
                reported = 1;
                break
            :: else -> skip
            fi;
#endif
            m = 0;
            pop_first(READY_Q, c, s, got, res, AB_ALERT | AB_CLOSE, CONSUMER)
        };
        pop_rest(READY_Q, c, s, got, res, AB_ALERT | AB_CLOSE, CONSUMER, 0);
        /* Filing is local work on the slot just popped. */
        atomic {
            if
            :: res == R_ALERT ->
                if
                :: cst[READY_Q * CAP + tail[READY_Q]] == CPU &&
                   cst[READY_Q * CAP + (tail[READY_Q] + 1) % CAP] == CF ->
                    REACHED(4)
                :: else -> skip
                fi;
                alerted = 1; res = 0; break
            :: else -> assert(res == R_OK); res = 0
            fi;
            t = hdr_task[s];
            if
            :: t >= NTASKS -> t = 0; free_slot(s, c, pushed)  /* end marker */
            :: else ->
                /* At most NSLOTS tasks are in flight past `expected`. */
                assert(t >= expected && t < expected + NSLOTS);
                assert(win[t] == 0);
                win[t] = s + 1;
                in_window++;
                s = 0;
                t = 0
            fi
        };
        wake_if_waiters(FREE_Q, pushed, 0, CONSUMER);
        /* In-order delivery out of the window: kept, or released at once. */
        do
        :: expected < NTASKS && win[expected] != 0 ->
            atomic {
                s = win[expected] - 1;
                win[expected] = 0;
                in_window--;
                assert(owner[s] == CONSUMER && hdr_task[s] == expected);
                assert(!seen[expected]);
                seen[expected] = 1;
                delivered++;
                expected++;
                if
                :: nheld < NSLOTS -> lease[nheld] = s; nheld++; s = 0
                :: true -> free_slot(s, c, pushed)
                fi
            };
            wake_if_waiters(FREE_Q, pushed, 0, CONSUMER)
        :: else -> break
        od
    od;

    /* fq_close: the flag first, then every event count. */
    closed = 1;
#ifndef BROKEN_CLOSE
    signal_all(FREE_Q);
    signal_all(READY_Q);
#endif
    /* Leases outlive close: the user gives each back later, or keeps it
     * to the end, so close alone must wake every waiter. The window's
     * slots go back with the ring. */
    do
    :: atomic {
        nheld > 0 -> nheld--; s = lease[nheld]; lease[nheld] = 0;
        free_slot(s, c, pushed)
       };
       wake_if_waiters(FREE_Q, pushed, 0, CONSUMER)
    :: true -> break
    od;
    i = 0;
    do
    :: i < NTASKS ->
        if
        :: win[i] != 0 ->
            atomic { s = win[i] - 1; win[i] = 0; free_slot(s, c, pushed) };
            wake_if_waiters(FREE_Q, pushed, 0, CONSUMER)
        :: else -> skip
        fi;
        i++
    :: else -> break
    od;
    i = 0;
    census_check(i, j, n, m);
    running--;
died:                       /* may_die's label: the consumer never dies */
    skip
}

init {
    byte s, i, j, n, m;
    atomic {
        /* fq_init: FREE holds every slot. */
        s = 0;
        do
        :: s < NSLOTS ->
            owner[s] = NOBODY; cen[s] = K_FREE; hdr_task[s] = NO_TASK;
            cst[FREE_Q * CAP + s] = CF; cslot[FREE_Q * CAP + s] = s;
            s++
        :: else -> break
        od;
        head[FREE_Q] = NSLOTS % CAP;
        s = 0;
        do
        :: s < 2 * CAP -> cown[s] = NOBODY; s++
        :: else -> break
        od;
        s = 0;
        run worker(0);
        run worker(1);
        run consumer();
        run watcher()
    };
    (running == 0);
    /* Nobody is left asleep: close and alert woke every waiter. */
    assert(asleep[0] == 0 && asleep[1] == 0 && asleep[2] == 0);
    census_check(i, j, n, m);
    /* Only the dead keep slots: in hand or in a half-done queue step. */
    assert(whold[0] == 0 || dead[0]);
    assert(whold[1] == 0 || dead[1]);
    j = 0;
    do
    :: j < 2 * CAP ->
        if
        :: cst[j] == CPU || cst[j] == CPO ->
            assert(cown[j] < NWORKERS && dead[cown[j]])
        :: else -> skip
        fi;
        j++
    :: else -> break
    od;
    assert(deaths > 0 || !alerted);
    if
    :: deaths == 0 && !reported ->
        assert(delivered == NTASKS);
        s = 0;
        do
        :: s < NTASKS -> assert(seen[s]); s++
        :: else -> break
        od
    :: else ->
        /* A death or a report stops the consumer early, never silently. */
        assert(delivered == NTASKS || alerted || reported)
    fi
}
