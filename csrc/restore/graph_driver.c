/* The CUDA driver's graph API for restore, from cuGetProcAddress like any CUDA library's. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

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
#define OPTIONAL(f, n, v)                                                                          \
    if (get(n, (void **)&D.f, v, 0, &st) != CUDA_SUCCESS)                                          \
        D.f = NULL;
    OPTIONAL(kernel_set, "cuGraphKernelNodeSetParams", 12000)
    OPTIONAL(name, "cuGetErrorName", 6000)
    OPTIONAL(func_name, "cuFuncGetName", 12030)
    OPTIONAL(library_kernel, "cuLibraryGetKernel", 12000)
    OPTIONAL(kernel_function, "cuKernelGetFunction", 12000)
    OPTIONAL(module_function, "cuModuleGetFunction", 2000)
#undef OPTIONAL
    D.ok = ok;
}

const mr_driver *mr_driver_api(void) {
    pthread_once(&once, load);
    return &D;
}

EXPORT int mr_abi_version(void) { return MR_ABI_VERSION; }

/* ---- finding kernels (medusa.restore.kernels): the driver functions are looked up once, here,
 * and a plan's stubs are all checked in one call (a few Python calls per kernel were a visible
 * share of a restore) ---- */
EXPORT int mr_find_stubs(uint32_t n, const char *const *symbols, const char *const *names,
                         void *get_func_by_symbol, uint64_t *funcs) {
    typedef int (*get_fn)(void **func, const void *symbol); /* cudaGetFuncBySymbol */
    get_fn get = (get_fn)get_func_by_symbol;
    const mr_driver *d = mr_driver_api();
    for (uint32_t i = 0; i < n; i++) {
        funcs[i] = 0;
        void *stub = symbols[i] ? dlsym(RTLD_DEFAULT, symbols[i]) : NULL;
        void *f = NULL;
        if (!stub || get(&f, stub) != 0)
            continue;
        if (!d->func_name)
            return -1;
        const char *got = NULL;
        if (d->func_name(&got, (CUfunction)f) == CUDA_SUCCESS && got && !strcmp(got, names[i]))
            funcs[i] = (uint64_t)(uintptr_t)f;
    }
    return 0;
}

EXPORT int mr_image_function(void *handle, int is_library, const char *name, CUfunction *out) {
    const mr_driver *d = mr_driver_api();
    if (!is_library)
        return d->module_function ? (int)d->module_function(out, (CUmodule)handle, name) : -1;
    if (!d->library_kernel || !d->kernel_function)
        return -1;
    CUkernel k;
    CUresult e = d->library_kernel(&k, (CUlibrary)handle, name);
    return (int)(e ? e : d->kernel_function(out, k));
}

void mr_failed(char *err, size_t errlen, const char *where, const char *call, CUresult e) {
    const char *name = NULL;
    if (!D.name || D.name(e, &name) != CUDA_SUCCESS || !name)
        name = "CUDA error";
    snprintf(err, errlen, "%s%s%s failed: %s (%d)", where, *where ? ": " : "", call, name, (int)e);
}
