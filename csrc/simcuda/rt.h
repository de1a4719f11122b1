/* The runtime half of simcuda. Like the real libcudart, it reaches the driver only through the
 * entry points cuGetProcAddress hands it (found with dlsym on the driver library), so an
 * interposer in front of the process sees every driver call the runtime makes. */
#ifndef SIMCUDA_RT_H
#define SIMCUDA_RT_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "simcuda/simcuda.h"

#define RT_API __attribute__((visibility("default")))

/* field, driver name, type; RT_DRIVER_PTSZ entries are also fetched with per-thread semantics. */
#define RT_DRIVER(X)                                                                               \
    X(init, cuInit, PFN_cuInit_v2000)                                                              \
    X(driverGetVersion, cuDriverGetVersion, PFN_cuDriverGetVersion_v2020)                          \
    X(deviceGetCount, cuDeviceGetCount, PFN_cuDeviceGetCount_v2000)                                \
    X(deviceGetName, cuDeviceGetName, PFN_cuDeviceGetName_v2000)                                   \
    X(deviceTotalMem, cuDeviceTotalMem, PFN_cuDeviceTotalMem_v3020)                                \
    X(deviceGetAttribute, cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                    \
    X(primaryCtxRetain, cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000)              \
    X(ctxSetCurrent, cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                                   \
    X(ctxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000)                                \
    X(libraryLoadData, cuLibraryLoadData, PFN_cuLibraryLoadData_v12000)                            \
    X(libraryGetKernel, cuLibraryGetKernel, PFN_cuLibraryGetKernel_v12000)                         \
    X(kernelGetFunction, cuKernelGetFunction, PFN_cuKernelGetFunction_v12000)                      \
    X(memAlloc, cuMemAlloc, PFN_cuMemAlloc_v3020)                                                  \
    X(memFree, cuMemFree, PFN_cuMemFree_v3020)                                                     \
    X(memGetInfo, cuMemGetInfo, PFN_cuMemGetInfo_v3020)                                            \
    X(memHostAlloc, cuMemHostAlloc, PFN_cuMemHostAlloc_v2020)                                      \
    X(memFreeHost, cuMemFreeHost, PFN_cuMemFreeHost_v2000)                                         \
    X(memHostRegister, cuMemHostRegister, PFN_cuMemHostRegister_v6050)                             \
    X(memHostUnregister, cuMemHostUnregister, PFN_cuMemHostUnregister_v4000)                       \
    X(memHostGetDevicePointer, cuMemHostGetDevicePointer, PFN_cuMemHostGetDevicePointer_v3020)     \
    X(pointerGetAttribute, cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                 \
    X(streamCreate, cuStreamCreateWithPriority, PFN_cuStreamCreateWithPriority_v5050)              \
    X(streamDestroy, cuStreamDestroy, PFN_cuStreamDestroy_v4000)                                   \
    X(eventCreate, cuEventCreate, PFN_cuEventCreate_v2000)                                         \
    X(eventSynchronize, cuEventSynchronize, PFN_cuEventSynchronize_v2000)                          \
    X(eventQuery, cuEventQuery, PFN_cuEventQuery_v2000)                                            \
    X(eventElapsedTime, cuEventElapsedTime, PFN_cuEventElapsedTime_v2000)                          \
    X(eventDestroy, cuEventDestroy, PFN_cuEventDestroy_v4000)                                      \
    X(exchangeCaptureMode, cuThreadExchangeStreamCaptureMode,                                      \
      PFN_cuThreadExchangeStreamCaptureMode_v10010)                                                \
    X(funcSetAttribute, cuFuncSetAttribute, PFN_cuFuncSetAttribute_v9000)                          \
    X(funcGetName, cuFuncGetName, PFN_cuFuncGetName_v12030)                                        \
    X(graphCreate, cuGraphCreate, PFN_cuGraphCreate_v10000)                                        \
    X(graphDestroy, cuGraphDestroy, PFN_cuGraphDestroy_v10000)                                     \
    X(graphAddKernelNode, cuGraphAddKernelNode, PFN_cuGraphAddKernelNode_v12000)                   \
    X(graphAddMemcpyNode, cuGraphAddMemcpyNode, PFN_cuGraphAddMemcpyNode_v10000)                   \
    X(graphAddMemsetNode, cuGraphAddMemsetNode, PFN_cuGraphAddMemsetNode_v10000)                   \
    X(graphAddEmptyNode, cuGraphAddEmptyNode, PFN_cuGraphAddEmptyNode_v10000)                      \
    X(graphAddHostNode, cuGraphAddHostNode, PFN_cuGraphAddHostNode_v10000)                         \
    X(graphAddDependencies, cuGraphAddDependencies, PFN_cuGraphAddDependencies_v12030)             \
    X(graphGetNodes, cuGraphGetNodes, PFN_cuGraphGetNodes_v10000)                                  \
    X(graphGetEdges, cuGraphGetEdges, PFN_cuGraphGetEdges_v12030)                                  \
    X(graphNodeGetType, cuGraphNodeGetType, PFN_cuGraphNodeGetType_v10000)                         \
    X(kernelNodeGetParams, cuGraphKernelNodeGetParams, PFN_cuGraphKernelNodeGetParams_v12000)      \
    X(kernelNodeSetParams, cuGraphKernelNodeSetParams, PFN_cuGraphKernelNodeSetParams_v12000)      \
    X(graphInstantiate, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040)       \
    X(execKernelNodeSetParams, cuGraphExecKernelNodeSetParams,                                     \
      PFN_cuGraphExecKernelNodeSetParams_v12000)                                                   \
    X(graphExecUpdate, cuGraphExecUpdate, PFN_cuGraphExecUpdate_v12000)                            \
    X(graphExecDestroy, cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000)

#define RT_DRIVER_PTSZ(X)                                                                          \
    X(memAllocAsync, cuMemAllocAsync, PFN_cuMemAllocAsync_v11020)                                  \
    X(memFreeAsync, cuMemFreeAsync, PFN_cuMemFreeAsync_v11020)                                     \
    X(memcpy, cuMemcpy, PFN_cuMemcpy_v4000)                                                        \
    X(memcpyAsync, cuMemcpyAsync, PFN_cuMemcpyAsync_v4000)                                         \
    X(memsetD8, cuMemsetD8, PFN_cuMemsetD8_v3020)                                                  \
    X(memsetD8Async, cuMemsetD8Async, PFN_cuMemsetD8Async_v3020)                                   \
    X(memsetD2D8, cuMemsetD2D8, PFN_cuMemsetD2D8_v3020)                                            \
    X(memsetD2D8Async, cuMemsetD2D8Async, PFN_cuMemsetD2D8Async_v3020)                             \
    X(streamSynchronize, cuStreamSynchronize, PFN_cuStreamSynchronize_v2000)                       \
    X(streamQuery, cuStreamQuery, PFN_cuStreamQuery_v2000)                                         \
    X(streamWaitEvent, cuStreamWaitEvent, PFN_cuStreamWaitEvent_v3020)                             \
    X(eventRecord, cuEventRecord, PFN_cuEventRecord_v2000)                                         \
    X(beginCapture, cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10010)                         \
    X(endCapture, cuStreamEndCapture, PFN_cuStreamEndCapture_v10000)                               \
    X(isCapturing, cuStreamIsCapturing, PFN_cuStreamIsCapturing_v10000)                            \
    X(getCaptureInfo, cuStreamGetCaptureInfo, PFN_cuStreamGetCaptureInfo_v12030)                   \
    X(launchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000)                                      \
    X(launchKernelEx, cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060)                               \
    X(launchHostFunc, cuLaunchHostFunc, PFN_cuLaunchHostFunc_v10000)                               \
    X(graphUpload, cuGraphUpload, PFN_cuGraphUpload_v11010)                                        \
    X(graphLaunch, cuGraphLaunch, PFN_cuGraphLaunch_v10000)

typedef struct rt_driver {
#define RT_FIELD(f, n, t) t f;
#define RT_FIELD2(f, n, t) t f[2]; /* [0] legacy default stream, [1] per-thread */
    RT_DRIVER(RT_FIELD)
    RT_DRIVER_PTSZ(RT_FIELD2)
#undef RT_FIELD
#undef RT_FIELD2
    PFN_cuGetProcAddress_v12000 getProcAddress;
} rt_driver;

extern rt_driver rt_drv;

/* Initializes the runtime on first use (driver lookup, cuInit, primary context, modules). */
cudaError_t rt_init(void);
/* Records err as this thread's last error and returns it. */
cudaError_t rt_ret(CUresult err);
cudaError_t rt_set(cudaError_t err);
/* The CUfunction of a host stub (its CUkernel made a function on first use, as cudaGetFuncBySymbol). */
CUfunction rt_func_of_stub(const void *stub);
CUkernel rt_kernel_of_stub(const void *stub);
const void *rt_stub_of_func(CUfunction f);

#define RT_INIT()                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = rt_init();                                                                \
        if (e_)                                                                                    \
            return rt_set(e_);                                                                     \
    } while (0)

#define RT_CALL(expr)                                                                              \
    do {                                                                                           \
        RT_INIT();                                                                                 \
        return rt_ret(expr);                                                                       \
    } while (0)

#endif
