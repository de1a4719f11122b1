/* Events: timing outside capture, fork/join of capture sequences inside it. */
#include <stdlib.h>

#include "internal.h"

static CUresult check_event(CUevent h) {
    return sim_handle_is(h, H_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (!ph || (flags & ~known))
        return CUDA_ERROR_INVALID_VALUE;
    sim_event *ev = calloc(1, sizeof *ev);
    ev->flags = flags;
    sim_lock();
    sim_handle_add(ev, H_EVENT);
    sim_unlock();
    *ph = (CUevent)ev;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuEventDestroy(CUevent h) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    e = check_event(h);
    if (!e)
        sim_handle_del(h);
    sim_unlock();
    if (!e) {
        sim_deps_free(&((sim_event *)h)->deps);
        free(h);
    }
    return e;
}

static CUresult record(CUevent h, CUstream hs, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_stream *s = sim_stream_resolve(hs, ptsz, &e);
    if (!e)
        e = check_event(h);
    sim_event *ev = (sim_event *)h;
    if (!e && s->cap) {
        if (s->cap->invalidated) {
            e = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            ev->cap = s->cap;
            sim_deps_set(&ev->deps, s->deps.v, s->deps.n);
        }
    } else if (!e) {
        if (s == &g_sim.legacy)
            e = sim_legacy_implicit();
        ev->cap = NULL;
        ev->deps.n = 0;
        ev->recorded = true;
        ev->time_ms = sim_now_ms();
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuEventRecord(CUevent h, CUstream s) { return record(h, s, false); }
SIM_API CUresult cuEventRecord_ptsz(CUevent h, CUstream s) { return record(h, s, true); }
SIM_API CUresult cuEventRecordWithFlags(CUevent h, CUstream s, unsigned int f) {
    return f ? CUDA_ERROR_INVALID_VALUE : record(h, s, false);
}
SIM_API CUresult cuEventRecordWithFlags_ptsz(CUevent h, CUstream s, unsigned int f) {
    return f ? CUDA_ERROR_INVALID_VALUE : record(h, s, true);
}

/* Waiting on an event recorded during capture forks the capture into this stream, or joins. */
static CUresult wait_event(CUstream hs, CUevent h, unsigned flags, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *s = sim_stream_resolve(hs, ptsz, &e);
    if (!e)
        e = check_event(h);
    sim_event *ev = (sim_event *)h;
    if (!e && ev->cap) {
        sim_capture *c = ev->cap;
        if (s->cap && s->cap != c) {
            e = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        } else if (c->invalidated) {
            e = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else if (!s->cap) {
            if (s == &g_sim.legacy || c->num_streams == SIM_MAX_CAPTURE_STREAMS) {
                c->invalidated = true;
                e = s == &g_sim.legacy ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                s->cap = c;
                c->streams[c->num_streams++] = s;
                sim_deps_set(&s->deps, ev->deps.v, ev->deps.n);
            }
        } else {
            for (size_t i = 0; i < ev->deps.n; i++)
                sim_deps_add(&s->deps, ev->deps.v[i]);
        }
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamWaitEvent(CUstream s, CUevent h, unsigned int f) { return wait_event(s, h, f, false); }
SIM_API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent h, unsigned int f) { return wait_event(s, h, f, true); }

static CUresult event_ready(CUevent h) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    e = check_event(h);
    if (!e && ((sim_event *)h)->cap)
        e = CUDA_ERROR_CAPTURED_EVENT;
    sim_unlock();
    return e;
}

SIM_API CUresult cuEventSynchronize(CUevent h) { return event_ready(h); }
SIM_API CUresult cuEventQuery(CUevent h) { return event_ready(h); }

SIM_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    if (check_event(start) || check_event(end))
        e = CUDA_ERROR_INVALID_HANDLE;
    sim_event *a = (sim_event *)start, *b = (sim_event *)end;
    if (!e && (a->cap || b->cap))
        e = CUDA_ERROR_CAPTURED_EVENT;
    else if (!e && ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        e = CUDA_ERROR_INVALID_HANDLE;
    else if (!e && (!a->recorded || !b->recorded))
        e = CUDA_ERROR_INVALID_HANDLE;
    if (!e)
        *ms = (float)(b->time_ms - a->time_ms);
    sim_unlock();
    return e;
}
