/* A capture made entirely through entry points from cuGetProcAddress, the way a static libcudart
 * reaches the driver: begin-capture asked for at CUDA 10.0 (the v1 variant, no mode argument) and
 * at 12.0 (v2: simcuda, like a driver may, hands out an internal entry rather than the exported
 * symbol's address), launches and end-capture, then "cuGraphInstantiate" (the five-argument
 * variant) and a launch of the graph. */
#include <stdbool.h>

#include "../../cuda/programs/common.h"

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static void *proc(const char *name, int version, cuuint64_t flags) {
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress(name, &fn, version, flags, &st));
    return fn;
}

static CUgraph capture(CUstream s, bool v1, launch_fn launch, CUfunction f, void **args) {
    CUresult (*end)(CUstream, CUgraph *) = proc("cuStreamEndCapture", 12000, 0);
    if (v1) {
        CUresult (*begin)(CUstream) = proc("cuStreamBeginCapture", 10000, 0);
        CHECK(begin(s));
    } else {
        CUresult (*begin)(CUstream, CUstreamCaptureMode) = proc("cuStreamBeginCapture", 12000, 0);
        CHECK(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    }
    CHECK(launch(f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
    CUgraph g;
    CHECK(end(s, &g));
    return g;
}

int main(void) {
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CHECK(cuModuleLoad(&mod, getenv("IMAGE")));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, "scale_inplace"));
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, 64));
    float v[16];
    for (int i = 0; i < 16; i++)
        v[i] = 1.0f;
    CHECK(cuMemcpyHtoD(buf, v, 64));
    float scale = 2.0f;
    int n = 16;
    void *args[] = {&buf, &scale, &n};
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    launch_fn launch = proc("cuLaunchKernel", 12000, 0);
    CUresult (*instantiate)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t) =
        proc("cuGraphInstantiate", 12000, 0);
    CUresult (*graph_launch)(CUgraphExec, CUstream) = proc("cuGraphLaunch", 12000, 0);
    for (int v1 = 1; v1 >= 0; v1--) {
        CUgraph g = capture(s, v1, launch, f, args);
        CUgraphExec exec;
        CUgraphNode err = NULL;
        char log[64];
        CHECK(instantiate(&exec, g, &err, log, sizeof log));
        CHECK(graph_launch(exec, s));
    }
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemcpyDtoH(v, buf, 64));
    printf("value: %g\n", v[0]);
    return 0;
}
