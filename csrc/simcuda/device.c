/* Device and context: one simulated device whose properties come from the environment. */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The one primary context; its address is the CUcontext handle. */
static int g_primary_ctx;
static __thread CUcontext t_current;

#define CHECK_DEV(d)                                                                               \
    do {                                                                                           \
        CUresult e_ = sim_ensure_init();                                                           \
        if (e_)                                                                                    \
            return e_;                                                                             \
        if ((d) != 0)                                                                              \
            return CUDA_ERROR_INVALID_DEVICE;                                                      \
    } while (0)

SIM_API CUresult cuDeviceGetCount(int *count) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CHECK_DEV(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", g_sim.cfg.name);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    CHECK_DEV(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = g_sim.cfg.total_mem;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    CHECK_DEV(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(uuid->bytes, g_sim.cfg.uuid, 16);
    return CUDA_SUCCESS;
}

int sim_device_attribute(CUdevice_attribute a) {
    const sim_config *c = &g_sim.cfg;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 227 * 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return c->sms;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return c->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return c->cc_minor;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x19 + g_sim.cfg.board; /* one bus per board */
    default: return 0;
    }
}

SIM_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pi || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = sim_device_attribute(attrib);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CHECK_DEV(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)&g_primary_ctx;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    CHECK_DEV(dev);
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = t_current;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (ctx && ctx != (CUcontext)&g_primary_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_current = ctx;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxGetDevice(CUdevice *dev) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (!t_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = 0;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSynchronize(void) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    CUresult r = CUDA_SUCCESS;
    if (g_sim.num_captures > 0) {
        sim_capture_invalidate_all();
        r = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "device synchronization while a stream is capturing");
    } else {
        r = sim_wait_all();
    }
    sim_unlock();
    return r;
}
