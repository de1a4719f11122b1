/* Device memory: an arena at a random base, first-fit with address reuse, lazily committed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int poison_file(void);

CUresult sim_arena_init(void) {
    size_t va = g_sim.cfg.total_mem * 4;
    uint64_t state = g_sim.cfg.seed;
    const uint64_t lo = 0x100000000000ULL, hi = 0x700000000000ULL;
    for (int attempt = 0; attempt < 64; attempt++) {
        uint64_t span = (hi - lo - va) / SIM_VMM_GRANULARITY;
        uintptr_t want = lo + (splitmix64(&state) % span) * SIM_VMM_GRANULARITY;
        void *p = mmap((void *)want, va, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == MAP_FAILED)
            continue;
        if ((uintptr_t)p != want) { /* old kernels ignore MAP_FIXED_NOREPLACE */
            munmap(p, va);
            continue;
        }
        g_sim.va_base = want;
        g_sim.va_size = va;
        g_sim.poison_fd = -1;
        /* NOTE: the stale-byte pattern file now, with the context (8 MiB written, ~10 ms), not
         * at the first large cudaMalloc: a pooled worker's warm-up pays it, not its model's start. */
        if (g_sim.cfg.poison)
            poison_file();
        return rs_insert(&g_sim.va_free, (sim_range){.base = want, .size = va, .kind = 0, .aux = 0}) ? CUDA_ERROR_OUT_OF_MEMORY
                                                                       : CUDA_SUCCESS;
    }
    return sim_fail(CUDA_ERROR_OUT_OF_MEMORY, "cannot place a %zu-byte device arena", va);
}

