/* cuGetProcAddress: how libcudart (shared, or static inside cuBLAS/NCCL) reaches the driver, on a
 * handle LD_PRELOAD never sees. The real lookup runs first; the variant it returned is identified
 * by pointer, and the hook bound to exactly that variant goes back (the per-thread flag holds). */
#include <string.h>

#include "internal.h"

static void *wrap(const char *symbol, void *fn) {
    if (!fn)
        return fn;
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        return mi_identify(symbol, fn);
    /* Only names some hook answers to are worth the comparison. */
    for (int i = 1; i < H_COUNT; i++) {
        const char *n = mi_hook_name[i];
        size_t l = strlen(symbol);
        if (strncmp(n, symbol, l) == 0 && (n[l] == 0 || n[l] == '_'))
            return mi_identify(symbol, fn);
    }
    return fn;
}

MI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    CUresult r = CALL_DRV(cuGetProcAddress_v2, symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && symbol && pfn)
        *pfn = wrap(symbol, *pfn);
    return r;
}

MI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    CUresult r = CALL_DRV(cuGetProcAddress, symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && symbol && pfn)
        *pfn = wrap(symbol, *pfn);
    return r;
}
