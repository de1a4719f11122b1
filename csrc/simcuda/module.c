/* Modules, libraries, kernels and functions (driver API). Four distinct handle kinds, as in the
 * driver: CUlibrary is a sim_library (cuLibraryLoadData), CUmodule the address of its module_tag
 * (cuModuleLoadData, cuLibraryGetModule), CUkernel a sim_func (cuLibraryGetKernel) and CUfunction
 * the address of its func_tag (cuModuleGetFunction, cuKernelGetFunction). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

sim_library *sim_library_of_module(CUmodule m) {
    sim_library *lib = (sim_library *)((char *)m - offsetof(sim_library, module_tag));
    return m && sim_handle_is(lib, H_LIBRARY) ? lib : NULL;
}

/* A library handle: only what cuLibraryLoadData gave (a module's library is not one). */
static sim_library *as_library(CUlibrary l) {
    return sim_handle_is(l, H_LIBRARY) && !((sim_library *)l)->as_module ? (sim_library *)l : NULL;
}

sim_func *sim_func_of(CUfunction h) {
    return h && sim_handle_is(h, H_FUNC) ? (sim_func *)((char *)h - offsetof(sim_func, func_tag)) : NULL;
}

sim_func *sim_kernel_of(CUkernel h) { return sim_handle_is(h, H_KERNEL) ? (sim_func *)h : NULL; }

sim_func *sim_launchable_of(CUfunction h) {
    sim_func *f = sim_func_of(h);
    return f ? f : sim_kernel_of((CUkernel)h);
}

CUresult sim_func_load(sim_func *f) {
    f->loaded = true;
    return CUDA_SUCCESS;
}

static CUresult load(const void *image, bool as_module, sim_library **out) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_lock();
    e = sim_library_from_image(image, out);
    if (!e)
        (*out)->as_module = as_module;
    sim_unlock();
    return e;
}

SIM_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jo, void **jv,
                                   unsigned int njo, CUlibraryOption *lo, void **lv, unsigned int nlo) {
    (void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
    if (!library)
        return CUDA_ERROR_INVALID_VALUE;
    sim_library *lib;
    CUresult e = load(code, false, &lib);
    if (!e)
        *library = (CUlibrary)lib;
    return e;
}

SIM_API CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    sim_library *lib;
    CUresult e = load(image, true, &lib);
    if (!e)
        *module = (CUmodule)&lib->module_tag;
    return e;
}

SIM_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int n,
                                    CUjit_option *o, void **v) {
    (void)n, (void)o, (void)v;
    return cuModuleLoadData(module, image);
}

SIM_API CUresult cuModuleLoad(CUmodule *module, const char *fname) {
    FILE *fp = fname ? fopen(fname, "rb") : NULL;
    if (!fp)
        return CUDA_ERROR_FILE_NOT_FOUND;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    rewind(fp);
    void *data = n > 0 ? malloc((size_t)n) : NULL;
    size_t got = data ? fread(data, 1, (size_t)n, fp) : 0;
    fclose(fp);
    CUresult e = got == (size_t)n && n >= 24 ? cuModuleLoadData(module, data) : CUDA_ERROR_INVALID_IMAGE;
    free(data);
    return e;
}

static CUresult unload(sim_library *lib, bool as_module) {
    if (!lib || lib->as_module != as_module)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_library_free(lib);
    return CUDA_SUCCESS;
}

/* Queued work may still run the library's kernels: the device finishes it first. */
SIM_API CUresult cuLibraryUnload(CUlibrary l) {
    sim_lock();
    CUresult e = g_sim.initialized ? sim_wait_all() : CUDA_SUCCESS;
    if (!e)
        e = unload(as_library(l), false);
    sim_unlock();
    return e;
}

SIM_API CUresult cuModuleUnload(CUmodule m) {
    sim_lock();
    CUresult e = g_sim.initialized ? sim_wait_all() : CUDA_SUCCESS;
    if (!e)
        e = unload(sim_library_of_module(m), true);
    sim_unlock();
    return e;
}

static sim_func *find_func(sim_library *lib, const char *name) {
    for (unsigned i = 0; i < lib->num_funcs; i++)
        if (strcmp(lib->funcs[i].name, name) == 0)
            return &lib->funcs[i];
    return NULL;
}

static CUresult get_func(sim_library *lib, const char *name, void **out, bool as_function) {
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_func *f = find_func(lib, name);
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    if (as_function)
        sim_func_load(f);
    *out = as_function ? (void *)SIM_FUNC_HANDLE(f) : (void *)f;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
    sim_lock();
    CUresult e = get_func(as_library(l), name, (void **)k, false);
    sim_unlock();
    return e;
}

SIM_API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    sim_lock();
    CUresult e = get_func(sim_library_of_module(m), name, (void **)f, true);
    sim_unlock();
    return e;
}

static CUresult count_funcs(sim_library *lib, unsigned *count) {
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    *count = lib->num_funcs;
    return CUDA_SUCCESS;
}

static CUresult enum_funcs(sim_library *lib, void **out, unsigned n, bool as_function) {
    if (!out || !lib)
        return !lib ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
    if (n > lib->num_funcs)
        n = lib->num_funcs;
    for (unsigned i = 0; i < n; i++)
        out[i] = as_function ? (void *)SIM_FUNC_HANDLE(&lib->funcs[i]) : (void *)&lib->funcs[i];
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary l) {
    SIM_SINCE(12040, cuLibraryGetKernelCount);
    SIM_LOCKED(count_funcs(as_library(l), count));
}
SIM_API CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule m) {
    SIM_SINCE(12040, cuModuleGetFunctionCount);
    SIM_LOCKED(count_funcs(sim_library_of_module(m), count));
}
SIM_API CUresult cuLibraryEnumerateKernels(CUkernel *k, unsigned int n, CUlibrary l) {
    SIM_SINCE(12040, cuLibraryEnumerateKernels);
    SIM_LOCKED(enum_funcs(as_library(l), (void **)k, n, false));
}
SIM_API CUresult cuModuleEnumerateFunctions(CUfunction *f, unsigned int n, CUmodule m) {
    SIM_SINCE(12040, cuModuleEnumerateFunctions);
    SIM_LOCKED(enum_funcs(sim_library_of_module(m), (void **)f, n, true));
}

SIM_API CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l) {
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    sim_library *lib = as_library(l);
    if (lib)
        *m = (CUmodule)&lib->module_tag;
    sim_unlock();
    return lib ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

SIM_API CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = g_sim.cfg.eager_loading ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
    return CUDA_SUCCESS;
}

static CUresult get_global(sim_library *lib, const char *name, CUdeviceptr *dptr, size_t *bytes) {
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < lib->num_globals; i++)
        if (strcmp(lib->global_names[i], name) == 0) {
            if (dptr)
                *dptr = (CUdeviceptr)lib->globals[i];
            if (bytes)
                *bytes = lib->global_sizes[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

SIM_API CUresult cuModuleGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUmodule m, const char *name) {
    SIM_LOCKED(get_global(sim_library_of_module(m), name, dptr, bytes));
}
SIM_API CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary l, const char *name) {
    SIM_LOCKED(get_global(as_library(l), name, dptr, bytes));
}
