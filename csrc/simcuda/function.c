/* Kernel and function queries and attributes (driver API): cuFunc* take a CUfunction, cuKernel* a
 * CUkernel (module.c says which is which); the other kind is CUDA_ERROR_INVALID_HANDLE. */
#include "internal.h"

#define WITH(of, h, body)                                                                          \
    do {                                                                                           \
        sim_lock();                                                                                \
        sim_func *f = of(h);                                                                       \
        CUresult e_ = f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;                                \
        if (f) {                                                                                   \
            body;                                                                                  \
        }                                                                                          \
        sim_unlock();                                                                              \
        return e_;                                                                                 \
    } while (0)
#define WITH_FUNC(h, body) WITH(sim_func_of, h, body)
#define WITH_KERNEL(h, body) WITH(sim_kernel_of, h, body)

SIM_API CUresult cuKernelGetFunction(CUfunction *out, CUkernel k) {
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_KERNEL(k, { sim_func_load(f); *out = SIM_FUNC_HANDLE(f); });
}

SIM_API CUresult cuFuncGetName(const char **name, CUfunction h) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *name = f->name);
}

SIM_API CUresult cuKernelGetName(const char **name, CUkernel h) {
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_KERNEL(h, *name = f->name);
}

SIM_API CUresult cuFuncGetModule(CUmodule *m, CUfunction h) {
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *m = (CUmodule)&f->lib->module_tag);
}

SIM_API CUresult cuKernelGetLibrary(CUlibrary *l, CUkernel h) {
    SIM_SINCE(12050, cuKernelGetLibrary);
    if (!l)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_KERNEL(h, *l = (CUlibrary)f->lib);
}

static CUresult param_info(const sim_func *f, size_t index, size_t *offset, size_t *size) {
    if (index >= f->num_params)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset)
        *offset = f->params[index].offset;
    if (size)
        *size = f->params[index].size;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuFuncGetParamInfo(CUfunction h, size_t index, size_t *offset, size_t *size) {
    SIM_SINCE(12040, cuFuncGetParamInfo);
    if (!offset && !size)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, e_ = param_info(f, index, offset, size));
}

SIM_API CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t *offset, size_t *size) {
    SIM_SINCE(12040, cuKernelGetParamInfo);
    if (!offset && !size)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_KERNEL(k, e_ = param_info(f, index, offset, size));
}

SIM_API CUresult cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction h) {
    SIM_SINCE(12040, cuFuncIsLoaded);
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, *state = f->loaded ? CU_FUNCTION_LOADING_STATE_LOADED : CU_FUNCTION_LOADING_STATE_UNLOADED);
}

SIM_API CUresult cuFuncLoad(CUfunction h) {
    SIM_SINCE(12040, cuFuncLoad);
    WITH_FUNC(h, sim_func_load(f));
}

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
    if ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    WITH_KERNEL(k, e_ = set_attr(f, a, v));
}

static void get_attr(const sim_func *f, CUfunction_attribute a, int *pi) {
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dynamic_smem; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = g_sim.cfg.cc_major * 10 + g_sim.cfg.cc_minor; break;
    default: *pi = f->attr_values[a]; break;
    }
}

SIM_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction h) {
    if (!pi || (int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    WITH_FUNC(h, get_attr(f, a, pi));
}

SIM_API CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute a, CUkernel k, CUdevice dev) {
    if (!pi || (int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    WITH_KERNEL(k, get_attr(f, a, pi));
}
