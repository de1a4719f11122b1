/* Fresh pages for copies over stale bytes (see sim_fresh_pages), and the lock that keeps device
 * writes out of a page while it is remapped. */
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

/* A copy about to overwrite most of a 2 MiB page of a cudaMalloc block gives the page fresh (huge)
 * memory first. The stale-byte mapping is copy-on-write of a pattern file: writing it faults and
 * copies 4 KiB at a time only for the copy to overwrite the bytes, which made a weight upload three
 * times slower than a memcpy. What a program can read is the same either way: a page the copy
 * covers in part gets the pattern written back where the copy does not reach, and only while no
 * byte of it was written before (its pages are all still the file's: /proc/self/pagemap). Not
 * while pages are watched (MEDUSA_SIM_ACCESSES: remapping would drop their protection), not for VMM
 * mappings (shared physical memory), and not where the source lies. */
#define FRESH_MIN ((size_t)256 << 10) /* below this a partial page is not worth a 2 MiB write */
#define PM_PRESENT (1ULL << 63)
#define PM_SWAPPED (1ULL << 62)
#define PM_FILE (1ULL << 61)

static pthread_rwlock_t g_writes;
static pthread_once_t g_writes_once = PTHREAD_ONCE_INIT;

static void writes_init(void) {
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
    /* NOTE: a remap waits for the writes in flight, and new ones wait for it: streams that never
     * pause must not starve it. */
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&g_writes, &a);
    pthread_rwlockattr_destroy(&a);
}

void sim_writes_begin(void) {
    pthread_once(&g_writes_once, writes_init);
    pthread_rwlock_rdlock(&g_writes);
}

void sim_writes_end(void) { pthread_rwlock_unlock(&g_writes); }

/* No byte of the page was written since its stale-byte mapping was made: each 4 KiB page is still
 * the file's or not touched at all. Called with the writes lock held exclusively. */
static bool pristine(uintptr_t page) {
    static uint64_t entries[SIM_VMM_GRANULARITY / 4096];
    long ps = sysconf(_SC_PAGESIZE);
    size_t n = SIM_VMM_GRANULARITY / (size_t)ps;
    if (ps != 4096)
        return false;
    static int fd = -2; /* opened on first use; kept */
    if (fd == -2)
        fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && pread(fd, entries, n * 8, (off_t)(page / (uintptr_t)ps * 8)) == (ssize_t)(n * 8);
    for (size_t i = 0; ok && i < n; i++)
        ok = !(entries[i] & PM_SWAPPED) && (!(entries[i] & PM_PRESENT) || (entries[i] & PM_FILE));
    return ok;
}

static bool remap(uintptr_t page) {
    const size_t g = SIM_VMM_GRANULARITY;
    if (mmap((void *)page, g, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        return false;
    madvise((void *)page, g, MADV_HUGEPAGE);
    return true;
}

void sim_fresh_pages(uintptr_t dst, size_t n, uintptr_t src, size_t src_n) {
    const uintptr_t g = SIM_VMM_GRANULARITY;
    if (!g_sim.cfg.poison || n < FRESH_MIN || g_sim.poison_fd < 0 || sim_acc_enabled())
        return;
    sim_lock();
    const sim_range *r = rs_find(&g_sim.allocs, dst);
    sim_range block = r ? *r : (sim_range){0};
    sim_unlock();
    if (!r || block.kind != A_DEVICE || block.size % g || dst + n > block.base + block.size)
        return;
    for (uintptr_t page = dst & ~(g - 1); page < dst + n; page += g) {
        uintptr_t a = page > dst ? page : dst, b = page + g < dst + n ? page + g : dst + n;
        if ((src < page + g && src + src_n > page) || b - a < FRESH_MIN)
            continue;
        if (a == page && b == page + g) { /* every byte is the copy's: nothing else to keep */
            if (!remap(page))
                return;
            continue;
        }
        /* NOTE: exclusive, so that no other write to the page (a copy beside this one) is in
         * flight between the check and the pattern written back. */
        pthread_once(&g_writes_once, writes_init);
        pthread_rwlock_wrlock(&g_writes);
        if (pristine(page) && remap(page)) {
            /* what the file mapping showed where the copy does not reach (8-byte words, the copy
             * that follows overwrites the overlap) */
            uintptr_t b8 = b & ~(uintptr_t)7;
            uint64_t off = (page - block.base) % SIM_POISON_CHUNK;
            sim_pattern((uint64_t *)page, (a - page + 7) / 8, off);
            sim_pattern((uint64_t *)b8, (page + g - b8) / 8, off + (b8 - page));
        }
        pthread_rwlock_unlock(&g_writes);
    }
}
