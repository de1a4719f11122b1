/* Graph building for restore: relocate each node's parameters, add nodes and edges with their
 * edge data and attributes, instantiate and upload (the driver's functions: graph_driver.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_build.h"
#include "graph_driver.h"

#define EXPORT __attribute__((visibility("default")))

#define D (*mr_driver_api())
#define RELOC_FAILED "a relocation has no target or lies outside the node"

static const char *node_call(unsigned type) {
    switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "cuGraphAddKernelNode";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "cuGraphAddMemcpyNode";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "cuGraphAddMemsetNode";
    default: return "cuGraphAddEmptyNode";
    }
}

/* Node n's parameters relocated into s, and the kernel node parameters pointing into them; -1
 * when a relocation has no target or lies outside the node. */
static int kernel_params(const mr_graph *g, const mr_node *n, const mr_kernels *k,
                         const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                         mr_scratch *s, CUDA_KERNEL_NODE_PARAMS *p) {
    memcpy(s->bytes, g->params + n->param_off, n->param_len);
    if (mr_relocate(s->bytes, n->param_len, g->relocs + n->reloc_off, n->reloc_len, bases, nb))
        return -1;
    const mr_func *f = &k->funcs[n->func];
    for (uint32_t j = 0; j < f->layout_len; j++)
        s->ptrs[j] = s->bytes + k->params[f->layout_off + j].offset;
    /* NOTE: kernelParams, never extra: CU_LAUNCH_PARAM_BUFFER_POINTER is invalid for
     * cooperative kernels, and the attributes that make one are set after the node exists. */
    *p = (CUDA_KERNEL_NODE_PARAMS){.func = (CUfunction)(uintptr_t)f->func,
                                   .gridDimX = n->grid[0], .gridDimY = n->grid[1],
                                   .gridDimZ = n->grid[2], .blockDimX = n->block[0],
                                   .blockDimY = n->block[1], .blockDimZ = n->block[2],
                                   .sharedMemBytes = n->shared,
                                   .kernelParams = f->layout_len ? s->ptrs : NULL};
    return 0;
}

static CUresult add_node(const mr_graph *g, uint32_t i, CUgraph graph, const mr_kernels *k,
                         const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                         CUcontext ctx, CUgraphNode *out, mr_scratch *scratch, const char **why) {
    const mr_node *n = &g->nodes[i];
    const mr_reloc *rel = g->relocs + n->reloc_off;
    *why = RELOC_FAILED;
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS p;
        if (kernel_params(g, n, k, bases, nb, scratch, &p))
            return CUDA_ERROR_INVALID_VALUE;
        *why = "";
        return D.kernel(out, graph, NULL, 0, &p);
    }
    uint64_t words[2] = {0, 0};
    uint32_t last = n->type == CU_GRAPH_NODE_TYPE_MEMCPY ? 8 : 0; /* memcpy: dst, src; memset: dst */
    for (uint32_t r = 0; r < n->reloc_len; r++)
        if (rel[r].offset % 8 || rel[r].offset > last ||
            mr_resolve(&rel[r], bases, nb, &words[rel[r].offset / 8]))
            return CUDA_ERROR_INVALID_VALUE;
    *why = "";
    if (n->type == CU_GRAPH_NODE_TYPE_MEMSET) {
        CUDA_MEMSET_NODE_PARAMS m = {.dst = words[0], .pitch = n->width * n->elem,
                                     .value = (unsigned)n->value, .elementSize = (unsigned)n->elem,
                                     .width = n->width, .height = n->height};
        return D.memset_(out, graph, NULL, 0, &m, ctx);
    }
    if (n->type == CU_GRAPH_NODE_TYPE_MEMCPY) {
        CUDA_MEMCPY3D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = (CUmemorytype)(n->elem & 0xff);
        c.dstMemoryType = (CUmemorytype)((n->elem >> 8) & 0xff);
        if (c.srcMemoryType == CU_MEMORYTYPE_HOST)
            c.srcHost = (const void *)(uintptr_t)words[1];
        else
            c.srcDevice = words[1];
        if (c.dstMemoryType == CU_MEMORYTYPE_HOST)
            c.dstHost = (void *)(uintptr_t)words[0];
        else
            c.dstDevice = words[0];
        /* NOTE: one row still has its pitches (cuda.h: pitch >= WidthInBytes + XInBytes); some
         * drivers refuse a copy node with pitch 0 */
        c.WidthInBytes = c.srcPitch = c.dstPitch = n->width;
        c.Height = c.Depth = c.srcHeight = c.dstHeight = 1;
        return D.memcpy_(out, graph, NULL, 0, &c, ctx);
    }
    return D.empty(out, graph, NULL, 0);
}

