/* Stream-ordered allocation: cudaMallocAsync hands out memory at once; cudaFreeAsync frees it
 * when its stream reaches the free. */
#include "internal.h"

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_stream *st = sim_stream_resolve(s, ptsz, &e);
    uintptr_t p = 0;
    if (st && st->cap)
        e = sim_fail(CUDA_ERROR_NOT_SUPPORTED, "simcuda has no memory-allocation graph nodes");
    else if (st)
        e = sim_dev_alloc(size, A_DEVICE, &p);
    sim_unlock();
    if (!e)
        *dptr = p;
    return e;
}

/* Stream-ordered: the memory is freed when the stream reaches the free (and reused after). */
static CUresult free_async(CUdeviceptr p, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_stream *st = sim_stream_resolve(s, ptsz, &e);
    sim_range *r = p ? rs_exact(&g_sim.allocs, p) : NULL;
    sim_op *op = NULL;
    if (st && st->cap)
        e = sim_fail(CUDA_ERROR_NOT_SUPPORTED, "simcuda has no memory-free graph nodes");
    else if (st && p && (!r || r->kind != A_DEVICE || (r->aux & SIM_FREE_PENDING)))
        e = sim_fail(CUDA_ERROR_INVALID_VALUE, "cudaFreeAsync(0x%lx): not the start of a live "
                     "allocation%s", (unsigned long)p,
                     r && (r->aux & SIM_FREE_PENDING) ? " (freed already, by an earlier "
                                                        "cudaFreeAsync still queued)" : "");
    else if (st && p && !(op = sim_op_new(OP_FREE)))
        e = CUDA_ERROR_OUT_OF_MEMORY;
    if (op) {
        r->aux |= SIM_FREE_PENDING;
        op->u.free_ptr = p;
        sim_enqueue(st, op, NULL, 0);
    }
    sim_unlock();
    return e;
}

/* A queued cudaFreeAsync, when its stream reaches it: a write of the whole block to the race
 * checker (work of other streams not ordered before it would use freed memory). */
CUresult sim_run_free(sim_op *op) {
    sim_lock();
    sim_range *r = rs_exact(&g_sim.allocs, op->u.free_ptr);
    size_t size = r ? r->size : 0;
    CUresult e = g_sim.cfg.racecheck && size
                     ? sim_race_access(op, -1, op->u.free_ptr, size, SIM_WRITE)
                     : CUDA_SUCCESS;
    if (!e && r)
        e = sim_dev_free(op->u.free_ptr, A_DEVICE);
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s, false); }
SIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, s, true); }
SIM_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(p, s, false); }
SIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(p, s, true); }
