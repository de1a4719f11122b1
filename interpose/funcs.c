/* The function table and the host-stub set: each kernel's parameter layout, asked of the driver
 * the first time it is launched and recorded as a FUNC event; each host stub, once. Their state is
 * the registry's, behind mi_registry_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "registry.h"

typedef struct {
    const void *key;
    mi_func_info info;
} func_slot;

static struct {
    func_slot *funcs;
    size_t func_cap, func_used;
    const void **stubs;
    size_t stub_cap, stub_used;
} W;

static func_slot *func_find(const void *key) {
    if (!W.func_cap)
        return NULL;
    for (size_t i = mi_slot_of((uint64_t)(uintptr_t)key, W.func_cap); W.funcs[i].key;
         i = (i + 1) & (W.func_cap - 1))
        if (W.funcs[i].key == key)
            return &W.funcs[i];
    return NULL;
}

static func_slot *func_insert(const void *key) {
    if ((W.func_used + 1) * 2 > W.func_cap) {
        size_t cap = W.func_cap ? W.func_cap * 2 : 1024;
        func_slot *n = calloc(cap, sizeof *n);
        if (!n)
            return NULL;
        for (size_t i = 0; i < W.func_cap; i++)
            if (W.funcs[i].key) {
                size_t j = mi_slot_of((uint64_t)(uintptr_t)W.funcs[i].key, cap);
                while (n[j].key)
                    j = (j + 1) & (cap - 1);
                n[j] = W.funcs[i];
            }
        free(W.funcs);
        W.funcs = n, W.func_cap = cap;
    }
    size_t i = mi_slot_of((uint64_t)(uintptr_t)key, W.func_cap);
    while (W.funcs[i].key)
        i = (i + 1) & (W.func_cap - 1);
    W.funcs[i].key = key;
    W.func_used++;
    return &W.funcs[i];
}

/* Parameter i of f: a CUfunction (cuFuncGetParamInfo, 12.4+) or a CUkernel (cuKernelGetParamInfo,
 * 12.4+; without it, through its function). */
static CUresult param_info(const mi_driver *d, CUfunction f, CUkernel k, size_t i, size_t *off,
                           size_t *size) {
    if (k && d->kernelGetParamInfo)
        return d->kernelGetParamInfo(k, i, off, size);
    return d->funcGetParamInfo ? d->funcGetParamInfo(f, i, off, size) : CUDA_ERROR_NOT_FOUND;
}

/* The layout of f's parameters into fi; false when the driver cannot tell it. NOTE: only
 * CUDA_ERROR_INVALID_VALUE past the last index ends the list: any other error is no layout at
 * all, never "no parameters" (the graph would be rebuilt with empty parameter buffers). */
static bool param_layout(const mi_driver *d, CUfunction f, CUkernel k, mi_func_info *fi) {
    uint32_t cap = 16, n = 0;
    uint32_t(*lay)[2] = malloc(cap * sizeof *lay);
    size_t off, size;
    CUresult e = CUDA_SUCCESS;
    while (lay && n < 4096 && !(e = param_info(d, f, k, n, &off, &size))) {
        if (n == cap) {
            uint32_t(*m)[2] = realloc(lay, (cap *= 2) * sizeof *lay);
            if (!m)
                break;
            lay = m;
        }
        lay[n][0] = (uint32_t)off, lay[n][1] = (uint32_t)size;
        fi->bytes = fi->bytes > off + size ? fi->bytes : (uint32_t)(off + size);
        n++;
    }
    fi->num_params = lay ? n : 0;
    fi->layout = lay;
    return lay && e == CUDA_ERROR_INVALID_VALUE;
}

static void stop_no_layout(const mi_driver *d, CUfunction f, const char *name, bool kernel) {
    int v = 0;
    if (d->driverGetVersion)
        d->driverGetVersion(&v);
    char msg[400];
    snprintf(msg, sizeof msg,
             "the parameter layout of kernel %s cannot be read: the driver (CUDA %d.%d) %s; an "
             "artifact needs a CUDA 12.4 or newer driver (cuFuncGetParamInfo, cuKernelGetParamInfo)",
             name ? name : "?", v / 1000, v % 1000 / 10,
             !d->funcGetParamInfo && !(kernel && d->kernelGetParamInfo)
                 ? "has neither cuFuncGetParamInfo nor cuKernelGetParamInfo"
                 : "refused the query");
    (void)f;
    mi_stop(msg);
}