SIM_API int simcudaGetArenaInfo(uint64_t *base, uint64_t *size) {
    if (!g_sim.initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (base)
        *base = g_sim.va_base;
    if (size)
        *size = g_sim.va_size;
    return 0;
}

/* Takes [base, base+size) out of the free VA list; the range must lie inside one free range. */
static int va_take(uintptr_t base, size_t size) {
    sim_range *f = rs_find(&g_sim.va_free, base);
    if (!f || base + size > f->base + f->size)
        return -1;
    sim_range before = {.base = f->base, .size = base - f->base};
    sim_range after = {.base = base + size, .size = f->base + f->size - (base + size)};
    rs_remove(&g_sim.va_free, f);
    if (before.size)
        rs_insert(&g_sim.va_free, before);
    if (after.size)
        rs_insert(&g_sim.va_free, after);
    return 0;
}

/* First fit, lowest address first, so a freed range is the next one handed out. */
uintptr_t sim_va_alloc(size_t size, size_t align, uintptr_t hint) {
    if (hint && hint % align == 0 && va_take(hint, size) == 0)
        return hint;
    for (size_t i = 0; i < g_sim.va_free.n; i++) {
        sim_range f = g_sim.va_free.v[i];
        uintptr_t b = (f.base + align - 1) & ~(uintptr_t)(align - 1);
        if (b + size <= f.base + f.size && va_take(b, size) == 0)
            return b;
    }
    return 0;
}

void sim_va_free(uintptr_t base, size_t size) {
    sim_range r = {.base = base, .size = size};
    size_t i = 0;
    while (i < g_sim.va_free.n && g_sim.va_free.v[i].base < base)
        i++;
    if (i > 0 && g_sim.va_free.v[i - 1].base + g_sim.va_free.v[i - 1].size == base) {
        r.base = g_sim.va_free.v[i - 1].base;
        r.size += g_sim.va_free.v[i - 1].size;
        rs_remove(&g_sim.va_free, &g_sim.va_free.v[--i]);
    }
    if (i < g_sim.va_free.n && g_sim.va_free.v[i].base == base + size) {
        r.size += g_sim.va_free.v[i].size;
        rs_remove(&g_sim.va_free, &g_sim.va_free.v[i]);
    }
    rs_insert(&g_sim.va_free, r);
    /* Give whole pages back to the host; the next allocation is poisoned again anyway. */
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = (base + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = (base + size) & ~(uintptr_t)(page - 1);
    if (hi > lo && hi - lo >= (64u << 10))
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ---- stale bytes: on a GPU, fresh memory holds what its last user (or another run) left ---- */
void sim_pattern(uint64_t *w, size_t words, uint64_t offset) {
    const uint64_t key = g_sim.cfg.poison_key;
    for (size_t i = 0; i < words; i++)
        w[i] = key ^ (offset + 8 * i);
}

void sim_poison(uintptr_t p, size_t size) {
    if (g_sim.cfg.poison)
        sim_pattern((uint64_t *)p, size / 8, 0);
}

/* A memfd with one chunk of the pattern, made on first use. Called with the lock held. */
static int poison_file(void) {
    if (g_sim.poison_fd >= 0)
        return g_sim.poison_fd;
    int fd = memfd_create("simcuda-stale", MFD_CLOEXEC);
    void *m = fd >= 0 && ftruncate(fd, (off_t)SIM_POISON_CHUNK) == 0
                  ? mmap(NULL, SIM_POISON_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    if (m == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    sim_pattern(m, SIM_POISON_CHUNK / 8, 0);
    munmap(m, SIM_POISON_CHUNK);
    return g_sim.poison_fd = fd;
}

/* Large blocks (page-aligned, whole 2 MiB pages) map the pattern copy-on-write instead of writing
 * it: a 7 GB KV cache costs no memory and no time until it is touched, as before. */
static void poison_block(uintptr_t p, size_t size) {
    if (!g_sim.cfg.poison)
        return;
    int fd = size % SIM_VMM_GRANULARITY == 0 ? poison_file() : -1;
    for (size_t off = 0; fd >= 0 && off < size; off += SIM_POISON_CHUNK) {
        size_t n = size - off < SIM_POISON_CHUNK ? size - off : SIM_POISON_CHUNK;
        if (mmap((void *)(p + off), n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, 0) == MAP_FAILED)
            fd = -1;
    }
    if (fd < 0)
        sim_poison(p, size);
}

/* VMM physical memory, written through a temporary mapping (granular, so a few pages at most in
 * practice; a VMM pool's pages are touched by its user soon anyway). */
void sim_poison_fd(int fd, size_t size) {
    if (!g_sim.cfg.poison)
        return;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return;
    sim_pattern(m, size / 8, 0);
    munmap(m, size);
}

/* cudaMalloc's placement: small blocks share pages at 256-byte alignment; from 1 MiB on a block
 * takes whole 2 MiB pages, which is what cudaMemGetInfo then reports as used. */
static size_t alloc_granule(size_t size, int kind) {
    return kind == A_DEVICE && size >= SIM_LARGE_ALLOC ? SIM_VMM_GRANULARITY : SIM_ALLOC_ALIGN;
}

CUresult sim_dev_alloc(size_t size, int kind, uintptr_t *out) {
    size_t granule = alloc_granule(size, kind);
    size_t rounded = (size + granule - 1) & ~(granule - 1);
    if (rounded < size || rounded > g_sim.cfg.total_mem - g_sim.mem_used)
        return sim_fail(CUDA_ERROR_OUT_OF_MEMORY, "out of memory: %zu bytes asked, %zu free", size,
                        g_sim.cfg.total_mem - g_sim.mem_used);
    uintptr_t p = sim_va_alloc(rounded, granule, 0);
    if (!p)
        return sim_fail(CUDA_ERROR_OUT_OF_MEMORY, "out of device address space");
    if (rs_insert(&g_sim.allocs, (sim_range){.base = p, .size = rounded, .kind = kind, .aux = size})) {
        sim_va_free(p, rounded);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_sim.mem_used += rounded;
    if (kind == A_DEVICE)
        poison_block(p, rounded);
    *out = p;
    return CUDA_SUCCESS;
}

CUresult sim_dev_free(uintptr_t p, int kind) {
    sim_range *r = rs_exact(&g_sim.allocs, p);
    if (!r || r->kind != kind)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "free of 0x%lx: not the start of a live allocation",
                        (unsigned long)p);
    uintptr_t base = r->base;
    size_t size = r->size;
    rs_remove(&g_sim.allocs, r);
    g_sim.mem_used -= size;
    sim_va_free(base, size);
    if (g_sim.cfg.racecheck)
        sim_race_forget(base, size);
    return CUDA_SUCCESS;
}

int sim_mem_class(uintptr_t p) {
    if (p - g_sim.va_base < g_sim.va_size)
        return SIMCUDA_TRAFFIC_DEVICE;
    return rs_find(&g_sim.hosts, p) ? SIMCUDA_TRAFFIC_HOST_MAPPED : SIMCUDA_TRAFFIC_OTHER;
}

/* Is [p, p+n) inside one live allocation? Device allocations, globals, accessible mappings and,
 * unless device_only, mapped host memory count. */
CUresult sim_check_range(uintptr_t p, size_t n, bool device_only) {
    sim_range *r = rs_find(&g_sim.allocs, p);
    if (r && (r->kind == A_DEVICE || r->kind == A_GLOBAL))
        return p + n <= r->base + r->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r && r->kind == A_RESERVE) {
        /* A reserved range may be backed by several mappings side by side (an elastic KV cache
         * maps a page at a time); an access is fine if accessible mappings cover all of it. */
        if (p + n > r->base + r->size)
            return CUDA_ERROR_INVALID_VALUE;
        uintptr_t at = p, end = p + (n ? n : 1);
        while (at < end) {
            sim_range *m = rs_find(&g_sim.maps, at);
            if (!m || !m->aux)
                return CUDA_ERROR_INVALID_VALUE;
            at = m->base + m->size;
        }
        return CUDA_SUCCESS;
    }
    if (!device_only) {
        sim_range *h = rs_find(&g_sim.hosts, p);
        if (h)
            return p + n <= h->base + h->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_check_pointer(uintptr_t p) {
    sim_range *r = rs_find(&g_sim.allocs, p);
    return r && r->kind == A_RESERVE ? CUDA_SUCCESS : sim_check_range(p, 1, false);
}

SIM_API CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    e = sim_capture_check_unsafe();
    uintptr_t p = 0;
    if (!e)
        e = sim_dev_alloc(bytesize, A_DEVICE, &p);
    sim_unlock();
    if (!e)
        *dptr = p;
    return e;
}

/* As cudaFree, it waits for the device first: work still queued may use the memory. */
SIM_API CUresult cuMemFree(CUdeviceptr dptr) {
    CUresult e = sim_ensure_init();
    if (e || dptr == 0)
        return e;
    sim_lock();
    e = sim_capture_check_unsafe();
    if (!e)
        e = sim_wait_all();
    if (!e)
        e = sim_dev_free(dptr, A_DEVICE);
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    *free_bytes = g_sim.cfg.total_mem - g_sim.mem_used;
    *total = g_sim.cfg.total_mem;
    sim_unlock();
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_range *r = rs_find(&g_sim.allocs, dptr);
    if (r && r->kind == A_RESERVE)
        r = rs_find(&g_sim.maps, dptr);
    if (r) {
        if (pbase)
            *pbase = r->base;
        if (psize)
            *psize = r->kind == A_DEVICE ? (size_t)(r->aux & ~SIM_FREE_PENDING) : r->size;
    }
    sim_unlock();
    return r ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

SIM_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_range *r = rs_find(&g_sim.allocs, ptr);
    if (r && r->kind == A_RESERVE)
        r = rs_find(&g_sim.maps, ptr);
    bool dev = r != NULL;
    if (!r)
        r = rs_find(&g_sim.hosts, ptr);
    sim_range rc = r ? *r : (sim_range){0};
    sim_unlock();
    if (!r)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (dev && attribute == CU_POINTER_ATTRIBUTE_HOST_POINTER)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = rc.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = rc.size; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data = 0; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned *)data = !dev && (rc.aux & CU_MEMHOSTREGISTER_READ_ONLY)
                                ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
