/* Streams and stream capture. Work submitted outside capture is queued (queue.c runs it later);
 * capture's rules follow the CUDA programming guide. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static __thread sim_stream *t_ptds;
static __thread CUstreamCaptureMode t_interaction = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* ---- dependency sets ---- */
void sim_deps_add(sim_deps *d, sim_dep dep) {
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].node == dep.node)
            return;
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        d->v = realloc(d->v, d->cap * sizeof *d->v);
    }
    d->v[d->n++] = dep;
}

void sim_deps_set(sim_deps *d, const sim_dep *src, size_t n) {
    d->n = 0;
    for (size_t i = 0; i < n; i++)
        sim_deps_add(d, src[i]);
}

void sim_deps_free(sim_deps *d) {
    free(d->v);
    *d = (sim_deps){0};
}

/* ---- stream handles ---- */
sim_stream *sim_stream_resolve(CUstream s, bool ptsz, CUresult *err) {
    if (s == CU_STREAM_LEGACY || (s == NULL && !ptsz))
        return &g_sim.legacy;
    if (s == NULL || s == CU_STREAM_PER_THREAD) {
        if (!t_ptds && (t_ptds = sim_stream_new(0, 0)))
            t_ptds->per_thread = true;
        if (!t_ptds)
            *err = CUDA_ERROR_OUT_OF_MEMORY;
        return t_ptds;
    }
    if (sim_handle_is(s, H_STREAM))
        return (sim_stream *)s;
    *err = CUDA_ERROR_INVALID_HANDLE;
    return NULL;
}

static bool is_blocking(const sim_stream *s) { return !(s->flags & CU_STREAM_NON_BLOCKING); }

/* ---- capture bookkeeping ---- */
static void capture_detach_all(sim_capture *c) {
    for (int i = 0; i < c->num_streams; i++) {
        c->streams[i]->cap = NULL;
        c->streams[i]->deps.n = 0;
        if (c->streams[i]->destroyed)
            sim_stream_release(c->streams[i]);
    }
    for (int i = 0; i < g_sim.num_captures; i++)
        if (g_sim.caps[i] == c) {
            g_sim.caps[i] = g_sim.caps[--g_sim.num_captures];
            break;
        }
}

void sim_capture_invalidate_all(void) {
    for (int i = 0; i < g_sim.num_captures; i++)
        g_sim.caps[i]->invalidated = true;
}

static bool own_thread(const sim_capture *c) { return pthread_equal(c->thread, pthread_self()); }

/* A "potentially unsafe" call (cudaMalloc, synchronous copies, ...) under the capture rules. */
CUresult sim_capture_check_unsafe(void) {
    if (t_interaction == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    bool prohibited = false;
    for (int i = 0; i < g_sim.num_captures; i++) {
        sim_capture *c = g_sim.caps[i];
        bool mine = own_thread(c) && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        bool global = t_interaction == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                      c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (mine || global) {
            c->invalidated = true;
            prohibited = true;
        }
    }
    return prohibited ? sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                 "operation not permitted while a stream is capturing")
                      : CUDA_SUCCESS;
}

/* Work on the legacy stream waits for every blocking stream: fatal to their captures. */
CUresult sim_legacy_implicit(void) {
    CUresult r = CUDA_SUCCESS;
    for (int i = 0; i < g_sim.num_captures; i++) {
        sim_capture *c = g_sim.caps[i];
        for (int j = 0; j < c->num_streams; j++)
            if (is_blocking(c->streams[j])) {
                c->invalidated = true;
                r = sim_fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                             "legacy-stream work would wait on a capturing stream");
                break;
            }
    }
    return r;
}

CUresult sim_sync_guard_locked(void) {
    CUresult r = sim_capture_check_unsafe();
    return r ? r : sim_legacy_implicit();
}

CUresult sim_sync_guard(void) {
    sim_lock();
    CUresult r = sim_sync_guard_locked();
    sim_unlock();
    return r;
}

/* ---- stream objects ---- */
SIM_API CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *s = sim_stream_new(flags, priority);
    if (s)
        sim_handle_add(s, H_STREAM);
    sim_unlock();
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = (CUstream)s;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
    return cuStreamCreateWithPriority(ph, flags, 0);
}

SIM_API CUresult cuStreamDestroy(CUstream h) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    if (!sim_handle_is(h, H_STREAM)) {
        sim_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    sim_stream *s = (sim_stream *)h;
    if (s->cap) /* the capture can no longer be ended where it began */
        s->cap->invalidated = true;
    sim_handle_del(s);
    sim_stream_release(s); /* as the driver: its pending work still runs, then it is freed */
    sim_unlock();
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamGetFlags(CUstream h, unsigned int *flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, false, &e);
    if (s && flags)
        *flags = s->flags;
    sim_unlock();
    return s ? (flags ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE) : e;
}

/* query: one step of the stream's work, then CUDA_ERROR_NOT_READY if some is left. */
static CUresult stream_sync(CUstream h, bool ptsz, bool query) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, ptsz, &e);
    if (s && s->cap) {
        s->cap->invalidated = true;
        e = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "synchronizing a capturing stream invalidates its capture");
    } else if (s == &g_sim.legacy) {
        e = sim_legacy_implicit();
    }
    if (s && !e)
        e = query ? sim_query_stream(s) : sim_wait_stream(s);
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamSynchronize(CUstream h) { return stream_sync(h, false, false); }
SIM_API CUresult cuStreamSynchronize_ptsz(CUstream h) { return stream_sync(h, true, false); }
SIM_API CUresult cuStreamQuery(CUstream h) { return stream_sync(h, false, true); }
SIM_API CUresult cuStreamQuery_ptsz(CUstream h) { return stream_sync(h, true, true); }

