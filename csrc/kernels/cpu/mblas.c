/* mblas: the engine's "cuBLAS". Its kernel is not exported and its module is registered on the
 * library's first call, so a new process cannot find the kernel until mblas has run once. The CPU
 * kernel hands the work to a real BLAS: one already loaded in the process (numpy's OpenBLAS), one
 * named by MEDUSA_BLAS_LIB, or the system's; without any, a plain blocked loop. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simcuda/simcuda.h"

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
typedef void (*sgemm32_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                           int, float, float *, int);

static struct {
    pthread_once_t once;
    sgemm64_fn s64;
    sgemm32_fn s32;
    void *handle; /* the library they came from */
} blas = {PTHREAD_ONCE_INIT, NULL, NULL, NULL};

static void try_handle(void *h) {
    if (!h || blas.s64 || blas.s32)
        return;
    blas.s64 = (sgemm64_fn)dlsym(h, "scipy_cblas_sgemm64_");
    if (!blas.s64)
        blas.s64 = (sgemm64_fn)dlsym(h, "cblas_sgemm64_");
    if (!blas.s64)
        blas.s32 = (sgemm32_fn)dlsym(h, "cblas_sgemm");
    if (blas.s64 || blas.s32)
        blas.handle = h;
}

/* MEDUSA_BLAS_THREADS=N: the BLAS's own threads (OpenBLAS's pool). A tensor-parallel rank sets
 * it to its share of the cores (medusa.engine.tensor_parallel): N ranks' pools of one thread
 * per core each, spinning while they wait for work, starved the ranks a collective waits on
 * (a SmolLM2 decode step at 2 ranks on 2 cores: 0.35 s, 0.05 s with one thread each). */
static void set_threads(void) {
    const char *env = getenv("MEDUSA_BLAS_THREADS");
    int n = env ? atoi(env) : 0;
    if (n <= 0 || !blas.handle)
        return;
    static const char *const names[] = {"scipy_openblas_set_num_threads64_",
                                        "openblas_set_num_threads64_", "openblas_set_num_threads"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        void (*set)(int) = (void (*)(int))dlsym(blas.handle, names[i]);
        if (set) {
            set(n);
            return;
        }
    }
}

/* NOTE: no dlopen in here: dl_iterate_phdr holds the loader's list lock, and dlopen takes the
 * load lock first and then that one, so a dlopen here deadlocks with another thread's dlopen
 * (Python importing an extension while the engine's first GEMM runs). The names are copied out. */
enum { MAX_FOUND = 8 };
struct found {
    int n;
    char name[MAX_FOUND][PATH_MAX];
};

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct found *f = data;
    const char *name = info->dlpi_name;
    if (name && strstr(name, "openblas") && strlen(name) < PATH_MAX)
        strcpy(f->name[f->n++], name);
    return f->n == MAX_FOUND;
}

static void find_blas(void) {
    const char *env = getenv("MEDUSA_BLAS_LIB");
    if (env && *env)
        try_handle(dlopen(env, RTLD_LAZY));
    static struct found loaded; /* (once: pthread_once) */
    dl_iterate_phdr(find_loaded, &loaded);
    for (int i = 0; i < loaded.n; i++)
        try_handle(dlopen(loaded.name[i], RTLD_LAZY | RTLD_NOLOAD));
    static const char *const names[] = {"libopenblas.so.0", "libcblas.so.3", "libblas.so.3"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        try_handle(dlopen(names[i], RTLD_LAZY));
    set_threads();
}

struct gemm_args {
    int transa, transb, m, n, k; float alpha; const float *a; int lda;
    const float *b; int ldb; float beta; float *c; int ldc;
};

static float at(const float *x, int ld, int trans, int i, int j) {
    return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

static void naive(const struct gemm_args *g) {
    for (int i = 0; i < g->m; i++)
        for (int j = 0; j < g->n; j++) {
            float s = 0;
            for (int l = 0; l < g->k; l++)
                s += at(g->a, g->lda, g->transa, i, l) * at(g->b, g->ldb, g->transb, l, j);
            float *c = g->c + (size_t)i * g->ldc + j;
            *c = g->alpha * s + (g->beta != 0.0f ? g->beta * *c : 0.0f);
        }
}

/* The bytes of a row-major rows x cols matrix with leading dimension ld. */
static size_t extent(int rows, int cols, int ld) {
    return rows > 0 && cols > 0 ? ((size_t)(rows - 1) * ld + cols) * 4 : 0;
}

/* C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C, row-major. */
static void sgemm(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct gemm_args *g = p;
    simcudaAccess(g->a, g->transa ? extent(g->k, g->m, g->lda) : extent(g->m, g->k, g->lda),
                  SIMCUDA_READ);
    simcudaAccess(g->b, g->transb ? extent(g->n, g->k, g->ldb) : extent(g->k, g->n, g->ldb),
                  SIMCUDA_READ);
    simcudaAccess(g->c, extent(g->m, g->n, g->ldc),
                  g->beta != 0.0f ? SIMCUDA_READ | SIMCUDA_WRITE : SIMCUDA_WRITE);
    simcudaCountRead(g->a, (size_t)g->m * g->k * 4);
    simcudaCountRead(g->b, (size_t)g->k * g->n * 4);
    pthread_once(&blas.once, find_blas);
    int ta = g->transa ? TRANS : NO_TRANS, tb = g->transb ? TRANS : NO_TRANS;
    if (blas.s64)
        blas.s64(ROW_MAJOR, ta, tb, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
                 g->beta, g->c, g->ldc);
    else if (blas.s32)
        blas.s32(ROW_MAJOR, ta, tb, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
                 g->beta, g->c, g->ldc);
    else
        naive(g);
}

SIMCUDA_HIDDEN_STUB(sgemm_stub)

static const simcuda_kernel_desc kernels[] = {
    {"_ZN5mblas12sgemm_rm_f32EiiiiifPKfiS1_ifPfi", "i i i i i f p i p i f p i", sgemm,
     (const void *)sgemm_stub},
};

SIMCUDA_MODULE_LAZY(mblas, kernels, NULL, 0)

static int registered;

/* The public entry point, like cublasSgemm: registers its module on first use, then launches. */
SIMCUDA_EXPORT int mblas_sgemm(int transa, int transb, int m, int n, int k, float alpha,
                               const float *a, int lda, const float *b, int ldb, float beta,
                               float *c, int ldc, cudaStream_t stream) {
    if (!__atomic_exchange_n(&registered, 1, __ATOMIC_ACQ_REL)) {
        int e = simcudaRegisterModule(&__simcuda_module_mblas);
        if (e)
            return e;
    }
    void *args[] = {&transa, &transb, &m, &n, &k, &alpha, &a, &lda, &b, &ldb, &beta, &c, &ldc};
    return cudaLaunchKernel((const void *)sgemm_stub, (dim3){1, 1, 1}, (dim3){256, 1, 1}, args, 0,
                            stream);
}

/* Which BLAS the kernel uses: 2 = ILP64 cblas, 1 = LP64 cblas, 0 = the built-in loop. */
SIMCUDA_EXPORT int mblas_backend(void) {
    pthread_once(&blas.once, find_blas);
    return blas.s64 ? 2 : blas.s32 ? 1 : 0;
}
