/* libmedusa_interpose.so: shared declarations. One registry (writer.c, live.c, funcs.c) behind one
 * lock; the hook tables (core.c) are generated from hooks.def. */
#ifndef MEDUSA_INTERPOSE_INTERNAL_H
#define MEDUSA_INTERPOSE_INTERNAL_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "medusa/trace.h"

/* cuda.h maps these plain names to later variants; every form is hooked, under its own name. */
#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuGraphInstantiate

#define MI_EXPORT __attribute__((visibility("default")))

/* Families (bit masks): a hook does not record while a hook of its own family runs on the thread. */
enum { F_PROC = 0, F_MEM = 1u, F_MODULE = 2u, F_LAUNCH = 4u, F_CAPTURE = 8u, F_GRAPH = 16u, F_ALL = 31u };

typedef enum {
    H_NONE, /* records that are not about one call (FUNC, DEVICE, MARK, ...) */
#define H(sym, base, version, ptsz, family) H_##sym,
#include "hooks.def"
#undef H
    H_COUNT
} hook_id;

/* The _ptsz and _v2_ptsz variants cuda.h only declares for per-thread builds. */
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuStreamBeginCapture(CUstream); /* v1 (CUDA 10.0): no mode */
CUresult cuStreamBeginCapture_ptsz(CUstream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream, CUstreamCaptureMode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream, CUgraph, const CUgraphNode *,
                                          const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
/* v1 (10.0) and v2 (11.0): what cuGetProcAddress("cuGraphInstantiate") hands out */
CUresult cuGraphInstantiate(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
CUresult cuStreamEndCapture_ptsz(CUstream, CUgraph *);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
cudaError_t cudaLaunchKernel_ptsz(const void *, dim3, dim3, void **, size_t, cudaStream_t);
cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *, const void *, void **);
cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t, enum cudaStreamCaptureMode);
cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t, cudaGraph_t *);
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t, cudaStream_t);

/* ---- core.c: symbols, the real functions behind the hooks, the per-thread gate, logging ---- */
extern const char *const mi_hook_name[H_COUNT];
void *mi_real(hook_id id);               /* the real function, or NULL (never call unchecked) */
bool mi_bind_real(hook_id id, void *fn); /* false: another implementation is already bound */
void *mi_hook_addr(hook_id id);
int mi_hook_lookup(const char *name);    /* -1 when not hooked */
void *mi_real_dlsym(void *handle, const char *name);
void mi_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mi_fail(const char *what);          /* fail-open: log once, stop recording, pass through */
void mi_stop(const char *why);           /* mi_fail, saying why in the trace: it cannot be used */
void *mi_sibling(hook_id id, const char *name); /* name, from the object that holds hook id's real */

extern __thread unsigned mi_t_nest;
bool mi_wants(unsigned family);          /* recording on, not paused, and the mode records it */

typedef struct {
    unsigned saved;
    bool rec;
} mi_gate;

static inline mi_gate mi_enter(unsigned family) {
    mi_gate g = {mi_t_nest, !(mi_t_nest & family) && mi_wants(family)};
    mi_t_nest |= family;
    return g;
}
static inline void mi_leave(mi_gate g) { mi_t_nest = g.saved; }

/* A hook: gate on the family, call the real function, record when this call is the outer one. */
#define MI_HOOK(ret, family, sym, params, call, record)                                            \
    MI_EXPORT ret sym params {                                                                     \
        mi_gate g_ = mi_enter(family);                                                             \
        ret r_ = call;                                                                             \
        if (g_.rec) {                                                                              \
            record;                                                                                \
        }                                                                                          \
        mi_leave(g_);                                                                              \
        return r_;                                                                                 \
    }

#define REAL(sym) ((__typeof__(&sym))mi_real(H_##sym))
#define CALL_DRV(sym, ...)                                                                         \
    __extension__({                                                                                \
        __typeof__(&sym) f_ = REAL(sym);                                                           \
        f_ ? f_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                                               \
    })
#define CALL_RT(sym, ...)                                                                          \
    __extension__({                                                                                \
        __typeof__(&sym) f_ = REAL(sym);                                                           \
        f_ ? f_(__VA_ARGS__) : cudaErrorSymbolNotFound;                                            \
    })

/* ---- writer.c, live.c, funcs.c: the trace, the live-allocation map and the function table,
 * under one lock (registry.h) ---- */
