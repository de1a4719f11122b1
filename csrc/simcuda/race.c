/* The race checker across streams (MEDUSA_SIM_RACECHECK=1): vector clocks, and per byte range the
 * last write and the reads since, each an operation (and graph node). An access conflicts with one
 * recorded there when either writes and the recorded one is not ordered before it: by stream
 * order, an event wait, the legacy stream's implicit ordering, a host synchronization, or a path
 * in the graph both are nodes of. As FastTrack, it finds at least one race of every racy range,
 * whatever the order the schedule ran them in. Every function runs with g_sim.lock held.
 *
 * Each host thread has a clock too: its later submissions follow the work it saw complete (its own
 * synchronizations, successful queries, waiting copies). NOTE (deliberate exemption): simcuda
 * cannot see the host's own synchronization (locks, queues, joins), so work another thread saw
 * complete is not ordered before this thread's: a thread that takes over results another thread
 * synchronized on must wait for them itself (an event, or a synchronization) to be checked clean.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "race.h"

/* ---- the history: sorted, disjoint byte ranges ---- */
typedef struct {
    uintptr_t lo, hi;
    who_t w; /* the last write (op NULL: none) */
    uint32_t nr;
    who_t *r; /* reads none of which is ordered before another */
} seg_t;

struct sim_race_history {
    seg_t *v;
    size_t n, cap;
};

static struct sim_race_history *hist(void) {
    if (!g_sim.history)
        g_sim.history = calloc(1, sizeof *g_sim.history);
    return g_sim.history;
}

static who_t hold(who_t w) {
    if (w.op)
        w.op->refs++;
    return w;
}

static void seg_clear(seg_t *s) {
    sim_op_unref(s->w.op);
    for (uint32_t i = 0; i < s->nr; i++)
        sim_op_unref(s->r[i].op);
    free(s->r);
    s->w = (who_t){NULL, 0};
    s->r = NULL;
    s->nr = 0;
}

static seg_t seg_copy(const seg_t *s, uintptr_t lo, uintptr_t hi) {
    seg_t c = {lo, hi, hold(s->w), s->nr, s->nr ? malloc(s->nr * sizeof *c.r) : NULL};
    if (s->nr && !c.r)
        c.nr = 0;
    for (uint32_t i = 0; i < c.nr; i++)
        c.r[i] = hold(s->r[i]);
    return c;
}

static size_t first_after(const struct sim_race_history *h, uintptr_t p) { /* first with hi > p */
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->v[mid].hi <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool insert(struct sim_race_history *h, size_t at, seg_t s) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 256;
        seg_t *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return false;
        h->v = v;
        h->cap = cap;
    }
    memmove(&h->v[at + 1], &h->v[at], (h->n - at) * sizeof *h->v);
    h->v[at] = s;
    h->n++;
    return true;
}

/* Segments cover [lo, hi) exactly, split at its ends and with empty ones in the gaps; returns
 * the index of the first, *end one past the last. */
static size_t cover(struct sim_race_history *h, uintptr_t lo, uintptr_t hi, size_t *end) {
    size_t i = first_after(h, lo), first = i;
    uintptr_t at = lo;
    while (at < hi) {
        if (i == h->n || h->v[i].lo >= hi) {
            i += insert(h, i, (seg_t){at, hi, {NULL, 0}, 0, NULL});
            break;
        }
        seg_t *s = &h->v[i];
        if (s->lo > at) {
            uintptr_t next = s->lo;
            if (!insert(h, i++, (seg_t){at, next, {NULL, 0}, 0, NULL}))
                break; /* out of memory: the rest goes unchecked */
            at = next;
            continue;
        }
        if (s->lo < at) { /* starts before lo: split off the part below */
            seg_t below = seg_copy(s, s->lo, at);
            h->v[i].lo = at;
            if (!insert(h, i++, below)) {
                seg_clear(&below);
                break;
            }
            continue;
        }
        if (s->hi > hi) { /* ends after hi: split off the part above */
            seg_t above = seg_copy(s, hi, s->hi);
            h->v[i].hi = hi;
            if (!insert(h, i + 1, above))
                seg_clear(&above);
        }
        at = h->v[i++].hi;
    }
    *end = i;
    return first;
}

