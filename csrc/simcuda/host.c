/* Pinned and registered host memory. It lies outside the arena and its device address is its host
 * address: simcuda reports CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 1, for which
 * cuda.h says cuMemHostGetDevicePointer returns the host pointer itself. Unified addressing makes
 * every registration mapped and portable, whatever the flags (cudaHostRegisterDefault, in
 * cuda_runtime_api.h); CU_MEMHOSTREGISTER_READ_ONLY ranges are never written by simcuda. */
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include "internal.h"

#define REGISTER_FLAGS                                                                             \
    (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |    \
     CU_MEMHOSTREGISTER_READ_ONLY)

static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_range r = {.base = (uintptr_t)p, .size = size, .kind = A_HOST, .aux = flags | SIM_HOST_OWNED};
    sim_lock();
    int bad = rs_insert(&g_sim.hosts, r);
    sim_unlock();
    if (bad) {
        munmap(p, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, size, flags);
}

SIM_API CUresult cuMemAllocHost(void **pp, size_t size) { return host_alloc(pp, size, 0); }

SIM_API CUresult cuMemFreeHost(void *p) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    sim_range *r = rs_exact(&g_sim.hosts, (uintptr_t)p);
    size_t size = r ? r->size : 0;
    if (r && (r->aux & SIM_HOST_OWNED) && (e = sim_wait_all()) == CUDA_SUCCESS) {
        r = rs_exact(&g_sim.hosts, (uintptr_t)p); /* the lock was let go while work ran */
        if (r)
            rs_remove(&g_sim.hosts, r);
        else
            e = CUDA_ERROR_INVALID_VALUE; /* another thread freed it meanwhile */
        if (r && g_sim.cfg.racecheck)
            sim_race_forget((uintptr_t)p, size);
    } else if (!e)
        e = sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost(%p): not the start of memory from "
                     "cuMemHostAlloc%s", p, r ? " (it is registered: cuMemHostUnregister it)" : "");
    sim_unlock();
    if (!e)
        munmap(p, size);
    return e;
}

/* What the CPU may do with [p, p+n): 0 if a page of it is unmapped or unreadable, else PROT_READ,
 * with PROT_WRITE when every page is writable. The driver pins the pages, so it sees the same. */
static int cpu_access(uintptr_t p, size_t n) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return PROT_READ | PROT_WRITE; /* cannot tell: as permissive as pinning would be */
    uintptr_t at = p, end = p + n;
    int prot = PROT_READ | PROT_WRITE;
    char *line = NULL;
    size_t cap = 0;
    while (at < end && getline(&line, &cap, f) > 0) {
        unsigned long lo, hi;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || hi <= at)
            continue;
        if (lo > at || perms[0] != 'r')
            break; /* a hole, or a page the device could not read either */
        if (perms[1] != 'w')
            prot &= ~PROT_WRITE;
        at = hi;
    }
    free(line);
    fclose(f);
    return at >= end ? prot : 0;
}

/* Whether the file mapped at [lo, hi) is on a filesystem with no writeback (tmpfs, and so a
 * memfd or SysV shared memory, hugetlbfs, ramfs), or cannot be looked at. */
static bool no_writeback(unsigned long lo, unsigned long hi) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/map_files/%lx-%lx", lo, hi); /* deleted files too */
    struct statfs st;
    if (statfs(link, &st) != 0)
        return true;
    return st.f_type == TMPFS_MAGIC || st.f_type == HUGETLBFS_MAGIC || st.f_type == RAMFS_MAGIC;
}

/* NOTE: the driver pins registered pages with FOLL_WRITE | FOLL_LONGTERM (os_lock_user_pages in
 * NVIDIA's open kernel modules), which Linux 6.5 on refuses for a shared mapping of a file whose
 * filesystem tracks dirty pages (ext4, xfs, overlayfs...): on a GPU cudaHostRegister without
 * READ_ONLY fails there (invalid argument). simcuda refuses it too. Copies such a mapping's file
 * name into `file` and returns true if [p, p+n) holds one. */
static bool writes_to_a_disk_file(uintptr_t p, size_t n, char *file, size_t cap) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return false;
    char *line = NULL;
    size_t len = 0;
    bool found = false;
    while (!found && getline(&line, &len, f) > 0) {
        unsigned long lo, hi;
        char perms[5];
        int at = 0;
        if (sscanf(line, "%lx-%lx %4s %*s %*s %*s %n", &lo, &hi, perms, &at) != 3 || hi <= p ||
            lo >= p + n || perms[3] != 's' || !at)
            continue;
        line[strcspn(line, "\n")] = '\0';
        snprintf(file, cap, "%s", line + at);
        found = !no_writeback(lo, hi);
    }
    free(line);
    fclose(f);
    return found;
}

