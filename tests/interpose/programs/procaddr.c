/* Launches that reach the driver only through cuGetProcAddress (as Triton or cuda-python do), once
 * with the legacy default stream and once asking for the per-thread variant. */
#include "../../cuda/programs/common.h"

int main(void) {
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUresult (*launch[2])(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                          unsigned, CUstream, void **, void **);
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress("cuLaunchKernel", (void **)&launch[0], 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    CHECK(cuGetProcAddress("cuLaunchKernel", (void **)&launch[1], 12000,
                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st));
    /* The kernel comes from a module loaded by file, the way a JIT hands it over. */
    const char *image = getenv("IMAGE");
    CUmodule mod;
    CHECK(cuModuleLoad(&mod, image));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "scale_inplace"));
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, 64));
    float ones[16];
    for (int i = 0; i < 16; i++)
        ones[i] = 1.0f;
    CHECK(cuMemcpyHtoD(buf, ones, 64));
    float s = 2.0f;
    int n = 16;
    void *args[] = {&buf, &s, &n};
    CHECK(launch[0](f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(launch[1](f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(ones, buf, 64));
    printf("value: %g\n", ones[0]);
    printf("func: %llu\n", (unsigned long long)(uintptr_t)f);
    return 0;
}
