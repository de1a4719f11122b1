/* The parameter shapes Medusa must relocate: struct-held pointers, a device-side pointer array,
 * a module global; eager and graph replay must agree, and param info must be the true layout. */
#include "common.h"

extern void axpy_struct(void);
extern void gather_ptrs(void);
extern void add_global_bias(void);

struct axpy_params { float *y; const float *x; float alpha; int n; };

int main(void) {
    enum { N = 64 };
    float h[N], out[N], *x, *y, *o, **table;
    for (int i = 0; i < N; i++)
        h[i] = (float)i;
    CHECK(cudaMalloc((void **)&x, sizeof h));
    CHECK(cudaMalloc((void **)&y, sizeof h));
    CHECK(cudaMalloc((void **)&o, sizeof h));
    CHECK(cudaMalloc((void **)&table, 2 * sizeof(float *)));
    CHECK(cudaMemcpy(x, h, sizeof h, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, h, sizeof h, cudaMemcpyHostToDevice));
    float *ptrs[2] = {x, y};
    CHECK(cudaMemcpy(table, ptrs, sizeof ptrs, cudaMemcpyHostToDevice));
    struct axpy_params ap = {y, x, 0.5f, N};
    int n = N, two = 2;
    void *axpy_args[] = {&ap};
    void *gather_args[] = {&o, &table, &two, &n};
    void *bias_args[] = {&o, &n};
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaLaunchKernel((const void *)axpy_struct, (dim3){1, 1, 1}, (dim3){64, 1, 1}, axpy_args, 0, s));
    CHECK(cudaLaunchKernel((const void *)gather_ptrs, (dim3){1, 1, 1}, (dim3){64, 1, 1}, gather_args, 0, s));
    CHECK(cudaLaunchKernel((const void *)add_global_bias, (dim3){1, 1, 1}, (dim3){64, 1, 1}, bias_args, 0, s));
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ex;
    CHECK(cudaGraphInstantiate(&ex, g, 0));
    CHECK(cudaGraphLaunch(ex, s));
    CHECK(cudaMemcpy(out, o, sizeof h, cudaMemcpyDeviceToHost));
    /* y = 1.5 i, out = x + y + 1.5 = 2.5 i + 1.5 */
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= out[i] == 2.5f * (float)i + 1.5f;
    printf("graph result ok: %d\n", ok);
    cudaFunction_t f;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)axpy_struct));
    size_t off, size;
    CHECK(cuFuncGetParamInfo((CUfunction)f, 0, &off, &size));
    printf("axpy param0 offset=%zu size=%zu\n", off, size);
    SHOW("axpy param1", cuFuncGetParamInfo((CUfunction)f, 1, &off, &size));
    CHECK(cudaGetFuncBySymbol(&f, (const void *)gather_ptrs));
    CHECK(cuFuncGetParamInfo((CUfunction)f, 3, &off, &size));
    printf("gather param3 offset=%zu size=%zu\n", off, size);
    CUmodule m;
    CHECK(cuFuncGetModule(&m, (CUfunction)f));
    CUdeviceptr gp;
    size_t gs;
    CHECK(cuModuleGetGlobal(&gp, &gs, m, "bias"));
    float bias;
    CHECK(cudaMemcpy(&bias, (void *)gp, 4, cudaMemcpyDeviceToHost));
    printf("global bias=%g size=%zu\n", bias, gs);
    return 0;
}
