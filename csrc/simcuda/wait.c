/* When queued work runs, and on which thread. Nothing runs at submission: a synchronizing call
 * runs, on the calling thread, exactly the operations what it waits for needs (its stream's up to
 * its target and, through event waits and the legacy stream's implicit ordering, other streams'),
 * picking among the ready ones of different streams with the schedule's seeded RNG. Work nobody
 * waits for runs on the device thread once it has been queued SIM_IDLE_MS, as a GPU never leaves
 * queued work idle. Operations of different streams may run at once on different threads; one
 * stream's run one at a time, in order. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define SIM_IDLE_MS 50.0

/* ---- what a wait needs: per stream, the last ticket that must complete ---- */
typedef struct {
    sim_stream *s;
    uint64_t upto;
} need_t;

typedef struct {
    need_t *v;
    size_t n, cap;
    sim_op **cand; /* scratch for pick, n long */
} cone_t;

static bool need(cone_t *c, sim_stream *s, uint64_t ticket) {
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].s == s) {
            bool more = ticket > c->v[i].upto;
            if (more)
                c->v[i].upto = ticket;
            return more;
        }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        need_t *v = realloc(c->v, cap * sizeof *v);
        if (!v)
            return false;
        c->v = v;
        c->cap = cap;
    }
    s->pins++;
    c->v[c->n++] = (need_t){s, ticket};
    return true;
}

static void cone_of(cone_t *c, sim_op *const *t, size_t nt) {
    for (size_t i = 0; i < nt; i++)
        if (!t[i]->done)
            need(c, t[i]->stream, t[i]->ticket);
    for (bool grew = true; grew;) {
        grew = false;
        for (size_t i = 0; i < c->n; i++)
            for (sim_op *op = c->v[i].s->head; op && op->ticket <= c->v[i].upto; op = op->next)
                for (uint32_t w = 0; w < op->num_waits; w++)
                    if (!op->waits[w]->done)
                        grew |= need(c, op->waits[w]->stream, op->waits[w]->ticket);
    }
}

static void cone_free(cone_t *c) {
    for (size_t i = 0; i < c->n; i++) {
        c->v[i].s->pins--;
        sim_stream_maybe_free(c->v[i].s);
    }
    free(c->v);
    free(c->cand);
}

/* A ready operation the cone needs, chosen by the schedule's RNG among those of its streams. */
static sim_op *pick(const cone_t *c) {
    size_t k = 0;
    for (size_t i = 0; i < c->n; i++) {
        sim_op *op = c->v[i].s->head;
        if (op && !op->running && op->ticket <= c->v[i].upto && sim_op_ready(op))
            c->cand[k++] = op;
    }
    return k ? c->cand[k == 1 ? 0 : sim_rand() % k] : NULL;
}

static bool all_done(sim_op *const *t, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!t[i]->done)
            return false;
    return true;
}

static void drive(sim_op *const *t, size_t nt, bool one_step) {
    cone_t c = {0};
    cone_of(&c, t, nt);
    c.cand = malloc((c.n + 1) * sizeof *c.cand);
    while (c.cand && !all_done(t, nt)) {
        sim_op *op = pick(&c);
        if (op) {
            sim_op_execute(op);
            if (one_step)
                break;
        } else if (one_step) {
            break;
        } else {
            pthread_cond_wait(&g_sim.progress, &g_sim.lock);
        }
    }
    cone_free(&c);
}

