/* Median cost of an eager launch and of a replayed graph node on simcuda, in microseconds. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern void noop_kernel(void);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(void) {
    enum { ROUNDS = 51, LAUNCHES = 2000, NODES = 1000 };
    float *p;
    int n = 1;
    cudaMalloc((void **)&p, 64);
    void *args[] = {&p, &n};
    cudaStream_t s;
    cudaStreamCreate(&s);
    double eager[ROUNDS], replay[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_us();
        for (int i = 0; i < LAUNCHES; i++)
            cudaLaunchKernel((const void *)noop_kernel, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, s);
        eager[r] = (now_us() - t0) / LAUNCHES;
    }
    cudaGraph_t g;
    cudaGraphExec_t x;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < NODES; i++)
        cudaLaunchKernel((const void *)noop_kernel, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, s);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&x, g, 0);
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_us();
        cudaGraphLaunch(x, s);
        replay[r] = (now_us() - t0) / NODES;
    }
    qsort(eager, ROUNDS, sizeof(double), cmp);
    qsort(replay, ROUNDS, sizeof(double), cmp);
    printf("%.4f %.4f\n", eager[ROUNDS / 2], replay[ROUNDS / 2]);
    return cudaGetLastError() != cudaSuccess;
}
