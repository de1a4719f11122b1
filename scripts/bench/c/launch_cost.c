/* What simcuda costs, median over rounds: an eager launch (queued, then run by the
 * synchronization after a batch of them), a replayed graph node (the launch and its
 * synchronization, per node), both in microseconds, and a 512 MiB upload from pageable memory
 * (cudaMemcpy), in milliseconds. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern void noop_kernel(void);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

int main(void) {
    enum { ROUNDS = 51, LAUNCHES = 2000, NODES = 1000, UPLOADS = 5 };
    const size_t upload = (size_t)512 << 20;
    float *p;
    int n = 1;
    cudaMalloc((void **)&p, 64);
    void *args[] = {&p, &n};
    cudaStream_t s;
    cudaStreamCreate(&s);
    double eager[ROUNDS], replay[ROUNDS], up[UPLOADS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_us();
        for (int i = 0; i < LAUNCHES; i++)
            cudaLaunchKernel((const void *)noop_kernel, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, s);
        cudaStreamSynchronize(s);
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
        cudaStreamSynchronize(s);
        replay[r] = (now_us() - t0) / NODES;
    }
    char *src = malloc(upload), *dst;
    memset(src, 1, upload);
    cudaMalloc((void **)&dst, upload);
    for (int r = 0; r < UPLOADS; r++) {
        double t0 = now_us();
        cudaMemcpy(dst, src, upload, cudaMemcpyHostToDevice);
        up[r] = (now_us() - t0) / 1e3;
    }
    printf("%.4f %.4f %.1f\n", median(eager, ROUNDS), median(replay, ROUNDS), median(up, UPLOADS));
    return cudaGetLastError() != cudaSuccess;
}
