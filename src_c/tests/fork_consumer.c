/* fork_consumer: the consumer a scenario's parent or consumer child
 * plays (_consumer.pxi's window, releases and deferral), and the
 * accounting of every slot and task once every child is gone. */
#define _GNU_SOURCE
#include "fork_scenario.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void fc_init(fconsumer *c, scenario *sc, uint8_t *books,
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

void fc_flush(fconsumer *c) {
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
int fc_wait(fconsumer *c, int64_t slice_ns, unsigned abort) {
    if (c->ndeferred) fc_flush(c);
    fc_audit(c);
    uint32_t s;
    int rc = fq_pop(c->r, FQ_READY, &s, FQ_OWNER(FQ_OWNER_CONSUMER, 0),
                    c->ndeferred ? DEFERRED_RETRY_NS : slice_ns, abort);
    if (rc == FQ_OK) fc_file(c, s);
    return rc;
}


/* The consumer child: runs until its fault kills it. */
_Noreturn void consumer_child(scenario *sc) {
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

/* -------------------------------------------------------------- accounting */

/* After every child is gone: each slot is in exactly one place (a queue,
 * the parent consumer's books, a dead consumer's books, a live worker that
 * ended holding it, or the dead process's `dead` slot) with the census
 * that place implies; and each claimed task is in exactly one (delivered,
 * in a window, in a published or held slot; the dead slot's task counts
 * when `dead_counts`), except that `lost` tasks (a death inside a claim)
 * are nowhere. Returns the lowest lost task, or FQ_NO_TASK. */
uint64_t account(scenario *sc, const fconsumer *cons,
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
