/* Submitting work: recorded into the stream's capture, or queued (queue.c). */
#include "internal.h"

static CUresult record_node(sim_stream *st, sim_op *o, const CUlaunchAttribute *attrs,
                            unsigned num_attrs) {
    bool programmatic = false;
    for (unsigned i = 0; i < num_attrs; i++)
        if (attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION &&
            attrs[i].value.programmaticStreamSerializationAllowed)
            programmatic = true;
    sim_deps deps = {0};
    for (size_t i = 0; i < st->deps.n; i++) {
        sim_dep d = st->deps.v[i];
        if (programmatic && d.node->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            d.data.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
            d.data.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
        }
        sim_deps_add(&deps, d);
    }
    static const CUgraphNodeType types[] = {[OP_KERNEL] = CU_GRAPH_NODE_TYPE_KERNEL,
                                            [OP_MEMCPY] = CU_GRAPH_NODE_TYPE_MEMCPY,
                                            [OP_MEMSET] = CU_GRAPH_NODE_TYPE_MEMSET,
                                            [OP_HOST] = CU_GRAPH_NODE_TYPE_HOST};
    sim_node *n;
    CUresult e = sim_graph_add_node(st->cap->graph, types[o->type], deps.v, deps.n, &n);
    sim_deps_free(&deps);
    if (e)
        return e;
    if (o->type == OP_KERNEL) {
        n->k = o->u.k;
        o->u.k.params = NULL; /* the node owns them now */
        for (unsigned i = 0; i < num_attrs && n->num_attrs < SIM_MAX_ATTRS; i++) {
            if (attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
                continue;
            n->attr_ids[n->num_attrs] = attrs[i].id;
            n->attr_vals[n->num_attrs++] = attrs[i].value;
        }
    } else if (o->type == OP_MEMCPY) {
        n->c = o->u.copy.c;
        n->c.src = o->u.copy.source; /* a node copies from the caller's memory when it runs */
    } else if (o->type == OP_HOST) {
        n->h = o->u.host;
    } else {
        n->s = o->u.s;
    }
    sim_dep self = {n, {0}};
    sim_deps_set(&st->deps, &self, 1);
    return CUDA_SUCCESS;
}

CUresult sim_submit_locked(CUstream s, bool ptsz, sim_op *o, const CUlaunchAttribute *attrs,
                           unsigned num_attrs, bool wait) {
    CUresult e = CUDA_SUCCESS;
    sim_stream *st = sim_stream_resolve(s, ptsz, &e);
    if (st && st->cap) {
        e = st->cap->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
                                 : record_node(st, o, attrs, num_attrs);
        sim_op_unref(o);
        return e;
    }
    if (st == &g_sim.legacy)
        e = sim_legacy_implicit();
    if (st && !e)
        e = sim_check_op(o, &wait);
    if (!st || e) {
        sim_op_unref(o);
        return e;
    }
    sim_enqueue(st, o, NULL, 0);
    if (wait || g_sim.cfg.launch_blocking)
        e = sim_wait_ops(&o, 1); /* the stream's reference keeps o until it is done */
    return e;
}

CUresult sim_submit(CUstream s, bool ptsz, sim_op *o, const CUlaunchAttribute *attrs,
                    unsigned num_attrs, bool wait) {
    sim_lock();
    CUresult e = sim_submit_locked(s, ptsz, o, attrs, num_attrs, wait);
    sim_unlock();
    return e;
}

/* cuLaunchHostFunc: fn runs once the stream's earlier work is done, before its later work. */
static CUresult host_func(CUstream s, CUhostFn fn, void *data, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    sim_op *o = sim_op_new(OP_HOST);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.host = (CUDA_HOST_NODE_PARAMS){fn, data};
    return sim_submit(s, ptsz, o, NULL, 0, false);
}

#undef cuLaunchHostFunc
SIM_API CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *d) { return host_func(s, fn, d, false); }
SIM_API CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *d) { return host_func(s, fn, d, true); }
