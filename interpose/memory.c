/* Memory hooks: device allocations (sync and async), host allocations, VMM. A free is recorded just
 * before the call, because the address may be handed out again as soon as the call returns. */
#include "internal.h"

#define U(x) ((uint64_t)(uintptr_t)(x))

static void rec(medusa_event_type type, hook_id api, int result, uint64_t a, uint64_t b, uint64_t c,
                uint64_t d, live_op op) {
    medusa_trace_record r = {.type = (uint16_t)type, .api = (uint16_t)api, .result = result,
                             .u = {a, b, c, d}};
    mi_emit(&r, NULL, 0, op);
}

static void rec_alloc(hook_id api, int res, uint64_t addr, size_t size, void *stream, uint64_t flags) {
    rec(MEDUSA_EV_ALLOC, api, res, res ? 0 : addr, size, U(stream), flags, LIVE_ADD);
    if (!res)
        mi_note_device();
}

static void rec_free(hook_id api, uint64_t addr, void *stream) {
    if (addr)
        rec(MEDUSA_EV_FREE, api, 0, addr, 0, U(stream), 0, LIVE_DEL);
}

static uint64_t mapped(void *host, unsigned flags) {
    CUdeviceptr d = 0;
    const mi_driver *drv = mi_drv();
    if (host && drv->hostGetDevicePointer && drv->hostGetDevicePointer(&d, host, 0) != CUDA_SUCCESS)
        d = 0;
    (void)flags;
    return d;
}

/* Registered host memory is an allocation too: graphs may point into it, restore relocates it. */
static void rec_host(medusa_event_type type, hook_id api, int res, void *host, size_t size,
                     unsigned flags) {
    rec(type, api, res, res ? 0 : U(host), size, flags, res ? 0 : mapped(host, flags), LIVE_ADD);
}

/* Unlike a free, an unregister is recorded after the call, and only if it succeeded: the memory is
 * the program's own (no allocator hands the address out again meanwhile), and a failed unregister
 * (inside a registration, during a capture) ends nothing. */
static void rec_unregister(hook_id api, int res, void *host) {
    if (!res)
        rec(MEDUSA_EV_HOST_FREE, api, 0, U(host), 0, 0, 0, LIVE_DEL);
}

#define HOOK(ret, sym, params, call, record) MI_HOOK(ret, F_MEM, sym, params, call, record)
/* A device allocation: the second recording's address shift goes in before the first of them. */
#define HOOK_ALLOC(ret, sym, params, runtime, call, record)                                        \
    MI_HOOK(ret, F_MEM, sym, params,                                                               \
            (g_.rec ? mi_before_device_alloc(runtime) : (void)0, call), record)
#define HOOK_FREE(ret, sym, params, call, before)                                                  \
    MI_EXPORT ret sym params {                                                                     \
        mi_gate g_ = mi_enter(F_MEM);                                                              \
        if (g_.rec) {                                                                              \
            before;                                                                                \
        }                                                                                          \
        ret r_ = call;                                                                             \
        mi_leave(g_);                                                                              \
        return r_;                                                                                 \
    }

/* ---- driver ---- */
HOOK_ALLOC(CUresult, cuMemAlloc_v2, (CUdeviceptr * p, size_t n), false,
           CALL_DRV(cuMemAlloc_v2, p, n),
     rec_alloc(H_cuMemAlloc_v2, r_, p ? *p : 0, n, NULL, 0))
HOOK_FREE(CUresult, cuMemFree_v2, (CUdeviceptr p), CALL_DRV(cuMemFree_v2, p),
          rec_free(H_cuMemFree_v2, p, NULL))
HOOK_ALLOC(CUresult, cuMemAllocAsync, (CUdeviceptr * p, size_t n, CUstream s), false,
     CALL_DRV(cuMemAllocAsync, p, n, s),
     rec_alloc(H_cuMemAllocAsync, r_, p ? *p : 0, n, s, MEDUSA_ALLOC_ASYNC))
HOOK_ALLOC(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * p, size_t n, CUstream s), false,
     CALL_DRV(cuMemAllocAsync_ptsz, p, n, s),
     rec_alloc(H_cuMemAllocAsync_ptsz, r_, p ? *p : 0, n, s, MEDUSA_ALLOC_ASYNC))
HOOK_FREE(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream s), CALL_DRV(cuMemFreeAsync, p, s),
          rec_free(H_cuMemFreeAsync, p, s))
HOOK_FREE(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s),
          CALL_DRV(cuMemFreeAsync_ptsz, p, s), rec_free(H_cuMemFreeAsync_ptsz, p, s))
HOOK(CUresult, cuMemHostAlloc, (void **p, size_t n, unsigned int f), CALL_DRV(cuMemHostAlloc, p, n, f),
     rec_host(MEDUSA_EV_HOST_ALLOC, H_cuMemHostAlloc, r_, p ? *p : NULL, n, f))
HOOK(CUresult, cuMemAllocHost_v2, (void **p, size_t n), CALL_DRV(cuMemAllocHost_v2, p, n),
     rec_host(MEDUSA_EV_HOST_ALLOC, H_cuMemAllocHost_v2, r_, p ? *p : NULL, n, 0))
HOOK_FREE(CUresult, cuMemFreeHost, (void *p), CALL_DRV(cuMemFreeHost, p),
          if (p) rec(MEDUSA_EV_HOST_FREE, H_cuMemFreeHost, 0, U(p), 0, 0, 0, LIVE_DEL))
