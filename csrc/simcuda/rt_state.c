/* Runtime state: lazy init through cuGetProcAddress, last error, module registration, stubs. */
#include <dlfcn.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

unsigned char *sim_image_build(const simcuda_module_desc *d, size_t *size); /* image.c */

rt_driver rt_drv;

typedef struct {
    const void *stub;
    CUkernel kernel;
    CUfunction func; /* from kernel, on first use (loading it, as lazy loading does) */
} stub_slot;

/* The runtime's one registry: modules waiting for init, and the host-stub map. */
static struct {
    pthread_mutex_t lock;
    pthread_once_t once;
    cudaError_t init_error;
    bool started;
    const simcuda_module_desc *pending[256];
    int num_pending;
    stub_slot *stubs;
    size_t stub_cap, num_stubs;
} rt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_ONCE_INIT, cudaSuccess, false, {0}, 0, NULL, 0, 0};

static __thread cudaError_t t_last;

cudaError_t rt_set(cudaError_t err) {
    if (err)
        t_last = err;
    return err;
}

cudaError_t rt_ret(CUresult err) { return rt_set((cudaError_t)err); }

RT_API cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

RT_API cudaError_t cudaPeekAtLastError(void) { return t_last; }

static size_t stub_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ULL;
    return (size_t)(x >> 20);
}

static void stub_put(const void *stub, CUkernel k, CUfunction f) {
    if ((rt.num_stubs + 1) * 2 > rt.stub_cap) {
        stub_slot *old = rt.stubs;
        size_t oldcap = rt.stub_cap;
        rt.stub_cap = rt.stub_cap ? rt.stub_cap * 2 : 256;
        rt.stubs = calloc(rt.stub_cap, sizeof *rt.stubs);
        rt.num_stubs = 0;
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].stub)
                stub_put(old[i].stub, old[i].kernel, old[i].func);
        free(old);
    }
    size_t i = stub_hash(stub) & (rt.stub_cap - 1);
    while (rt.stubs[i].stub && rt.stubs[i].stub != stub)
        i = (i + 1) & (rt.stub_cap - 1);
    rt.num_stubs += !rt.stubs[i].stub;
    rt.stubs[i] = (stub_slot){stub, k, f};
}

/* The slot of stub, or NULL; called with rt.lock held. */
static stub_slot *stub_find(const void *stub) {
    if (!rt.stub_cap || !stub)
        return NULL;
    size_t i = stub_hash(stub) & (rt.stub_cap - 1);
    while (rt.stubs[i].stub && rt.stubs[i].stub != stub)
        i = (i + 1) & (rt.stub_cap - 1);
    return rt.stubs[i].stub ? &rt.stubs[i] : NULL;
}

CUkernel rt_kernel_of_stub(const void *stub) {
    pthread_mutex_lock(&rt.lock);
    stub_slot *s = stub_find(stub);
    CUkernel k = s ? s->kernel : NULL;
    pthread_mutex_unlock(&rt.lock);
    return k;
}

CUfunction rt_func_of_stub(const void *stub) {
    pthread_mutex_lock(&rt.lock);
    stub_slot *s = stub_find(stub);
    if (s && !s->func && rt_drv.kernelGetFunction(&s->func, s->kernel))
        s->func = NULL;
    CUfunction f = s ? s->func : NULL;
    pthread_mutex_unlock(&rt.lock);
    return f;
}

/* NOTE: only exported stubs are given back. A hidden library (cuBLAS) launches through its own,
 * statically linked runtime, whose stubs the application's runtime cannot name. */
const void *rt_stub_of_func(CUfunction f) {
    const void *stub = NULL;
    pthread_mutex_lock(&rt.lock);
    for (size_t i = 0; i < rt.stub_cap && !stub; i++) {
        stub_slot *s = &rt.stubs[i];
        if (s->stub && !s->func && rt_drv.kernelGetFunction(&s->func, s->kernel))
            s->func = NULL;
        if (s->stub && s->func == f)
            stub = s->stub;
    }
    pthread_mutex_unlock(&rt.lock);
    Dl_info info;
    return stub && dladdr(stub, &info) && info.dli_saddr == stub ? stub : NULL;
}

/* Hands a module's image to the driver as CUDA 13's runtime does: the registered fatbin wrapper
 * goes to cuLibraryLoadData; host stubs map to the library's kernels. */
static cudaError_t load_module(const simcuda_module_desc *d) {
    size_t size;
    unsigned char *image = sim_image_build(d, &size);
    if (!image)
        return cudaErrorInvalidKernelImage;
    simcuda_fatbin_wrapper *w = malloc(sizeof *w);
    if (!w) {
        free(image);
        return cudaErrorMemoryAllocation;
    }
    *w = (simcuda_fatbin_wrapper){SIMCUDA_FATBIN_WRAPPER_MAGIC, 1, image, NULL};
    CUlibrary lib;
    CUresult e = rt_drv.libraryLoadData(&lib, w, NULL, NULL, 0, NULL, NULL, 0);
    free(w);
    free(image);
    for (unsigned i = 0; !e && i < d->num_kernels; i++) {
        CUkernel k;
        e = rt_drv.libraryGetKernel(&k, lib, d->kernels[i].name);
        if (!e && d->kernels[i].host_stub)
            stub_put(d->kernels[i].host_stub, k, NULL);
    }
    return (cudaError_t)e;
}

