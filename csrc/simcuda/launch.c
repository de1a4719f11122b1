/* Kernel launch: parameter packing, launch checks, memcheck, and running a CPU kernel with faults
 * turned into CUDA_ERROR_ILLEGAL_ADDRESS (sticky, as on a GPU) instead of a crash. */
#include <setjmp.h>
#include <stdio.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static _Atomic uint64_t g_traffic[3];
static __thread sigjmp_buf t_jmp;
static __thread volatile int t_in_kernel;
static __thread volatile uintptr_t t_fault_addr;
static __thread volatile int t_fault_sig, t_fault_code; /* the fault's signal and si_code */
#define TRAP_SIG (-1)                /* t_fault_sig of a kernel that called simcudaTrap */
static __thread char t_trap_why[256];
static __thread bool t_parts_ok; /* the running kernel's parts may run on other threads */

SIMCUDA_EXPORT void simcudaTrap(const char *why) {
    if (!t_in_kernel)
        return;
    snprintf(t_trap_why, sizeof t_trap_why, "%s", why ? why : "");
    t_fault_sig = TRAP_SIG;
    siglongjmp(t_jmp, 1);
}

static CUresult kernel_trap(const sim_func *f) {
    sim_lock();
    CUresult e = sim_sticky_locked(CUDA_ERROR_LAUNCH_FAILED, "kernel %s trapped: %s", f->name,
                                   t_trap_why);
    sim_unlock();
    return e;
}
static __thread void *t_shared;
static __thread size_t t_shared_size;
static struct sigaction g_old_segv, g_old_bus;
static pthread_once_t g_sig_once = PTHREAD_ONCE_INIT;

SIM_API void simcudaCountRead(const void *ptr, size_t bytes) {
    sim_lock();
    int c = sim_mem_class((uintptr_t)ptr);
    sim_unlock();
    atomic_fetch_add_explicit(&g_traffic[c], bytes, memory_order_relaxed);
}

/* The counters count work that has run: both calls let the device finish what is queued. */
static void drain(void) {
    sim_lock();
    if (g_sim.initialized)
        sim_wait_all();
    sim_unlock();
}

SIM_API void simcudaGetTraffic(uint64_t out[3]) {
    drain();
    for (int i = 0; i < 3; i++)
        out[i] = atomic_load(&g_traffic[i]);
}

SIM_API void simcudaResetTraffic(void) {
    drain();
    for (int i = 0; i < 3; i++)
        atomic_store(&g_traffic[i], 0);
}

/* memcheck write-protects read-only registrations of memory the CPU may write while kernels run
 * (whole pages inside them: a page shared with other memory stays writable). */
static _Atomic int g_ro_active;
static struct {
    int depth;
    size_t n;
    sim_range *v;
} g_guard; /* under g_sim.lock */

static void on_fault(int sig, siginfo_t *info, void *uc) {
    if (sim_acc_fault((uintptr_t)info->si_addr, uc))
        return;
    if (t_in_kernel) {
        t_fault_addr = (uintptr_t)info->si_addr;
        t_fault_sig = sig;
        t_fault_code = info->si_code;
        siglongjmp(t_jmp, 1);
    }
    if (atomic_load(&g_ro_active)) {
        /* The host may write its own memory: wait for the kernels to end, then retry. */
        struct timespec ts = {0, 100000};
        while (atomic_load(&g_ro_active))
            nanosleep(&ts, NULL);
        return;
    }
    /* Not ours: restore the previous disposition and let the fault happen again. */
    sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, NULL);
}

static void install_fault_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

static void page_protect(const sim_range *r, int prot) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (r->base + page - 1) & ~(page - 1), hi = (r->base + r->size) & ~(page - 1);
    if (hi > lo)
        mprotect((void *)lo, hi - lo, prot);
}

static void ro_guard(bool enter) {
    sim_lock();
    if (enter && g_guard.depth++ == 0) {
        g_guard.v = malloc((g_sim.hosts.n + 1) * sizeof *g_guard.v);
        g_guard.n = 0;
        for (size_t i = 0; g_guard.v && i < g_sim.hosts.n; i++) {
            const sim_range *r = &g_sim.hosts.v[i];
            uint64_t want = CU_MEMHOSTREGISTER_READ_ONLY | SIM_HOST_CPU_WRITABLE;
            if ((r->aux & want) == want)
                g_guard.v[g_guard.n++] = *r;
        }
        atomic_store(&g_ro_active, g_guard.n > 0); /* before a page is protected */
        for (size_t i = 0; i < g_guard.n; i++)
            page_protect(&g_guard.v[i], PROT_READ);
    } else if (!enter && --g_guard.depth == 0) {
        for (size_t i = 0; i < g_guard.n; i++)
            page_protect(&g_guard.v[i], PROT_READ | PROT_WRITE);
        atomic_store(&g_ro_active, 0);
        free(g_guard.v);
        g_guard.v = NULL;
        g_guard.n = 0;
    }
    sim_unlock();
}