HOOK(CUresult, cuMemHostRegister_v2, (void *p, size_t n, unsigned int f),
     CALL_DRV(cuMemHostRegister_v2, p, n, f),
     rec_host(MEDUSA_EV_HOST_REGISTER, H_cuMemHostRegister_v2, r_, p, n, f))
HOOK(CUresult, cuMemHostUnregister, (void *p), CALL_DRV(cuMemHostUnregister, p),
     rec_unregister(H_cuMemHostUnregister, r_, p))
HOOK_ALLOC(CUresult, cuMemAddressReserve,
     (CUdeviceptr * p, size_t n, size_t align, CUdeviceptr addr, unsigned long long f), false,
     CALL_DRV(cuMemAddressReserve, p, n, align, addr, f),
     rec(MEDUSA_EV_VMM_RESERVE, H_cuMemAddressReserve, r_, p && !r_ ? *p : 0, n, align, addr,
         LIVE_NONE))
HOOK_FREE(CUresult, cuMemAddressFree, (CUdeviceptr p, size_t n), CALL_DRV(cuMemAddressFree, p, n),
          rec(MEDUSA_EV_VMM_FREE, H_cuMemAddressFree, 0, p, n, 0, 0, LIVE_NONE))
HOOK(CUresult, cuMemCreate,
     (CUmemGenericAllocationHandle * h, size_t n, const CUmemAllocationProp *prop,
      unsigned long long f),
     CALL_DRV(cuMemCreate, h, n, prop, f),
     rec(MEDUSA_EV_VMM_CREATE, H_cuMemCreate, r_, h && !r_ ? *h : 0, n,
         prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? (uint64_t)prop->location.id
                                                                    : UINT64_MAX,
         0, LIVE_NONE))
HOOK_FREE(CUresult, cuMemRelease, (CUmemGenericAllocationHandle h), CALL_DRV(cuMemRelease, h),
          rec(MEDUSA_EV_VMM_RELEASE, H_cuMemRelease, 0, h, 0, 0, 0, LIVE_NONE))
HOOK(CUresult, cuMemMap,
     (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f),
     CALL_DRV(cuMemMap, p, n, off, h, f),
     rec(MEDUSA_EV_VMM_MAP, H_cuMemMap, r_, p, n, off, h, LIVE_NONE); if (!r_) mi_note_device())
HOOK_FREE(CUresult, cuMemUnmap, (CUdeviceptr p, size_t n), CALL_DRV(cuMemUnmap, p, n),
          rec(MEDUSA_EV_VMM_UNMAP, H_cuMemUnmap, 0, p, n, 0, 0, LIVE_NONE))

/* ---- runtime ---- */
HOOK_ALLOC(cudaError_t, cudaMalloc, (void **p, size_t n), true, CALL_RT(cudaMalloc, p, n),
     rec_alloc(H_cudaMalloc, r_, p ? U(*p) : 0, n, NULL, 0))
HOOK_FREE(cudaError_t, cudaFree, (void *p), CALL_RT(cudaFree, p), rec_free(H_cudaFree, U(p), NULL))
HOOK_ALLOC(cudaError_t, cudaMallocAsync, (void **p, size_t n, cudaStream_t s), true,
     CALL_RT(cudaMallocAsync, p, n, s),
     rec_alloc(H_cudaMallocAsync, r_, p ? U(*p) : 0, n, s, MEDUSA_ALLOC_ASYNC))
HOOK_ALLOC(cudaError_t, cudaMallocAsync_ptsz, (void **p, size_t n, cudaStream_t s), true,
     CALL_RT(cudaMallocAsync_ptsz, p, n, s),
     rec_alloc(H_cudaMallocAsync_ptsz, r_, p ? U(*p) : 0, n, s, MEDUSA_ALLOC_ASYNC))
HOOK_FREE(cudaError_t, cudaFreeAsync, (void *p, cudaStream_t s), CALL_RT(cudaFreeAsync, p, s),
          rec_free(H_cudaFreeAsync, U(p), s))
HOOK_FREE(cudaError_t, cudaFreeAsync_ptsz, (void *p, cudaStream_t s),
          CALL_RT(cudaFreeAsync_ptsz, p, s), rec_free(H_cudaFreeAsync_ptsz, U(p), s))
HOOK(cudaError_t, cudaMallocHost, (void **p, size_t n), CALL_RT(cudaMallocHost, p, n),
     rec_host(MEDUSA_EV_HOST_ALLOC, H_cudaMallocHost, r_, p ? *p : NULL, n, 0))
HOOK(cudaError_t, cudaHostAlloc, (void **p, size_t n, unsigned int f), CALL_RT(cudaHostAlloc, p, n, f),
     rec_host(MEDUSA_EV_HOST_ALLOC, H_cudaHostAlloc, r_, p ? *p : NULL, n, f))
HOOK_FREE(cudaError_t, cudaFreeHost, (void *p), CALL_RT(cudaFreeHost, p),
          if (p) rec(MEDUSA_EV_HOST_FREE, H_cudaFreeHost, 0, U(p), 0, 0, 0, LIVE_DEL))
HOOK(cudaError_t, cudaHostRegister, (void *p, size_t n, unsigned int f),
     CALL_RT(cudaHostRegister, p, n, f),
     rec_host(MEDUSA_EV_HOST_REGISTER, H_cudaHostRegister, r_, p, n, f))
HOOK(cudaError_t, cudaHostUnregister, (void *p), CALL_RT(cudaHostUnregister, p),
     rec_unregister(H_cudaHostUnregister, r_, p))