/* Sets one kernel node attribute, its pointer words relocated (an access-policy window). */
static CUresult set_attr(const mr_graph *g, const mr_attr *a, CUgraphNode *nodes,
                         const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS]) {
    uint8_t value[64];
    memcpy(value, a->value, sizeof value);
    if (a->node >= g->num_nodes || g->nodes[a->node].type != CU_GRAPH_NODE_TYPE_KERNEL ||
        (uint64_t)a->reloc_off + a->reloc_len > g->num_relocs ||
        mr_relocate(value, sizeof value, g->relocs + a->reloc_off, a->reloc_len, bases, nb))
        return CUDA_ERROR_INVALID_VALUE;
    CUkernelNodeAttrValue v;
    memset(&v, 0, sizeof v);
    memcpy(&v, value, sizeof v < sizeof value ? sizeof v : sizeof value);
    return D.attr(nodes[a->node], (CUkernelNodeAttrID)a->attr, &v);
}

/* The largest parameter layout of the kernel table, for the kernelParams scratch. */
static uint32_t max_layout(const mr_kernels *k) {
    uint32_t m = 1;
    for (uint32_t i = 0; i < k->num_funcs; i++)
        if (k->funcs[i].layout_len > m && k->funcs[i].layout_len <= MR_MAX_PARAM_BYTES)
            m = k->funcs[i].layout_len;
    return m;
}

static CUresult add_all(const mr_graph *g, const mr_kernels *k, CUgraph graph, CUgraphNode *nodes,
                        mr_scratch *scratch, const uint64_t *const bases[MR_KINDS],
                        const uint64_t nb[MR_KINDS], char *err, size_t errlen) {
    CUcontext ctx = NULL;
    D.ctx(&ctx);
    CUresult e = CUDA_SUCCESS;
    for (uint32_t i = 0; !e && i < g->num_nodes; i++) {
        const char *why = "";
        if (!(e = add_node(g, i, graph, k, bases, nb, ctx, &nodes[i], scratch, &why)))
            continue;
        char where[48];
        snprintf(where, sizeof where, "node %u (type %u)", i, g->nodes[i].type);
        if (*why)
            snprintf(err, errlen, "%s: %s", where, why);
        else
            mr_failed(err, errlen, where, node_call(g->nodes[i].type), e);
    }
    for (uint32_t i = 0; !e && i < g->num_edges; i++) {
        const mr_edge *x = &g->edges[i];
        CUgraphEdgeData ed = {.from_port = x->from_port, .to_port = x->to_port, .type = x->type};
        if (x->from >= g->num_nodes || x->to >= g->num_nodes)
            e = CUDA_ERROR_INVALID_VALUE;
        else
            e = D.deps(graph, &nodes[x->from], &nodes[x->to], &ed, 1);
        if (e) {
            char where[64];
            snprintf(where, sizeof where, "edge %u (%u -> %u)", i, x->from, x->to);
            mr_failed(err, errlen, where, "cuGraphAddDependencies", e);
        }
    }
    for (uint32_t i = 0; !e && i < g->num_attrs; i++)
        if ((e = set_attr(g, &g->attrs[i], nodes, bases, nb))) {
            char where[64];
            snprintf(where, sizeof where, "attribute %u of node %u", g->attrs[i].attr,
                     g->attrs[i].node);
            mr_failed(err, errlen, where, "cuGraphKernelNodeSetAttribute", e);
        }
    return e;
}

