/* simcuda: the CPU implementation of the CUDA runtime/driver subset Medusa uses.
 *
 * This header is for CPU kernel libraries (the analogue of nvcc output) and for tools that want
 * simcuda's few extensions. Everything else is the real CUDA ABI from cuda.h / cuda_runtime_api.h.
 *
 * A kernel library describes its kernels in a module table and registers it, like the
 * __cudaRegisterFatBinary/__cudaRegisterFunction calls nvcc emits:
 *
 *   static void vadd(const simcuda_kctx *ctx, const void *params) { ... }
 *   SIMCUDA_STUB(vector_add)                      // exported host stub: dlsym finds it
 *   static const simcuda_kernel_desc k[] = {{"vector_add", "p p p i", vadd, vector_add}};
 *   SIMCUDA_MODULE(mylib, k, NULL, 0)             // registered at load time
 *
 * Hidden kernels (like cuBLAS's) have static stubs and a module registered lazily, on the library's
 * first use, with SIMCUDA_MODULE_LAZY + simcudaRegisterModule.
 *
 * Signature grammar: parameters separated by spaces, laid out with C alignment rules:
 *   p            pointer (8 bytes; memcheck verifies it)
 *   b h i u f    1, 2, 4, 4, 4-byte scalars        l q d   8-byte scalars
 *   sN@o1,o2     N-byte struct (8-aligned) holding pointers at byte offsets o1, o2, ... ("sN" if none)
 */
#ifndef SIMCUDA_SIMCUDA_H
#define SIMCUDA_SIMCUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIMCUDA_EXPORT __attribute__((visibility("default")))
#define SIMCUDA_IMAGE_MAGIC "SIMCUBIN"
#define SIMCUDA_IMAGE_VERSION 1u

/* How a runtime registers and loads an image, as CUDA's __fatBinC_Wrapper_t: the driver's load
 * calls (cuLibraryLoadData, cuModuleLoadData) take this wrapper or the image it points to. */
#define SIMCUDA_FATBIN_WRAPPER_MAGIC 0x466243b1u
typedef struct simcuda_fatbin_wrapper {
    uint32_t magic;   /* SIMCUDA_FATBIN_WRAPPER_MAGIC */
    uint32_t version; /* 1 */
    const void *data; /* the image */
    const void *filename_or_fatbins;
} simcuda_fatbin_wrapper;

typedef struct simcuda_kctx {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    void *shared;          /* dynamic shared memory scratch, shared_bytes long */
    void *const *globals;  /* device addresses of the module's globals, in declaration order */
} simcuda_kctx;

/* A CPU kernel runs the whole grid in one call. */
typedef void (*simcuda_kernel_fn)(const simcuda_kctx *ctx, const void *params);

typedef struct simcuda_kernel_desc {
    const char *name;      /* device-side (possibly mangled) name, as cuFuncGetName reports it */
    const char *signature; /* parameter layout, grammar above */
    simcuda_kernel_fn fn;
    const void *host_stub; /* what cudaLaunchKernel takes; static (unexported) for hidden kernels */
} simcuda_kernel_desc;

typedef struct simcuda_global_desc {
    const char *name;
    size_t size;
    const void *init; /* NULL: zero-filled */
} simcuda_global_desc;

typedef struct simcuda_module_desc {
    const char *name; /* unique per process; the table is exported as __simcuda_module_<name> */
    const simcuda_kernel_desc *kernels;
    unsigned num_kernels;
    const simcuda_global_desc *globals;
    unsigned num_globals;
} simcuda_module_desc;

/* Registers a module with the runtime (cudart's __cudaRegisterFatBinary analogue). The runtime
 * hands the module's image to the driver with cuLibraryLoadData. Returns a cudaError_t. */
SIMCUDA_EXPORT int simcudaRegisterModule(const simcuda_module_desc *desc);

/* Kernels say what they access with this, as they start: the race checker
 * (MEDUSA_SIM_RACECHECK=1) checks those bytes against other streams' unordered accesses. A kernel
 * that never calls it is taken to read and write all of every block its pointer arguments point
 * into; one that touches nothing says so with simcudaAccess(NULL, 0, 0). Free when the checker is
 * off. */
#define SIMCUDA_READ 1
#define SIMCUDA_WRITE 2
SIMCUDA_EXPORT void simcudaAccess(const void *ptr, size_t bytes, int mode);

/* From inside a kernel: runs fn(arg, i) for every i in [0, parts), on several host threads when
 * it may (MEDUSA_SIM_THREADS; as a GPU runs a kernel's blocks on many SMs), the calling thread
 * among them, and returns once all have run. The parts must write disjoint bytes; each may call
 * simcudaCountRead and simcudaTrap, and a fault or trap in any is the kernel's. Under memcheck,
 * racecheck, access tracing or the slowdown they run in order on the calling thread. */
SIMCUDA_EXPORT void simcudaParallel(int parts, void (*fn)(void *arg, int part), void *arg);

/* Kernels call this for each read they make, so traffic by memory class can be measured. */
SIMCUDA_EXPORT void simcudaCountRead(const void *ptr, size_t bytes);

enum { SIMCUDA_TRAFFIC_DEVICE = 0, SIMCUDA_TRAFFIC_HOST_MAPPED = 1, SIMCUDA_TRAFFIC_OTHER = 2 };
/* Both let the device finish the work queued first: the counters count work that has run. */
SIMCUDA_EXPORT void simcudaGetTraffic(uint64_t out[3]);
SIMCUDA_EXPORT void simcudaResetTraffic(void);

/* How many objects of one kind are alive (not yet destroyed), for leak checks. */
enum { SIMCUDA_LIVE_GRAPHS = 0, SIMCUDA_LIVE_EXECS = 1 };
SIMCUDA_EXPORT uint64_t simcudaCountLive(int kind);

/* The message of the last memcheck or launch failure on this thread ("" if none). */
SIMCUDA_EXPORT const char *simcudaGetLastMessage(void);

/* From inside a kernel: stops it as a device-side __trap() does. The launch fails with
 * CUDA_ERROR_LAUNCH_FAILED, sticky (the context is lost, as on a GPU), and WHY becomes the
 * message. Outside a kernel it does nothing. Hold no lock when calling it: it does not return. */
SIMCUDA_EXPORT void simcudaTrap(const char *why);

/* Arena placement, for diagnostics: base address and size of the device address space. */
SIMCUDA_EXPORT int simcudaGetArenaInfo(uint64_t *base, uint64_t *size);

#define SIMCUDA_STUB(name)                                                                         \
    SIMCUDA_EXPORT void name(void);                                                                \
    SIMCUDA_EXPORT void name(void) {}

#define SIMCUDA_HIDDEN_STUB(name)                                                                  \
    static void name(void) {}

#define SIMCUDA_MODULE_LAZY(mname, kernels, globals, nglobals)                                     \
    SIMCUDA_EXPORT const simcuda_module_desc __simcuda_module_##mname = {                          \
        #mname, kernels, (unsigned)(sizeof(kernels) / sizeof((kernels)[0])), globals, nglobals};

#define SIMCUDA_MODULE(mname, kernels, globals, nglobals)                                          \
    SIMCUDA_MODULE_LAZY(mname, kernels, globals, nglobals)                                         \
    __attribute__((constructor)) static void simcuda_register_##mname(void) {                      \
        simcudaRegisterModule(&__simcuda_module_##mname);                                          \
    }

#ifdef __cplusplus
}
#endif
#endif
