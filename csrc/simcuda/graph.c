/* Graph construction and inspection (driver API). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static sim_graph *as_graph(CUgraph g) { return sim_handle_is(g, H_GRAPH) ? (sim_graph *)g : NULL; }
static sim_node *as_node(CUgraphNode n) { return sim_handle_is(n, H_NODE) ? (sim_node *)n : NULL; }

CUresult sim_graph_add_node(sim_graph *g, CUgraphNodeType type, const sim_dep *deps, size_t ndeps,
                            sim_node **out) {
    for (size_t i = 0; i < ndeps; i++)
        if (!deps[i].node || deps[i].node->graph != g)
            return CUDA_ERROR_INVALID_VALUE;
    if (g->n == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 16;
        sim_node **nodes = realloc(g->nodes, cap * sizeof *nodes);
        if (!nodes)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->nodes = nodes, g->cap = cap;
    }
    if (!g->blocks || g->blocks->used == SIM_NODE_BLOCK) {
        sim_node_block *b = calloc(1, sizeof *b);
        if (!b)
            return CUDA_ERROR_OUT_OF_MEMORY;
        b->next = g->blocks;
        g->blocks = b;
    }
    sim_node *n = &g->blocks->v[g->blocks->used++];
    n->type = type;
    n->graph = g;
    sim_deps_set(&n->deps, deps, ndeps);
    g->nodes[g->n++] = n;
    sim_handle_add(n, H_NODE);
    *out = n;
    return CUDA_SUCCESS;
}

void sim_graph_destroy(sim_graph *g) {
    for (size_t i = 0; i < g->n; i++) {
        sim_handle_del(g->nodes[i]);
        sim_kernel_op_free(&g->nodes[i]->k);
        sim_deps_free(&g->nodes[i]->deps);
        free(g->nodes[i]->param_ptrs);
    }
    for (sim_node_block *b = g->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    sim_handle_del(g);
    free(g->nodes);
    free(g);
}

SIM_API CUresult cuGraphCreate(CUgraph *out, unsigned int flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    sim_graph *g = calloc(1, sizeof *g);
    sim_lock();
    sim_handle_add(g, H_GRAPH);
    sim_unlock();
    *out = (CUgraph)g;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphDestroy(CUgraph h) {
    sim_lock();
    sim_graph *g = as_graph(h);
    if (g)
        sim_graph_destroy(g);
    sim_unlock();
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Adds a node after resolving the dependency handles; the caller fills in its operation. */
static CUresult add_node(CUgraphNode *out, CUgraph h, const CUgraphNode *deps, const CUgraphEdgeData *ed,
                         size_t n, CUgraphNodeType type, sim_node **node) {
    if (!out || (n && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    sim_graph *g = as_graph(h);
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    /* NOTE: most nodes have a few dependencies or none (a restore adds edges afterwards): no heap
     * allocation for those, it was a visible share of building a graph. */
    sim_dep few[8] = {0};
    sim_dep *d = n <= 8 ? few : calloc(n, sizeof *d);
    if (!d)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        d[i].node = as_node(deps[i]);
        if (ed)
            d[i].data = ed[i];
    }
    CUresult e = sim_graph_add_node(g, type, d, n, node);
    if (d != few)
        free(d);
    if (!e)
        *out = (CUgraphNode)*node;
    return e;
}

/* func must be a CUfunction; a CUkernel goes in kern (CUDA_KERNEL_NODE_PARAMS_v3). */
sim_func *sim_param_func(const CUDA_KERNEL_NODE_PARAMS *p) {
    return p->func ? sim_func_of(p->func) : sim_kernel_of(p->kern);
}

static CUresult kernel_op_from(sim_kernel_op *op, const CUDA_KERNEL_NODE_PARAMS *p) {
    sim_func *f = sim_param_func(p);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    return sim_kernel_op_init(op, f, g, b, p->sharedMemBytes, p->kernelParams, p->extra);
}

SIM_API CUresult cuGraphAddKernelNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                      const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_kernel_op op = {0};
    sim_node *node = NULL;
    CUresult e = kernel_op_from(&op, p);
    if (!e)
        e = add_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_KERNEL, &node);
    if (!e) {
        node->k = op;
        node->params_by_extra = p->extra != NULL;
    } else
        sim_kernel_op_free(&op);
    sim_unlock();
    return e;
}

/* NOTE: cuda.h asks srcPitch >= WidthInBytes + srcXInBytes (dst likewise) of a copy that is not
 * an array's. The driver (580, CUDA 13, on an H200) accepts a pitch of 0 on a copy of one row
 * (Height and Depth 1), where no second row is placed by it, and refuses a pitch below the
 * row even there: so does simcuda (pitch 0 on one row hides no bug; one below the row does). */
static bool pitch_fits(const CUDA_MEMCPY3D *p, CUmemorytype type, size_t pitch, size_t x) {
    bool one_row = p->Height == 1 && p->Depth == 1;
    return type == CU_MEMORYTYPE_ARRAY || (one_row && pitch == 0) || pitch >= p->WidthInBytes + x;
}