int mr_scratch_init(mr_scratch *s, const mr_kernels *k) {
    s->bytes = malloc(MR_MAX_PARAM_BYTES + 8);
    s->ptrs = calloc(max_layout(k), sizeof(void *));
    if (s->bytes && s->ptrs)
        return 0;
    mr_scratch_free(s);
    return -1;
}

void mr_scratch_free(mr_scratch *s) {
    free(s->bytes);
    free(s->ptrs);
    *s = (mr_scratch){0};
}

CUresult mr_populate(const mr_graph *g, const mr_kernels *k, const uint64_t *const bases[MR_KINDS],
                     const uint64_t nb[MR_KINDS], mr_scratch *s, CUgraph *out, CUgraphNode *nodes,
                     char *err, size_t errlen) {
    if (!D.ok) {
        snprintf(err, errlen, "the CUDA driver's graph API was not found");
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult e = mr_check_nodes(g, k, err, errlen);
    if (e)
        return e;
    if ((e = D.create(out, 0))) {
        mr_failed(err, errlen, "", "cuGraphCreate", e);
        return e;
    }
    if ((e = add_all(g, k, *out, nodes, s, bases, nb, err, errlen))) {
        D.destroy(*out);
        *out = NULL;
    }
    return e;
}

CUresult mr_set_kernel(const mr_graph *g, uint32_t i, const mr_kernels *k,
                       const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                       mr_scratch *s, CUgraphNode node, char *err, size_t errlen) {
    CUDA_KERNEL_NODE_PARAMS p;
    int bad = kernel_params(g, &g->nodes[i], k, bases, nb, s, &p);
    CUresult e = bad ? CUDA_ERROR_INVALID_VALUE : D.kernel_set(node, &p);
    if (!e)
        return e;
    char where[48];
    snprintf(where, sizeof where, "node %u (type %u)", i, g->nodes[i].type);
    if (bad)
        snprintf(err, errlen, "%s: %s", where, RELOC_FAILED);
    else
        mr_failed(err, errlen, where, "cuGraphKernelNodeSetParams", e);
    return e;
}

CUresult mr_instantiate(CUgraph graph, CUstream stream, CUgraphExec *exec_out, char *err,
                        size_t errlen) {
    CUgraphExec exec = NULL;
    CUresult e = D.instantiate(&exec, graph, 0);
    if (e) {
        mr_failed(err, errlen, "", "cuGraphInstantiateWithFlags", e);
    } else if ((e = D.upload(exec, stream))) {
        mr_failed(err, errlen, "", "cuGraphUpload", e);
        D.exec_destroy(exec);
    } else {
        *exec_out = exec;
    }
    return e;
}

/* The graph itself is destroyed once instantiated (the exec does not need it). */
EXPORT int mr_build_graph(const mr_graph *g, const mr_kernels *k,
                          const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                          CUstream stream, CUgraphExec *exec_out, char *err, size_t errlen) {
    CUgraphNode *nodes = calloc(g->num_nodes ? g->num_nodes : 1, sizeof *nodes);
    mr_scratch s;
    if (!nodes || mr_scratch_init(&s, k)) {
        free(nodes);
        snprintf(err, errlen, "out of host memory for %u nodes", g->num_nodes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUgraph graph;
    CUresult e = mr_populate(g, k, bases, num_bases, &s, &graph, nodes, err, errlen);
    free(nodes);
    mr_scratch_free(&s);
    if (e)
        return e;
    e = mr_instantiate(graph, stream, exec_out, err, errlen);
    D.destroy(graph);
    return e;
}
