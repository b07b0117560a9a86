/*
 * fq_ring.pml: a model of the fq ring protocol (src_c/fq_ring.h) for spin.
 *
 * What is modelled: NSLOTS slots, 2 workers and 1 consumer. FREE and READY
 * are channels (the Vyukov queue is abstracted to an atomic FIFO: its own
 * memory ordering is the stress test's job, under TSan). Every pop that may
 * wait runs the event-count protocol of fq_pop step by step: try, check the
 * abort flags, waiters += 1, key = wake_seq, try again, check the flags,
 * then a futex sleep that returns at once if wake_seq moved and otherwise
 * until a futex wake picks this sleeper. A push increments wake_seq and
 * wakes ONE sleeper when it reads waiters > 0; close and alert wake all.
 * Sleeps have no timeout here: the model shows that progress never needs
 * the real code's bounded slices.
 *
 * A worker: pop FREE, claim a task (fetch_add, after owning the slot),
 * write the header, push READY; past the last task it publishes an end
 * marker and stops. It may die before any step, asleep included, and then
 * keeps its slot (and its task) forever; the death watcher raises alert.
 * The consumer: pop READY, reorder window, in-order delivery; each batch
 * it delivers is released at once or kept as a lease the user gives back
 * later (possibly never before the next pop). Before waiting it checks
 * whether it holds every slot with the next task missing, and reports that
 * instead of waiting. At the end (all tasks, an alert or the report) it
 * closes the ring, gives back its slots and stops.
 *
 * Checked, over every interleaving:
 *   - no slot owned by two parties at once (owner[] assertions);
 *   - with no death and no report, tasks 0..NTASKS-1 come out in order,
 *     each exactly once, and all their content is the task's own;
 *   - "the consumer holds every slot" happens only with an empty window
 *     (a claimed task always holds a slot) and is reported, not waited on;
 *   - no deadlock and no invalid end state: nobody is left asleep, the
 *     consumer always finishes (all tasks, alert or report), close wakes
 *     every waiter, a death always reaches the consumer;
 *   - at the end every slot is in a queue or in a dead worker's hands.
 * Every execution is finite (the tasks are), so "never waits forever" is
 * exactly "no invalid end state", which a safety search decides.
 *
 * Broken variants, each of which spin must refute (the model can fail):
 *   -DBROKEN_WAKE      waiter sleeps without re-trying after waiters += 1
 *                      (the lost-wakeup hazard);
 *   -DBROKEN_CLOSE     close sets the flag but bumps no event count;
 *   -DNO_HOLD_CHECK    the consumer waits even when it holds every slot;
 *   -DCLAIM_FIRST      workers claim the task before owning a slot.
 *
 * Run (about a second; tests/test_ring_model.py does this):
 *   spin -a fq_ring.pml                # or: spin -DBROKEN_WAKE -a ...
 *   gcc -O2 -DSAFETY -o pan pan.c
 *   ./pan -m100000                     # "errors: 0" for the correct model
 *   spin -t -p fq_ring.pml             # replays a counterexample trail
 * Sizes: -DNSLOTS=2|3 (default 3), -DNTASKS=... (default 4), -DMAXDEATHS=0|1.
 */

#ifndef NSLOTS
#define NSLOTS 3
#endif
#ifndef NTASKS
#define NTASKS 4
#endif
#ifndef MAXDEATHS
#define MAXDEATHS 1
#endif

#define NWORKERS 2
#define CONSUMER 2          /* process index of the consumer in asleep[] */
#define FREE_Q 0
#define READY_Q 1
#define NOBODY 255

/* fq_pop's results and abort flags */
#define R_NONE 0
#define R_OK 1
#define R_CLOSED 2
#define R_ALERT 3
#define AB_CLOSE 1
#define AB_ALERT 2

chan freeq = [NSLOTS] of { byte };
chan readyq = [NSLOTS] of { byte };

