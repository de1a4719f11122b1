/* testblas: a stand-in for cuBLAS. Its kernels are not exported and its module is registered only
 * when the library is first used, so a new process cannot find them until that happens. */
#include <cuda_runtime_api.h>

#include "simcuda/simcuda.h"

/* C[m x n] = A[m x k] * B[k x n], row-major. */
struct sgemm_args { int m, n, k; const float *a; const float *b; float *c; };
static void sgemm(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct sgemm_args *g = p;
    simcudaAccess(g->a, (size_t)g->m * g->k * 4, SIMCUDA_READ);
    simcudaAccess(g->b, (size_t)g->k * g->n * 4, SIMCUDA_READ);
    simcudaAccess(g->c, (size_t)g->m * g->n * 4, SIMCUDA_WRITE);
    simcudaCountRead(g->a, (size_t)g->m * g->k * 4);
    simcudaCountRead(g->b, (size_t)g->k * g->n * 4);
    for (int i = 0; i < g->m; i++)
        for (int j = 0; j < g->n; j++) {
            float s = 0;
            for (int l = 0; l < g->k; l++)
                s += g->a[i * g->k + l] * g->b[l * g->n + j];
            g->c[i * g->n + j] = s;
        }
}

SIMCUDA_HIDDEN_STUB(sgemm_stub)

static const simcuda_kernel_desc kernels[] = {
    {"_ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf", "i i i p p p", sgemm, (const void *)sgemm_stub},
};

SIMCUDA_MODULE_LAZY(testblas, kernels, NULL, 0)

static int registered;

/* The public entry point, like cublasSgemm: registers its module on first use, then launches. */
SIMCUDA_EXPORT int testblas_sgemm(int m, int n, int k, const float *a, const float *b, float *c,
                                  cudaStream_t stream) {
    if (!__atomic_exchange_n(&registered, 1, __ATOMIC_ACQ_REL)) {
        int e = simcudaRegisterModule(&__simcuda_module_testblas);
        if (e)
            return e;
    }
    void *args[] = {&m, &n, &k, &a, &b, &c};
    return cudaLaunchKernel((const void *)sgemm_stub, (dim3){1, 1, 1}, (dim3){128, 1, 1}, args, 0, stream);
}
