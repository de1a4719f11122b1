/* Memcpy and memset, synchronous and stream-ordered (captured into graphs when capturing). */
#include <string.h>

#include "internal.h"

/* A pointer inside the arena must lie in a live allocation; anything else is host memory. */
static CUresult check_side(uintptr_t p, size_t n, const char *what) {
    if (p - g_sim.va_base >= g_sim.va_size)
        return CUDA_SUCCESS;
    if (sim_check_range(p, n, false))
        return sim_fail(CUDA_ERROR_INVALID_VALUE,
                        "memcpy/memset %s range [0x%lx, +%zu) is not inside a live allocation", what,
                        (unsigned long)p, n);
    return CUDA_SUCCESS;
}

/* NOTE: a copy engine faults writing host memory registered read-only; simcuda refuses the copy
 * before it starts (a PROT_READ mapping would otherwise crash the process). */
static CUresult check_writable(uintptr_t p, size_t n, const char *what) {
    const sim_range *r = n ? sim_host_read_only(p, n) : NULL;
    if (!r)
        return CUDA_SUCCESS;
    return sim_fail(CUDA_ERROR_INVALID_VALUE,
                    "%s destination [0x%lx, +%zu) overlaps host memory registered read-only for "
                    "the device (CU_MEMHOSTREGISTER_READ_ONLY) at [0x%lx, +%zu)",
                    what, (unsigned long)p, n, (unsigned long)r->base, r->size);
}

CUresult sim_run_memcpy(const sim_memcpy_op *op) {
    sim_lock();
    CUresult e = check_writable(op->dst, op->bytes, "memcpy");
    if (!e)
        e = check_side(op->dst, op->bytes, "destination");
    if (!e)
        e = check_side(op->src, op->bytes, "source");
    sim_unlock();
    if (!e && op->bytes) {
        sim_fresh_pages(op->dst, op->bytes, op->src, op->bytes);
        sim_writes_begin();
        memmove((void *)op->dst, (const void *)op->src, op->bytes);
        sim_writes_end();
    }
    return e;
}

CUresult sim_run_memset(const sim_memset_op *op) {
    size_t row = op->width * op->elem;
    size_t span = op->height ? op->pitch * (op->height - 1) + row : 0;
    sim_lock();
    CUresult e = check_writable(op->dst, span, "memset");
    if (!e)
        e = check_side(op->dst, span, "destination");
    sim_unlock();
    if (e)
        return e;
    sim_writes_begin();
    for (size_t y = 0; y < op->height; y++) {
        unsigned char *d = (unsigned char *)op->dst + y * op->pitch;
        if (op->elem == 1) {
            memset(d, (int)(op->value & 0xff), op->width);
        } else if (op->elem == 2) {
            uint16_t v = (uint16_t)op->value;
            for (size_t i = 0; i < op->width; i++)
                memcpy(d + 2 * i, &v, 2);
        } else {
            uint32_t v = op->value;
            for (size_t i = 0; i < op->width; i++)
                memcpy(d + 4 * i, &v, 4);
        }
    }
    sim_writes_end();
    return CUDA_SUCCESS;
}

static CUresult copy_sync(uintptr_t dst, uintptr_t src, size_t n) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if ((e = sim_sync_guard()))
        return e;
    sim_memcpy_op op = {dst, src, n};
    return sim_run_memcpy(&op);
}

static CUresult copy_async(uintptr_t dst, uintptr_t src, size_t n, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_memcpy_op op = {dst, src, n};
    return sim_submit(s, ptsz, CU_GRAPH_NODE_TYPE_MEMCPY, &op, NULL, 0);
}

enum { SET_SYNC, SET_ASYNC, SET_PTSZ };

static CUresult set_sync(uintptr_t dst, unsigned v, unsigned elem, size_t n) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if ((e = sim_sync_guard()))
        return e;
    sim_memset_op op = {dst, n * elem, n, 1, v, elem};
    return sim_run_memset(&op);
}

static CUresult set_async(uintptr_t dst, unsigned v, unsigned elem, size_t n, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_memset_op op = {dst, n * elem, n, 1, v, elem};
    return sim_submit(s, ptsz, CU_GRAPH_NODE_TYPE_MEMSET, &op, NULL, 0);
}

