/* Launches through the driver with the two kinds of kernel handle a library gives: a CUkernel
 * (cuLibraryGetKernel; cuLaunchKernel takes it) and the CUfunction made of it. */
#include <stdlib.h>

#include "../../cuda/programs/common.h"

extern void scale_inplace(void); /* links the test kernels, which the runtime then loads */

int main(void) {
    CHECK(cudaFree(0));
    printf("stub: %p\n", (void *)scale_inplace);
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    /* The library image, as a program would hold it: loaded again by the driver API. */
    const char *image = getenv("IMAGE");
    CUlibrary lib;
    FILE *fp = fopen(image, "rb");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    printf("image bytes: %zu\n", n);
    CHECK(cuLibraryLoadData(&lib, buf, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CUfunction f;
    CHECK(cuLibraryGetKernel(&k, lib, "scale_inplace"));
    CHECK(cuKernelGetFunction(&f, k));
    CUdeviceptr x;
    CHECK(cuMemAlloc(&x, 64 * sizeof(float)));
    CHECK(cuMemsetD8(x, 0, 64 * sizeof(float)));
    float s = 2.0f;
    int n64 = 64;
    void *params[] = {&x, &s, &n64};
    CHECK(cuLaunchKernel((CUfunction)k, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
    CHECK(cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
    printf("kernel: %llu\nfunction: %llu\n", (unsigned long long)(uintptr_t)k,
           (unsigned long long)(uintptr_t)f);
    return 0;
}