/* What a kernel's fault at `addr` inside host memory registered for the device was: a write into
 * a read-only registration (SEGV_ACCERR), or pages that are gone (SIGBUS: a mapped file cut short
 * under it; SEGV_MAPERR: unmapped while registered), which a read meets as well. */
static CUresult host_fault(const sim_func *f, uintptr_t addr, const sim_range *r, int sig,
                           int code) {
    const char *ro = r->aux & CU_MEMHOSTREGISTER_READ_ONLY ? " read-only" : "";
    if (sig == SIGBUS)
        return sim_fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                        "kernel %s faulted at 0x%lx, inside host memory registered%s for the device "
                        "at [0x%lx, +%zu): no page behind it (SIGBUS: the file mapped there was "
                        "cut short while registered)",
                        f->name, (unsigned long)addr, ro, (unsigned long)r->base, r->size);
    if (code == SEGV_MAPERR)
        return sim_fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                        "kernel %s faulted at 0x%lx, inside host memory registered%s for the device "
                        "at [0x%lx, +%zu): unmapped while registered",
                        f->name, (unsigned long)addr, ro, (unsigned long)r->base, r->size);
    if (*ro)
        return sim_fail(CUDA_ERROR_ILLEGAL_ADDRESS,
                        "kernel %s wrote to 0x%lx, inside host memory registered read-only for "
                        "the device (CU_MEMHOSTREGISTER_READ_ONLY) at [0x%lx, +%zu)",
                        f->name, (unsigned long)addr, (unsigned long)r->base, r->size);
    return sim_fail(CUDA_ERROR_ILLEGAL_ADDRESS, "kernel %s accessed an illegal address (0x%lx)",
                    f->name, (unsigned long)addr);
}

static CUresult kernel_fault(const sim_func *f, uintptr_t addr, int sig, int code) {
    sim_lock();
    const sim_range *r = rs_find(&g_sim.hosts, addr);
    sim_range rc = r ? *r : (sim_range){0};
    if (r)
        host_fault(f, addr, &rc, sig, code);
    else
        sim_fail(CUDA_ERROR_ILLEGAL_ADDRESS, "kernel %s accessed an illegal address (0x%lx)",
                 f->name, (unsigned long)addr);
    /* the context fails: every thread sees the message from here on */
    CUresult e = sim_sticky_locked(CUDA_ERROR_ILLEGAL_ADDRESS, "%s", simcudaGetLastMessage());
    sim_unlock();
    return e;
}

/* Why a launch of f so configured, with these parameters, is refused, or CUDA_SUCCESS; *packed:
 * the parameter buffer given through extra, if any. */
