/* Capture and graph hooks. When a capture ends, the graph it made is walked with the driver API and
 * written out: nodes with their parameters and attributes, and edges with their edge data. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define U(x) ((uint64_t)(uintptr_t)(x))

static void rec(medusa_event_type type, hook_id api, int res, uint64_t a, uint64_t b, uint64_t c,
                uint64_t d) {
    medusa_trace_record r = {.type = (uint16_t)type, .api = (uint16_t)api, .result = res,
                             .u = {a, b, c, d}};
    mi_emit(&r, NULL, 0, LIVE_NONE);
}

static const CUkernelNodeAttrID kept_attrs[] = {
    CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
    CU_LAUNCH_ATTRIBUTE_PRIORITY, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP,
    CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION,
    CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE};

static void dump_kernel(const mi_driver *d, medusa_trace_record *r, CUgraphNode node) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    if (!d->kernelNodeGetParams || d->kernelNodeGetParams(node, &p) != CUDA_SUCCESS) {
        mi_emit(r, NULL, 0, LIVE_NONE);
        return;
    }
    CUfunction f = p.func ? p.func : (CUfunction)p.kern;
    const mi_func_info *fi = mi_func(f);
    r->u[3] = U(f);
    r->u[4] = p.gridDimX | (uint64_t)p.gridDimY << 32;
    r->u[5] = p.gridDimZ | (uint64_t)p.blockDimX << 32;
    r->u[6] = p.blockDimY | (uint64_t)p.blockDimZ << 32;
    r->u[7] = p.sharedMemBytes;
    unsigned char stack[4096], *buf = fi->bytes > sizeof stack ? malloc(fi->bytes) : stack;
    size_t n = buf ? mi_param_bytes(fi, p.kernelParams, p.extra, buf,
                                    buf == stack ? sizeof stack : fi->bytes)
                   : 0;
    mi_emit(r, buf, n, LIVE_NONE);
    if (buf != stack)
        free(buf);
    static const CUkernelNodeAttrValue zero;
    for (size_t i = 0; d->kernelNodeGetAttribute && i < sizeof kept_attrs / sizeof *kept_attrs; i++) {
        CUkernelNodeAttrValue v;
        memset(&v, 0, sizeof v);
        if (d->kernelNodeGetAttribute(node, kept_attrs[i], &v) != CUDA_SUCCESS ||
            !memcmp(&v, &zero, sizeof v))
            continue;
        medusa_trace_record a = {.type = MEDUSA_EV_NODE_ATTR, .api = r->api,
                                 .u = {U(node), (uint64_t)kept_attrs[i]}};
        mi_emit(&a, &v, sizeof v, LIVE_NONE);
    }
}

static void dump_node(const mi_driver *d, hook_id api, CUgraph g, CUgraphNode node, size_t index) {
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
    if (d->nodeGetType)
        d->nodeGetType(node, &type);
    medusa_trace_record r = {.type = MEDUSA_EV_NODE, .api = (uint16_t)api,
                             .u = {U(g), U(node), (uint64_t)type | (uint64_t)index << 32}};
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
        dump_kernel(d, &r, node);
        return;
    }
    if (type == CU_GRAPH_NODE_TYPE_MEMCPY && d->memcpyNodeGetParams) {
        CUDA_MEMCPY3D c;
        memset(&c, 0, sizeof c);
        if (d->memcpyNodeGetParams(node, &c) == CUDA_SUCCESS) {
            uint64_t dst = c.dstMemoryType == CU_MEMORYTYPE_HOST ? U(c.dstHost) : c.dstDevice;
            uint64_t src = c.srcMemoryType == CU_MEMORYTYPE_HOST ? U(c.srcHost) : c.srcDevice;
            r.u[3] = dst + c.dstXInBytes, r.u[4] = src + c.srcXInBytes;
            r.u[5] = c.WidthInBytes, r.u[6] = c.Height | (uint64_t)c.Depth << 32;
            r.u[7] = (uint64_t)c.srcMemoryType | (uint64_t)c.dstMemoryType << 8;
        }
    } else if (type == CU_GRAPH_NODE_TYPE_MEMSET && d->memsetNodeGetParams) {
        CUDA_MEMSET_NODE_PARAMS m;
        memset(&m, 0, sizeof m);
        if (d->memsetNodeGetParams(node, &m) == CUDA_SUCCESS) {
            r.u[3] = m.dst, r.u[4] = m.value, r.u[5] = m.elementSize;
            r.u[6] = m.width, r.u[7] = m.height;
        }
    }
    mi_emit(&r, NULL, 0, LIVE_NONE);
}

void mi_dump_graph(hook_id api, void *stream, CUgraph g) {
    const mi_driver *d = mi_drv();
    size_t n = 0, m = 0;
    if (!d->graphGetNodes || d->graphGetNodes(g, NULL, &n) != CUDA_SUCCESS)
        return;
    CUgraphNode *nodes = calloc(n ? n : 1, sizeof *nodes);
    if (!nodes || d->graphGetNodes(g, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        return;
    }
    if (d->graphGetEdges)
        d->graphGetEdges(g, NULL, NULL, NULL, &m);
    CUgraphNode *from = calloc(m ? m : 1, sizeof *from), *to = calloc(m ? m : 1, sizeof *to);
    CUgraphEdgeData *ed = calloc(m ? m : 1, sizeof *ed);
    if (!from || !to || !ed || (m && d->graphGetEdges(g, from, to, ed, &m) != CUDA_SUCCESS))
        m = 0;
    /* NOTE: the capture end record comes first, with the counts, so a reader knows what follows. */
    rec(MEDUSA_EV_CAPTURE_END, api, 0, U(stream), U(g), n, m);
    for (size_t i = 0; i < n; i++)
        dump_node(d, api, g, nodes[i], i);
    for (size_t i = 0; i < m; i++) {
        medusa_trace_record r = {.type = MEDUSA_EV_EDGE, .api = (uint16_t)api,
                                 .u = {U(g), U(from[i]), U(to[i]), ed[i].from_port, ed[i].to_port,
                                       ed[i].type}};
        mi_emit(&r, NULL, 0, LIVE_NONE);
    }
    free(nodes), free(from), free(to), free(ed);
}

