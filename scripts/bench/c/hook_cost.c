/* Median cost per call of cudaMalloc+cudaFree and of cudaLaunchKernel, in microseconds. Run once
 * plainly and once under the recorder; the difference is what recording adds. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern void vector_add(void);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = 31, calls = argc > 1 ? atoi(argv[1]) : 2000;
    float *a;
    int n = 1;
    cudaMalloc((void **)&a, 64);
    void *args[] = {&a, &a, &a, &n};
    cudaStream_t s;
    cudaStreamCreate(&s);
    double alloc[64], launch[64];
    for (int r = 0; r < rounds; r++) {
        double t0 = now_us();
        for (int i = 0; i < calls; i++) {
            void *p;
            cudaMalloc(&p, 256);
            cudaFree(p);
        }
        alloc[r] = (now_us() - t0) / calls / 2;
        t0 = now_us();
        for (int i = 0; i < calls; i++)
            cudaLaunchKernel((const void *)vector_add, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, s);
        launch[r] = (now_us() - t0) / calls;
    }
    qsort(alloc, rounds, sizeof *alloc, cmp);
    qsort(launch, rounds, sizeof *launch, cmp);
    printf("%.4f %.4f\n", alloc[rounds / 2], launch[rounds / 2]);
    return 0;
}
