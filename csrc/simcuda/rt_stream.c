/* Runtime streams, events, capture and kernel launch over the driver entry points. */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "rt.h"

RT_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int prio) {
    RT_CALL(rt_drv.streamCreate((CUstream *)s, flags, prio));
}
RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    return cudaStreamCreateWithPriority(s, flags, 0);
}
RT_API cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }
RT_API cudaError_t cudaStreamDestroy(cudaStream_t s) { RT_CALL(rt_drv.streamDestroy((CUstream)s)); }

#define RT_PT(name, params, call0, call1)                                                          \
    RT_API cudaError_t name params { RT_CALL(call0); }                                             \
    RT_API cudaError_t name##_ptsz params { RT_CALL(call1); }

RT_PT(cudaStreamSynchronize, (cudaStream_t s), rt_drv.streamSynchronize[0]((CUstream)s),
      rt_drv.streamSynchronize[1]((CUstream)s))
RT_PT(cudaStreamQuery, (cudaStream_t s), rt_drv.streamQuery[0]((CUstream)s), rt_drv.streamQuery[1]((CUstream)s))
RT_PT(cudaStreamWaitEvent, (cudaStream_t s, cudaEvent_t e, unsigned int f),
      rt_drv.streamWaitEvent[0]((CUstream)s, (CUevent)e, f), rt_drv.streamWaitEvent[1]((CUstream)s, (CUevent)e, f))
RT_PT(cudaEventRecord, (cudaEvent_t e, cudaStream_t s), rt_drv.eventRecord[0]((CUevent)e, (CUstream)s),
      rt_drv.eventRecord[1]((CUevent)e, (CUstream)s))
RT_PT(cudaStreamBeginCapture, (cudaStream_t s, enum cudaStreamCaptureMode m),
      rt_drv.beginCapture[0]((CUstream)s, (CUstreamCaptureMode)m),
      rt_drv.beginCapture[1]((CUstream)s, (CUstreamCaptureMode)m))
RT_PT(cudaStreamEndCapture, (cudaStream_t s, cudaGraph_t *g), rt_drv.endCapture[0]((CUstream)s, (CUgraph *)g),
      rt_drv.endCapture[1]((CUstream)s, (CUgraph *)g))
RT_PT(cudaStreamIsCapturing, (cudaStream_t s, enum cudaStreamCaptureStatus *st),
      rt_drv.isCapturing[0]((CUstream)s, (CUstreamCaptureStatus *)st),
      rt_drv.isCapturing[1]((CUstream)s, (CUstreamCaptureStatus *)st))
RT_PT(cudaStreamGetCaptureInfo,
      (cudaStream_t s, enum cudaStreamCaptureStatus *st, unsigned long long *id, cudaGraph_t *g,
       const cudaGraphNode_t **d, const cudaGraphEdgeData **ed, size_t *n),
      rt_drv.getCaptureInfo[0]((CUstream)s, (CUstreamCaptureStatus *)st, (cuuint64_t *)id, (CUgraph *)g,
                               (const CUgraphNode **)d, (const CUgraphEdgeData **)ed, n),
      rt_drv.getCaptureInfo[1]((CUstream)s, (CUstreamCaptureStatus *)st, (cuuint64_t *)id, (CUgraph *)g,
                               (const CUgraphNode **)d, (const CUgraphEdgeData **)ed, n))

RT_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *m) {
    RT_CALL(rt_drv.exchangeCaptureMode((CUstreamCaptureMode *)m));
}

RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    RT_CALL(rt_drv.eventCreate((CUevent *)e, flags));
}
RT_API cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
RT_API cudaError_t cudaEventDestroy(cudaEvent_t e) { RT_CALL(rt_drv.eventDestroy((CUevent)e)); }
RT_API cudaError_t cudaEventSynchronize(cudaEvent_t e) { RT_CALL(rt_drv.eventSynchronize((CUevent)e)); }
RT_API cudaError_t cudaEventQuery(cudaEvent_t e) { RT_CALL(rt_drv.eventQuery((CUevent)e)); }
RT_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    RT_CALL(rt_drv.eventElapsedTime(ms, (CUevent)a, (CUevent)b));
}

RT_PT(cudaLaunchHostFunc, (cudaStream_t s, cudaHostFn_t fn, void *d),
      rt_drv.launchHostFunc[0]((CUstream)s, (CUhostFn)fn, d),
      rt_drv.launchHostFunc[1]((CUstream)s, (CUhostFn)fn, d))

