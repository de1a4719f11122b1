/* Access recording (MEDUSA_SIM_ACCESSES=1, or =graphs for kernels run by a graph launch only):
 * which device memory each kernel run reads and writes, found without any help from the kernel. Before a kernel runs, the pages of every live device
 * allocation and module global are protected (PROT_NONE); a fault on one is recorded (read or
 * write, from the fault's error code) and the page opened just enough (PROT_READ for a read, so a
 * later write faults again), and the access goes on. When the kernel ends the pages are opened
 * again and the touched pages, coalesced into extents, are handed to the recorder's
 * medusa_trace_access (when one is loaded).
 *
 * NOTE: the granularity is the page (4 KiB): an extent covers whole pages, so it may reach into a
 * neighbouring allocation; the analysis keeps only what lies in the allocations the kernel's
 * parameters point into. A page whose first access is a write is recorded as written only. */
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "internal.h"

#define ACC_MAX_RUNS 4096
#define ACC_MAX_TOUCHES (1u << 21)
#define ACC_READ 1u
#define ACC_WRITE 2u
#define ACC_OVERFLOW 1u /* the report's flags: some accesses were not recorded */

typedef void (*acc_report_fn)(const void *func, const void *node, const uint64_t *extents,
                              size_t num_extents, uint64_t granularity, uint64_t flags);

static struct {
    pthread_once_t once;
    int on; /* 0 off, 1 every kernel run, 2 graph nodes only */
    uintptr_t page;
    acc_report_fn report;
    pthread_mutex_t lock; /* one instrumented kernel at a time */
    size_t num_runs;
    uintptr_t runs[ACC_MAX_RUNS][2]; /* protected page ranges, sorted, while a kernel runs */
    uint64_t *touches;               /* page | ACC_READ / ACC_WRITE, appended by the handler */
    _Atomic size_t num_touches;
    _Atomic int active;
    _Atomic int overflow;
} g_acc = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

static __thread const void *t_node; /* the graph node the kernel runs as, NULL when eager */

static void acc_init(void) {
    const char *env = getenv("MEDUSA_SIM_ACCESSES");
    g_acc.page = (uintptr_t)sysconf(_SC_PAGESIZE);
    g_acc.touches = malloc(ACC_MAX_TOUCHES * sizeof *g_acc.touches);
    if (env && *env && strcmp(env, "0") != 0 && g_acc.touches)
        g_acc.on = strcmp(env, "graphs") == 0 ? 2 : 1;
    g_acc.report = (acc_report_fn)dlsym(RTLD_DEFAULT, "medusa_trace_access");
}

void sim_acc_set_node(const void *node) { t_node = node; }

bool sim_acc_enabled(void) {
    pthread_once(&g_acc.once, acc_init);
    return g_acc.on != 0;
}