/* ---- capture ---- */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, ptsz, &e);
    if (s == &g_sim.legacy)
        e = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "the legacy stream cannot be captured");
    else if (s && s->cap)
        e = CUDA_ERROR_ILLEGAL_STATE;
    else if (s && g_sim.num_captures == SIM_MAX_CAPTURES)
        e = CUDA_ERROR_OUT_OF_MEMORY;
    if (s && !e) {
        sim_capture *c = calloc(1, sizeof *c);
        c->graph = calloc(1, sizeof *c->graph);
        sim_handle_add(c->graph, H_GRAPH);
        c->mode = mode;
        c->id = ++g_sim.next_capture_id;
        c->thread = pthread_self();
        c->streams[c->num_streams++] = s;
        s->cap = c;
        s->deps.n = 0;
        g_sim.caps[g_sim.num_captures++] = c;
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, false); }
SIM_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, true); }
#undef cuStreamBeginCapture /* the CUDA 10.0 form, without a mode */
SIM_API CUresult cuStreamBeginCapture(CUstream h) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, false); }
SIM_API CUresult cuStreamBeginCapture_ptsz(CUstream h) { return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, true); }
/* What cuGetProcAddress hands out for the v2 forms (procs.def I): internal entries, neither the
 * exported symbols nor calls through them, as a driver may hand out: an interposer that hooks the
 * exported names sees no call made through these. */
CUresult sim_internal_cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, false); }
CUresult sim_internal_cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode m) { return begin_capture(h, m, true); }

static void mark_ancestors(sim_node *n, uint64_t mark) {
    if (n->mark == mark)
        return;
    n->mark = mark;
    for (size_t i = 0; i < n->deps.n; i++)
        mark_ancestors(n->deps.v[i].node, mark);
}

/* Every stream that joined must have been joined back into the origin stream. */
static bool capture_joined(sim_capture *c) {
    uint64_t mark = ++g_sim.next_mark;
    sim_stream *origin = c->streams[0];
    for (size_t i = 0; i < origin->deps.n; i++)
        mark_ancestors(origin->deps.v[i].node, mark);
    for (int j = 1; j < c->num_streams; j++)
        for (size_t i = 0; i < c->streams[j]->deps.n; i++)
            if (c->streams[j]->deps.v[i].node->mark != mark)
                return false;
    return true;
}

static CUresult end_capture(CUstream h, CUgraph *out, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, ptsz, &e);
    sim_capture *c = s ? s->cap : NULL;
    if (!s || !c) {
        sim_unlock();
        return s ? CUDA_ERROR_ILLEGAL_STATE : e;
    }
    if (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && !own_thread(c)) {
        sim_unlock();
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    if (c->streams[0] != s) {
        c->invalidated = true;
        sim_unlock();
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    if (!c->invalidated && !capture_joined(c))
        e = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "a forked stream was not joined back");
    else if (c->invalidated)
        e = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    capture_detach_all(c);
    if (e)
        sim_graph_destroy(c->graph);
    *out = e ? NULL : (CUgraph)c->graph;
    free(c);
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamEndCapture(CUstream h, CUgraph *g) { return end_capture(h, g, false); }
SIM_API CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph *g) { return end_capture(h, g, true); }

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *st, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, ptsz, &e);
    if (s == &g_sim.legacy)
        e = sim_legacy_implicit();
    if (s && !e)
        *st = !s->cap ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                    : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st) { return is_capturing(h, st, false); }
SIM_API CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus *st) { return is_capturing(h, st, true); }

/* The edge data of the current dependencies; valid until the stream's next captured operation. */
static __thread CUgraphEdgeData t_edge_data[256];
static __thread CUgraphNode t_dep_nodes[256];

static CUresult capture_info(CUstream h, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps,
                             bool ptsz) {
    CUresult e = is_capturing(h, status, ptsz);
    if (e)
        return e;
    sim_lock();
    sim_stream *s = sim_stream_resolve(h, ptsz, &e);
    sim_capture *c = s ? s->cap : NULL;
    if (id && c)
        *id = c->id;
    if (graph)
        *graph = c ? (CUgraph)c->graph : NULL;
    size_t n = c ? s->deps.n : 0;
    if (n > 256)
        n = 256;
    for (size_t i = 0; i < n; i++) {
        t_dep_nodes[i] = (CUgraphNode)s->deps.v[i].node;
        t_edge_data[i] = s->deps.v[i].data;
    }
    if (deps)
        *deps = t_dep_nodes;
    if (edges)
        *edges = t_edge_data;
    if (ndeps)
        *ndeps = n;
    sim_unlock();
    return CUDA_SUCCESS;
}

SIM_API CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                           const CUgraphNode **d, const CUgraphEdgeData **ed, size_t *n) {
    return capture_info(h, st, id, g, d, ed, n, false);
}
SIM_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id,
                                                CUgraph *g, const CUgraphNode **d,
                                                const CUgraphEdgeData **ed, size_t *n) {
    return capture_info(h, st, id, g, d, ed, n, true);
}
SIM_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                           const CUgraphNode **d, size_t *n) {
    return capture_info(h, st, id, g, d, NULL, n, false);
}

SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_interaction;
    t_interaction = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
