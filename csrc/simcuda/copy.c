/* Memcpy and memset, synchronous and stream-ordered (captured into graphs when capturing). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* No process maps its lowest pages (Linux's vm.mmap_min_addr is 64 KiB by default). */
#define NULL_PAGES ((uintptr_t)64 << 10)

/* A pointer inside the arena must lie in a live allocation; anything else is host memory, except
 * the null pages (cudaMalloc of 0 bytes hands out NULL): refused there, not a crash. */
static CUresult check_side(uintptr_t p, size_t n, const char *what) {
    if (n && p < NULL_PAGES)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "memcpy/memset %s 0x%lx is a null pointer", what,
                        (unsigned long)p);
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

CUresult sim_check_memcpy(const sim_memcpy_op *op) {
    CUresult e = check_writable(op->dst, op->bytes, "memcpy");
    if (!e)
        e = check_side(op->dst, op->bytes, "destination");
    if (!e)
        e = check_side(op->src, op->bytes, "source");
    return e;
}

static size_t memset_span(const sim_memset_op *op) {
    return op->height ? op->pitch * (op->height - 1) + op->width * op->elem : 0;
}

CUresult sim_check_memset(const sim_memset_op *op) {
    CUresult e = check_writable(op->dst, memset_span(op), "memset");
    return e ? e : check_side(op->dst, memset_span(op), "destination");
}

/* Checked again when it runs: memory freed or unmapped meanwhile faults, as on a GPU. */
static CUresult late_failure(CUresult e, const char *what) {
    return e ? sim_sticky(CUDA_ERROR_ILLEGAL_ADDRESS, "%s, when it ran: %s", what,
                          simcudaGetLastMessage())
             : CUDA_SUCCESS;
}

CUresult sim_run_memcpy(const sim_memcpy_op *op) {
    sim_lock();
    CUresult e = sim_check_memcpy(op);
    sim_unlock();
    if (e)
        return late_failure(e, "memcpy");
    if (op->bytes) {
        sim_fresh_pages(op->dst, op->bytes, op->src, op->bytes);
        sim_writes_begin();
        memmove((void *)op->dst, (const void *)op->src, op->bytes);
        sim_writes_end();
    }
    return CUDA_SUCCESS;
}

