/* A hidden (cuBLAS-like) kernel: no exported symbol; its module appears at first use; afterwards
 * it is found through the graph node's function, its module and enumeration. */
#include <dlfcn.h>
#include "common.h"

int testblas_sgemm(int m, int n, int k, const float *a, const float *b, float *c, cudaStream_t s);

int main(void) {
    CHECK(cudaFree(0));
    printf("exported: %d\n", dlsym(RTLD_DEFAULT, "_ZN7testblas11sgemm_nn_f3EiiiPKfS1_Pf") != NULL);
    fprintf(stderr, "marker: before first use\n");
    float *a, *b, *c, ha[4] = {1, 2, 3, 4}, hc[4];
    CHECK(cudaMalloc((void **)&a, 16));
    CHECK(cudaMalloc((void **)&b, 16));
    CHECK(cudaMalloc((void **)&c, 16));
    CHECK(cudaMemcpy(a, ha, 16, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, ha, 16, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(testblas_sgemm(2, 2, 2, a, b, c, s));
    fprintf(stderr, "marker: after first use\n");
    CHECK(cudaMemcpy(hc, c, 16, cudaMemcpyDeviceToHost));
    printf("product: %g %g %g %g\n", hc[0], hc[1], hc[2], hc[3]);
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(testblas_sgemm(2, 2, 2, a, b, c, s));
    CHECK(cudaStreamEndCapture(s, &g));
    cudaGraphNode_t node;
    size_t n = 1;
    CHECK(cudaGraphGetNodes(g, &node, &n));
    struct cudaKernelNodeParams rp;
    SHOW("runtime params", cudaGraphKernelNodeGetParams(node, &rp));
    CUDA_KERNEL_NODE_PARAMS p;
    CHECK(cuGraphKernelNodeGetParams((CUgraphNode)node, &p));
    CUmodule mod;
    CHECK(cuFuncGetModule(&mod, p.func));
    unsigned count = 0;
    CHECK(cuModuleGetFunctionCount(&count, mod));
    CUfunction fs[8];
    CHECK(cuModuleEnumerateFunctions(fs, count, mod));
    for (unsigned i = 0; i < count; i++) {
        const char *name;
        CHECK(cuFuncGetName(&name, fs[i]));
        size_t off, size;
        int np = 0;
        while (cuFuncGetParamInfo(fs[i], (size_t)np, &off, &size) == CUDA_SUCCESS)
            np++;
        printf("enumerated: %s params=%d same=%d\n", name, np, fs[i] == p.func);
    }
    return 0;
}
