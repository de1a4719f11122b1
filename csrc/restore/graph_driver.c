/* The CUDA driver's graph API for restore, from cuGetProcAddress like any CUDA library's. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "graph_driver.h"
#include "restore.h"

#define EXPORT __attribute__((visibility("default")))

static mr_driver D;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *gp = dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    if (!gp) {
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        gp = h ? dlsym(h, "cuGetProcAddress_v2") : NULL;
    }
    PFN_cuGetProcAddress_v12000 get = (PFN_cuGetProcAddress_v12000)gp;
    if (!get)
        return;
    CUdriverProcAddressQueryResult st;
    int ok = 1;
#define GET(f, n, v) ok &= get(n, (void **)&D.f, v, 0, &st) == CUDA_SUCCESS;
    GET(create, "cuGraphCreate", 10000)
    GET(destroy, "cuGraphDestroy", 10000)
    GET(kernel, "cuGraphAddKernelNode", 12000)
    GET(memcpy_, "cuGraphAddMemcpyNode", 10000)
    GET(memset_, "cuGraphAddMemsetNode", 10000)
    GET(empty, "cuGraphAddEmptyNode", 10000)
    GET(deps, "cuGraphAddDependencies", 12030)
    GET(attr, "cuGraphKernelNodeSetAttribute", 11000)
    GET(instantiate, "cuGraphInstantiateWithFlags", 11040)
    GET(upload, "cuGraphUpload", 11010)
    GET(exec_destroy, "cuGraphExecDestroy", 10000)
    GET(ctx, "cuCtxGetCurrent", 4000)
#undef GET
    if (get("cuGraphKernelNodeSetParams", (void **)&D.kernel_set, 12000, 0, &st) != CUDA_SUCCESS)
        D.kernel_set = NULL;
    if (get("cuGetErrorName", (void **)&D.name, 6000, 0, &st) != CUDA_SUCCESS)
        D.name = NULL;
    D.ok = ok;
}

const mr_driver *mr_driver_api(void) {
    pthread_once(&once, load);
    return &D;
}

EXPORT int mr_abi_version(void) { return MR_ABI_VERSION; }

void mr_failed(char *err, size_t errlen, const char *where, const char *call, CUresult e) {
    const char *name = NULL;
    if (!D.name || D.name(e, &name) != CUDA_SUCCESS || !name)
        name = "CUDA error";
    snprintf(err, errlen, "%s%s%s failed: %s (%d)", where, *where ? ": " : "", call, name, (int)e);
}