/* ---- kernels by host stub ---- */
/* NOTE: the runtime checks a launch's dimensions itself: a zero grid or block, or a block over
 * 1024 threads (the limits of every device since sm_20), is cudaErrorInvalidConfiguration
 * ("invalid configuration argument"), where the driver's cuLaunchKernel answers
 * CUDA_ERROR_INVALID_VALUE. */
static bool bad_config(dim3 g, dim3 b) {
    return !g.x || !g.y || !g.z || !b.x || !b.y || !b.z || g.x > INT_MAX || g.y > 65535 ||
           g.z > 65535 || b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > 1024;
}

static cudaError_t launch(const void *stub, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s, int pt) {
    RT_INIT();
    CUfunction f = rt_func_of_stub(stub);
    if (!f)
        return rt_set(cudaErrorInvalidDeviceFunction);
    if (bad_config(g, b))
        return rt_set(cudaErrorInvalidConfiguration);
    return rt_ret(rt_drv.launchKernel[pt](f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)smem, (CUstream)s, args, NULL));
}

RT_API cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s) {
    return launch(f, g, b, args, smem, s, 0);
}
RT_API cudaError_t cudaLaunchKernel_ptsz(const void *f, dim3 g, dim3 b, void **args, size_t smem, cudaStream_t s) {
    return launch(f, g, b, args, smem, s, 1);
}

static cudaError_t launch_ex(const cudaLaunchConfig_t *c, const void *stub, void **args, int pt) {
    RT_INIT();
    if (!c)
        return rt_set(cudaErrorInvalidValue);
    CUfunction f = rt_func_of_stub(stub);
    if (!f)
        return rt_set(cudaErrorInvalidDeviceFunction);
    if (bad_config(c->gridDim, c->blockDim))
        return rt_set(cudaErrorInvalidConfiguration);
    CUlaunchConfig dc = {c->gridDim.x, c->gridDim.y, c->gridDim.z, c->blockDim.x, c->blockDim.y,
                         c->blockDim.z, (unsigned)c->dynamicSmemBytes, (CUstream)c->stream,
                         (CUlaunchAttribute *)c->attrs, c->numAttrs};
    return rt_ret(rt_drv.launchKernelEx[pt](&dc, f, args, NULL));
}

RT_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *c, const void *f, void **args) {
    return launch_ex(c, f, args, 0);
}
RT_API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *c, const void *f, void **args) {
    return launch_ex(c, f, args, 1);
}

RT_API cudaError_t cudaGetFuncBySymbol(cudaFunction_t *out, const void *stub) {
    RT_INIT();
    CUfunction f = rt_func_of_stub(stub);
    if (!out)
        return rt_set(cudaErrorInvalidValue);
    if (!f)
        return rt_set(cudaErrorInvalidDeviceFunction);
    *out = (cudaFunction_t)f;
    return cudaSuccess;
}

/* The context-less CUkernel behind a stub (12.1); cudaGetFuncBySymbol gives its CUfunction. */
RT_API cudaError_t cudaGetKernel(cudaKernel_t *out, const void *stub) {
    RT_INIT();
    CUkernel k = rt_kernel_of_stub(stub);
    if (!out)
        return rt_set(cudaErrorInvalidValue);
    if (!k)
        return rt_set(cudaErrorInvalidDeviceFunction);
    *out = (cudaKernel_t)k;
    return cudaSuccess;
}

RT_API cudaError_t cudaFuncGetName(const char **name, const void *stub) {
    RT_INIT();
    CUfunction f = rt_func_of_stub(stub);
    if (!f)
        return rt_set(cudaErrorInvalidDeviceFunction);
    return rt_ret(rt_drv.funcGetName(name, f));
}

RT_API cudaError_t cudaFuncSetAttribute(const void *stub, enum cudaFuncAttribute a, int v) {
    RT_INIT();
    CUfunction f = rt_func_of_stub(stub);
    if (!f)
        return rt_set(cudaErrorInvalidDeviceFunction);
    CUfunction_attribute da = a == cudaFuncAttributeMaxDynamicSharedMemorySize
                                  ? CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                              : a == cudaFuncAttributePreferredSharedMemoryCarveout
                                  ? CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
                                  : CU_FUNC_ATTRIBUTE_MAX;
    return rt_ret(rt_drv.funcSetAttribute(f, da, v));
}
