/* What a driver of MEDUSA_SIM_DRIVER_VERSION offers: its version, and which newer entry points
 * cuGetProcAddress, the exported symbols and the runtime's lookups answer. */
#include "common.h"

#define CU(label, x) printf("%s: %s\n", label, cu_name(x))

static const char *cu_name(CUresult r) {
    const char *s = "?";
    cuGetErrorName(r, &s);
    return s;
}

extern void scale_inplace(void);

int main(void) {
    CHECK(cudaFree(0));
    int v = 0;
    CHECK(cuDriverGetVersion(&v));
    printf("version: %d\n", v);
    static const char *const names[] = {"cuFuncGetParamInfo", "cuKernelGetLibrary", "cuFuncGetName"};
    for (int i = 0; i < 3; i++) {
        void *fn;
        CUdriverProcAddressQueryResult st;
        char label[64];
        snprintf(label, sizeof label, "lookup %s", names[i]);
        CU(label, cuGetProcAddress(names[i], &fn, CUDA_VERSION, 0, &st));
    }
    cudaFunction_t f;
    cudaKernel_t k;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)scale_inplace));
    CHECK(cudaGetKernel(&k, (const void *)scale_inplace));
    size_t off, size;
    CU("call cuFuncGetParamInfo", cuFuncGetParamInfo((CUfunction)f, 0, &off, &size));
    CU("call cuKernelGetParamInfo", cuKernelGetParamInfo((CUkernel)k, 0, &off, &size));
    void *fn;
    SHOW("runtime lookup by version", cudaGetDriverEntryPointByVersion("cuInit", &fn, 12000, 0, NULL));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* what a 12.4 runtime has */
    SHOW("runtime lookup", cudaGetDriverEntryPoint("cuInit", &fn, 0, NULL));
#pragma GCC diagnostic pop
    return 0;
}
