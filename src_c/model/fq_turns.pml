/*
 * fq_turns.pml: a model of turns (src_c/fq_ring.h, "Turns"; the consumer's
 * side is fastq/_core/_turns.py, the workers' _Stream._take_turn in
 * fastq/_workers/_stream_loops.py) for spin.
 *
 * What is modelled: 2 workers whose streams hold LEN0 and LEN1 items, a
 * ring of NSLOTS slots, and the consumer with its user, who keeps at most
 * HOLD batches (fastq copies batches out of the ring past `slots` of them,
 * and the ring has one slot more, so HOLD < NSLOTS) and lets any of them go
 * before any fetch. Worker w's k-th item (its end marker after the last)
 * is task k * 2 + w. The slot queues are a count of free slots and a flag
 * per published task: fq_ring.pml checks the queues themselves; this model
 * checks what turns add on top of them, the order and the grant.
 *
 * A worker: wait until granted > its task, take a free slot (waiting while
 * there is none), make the item, publish it; after its end marker, stop.
 * The consumer, at each fetch: the user lets go of some batches; the next
 * task steps over tasks no item will come for (past a worker's end marker);
 * the grant rises as far as the running workers' tasks from the next one
 * number at most NSLOTS - held, within SPAN (the reorder window's size);
 * then it waits for the next task's item. An end marker's slot goes back at
 * once; a batch is kept by the user or let go.
 *
 * Checked, over every interleaving:
 *   - no invalid end state: nobody waits forever (the consumer always gets
 *     its next task's item, every worker finishes);
 *   - each worker's items come in its order, each exactly once, in task
 *     order: round-robin, skipping workers whose stream has ended;
 *   - the user never holds every slot (so the "holds every slot" report is
 *     never what ends a correct run).
 * Not modelled: passes (a new pass's tasks lie above every earlier one and
 * its batches in flight are dropped as they arrive), turns used before the
 * ring existed, errors (an error is an item in its turn), deaths.
 *
 * Broken variants, each of which spin must refute:
 *   -DSLOT_FIRST  a worker takes a slot before its grant (holding it while
 *                 it waits): invalid end state;
 *   -DNO_BUDGET   the grant ignores the slots the user holds: invalid end
 *                 state.
 * -DREACH=n turns the n-th "this can happen" into an assertion: 1 a worker
 * waits for its grant while a slot is free and the user holds a batch
 * (the budget is what holds it back); 2 the consumer steps over a task of
 * a worker whose stream ended.
 *
 * Run (tests/test_turns_model.py does this for several sizes):
 *   spin -DNSLOTS=3 -DLEN0=2 -DLEN1=3 -DHOLD=2 -a fq_turns.pml
 *   gcc -w -O0 -DSAFETY -o pan pan.c && ./pan
 */

#ifndef NSLOTS
#define NSLOTS 2
#endif
#ifndef LEN0
#define LEN0 2
#endif
#ifndef LEN1
#define LEN1 3
#endif
#ifndef HOLD
#define HOLD 1
#endif
#ifndef REACH
#define REACH 0
#endif

#define NW 2
#define NTASKS (NW * (LEN0 + LEN1 + 2))
#define RUNNING 255 /* a worker's end while its stream runs */

/* The reorder window's size: the power of two >= NSLOTS. */
#if NSLOTS <= 2
#define SPAN 2
#elif NSLOTS <= 4
#define SPAN 4
#else
#define SPAN 8
#endif

byte granted = 0;      /* ctrl.planned: tasks below it are granted */
byte freeslots = NSLOTS;
bit pub[NTASKS];       /* the task's item is published (on READY) */
bit isend[NTASKS];     /* ... and it is an end marker */
byte lens[NW];

/* The consumer's books. */
byte endt[NW];         /* the turn of each worker's end marker */
byte held = 0;         /* slots of batches the user still holds */
byte nextt = 0;        /* the next task it hands out */
byte ended = 0;
byte got[NW];          /* each worker's items handed out */

/* Whether an item will come for task t: its worker's turn is not past the
 * worker's end marker. */
#define COMING(t) (((t) / NW) <= endt[(t) % NW])

proctype Worker(byte w) {
    byte turn = 0;
    byte t;
    do
    :: t = turn * NW + w;
#ifdef SLOT_FIRST
       atomic { freeslots > 0 -> freeslots-- };
       granted > t;
#else
#if REACH == 1
       assert(!(granted <= t && freeslots > 0 && held > 0));
#endif
       granted > t;
       atomic { freeslots > 0 -> freeslots-- };
#endif
       /* make the item, then publish it (the READY push) */
       atomic { isend[t] = (turn == lens[w]); pub[t] = 1 };
       if
       :: turn == lens[w] -> break
       :: else -> turn++
       fi
    od
}

proctype Consumer() {
    byte limit, live, w, k;
    do
    :: ended == NW -> break
    :: else ->
       /* the user lets go of any of the batches it holds */
       do
       :: atomic { held > 0 -> held--; freeslots++ }
       :: break
       od;
       /* step over tasks no item will come for */
       do
       :: COMING(nextt) -> break
       :: else ->
#if REACH == 2
          assert(REACH != 2);
#endif
          nextt++
       od;
       /* grant */
       limit = nextt;
#ifdef NO_BUDGET
       limit = nextt + NSLOTS;
#else
       live = 0;
       do
       :: live < NSLOTS - held && limit - nextt < SPAN ->
          if
          :: COMING(limit) -> live++
          :: else -> skip
          fi;
          limit++
       :: else -> break
       od;
#endif
       if
       :: limit > granted -> granted = limit
       :: else -> skip
       fi;
       assert(held < NSLOTS);
       /* wait for the next task's item, and take it */
       pub[nextt] == 1;
       atomic {
           pub[nextt] = 0;
           w = nextt % NW;
           k = nextt / NW
       };
       if
       :: isend[nextt] ->
          assert(k == lens[w] && got[w] == k);
          endt[w] = k;
          ended++;
          freeslots++
       :: else ->
          assert(k == got[w] && k < lens[w]);
          got[w]++;
          if
          :: held < HOLD -> held++
          :: freeslots++
          fi
       fi;
       nextt++
    od;
    assert(got[0] == LEN0 && got[1] == LEN1)
}

init {
    atomic {
        lens[0] = LEN0;
        lens[1] = LEN1;
        endt[0] = RUNNING;
        endt[1] = RUNNING;
        run Consumer();
        run Worker(0);
        run Worker(1)
    }
}