/* Checks a registration's arguments and the memory; *writable: whether the CPU may write it all. */
static CUresult check_register(uintptr_t b, size_t size, unsigned flags, bool *writable) {
    if (!b || size == 0 || b + size < b)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(0x%lx, %zu): a null pointer "
                        "or an empty range", (unsigned long)b, size);
    if (flags & ~(unsigned)REGISTER_FLAGS)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister: unknown flags 0x%x",
                        flags & ~(unsigned)REGISTER_FLAGS);
    if (flags & CU_MEMHOSTREGISTER_IOMEMORY)
        return sim_fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemHostRegister: simcuda has no I/O memory "
                        "(CU_MEMHOSTREGISTER_IOMEMORY)");
    if (b < g_sim.va_base + g_sim.va_size && b + size > g_sim.va_base)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(0x%lx, %zu): the range is "
                        "device memory", (unsigned long)b, size);
    int prot = cpu_access(b, size);
    if (!prot)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(0x%lx, %zu): the range is not "
                        "all mapped, readable host memory", (unsigned long)b, size);
    /* NOTE: simcuda reports CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES = 0,
     * and there cuda.h requires READ_ONLY for memory the CPU maps read-only. */
    if (!(prot & PROT_WRITE) && !(flags & CU_MEMHOSTREGISTER_READ_ONLY))
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(0x%lx, %zu): the CPU maps the "
                        "range read-only; register it with CU_MEMHOSTREGISTER_READ_ONLY "
                        "(cudaHostRegisterReadOnly)", (unsigned long)b, size);
    char file[256];
    if (!(flags & CU_MEMHOSTREGISTER_READ_ONLY) && writes_to_a_disk_file(b, size, file, sizeof file))
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostRegister(0x%lx, %zu): the range maps %s "
                        "shared, on a filesystem that writes back: the driver cannot pin its pages for "
                        "writing (Linux 6.5 on); put the file on tmpfs (/dev/shm) or register it "
                        "read-only (cudaHostRegisterReadOnly)", (unsigned long)b, size, file);
    *writable = prot & PROT_WRITE;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    uintptr_t b = (uintptr_t)p;
    bool writable = false;
    if ((e = check_register(b, size, flags, &writable)))
        return e;
    sim_range r = {.base = b, .size = size, .kind = A_HOST,
                   .aux = flags | (writable ? SIM_HOST_CPU_WRITABLE : 0)};
    sim_lock();
    e = sim_capture_check_unsafe();
    const sim_range *old = e ? NULL : rs_overlap(&g_sim.hosts, b, size);
    if (old)
        e = sim_fail(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "cuMemHostRegister(0x%lx, %zu): "
                     "overlaps [0x%lx, +%zu), already %s", (unsigned long)b, size,
                     (unsigned long)old->base, old->size,
                     old->aux & SIM_HOST_OWNED ? "pinned by cuMemHostAlloc" : "registered");
    else if (!e && rs_insert(&g_sim.hosts, r))
        e = CUDA_ERROR_OUT_OF_MEMORY;
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemHostUnregister(void *p) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    e = sim_capture_check_unsafe();
    sim_range *r = e ? NULL : rs_find(&g_sim.hosts, (uintptr_t)p);
    if (r && r->base == (uintptr_t)p && !(r->aux & SIM_HOST_OWNED) &&
        (e = sim_wait_all()) == CUDA_SUCCESS) {
        r = rs_exact(&g_sim.hosts, (uintptr_t)p); /* the lock was let go while work ran */
        if (r && g_sim.cfg.racecheck)
            sim_race_forget(r->base, r->size);
        if (r)
            rs_remove(&g_sim.hosts, r);
    } else if (!e)
        e = sim_fail(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "cuMemHostUnregister(%p): %s", p,
                     !r                           ? "no registration holds it"
                     : r->aux & SIM_HOST_OWNED    ? "it is from cuMemHostAlloc (cuMemFreeHost it)"
                                                  : "not the base a registration was made with");
    sim_unlock();
    return e;
}

SIM_API CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!pdptr || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    bool ok = rs_find(&g_sim.hosts, (uintptr_t)p) != NULL;
    sim_unlock();
    if (!ok)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer(%p): not pinned or "
                        "registered host memory", p);
    *pdptr = (CUdeviceptr)p;
    return CUDA_SUCCESS;
}

/* The first read-only registration [p, p+n) overlaps, or NULL. Called with the lock held. */
const sim_range *sim_host_read_only(uintptr_t p, size_t n) {
    const sim_range *r = rs_overlap(&g_sim.hosts, p, n);
    const sim_range *end = g_sim.hosts.v + g_sim.hosts.n;
    for (; r && r < end && r->base < p + n; r++)
        if (r->aux & CU_MEMHOSTREGISTER_READ_ONLY)
            return r;
    return NULL;
}