static void capture_begin(hook_id api, int res, void *stream, int mode) {
    if (res)
        return;
    __atomic_add_fetch(&mi_num_captures, 1, __ATOMIC_ACQ_REL);
    mi_note_device();
    medusa_trace_record r = {.type = MEDUSA_EV_CAPTURE_BEGIN, .api = (uint16_t)api, .result = res,
                             .u = {U(stream), (uint64_t)mode}};
    mi_emit(&r, NULL, 0, LIVE_NONE);
    mi_note_phase("", r.seq);
}

static void capture_end(hook_id api, int res, void *stream, void *graph) {
    if (__atomic_load_n(&mi_num_captures, __ATOMIC_ACQUIRE) > 0)
        __atomic_sub_fetch(&mi_num_captures, 1, __ATOMIC_ACQ_REL);
    if (res || !graph) {
        rec(MEDUSA_EV_CAPTURE_END, api, res, U(stream), 0, 0, 0);
    } else {
        mi_dump_graph(api, stream, (CUgraph)graph);
    }
    mi_flush();
}


/* v1 (CUDA 10.0) took no mode: it captures in global mode. */
MI_HOOK(CUresult, F_CAPTURE, cuStreamBeginCapture, (CUstream s), CALL_DRV(cuStreamBeginCapture, s),
        capture_begin(H_cuStreamBeginCapture, r_, s, CU_STREAM_CAPTURE_MODE_GLOBAL))
MI_HOOK(CUresult, F_CAPTURE, cuStreamBeginCapture_ptsz, (CUstream s),
        CALL_DRV(cuStreamBeginCapture_ptsz, s),
        capture_begin(H_cuStreamBeginCapture_ptsz, r_, s, CU_STREAM_CAPTURE_MODE_GLOBAL))
MI_HOOK(CUresult, F_CAPTURE, cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode m),
     CALL_DRV(cuStreamBeginCapture_v2, s, m), capture_begin(H_cuStreamBeginCapture_v2, r_, s, m))
MI_HOOK(CUresult, F_CAPTURE, cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode m),
     CALL_DRV(cuStreamBeginCapture_v2_ptsz, s, m),
     capture_begin(H_cuStreamBeginCapture_v2_ptsz, r_, s, m))
