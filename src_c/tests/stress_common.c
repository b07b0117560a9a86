/* stress_common: what every mode of stress_ring shares (stress_ring.h). */
#define _GNU_SOURCE
#include "stress_ring.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- reporting */

_Atomic unsigned violations;

void violation(const char *fmt, ...) {
    /* Printing only the first few keeps a cascade readable. */
    if (atomic_fetch_add(&violations, 1) >= 20) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("VIOLATION: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

const char *status_name(int rc) {
    switch (rc) {
    case FQ_OK: return "FQ_OK";
    case FQ_EMPTY: return "FQ_EMPTY";
    case FQ_TIMEOUT: return "FQ_TIMEOUT";
    case FQ_CLOSED: return "FQ_CLOSED";
    case FQ_ALERT: return "FQ_ALERT";
    case FQ_EINTR: return "FQ_EINTR";
    case FQ_EBUSY: return "FQ_EBUSY";
    case FQ_EINVAL: return "FQ_EINVAL";
    case FQ_EBADMAGIC: return "FQ_EBADMAGIC";
    case FQ_EVERSION: return "FQ_EVERSION";
    case FQ_ESMALL: return "FQ_ESMALL";
    case FQ_ESYS: return "FQ_ESYS";
    default: return "unknown status";
    }
}

const char *owner_name(uint32_t owner, char *buf) {
    static const char *const kinds[] = {"FREE", "WORKER", "READY", "CONSUMER"};
    uint32_t kind = FQ_OWNER_KIND(owner);
    if (kind > FQ_OWNER_CONSUMER)
        snprintf(buf, 32, "?%08x", owner);
    else if (kind == FQ_OWNER_WORKER || kind == FQ_OWNER_READY)
        snprintf(buf, 32, "%s(%u)", kinds[kind], FQ_OWNER_WHO(owner));
    else
        snprintf(buf, 32, "%s", kinds[kind]);
    return buf;
}

void expect_census(const fq_ring *r, uint32_t slot, uint32_t owner,
                          uint64_t task, const char *when) {
    uint32_t o = fq_slot_owner(r, slot);
    uint64_t t = fq_slot_task(r, slot);
    if (o != owner || (task != ANY_TASK && t != task)) {
        char a[32], b[32];
        violation("%s: slot %u census says %s task %" PRId64 ", expected %s"
                  " task %" PRId64,
                  when, slot, owner_name(o, a), (int64_t)t,
                  owner_name(owner, b), (int64_t)task);
    }
}

/* ------------------------------------------------- determinism and delays */

uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_next(uint64_t *s) { return mix64(*s += 0x9e3779b97f4a7c15ull); }

/* Small random delays move the threads' relative timing around so that
 * many interleavings of pops and pushes occur, including a producer
 * stalled while holding its slot. */
void jitter(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    switch (r & 15) {
    case 0: {
        volatile unsigned sink = 0;
        for (unsigned i = (unsigned)((r >> 8) % 2000); i > 0; i--) sink += i;
        break;
    }
    case 1: sched_yield(); break;
    case 2:
        if (((r >> 8) & 63) == 0) {
            struct timespec ts = {0, (long)(20000 + (r >> 16) % 200000)};
            nanosleep(&ts, NULL);
        }
        break;
    default: break;
    }
}

void sleep_ns(int64_t ns) {
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------- the slot content */

/* Everything a producer writes is a function of the task number, so the
 * consumer can recompute it bit for bit. */
static uint64_t pattern_words(uint64_t task, uint64_t slot_bytes) {
    return 1 + mix64(task ^ 0x5eedull) % (slot_bytes / 8);
}

static uint64_t pattern_word(uint64_t task, uint64_t i) {
    return mix64(task * 0x100000001b3ull + i);
}

static uint32_t header_tag(uint64_t task) {
    return (uint32_t)(task * 2654435761u) ^ 0xa5a5a5a5u;
}

/* The task itself is in the header already: fq_claim_task recorded it. */
void fill_slot(fq_ring *r, uint32_t slot, uint64_t task, int worker,
               uint32_t round) {
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    uint64_t *w = (uint64_t *)fq_slot_data(r, slot);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        w[i] = pattern_word(task, i);
        sum = mix64(sum ^ w[i]);
    }
    fq_slot_header *h = &r->headers[slot];
    h->rows = n;
    h->payload_bytes = sum;
    h->pass = round;
    h->worker = worker;
    h->kind = FQ_SLOT_BATCH;
    h->sample = header_tag(task);
}

/* Returns 1 when slot's header and data are exactly what task `task`
 * produces; otherwise reports what differs. */
int check_slot(fq_ring *r, uint32_t slot, uint64_t task, uint32_t round,
               const char *when) {
    const fq_slot_header *h = &r->headers[slot];
    uint64_t n = pattern_words(task, r->ctrl->slot_bytes);
    uint64_t ht = fq_slot_task(r, slot);
    if (ht != task || h->kind != FQ_SLOT_BATCH || h->rows != n ||
        h->pass != round || h->sample != header_tag(task)) {
        violation("%s: slot %u header task=%" PRIu64 " kind=%u rows=%" PRIu64
                  " pass=%u tag=%08x, expected task %" PRIu64 " rows %" PRIu64,
                  when, slot, ht, h->kind, h->rows, h->pass, h->sample, task,
                  n);
        return 0;
    }
    const uint64_t *w = (const uint64_t *)fq_slot_data(r, slot);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (w[i] != pattern_word(task, i)) {
            violation("%s: slot %u task %" PRIu64 " word %" PRIu64
                      " is %016" PRIx64 ", expected %016" PRIx64,
                      when, slot, task, i, w[i], pattern_word(task, i));
            return 0;
        }
        sum = mix64(sum ^ w[i]);
    }
    if (sum != h->payload_bytes) {
        violation("%s: slot %u task %" PRIu64 " checksum mismatch", when, slot,
                  task);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ ring setup */

int region_open(region *g, uint32_t nslots, uint32_t nworkers,
                uint64_t slot_bytes, uint64_t spin_ns) {
    fq_geometry geo = {nslots, nworkers, slot_bytes,
                       (uint64_t)sysconf(_SC_PAGESIZE), spin_ns};
    uint64_t len = fq_layout(&geo, NULL);
    if (len == 0) return FQ_EINVAL;
    /* MAP_SHARED anonymous memory is zeroed, like the real memfd, and
     * children forked later share it. */
    void *base = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return FQ_ESYS;
    g->base = base;
    g->len = (size_t)len;
    int rc = fq_init(base, len, &geo, &g->ring);
    if (rc != FQ_OK) munmap(base, (size_t)len);
    return rc;
}

void region_close(region *g) { munmap(g->base, g->len); }

/* Joins t, or gives up at the deadline: a hung ring must not hang CI. */
void join_or_die(pthread_t t, uint64_t deadline, const char *what) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = fq_now_ns();
    int64_t left = deadline > now ? (int64_t)(deadline - now) : 0;
    ts.tv_sec += (time_t)(left / SEC);
    ts.tv_nsec += (long)(left % SEC);
    if (ts.tv_nsec >= SEC) {
        ts.tv_sec++;
        ts.tv_nsec -= SEC;
    }
    if (pthread_timedjoin_np(t, NULL, &ts) != 0) {
        fprintf(stderr, "HANG: %s did not finish before the watchdog\n", what);
        fflush(stderr);
        _exit(3);
    }
}
