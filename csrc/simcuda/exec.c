/* Executable graphs: instantiate (topological order), update, per-node params. An exec's nodes
 * live in an image that queued launches share; changing an image a launch still holds changes a
 * copy (an update affects later launches only, as in CUDA). Launching: graph_run.c. */
#include <stdlib.h>
#include <string.h>

#include "exec.h"

CUresult sim_kernel_op_replace(sim_kernel_op *dst, const CUDA_KERNEL_NODE_PARAMS *p); /* node.c */

sim_exec *sim_as_exec(CUgraphExec h) { return sim_handle_is(h, H_EXEC) ? (sim_exec *)h : NULL; }

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

static void image_free(sim_exec_image *img) {
    for (size_t i = 0; i < img->n; i++)
        sim_kernel_op_free(&img->v[i].k);
    free(img->v);
    free(img->dep_start);
    free(img->dep);
    free(img->reach);
    free(img->params);
    free(img);
}

void sim_exec_image_unref(sim_exec_image *img) {
    if (img && --img->refs == 0)
        image_free(img);
}

/* A kernel op's parameters take this many bytes of an image's block (aligned as malloc's). */
static size_t pooled_size(const sim_kernel_op *k) { return (k->func->param_bytes + 16u) & ~15u; }

/* dst a copy of src, its parameters at *pool (then past them), or allocated when pool is NULL. */
static void copy_kernel(sim_kernel_op *dst, const sim_kernel_op *src, unsigned char **pool) {
    *dst = *src;
    dst->pooled = pool != NULL;
    if (pool) {
        dst->params = *pool;
        *pool += pooled_size(src);
    } else {
        dst->params = malloc(src->func->param_bytes ? src->func->param_bytes : 1);
    }
    memcpy(dst->params, src->params, src->func->param_bytes);
}

static void copy_node(sim_exec_node *en, const sim_node *n, unsigned char **pool) {
    en->type = n->type;
    en->num_deps = n->deps.n;
    en->c = n->c;
    en->s = n->s;
    en->h = n->h;
    sim_kernel_op_free(&en->k);
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL)
        copy_kernel(&en->k, &n->k, pool);
}

/* One block for the parameters of a new image's kernel nodes: one allocation per instantiation,
 * not one per node (a visible share of a restore's instantiations). NULL: none needed. */
static unsigned char *params_block(const sim_graph *g) {
    size_t bytes = 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_KERNEL)
            bytes += pooled_size(&g->nodes[i]->k);
    return bytes ? malloc(bytes) : NULL;
}

/* Node i's dependencies as indices into order (topological: each is below i). */
static void set_deps(sim_exec_image *img, sim_node *const *order) {
    size_t edges = 0;
    for (size_t i = 0; i < img->n; i++) {
        order[i]->mark = i;
        edges += order[i]->deps.n;
    }
    free(img->dep_start);
    free(img->dep);
    free(img->reach);
    img->reach = NULL;
    img->dep_start = malloc((img->n + 1) * sizeof *img->dep_start);
    img->dep = malloc((edges + 1) * sizeof *img->dep);
    size_t k = 0;
    for (size_t i = 0; i < img->n; i++) {
        img->dep_start[i] = k;
        for (size_t j = 0; j < order[i]->deps.n; j++)
            img->dep[k++] = (uint32_t)order[i]->deps.v[j].node->mark;
    }
    img->dep_start[img->n] = k;
}

/* The image to change: the exec's own, or a copy when a queued launch still holds it. */
static sim_exec_image *writable(sim_exec *x) {
    sim_exec_image *old = x->img;
    if (old->refs == 1)
        return old;
    sim_exec_image *img = calloc(1, sizeof *img);
    img->refs = 1;
    img->n = old->n;
    img->v = calloc(old->n + 1, sizeof *img->v);
    for (size_t i = 0; i < old->n; i++) {
        img->v[i] = old->v[i];
        if (old->v[i].type == CU_GRAPH_NODE_TYPE_KERNEL)
            copy_kernel(&img->v[i].k, &old->v[i].k, NULL);
    }
    size_t bytes = (old->n + 1) * sizeof *img->dep_start;
    img->dep_start = malloc(bytes);
    memcpy(img->dep_start, old->dep_start, bytes);
    bytes = (old->dep_start[old->n] + 1) * sizeof *img->dep;
    img->dep = malloc(bytes);
    memcpy(img->dep, old->dep, bytes);
    x->img = img;
    sim_exec_image_unref(old);
    return img;
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
    sim_exec_image *img = x->img = calloc(1, sizeof *img);
    img->refs = 1;
    img->n = g->n;
    img->v = calloc(g->n + 1, sizeof *img->v);
    unsigned char *pool = img->params = params_block(g);
    for (size_t i = 0; i < g->n; i++) {
        copy_node(&img->v[i], order[i], pool ? &pool : NULL);
        img->v[i].origin = order[i];
    }
    set_deps(img, order);
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
    sim_exec *x = sim_as_exec(h);
    if (x) { /* as the driver: a launch in flight completes, then its image goes */
        sim_handle_del(x);
        sim_exec_image_unref(x->img);
        sim_op_unref(x->last);
        free(x);
    }
    sim_unlock();
    return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static ptrdiff_t find_exec_node(const sim_exec_image *img, const void *node) {
    for (size_t i = 0; i < img->n; i++)
        if (img->v[i].origin == node)
            return (ptrdiff_t)i;
    return -1;
}

static CUresult exec_kernel_set(CUgraphExec h, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p) {
    sim_exec *x = sim_as_exec(h);
    ptrdiff_t i = x && p ? find_exec_node(x->img, node) : -1;
    if (i < 0 || x->img->v[i].type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    sim_kernel_op op = {0};
    CUresult e = sim_kernel_op_replace(&op, p); /* checked before the image is copied */
    if (!e) {
        sim_kernel_op *k = &writable(x)->v[i].k;
        sim_kernel_op_free(k);
        *k = op;
    }
    return e;
}

SIM_API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec h, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_LOCKED(exec_kernel_set(h, n, p));
}

/* Same topology: same node count, and in topological order the same types and dependencies. */
static CUresult update(sim_exec *x, sim_graph *g, CUgraphExecUpdateResultInfo *info) {
    sim_node **order = calloc(g->n + 1, sizeof *order);
    CUgraphExecUpdateResult res = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    const sim_node *bad = NULL;
    if (!topo_order(g, order) || g->n != x->img->n)
        res = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    for (size_t i = 0; !res && i < g->n; i++) {
        const sim_node *a = order[i];
        if (a->type != x->img->v[i].type) {
            res = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
            bad = a;
        } else if (a->deps.n != x->img->v[i].num_deps) {
            res = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
            bad = a;
        }
    }
    sim_exec_image *img = res ? NULL : writable(x);
    for (size_t i = 0; img && i < g->n; i++)
        copy_node(&img->v[i], order[i], NULL);
    if (img)
        set_deps(img, order);
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
    sim_exec *x = sim_as_exec(h);
    sim_graph *gr = sim_handle_is(g, H_GRAPH) ? (sim_graph *)g : NULL;
    CUresult e = x && gr ? update(x, gr, info) : CUDA_ERROR_INVALID_VALUE;
    sim_unlock();
    return e;
}