/* A 2-D fill of height rows of width elements, pitch bytes apart (unused for one row). */
static CUresult set_2d(uintptr_t dst, size_t pitch, unsigned v, unsigned elem, size_t width,
                       size_t height, CUstream s, int mode) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (height > 1 && pitch < width * elem)
        return sim_fail(CUDA_ERROR_INVALID_VALUE,
                        "2-D memset: pitch %zu bytes is less than a row of %zu elements of %u bytes",
                        pitch, width, elem);
    sim_memset_op op = {dst, height > 1 ? pitch : width * elem, width, height, v, elem};
    if (mode == SET_SYNC) {
        if ((e = sim_sync_guard()))
            return e;
        return sim_run_memset(&op);
    }
    return sim_submit(s, mode == SET_PTSZ, CU_GRAPH_NODE_TYPE_MEMSET, &op, NULL, 0);
}

#define PTDS(name, params, call)                                                                   \
    SIM_API CUresult name params { return call; }                                                  \
    SIM_API CUresult SIM_CAT(name, _ptds) params { return call; }

PTDS(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), copy_sync(d, s, n))
PTDS(cuMemcpyHtoD, (CUdeviceptr d, const void *s, size_t n), copy_sync(d, (uintptr_t)s, n))
PTDS(cuMemcpyDtoH, (void *d, CUdeviceptr s, size_t n), copy_sync((uintptr_t)d, s, n))
PTDS(cuMemcpyDtoD, (CUdeviceptr d, CUdeviceptr s, size_t n), copy_sync(d, s, n))
PTDS(cuMemsetD8, (CUdeviceptr d, unsigned char v, size_t n), set_sync(d, v, 1, n))
PTDS(cuMemsetD16, (CUdeviceptr d, unsigned short v, size_t n), set_sync(d, v, 2, n))
PTDS(cuMemsetD32, (CUdeviceptr d, unsigned int v, size_t n), set_sync(d, v, 4, n))

#define PTSZ(name, params, legacy, perthread)                                                      \
    SIM_API CUresult name params { return legacy; }                                                \
    SIM_API CUresult SIM_CAT(name, _ptsz) params { return perthread; }

PTSZ(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
     copy_async(d, s, n, st, false), copy_async(d, s, n, st, true))
PTSZ(cuMemcpyHtoDAsync, (CUdeviceptr d, const void *s, size_t n, CUstream st),
     copy_async(d, (uintptr_t)s, n, st, false), copy_async(d, (uintptr_t)s, n, st, true))
PTSZ(cuMemcpyDtoHAsync, (void *d, CUdeviceptr s, size_t n, CUstream st),
     copy_async((uintptr_t)d, s, n, st, false), copy_async((uintptr_t)d, s, n, st, true))
PTSZ(cuMemcpyDtoDAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st),
     copy_async(d, s, n, st, false), copy_async(d, s, n, st, true))
PTSZ(cuMemsetD8Async, (CUdeviceptr d, unsigned char v, size_t n, CUstream st),
     set_async(d, v, 1, n, st, false), set_async(d, v, 1, n, st, true))
PTSZ(cuMemsetD16Async, (CUdeviceptr d, unsigned short v, size_t n, CUstream st),
     set_async(d, v, 2, n, st, false), set_async(d, v, 2, n, st, true))
PTSZ(cuMemsetD32Async, (CUdeviceptr d, unsigned int v, size_t n, CUstream st),
     set_async(d, v, 4, n, st, false), set_async(d, v, 4, n, st, true))

/* cudaMemset2D and friends: Width in elements, dstPitch in bytes */
PTDS(cuMemsetD2D8, (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h),
     set_2d(d, pitch, v, 1, w, h, NULL, SET_SYNC))
PTDS(cuMemsetD2D16, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h),
     set_2d(d, pitch, v, 2, w, h, NULL, SET_SYNC))
PTDS(cuMemsetD2D32, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h),
     set_2d(d, pitch, v, 4, w, h, NULL, SET_SYNC))
PTSZ(cuMemsetD2D8Async, (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 1, w, h, st, SET_ASYNC), set_2d(d, pitch, v, 1, w, h, st, SET_PTSZ))
PTSZ(cuMemsetD2D16Async, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 2, w, h, st, SET_ASYNC), set_2d(d, pitch, v, 2, w, h, st, SET_PTSZ))
PTSZ(cuMemsetD2D32Async, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 4, w, h, st, SET_ASYNC), set_2d(d, pitch, v, 4, w, h, st, SET_PTSZ))
