/* Graph building for restore: relocate each node's parameters, add nodes and edges with their
 * edge data and attributes, instantiate and upload. Driver entry points come from
 * cuGetProcAddress, like any CUDA library's. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudaTypedefs.h>

#include "restore.h"

#define EXPORT __attribute__((visibility("default")))

static struct {
    PFN_cuGraphCreate_v10000 create;
    PFN_cuGraphDestroy_v10000 destroy;
    PFN_cuGraphAddKernelNode_v12000 kernel;
    PFN_cuGraphAddMemcpyNode_v10000 memcpy_;
    PFN_cuGraphAddMemsetNode_v10000 memset_;
    PFN_cuGraphAddEmptyNode_v10000 empty;
    PFN_cuGraphAddDependencies_v12030 deps;
    PFN_cuGraphKernelNodeSetAttribute_v11000 attr;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphUpload_v11010 upload;
    PFN_cuCtxGetCurrent_v4000 ctx;
    int ok;
} D;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *gp = dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    if (!gp) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        gp = h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
    }
    PFN_cuGetProcAddress_v12000 get = (PFN_cuGetProcAddress_v12000)gp;
    if (!get)
        return;
    CUdriverProcAddressQueryResult st;
    int ok = 1;
#define GET(f, n, v) ok &= get(n, (void **)&D.f, v, 0, &st) == CUDA_SUCCESS;
    GET(create, "cuGraphCreate", 10000)
    GET(destroy, "cuGraphDestroy", 10000)
    GET(kernel, "cuGraphAddKernelNode", 12000)
    GET(memcpy_, "cuGraphAddMemcpyNode", 10000)
    GET(memset_, "cuGraphAddMemsetNode", 10000)
    GET(empty, "cuGraphAddEmptyNode", 10000)
    GET(deps, "cuGraphAddDependencies", 12030)
    GET(attr, "cuGraphKernelNodeSetAttribute", 11000)
    GET(instantiate, "cuGraphInstantiateWithFlags", 11040)
    GET(upload, "cuGraphUpload", 11010)
    GET(ctx, "cuCtxGetCurrent", 4000)
#undef GET
    D.ok = ok;
}

EXPORT int mr_abi_version(void) { return MR_ABI_VERSION; }

static int resolve(const mr_reloc *r, const uint64_t *const bases[MR_KINDS],
                   const uint64_t num_bases[MR_KINDS], uint64_t *out) {
    if (r->kind >= MR_KINDS || r->target >= num_bases[r->kind] || !bases[r->kind][r->target])
        return -1;
    *out = bases[r->kind][r->target] + (uint64_t)r->addend;
    return 0;
}

EXPORT int mr_relocate(uint8_t *data, size_t len, const mr_reloc *relocs, uint32_t n,
                       const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS]) {
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if ((uint64_t)relocs[i].offset + 8 > len || resolve(&relocs[i], bases, num_bases, &v))
            return i < INT32_MAX ? -1 - (int)i : INT32_MIN;
        memcpy(data + relocs[i].offset, &v, 8);
    }
    return 0;
}

/* Why a node cannot be built from the tables it indexes (64-bit sums: no wrap-around), or NULL. */
static const char *check_node(const mr_graph *g, const mr_node *n, uint32_t num_funcs) {
    if ((uint64_t)n->reloc_off + n->reloc_len > g->num_relocs)
        return "its relocations lie outside the relocation table";
    switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        if (n->func >= num_funcs)
            return "its kernel is not in the kernel table";
        if (n->param_len > MR_MAX_PARAM_BYTES ||
            (uint64_t)n->param_off + n->param_len > g->params_len)
            return "its parameters lie outside the parameter bytes";
        return NULL;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_EMPTY: return NULL;
    default: return "its type is not one restore builds";
    }
}

