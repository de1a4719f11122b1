/* Test kernels for simcuda: exported like nvcc output (host stubs dlsym can find). Each one is
 * shaped after a case Medusa must handle: plain pointers, a pointer inside a by-value struct,
 * a device-side array of pointers, a module global, dynamic shared memory. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "simcuda/simcuda.h"

struct vadd_args { float *out; const float *a; const float *b; int n; };
static void vadd(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct vadd_args *a = p;
    simcudaAccess(a->a, (size_t)a->n * 4, SIMCUDA_READ);
    simcudaAccess(a->b, (size_t)a->n * 4, SIMCUDA_READ);
    simcudaAccess(a->out, (size_t)a->n * 4, SIMCUDA_WRITE);
    simcudaCountRead(a->a, (size_t)a->n * 4);
    simcudaCountRead(a->b, (size_t)a->n * 4);
    for (int i = 0; i < a->n; i++)
        a->out[i] = a->a[i] + a->b[i];
}

struct scale_args { float *x; float s; int n; };
static void scale(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct scale_args *a = p;
    simcudaAccess(a->x, (size_t)a->n * 4, SIMCUDA_READ | SIMCUDA_WRITE);
    for (int i = 0; i < a->n; i++)
        a->x[i] *= a->s;
}

/* One by-value struct parameter holding two pointers. */
struct axpy_params { float *y; const float *x; float alpha; int n; };
struct axpy_args { struct axpy_params s; };
static void axpy(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct axpy_params *a = &((const struct axpy_args *)p)->s;
    simcudaAccess(a->x, (size_t)a->n * 4, SIMCUDA_READ);
    simcudaAccess(a->y, (size_t)a->n * 4, SIMCUDA_READ | SIMCUDA_WRITE);
    for (int i = 0; i < a->n; i++)
        a->y[i] += a->alpha * a->x[i];
}

/* out[i] = sum_k ptrs[k][i]: the pointers live in device memory, not in the parameters. */
struct gather_args { float *out; float *const *ptrs; int count; int n; };
static void gather(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct gather_args *a = p;
    simcudaAccess(a->ptrs, (size_t)a->count * sizeof *a->ptrs, SIMCUDA_READ);
    for (int k = 0; k < a->count; k++)
        simcudaAccess(a->ptrs[k], (size_t)a->n * 4, SIMCUDA_READ);
    simcudaAccess(a->out, (size_t)a->n * 4, SIMCUDA_WRITE);
    for (int i = 0; i < a->n; i++) {
        float s = 0;
        for (int k = 0; k < a->count; k++)
            s += a->ptrs[k][i];
        a->out[i] = s;
    }
}

/* x[i] += bias, where bias is the module global "bias". */
struct bias_args { float *x; int n; };
static void add_bias(const simcuda_kctx *ctx, const void *p) {
    const struct bias_args *a = p;
    simcudaAccess(ctx->globals[0], sizeof(float), SIMCUDA_READ);
    simcudaAccess(a->x, (size_t)a->n * 4, SIMCUDA_READ | SIMCUDA_WRITE);
    float bias = *(const float *)ctx->globals[0];
    for (int i = 0; i < a->n; i++)
        a->x[i] += bias;
}

/* Reverses x through dynamic shared memory, which must hold n floats. */
struct rev_args { float *x; int n; };
static void reverse_smem(const simcuda_kctx *ctx, const void *p) {
    const struct rev_args *a = p;
    simcudaAccess(a->x, (size_t)a->n * 4, SIMCUDA_READ | SIMCUDA_WRITE);
    float *tmp = ctx->shared;
    memcpy(tmp, a->x, (size_t)a->n * 4);
    for (int i = 0; i < a->n; i++)
        a->x[i] = tmp[a->n - 1 - i];
}

/* Does nothing: what a launch costs, measured without the kernel's work. */
static void noop(const simcuda_kctx *ctx, const void *p) {
    (void)ctx, (void)p;
    simcudaAccess(NULL, 0, 0); /* touches nothing */
}

/* simcudaParallel's parts: each adds 1 to out[part]. Part 0 waits (up to 2 s) until another
 * part has begun, so those run on other threads, and adds 1000 more if none did; part `bad`
 * faults (mode 1) or traps (mode 2). */
struct parts_args { int *out; int parts, bad, mode; };
static _Atomic int g_parts_begun;
static int *volatile g_nowhere = (int *)(uintptr_t)8; /* no page there */
static void one_part(void *arg, int part) {
    const struct parts_args *a = arg;
    if (part == 0) {
        struct timespec ts = {0, 1000000};
        int i = 0;
        for (; i < 2000 && atomic_load(&g_parts_begun) == 0; i++)
            nanosleep(&ts, NULL);
        if (i == 2000)
            a->out[0] += 1000; /* no other part began: they run after it, on this thread */
    } else {
        atomic_fetch_add(&g_parts_begun, 1);
    }
    if (part == a->bad && a->mode == 1)
        *g_nowhere = 1;
    if (part == a->bad && a->mode == 2)
        simcudaTrap("part trapped");
    a->out[part] += 1;
}
static void parts(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct parts_args *a = p;
    simcudaAccess(a->out, (size_t)a->parts * 4, SIMCUDA_READ | SIMCUDA_WRITE);
    atomic_store(&g_parts_begun, 0);
    simcudaParallel(a->parts, one_part, (void *)a);
}

SIMCUDA_STUB(vector_add)
SIMCUDA_STUB(scale_inplace)
SIMCUDA_STUB(axpy_struct)
SIMCUDA_STUB(gather_ptrs)
SIMCUDA_STUB(add_global_bias)
SIMCUDA_STUB(reverse_smem_kernel)
SIMCUDA_STUB(noop_kernel)
SIMCUDA_STUB(parts_kernel)

static const simcuda_kernel_desc kernels[] = {
    {"vector_add", "p p p i", vadd, vector_add},
    {"scale_inplace", "p f i", scale, scale_inplace},
    {"axpy_struct", "s24@0,8", axpy, axpy_struct},
    {"gather_ptrs", "p p i i", gather, gather_ptrs},
    {"add_global_bias", "p i", add_bias, add_global_bias},
    {"reverse_smem_kernel", "p i", reverse_smem, reverse_smem_kernel},
    {"noop_kernel", "p i", noop, noop_kernel},
    {"parts_kernel", "p i i i", parts, parts_kernel},
};

static const float bias_init = 1.5f;
static const simcuda_global_desc globals[] = {{"bias", sizeof(float), &bias_init}};

SIMCUDA_MODULE(testkernels, kernels, globals, 1)
