/* Library, module, kernel and function handles are four kinds, as in the driver: each API takes
 * its own kind and answers another with CUDA_ERROR_INVALID_HANDLE. Prints one line per check. */
#include "common.h"

#define IS(label, x, want) printf("%s: %s\n", label, (x) == (want) ? "ok" : cudaGetErrorName((cudaError_t)(x)))

extern void scale_inplace(void);

int main(void) {
    CHECK(cudaFree(0));
    cudaKernel_t rk;
    cudaFunction_t rf;
    CHECK(cudaGetKernel(&rk, (const void *)scale_inplace));
    CHECK(cudaGetFuncBySymbol(&rf, (const void *)scale_inplace));
    CUkernel k = (CUkernel)rk;
    CUfunction f = (CUfunction)rf, f2;
    CHECK(cuKernelGetFunction(&f2, k));
    IS("function of kernel", f2 == f, 1);
    IS("kernel is not function", (void *)k != (void *)f, 1);
    size_t off, size;
    IS("func param info on kernel", cuFuncGetParamInfo((CUfunction)k, 0, &off, &size), CUDA_ERROR_INVALID_HANDLE);
    IS("kernel param info on function", cuKernelGetParamInfo((CUkernel)f, 0, &off, &size), CUDA_ERROR_INVALID_HANDLE);
    IS("func param info", cuFuncGetParamInfo(f, 1, &off, &size), CUDA_SUCCESS);
    IS("kernel param info", cuKernelGetParamInfo(k, 1, &off, &size), CUDA_SUCCESS);
    IS("past the last param", cuFuncGetParamInfo(f, 3, &off, &size), CUDA_ERROR_INVALID_VALUE);
    IS("set attribute on kernel",
       cuFuncSetAttribute((CUfunction)k, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024),
       CUDA_ERROR_INVALID_HANDLE);
    IS("set attribute", cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024), CUDA_SUCCESS);
    /* the module of a function is not the library of its kernel; cuLibraryGetModule relates them */
    CUlibrary lib;
    CUmodule mod, libmod;
    CHECK(cuKernelGetLibrary(&lib, k));
    CHECK(cuFuncGetModule(&mod, f));
    CHECK(cuLibraryGetModule(&libmod, lib));
    IS("module is not library", (void *)mod != (void *)lib, 1);
    IS("module of library", mod == libmod, 1);
    IS("library of function", cuKernelGetLibrary(&lib, (CUkernel)f), CUDA_ERROR_INVALID_HANDLE);
    CUkernel k2;
    IS("kernel from module", cuLibraryGetKernel(&k2, (CUlibrary)mod, "scale_inplace"), CUDA_ERROR_INVALID_HANDLE);
    CUdeviceptr g1 = 0, g2 = 0;
    size_t n1, n2;
    IS("library global", cuLibraryGetGlobal(&g1, &n1, lib, "bias"), CUDA_SUCCESS);
    IS("module global", cuModuleGetGlobal(&g2, &n2, mod, "bias"), CUDA_SUCCESS);
    IS("same global", g1 == g2 && n1 == n2, 1);
    /* a kernel node's func is a CUfunction; a CUkernel goes in kern */
    CUgraph g;
    CUgraphNode node;
    CHECK(cuGraphCreate(&g, 0));
    CUdeviceptr x;
    CHECK(cuMemAlloc(&x, 256));
    float s = 2.0f;
    int n = 64;
    void *params[] = {&x, &s, &n};
    CUDA_KERNEL_NODE_PARAMS p = {0};
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 64, p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = params;
    p.func = (CUfunction)k;
    IS("node func is kernel", cuGraphAddKernelNode(&node, g, NULL, 0, &p), CUDA_ERROR_INVALID_HANDLE);
    p.func = NULL, p.kern = k;
    IS("node kern", cuGraphAddKernelNode(&node, g, NULL, 0, &p), CUDA_SUCCESS);
    p.kern = NULL, p.func = f;
    IS("node func", cuGraphAddKernelNode(&node, g, NULL, 0, &p), CUDA_SUCCESS);
    IS("launch kernel", cuLaunchKernel((CUfunction)k, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    IS("launch function", cuLaunchKernel(f, 1, 1, 1, 64, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    return 0;
}