static CUresult check_launch(sim_func *f, const unsigned grid[3], const unsigned block[3],
                             unsigned smem, void **kernelParams, void **extra,
                             const void **packed) {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || block[0] == 0 || block[1] == 0 ||
        block[2] == 0 || grid[1] > 65535 || grid[2] > 65535 || block[0] > 1024 ||
        block[1] > 1024 || block[2] > 64 || (uint64_t)block[0] * block[1] * block[2] > 1024)
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "%s: invalid launch configuration", f->name);
    if (smem > (unsigned)f->max_dynamic_smem)
        return sim_fail(CUDA_ERROR_INVALID_VALUE,
                        "%s: %u bytes of dynamic shared memory asked, %d allowed (set "
                        "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                        f->name, smem, f->max_dynamic_smem);
    *packed = NULL;
    if (extra && kernelParams)
        return CUDA_ERROR_INVALID_VALUE;
    if (extra) {
        size_t *size = NULL;
        for (void **x = extra; *x != CU_LAUNCH_PARAM_END; x += 2) {
            if (x[0] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                *packed = x[1];
            else if (x[0] == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = x[1];
            else
                return CUDA_ERROR_INVALID_VALUE;
        }
        if (!*packed || !size || *size < f->param_bytes)
            return sim_fail(CUDA_ERROR_INVALID_VALUE, "%s: parameter buffer missing or short", f->name);
    } else if (!kernelParams && f->num_params) {
        return sim_fail(CUDA_ERROR_INVALID_VALUE, "%s: no kernel parameters given", f->name);
    }
    return CUDA_SUCCESS;
}

/* op becomes a launch of f, its parameters copied into op->params (f->param_bytes of them). */
static void fill_op(sim_kernel_op *op, sim_func *f, const unsigned grid[3], const unsigned block[3],
                    unsigned smem, void **kernelParams, const void *packed) {
    op->func = f;
    memcpy(op->grid, grid, sizeof op->grid);
    memcpy(op->block, block, sizeof op->block);
    op->smem = smem;
    if (packed)
        memcpy(op->params, packed, f->param_bytes);
    else
        for (uint32_t i = 0; i < f->num_params; i++)
            memcpy(op->params + f->params[i].offset, kernelParams[i], f->params[i].size);
}

CUresult sim_kernel_op_init(sim_kernel_op *op, sim_func *f, const unsigned grid[3],
                            const unsigned block[3], unsigned smem, void **kernelParams,
                            void **extra) {
    const void *packed = NULL;
    CUresult e = check_launch(f, grid, block, smem, kernelParams, extra, &packed);
    if (e)
        return e;
    op->params = malloc(f->param_bytes ? f->param_bytes : 1);
    if (!op->params)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fill_op(op, f, grid, block, smem, kernelParams, packed);
    return CUDA_SUCCESS;
}

CUresult sim_kernel_op_set(sim_kernel_op *op, sim_func *f, const unsigned grid[3],
                           const unsigned block[3], unsigned smem, void **kernelParams,
                           void **extra) {
    if (op->func != f || !op->params || op->pooled) {
        sim_kernel_op fresh = {0};
        CUresult e = sim_kernel_op_init(&fresh, f, grid, block, smem, kernelParams, extra);
        if (e)
            return e;
        sim_kernel_op_free(op);
        *op = fresh;
        return CUDA_SUCCESS;
    }
    const void *packed = NULL;
    CUresult e = check_launch(f, grid, block, smem, kernelParams, extra, &packed);
    if (!e) /* NOTE: the same function: its parameter buffer is the right size already */
        fill_op(op, f, grid, block, smem, kernelParams, packed);
    return e;
}

void sim_kernel_op_free(sim_kernel_op *op) {
    if (!op->pooled)
        free(op->params);
    op->params = NULL;
    op->pooled = false;
}

/* Every pointer argument inside a live allocation; a failure poisons the context, as the
 * kernel's fault would. Lock held. */
CUresult sim_memcheck_locked(const sim_kernel_op *op) {
    const sim_func *f = op->func;
    CUresult e = CUDA_SUCCESS;
    for (uint32_t i = 0; i < f->num_ptr_words && !e; i++) {
        uint64_t v;
        memcpy(&v, op->params + f->ptr_words[i], 8);
        if (v && sim_check_pointer(v)) {
            uint32_t arg = 0;
            while (arg + 1 < f->num_params && f->params[arg + 1].offset <= f->ptr_words[i])
                arg++;
            e = sim_sticky_locked(CUDA_ERROR_ILLEGAL_ADDRESS,
                                  "memcheck: kernel %s argument %u (byte %u) = 0x%lx is not inside "
                                  "a live allocation",
                                  f->name, arg, f->ptr_words[i] - f->params[arg].offset,
                                  (unsigned long)v);
        }
    }
    return e;
}

static CUresult memcheck(const sim_kernel_op *op) {
    sim_lock();
    CUresult e = sim_memcheck_locked(op);
    sim_unlock();
    return e;
}

static CUresult run_kernel(const sim_kernel_op *op) {
    sim_func *f = op->func;
    if (g_sim.sticky)
        return g_sim.sticky;
    CUresult e = g_sim.cfg.memcheck ? memcheck(op) : CUDA_SUCCESS;
    if (e)
        return e;
    if (!f->loaded)
        sim_func_load(f);
    if (op->smem > t_shared_size) {
        free(t_shared);
        t_shared = malloc(op->smem);
        t_shared_size = op->smem;
    }
    simcuda_kctx ctx = {{op->grid[0], op->grid[1], op->grid[2]},
                        {op->block[0], op->block[1], op->block[2]},
                        op->smem, t_shared, f->lib->globals};
    pthread_once(&g_sig_once, install_fault_handler);
    bool guard = g_sim.cfg.memcheck;
    if (guard)
        ro_guard(true);
    bool traced = sim_acc_begin();
    if (sigsetjmp(t_jmp, 1)) {
        t_in_kernel = 0;
        if (traced)
            sim_acc_end(f, false);
        if (guard)
            ro_guard(false);
        if (t_fault_sig == TRAP_SIG)
            return kernel_trap(f);
        return kernel_fault(f, t_fault_addr, t_fault_sig, t_fault_code);
    }
    t_in_kernel = 1;
    /* a checker or the slowdown watches this thread alone: parts stay on it */
    t_parts_ok = !traced && !guard && !g_sim.cfg.racecheck && g_sim.cfg.slowdown <= 1.0;
    f->fn(&ctx, op->params);
    t_in_kernel = 0;
    if (traced)
        sim_acc_end(f, true);
    if (guard)
        ro_guard(false);
    return CUDA_SUCCESS;
}

bool sim_parts_parallel(void) { return t_in_kernel && t_parts_ok; }

int sim_part_run(void (*fn)(void *, int), void *arg, int part, sim_part_fault *out) {
    sigjmp_buf saved; /* the kernel's, on its own thread: its part returns here, not past it */
    memcpy(&saved, &t_jmp, sizeof saved);
    int was = t_in_kernel, failed = 0;
    if (sigsetjmp(t_jmp, 1)) {
        *out = (sim_part_fault){t_fault_addr, t_fault_sig, t_fault_code, {0}};
        memcpy(out->why, t_trap_why, sizeof out->why);
        failed = 1;
    } else {
        t_in_kernel = 1;
        fn(arg, part);
    }
    t_in_kernel = was;
    memcpy(&t_jmp, &saved, sizeof saved);
    return failed;
}

void sim_part_raise(const sim_part_fault *f) {
    t_fault_addr = f->addr;
    t_fault_sig = f->sig;
    t_fault_code = f->code;
    memcpy(t_trap_why, f->why, sizeof t_trap_why);
    siglongjmp(t_jmp, 1);
}

/* A slower device (MEDUSA_SIM_SLOWDOWN=F): the kernel's thread waits (F - 1) times the CPU time
 * it took, without using the CPU, as a host waits on a GPU; the results are the same. */
static void stall(const struct timespec *t0, double factor) {
    struct timespec t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double ns = ((double)(t1.tv_sec - t0->tv_sec) * 1e9 + (double)(t1.tv_nsec - t0->tv_nsec)) *
                (factor - 1.0);
    struct timespec ts = {(time_t)(ns / 1e9), (long)(ns - (double)(time_t)(ns / 1e9) * 1e9)};
    while (ns > 0 && nanosleep(&ts, &ts) != 0)
        ;
}

/* A kernel writes device memory: no page of it is remapped meanwhile (sim_fresh_pages). */
CUresult sim_run_kernel(const sim_kernel_op *op) {
    double factor = g_sim.cfg.slowdown;
    struct timespec t0;
    if (factor > 1.0)
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    sim_writes_begin();
    CUresult e = run_kernel(op);
    sim_writes_end();
    if (factor > 1.0 && e == CUDA_SUCCESS)
        stall(&t0, factor);
    return e;
}

static CUresult launch(CUfunction h, const unsigned grid[3], const unsigned block[3], unsigned smem,
                       CUstream s, void **params, void **extra, const CUlaunchAttribute *attrs,
                       unsigned num_attrs, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_op *o = sim_op_new(OP_KERNEL);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    sim_lock();
    sim_func *f = sim_launchable_of(h);
    e = f ? sim_kernel_op_init(&o->u.k, f, grid, block, smem, params, extra)
          : CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; !e && i < num_attrs; i++)
        if (attrs[i].id <= CU_LAUNCH_ATTRIBUTE_IGNORE || attrs[i].id > SIM_LAUNCH_ATTRIBUTE_LAST)
            e = CUDA_ERROR_INVALID_VALUE;
    if (e)
        sim_op_unref(o);
    else
        e = sim_submit_locked(s, ptsz, o, attrs, num_attrs, false);
    sim_unlock();
    return e;
}

#define LAUNCH_ARGS                                                                                \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,    \
        unsigned smem, CUstream s, void **params, void **extra

SIM_API CUresult cuLaunchKernel(LAUNCH_ARGS) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, smem, s, params, extra, NULL, 0, false);
}

SIM_API CUresult cuLaunchKernel_ptsz(LAUNCH_ARGS) {
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return launch(f, g, b, smem, s, params, extra, NULL, 0, true);
}

static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra, bool ptsz) {
    if (!c || (c->numAttrs && !c->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return launch(f, g, b, c->sharedMemBytes, c->hStream, params, extra, c->attrs, c->numAttrs, ptsz);
}

SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
    return launch_ex(c, f, p, x, false);
}
SIM_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **x) {
    return launch_ex(c, f, p, x, true);
}