CUresult sim_run_memset(const sim_memset_op *op) {
    sim_lock();
    CUresult e = sim_check_memset(op);
    sim_unlock();
    if (e)
        return late_failure(e, "memset");
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

/* ---- as a queued operation: checked by the race checker first ---- */
CUresult sim_run_memcpy_op(sim_op *op, int32_t node, const sim_memcpy_op *c) {
    if (g_sim.cfg.racecheck && c->bytes) {
        sim_lock();
        CUresult e = sim_race_access(op, node, c->src, c->bytes, SIM_READ);
        if (!e)
            e = sim_race_access(op, node, c->dst, c->bytes, SIM_WRITE);
        sim_unlock();
        if (e)
            return e;
    }
    return sim_run_memcpy(c);
}

CUresult sim_run_memset_op(sim_op *op, int32_t node, const sim_memset_op *m) {
    size_t row = m->width * m->elem;
    for (size_t y = 0; g_sim.cfg.racecheck && row && y < m->height; y++) {
        sim_lock();
        CUresult e = sim_race_access(op, node, m->dst + y * m->pitch, row, SIM_WRITE);
        sim_unlock();
        if (e)
            return e;
    }
    return sim_run_memset(m);
}

/* ---- when a copy returns (the CUDA runtime API's "API synchronization behavior") ---- */
enum { MEM_DEVICE, MEM_PINNED, MEM_PAGEABLE };

static int mem_kind(uintptr_t p) {
    if (p - g_sim.va_base < g_sim.va_size)
        return MEM_DEVICE;
    return rs_find(&g_sim.hosts, p) ? MEM_PINNED : MEM_PAGEABLE;
}

/* sync: cudaMemcpy, which returns once the copy is done except device to device; async:
 * cudaMemcpyAsync, which returns at once except to or between pageable host memory (a pageable
 * source was staged by the caller: consumed before the call returned). */
static bool copy_waits(const sim_memcpy_op *c, bool staged, bool sync) {
    int ks = mem_kind(c->src), kd = mem_kind(c->dst);
    if (sync)
        return !(ks == MEM_DEVICE && kd == MEM_DEVICE);
    return (ks != MEM_DEVICE && kd != MEM_DEVICE) || kd == MEM_PAGEABLE ||
           (ks == MEM_PAGEABLE && !staged);
}

CUresult sim_check_op(sim_op *o, bool *wait) {
    switch (o->type) {
    case OP_MEMCPY: {
        CUresult e = sim_check_memcpy(&o->u.copy.c);
        *wait = !e && copy_waits(&o->u.copy.c, o->u.copy.staging != NULL, *wait);
        return e;
    }
    case OP_MEMSET: {
        CUresult e = sim_check_memset(&o->u.s);
        *wait = !e && *wait && mem_kind(o->u.s.dst) == MEM_PINNED; /* cudaMemset: async on device */
        return e;
    }
    case OP_KERNEL: return g_sim.cfg.memcheck ? sim_memcheck_locked(&o->u.k) : CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
    }
}

static sim_op *memcpy_op(uintptr_t dst, uintptr_t src, size_t n) {
    sim_op *o = sim_op_new(OP_MEMCPY);
    if (o)
        o->u.copy.c = (sim_memcpy_op){dst, src, n}, o->u.copy.source = src;
    return o;
}

/* A pageable source of a host-to-device copy is staged now, as the driver does, so the caller may
 * reuse its buffer when the call returns; large ones wait instead (the driver may too). */
#define STAGE_MAX ((size_t)64 << 20)
static void stage(sim_op *o, size_t n) {
    sim_lock();
    bool pageable = mem_kind(o->u.copy.source) == MEM_PAGEABLE &&
                    mem_kind(o->u.copy.c.dst) == MEM_DEVICE;
    sim_unlock();
    if (!pageable || !n || n > STAGE_MAX)
        return;
    o->u.copy.staging = malloc(n);
    if (o->u.copy.staging) {
        memcpy(o->u.copy.staging, (const void *)o->u.copy.source, n);
        o->u.copy.c.src = (uintptr_t)o->u.copy.staging;
    }
}

static CUresult copy_sync(uintptr_t dst, uintptr_t src, size_t n, bool ptds) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if ((e = sim_sync_guard()))
        return e;
    sim_op *o = memcpy_op(dst, src, n);
    return o ? sim_submit(NULL, ptds, o, NULL, 0, true) : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult copy_async(uintptr_t dst, uintptr_t src, size_t n, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_op *o = memcpy_op(dst, src, n);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stage(o, n);
    return sim_submit(s, ptsz, o, NULL, 0, false);
}

static sim_op *memset_op(uintptr_t dst, unsigned v, unsigned elem, size_t n) {
    sim_op *o = sim_op_new(OP_MEMSET);
    if (o)
        o->u.s = (sim_memset_op){dst, n * elem, n, 1, v, elem};
    return o;
}

static CUresult set_sync(uintptr_t dst, unsigned v, unsigned elem, size_t n, bool ptds) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if ((e = sim_sync_guard()))
        return e;
    sim_op *o = memset_op(dst, v, elem, n);
    return o ? sim_submit(NULL, ptds, o, NULL, 0, true) : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult set_async(uintptr_t dst, unsigned v, unsigned elem, size_t n, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_op *o = memset_op(dst, v, elem, n);
    return o ? sim_submit(s, ptsz, o, NULL, 0, false) : CUDA_ERROR_OUT_OF_MEMORY;
}

/* A 2-D fill of height rows of width elements, pitch bytes apart (unused for one row); sync:
 * cudaMemset2D, which returns at once on device memory, as cudaMemset. */
static CUresult set_2d(uintptr_t dst, size_t pitch, unsigned v, unsigned elem, size_t width,
                       size_t height, CUstream s, bool ptsz, bool sync) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (height > 1 && pitch < width * elem)
        return sim_fail(CUDA_ERROR_INVALID_VALUE,
                        "2-D memset: pitch %zu bytes is less than a row of %zu elements of %u bytes",
                        pitch, width, elem);
    if (sync && (e = sim_sync_guard()))
        return e;
    sim_op *o = sim_op_new(OP_MEMSET);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->u.s = (sim_memset_op){dst, height > 1 ? pitch : width * elem, width, height, v, elem};
    return sim_submit(s, ptsz, o, NULL, 0, sync);
}

/* `pt` is the per-thread default stream flag each pair passes its two entry points. */
#define PTDS(name, params, call)                                                                   \
    SIM_API CUresult name params {                                                                 \
        const bool pt = false;                                                                     \
        return call;                                                                               \
    }                                                                                              \
    SIM_API CUresult SIM_CAT(name, _ptds) params {                                                 \
        const bool pt = true;                                                                      \
        return call;                                                                               \
    }

PTDS(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), copy_sync(d, s, n, pt))
PTDS(cuMemcpyHtoD, (CUdeviceptr d, const void *s, size_t n), copy_sync(d, (uintptr_t)s, n, pt))
PTDS(cuMemcpyDtoH, (void *d, CUdeviceptr s, size_t n), copy_sync((uintptr_t)d, s, n, pt))
PTDS(cuMemcpyDtoD, (CUdeviceptr d, CUdeviceptr s, size_t n), copy_sync(d, s, n, pt))
PTDS(cuMemsetD8, (CUdeviceptr d, unsigned char v, size_t n), set_sync(d, v, 1, n, pt))
PTDS(cuMemsetD16, (CUdeviceptr d, unsigned short v, size_t n), set_sync(d, v, 2, n, pt))
PTDS(cuMemsetD32, (CUdeviceptr d, unsigned int v, size_t n), set_sync(d, v, 4, n, pt))

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
     set_2d(d, pitch, v, 1, w, h, NULL, pt, true))
PTDS(cuMemsetD2D16, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h),
     set_2d(d, pitch, v, 2, w, h, NULL, pt, true))
PTDS(cuMemsetD2D32, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h),
     set_2d(d, pitch, v, 4, w, h, NULL, pt, true))
PTSZ(cuMemsetD2D8Async, (CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 1, w, h, st, false, false), set_2d(d, pitch, v, 1, w, h, st, true, false))
PTSZ(cuMemsetD2D16Async, (CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 2, w, h, st, false, false), set_2d(d, pitch, v, 2, w, h, st, true, false))
PTSZ(cuMemsetD2D32Async, (CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h, CUstream st),
     set_2d(d, pitch, v, 4, w, h, st, false, false), set_2d(d, pitch, v, 4, w, h, st, true, false))
