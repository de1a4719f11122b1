/* Kernel node parameters and attributes as the driver takes them: a cooperative node refuses a
 * packed parameter buffer (extra) and takes kernelParams; under memcheck an access-policy window
 * that starts outside every allocation fails instantiation. */
#include "common.h"

extern void scale_inplace(void);

static CUfunction func(void) {
    cudaFunction_t f;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)scale_inplace));
    return (CUfunction)f;
}

int main(void) {
    enum { N = 64 };
    float *x, s = 2.0f;
    int n = N;
    CHECK(cudaMalloc((void **)&x, N * sizeof(float)));
    struct { float *x; float s; int n; } packed = {x, s, n};
    size_t len = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &len,
                     CU_LAUNCH_PARAM_END};
    void *args[] = {&x, &s, &n};
    CUDA_KERNEL_NODE_PARAMS p = {.func = func(), .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                 .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
    CUkernelNodeAttrValue coop;
    memset(&coop, 0, sizeof coop);
    coop.cooperative = 1;
    CUgraph g;
    CUgraphNode by_extra, by_params;
    CHECK(cuGraphCreate(&g, 0));
    p.extra = extra;
    CHECK(cuGraphAddKernelNode(&by_extra, g, NULL, 0, &p));
    SHOW("cooperative with extra",
         cuGraphKernelNodeSetAttribute(by_extra, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &coop));
    p.extra = NULL, p.kernelParams = args;
    CHECK(cuGraphAddKernelNode(&by_params, g, NULL, 0, &p));
    SHOW("cooperative with kernelParams",
         cuGraphKernelNodeSetAttribute(by_params, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &coop));
    p.kernelParams = NULL, p.extra = extra;
    SHOW("extra on a cooperative node", cuGraphKernelNodeSetParams(by_params, &p));
    CHECK(cuGraphDestroy(g));

    CUkernelNodeAttrValue w;
    memset(&w, 0, sizeof w);
    w.accessPolicyWindow = (CUaccessPolicyWindow){x, N * sizeof(float), 1.0f,
                                                  CU_ACCESS_PROPERTY_PERSISTING,
                                                  CU_ACCESS_PROPERTY_STREAMING};
    for (int inside = 1; inside >= 0; inside--) {
        CUgraphNode k;
        CUgraphExec ex;
        p.extra = NULL, p.kernelParams = args;
        CHECK(cuGraphCreate(&g, 0));
        CHECK(cuGraphAddKernelNode(&k, g, NULL, 0, &p));
        if (!inside)
            w.accessPolicyWindow.base_ptr = (char *)x + (1ull << 40);
        CHECK(cuGraphKernelNodeSetAttribute(k, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &w));
        CUresult e = cuGraphInstantiateWithFlags(&ex, g, 0);
        SHOW(inside ? "window inside" : "window outside", e);
        if (!e)
            CHECK(cuGraphExecDestroy(ex));
        CHECK(cuGraphDestroy(g));
    }
    return 0;
}
