/* The driver calls the recorder makes itself. They are looked up with the real cuGetProcAddress,
 * so they never pass through a hook, and the recorder's own work is never recorded. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static mi_driver g_drv;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
int mi_num_captures;

static PFN_cuGetProcAddress_v12000 real_getproc(void) {
    void *f = mi_real(H_cuGetProcAddress_v2);
    if (!f) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        f = h ? mi_real_dlsym(h, "cuGetProcAddress_v2") : NULL;
    }
    return (PFN_cuGetProcAddress_v12000)f;
}

static void load(void) {
    PFN_cuGetProcAddress_v12000 gp = real_getproc();
    if (!gp)
        return;
    CUdriverProcAddressQueryResult st;
#define GET(field, name, ver, flags)                                                               \
    if (gp(name, (void **)&g_drv.field, ver, flags, &st) != CUDA_SUCCESS)                          \
        g_drv.field = NULL;
    GET(graphGetNodes, "cuGraphGetNodes", 10000, 0)
    GET(nodeGetType, "cuGraphNodeGetType", 10000, 0)
    GET(kernelNodeGetParams, "cuGraphKernelNodeGetParams", 12000, 0)
    GET(kernelNodeGetAttribute, "cuGraphKernelNodeGetAttribute", 11000, 0)
    GET(memcpyNodeGetParams, "cuGraphMemcpyNodeGetParams", 10000, 0)
    GET(memsetNodeGetParams, "cuGraphMemsetNodeGetParams", 10000, 0)
    GET(graphGetEdges, "cuGraphGetEdges", 12030, 0)
    GET(captureInfo[0], "cuStreamGetCaptureInfo", 12030, CU_GET_PROC_ADDRESS_LEGACY_STREAM)
    GET(captureInfo[1], "cuStreamGetCaptureInfo", 12030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
    GET(funcGetParamInfo, "cuFuncGetParamInfo", 12040, 0)
    GET(funcGetName, "cuFuncGetName", 12030, 0)
    GET(kernelGetLibrary, "cuKernelGetLibrary", 12050, 0)
    GET(funcGetModule, "cuFuncGetModule", 11000, 0)
    GET(kernelGetParamInfo, "cuKernelGetParamInfo", 12040, 0)
    GET(kernelGetFunction, "cuKernelGetFunction", 12000, 0)
    GET(libraryGetModule, "cuLibraryGetModule", 12000, 0)
    GET(ctxGetDevice, "cuCtxGetDevice", 2000, 0)
    GET(deviceGetName, "cuDeviceGetName", 2000, 0)
    GET(deviceTotalMem, "cuDeviceTotalMem", 3020, 0)
    GET(deviceGetAttribute, "cuDeviceGetAttribute", 2000, 0)
    GET(driverGetVersion, "cuDriverGetVersion", 2020, 0)
    GET(deviceGetUuid, "cuDeviceGetUuid", 11040, 0)
    GET(hostGetDevicePointer, "cuMemHostGetDevicePointer", 3020, 0)
    GET(memAlloc, "cuMemAlloc", 3020, 0)
    GET(memcpyDtoH, "cuMemcpyDtoH", 3020, 0)
    GET(ctxSynchronize, "cuCtxSynchronize", 2000, 0)
#undef GET
}

const mi_driver *mi_drv(void) {
    pthread_once(&g_once, load);
    return &g_drv;
}

CUgraphNode mi_captured_node(CUstream s, bool ptsz) {
    const mi_driver *d = mi_drv();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUgraphNode *deps = NULL;
    size_t n = 0;
    if (!d->captureInfo[ptsz] ||
        d->captureInfo[ptsz](s, &status, NULL, NULL, &deps, NULL, &n) != CUDA_SUCCESS)
        return NULL;
    return status == CU_STREAM_CAPTURE_STATUS_ACTIVE && n == 1 ? deps[0] : NULL;
}

static int g_shifted;

/* NOTE: the pad must come before the first allocation, not after it: memory freed and handed out
 * again before the pad would keep its address in both recordings, and pointers into it would pass
 * for constants. A runtime allocation may be the process's first CUDA call, so the runtime is
 * brought up first (cudaFree(NULL), the usual idiom) to give the driver call a context. */
void mi_before_device_alloc(bool runtime) {
    if (__atomic_load_n(&g_shifted, __ATOMIC_ACQUIRE) ||
        __atomic_exchange_n(&g_shifted, 1, __ATOMIC_ACQ_REL))
        return;
    const char *env = getenv("MEDUSA_TRACE_SHIFT");
    unsigned long long n = env ? strtoull(env, NULL, 0) : 0;
    if (!n)
        return;
    cudaError_t (*rt_free)(void *) = runtime ? (cudaError_t(*)(void *))mi_real(H_cudaFree) : NULL;
    if (rt_free)
        rt_free(NULL);
    CUdeviceptr pad;
    if (!mi_drv()->memAlloc || mi_drv()->memAlloc(&pad, (size_t)n) != CUDA_SUCCESS)
        mi_log("MEDUSA_TRACE_SHIFT=%llu: the shift allocation failed; addresses are not shifted", n);
}

static int g_device_noted;

void mi_note_device(void) {
    if (__atomic_load_n(&g_device_noted, __ATOMIC_ACQUIRE))
        return;
    const mi_driver *d = mi_drv();
    CUdevice dev;
    if (!d->ctxGetDevice || d->ctxGetDevice(&dev) != CUDA_SUCCESS)
        return;
    if (__atomic_exchange_n(&g_device_noted, 1, __ATOMIC_ACQ_REL))
        return;
    char blob[256 + 16] = {0};
    size_t total = 0;
    int major = 0, minor = 0, sms = 0, drv = 0, rt = 0;
    if (d->deviceGetName)
        d->deviceGetName(blob, 255, dev);
    if (d->deviceTotalMem)
        d->deviceTotalMem(&total, dev);
    if (d->deviceGetAttribute) {
        d->deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        d->deviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        d->deviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    }
    if (d->driverGetVersion)
        d->driverGetVersion(&drv);
    cudaError_t (*rtver)(int *) = (cudaError_t(*)(int *))mi_sibling(H_cudaMalloc, "cudaRuntimeGetVersion");
    if (rtver)
        rtver(&rt);
    size_t nl = strlen(blob) + 1;
    CUuuid uuid = {{0}};
    if (d->deviceGetUuid)
        d->deviceGetUuid(&uuid, dev);
    memcpy(blob + nl, uuid.bytes, 16);
    medusa_trace_record r = {.type = MEDUSA_EV_DEVICE,
                             .u = {(uint64_t)dev, total, (uint64_t)major, (uint64_t)minor,
                                   (uint64_t)drv, (uint64_t)rt, (uint64_t)sms}};
    mi_emit(&r, blob, nl + 16, LIVE_NONE);
}
