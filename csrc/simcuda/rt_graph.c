/* Runtime graph API over the driver entry points. */
#include <string.h>

#include "rt.h"

RT_API cudaError_t cudaGraphCreate(cudaGraph_t *g, unsigned int flags) { RT_CALL(rt_drv.graphCreate((CUgraph *)g, flags)); }
RT_API cudaError_t cudaGraphDestroy(cudaGraph_t g) { RT_CALL(rt_drv.graphDestroy((CUgraph)g)); }

static CUresult to_driver(const struct cudaKernelNodeParams *p, CUDA_KERNEL_NODE_PARAMS *d) {
    CUfunction f = rt_func_of_stub(p->func);
    if (!f)
        return (CUresult)cudaErrorInvalidDeviceFunction;
    memset(d, 0, sizeof *d);
    d->func = f;
    d->gridDimX = p->gridDim.x, d->gridDimY = p->gridDim.y, d->gridDimZ = p->gridDim.z;
    d->blockDimX = p->blockDim.x, d->blockDimY = p->blockDim.y, d->blockDimZ = p->blockDim.z;
    d->sharedMemBytes = p->sharedMemBytes;
    d->kernelParams = p->kernelParams;
    d->extra = p->extra;
    return CUDA_SUCCESS;
}

RT_API cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *n, cudaGraph_t g, const cudaGraphNode_t *deps,
                                          size_t nd, const struct cudaKernelNodeParams *p) {
    RT_INIT();
    CUDA_KERNEL_NODE_PARAMS d;
    CUresult e = p ? to_driver(p, &d) : CUDA_ERROR_INVALID_VALUE;
    if (!e)
        e = rt_drv.graphAddKernelNode((CUgraphNode *)n, (CUgraph)g, (const CUgraphNode *)deps, nd, &d);
    return rt_ret(e);
}

RT_API cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t n, struct cudaKernelNodeParams *p) {
    RT_INIT();
    CUDA_KERNEL_NODE_PARAMS d;
    CUresult e = p ? rt_drv.kernelNodeGetParams((CUgraphNode)n, &d) : CUDA_ERROR_INVALID_VALUE;
    if (e)
        return rt_ret(e);
    const void *stub = rt_stub_of_func(d.func);
    if (!stub) /* launched through the driver (a hidden library kernel): no host stub to give */
        return rt_set(cudaErrorInvalidDeviceFunction);
    p->func = (void *)stub;
    p->gridDim = (dim3){d.gridDimX, d.gridDimY, d.gridDimZ};
    p->blockDim = (dim3){d.blockDimX, d.blockDimY, d.blockDimZ};
    p->sharedMemBytes = d.sharedMemBytes;
    p->kernelParams = d.kernelParams;
    p->extra = d.extra;
    return cudaSuccess;
}

RT_API cudaError_t cudaGraphKernelNodeSetParams(cudaGraphNode_t n, const struct cudaKernelNodeParams *p) {
    RT_INIT();
    CUDA_KERNEL_NODE_PARAMS d;
    CUresult e = p ? to_driver(p, &d) : CUDA_ERROR_INVALID_VALUE;
    return rt_ret(e ? e : rt_drv.kernelNodeSetParams((CUgraphNode)n, &d));
}

RT_API cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t x, cudaGraphNode_t n,
                                                    const struct cudaKernelNodeParams *p) {
    RT_INIT();
    CUDA_KERNEL_NODE_PARAMS d;
    CUresult e = p ? to_driver(p, &d) : CUDA_ERROR_INVALID_VALUE;
    return rt_ret(e ? e : rt_drv.execKernelNodeSetParams((CUgraphExec)x, (CUgraphNode)n, &d));
}

RT_API cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *n, cudaGraph_t g, const cudaGraphNode_t *deps,
                                            size_t nd, void *dst, const void *src, size_t count,
                                            enum cudaMemcpyKind kind) {
    RT_INIT();
    if ((unsigned)kind > cudaMemcpyDefault)
        return rt_set(cudaErrorInvalidMemcpyDirection);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    c.srcDevice = (CUdeviceptr)src;
    c.dstDevice = (CUdeviceptr)dst;
    c.WidthInBytes = c.srcPitch = c.dstPitch = count;
    c.Height = c.Depth = c.srcHeight = c.dstHeight = 1;
    RT_CALL(rt_drv.graphAddMemcpyNode((CUgraphNode *)n, (CUgraph)g, (const CUgraphNode *)deps, nd, &c, NULL));
}