static void func_query(CUfunction f, mi_func_info *fi, medusa_trace_record *r, char **blob,
                       size_t *len) {
    const mi_driver *d = mi_drv();
    /* f is a CUfunction, or a CUkernel (cuLaunchKernel takes both): a kernel is asked through the
     * function it gives, for its module. */
    const char *name = NULL;
    CUfunction fn = f;
    CUkernel k = NULL;
    CUresult named = d->funcGetName ? d->funcGetName(&name, f) : CUDA_ERROR_NOT_FOUND;
    if (named == CUDA_ERROR_INVALID_HANDLE && d->kernelGetFunction &&
        d->kernelGetFunction(&fn, (CUkernel)f) == CUDA_SUCCESS) {
        k = (CUkernel)f;
        if (d->funcGetName)
            d->funcGetName(&name, fn);
    }
    if (!param_layout(d, fn, k, fi))
        stop_no_layout(d, f, name, k != NULL);
    CUlibrary lib = NULL;
    CUmodule mod = NULL;
    if (k && d->kernelGetLibrary && d->kernelGetLibrary(&lib, k) != CUDA_SUCCESS)
        lib = NULL;
    if (d->funcGetModule && d->funcGetModule(&mod, fn) != CUDA_SUCCESS)
        mod = NULL;
    *r = (medusa_trace_record){.type = MEDUSA_EV_FUNC,
                               .u = {(uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)lib,
                                     (uint64_t)(uintptr_t)mod, fi->num_params, fi->bytes}};
    size_t nl = name ? strlen(name) : 0;
    *len = fi->num_params * 8u + nl;
    *blob = malloc(*len + 1);
    if (*blob) {
        if (fi->num_params)
            memcpy(*blob, fi->layout, fi->num_params * 8u);
        if (nl)
            memcpy(*blob + fi->num_params * 8u, name, nl);
    }
}

const mi_func_info *mi_func(CUfunction f) {
    static const mi_func_info none;
    pthread_mutex_lock(&mi_registry_lock);
    func_slot *s = func_find(f);
    pthread_mutex_unlock(&mi_registry_lock);
    if (s)
        return &s->info;
    /* First sight: ask the driver outside the lock (it may take its own). */
    mi_func_info fi = {0};
    medusa_trace_record r;
    char *blob = NULL;
    size_t len = 0;
    func_query(f, &fi, &r, &blob, &len);
    pthread_mutex_lock(&mi_registry_lock);
    s = func_find(f);
    bool fresh = !s;
    if (fresh && (s = func_insert(f)))
        s->info = fi;
    pthread_mutex_unlock(&mi_registry_lock);
    if (fresh && s)
        mi_emit(&r, blob, len, LIVE_NONE);
    else
        free(fi.layout);
    free(blob);
    return s ? &s->info : &none;
}

bool mi_stub_seen(const void *stub) {
    pthread_mutex_lock(&mi_registry_lock);
    bool seen = false;
    if ((W.stub_used + 1) * 2 > W.stub_cap) {
        size_t cap = W.stub_cap ? W.stub_cap * 2 : 256;
        const void **n = calloc(cap, sizeof *n);
        if (n) {
            for (size_t i = 0; i < W.stub_cap; i++)
                if (W.stubs[i]) {
                    size_t j = mi_slot_of((uint64_t)(uintptr_t)W.stubs[i], cap);
                    while (n[j])
                        j = (j + 1) & (cap - 1);
                    n[j] = W.stubs[i];
                }
            free(W.stubs);
            W.stubs = n, W.stub_cap = cap;
        }
    }
    if (W.stub_cap) {
        size_t i = mi_slot_of((uint64_t)(uintptr_t)stub, W.stub_cap);
        while (W.stubs[i] && W.stubs[i] != stub)
            i = (i + 1) & (W.stub_cap - 1);
        seen = W.stubs[i] == stub;
        if (!seen)
            W.stubs[i] = stub, W.stub_used++;
    }
    pthread_mutex_unlock(&mi_registry_lock);
    return seen;
}