static CUresult memcpy_op_from(sim_memcpy_op *op, const CUDA_MEMCPY3D *p) {
    if ((p->Height > 1) || (p->Depth > 1) || p->srcArray || p->dstArray)
        return sim_fail(CUDA_ERROR_NOT_SUPPORTED, "simcuda supports 1-D memcpy nodes only");
    if (!pitch_fits(p, p->srcMemoryType, p->srcPitch, p->srcXInBytes) ||
        !pitch_fits(p, p->dstMemoryType, p->dstPitch, p->dstXInBytes))
        return sim_fail(CUDA_ERROR_INVALID_VALUE,
                        "memcpy node: srcPitch %zu and dstPitch %zu must be at least WidthInBytes "
                        "%zu plus srcXInBytes %zu and dstXInBytes %zu (0 on one row only)",
                        p->srcPitch, p->dstPitch, p->WidthInBytes, p->srcXInBytes, p->dstXInBytes);
    uintptr_t src = p->srcMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)p->srcHost : p->srcDevice;
    uintptr_t dst = p->dstMemoryType == CU_MEMORYTYPE_HOST ? (uintptr_t)p->dstHost : p->dstDevice;
    *op = (sim_memcpy_op){dst + p->dstXInBytes, src + p->srcXInBytes, p->WidthInBytes};
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphAddMemcpyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                      const CUDA_MEMCPY3D *p, CUcontext ctx) {
    (void)ctx;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    sim_memcpy_op op;
    CUresult e = memcpy_op_from(&op, p);
    if (e)
        return e;
    sim_lock();
    sim_node *node = NULL;
    e = add_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_MEMCPY, &node);
    if (!e)
        node->c = op;
    sim_unlock();
    return e;
}

SIM_API CUresult cuGraphAddMemsetNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                      const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx) {
    (void)ctx;
    if (!p || !(p->elementSize == 1 || p->elementSize == 2 || p->elementSize == 4) ||
        p->height == 0 || (p->height > 1 && p->pitch < p->width * p->elementSize))
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_node *node = NULL;
    CUresult e = add_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_MEMSET, &node);
    if (!e)
        node->s = (sim_memset_op){p->dst, p->height > 1 ? p->pitch : p->width * p->elementSize,
                                  p->width, p->height, p->value, p->elementSize};
    sim_unlock();
    return e;
}

SIM_API CUresult cuGraphAddHostNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS *p) {
    if (!p || !p->fn)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_node *node = NULL;
    CUresult e = add_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_HOST, &node);
    if (!e)
        node->h = *p;
    sim_unlock();
    return e;
}

SIM_API CUresult cuGraphAddEmptyNode(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n) {
    sim_node *node;
    SIM_LOCKED(add_node(out, g, deps, NULL, n, CU_GRAPH_NODE_TYPE_EMPTY, &node));
}

static CUresult add_deps(CUgraph h, const CUgraphNode *from, const CUgraphNode *to,
                         const CUgraphEdgeData *ed, size_t n) {
    sim_graph *g = as_graph(h);
    if (!g || (n && (!from || !to)))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        sim_node *a = as_node(from[i]), *b = as_node(to[i]);
        if (!a || !b || a->graph != g || b->graph != g || a == b)
            return CUDA_ERROR_INVALID_VALUE;
        for (size_t j = 0; j < b->deps.n; j++)
            if (b->deps.v[j].node == a)
                return CUDA_ERROR_INVALID_VALUE; /* the edge exists already */
        sim_deps_add(&b->deps, (sim_dep){a, ed ? ed[i] : (CUgraphEdgeData){0}});
    }
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
                                           const CUgraphEdgeData *ed, size_t n) {
    SIM_LOCKED(add_deps(g, from, to, ed, n));
}
#undef cuGraphAddDependencies /* the CUDA 10.0 form, without edge data */
SIM_API CUresult cuGraphAddDependencies(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
    SIM_LOCKED(add_deps(g, from, to, NULL, n));
}

static CUresult get_nodes(CUgraph h, CUgraphNode *nodes, size_t *num) {
    sim_graph *g = as_graph(h);
    if (!g || !num)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        for (size_t i = 0; i < *num; i++)
            nodes[i] = i < g->n ? (CUgraphNode)g->nodes[i] : NULL;
        if (*num > g->n)
            *num = g->n;
    } else {
        *num = g->n;
    }
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num) { SIM_LOCKED(get_nodes(g, nodes, num)); }

static bool edge_data_default(const CUgraphEdgeData *d) {
    return !d->from_port && !d->to_port && !d->type;
}

static CUresult get_edges(CUgraph h, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *ed, size_t *num) {
    sim_graph *g = as_graph(h);
    if (!g || !num || (!from != !to))
        return CUDA_ERROR_INVALID_VALUE;
    size_t k = 0;
    bool lossy = false;
    for (size_t i = 0; i < g->n; i++)
        for (size_t j = 0; j < g->nodes[i]->deps.n; j++, k++) {
            const sim_dep *d = &g->nodes[i]->deps.v[j];
            if (!from || k >= *num)
                continue;
            from[k] = (CUgraphNode)d->node;
            to[k] = (CUgraphNode)g->nodes[i];
            if (ed)
                ed[k] = d->data;
            else if (!edge_data_default(&d->data))
                lossy = true;
        }
    if (from)
        for (size_t i = k; i < *num; i++) {
            from[i] = to[i] = NULL;
            if (ed)
                ed[i] = (CUgraphEdgeData){0};
        }
    if (!from || *num > k)
        *num = k;
    return lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

SIM_API CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *ed,
                                    size_t *num) {
    SIM_LOCKED(get_edges(g, from, to, ed, num));
}
#undef cuGraphGetEdges /* the CUDA 10.0 form, without edge data */
SIM_API CUresult cuGraphGetEdges(CUgraph g, CUgraphNode *from, CUgraphNode *to, size_t *num) {
    SIM_LOCKED(get_edges(g, from, to, NULL, num));
}

SIM_API CUresult cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType *type) {
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_node *n = as_node(h);
    if (n)
        *type = n->type;
    sim_unlock();
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
