/* Events: outside capture, a record is an operation in its stream (done when the stream reaches
 * it) and a wait makes the stream's later work follow it; inside capture, fork and join. */
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
    if (!e) {
        sim_handle_del(h);
        sim_op_unref(((sim_event *)h)->rec); /* a pending record still completes */
    }
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
        sim_op *op = e ? NULL : sim_op_new(OP_RECORD);
        if (op) {
            ev->cap = NULL;
            ev->deps.n = 0;
            sim_op_unref(ev->rec);
            op->refs++; /* the event's */
            ev->rec = op;
            sim_enqueue(s, op, NULL, 0);
        } else if (!e) {
            e = CUDA_ERROR_OUT_OF_MEMORY;
        }
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
static CUresult wait_captured(sim_stream *s, sim_event *ev) {
    sim_capture *c = ev->cap;
    if (s->cap && s->cap != c)
        return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
    if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!s->cap) {
        if (s == &g_sim.legacy || c->num_streams == SIM_MAX_CAPTURE_STREAMS) {
            c->invalidated = true;
            return s == &g_sim.legacy ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_ERROR_OUT_OF_MEMORY;
        }
        s->cap = c;
        c->streams[c->num_streams++] = s;
        sim_deps_set(&s->deps, ev->deps.v, ev->deps.n);
    } else {
        for (size_t i = 0; i < ev->deps.n; i++)
            sim_deps_add(&s->deps, ev->deps.v[i]);
    }
    return CUDA_SUCCESS;
}

/* As the programming guide: a capturing stream may not wait on an event recorded outside the
 * capture (a dependency across the capture's boundary) unless the wait is external, an event-wait
 * node, which simcuda does not have. */
static CUresult wait_uncaptured_in_capture(sim_stream *s, const sim_event *ev, unsigned flags) {
    if (flags & CU_EVENT_WAIT_EXTERNAL) {
        s->cap->invalidated = true;
        return sim_fail(CUDA_ERROR_NOT_SUPPORTED, "simcuda has no event-wait graph nodes "
                        "(cudaStreamWaitEvent with cudaEventWaitExternal during capture)");
    }
    if (!ev->rec) /* never recorded: an empty set of work, nothing to wait for */
        return CUDA_SUCCESS;
    s->cap->invalidated = true;
    return sim_fail(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                    "a capturing stream waited on an event recorded outside the capture: the "
                    "graph cannot depend on work outside it (record the event in the capture, or "
                    "wait before cudaStreamBeginCapture)");
}

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
    if (!e && (flags & CU_EVENT_WAIT_EXTERNAL) && !s->cap)
        e = sim_fail(CUDA_ERROR_ILLEGAL_STATE, "cudaEventWaitExternal is only valid while the "
                     "stream is capturing (cuda.h: invalid outside of stream capture; the "
                     "driver answers CUDA_ERROR_ILLEGAL_STATE, as an H200 did)");
    else if (!e && ev->cap && !(flags & CU_EVENT_WAIT_EXTERNAL))
        e = wait_captured(s, ev);
    else if (!e && s->cap)
        e = wait_uncaptured_in_capture(s, ev, flags);
    else if (!e && ev->rec) {
        sim_op *op = sim_op_new(OP_WAIT);
        if (op)
            sim_enqueue(s, op, &ev->rec, 1);
        else
            e = CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuStreamWaitEvent(CUstream s, CUevent h, unsigned int f) { return wait_event(s, h, f, false); }
SIM_API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent h, unsigned int f) { return wait_event(s, h, f, true); }

/* query: one step of the work the event waits for, then CUDA_ERROR_NOT_READY if some is left. */
static CUresult event_ready(CUevent h, bool query) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    e = check_event(h);
    sim_event *ev = (sim_event *)h;
    if (!e && ev->cap)
        e = CUDA_ERROR_CAPTURED_EVENT;
    else if (!e && ev->rec && query)
        e = sim_step_ops(&ev->rec, 1) ? g_sim.sticky : CUDA_ERROR_NOT_READY;
    else if (!e && ev->rec)
        e = sim_wait_ops(&ev->rec, 1);
    sim_unlock();
    return e;
}

SIM_API CUresult cuEventSynchronize(CUevent h) { return event_ready(h, false); }
SIM_API CUresult cuEventQuery(CUevent h) { return event_ready(h, true); }

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
    else if (!e && (!a->rec || !b->rec))
        e = CUDA_ERROR_INVALID_HANDLE;
    else if (!e && (!a->rec->done || !b->rec->done))
        e = CUDA_ERROR_NOT_READY; /* cuda.h: as cuEventQuery would on either */
    if (!e)
        *ms = (float)(b->rec->u.time_ms - a->rec->u.time_ms);
    sim_unlock();
    return e;
}