/* Capture into an existing graph: its end dumps the whole graph, what was there before included. */
#define BEGIN_TO_GRAPH(sym)                                                                        \
    MI_HOOK(CUresult, F_CAPTURE, sym,                                                              \
            (CUstream s, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *data, size_t n, \
             CUstreamCaptureMode m),                                                               \
            CALL_DRV(sym, s, g, deps, data, n, m), capture_begin(H_##sym, r_, s, m))
BEGIN_TO_GRAPH(cuStreamBeginCaptureToGraph)
BEGIN_TO_GRAPH(cuStreamBeginCaptureToGraph_ptsz)
MI_HOOK(CUresult, F_CAPTURE, cuStreamEndCapture, (CUstream s, CUgraph *g),
     CALL_DRV(cuStreamEndCapture, s, g), capture_end(H_cuStreamEndCapture, r_, s, g ? *g : NULL))
MI_HOOK(CUresult, F_CAPTURE, cuStreamEndCapture_ptsz, (CUstream s, CUgraph *g),
     CALL_DRV(cuStreamEndCapture_ptsz, s, g),
     capture_end(H_cuStreamEndCapture_ptsz, r_, s, g ? *g : NULL))
MI_HOOK(cudaError_t, F_CAPTURE, cudaStreamBeginCapture, (cudaStream_t s, enum cudaStreamCaptureMode m),
     CALL_RT(cudaStreamBeginCapture, s, m), capture_begin(H_cudaStreamBeginCapture, r_, s, m))
MI_HOOK(cudaError_t, F_CAPTURE, cudaStreamBeginCapture_ptsz,
     (cudaStream_t s, enum cudaStreamCaptureMode m), CALL_RT(cudaStreamBeginCapture_ptsz, s, m),
     capture_begin(H_cudaStreamBeginCapture_ptsz, r_, s, m))
MI_HOOK(cudaError_t, F_CAPTURE, cudaStreamEndCapture, (cudaStream_t s, cudaGraph_t *g),
     CALL_RT(cudaStreamEndCapture, s, g),
     capture_end(H_cudaStreamEndCapture, r_, s, g ? *g : NULL))
MI_HOOK(cudaError_t, F_CAPTURE, cudaStreamEndCapture_ptsz, (cudaStream_t s, cudaGraph_t *g),
     CALL_RT(cudaStreamEndCapture_ptsz, s, g),
     capture_end(H_cudaStreamEndCapture_ptsz, r_, s, g ? *g : NULL))

static void instantiated(hook_id api, int res, void *graph, void *exec, uint64_t flags) {
    rec(MEDUSA_EV_INSTANTIATE, api, res, U(graph), res ? 0 : U(exec), flags, 0);
    mi_flush();
}

/* The five-argument forms (an error node and a log buffer instead of flags). */
#define INSTANTIATE_V1(sym)                                                                        \
    MI_HOOK(CUresult, F_GRAPH, sym,                                                                \
            (CUgraphExec * e, CUgraph g, CUgraphNode * err, char *log, size_t log_size),            \
            CALL_DRV(sym, e, g, err, log, log_size), instantiated(H_##sym, r_, g, e ? *e : NULL, 0))
INSTANTIATE_V1(cuGraphInstantiate)
INSTANTIATE_V1(cuGraphInstantiate_v2)
MI_HOOK(CUresult, F_GRAPH, cuGraphInstantiateWithFlags,
     (CUgraphExec * e, CUgraph g, unsigned long long f), CALL_DRV(cuGraphInstantiateWithFlags, e, g, f),
     instantiated(H_cuGraphInstantiateWithFlags, r_, g, e ? *e : NULL, f))
MI_HOOK(CUresult, F_GRAPH, cuGraphInstantiateWithParams,
     (CUgraphExec * e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p),
     CALL_DRV(cuGraphInstantiateWithParams, e, g, p),
     instantiated(H_cuGraphInstantiateWithParams, r_, g, e ? *e : NULL, p ? p->flags : 0))
MI_HOOK(CUresult, F_GRAPH, cuGraphInstantiateWithParams_ptsz,
     (CUgraphExec * e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p),
     CALL_DRV(cuGraphInstantiateWithParams_ptsz, e, g, p),
     instantiated(H_cuGraphInstantiateWithParams_ptsz, r_, g, e ? *e : NULL, p ? p->flags : 0))
MI_HOOK(cudaError_t, F_GRAPH, cudaGraphInstantiate,
     (cudaGraphExec_t * e, cudaGraph_t g, unsigned long long f), CALL_RT(cudaGraphInstantiate, e, g, f),
     instantiated(H_cudaGraphInstantiate, r_, g, e ? *e : NULL, f))
MI_HOOK(cudaError_t, F_GRAPH, cudaGraphInstantiateWithFlags,
     (cudaGraphExec_t * e, cudaGraph_t g, unsigned long long f),
     CALL_RT(cudaGraphInstantiateWithFlags, e, g, f),
     instantiated(H_cudaGraphInstantiateWithFlags, r_, g, e ? *e : NULL, f))

MI_HOOK(CUresult, F_GRAPH, cuGraphLaunch, (CUgraphExec e, CUstream s), CALL_DRV(cuGraphLaunch, e, s),
     rec(MEDUSA_EV_GRAPH_LAUNCH, H_cuGraphLaunch, r_, U(e), U(s), 0, 0))
MI_HOOK(CUresult, F_GRAPH, cuGraphLaunch_ptsz, (CUgraphExec e, CUstream s),
     CALL_DRV(cuGraphLaunch_ptsz, e, s),
     rec(MEDUSA_EV_GRAPH_LAUNCH, H_cuGraphLaunch_ptsz, r_, U(e), U(s), 0, 0))
MI_HOOK(cudaError_t, F_GRAPH, cudaGraphLaunch, (cudaGraphExec_t e, cudaStream_t s),
     CALL_RT(cudaGraphLaunch, e, s),
     rec(MEDUSA_EV_GRAPH_LAUNCH, H_cudaGraphLaunch, r_, U(e), U(s), 0, 0))
MI_HOOK(cudaError_t, F_GRAPH, cudaGraphLaunch_ptsz, (cudaGraphExec_t e, cudaStream_t s),
     CALL_RT(cudaGraphLaunch_ptsz, e, s),
     rec(MEDUSA_EV_GRAPH_LAUNCH, H_cudaGraphLaunch_ptsz, r_, U(e), U(s), 0, 0))
