/* Executable graphs: instantiate (topological order), launch, upload, update, per-node params. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

CUresult sim_kernel_op_replace(sim_kernel_op *dst, const CUDA_KERNEL_NODE_PARAMS *p); /* node.c */

typedef struct sim_exec_node {
    CUgraphNodeType type;
    const sim_node *origin; /* the node handle of the instantiated graph, kept across updates */
    size_t num_deps;
    sim_kernel_op k;
    sim_memcpy_op c;
    sim_memset_op s;
} sim_exec_node;

typedef struct sim_exec {
    size_t n;
    sim_exec_node *v;
} sim_exec;

static sim_exec *as_exec(CUgraphExec h) { return sim_handle_is(h, H_EXEC) ? (sim_exec *)h : NULL; }

/* Kahn's algorithm in O(V+E); order[i] is the i-th node to run. Returns false on a cycle. */
static bool topo_order(const sim_graph *g, sim_node **order) {
    size_t n = g->n, head = 0, tail = 0;
    size_t *indeg = calloc(n + 1, sizeof *indeg), *start = calloc(n + 2, sizeof *start);
    uint64_t base = g_sim.next_mark + 1;
    g_sim.next_mark += n;
    for (size_t i = 0; i < n; i++)
        g->nodes[i]->mark = base + i;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < g->nodes[i]->deps.n; j++)
            start[g->nodes[i]->deps.v[j].node->mark - base + 1]++;
    for (size_t i = 0; i < n; i++)
        start[i + 1] += start[i];
    size_t *fill = calloc(n + 1, sizeof *fill), *child = calloc(start[n] + 1, sizeof *child);
    for (size_t i = 0; i < n; i++) {
        indeg[i] = g->nodes[i]->deps.n;
        for (size_t j = 0; j < g->nodes[i]->deps.n; j++) {
            size_t p = g->nodes[i]->deps.v[j].node->mark - base;
            child[start[p] + fill[p]++] = i;
        }
        if (!indeg[i])
            order[tail++] = g->nodes[i];
    }
    while (head < tail) {
        size_t p = order[head++]->mark - base;
        for (size_t k = start[p]; k < start[p + 1]; k++)
            if (--indeg[child[k]] == 0)
                order[tail++] = g->nodes[child[k]];
    }
    free(indeg);
    free(start);
    free(fill);
    free(child);
    return tail == n;
}

static void exec_free(sim_exec *x) {
    for (size_t i = 0; i < x->n; i++)
        sim_kernel_op_free(&x->v[i].k);
    free(x->v);
    free(x);
}

static void copy_node(sim_exec_node *en, const sim_node *n) {
    en->type = n->type;
    en->num_deps = n->deps.n;
    en->c = n->c;
    en->s = n->s;
    sim_kernel_op_free(&en->k);
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        en->k = n->k;
        en->k.params = malloc(n->k.func->param_bytes ? n->k.func->param_bytes : 1);
        memcpy(en->k.params, n->k.params, n->k.func->param_bytes);
    }
}

/* memcheck: an access-policy window must start inside a live allocation, like a pointer argument
 * (a window left at an address from another process is a relocation restore missed). */
static CUresult check_windows(const sim_graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        const sim_node *n = g->nodes[i];
        for (int j = 0; n->type == CU_GRAPH_NODE_TYPE_KERNEL && j < n->num_attrs; j++) {
            const CUaccessPolicyWindow *w = &n->attr_vals[j].accessPolicyWindow;
            if (n->attr_ids[j] != CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW || !w->num_bytes ||
                !sim_check_range((uintptr_t)w->base_ptr, 1, false))
                continue;
            return sim_fail(CUDA_ERROR_INVALID_VALUE,
                            "memcheck: kernel %s: access-policy window base_ptr %p is not inside "
                            "a live allocation",
                            n->k.func ? n->k.func->name : "?", w->base_ptr);
        }
    }
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *out, CUgraph h) {
    sim_graph *g = sim_handle_is(h, H_GRAPH) ? (sim_graph *)h : NULL;
    if (!g || !out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult e = g_sim.cfg.memcheck ? check_windows(g) : CUDA_SUCCESS;
    if (e)
        return e;
    sim_node **order = calloc(g->n + 1, sizeof *order);
    if (!topo_order(g, order)) {
        free(order);
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "graph has a cycle");
    }
    sim_exec *x = calloc(1, sizeof *x);
    x->n = g->n;
    x->v = calloc(g->n + 1, sizeof *x->v);
    for (size_t i = 0; i < g->n; i++) {
        copy_node(&x->v[i], order[i]);
        x->v[i].origin = order[i];
    }
    free(order);
    sim_handle_add(x, H_EXEC);
    *out = (CUgraphExec)x;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph g, unsigned long long flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                               CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                               CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                               CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if (flags & ~known)
        return CUDA_ERROR_INVALID_VALUE;
    SIM_LOCKED(instantiate(out, g));
}