static bool same_who(who_t a, who_t b) { return a.op == b.op && a.node == b.node; }

static bool same_state(const seg_t *a, const seg_t *b) {
    if (a->hi != b->lo || !same_who(a->w, b->w) || a->nr != b->nr)
        return false;
    for (uint32_t i = 0; i < a->nr; i++)
        if (!same_who(a->r[i], b->r[i]))
            return false;
    return true;
}

static void coalesce(struct sim_race_history *h, size_t from, size_t to) {
    size_t i = from ? from - 1 : 0;
    for (; i + 1 < h->n && i < to + 1;) {
        if (same_state(&h->v[i], &h->v[i + 1])) {
            h->v[i].hi = h->v[i + 1].hi;
            seg_clear(&h->v[i + 1]);
            memmove(&h->v[i + 1], &h->v[i + 2], (h->n - i - 2) * sizeof *h->v);
            h->n--;
            to--;
        } else {
            i++;
        }
    }
}

void sim_race_forget(uintptr_t p, size_t n) {
    struct sim_race_history *h = g_sim.history;
    if (!h || !n)
        return;
    size_t end, i = cover(h, p, p + n, &end);
    for (size_t k = i; k < end; k++)
        seg_clear(&h->v[k]);
    memmove(&h->v[i], &h->v[end], (h->n - end) * sizeof *h->v);
    h->n -= end - i;
}

/* ---- order ---- */
/* e happened before x (node: x's graph node, or -1). */
static bool before(who_t e, const sim_op *x, int32_t node) {
    if (e.op == x)
        return e.node < 0 || node < 0 || sim_exec_precedes(x->u.graph.img, (uint32_t)e.node,
                                                            (uint32_t)node);
    return e.op->ticket <= sim_clock_at(&x->clock, e.op->race);
}

static CUresult check(const seg_t *s, sim_op *x, int32_t node, int mode, uintptr_t lo,
                      uintptr_t hi) {
    who_t now = {x, node};
    uintptr_t a = s->lo > lo ? s->lo : lo, b = s->hi < hi ? s->hi : hi;
    if (s->w.op && !before(s->w, x, node))
        return sim_race_report(now, mode, s->w, SIM_WRITE, a, b);
    for (uint32_t i = 0; (mode & SIM_WRITE) && i < s->nr; i++)
        if (!before(s->r[i], x, node))
            return sim_race_report(now, mode, s->r[i], SIM_READ, a, b);
    return CUDA_SUCCESS;
}

static void record(seg_t *s, sim_op *x, int32_t node, int mode) {
    who_t now = {x, node};
    if (mode & SIM_WRITE) {
        seg_clear(s);
        s->w = hold(now);
        return;
    }
    uint32_t m = 0;
    bool present = false;
    for (uint32_t i = 0; i < s->nr; i++) {
        present |= same_who(s->r[i], now);
        if (!same_who(s->r[i], now) && before(s->r[i], x, node))
            sim_op_unref(s->r[i].op); /* ordered before this read: this one stands for it */
        else
            s->r[m++] = s->r[i];
    }
    s->nr = m;
    who_t *r = present ? s->r : realloc(s->r, (s->nr + 1) * sizeof *r);
    if (!present && r) {
        r[s->nr++] = hold(now);
        s->r = r;
    }
}

/* Accesses are clipped to the block they start in; memory outside every block (pageable host
 * memory) is the host's, not checked. */
CUresult sim_race_access(sim_op *op, int32_t node, uintptr_t p, size_t n, int mode) {
    struct sim_race_history *h = hist();
    uintptr_t lo, hi;
    if (!h || !n || g_sim.sticky || !sim_race_block_of(p, &lo, &hi))
        return g_sim.sticky;
    if (p + n > hi || p + n < p)
        n = hi - p;
    size_t end, i = cover(h, p, p + n, &end);
    for (size_t k = i; k < end; k++) {
        CUresult e = check(&h->v[k], op, node, mode, p, p + n);
        if (e)
            return e;
    }
    for (size_t k = i; k < end; k++)
        record(&h->v[k], op, node, mode);
    coalesce(h, i, end);
    return CUDA_SUCCESS;
}
