/* A stale pointer: freed, then passed to a kernel. */
#include "common.h"

extern void scale_inplace(void);

int main(void) {
    float *x, *y;
    CHECK(cudaMalloc((void **)&x, 4096));
    CHECK(cudaMalloc((void **)&y, 4096));
    CHECK(cudaFree(y));
    int n = 8;
    float s = 2.0f;
    void *args[] = {&y, &s, &n};
    SHOW("stale launch", cudaLaunchKernel((const void *)scale_inplace, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, 0));
    SHOW("after", cudaMemset(x, 0, 16));
    return 0;
}
