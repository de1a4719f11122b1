/* The race checker's vector clocks: per stream, carried by operations and events, and per host
 * thread (see race.c). Every function runs with g_sim.lock held, or on the calling thread's own
 * clock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "race.h"

/* ---- vector clocks ---- */
static sim_vc *vc_grow(sim_vc *vc, uint32_t n) {
    if (vc && vc->n >= n)
        return vc;
    uint32_t cap = n < 8 ? 8 : n + n / 2;
    sim_vc *v = realloc(vc, sizeof *v + cap * sizeof v->t[0]);
    if (!v)
        return vc;
    uint32_t old = vc ? v->n : 0;
    memset(v->t + old, 0, (cap - old) * sizeof v->t[0]);
    if (!vc)
        v->refs = 1;
    v->n = cap;
    return v;
}

uint64_t sim_vc_at(const sim_vc *vc, uint32_t i) { return vc && i < vc->n ? vc->t[i] : 0; }

uint64_t sim_clock_at(const sim_clock *c, uint32_t i) {
    return i == c->own ? c->tick : sim_vc_at(c->vc, i);
}

void sim_vc_unref(sim_vc *vc) {
    if (vc && --vc->refs == 0)
        free(vc);
}

void sim_race_stream(sim_stream *st) { st->race = g_sim.next_race++; }

static bool raise_to(sim_vc **vc, uint32_t i, uint64_t t) {
    if (sim_vc_at(*vc, i) >= t)
        return false;
    *vc = vc_grow(*vc, i + 1);
    if (*vc && i < (*vc)->n)
        (*vc)->t[i] = t;
    return true;
}

static void changed(sim_stream *st) {
    sim_vc_unref(st->snap);
    st->snap = NULL;
}

void sim_race_join_stream(sim_stream *st, const sim_vc *vc) {
    bool more = false;
    for (uint32_t i = 0; vc && i < vc->n; i++)
        more |= raise_to(&st->vc, i, vc->t[i]);
    if (more)
        changed(st);
}

void sim_race_join_clock(sim_stream *st, const sim_clock *c) {
    sim_race_join_stream(st, c->vc);
    if (c->tick && raise_to(&st->vc, c->own, c->tick))
        changed(st);
}

/* ---- the host threads' clocks ---- */
static pthread_key_t g_host_key;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;
static __thread sim_vc *t_host; /* what this thread has seen complete */

static void host_gone(void *vc) { free(vc); } /* held by its thread only */
static void host_key(void) { pthread_key_create(&g_host_key, host_gone); }

static sim_vc **host(void) {
    if (!t_host) {
        pthread_once(&g_host_once, host_key);
        t_host = vc_grow(NULL, 1);
        pthread_setspecific(g_host_key, t_host);
    }
    return &t_host;
}

static void host_raise(uint32_t i, uint64_t t) {
    sim_vc **h = host();
    raise_to(h, i, t);
    pthread_setspecific(g_host_key, *h); /* raise_to may have moved it */
}

void sim_race_host_into(sim_stream *st) { sim_race_join_stream(st, *host()); }

/* op's clock: its stream's (shared with the stream's other operations until that changes). */
void sim_race_stamp(sim_stream *st, sim_op *op) {
    raise_to(&st->vc, st->race, op->ticket);
    if (!st->snap && st->vc) {
        st->snap = malloc(sizeof *st->snap + st->vc->n * sizeof st->vc->t[0]);
        if (st->snap) {
            memcpy(st->snap, st->vc, sizeof *st->snap + st->vc->n * sizeof st->vc->t[0]);
            st->snap->refs = 1;
        }
    }
    if (st->snap)
        st->snap->refs++;
    op->clock = (sim_clock){st->snap, st->race, op->ticket};
}

void sim_race_host_join(const sim_clock *c) {
    for (uint32_t i = 0; c->vc && i < c->vc->n; i++)
        host_raise(i, c->vc->t[i]);
    host_raise(c->own, c->tick);
}

void sim_race_host_join_vc(const sim_vc *vc) {
    for (uint32_t i = 0; vc && i < vc->n; i++)
        host_raise(i, vc->t[i]);
}