RT_API cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *n, cudaGraph_t g, const cudaGraphNode_t *deps,
                                          size_t nd, const struct cudaMemsetParams *p) {
    RT_INIT();
    if (!p)
        return rt_set(cudaErrorInvalidValue);
    CUDA_MEMSET_NODE_PARAMS m = {(CUdeviceptr)p->dst, p->pitch, p->value, p->elementSize, p->width, p->height};
    RT_CALL(rt_drv.graphAddMemsetNode((CUgraphNode *)n, (CUgraph)g, (const CUgraphNode *)deps, nd, &m, NULL));
}

RT_API cudaError_t cudaGraphAddHostNode(cudaGraphNode_t *n, cudaGraph_t g, const cudaGraphNode_t *deps,
                                        size_t nd, const struct cudaHostNodeParams *p) {
    RT_CALL(rt_drv.graphAddHostNode((CUgraphNode *)n, (CUgraph)g, (const CUgraphNode *)deps, nd,
                                    (const CUDA_HOST_NODE_PARAMS *)p));
}

RT_API cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *n, cudaGraph_t g, const cudaGraphNode_t *deps, size_t nd) {
    RT_CALL(rt_drv.graphAddEmptyNode((CUgraphNode *)n, (CUgraph)g, (const CUgraphNode *)deps, nd));
}

RT_API cudaError_t cudaGraphAddDependencies(cudaGraph_t g, const cudaGraphNode_t *from, const cudaGraphNode_t *to,
                                            const cudaGraphEdgeData *ed, size_t n) {
    RT_CALL(rt_drv.graphAddDependencies((CUgraph)g, (const CUgraphNode *)from, (const CUgraphNode *)to,
                                        (const CUgraphEdgeData *)ed, n));
}

RT_API cudaError_t cudaGraphGetNodes(cudaGraph_t g, cudaGraphNode_t *nodes, size_t *n) {
    RT_CALL(rt_drv.graphGetNodes((CUgraph)g, (CUgraphNode *)nodes, n));
}

RT_API cudaError_t cudaGraphGetEdges(cudaGraph_t g, cudaGraphNode_t *from, cudaGraphNode_t *to,
                                     cudaGraphEdgeData *ed, size_t *n) {
    RT_CALL(rt_drv.graphGetEdges((CUgraph)g, (CUgraphNode *)from, (CUgraphNode *)to, (CUgraphEdgeData *)ed, n));
}

RT_API cudaError_t cudaGraphNodeGetType(cudaGraphNode_t n, enum cudaGraphNodeType *t) {
    RT_CALL(rt_drv.graphNodeGetType((CUgraphNode)n, (CUgraphNodeType *)t));
}

RT_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
    RT_CALL(rt_drv.graphInstantiate((CUgraphExec *)x, (CUgraph)g, flags));
}
RT_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
    return cudaGraphInstantiate(x, g, flags);
}

RT_API cudaError_t cudaGraphUpload(cudaGraphExec_t x, cudaStream_t s) { RT_CALL(rt_drv.graphUpload[0]((CUgraphExec)x, (CUstream)s)); }
RT_API cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t x, cudaStream_t s) { RT_CALL(rt_drv.graphUpload[1]((CUgraphExec)x, (CUstream)s)); }
RT_API cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s) { RT_CALL(rt_drv.graphLaunch[0]((CUgraphExec)x, (CUstream)s)); }
RT_API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t x, cudaStream_t s) { RT_CALL(rt_drv.graphLaunch[1]((CUgraphExec)x, (CUstream)s)); }

RT_API cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    RT_CALL(rt_drv.graphExecUpdate((CUgraphExec)x, (CUgraph)g, (CUgraphExecUpdateResultInfo *)info));
}

RT_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) { RT_CALL(rt_drv.graphExecDestroy((CUgraphExec)x)); }