static bool in_runs(uintptr_t a) {
    size_t lo = 0, hi = g_acc.num_runs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < g_acc.runs[mid][0])
            hi = mid;
        else if (a >= g_acc.runs[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* 1: the fault was a write, 0: a read, -1: unknown (then the page is opened for both). */
static int fault_is_write(const void *uc) {
#if defined(__x86_64__)
    return (((const ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
    (void)uc;
    return -1;
#endif
}

/* Called first by simcuda's fault handler: true when the fault was an access being recorded. */
bool sim_acc_fault(uintptr_t addr, const void *uc) {
    if (!atomic_load_explicit(&g_acc.active, memory_order_acquire) || !in_runs(addr))
        return false;
    uintptr_t page = addr & ~(g_acc.page - 1);
    int w = fault_is_write(uc);
    size_t i = atomic_fetch_add_explicit(&g_acc.num_touches, 1, memory_order_relaxed);
    if (i < ACC_MAX_TOUCHES)
        g_acc.touches[i] = page | (w == 0 ? ACC_READ : w > 0 ? ACC_WRITE : ACC_READ | ACC_WRITE);
    else
        atomic_store(&g_acc.overflow, 1);
    mprotect((void *)page, g_acc.page, w == 0 ? PROT_READ : PROT_READ | PROT_WRITE);
    return true;
}

static void add_run(uintptr_t base, size_t size) {
    uintptr_t lo = base & ~(g_acc.page - 1), hi = (base + size + g_acc.page - 1) & ~(g_acc.page - 1);
    size_t n = g_acc.num_runs;
    if (n && lo <= g_acc.runs[n - 1][1]) {
        if (hi > g_acc.runs[n - 1][1])
            g_acc.runs[n - 1][1] = hi;
    } else if (n < ACC_MAX_RUNS) {
        g_acc.runs[n][0] = lo;
        g_acc.runs[n][1] = hi;
        g_acc.num_runs++;
    } else {
        atomic_store(&g_acc.overflow, 1);
    }
}

/* Protects the live device memory; true when the kernel is being recorded (sim_acc_end follows). */
bool sim_acc_begin(void) {
    pthread_once(&g_acc.once, acc_init);
    if (!g_acc.on || (g_acc.on == 2 && !t_node))
        return false;
    pthread_mutex_lock(&g_acc.lock);
    g_acc.num_runs = 0;
    atomic_store(&g_acc.num_touches, 0);
    atomic_store(&g_acc.overflow, 0);
    sim_lock();
    for (size_t i = 0; i < g_sim.allocs.n; i++) { /* sorted by base */
        const sim_range *r = &g_sim.allocs.v[i];
        if ((r->kind == A_DEVICE || r->kind == A_GLOBAL) && r->size)
            add_run(r->base, r->size);
    }
    sim_unlock();
    atomic_store_explicit(&g_acc.active, 1, memory_order_release); /* before a page is closed */
    for (size_t i = 0; i < g_acc.num_runs; i++)
        mprotect((void *)g_acc.runs[i][0], g_acc.runs[i][1] - g_acc.runs[i][0], PROT_NONE);
    return true;
}

static int by_page(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorted touches -> extents (lo, hi, flags), pages with the same flags side by side merged. */
static size_t coalesce(uint64_t *t, size_t n, uint64_t *ext) {
    uint64_t mask = g_acc.page - 1;
    size_t m = 0, i = 0;
    while (i < n) {
        uint64_t page = t[i] & ~mask, flags = 0;
        for (; i < n && (t[i] & ~mask) == page; i++)
            flags |= t[i] & mask;
        if (m && ext[3 * (m - 1) + 1] == page && ext[3 * (m - 1) + 2] == flags) {
            ext[3 * (m - 1) + 1] = page + g_acc.page;
        } else {
            ext[3 * m] = page;
            ext[3 * m + 1] = page + g_acc.page;
            ext[3 * m + 2] = flags;
            m++;
        }
    }
    return m;
}

/* Opens the pages again and, when the kernel ran to its end, reports what it touched. */
void sim_acc_end(const sim_func *f, bool completed) {
    atomic_store_explicit(&g_acc.active, 0, memory_order_release);
    for (size_t i = 0; i < g_acc.num_runs; i++)
        mprotect((void *)g_acc.runs[i][0], g_acc.runs[i][1] - g_acc.runs[i][0],
                 PROT_READ | PROT_WRITE);
    size_t n = atomic_load(&g_acc.num_touches);
    n = n < ACC_MAX_TOUCHES ? n : ACC_MAX_TOUCHES;
    uint64_t *ext = completed && g_acc.report ? malloc((3 * n + 3) * sizeof *ext) : NULL;
    if (ext) {
        qsort(g_acc.touches, n, sizeof *g_acc.touches, by_page);
        size_t m = coalesce(g_acc.touches, n, ext);
        g_acc.report(SIM_FUNC_HANDLE(f), t_node, ext, m, g_acc.page,
                     atomic_load(&g_acc.overflow) ? ACC_OVERFLOW : 0);
        free(ext);
    }
    pthread_mutex_unlock(&g_acc.lock);
}
