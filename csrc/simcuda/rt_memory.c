/* Runtime memory API over the driver entry points. */
#include <string.h>

#include "rt.h"

RT_API cudaError_t cudaMalloc(void **p, size_t size) {
    RT_INIT();
    if (!p)
        return rt_set(cudaErrorInvalidValue);
    if (size == 0) {
        *p = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult e = rt_drv.memAlloc(&d, size);
    *p = e ? NULL : (void *)d;
    return rt_ret(e);
}

RT_API cudaError_t cudaFree(void *p) { RT_CALL(p ? rt_drv.memFree((CUdeviceptr)p) : CUDA_SUCCESS); }

static cudaError_t malloc_async(void **p, size_t size, cudaStream_t s, int pt) {
    RT_INIT();
    if (!p)
        return rt_set(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult e = rt_drv.memAllocAsync[pt](&d, size, (CUstream)s);
    *p = e ? NULL : (void *)d;
    return rt_ret(e);
}

RT_API cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 0); }
RT_API cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, 1); }
RT_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { RT_CALL(rt_drv.memFreeAsync[0]((CUdeviceptr)p, (CUstream)s)); }
RT_API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { RT_CALL(rt_drv.memFreeAsync[1]((CUdeviceptr)p, (CUstream)s)); }

RT_API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) { RT_CALL(rt_drv.memGetInfo(free_bytes, total)); }

static cudaError_t check_kind(enum cudaMemcpyKind kind) {
    return (unsigned)kind > cudaMemcpyDefault ? cudaErrorInvalidMemcpyDirection : cudaSuccess;
}

RT_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    RT_INIT();
    if (check_kind(kind))
        return rt_set(cudaErrorInvalidMemcpyDirection);
    return rt_ret(rt_drv.memcpy[0]((CUdeviceptr)dst, (CUdeviceptr)src, n));
}

RT_API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
    RT_INIT();
    if (check_kind(kind))
        return rt_set(cudaErrorInvalidMemcpyDirection);
    return rt_ret(rt_drv.memcpy[1]((CUdeviceptr)dst, (CUdeviceptr)src, n));
}

static cudaError_t memcpy_async(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                cudaStream_t s, int pt) {
    RT_INIT();
    if (check_kind(kind))
        return rt_set(cudaErrorInvalidMemcpyDirection);
    return rt_ret(rt_drv.memcpyAsync[pt]((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)s));
}

RT_API cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    return memcpy_async(d, s, n, k, st, 0);
}
RT_API cudaError_t cudaMemcpyAsync_ptsz(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    return memcpy_async(d, s, n, k, st, 1);
}

RT_API cudaError_t cudaMemset(void *p, int v, size_t n) { RT_CALL(rt_drv.memsetD8[0]((CUdeviceptr)p, (unsigned char)v, n)); }
RT_API cudaError_t cudaMemset_ptds(void *p, int v, size_t n) { RT_CALL(rt_drv.memsetD8[1]((CUdeviceptr)p, (unsigned char)v, n)); }
RT_API cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    RT_CALL(rt_drv.memsetD8Async[0]((CUdeviceptr)p, (unsigned char)v, n, (CUstream)s));
}
RT_API cudaError_t cudaMemsetAsync_ptsz(void *p, int v, size_t n, cudaStream_t s) {
    RT_CALL(rt_drv.memsetD8Async[1]((CUdeviceptr)p, (unsigned char)v, n, (CUstream)s));
}

RT_API cudaError_t cudaMemset2D(void *p, size_t pitch, int v, size_t w, size_t h) {
    RT_CALL(rt_drv.memsetD2D8[0]((CUdeviceptr)p, pitch, (unsigned char)v, w, h));
}
RT_API cudaError_t cudaMemset2D_ptds(void *p, size_t pitch, int v, size_t w, size_t h) {
    RT_CALL(rt_drv.memsetD2D8[1]((CUdeviceptr)p, pitch, (unsigned char)v, w, h));
}
RT_API cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t w, size_t h, cudaStream_t s) {
    RT_CALL(rt_drv.memsetD2D8Async[0]((CUdeviceptr)p, pitch, (unsigned char)v, w, h, (CUstream)s));
}
RT_API cudaError_t cudaMemset2DAsync_ptsz(void *p, size_t pitch, int v, size_t w, size_t h, cudaStream_t s) {
    RT_CALL(rt_drv.memsetD2D8Async[1]((CUdeviceptr)p, pitch, (unsigned char)v, w, h, (CUstream)s));
}

RT_API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
    RT_INIT();
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined))
        return rt_set(cudaErrorInvalidValue);
    return rt_ret(rt_drv.memHostAlloc(p, n, flags));
}

RT_API cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
RT_API cudaError_t cudaFreeHost(void *p) { RT_CALL(rt_drv.memFreeHost(p)); }
RT_API cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags) { RT_CALL(rt_drv.memHostRegister(p, n, flags)); }
RT_API cudaError_t cudaHostUnregister(void *p) { RT_CALL(rt_drv.memHostUnregister(p)); }

RT_API cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int flags) {
    RT_INIT();
    CUdeviceptr p = 0;
    CUresult e = rt_drv.memHostGetDevicePointer(&p, h, flags);
    if (!e && d)
        *d = (void *)p;
    return rt_ret(e);
}

RT_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
    RT_INIT();
    if (!a)
        return rt_set(cudaErrorInvalidValue);
    memset(a, 0, sizeof *a);
    unsigned type = 0;
    if (rt_drv.pointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ptr)) {
        a->type = cudaMemoryTypeUnregistered; /* plain host memory is not an error since CUDA 11 */
        a->device = -2;
        return cudaSuccess;
    }
    a->type = type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    a->device = 0;
    a->devicePointer = (void *)ptr;
    a->hostPointer = type == CU_MEMORYTYPE_DEVICE ? NULL : (void *)ptr;
    return cudaSuccess;
}
