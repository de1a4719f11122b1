/* A graph whose nodes' accesses are known: c = a + b; c *= 2; d = sum of the arrays listed in
 * ptrs (an indirect access through device memory); and a node that is passed pointers it never
 * dereferences (n = 0). Eager launches first, as an engine's warm-up before capture. */
#include "../../cuda/programs/common.h"

extern void vector_add(void);
extern void scale_inplace(void);
extern void gather_ptrs(void);

#define N 4096 /* floats: 16 KiB, four pages per array */

static void step(cudaStream_t s, float **a, float **b, float **c, float **d, float **idle,
                 float ***ptrs) {
    int n = N, zero = 0, count = 2;
    float two = 2.0f;
    void *add[] = {c, a, b, &n}, *scale[] = {c, &two, &n}, *gather[] = {d, ptrs, &count, &n};
    void *unused[] = {idle, a, b, &zero};
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){1, 1, 1}, (dim3){256, 1, 1}, add, 0, s));
    CHECK(cudaLaunchKernel((const void *)scale_inplace, (dim3){1, 1, 1}, (dim3){256, 1, 1}, scale, 0, s));
    CHECK(cudaLaunchKernel((const void *)gather_ptrs, (dim3){1, 1, 1}, (dim3){256, 1, 1}, gather, 0, s));
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){1, 1, 1}, (dim3){256, 1, 1}, unused, 0, s));
}

int main(int argc, char **argv) {
    int replay = argc > 1 && strcmp(argv[1], "replay") == 0;
    float *a, *b, *c, *d, *idle, **ptrs, host[N];
    CHECK(cudaMalloc((void **)&a, N * 4));
    CHECK(cudaMalloc((void **)&b, N * 4));
    CHECK(cudaMalloc((void **)&c, N * 4));
    CHECK(cudaMalloc((void **)&d, N * 4));
    CHECK(cudaMalloc((void **)&idle, N * 4));
    CHECK(cudaMalloc((void **)&ptrs, 4096));
    for (int i = 0; i < N; i++)
        host[i] = (float)i;
    CHECK(cudaMemcpy(a, host, N * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, host, N * 4, cudaMemcpyHostToDevice));
    float *list[2] = {a, c};
    CHECK(cudaMemcpy(ptrs, list, sizeof list, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    step(s, &a, &b, &c, &d, &idle, &ptrs); /* warm-up */
    CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    step(s, &a, &b, &c, &d, &idle, &ptrs);
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    if (replay)
        CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host, d, N * 4, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < N; i++)
        sum += host[i];
    printf("checksum: %.1f\n", sum);
    return 0;
}