/* The control block. */
byte next_task;             /* fetch_add by workers */
bit closed;                 /* 0 -> 1 by the consumer's close */
bit alert;                  /* set by the death watcher, sticky */
byte waiters[2];            /* per queue: processes inside the slow path */
byte wake_seq[2];           /* per queue: the futex word (event count) */

/* Slot headers, written by the owning worker, read by the consumer. */
byte hdr_task[NSLOTS];
bit hdr_end[NSLOTS];

/* The kernel's futex queues: asleep[p] = 1 + the queue p sleeps on. */
byte asleep[3];

/* Ghost state for the properties. */
byte owner[NSLOTS];         /* NOBODY while in a queue, else the process */
bit seen[NTASKS];
byte deaths;
byte dead_holding;          /* slots kept forever by dead workers */
bit alerted;                /* the consumer stopped on FQ_ALERT */
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

inline futex_wait(q, key, me) {
    /* FUTEX_WAIT compares and enqueues atomically: EAGAIN if it moved. */
    atomic {
        if
        :: wake_seq[q] == key -> asleep[me] = q + 1
        :: else -> skip
        fi
    };
    (asleep[me] == 0)
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

/* fq_push: the send, then (after the seq_cst fence) the waiters check. */
inline push(q, ch, s) {
    ch ! s;
    if
    :: waiters[q] > 0 -> wake_seq[q]++; futex_wake_one(q)
    :: else -> skip
    fi
}

inline try_pop(ch, s, got) {
    atomic {
        if
        :: ch ? s -> got = 1
        :: else -> got = 0
        fi
    }
}

inline abort_check(ab, res) {
    if
    :: (ab & AB_CLOSE) && closed -> res = R_CLOSED
    :: (ab & AB_ALERT) && alert -> res = R_ALERT
    :: else -> skip
    fi
}

/* A worker's death: at most MAXDEATHS in all, at any point marked. */
inline may_die(mortal) {
    if
    :: mortal && deaths < MAXDEATHS -> deaths++; goto died
    :: true -> skip
    fi
}

/* fq_pop: the spin phase is a run of try_pops and adds nothing here. */
inline pop_wait(q, ch, s, res, ab, me, mortal) {
    res = R_NONE;
    try_pop(ch, s, got);
    if
    :: got -> res = R_OK
    :: else -> abort_check(ab, res)
    fi;
    do
    :: res != R_NONE -> break
    :: else ->
        waiters[q]++;
        key = wake_seq[q];
#ifndef BROKEN_WAKE
        try_pop(ch, s, got);
#else
        got = 0;
#endif
        if
        :: got -> res = R_OK
        :: else ->
            abort_check(ab, res);
            if
            :: res == R_NONE ->
                may_die(mortal);
                futex_wait(q, key, me)
            :: else -> skip
            fi
        fi;
        waiters[q]--
    od
}

inline signal_all(q) {
    wake_seq[q]++;
    futex_wake_all(q)
}

proctype worker(byte me) {
    byte s, t, key, res;
    bit got;
    do
    :: may_die(1);
#ifdef CLAIM_FIRST
        atomic { t = next_task; next_task++ };
        may_die(1);
#endif
        pop_wait(FREE_Q, freeq, s, res, AB_CLOSE, me, 1);
        if
        :: res == R_CLOSED -> break
        :: else -> assert(res == R_OK)
        fi;
        take(s, me);
        may_die(1);
#ifndef CLAIM_FIRST
        /* fetch_add after owning the slot: every claimed task has one. */
        atomic { t = next_task; next_task++ };
        may_die(1);
#endif
        hdr_task[s] = t;
        hdr_end[s] = (t >= NTASKS);
        may_die(1);
        give(s, me);
        push(READY_Q, readyq, s);
        if
        :: t >= NTASKS -> break     /* published its end marker */
        :: else -> skip
        fi
    od;
    running--;
    goto done;
died:
    /* Whatever it held stays held: the ring cannot take it back. */
    if
    :: s < NSLOTS && owner[s] == me -> dead_holding++
    :: else -> skip
    fi;
    running--;
done:
    skip
}

proctype watcher() {
    /* The death watcher: notices a death and alerts the consumer. */
end_idle:
    (deaths > 0);
    alert = 1;
    signal_all(READY_Q)
}

proctype consumer() {
    byte s, t, key, res, expected, held, in_window, i;
    bit got;
    byte win[NTASKS];       /* 1 + slot holding task t, 0: not here */
    byte lease[NSLOTS];     /* slots the user holds, a stack */
    do
    :: expected == NTASKS -> break
    :: else ->
        /* Between two next() calls the user may give leases back. */
        do
        :: held > 0 -> held--; give(lease[held], CONSUMER);
                       push(FREE_Q, freeq, lease[held])
        :: true -> break
        od;
#ifndef NO_HOLD_CHECK
        if
        :: held + in_window == NSLOTS && win[expected] == 0 ->
            /* No slot is left to produce `expected`: report it. A
             * claimed task always holds a slot, so the window is empty. */
            assert(in_window == 0);
            assert(len(freeq) == 0 && len(readyq) == 0);
            reported = 1;
            break
        :: else -> skip
        fi;
#endif
        pop_wait(READY_Q, readyq, s, res, AB_ALERT | AB_CLOSE, CONSUMER, 0);
        if
        :: res == R_ALERT -> alerted = 1; break
        :: else -> assert(res == R_OK)
        fi;
        take(s, CONSUMER);
        t = hdr_task[s];
        if
        :: hdr_end[s] ->
            assert(t >= NTASKS);
            give(s, CONSUMER);
            push(FREE_Q, freeq, s)
        :: else ->
            /* At most NSLOTS tasks are in flight past `expected`. */
            assert(t >= expected && t < expected + NSLOTS);
            assert(win[t] == 0);
            win[t] = s + 1;
            in_window++;
            do
            :: expected < NTASKS && win[expected] != 0 ->
                s = win[expected] - 1;
                win[expected] = 0;
                in_window--;
                assert(owner[s] == CONSUMER && hdr_task[s] == expected);
                assert(!seen[expected]);
                seen[expected] = 1;
                delivered++;
                expected++;
                if
                :: held < NSLOTS -> lease[held] = s; held++
                :: true -> give(s, CONSUMER); push(FREE_Q, freeq, s)
                fi
            :: else -> break
            od
        fi
    od;

    /* fq_close: the flag first, then every event count. */
    closed = 1;
#ifndef BROKEN_CLOSE
    signal_all(FREE_Q);
    signal_all(READY_Q);
#endif
    /* Leases outlive close; the window's slots are dropped with it. */
    do
    :: held > 0 -> held--; give(lease[held], CONSUMER);
                   push(FREE_Q, freeq, lease[held])
    :: else -> break
    od;
    i = 0;
    do
    :: i < NTASKS ->
        if
        :: win[i] != 0 -> give(win[i] - 1, CONSUMER);
                          push(FREE_Q, freeq, win[i] - 1);
                          win[i] = 0
        :: else -> skip
        fi;
        i++
    :: else -> break
    od;
    running--;
    goto done;
died:
    assert(false);          /* pop_wait's death point is for workers only */
done:
    skip
}

init {
    byte s;
    atomic {
        s = 0;
        do
        :: s < NSLOTS -> owner[s] = NOBODY; freeq ! s; s++
        :: else -> break
        od;
        run worker(0);
        run worker(1);
        run consumer();
        run watcher()
    };
    (running == 0);
    /* Nobody is left asleep: close and alert woke every waiter. */
    assert(asleep[0] == 0 && asleep[1] == 0 && asleep[2] == 0);
    /* Every slot is back in a queue or with a dead worker. */
    assert(len(freeq) + len(readyq) + dead_holding == NSLOTS);
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
