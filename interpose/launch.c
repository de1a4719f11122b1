/* Launch hooks: the function, geometry and raw parameter bytes of every launch, and the graph node
 * a launch became when its stream was capturing. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define U(x) ((uint64_t)(uintptr_t)(x))

size_t mi_param_bytes(const mi_func_info *fi, void **params, void **extra, unsigned char *out,
                      size_t cap) {
    if (params) {
        if (fi->bytes > cap)
            return 0;
        memset(out, 0, fi->bytes);
        for (uint32_t i = 0; i < fi->num_params; i++)
            if (params[i])
                memcpy(out + fi->layout[i][0], params[i], fi->layout[i][1]);
        return fi->bytes;
    }
    /* The packed form: CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE pairs up to CU_LAUNCH_PARAM_END. */
    const void *ptr = NULL;
    size_t size = 0;
    for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            ptr = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            size = *(const size_t *)extra[i + 1];
    }
    if (!ptr || size > cap)
        return 0;
    memcpy(out, ptr, size);
    return size;
}

void mi_record_launch(hook_id api, CUresult res, CUfunction f, const unsigned grid[3],
                      const unsigned block[3], unsigned shared, CUstream s, void **params,
                      void **extra, bool ptsz) {
    static const mi_func_info none;
    const mi_func_info *fi = f ? mi_func(f) : &none;
    unsigned char stack[4096], *buf = stack;
    if (fi->bytes > sizeof stack && !(buf = malloc(fi->bytes)))
        buf = stack;
    size_t n = mi_param_bytes(fi, params, extra, buf, buf == stack ? sizeof stack : fi->bytes);
    CUgraphNode node = NULL;
    if (!res && __atomic_load_n(&mi_num_captures, __ATOMIC_ACQUIRE) > 0)
        node = mi_captured_node(s, ptsz);
    medusa_trace_record r = {
        .type = MEDUSA_EV_LAUNCH,
        .api = (uint16_t)api,
        .result = res,
        .u = {U(f), U(s), U(node), grid[0] | (uint64_t)grid[1] << 32,
              grid[2] | (uint64_t)block[0] << 32, block[1] | (uint64_t)block[2] << 32, shared}};
    mi_emit(&r, buf, n, LIVE_NONE);
    if (buf != stack)
        free(buf);
}

typedef cudaError_t (*get_func_fn)(cudaFunction_t *, const void *);

/* The driver function behind a runtime host stub, asked of the runtime the call went to. The
 * first time a stub is seen, a STUB event names its exported symbol (if it has one). */
CUfunction mi_func_of_stub(hook_id api, const void *stub) {
    static get_func_fn get;
    get_func_fn g = __atomic_load_n(&get, __ATOMIC_ACQUIRE);
    if (!g) {
        g = (get_func_fn)mi_sibling(api, "cudaGetFuncBySymbol");
        __atomic_store_n(&get, g, __ATOMIC_RELEASE);
    }
    cudaFunction_t f = NULL;
    if (!stub || !g || g(&f, stub) != cudaSuccess)
        return NULL;
    if (!mi_stub_seen(stub)) {
        Dl_info info;
        char blob[1024] = {0};
        size_t n = 0;
        if (dladdr(stub, &info) && info.dli_saddr == stub && info.dli_sname) {
            size_t a = strnlen(info.dli_sname, 500), b = strnlen(info.dli_fname, 500);
            memcpy(blob, info.dli_sname, a);
            memcpy(blob + a + 1, info.dli_fname, b);
            n = a + 1 + b;
        }
        medusa_trace_record r = {.type = MEDUSA_EV_STUB, .api = (uint16_t)api, .u = {U(stub), U(f)}};
        mi_emit(&r, blob, n, LIVE_NONE);
    }
    return (CUfunction)f;
}

#define DRV_LAUNCH(sym, ptsz)                                                                      \
    MI_EXPORT CUresult sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,        \
                           unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,    \
                           void **extra) {                                                          \
        mi_gate g = mi_enter(F_LAUNCH);                                                            \
        CUresult r = CALL_DRV(sym, f, gx, gy, gz, bx, by, bz, shared, s, params, extra);            \
        if (g.rec)                                                                                 \
            mi_record_launch(H_##sym, r, f, (unsigned[3]){gx, gy, gz}, (unsigned[3]){bx, by, bz},   \
                             shared, s, params, extra, ptsz);                                      \
        mi_leave(g);                                                                               \
        return r;                                                                                  \
    }
DRV_LAUNCH(cuLaunchKernel, false)
DRV_LAUNCH(cuLaunchKernel_ptsz, true)

#define DRV_LAUNCH_EX(sym, ptsz)                                                                   \
    MI_EXPORT CUresult sym(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {   \
        mi_gate g = mi_enter(F_LAUNCH);                                                            \
        CUresult r = CALL_DRV(sym, c, f, params, extra);                                           \
        if (g.rec && c)                                                                            \
            mi_record_launch(H_##sym, r, f, (unsigned[3]){c->gridDimX, c->gridDimY, c->gridDimZ},  \
                             (unsigned[3]){c->blockDimX, c->blockDimY, c->blockDimZ},              \
                             c->sharedMemBytes, c->hStream, params, extra, ptsz);                  \
        mi_leave(g);                                                                               \
        return r;                                                                                  \
    }
DRV_LAUNCH_EX(cuLaunchKernelEx, false)
DRV_LAUNCH_EX(cuLaunchKernelEx_ptsz, true)

#define RT_LAUNCH(sym, ptsz)                                                                       \
    MI_EXPORT cudaError_t sym(const void *stub, dim3 grid, dim3 block, void **args, size_t shared, \
                              cudaStream_t s) {                                                    \
        mi_gate g = mi_enter(F_LAUNCH);                                                            \
        cudaError_t r = CALL_RT(sym, stub, grid, block, args, shared, s);                          \
        if (g.rec)                                                                                 \
            mi_record_launch(H_##sym, (CUresult)r, mi_func_of_stub(H_##sym, stub),                  \
                             (unsigned[3]){grid.x, grid.y, grid.z},                                \
                             (unsigned[3]){block.x, block.y, block.z}, (unsigned)shared, s, args,  \
                             NULL, ptsz);                                                          \
        mi_leave(g);                                                                               \
        return r;                                                                                  \
    }
RT_LAUNCH(cudaLaunchKernel, false)
RT_LAUNCH(cudaLaunchKernel_ptsz, true)

#define RT_LAUNCH_EX(sym, ptsz)                                                                    \
    MI_EXPORT cudaError_t sym(const cudaLaunchConfig_t *c, const void *stub, void **args) {       \
        mi_gate g = mi_enter(F_LAUNCH);                                                            \
        cudaError_t r = CALL_RT(sym, c, stub, args);                                               \
        if (g.rec && c)                                                                            \
            mi_record_launch(H_##sym, (CUresult)r, mi_func_of_stub(H_##sym, stub),                  \
                             (unsigned[3]){c->gridDim.x, c->gridDim.y, c->gridDim.z},              \
                             (unsigned[3]){c->blockDim.x, c->blockDim.y, c->blockDim.z},           \
                             (unsigned)c->dynamicSmemBytes, c->stream, args, NULL, ptsz);          \
        mi_leave(g);                                                                               \
        return r;                                                                                  \
    }
RT_LAUNCH_EX(cudaLaunchKernelExC, false)
RT_LAUNCH_EX(cudaLaunchKernelExC_ptsz, true)
