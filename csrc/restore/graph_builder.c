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
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuCtxGetCurrent_v4000 ctx;
    PFN_cuGetErrorName_v6000 name; /* optional: only for messages */
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
    GET(exec_destroy, "cuGraphExecDestroy", 10000)
    GET(ctx, "cuCtxGetCurrent", 4000)
#undef GET
    if (get("cuGetErrorName", (void **)&D.name, 6000, 0, &st) != CUDA_SUCCESS)
        D.name = NULL;
    D.ok = ok;
}

EXPORT int mr_abi_version(void) { return MR_ABI_VERSION; }

/* "WHERE: CALL failed: CUDA_ERROR_NAME (code)", so that a GPU run's log says what failed. */
static void failed(char *err, size_t errlen, const char *where, const char *call, CUresult e) {
    const char *name = NULL;
    if (!D.name || D.name(e, &name) != CUDA_SUCCESS || !name)
        name = "CUDA error";
    snprintf(err, errlen, "%s%s%s failed: %s (%d)", where, *where ? ": " : "", call, name, (int)e);
}

static const char *node_call(unsigned type) {
    switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return "cuGraphAddKernelNode";
    case CU_GRAPH_NODE_TYPE_MEMCPY: return "cuGraphAddMemcpyNode";
    case CU_GRAPH_NODE_TYPE_MEMSET: return "cuGraphAddMemsetNode";
    default: return "cuGraphAddEmptyNode";
    }
}

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

/* Why a kernel node's parameters cannot be passed as kernelParams, or NULL: every parameter of
 * its kernel's recorded layout must lie in the node's parameter bytes. */
static const char *check_layout(const mr_kernels *k, const mr_node *n) {
    const mr_func *f = &k->funcs[n->func];
    if ((uint64_t)f->layout_off + f->layout_len > k->num_params ||
        f->layout_len > MR_MAX_PARAM_BYTES)
        return "its kernel's parameter layout lies outside the layout table";
    if (!f->layout_len && n->param_len)
        return "its kernel's parameter layout was not recorded (cuFuncGetParamInfo), so its "
               "parameters cannot be passed as kernelParams";
    for (uint32_t j = 0; j < f->layout_len; j++) {
        const mr_param *p = &k->params[f->layout_off + j];
        if ((uint64_t)p->offset + p->size > n->param_len)
            return "a parameter of its kernel's layout lies outside its parameter bytes";
    }
    return NULL;
}

/* Why a node cannot be built from the tables it indexes (64-bit sums: no wrap-around), or NULL. */
static const char *check_node(const mr_graph *g, const mr_node *n, const mr_kernels *k) {
    if ((uint64_t)n->reloc_off + n->reloc_len > g->num_relocs)
        return "its relocations lie outside the relocation table";
    switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        if (n->func >= k->num_funcs)
            return "its kernel is not in the kernel table";
        if (n->param_len > MR_MAX_PARAM_BYTES ||
            (uint64_t)n->param_off + n->param_len > g->params_len)
            return "its parameters lie outside the parameter bytes";
        return check_layout(k, n);
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (n->height > 1 || n->depth > 1)
            return "it is a 2-D or 3-D copy, and the recording keeps no pitches: restore "
                   "rebuilds 1-D copies only (copy row by row, or leave it out of the graph)";
        return NULL;
    case CU_GRAPH_NODE_TYPE_MEMSET:
        if (n->height > 1)
            return "it is a 2-D fill, and the recording keeps no pitch: restore rebuilds 1-D "
                   "fills only (fill row by row, or leave it out of the graph)";
        return NULL;
    case CU_GRAPH_NODE_TYPE_EMPTY: return NULL;
    default: return "its type is not one restore builds";
    }
}

/* Scratch for one node: its relocated parameter bytes and kernelParams pointing into them. */
typedef struct {
    uint8_t *bytes;
    void **ptrs;
} mr_scratch;

static CUresult add_kernel(const mr_node *n, CUgraph graph, const mr_kernels *k, mr_scratch *s,
                           CUgraphNode *out) {
    const mr_func *f = &k->funcs[n->func];
    for (uint32_t j = 0; j < f->layout_len; j++)
        s->ptrs[j] = s->bytes + k->params[f->layout_off + j].offset;
    /* NOTE: kernelParams, never extra: CU_LAUNCH_PARAM_BUFFER_POINTER is invalid for
     * cooperative kernels, and the attributes that make one are set after the node exists. */
    CUDA_KERNEL_NODE_PARAMS p = {.func = (CUfunction)(uintptr_t)f->func,
                                 .gridDimX = n->grid[0], .gridDimY = n->grid[1],
                                 .gridDimZ = n->grid[2], .blockDimX = n->block[0],
                                 .blockDimY = n->block[1], .blockDimZ = n->block[2],
                                 .sharedMemBytes = n->shared,
                                 .kernelParams = f->layout_len ? s->ptrs : NULL};
    return D.kernel(out, graph, NULL, 0, &p);
}