typedef enum { LIVE_NONE, LIVE_ADD, LIVE_DEL } live_op;
void mi_emit(medusa_trace_record *r, const void *blob, size_t len, live_op op);
int mi_flush(void);
bool mi_recording_on(void);
unsigned mi_mode(void);
void mi_save_image(const char *hex, const void *data, size_t size); /* as <trace>.images/<hex>.img */
void mi_writer_config(const char *path, unsigned mode);
void mi_writer_fork_child(void);
void mi_writer_fork_prepare(void);
void mi_writer_fork_parent(void);
void mi_writer_close(void);

typedef struct {
    uint32_t num_params;
    uint32_t bytes; /* parameter buffer size: max(offset + size) */
    uint32_t (*layout)[2];
} mi_func_info;
/* The parameter layout of f, querying the driver and recording a FUNC event the first time. */
const mi_func_info *mi_func(CUfunction f);
bool mi_stub_seen(const void *stub);     /* true the second time a host stub is asked about */

/* ---- driver.c: the driver calls the recorder itself makes, straight to the real driver ---- */
typedef struct {
    PFN_cuGraphGetNodes_v10000 graphGetNodes;
    PFN_cuGraphNodeGetType_v10000 nodeGetType;
    PFN_cuGraphKernelNodeGetParams_v12000 kernelNodeGetParams;
    PFN_cuGraphKernelNodeGetAttribute_v11000 kernelNodeGetAttribute;
    PFN_cuGraphMemcpyNodeGetParams_v10000 memcpyNodeGetParams;
    PFN_cuGraphMemsetNodeGetParams_v10000 memsetNodeGetParams;
    PFN_cuGraphGetEdges_v12030 graphGetEdges;
    PFN_cuStreamGetCaptureInfo_v12030 captureInfo[2]; /* legacy, per-thread */
    PFN_cuFuncGetParamInfo_v12040 funcGetParamInfo;
    PFN_cuFuncGetName_v12030 funcGetName;
    PFN_cuKernelGetLibrary_v12050 kernelGetLibrary;
    PFN_cuFuncGetModule_v11000 funcGetModule;
    PFN_cuKernelGetParamInfo_v12040 kernelGetParamInfo;
    PFN_cuKernelGetFunction_v12000 kernelGetFunction;
    PFN_cuLibraryGetModule_v12000 libraryGetModule;
    PFN_cuCtxGetDevice_v2000 ctxGetDevice;
    PFN_cuDeviceGetName_v2000 deviceGetName;
    PFN_cuDeviceTotalMem_v3020 deviceTotalMem;
    PFN_cuDeviceGetAttribute_v2000 deviceGetAttribute;
    PFN_cuDriverGetVersion_v2020 driverGetVersion;
    PFN_cuDeviceGetUuid_v11040 deviceGetUuid;
    PFN_cuMemHostGetDevicePointer_v3020 hostGetDevicePointer;
    PFN_cuMemAlloc_v3020 memAlloc;
    PFN_cuMemcpyDtoH_v3020 memcpyDtoH;
    PFN_cuCtxSynchronize_v2000 ctxSynchronize;
} mi_driver;
const mi_driver *mi_drv(void);           /* never NULL; missing entries are NULL */
void mi_note_device(void);               /* records the DEVICE fingerprint once */
CUgraphNode mi_captured_node(CUstream s, bool ptsz); /* the node a launch just became, or NULL */
extern int mi_num_captures;              /* captures in progress (atomic) */

/* ---- module.c / launch.c / graph.c helpers ---- */
void mi_record_launch(hook_id api, CUresult res, CUfunction f, const unsigned grid[3],
                      const unsigned block[3], unsigned shared, CUstream s, void **params,
                      void **extra, bool ptsz);
CUfunction mi_func_of_stub(hook_id api, const void *stub);
size_t mi_param_bytes(const mi_func_info *fi, void **params, void **extra, unsigned char *out,
                      size_t cap);
size_t mi_image_size(const void *image);
const void *mi_image_data(const void *image); /* a fatbin wrapper's image, else image */
void mi_sha256(const void *data, size_t len, uint8_t out[32]);
void mi_dump_graph(hook_id api, void *stream, CUgraph g);
void mi_before_device_alloc(bool runtime); /* the layout shift, once, before any allocation */
void mi_snapshot_live(void);             /* CONTENT records for the capture phase's buffers */
void mi_note_phase(const char *phase, uint64_t seq);

#endif
