/* Virtual memory management: reservations are inaccessible (PROT_NONE) until a physical handle is
 * mapped and access is granted, as on a GPU; physical handles are memfds, so aliases work. */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

uintptr_t sim_va_alloc(size_t size, size_t align, uintptr_t hint); /* memory.c */
void sim_va_free(uintptr_t base, size_t size);

typedef struct sim_phys {
    int fd;
    size_t size;
    int maps;
    bool released;
} sim_phys;

static void phys_put(sim_phys *p) {
    if (p->released && p->maps == 0) {
        g_sim.mem_used -= p->size;
        close(p->fd);
        free(p);
    }
}

static bool granular(size_t v) { return v % SIM_VMM_GRANULARITY == 0; }

SIM_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option) {
    (void)option;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *g = SIM_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!h || !prop || flags || !size || !granular(size) || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    if (size > g_sim.cfg.total_mem - g_sim.mem_used) {
        sim_unlock();
        return sim_fail(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate: %zu bytes asked, %zu free", size,
                        g_sim.cfg.total_mem - g_sim.mem_used);
    }
    int fd = memfd_create("simcuda-phys", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        sim_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_poison_fd(fd, size);
    sim_phys *p = calloc(1, sizeof *p);
    p->fd = fd;
    p->size = size;
    g_sim.mem_used += size;
    sim_handle_add(p, H_MEMHANDLE);
    sim_unlock();
    *h = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    sim_lock();
    sim_phys *p = (sim_phys *)(uintptr_t)h;
    bool ok = sim_handle_is(p, H_MEMHANDLE) && !p->released;
    if (ok) {
        sim_handle_del(p);
        p->released = true;
        phys_put(p);
    }
    sim_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!ptr || !size || !granular(size) || (alignment && (alignment & (alignment - 1))) ||
        (flags & ~(unsigned long long)0))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > SIM_VMM_GRANULARITY ? alignment : SIM_VMM_GRANULARITY;
    sim_lock();
    uintptr_t p = sim_va_alloc(size, align, addr);
    if (p) {
        mprotect((void *)p, size, PROT_NONE);
        rs_insert(&g_sim.allocs, (sim_range){.base = p, .size = size, .kind = A_RESERVE, .aux = 0, .obj = NULL});
    }
    sim_unlock();
    if (!p)
        return sim_fail(CUDA_ERROR_OUT_OF_MEMORY, "no %zu-byte range of device address space left", size);
    *ptr = p;
    return CUDA_SUCCESS;
}

static bool has_maps(uintptr_t base, size_t size) {
    for (size_t i = 0; i < g_sim.maps.n; i++)
        if (g_sim.maps.v[i].base < base + size && base < g_sim.maps.v[i].base + g_sim.maps.v[i].size)
            return true;
    return false;
}

SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    sim_lock();
    sim_range *r = rs_exact(&g_sim.allocs, ptr);
    CUresult e = r && r->kind == A_RESERVE && r->size == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (!e && has_maps(ptr, size))
        e = sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: the range is still mapped");
    if (!e) {
        rs_remove(&g_sim.allocs, r);
        mmap((void *)ptr, size, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        sim_va_free(ptr, size);
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                          unsigned long long flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_phys *p = (sim_phys *)(uintptr_t)h;
    sim_range *r = rs_find(&g_sim.allocs, ptr);
    if (flags || !size || !granular(size) || !granular(offset) || !sim_handle_is(p, H_MEMHANDLE) ||
        offset + size > p->size || !r || r->kind != A_RESERVE || ptr + size > r->base + r->size)
        e = CUDA_ERROR_INVALID_VALUE;
    else if (has_maps(ptr, size))
        e = sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemMap: range already mapped");
    else if (mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset) == MAP_FAILED)
        e = CUDA_ERROR_OUT_OF_MEMORY;
    if (!e) {
        rs_insert(&g_sim.maps, (sim_range){.base = ptr, .size = size, .kind = A_MAPPING, .aux = 0, .obj = p});
        p->maps++;
    }
    sim_unlock();
    return e;
}

/* cuMemUnmap and cuMemSetAccess synchronize (cuda.h's note_sync): queued work that uses the
 * range runs first. */
SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    sim_lock();
    CUresult e = g_sim.initialized ? sim_wait_all() : CUDA_SUCCESS;
    if (e) {
        sim_unlock();
        return e;
    }
    e = CUDA_ERROR_INVALID_VALUE;
    sim_range *m;
    while ((m = rs_find(&g_sim.maps, ptr)) && m->base >= ptr && m->base + m->size <= ptr + size) {
        sim_phys *p = m->obj;
        mmap((void *)m->base, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
             -1, 0);
        uintptr_t next = m->base + m->size;
        if (g_sim.cfg.racecheck)
            sim_race_forget(m->base, m->size);
        rs_remove(&g_sim.maps, m);
        p->maps--;
        phys_put(p);
        e = CUDA_SUCCESS;
        if (next >= ptr + size)
            break;
        ptr = next;
    }
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!desc || !count)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
               : desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                   : PROT_NONE;
    sim_lock();
    CUresult e = g_sim.initialized ? sim_wait_all() : CUDA_SUCCESS;
    if (e) {
        sim_unlock();
        return e;
    }
    e = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_sim.maps.n; i++) {
        sim_range *m = &g_sim.maps.v[i];
        if (m->base >= ptr && m->base + m->size <= ptr + size) {
            mprotect((void *)m->base, m->size, prot);
            m->aux = (uint64_t)desc[0].flags;
            e = CUDA_SUCCESS;
        }
    }
    sim_unlock();
    return e;
}
