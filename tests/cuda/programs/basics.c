/* Exercises the runtime: allocation reuse, copies, eager launch vs graph replay, capture rules. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

extern void vector_add(void);
extern void scale_inplace(void);

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_) {                                                                                  \
            printf("FAIL %s -> %s\n", #x, cudaGetErrorName(e_));                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(void) {
    enum { N = 1024 };
    float h[N], out_eager[N], out_graph[N];
    float *a, *b, *c;
    CHECK(cudaMalloc((void **)&a, N * 4));
    printf("first: %p\n", (void *)a);
    CHECK(cudaFree(a));
    CHECK(cudaMalloc((void **)&a, N * 4));
    printf("reused: %p\n", (void *)a);
    CHECK(cudaMalloc((void **)&b, N * 4));
    CHECK(cudaMalloc((void **)&c, N * 4));
    for (int i = 0; i < N; i++)
        h[i] = (float)i * 0.5f;
    CHECK(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, h, sizeof h, cudaMemcpyHostToDevice));
    int n = N;
    float s = 3.0f;
    void *add_args[] = {&c, &a, &b, &n};
    void *scale_args[] = {&c, &s, &n};
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){4, 1, 1}, (dim3){256, 1, 1}, add_args, 0, st));
    CHECK(cudaLaunchKernel((const void *)scale_inplace, (dim3){4, 1, 1}, (dim3){256, 1, 1}, scale_args, 0, st));
    /* NOTE: built with per-thread default streams, cudaMemcpy does not wait for st by itself */
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemcpy(out_eager, c, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaMemsetAsync(c, 0, N * 4, st)); /* on st: ordered before the graph launch */
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){4, 1, 1}, (dim3){256, 1, 1}, add_args, 0, st));
    CHECK(cudaLaunchKernel((const void *)scale_inplace, (dim3){4, 1, 1}, (dim3){256, 1, 1}, scale_args, 0, st));
    CHECK(cudaStreamEndCapture(st, &g));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &nodes));
    printf("nodes: %zu\n", nodes);
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaGraphLaunch(x, st));
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaMemcpy(out_graph, c, sizeof h, cudaMemcpyDeviceToHost));
    printf("identical: %d\n", memcmp(out_eager, out_graph, sizeof h) == 0);
    /* a synchronising call during capture fails the capture */
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    cudaError_t e = cudaDeviceSynchronize();
    printf("sync during capture: %s\n", cudaGetErrorName(e));
    cudaGraph_t g2 = (cudaGraph_t)1;
    e = cudaStreamEndCapture(st, &g2);
    printf("end capture: %s graph=%p\n", cudaGetErrorName(e), (void *)g2);
    return 0;
}
