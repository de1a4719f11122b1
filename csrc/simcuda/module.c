/* Modules, libraries, kernels and functions (driver API). CUlibrary is a sim_library, CUmodule is
 * the address of its module_tag, CUkernel and CUfunction are the same sim_func (context-less). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

sim_library *sim_library_of_module(CUmodule m) {
    sim_library *lib = (sim_library *)((char *)m - offsetof(sim_library, module_tag));
    return m && sim_handle_is(lib, H_LIBRARY) ? lib : NULL;
}

static sim_func *as_func(const void *f) { return sim_handle_is(f, H_FUNC) ? (sim_func *)f : NULL; }

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

SIM_API CUresult cuLibraryUnload(CUlibrary l) {
    sim_lock();
    CUresult e = unload(sim_handle_is(l, H_LIBRARY) ? (sim_library *)l : NULL, false);
    sim_unlock();
    return e;
}

SIM_API CUresult cuModuleUnload(CUmodule m) {
    sim_lock();
    CUresult e = unload(sim_library_of_module(m), true);
    sim_unlock();
    return e;
}

static sim_func *find_func(sim_library *lib, const char *name) {
    for (unsigned i = 0; i < lib->num_funcs; i++)
        if (strcmp(lib->funcs[i].name, name) == 0)
            return &lib->funcs[i];
    return NULL;
}

static CUresult get_func(sim_library *lib, const char *name, void **out, bool load_it) {
    if (!out || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!lib)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_func *f = find_func(lib, name);
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    if (load_it)
        sim_func_load(f);
    *out = f;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) {
    sim_lock();
    CUresult e = get_func(sim_handle_is(l, H_LIBRARY) ? (sim_library *)l : NULL, name, (void **)k, false);
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

static CUresult enum_funcs(sim_library *lib, void **out, unsigned n) {
    if (!out || !lib)
        return !lib ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_VALUE;
    if (n > lib->num_funcs)
        n = lib->num_funcs;
    for (unsigned i = 0; i < n; i++)
        out[i] = &lib->funcs[i];
    return CUDA_SUCCESS;
}

SIM_API CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary l) {
    SIM_LOCKED(count_funcs(sim_handle_is(l, H_LIBRARY) ? (sim_library *)l : NULL, count));
}
SIM_API CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule m) {
    SIM_LOCKED(count_funcs(sim_library_of_module(m), count));
}
SIM_API CUresult cuLibraryEnumerateKernels(CUkernel *k, unsigned int n, CUlibrary l) {
    SIM_LOCKED(enum_funcs(sim_handle_is(l, H_LIBRARY) ? (sim_library *)l : NULL, (void **)k, n));
}
SIM_API CUresult cuModuleEnumerateFunctions(CUfunction *f, unsigned int n, CUmodule m) {
    SIM_LOCKED(enum_funcs(sim_library_of_module(m), (void **)f, n));
}

SIM_API CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l) {
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    bool ok = sim_handle_is(l, H_LIBRARY);
    if (ok)
        *m = (CUmodule) & ((sim_library *)l)->module_tag;
    sim_unlock();
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
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
    SIM_LOCKED(get_global(sim_handle_is(l, H_LIBRARY) ? (sim_library *)l : NULL, name, dptr, bytes));
}

/* ---- per-function queries ---- */
#define WITH_FUNC(h, body)                                                                         \
    do {                                                                                           \
        sim_lock();                                                                                \
        sim_func *f = as_func(h);                                                                  \
        CUresult e_ = f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;                                \
        if (f) {                                                                                   \
            body;                                                                                  \
        }                                                                                          \
        sim_unlock();                                                                              \
        return e_;                                                                                 \
    } while (0)

SIM_API CUresult cuKernelGetFunction(CUfunction *out, CUkernel k) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(k, { sim_func_load(f); *out = (CUfunction)f; });
}

SIM_API CUresult cuFuncGetName(const char **name, CUfunction h) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *name = f->name);
}

SIM_API CUresult cuKernelGetName(const char **name, CUkernel h) {
    return cuFuncGetName(name, (CUfunction)h);
}

SIM_API CUresult cuFuncGetModule(CUmodule *m, CUfunction h) {
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *m = (CUmodule)&f->lib->module_tag);
}

SIM_API CUresult cuKernelGetLibrary(CUlibrary *l, CUkernel h) {
    if (!l)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *l = (CUlibrary)f->lib);
}

SIM_API CUresult cuFuncGetParamInfo(CUfunction h, size_t index, size_t *offset, size_t *size) {
    if (!offset && !size)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, {
        if (index >= f->num_params) {
            e_ = CUDA_ERROR_INVALID_VALUE;
        } else {
            if (offset)
                *offset = f->params[index].offset;
            if (size)
                *size = f->params[index].size;
        }
    });
}

SIM_API CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t *offset, size_t *size) {
    return cuFuncGetParamInfo((CUfunction)k, index, offset, size);
}

SIM_API CUresult cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction h) {
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *state = f->loaded ? CU_FUNCTION_LOADING_STATE_LOADED : CU_FUNCTION_LOADING_STATE_UNLOADED);
}

SIM_API CUresult cuFuncLoad(CUfunction h) { WITH_FUNC(h, sim_func_load(f)); }

static CUresult set_attr(sim_func *f, CUfunction_attribute a, int v) {
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        if (v < 0 || v > 227 * 1024)
            return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_smem = v;
        break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    f->attr_values[a] = v;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuFuncSetAttribute(CUfunction h, CUfunction_attribute a, int v) {
    if ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, e_ = set_attr(f, a, v));
}

SIM_API CUresult cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice dev) {
    return dev != 0 ? CUDA_ERROR_INVALID_DEVICE : cuFuncSetAttribute((CUfunction)k, a, v);
}

SIM_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction h) {
    if (!pi || (int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, {
        switch (a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dynamic_smem; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION:
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = g_sim.cfg.cc_major * 10 + g_sim.cfg.cc_minor; break;
        default: *pi = f->attr_values[a]; break;
        }
    });
}

SIM_API CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute a, CUkernel k, CUdevice dev) {
    return dev != 0 ? CUDA_ERROR_INVALID_DEVICE : cuFuncGetAttribute(pi, a, (CUfunction)k);
}
