/* cuGetProcAddress: how libcudart (shared, or static inside cuBLAS/NCCL) reaches the driver, on a
 * handle LD_PRELOAD never sees. The real lookup runs first; the variant it returned is identified
 * (hooks.def lists every variant a lookup can hand out), and the hook bound to exactly that
 * variant goes back: the per-thread flag and the ABI of the requested version hold. */
#include <dlfcn.h>
#include <string.h>

#include "internal.h"

typedef struct {
    const char *base, *sym;
    int version;
    bool ptsz;
} variant;

static const variant g_variants[] = {
#define H(sym, base, version, ptsz, family) {#base, #sym, version, ptsz},
#define V(sym, base, version, ptsz) {#base, #sym, version, ptsz},
#include "hooks.def"
#undef H
};
#define NUM_VARIANTS (sizeof g_variants / sizeof g_variants[0])

/* The variant a lookup of base at version with the per-thread flag (or not) hands out: the newest
 * not newer than version. A base without per-thread variants answers both kinds of caller. */
static const variant *by_version(const char *base, int version, bool ptsz) {
    const variant *best = NULL;
    bool any_ptsz = false;
    for (size_t i = 0; i < NUM_VARIANTS; i++) {
        const variant *v = &g_variants[i];
        if (strcmp(v->base, base) != 0)
            continue;
        any_ptsz |= v->ptsz;
        if (v->ptsz == ptsz && v->version <= version && (!best || v->version > best->version))
            best = v;
    }
    return best || !ptsz || any_ptsz ? best : by_version(base, version, false);
}

/* The hook for variant v when the driver handed out fn: fn itself, or (an internal entry of the
 * driver) the same library's export of v; NULL when the hook cannot stand for fn. */
static void *bind_variant(const variant *v, void *fn, bool exact, void *lib) {
    int id = mi_hook_lookup(v->sym);
    if (id < 0)
        return NULL;
    if (exact)
        return mi_bind_real((hook_id)id, fn) ? mi_hook_addr((hook_id)id) : NULL;
    void *exported = lib ? mi_real_dlsym(lib, v->sym) : NULL;
    if (!exported)
        return NULL;
    return mi_bind_real((hook_id)id, exported) ? mi_hook_addr((hook_id)id) : NULL;
}

static void *identify(const char *base, void *fn, int version, cuuint64_t flags) {
    bool named = false;
    for (size_t i = 0; i < NUM_VARIANTS && !named; i++)
        named = strcmp(g_variants[i].base, base) == 0;
    if (!named)
        return fn;
    Dl_info info = {0};
    void *lib = NULL;
    if (dladdr(fn, &info) && info.dli_fname)
        lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    const variant *v = NULL;
    for (size_t i = 0; lib && i < NUM_VARIANTS && !v; i++)
        if (strcmp(g_variants[i].base, base) == 0 && mi_real_dlsym(lib, g_variants[i].sym) == fn)
            v = &g_variants[i];
    bool exact = v != NULL;
    /* An export under another name (a driver may answer one base with another function): its own
     * hook, if any, has its signature; guessing by version could give a caller the wrong one. */
    bool other_export = !exact && info.dli_saddr == fn && info.dli_sname;
    void *hook = NULL;
    if (other_export) {
        int id = mi_hook_lookup(info.dli_sname);
        hook = id >= 0 && mi_bind_real((hook_id)id, fn) ? mi_hook_addr((hook_id)id) : NULL;
        v = NULL;
    } else {
        if (!v)
            v = by_version(base, version, flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        hook = v ? bind_variant(v, fn, exact, lib) : NULL;
    }
    if (lib)
        dlclose(lib);
    if (!hook)
        mi_log("%s (version %d, flags %llu): the driver returned %s (%s in %s), which no hook "
               "stands for; calls through it are not recorded",
               base, version, (unsigned long long)flags,
               v ? v->sym : (other_export ? "another function" : "no variant hooks.def lists"),
               info.dli_sname ? info.dli_sname : "no symbol", info.dli_fname ? info.dli_fname : "?");
    return hook ? hook : fn;
}

MI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status) {
    CUresult r = CALL_DRV(cuGetProcAddress_v2, symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = identify(symbol, *pfn, version, flags);
    return r;
}

MI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    CUresult r = CALL_DRV(cuGetProcAddress, symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = identify(symbol, *pfn, version, flags);
    return r;
}