static CUresult add_node(const mr_graph *g, uint32_t i, CUgraph graph, const mr_kernels *k,
                         const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                         CUcontext ctx, CUgraphNode *out, mr_scratch *scratch, const char **why) {
    const mr_node *n = &g->nodes[i];
    const mr_reloc *rel = g->relocs + n->reloc_off;
    *why = "a relocation has no target or lies outside the node";
    if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        memcpy(scratch->bytes, g->params + n->param_off, n->param_len);
        if (mr_relocate(scratch->bytes, n->param_len, rel, n->reloc_len, bases, nb))
            return CUDA_ERROR_INVALID_VALUE;
        *why = "";
        return add_kernel(n, graph, k, scratch, out);
    }
    uint64_t words[2] = {0, 0};
    uint32_t last = n->type == CU_GRAPH_NODE_TYPE_MEMCPY ? 8 : 0; /* memcpy: dst, src; memset: dst */
    for (uint32_t r = 0; r < n->reloc_len; r++)
        if (rel[r].offset % 8 || rel[r].offset > last ||
            resolve(&rel[r], bases, nb, &words[rel[r].offset / 8]))
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
            failed(err, errlen, where, node_call(g->nodes[i].type), e);
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
            failed(err, errlen, where, "cuGraphAddDependencies", e);
        }
    }
    for (uint32_t i = 0; !e && i < g->num_attrs; i++)
        if ((e = set_attr(g, &g->attrs[i], nodes, bases, nb))) {
            char where[64];
            snprintf(where, sizeof where, "attribute %u of node %u", g->attrs[i].attr,
                     g->attrs[i].node);
            failed(err, errlen, where, "cuGraphKernelNodeSetAttribute", e);
        }
    return e;
}

/* The executable graph of a graph built without error: instantiated, uploaded, and the graph
 * itself destroyed (the exec does not need it). Nothing is left behind on failure. */
static CUresult instantiate(CUgraph graph, CUstream stream, CUgraphExec *exec_out, char *err,
                            size_t errlen) {
    CUgraphExec exec = NULL;
    CUresult e = D.instantiate(&exec, graph, 0);
    if (e) {
        failed(err, errlen, "", "cuGraphInstantiateWithFlags", e);
    } else if ((e = D.upload(exec, stream))) {
        failed(err, errlen, "", "cuGraphUpload", e);
        D.exec_destroy(exec);
    } else {
        *exec_out = exec;
    }
    D.destroy(graph);
    return e;
}

EXPORT int mr_build_graph(const mr_graph *g, const mr_kernels *k,
                          const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                          CUstream stream, CUgraphExec *exec_out, char *err, size_t errlen) {
    pthread_once(&once, load);
    if (!D.ok) {
        snprintf(err, errlen, "the CUDA driver's graph API was not found");
        return CUDA_ERROR_NOT_FOUND;
    }
    CUgraph graph;
    CUresult e = D.create(&graph, 0);
    if (e) {
        failed(err, errlen, "", "cuGraphCreate", e);
        return e;
    }
    for (uint32_t i = 0; !e && i < g->num_nodes; i++) {
        const char *why = check_node(g, &g->nodes[i], k);
        if (why) {
            e = CUDA_ERROR_INVALID_VALUE;
            snprintf(err, errlen, "node %u (type %u): %s", i, g->nodes[i].type, why);
        }
    }
    CUgraphNode *nodes = calloc(g->num_nodes ? g->num_nodes : 1, sizeof *nodes);
    mr_scratch scratch = {malloc(MR_MAX_PARAM_BYTES + 8), calloc(max_layout(k), sizeof(void *))};
    if (!e && (!nodes || !scratch.bytes || !scratch.ptrs)) {
        e = CUDA_ERROR_OUT_OF_MEMORY;
        snprintf(err, errlen, "out of host memory for %u nodes", g->num_nodes);
    }
    if (!e)
        e = add_all(g, k, graph, nodes, &scratch, bases, num_bases, err, errlen);
    free(nodes);
    free(scratch.bytes);
    free(scratch.ptrs);
    if (e) {
        D.destroy(graph);
        return e;
    }
    return instantiate(graph, stream, exec_out, err, errlen);
}