static CUresult wait_held(sim_op *const *t, size_t n, bool one_step) {
    for (size_t i = 0; i < n; i++)
        t[i]->refs++;
    drive(t, n, one_step);
    bool done = all_done(t, n);
    for (size_t i = 0; i < n; i++) {
        if (done && g_sim.cfg.racecheck)
            sim_race_host_join(&t[i]->clock);
        sim_op_unref(t[i]);
    }
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult sim_wait_ops(sim_op *const *targets, size_t n) {
    wait_held(targets, n, false);
    return g_sim.sticky;
}

bool sim_step_ops(sim_op *const *targets, size_t n) {
    return wait_held(targets, n, true) == CUDA_SUCCESS;
}

/* The pending tails of `only` (NULL: every stream; the legacy stream: blocking ones too). */
static size_t tails(sim_stream *only, sim_op **out, size_t cap) {
    size_t n = 0;
    for (sim_stream *s = g_sim.streams; s && n < cap; s = s->next_live)
        if (s->tail && (!only || s == only || (only == &g_sim.legacy && sim_stream_blocking(s))))
            out[n++] = s->tail;
    return n;
}

/* A stream with nothing pending: the host has seen all of its work complete. */
static void join_idle(sim_stream *only) {
    for (sim_stream *s = g_sim.streams; s && g_sim.cfg.racecheck; s = s->next_live)
        if (!s->tail && (!only || s == only || (only == &g_sim.legacy && sim_stream_blocking(s))))
            sim_race_host_join_vc(s->vc);
}

static CUresult wait_tails(sim_stream *only, bool one_step) {
    size_t cap = 1;
    for (sim_stream *s = g_sim.streams; s; s = s->next_live)
        cap++;
    sim_op **t = malloc(cap * sizeof *t);
    if (!t)
        return CUDA_ERROR_OUT_OF_MEMORY;
    join_idle(only);
    size_t n = tails(only, t, cap);
    CUresult e = wait_held(t, n, one_step);
    free(t);
    return g_sim.sticky ? g_sim.sticky : e;
}

CUresult sim_wait_stream(sim_stream *st) { return wait_tails(st, false); }
CUresult sim_query_stream(sim_stream *st) { return wait_tails(st, true); }
CUresult sim_wait_all(void) { return wait_tails(NULL, false); }

/* ---- the context's sticky error ---- */
static CUresult vsticky(CUresult e, const char *fmt, va_list ap) {
    char msg[sizeof g_sim.sticky_message];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (!g_sim.sticky) {
        snprintf(g_sim.sticky_message, sizeof g_sim.sticky_message, "%s", msg);
        __atomic_store_n(&g_sim.sticky, e, __ATOMIC_RELEASE);
        if (!getenv("MEDUSA_SIM_VERBOSE")) /* sim_fail prints it then */
            fprintf(stderr, "simcuda: %s\n", msg);
    }
    return sim_fail(e, "%s", msg);
}

CUresult sim_sticky_locked(CUresult e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsticky(e, fmt, ap);
    va_end(ap);
    return e;
}

CUresult sim_sticky(CUresult e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    sim_lock();
    vsticky(e, fmt, ap);
    sim_unlock();
    va_end(ap);
    return e;
}

/* ---- the device thread: work nobody waits for still runs ---- */
static sim_op *oldest_ready(double before) {
    sim_op *best = NULL;
    for (sim_stream *s = g_sim.streams; s; s = s->next_live) {
        sim_op *op = s->head;
        if (op && !op->running && op->submitted_ms <= before && sim_op_ready(op) &&
            (!best || op->submitted_ms < best->submitted_ms))
            best = op;
    }
    return best;
}

static void *device_main(void *arg) {
    (void)arg;
    sim_lock();
    for (;;) {
        double now = sim_coarse_ms();
        sim_op *op = oldest_ready(now - SIM_IDLE_MS);
        if (op) {
            sim_op_execute(op);
            continue;
        }
        if (!g_sim.pending) {
            pthread_cond_wait(&g_sim.work, &g_sim.lock);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long ns = ts.tv_nsec + (long)(SIM_IDLE_MS * 1e6 / 4);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&g_sim.work, &g_sim.lock, &ts);
    }
    return NULL;
}

void sim_device_thread_start(void) {
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    g_sim.device_thread = pthread_create(&t, &a, device_main, NULL) == 0;
    pthread_attr_destroy(&a);
}