static CUresult add_node(const mr_graph *g, uint32_t i, CUgraph graph, const CUfunction *funcs,
                         const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                         CUcontext ctx, CUgraphNode *out, uint8_t *scratch, const char **why) {
    const mr_node *n = &g->nodes[i];
    const mr_reloc *rel = g->relocs + n->reloc_off;
    *why = " (a relocation has no target or lies outside the node)";
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        memcpy(scratch, g->params + n->param_off, n->param_len);
        if (mr_relocate(scratch, n->param_len, rel, n->reloc_len, bases, nb))
            return CUDA_ERROR_INVALID_VALUE;
        *why = "";
        size_t len = n->param_len;
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, scratch, CU_LAUNCH_PARAM_BUFFER_SIZE, &len,
                         CU_LAUNCH_PARAM_END};
        CUDA_KERNEL_NODE_PARAMS p = {.func = funcs[n->func],
                                     .gridDimX = n->grid[0], .gridDimY = n->grid[1],
                                     .gridDimZ = n->grid[2], .blockDimX = n->block[0],
                                     .blockDimY = n->block[1], .blockDimZ = n->block[2],
                                     .sharedMemBytes = n->shared, .extra = extra};
        return D.kernel(out, graph, NULL, 0, &p);
    }
    uint64_t words[2] = {0, 0};
    uint32_t last = n->type == CU_GRAPH_NODE_TYPE_MEMCPY ? 8 : 0; /* memcpy: dst, src; memset: dst */
    for (uint32_t r = 0; r < n->reloc_len; r++)
        if (rel[r].offset % 8 || rel[r].offset > last ||
            resolve(&rel[r], bases, nb, &words[rel[r].offset / 8]))
            return CUDA_ERROR_INVALID_VALUE;
    *why = "";
    if (n->type == CU_GRAPH_NODE_TYPE_MEMSET) {
        CUDA_MEMSET_NODE_PARAMS m = {.dst = words[0], .pitch = 0, .value = (unsigned)n->value,
                                     .elementSize = (unsigned)n->elem, .width = n->width,
                                     .height = n->height};
        if (m.height > 1)
            m.pitch = m.width * m.elementSize;
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
        c.WidthInBytes = n->width;
        c.Height = n->height ? n->height : 1;
        c.Depth = 1;
        return D.memcpy_(out, graph, NULL, 0, &c, ctx);
    }
    return D.empty(out, graph, NULL, 0);
}

EXPORT int mr_build_graph(const mr_graph *g, const CUfunction *funcs, uint32_t num_funcs,
                          const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                          CUstream stream, CUgraph *graph_out, CUgraphExec *exec_out, char *err,
                          size_t errlen) {
    pthread_once(&once, load);
    if (!D.ok) {
        snprintf(err, errlen, "the CUDA driver's graph API was not found");
        return CUDA_ERROR_NOT_FOUND;
    }
    CUcontext ctx = NULL;
    D.ctx(&ctx);
    CUgraph graph;
    CUresult e = D.create(&graph, 0);
    if (e)
        return e;
    for (uint32_t i = 0; !e && i < g->num_nodes; i++) {
        const char *why = check_node(g, &g->nodes[i], num_funcs);
        if (why) {
            e = CUDA_ERROR_INVALID_VALUE;
            snprintf(err, errlen, "node %u (type %u): %s", i, g->nodes[i].type, why);
        }
    }
    CUgraphNode *nodes = calloc(g->num_nodes ? g->num_nodes : 1, sizeof *nodes);
    uint8_t *scratch = malloc(MR_MAX_PARAM_BYTES + 8);
    if (!e && (!nodes || !scratch)) {
        e = CUDA_ERROR_OUT_OF_MEMORY;
        snprintf(err, errlen, "out of host memory for %u nodes", g->num_nodes);
    }
    for (uint32_t i = 0; !e && i < g->num_nodes; i++) {
        const char *why = "";
        if ((e = add_node(g, i, graph, funcs, bases, num_bases, ctx, &nodes[i], scratch, &why)))
            snprintf(err, errlen, "node %u (type %u): CUDA error %d%s", i, g->nodes[i].type, (int)e,
                     e == CUDA_ERROR_INVALID_VALUE ? why : "");
    }
    for (uint32_t i = 0; !e && i < g->num_edges; i++) {
        const mr_edge *x = &g->edges[i];
        CUgraphEdgeData ed = {.from_port = x->from_port, .to_port = x->to_port, .type = x->type};
        if (x->from >= g->num_nodes || x->to >= g->num_nodes)
            e = CUDA_ERROR_INVALID_VALUE;
        else
            e = D.deps(graph, &nodes[x->from], &nodes[x->to], &ed, 1);
        if (e)
            snprintf(err, errlen, "edge %u (%u -> %u): CUDA error %d", i, x->from, x->to, (int)e);
    }
    for (uint32_t i = 0; !e && i < g->num_attrs; i++) {
        CUkernelNodeAttrValue v;
        memset(&v, 0, sizeof v);
        memcpy(&v, g->attrs[i].value, sizeof v < 64 ? sizeof v : 64);
        if (g->attrs[i].node >= g->num_nodes ||
            g->nodes[g->attrs[i].node].type != CU_GRAPH_NODE_TYPE_KERNEL)
            e = CUDA_ERROR_INVALID_VALUE;
        else
            e = D.attr(nodes[g->attrs[i].node], (CUkernelNodeAttrID)g->attrs[i].attr, &v);
        if (e)
            snprintf(err, errlen, "attribute %u of node %u: CUDA error %d", g->attrs[i].attr,
                     g->attrs[i].node, (int)e);
    }
    CUgraphExec exec = NULL;
    if (!e && (e = D.instantiate(&exec, graph, 0)))
        snprintf(err, errlen, "instantiate: CUDA error %d", (int)e);
    if (!e && (e = D.upload(exec, stream)))
        snprintf(err, errlen, "upload: CUDA error %d", (int)e);
    free(nodes);
    free(scratch);
    if (e) {
        D.destroy(graph);
        return e;
    }
    *graph_out = graph;
    *exec_out = exec;
    return CUDA_SUCCESS;
}
