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
 *     each exactly once, each from a slot whose header names it;
 *   - "the consumer holds every slot" happens only with an empty window
 *     (a claimed task always holds a slot) and is reported, not waited on;
 *   - no deadlock and no invalid end state: nobody is left asleep, the
 *     consumer always finishes (all tasks, alert or report), close wakes
 *     every waiter, a death always reaches the consumer;
 *   - at the end every slot is in a queue, with a dead worker, or leased.
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
 * Run (tests/test_ring_model.py does this for several sizes):
 *   spin -DNSLOTS=3 -DNTASKS=3 -DMAXDEATHS=0 -a fq_ring.pml
 *   gcc -w -O2 -DSAFETY -DMEMLIM=4096 -o pan pan.c
 *   ./pan -m5000 -w25                  # "errors: 0" for the correct model
 *   spin -t -p fq_ring.pml             # replays a counterexample trail
 * with the same -D flags on every spin call (add -DBROKEN_WAKE etc. for a
 * broken variant). Sizes (NSLOTS/NTASKS/MAXDEATHS, default 3/3/0) on two
 * cores: 3/3/0 about 4 M states, 8 s; 2/2/1 about 3 M, 10 s; 3/4/0 about
 * 12 M, 40 s; 2/3/1 about 9 M, 40 s; 3/4/1 runs out of minutes. Sleeps and the fast path are merged into atomic steps only where
 * the next round re-checks what the split would show (comments say which).
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
/* The futex word wake_seq of each queue, kept as what matters about it:
 * whether it moved since each waiter read its key. keyq[p] = 1 + the queue
 * whose key process p holds, moved[p]: bumped since. Exact, unlike a
 * counter wrapping in a byte, and it keeps the state space finite. */
byte keyq[3];
bit moved[3];

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
byte kept;                  /* leases the user still holds at the end */
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

inline futex_wait(q, me) {
    /* FUTEX_WAIT compares and enqueues atomically: EAGAIN if it moved. */
    atomic {
        if
        :: !moved[me] -> asleep[me] = q + 1
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

/* fq_push's second half, after the send and the seq_cst fence. */
inline wake_if_waiters(q) {
    if
    :: waiters[q] > 0 -> bump(q); futex_wake_one(q)
    :: else -> skip
    fi
}

inline push(q, ch, s) {
    ch ! s;
    wake_if_waiters(q)
}

/* The owner ghost is set in the pop's own step: nothing observable can
 * happen between the two. */
inline try_pop(ch, s, got, me) {
    atomic {
        if
        :: nempty(ch) -> ch ? s; take(s, me); got = 1
        :: empty(ch) -> got = 0
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
    /* The first try and flag check as one step: the slow path below
     * repeats both, so splitting them adds interleavings, not outcomes. */
    atomic {
        res = R_NONE;
        try_pop(ch, s, got, me);
        if
        :: got -> res = R_OK
        :: else -> abort_check(ab, res)
        fi
    };
    do
    :: res != R_NONE -> break
    :: else ->
        /* waiters += 1 and key = wake_seq as one step: a bump between
         * them leaves the same key and the same retry, so the split would
         * add states, not outcomes. */
        atomic { waiters[q]++; read_key(q, me) };
        /* The retry and the flag check as one step, for the same reason:
         * whatever lands between them is seen by the next round, which a
         * bump after it guarantees. The key stays read before both. */
        atomic {
#ifndef BROKEN_WAKE
            try_pop(ch, s, got, me);
#else
            got = 0;
#endif
            if
            :: got -> res = R_OK
            :: else -> abort_check(ab, res)
            fi
        };
        if
        :: got -> skip
        :: else ->
            if
            :: res == R_NONE ->
                may_die(mortal);
                futex_wait(q, me)
            :: else -> skip
            fi
        fi;
        atomic { waiters[q]--; keyq[me] = 0; moved[me] = 0 }
    od;
    got = 0
}

inline signal_all(q) {
    bump(q);
    futex_wake_all(q)
}

proctype worker(byte me) {
    byte s, t, res;
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
        may_die(1);
#ifndef CLAIM_FIRST
        /* fetch_add after owning the slot: every claimed task has one. */
        atomic { t = next_task; next_task++ };
        may_die(1);
#endif
        /* The header's plain stores, published by the send (the model
         * is sequentially consistent; the release/acquire pair that makes
         * the real code so is TSan's to check). */
        atomic {
            hdr_task[s] = t;
            hdr_end[s] = (t >= NTASKS);
            give(s, me);
            readyq ! s
        };
        wake_if_waiters(READY_Q);
        if
        :: t >= NTASKS -> break     /* published its end marker */
        :: else -> t = 0; s = 0     /* dead values: keep states few */
        fi
    od;
    running--;
    goto done;
died:
    /* Whatever it held stays held: the ring cannot take it back. */
    atomic {
        s = 0;
        do
        :: s < NSLOTS ->
            if :: owner[s] == me -> dead_holding++ :: else fi;
            s++
        :: else -> break
        od;
        running--
    };
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

/* The consumer gives slot s back: the send, then the wake (two steps, as
 * in fq_push). Local clean-up rides in the send's atomic step. */
inline release(s) {
    /* Clearing the header is ghost work: stale headers would only
     * multiply states; the next owner rewrites it anyway. */
    atomic { give(s, CONSUMER); hdr_task[s] = 0; hdr_end[s] = 0;
             freeq ! s; s = 0 };
    wake_if_waiters(FREE_Q)
}

proctype consumer() {
    byte s, t, res, expected, held, in_window, i;
    bit got;
    byte win[NTASKS];       /* 1 + slot holding task t, 0: not here */
    byte lease[NSLOTS];     /* slots the user holds, a stack */
    do
    :: expected == NTASKS -> break
    :: else ->
        /* Between two next() calls the user may give leases back. */
        do
        :: held > 0 -> atomic { held--; s = lease[held]; lease[held] = 0 };
                       release(s)
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
        :: res == R_ALERT -> alerted = 1; res = 0; break
        :: else -> assert(res == R_OK); res = 0
        fi;
        atomic {
            t = hdr_task[s];
            if
            :: hdr_end[s] -> assert(t >= NTASKS); t = 0
            :: else ->
                /* At most NSLOTS tasks are in flight past `expected`. */
                assert(t >= expected && t < expected + NSLOTS);
                assert(win[t] == 0);
                win[t] = s + 1;
                in_window++;
                s = NOBODY;
                t = 0
            fi
        };
        if
        :: s != NOBODY -> release(s)     /* an end marker: recycle it */
        :: else -> s = 0
        fi;
        /* In-order delivery out of the window. */
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
                expected++
            };
            if
            :: held < NSLOTS -> atomic { lease[held] = s; held++; s = 0 }
            :: true -> release(s)
            fi
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
    :: held > 0 -> atomic { held--; s = lease[held]; lease[held] = 0 };
                   release(s)
    :: held > 0 -> atomic { kept = held; held = 0 }; break
    :: else -> break
    od;
    i = 0;
    do
    :: i < NTASKS ->
        if
        :: win[i] != 0 -> atomic { s = win[i] - 1; win[i] = 0 }; release(s)
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
    /* Every slot is in a queue, with a dead worker, or still leased. */
    assert(len(freeq) + len(readyq) + dead_holding + kept == NSLOTS);
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
