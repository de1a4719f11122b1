/* cuGetProcAddress: the driver's entry-point table, generated from procs.def. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* procs.def names these driver symbols by their versioned names. */
#undef cuGetProcAddress
#undef cuStreamBeginCapture
#undef cuGraphInstantiate
#undef cuGraphAddDependencies
#undef cuGraphGetEdges
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

#define P(name, version, sym, ptsz)
#define X(name, version, sym, ptsz) extern char sym[];
#define I(name, version, sym, ptsz)
#include "procs.def"
#undef P
#undef X
#undef I

/* The internal entries (procs.def's I), in the files of their exported twins. */
CUresult sim_internal_cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode);
CUresult sim_internal_cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);

typedef struct {
    const char *name;
    int version;
    void *fn;
    int ptsz;
} proc_entry;

static const proc_entry g_procs[] = {
#define P(name, version, sym, ptsz) {#name, version, (void *)&sym, ptsz},
#define X(name, version, sym, ptsz) {#name, version, (void *)sym, ptsz},
#define I(name, version, sym, ptsz) {#name, version, (void *)&sim_internal_##sym, ptsz},
#include "procs.def"
#undef P
#undef X
#undef I
};

SIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn || (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                                   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    int want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    const proc_entry *best[2] = {NULL, NULL};
    int driver = sim_driver_version();
    bool named = false;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_entry *e = &g_procs[i];
        if (strcmp(e->name, symbol) != 0)
            continue;
        if (e->version > driver) /* an older driver does not know it at all */
            continue;
        named = true;
        if (e->version <= cudaVersion && (!best[e->ptsz] || e->version >= best[e->ptsz]->version))
            best[e->ptsz] = e;
    }
    /* A function without stream semantics has one variant for both kinds of caller. */
    const proc_entry *pick = best[want] ? best[want] : best[0];
    *pfn = pick ? pick->fn : NULL;
    if (status)
        *status = pick ? CU_GET_PROC_ADDRESS_SUCCESS
                  : named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return pick ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* The CUDA 11.3 form, without the query result. */
SIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

int sim_driver_version(void) {
    const char *e = getenv("MEDUSA_SIM_DRIVER_VERSION");
    int v = e && *e ? atoi(e) : 0;
    return v >= 11000 && v < CUDA_VERSION ? v : CUDA_VERSION;
}

CUresult sim_since(int version, const char *name) {
    if (sim_driver_version() >= version)
        return CUDA_SUCCESS;
    return sim_fail(CUDA_ERROR_NOT_SUPPORTED, "%s needs a CUDA %d.%d driver; this one is %d.%d "
                    "(MEDUSA_SIM_DRIVER_VERSION)", name, version / 1000, version % 1000 / 10,
                    sim_driver_version() / 1000, sim_driver_version() % 1000 / 10);
}