static void do_init(void) {
    Dl_info info;
    void *self = dladdr((void *)&do_init, &info) ? dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD) : NULL;
    /* NOTE: through the global dlsym on purpose: an interposer hooks it, as with libcudart. */
    rt_drv.getProcAddress = self ? (PFN_cuGetProcAddress_v12000)dlsym(self, "cuGetProcAddress_v2") : NULL;
    if (!rt_drv.getProcAddress) {
        rt.init_error = cudaErrorInsufficientDriver;
        return;
    }
    CUdriverProcAddressQueryResult st;
    bool ok = true;
#define RT_GET(f, n, t) ok &= !rt_drv.getProcAddress(#n, (void **)&rt_drv.f, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st);
#define RT_GET2(f, n, t)                                                                           \
    ok &= !rt_drv.getProcAddress(#n, (void **)&rt_drv.f[0], CUDA_VERSION,                         \
                                 CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);                          \
    ok &= !rt_drv.getProcAddress(#n, (void **)&rt_drv.f[1], CUDA_VERSION,                         \
                                 CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
    RT_DRIVER(RT_GET)
    RT_DRIVER_PTSZ(RT_GET2)
    CUcontext ctx;
    if (!ok || rt_drv.init(0) || rt_drv.primaryCtxRetain(&ctx, 0) || rt_drv.ctxSetCurrent(ctx)) {
        rt.init_error = ok ? cudaErrorInitializationError : cudaErrorInsufficientDriver;
        return;
    }
    pthread_mutex_lock(&rt.lock);
    rt.started = true;
    for (int i = 0; i < rt.num_pending && !rt.init_error; i++)
        rt.init_error = load_module(rt.pending[i]);
    rt.num_pending = 0;
    pthread_mutex_unlock(&rt.lock);
}

cudaError_t rt_init(void) {
    pthread_once(&rt.once, do_init);
    return rt.init_error;
}

SIMCUDA_EXPORT int simcudaRegisterModule(const simcuda_module_desc *desc) {
    if (!desc)
        return cudaErrorInvalidValue;
    pthread_mutex_lock(&rt.lock);
    bool later = !rt.started && rt.num_pending < 256;
    if (later)
        rt.pending[rt.num_pending++] = desc;
    pthread_mutex_unlock(&rt.lock);
    if (later)
        return cudaSuccess;
    cudaError_t e = rt_init();
    if (e)
        return e;
    pthread_mutex_lock(&rt.lock);
    e = load_module(desc);
    pthread_mutex_unlock(&rt.lock);
    return e;
}

/* ---- versions, devices ---- */
RT_API cudaError_t cudaDriverGetVersion(int *v) {
    RT_INIT();
    return rt_ret(rt_drv.driverGetVersion(v));
}

RT_API cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v)
        return rt_set(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

RT_API cudaError_t cudaGetDeviceCount(int *n) { RT_CALL(rt_drv.deviceGetCount(n)); }

static __thread int t_device;

RT_API cudaError_t cudaSetDevice(int d) {
    RT_INIT();
    int n = 0;
    rt_drv.deviceGetCount(&n);
    if (d < 0 || d >= n)
        return rt_set(cudaErrorInvalidDevice);
    t_device = d;
    return cudaSuccess;
}

RT_API cudaError_t cudaGetDevice(int *d) {
    RT_INIT();
    if (!d)
        return rt_set(cudaErrorInvalidValue);
    *d = t_device;
    return cudaSuccess;
}

RT_API cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
    RT_CALL(rt_drv.deviceGetAttribute(v, (CUdevice_attribute)a, d));
}

RT_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    RT_INIT();
    if (!p)
        return rt_set(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    CUresult e = rt_drv.deviceGetName(p->name, sizeof p->name, d);
    if (e)
        return rt_ret(e);
    rt_drv.deviceTotalMem(&p->totalGlobalMem, d);
    rt_drv.deviceGetAttribute(&p->multiProcessorCount, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
    rt_drv.deviceGetAttribute(&p->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    rt_drv.deviceGetAttribute(&p->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    rt_drv.deviceGetAttribute(&p->maxThreadsPerBlock, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, d);
    rt_drv.deviceGetAttribute(&p->warpSize, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d);
    int smem = 0;
    rt_drv.deviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, d);
    p->sharedMemPerBlock = (size_t)smem;
    p->unifiedAddressing = 1;
    p->canMapHostMemory = 1;
    p->canUseHostPointerForRegisteredMem = 1;
    p->hostRegisterSupported = 1;
    p->hostRegisterReadOnlySupported = 1;
    return cudaSuccess;
}

RT_API cudaError_t cudaDeviceSynchronize(void) { RT_CALL(rt_drv.ctxSynchronize()); }

RT_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                                    unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status) {
    RT_INIT();
    /* NOTE: a runtime is as old as the driver it simulates; this entry point came with 12.5. */
    int driver = 0;
    rt_drv.driverGetVersion(&driver);
    if (driver < 12050)
        return rt_set(cudaErrorNotSupported);
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult e = rt_drv.getProcAddress(symbol, fn, (int)version, flags, &st);
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    return rt_ret(e);
}

RT_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *status) {
    RT_INIT();
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult e = rt_drv.getProcAddress(symbol, fn, CUDART_VERSION, flags, &st);
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    return rt_ret(e);
}
