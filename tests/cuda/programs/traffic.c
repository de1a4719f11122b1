/* Traffic counters: a kernel reading one device and one host-mapped buffer. */
#include "common.h"
#include "simcuda/simcuda.h"

extern void vector_add(void);

int main(void) {
    enum { N = 1000 };
    float *dev, *out, *host, *host_dev;
    CHECK(cudaMalloc((void **)&dev, N * 4));
    CHECK(cudaMalloc((void **)&out, N * 4));
    CHECK(cudaHostAlloc((void **)&host, N * 4, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&host_dev, host, 0));
    int n = N;
    void *args[] = {&out, &dev, &host_dev, &n};
    simcudaResetTraffic();
    CHECK(cudaLaunchKernel((const void *)vector_add, (dim3){4, 1, 1}, (dim3){256, 1, 1}, args, 0, 0));
    uint64_t t[3];
    simcudaGetTraffic(t);
    printf("device: %llu\nhost: %llu\n", (unsigned long long)t[0], (unsigned long long)t[1]);
    return 0;
}