SIM_API CUresult cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult e = cuGraphInstantiateWithFlags(out, g, p->flags);
    p->result_out = e ? CUDA_GRAPH_INSTANTIATE_ERROR : CUDA_GRAPH_INSTANTIATE_SUCCESS;
    p->hErrNode_out = NULL;
    return e;
}

SIM_API CUresult cuGraphExecDestroy(CUgraphExec h) {
    sim_lock();
    sim_exec *x = as_exec(h);
    if (x) {
        sim_handle_del(x);
        exec_free(x);
    }
    sim_unlock();
    return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Checks the exec and the stream; launching into a capture or next to one is refused. */
static CUresult prepare_launch(CUgraphExec h, CUstream s, bool ptsz, sim_exec **out) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    *out = as_exec(h);
    sim_stream *st = sim_stream_resolve(s, ptsz, &e);
    if (!*out)
        e = CUDA_ERROR_INVALID_VALUE;
    else if (st && st->cap) {
        st->cap->invalidated = true;
        e = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "simcuda cannot capture a graph launch");
    } else if (st == &g_sim.legacy)
        e = sim_legacy_implicit();
    sim_unlock();
    return e;
}

static CUresult graph_launch(CUgraphExec h, CUstream s, bool ptsz) {
    sim_exec *x;
    CUresult e = prepare_launch(h, s, ptsz, &x);
    for (size_t i = 0; !e && i < x->n; i++) {
        const sim_exec_node *n = &x->v[i];
        if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            sim_acc_set_node(n->origin);
            e = sim_run_kernel(&n->k);
            sim_acc_set_node(NULL);
        }
        else if (n->type == CU_GRAPH_NODE_TYPE_MEMCPY)
            e = sim_run_memcpy(&n->c);
        else if (n->type == CU_GRAPH_NODE_TYPE_MEMSET)
            e = sim_run_memset(&n->s);
    }
    return e;
}

SIM_API CUresult cuGraphLaunch(CUgraphExec h, CUstream s) { return graph_launch(h, s, false); }
SIM_API CUresult cuGraphLaunch_ptsz(CUgraphExec h, CUstream s) { return graph_launch(h, s, true); }

SIM_API CUresult cuGraphUpload(CUgraphExec h, CUstream s) {
    sim_exec *x;
    return prepare_launch(h, s, false, &x);
}
SIM_API CUresult cuGraphUpload_ptsz(CUgraphExec h, CUstream s) {
    sim_exec *x;
    return prepare_launch(h, s, true, &x);
}

static sim_exec_node *find_exec_node(sim_exec *x, const void *node) {
    for (size_t i = 0; i < x->n; i++)
        if (x->v[i].origin == node)
            return &x->v[i];
    return NULL;
}

static CUresult exec_kernel_set(CUgraphExec h, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p) {
    sim_exec *x = as_exec(h);
    sim_exec_node *en = x && p ? find_exec_node(x, node) : NULL;
    if (!en || en->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_kernel_op_replace(&en->k, p);
}

SIM_API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec h, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_LOCKED(exec_kernel_set(h, n, p));
}

/* Same topology: same node count, and in topological order the same types and dependencies. */
static CUresult update(sim_exec *x, sim_graph *g, CUgraphExecUpdateResultInfo *info) {
    sim_node **order = calloc(g->n + 1, sizeof *order);
    CUgraphExecUpdateResult res = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    const sim_node *bad = NULL;
    if (!topo_order(g, order) || g->n != x->n)
        res = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (size_t i = 0; !res && i < g->n; i++) {
        const sim_node *a = order[i];
        if (a->type != x->v[i].type) {
            res = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
            bad = a;
        } else if (a->deps.n != x->v[i].num_deps) {
            res = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
            bad = a;
        }
    }
    for (size_t i = 0; !res && i < g->n; i++)
        copy_node(&x->v[i], order[i]);
    free(order);
    if (info) {
        info->result = res;
        info->errorNode = (CUgraphNode)bad;
        info->errorFromNode = NULL;
    }
    return res ? CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE : CUDA_SUCCESS;
}

SIM_API CUresult cuGraphExecUpdate_v2(CUgraphExec h, CUgraph g, CUgraphExecUpdateResultInfo *info) {
    sim_lock();
    sim_exec *x = as_exec(h);
    sim_graph *gr = sim_handle_is(g, H_GRAPH) ? (sim_graph *)g : NULL;
    CUresult e = x && gr ? update(x, gr, info) : CUDA_ERROR_INVALID_VALUE;
    sim_unlock();
    return e;
}
