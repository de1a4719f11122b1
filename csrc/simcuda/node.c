/* Graph node parameters and attributes (driver API). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static sim_node *as_kernel_node(CUgraphNode h) {
    sim_node *n = sim_handle_is(h, H_NODE) ? (sim_node *)h : NULL;
    return n && n->type == CU_GRAPH_NODE_TYPE_KERNEL ? n : NULL;
}

static CUresult kernel_get(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS *p) {
    sim_node *n = as_kernel_node(h);
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    const sim_kernel_op *k = &n->k;
    if (!n->param_ptrs && !(n->param_ptrs = calloc(SIM_MAX_PARAMS, sizeof *n->param_ptrs)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0, sizeof *p);
    p->func = SIM_FUNC_HANDLE(k->func);
    p->gridDimX = k->grid[0], p->gridDimY = k->grid[1], p->gridDimZ = k->grid[2];
    p->blockDimX = k->block[0], p->blockDimY = k->block[1], p->blockDimZ = k->block[2];
    p->sharedMemBytes = k->smem;
    for (uint32_t i = 0; i < k->func->num_params; i++)
        n->param_ptrs[i] = k->params + k->func->params[i].offset;
    p->kernelParams = n->param_ptrs; /* node-owned, valid until the node changes */
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphKernelNodeGetParams(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_LOCKED(kernel_get(h, p));
}

CUresult sim_kernel_op_replace(sim_kernel_op *dst, const CUDA_KERNEL_NODE_PARAMS *p) {
    sim_func *f = sim_param_func(p);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    sim_kernel_op op = {0};
    CUresult e = sim_kernel_op_init(&op, f, g, b, p->sharedMemBytes, p->kernelParams, p->extra);
    if (e)
        return e;
    sim_kernel_op_free(dst);
    *dst = op;
    return CUDA_SUCCESS;
}

static bool is_cooperative(const sim_node *n) {
    for (int i = 0; i < n->num_attrs; i++)
        if (n->attr_ids[i] == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && n->attr_vals[i].cooperative)
            return true;
    return false;
}

/* As the driver: a cooperative kernel takes its parameters as kernelParams, never through extra
 * (CU_LAUNCH_PARAM_BUFFER_POINTER). */
static CUresult refuse_extra(const sim_node *n) {
    return sim_fail(CUDA_ERROR_INVALID_VALUE,
                    "%s: a cooperative kernel node takes kernelParams, not extra (a packed "
                    "parameter buffer)",
                    n->k.func ? n->k.func->name : "kernel node");
}

static CUresult kernel_set(CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS *p) {
    sim_node *n = as_kernel_node(h);
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->extra && is_cooperative(n))
        return refuse_extra(n);
    sim_func *f = sim_param_func(p);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    const unsigned g[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
    const unsigned b[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
    CUresult e = sim_kernel_op_set(&n->k, f, g, b, p->sharedMemBytes, p->kernelParams, p->extra);
    if (!e)
        n->params_by_extra = p->extra != NULL;
    return e;
}

SIM_API CUresult cuGraphKernelNodeSetParams(CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS *p) {
    SIM_LOCKED(kernel_set(h, p));
}

static CUresult attr_get(CUgraphNode h, CUkernelNodeAttrID id, CUkernelNodeAttrValue *v) {
    sim_node *n = as_kernel_node(h);
    if (!n || !v)
        return CUDA_ERROR_INVALID_VALUE;
    memset(v, 0, sizeof *v);
    for (int i = 0; i < n->num_attrs; i++)
        if (n->attr_ids[i] == id)
            *v = n->attr_vals[i];
    return CUDA_SUCCESS;
}

static CUresult attr_set(CUgraphNode h, CUkernelNodeAttrID id, const CUkernelNodeAttrValue *v) {
    sim_node *n = as_kernel_node(h);
    if (!n || !v || id <= CU_LAUNCH_ATTRIBUTE_IGNORE || id > SIM_LAUNCH_ATTRIBUTE_LAST)
        return CUDA_ERROR_INVALID_VALUE;
    if (id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && v->cooperative && n->params_by_extra)
        return refuse_extra(n);
    for (int i = 0; i < n->num_attrs; i++)
        if (n->attr_ids[i] == id) {
            n->attr_vals[i] = *v;
            return CUDA_SUCCESS;
        }
    if (n->num_attrs == SIM_MAX_ATTRS)
        return CUDA_ERROR_NOT_SUPPORTED;
    n->attr_ids[n->num_attrs] = id;
    n->attr_vals[n->num_attrs++] = *v;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphKernelNodeGetAttribute(CUgraphNode h, CUkernelNodeAttrID id, CUkernelNodeAttrValue *v) {
    SIM_LOCKED(attr_get(h, id, v));
}
SIM_API CUresult cuGraphKernelNodeSetAttribute(CUgraphNode h, CUkernelNodeAttrID id,
                                               const CUkernelNodeAttrValue *v) {
    SIM_LOCKED(attr_set(h, id, v));
}

static CUresult memcpy_get(CUgraphNode h, CUDA_MEMCPY3D *p) {
    sim_node *n = sim_handle_is(h, H_NODE) ? (sim_node *)h : NULL;
    if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_MEMCPY)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->srcMemoryType = p->dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    p->srcDevice = n->c.src;
    p->dstDevice = n->c.dst;
    p->WidthInBytes = p->srcPitch = p->dstPitch = n->c.bytes;
    p->Height = p->Depth = p->srcHeight = p->dstHeight = 1;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphMemcpyNodeGetParams(CUgraphNode h, CUDA_MEMCPY3D *p) { SIM_LOCKED(memcpy_get(h, p)); }

static CUresult memset_get(CUgraphNode h, CUDA_MEMSET_NODE_PARAMS *p) {
    sim_node *n = sim_handle_is(h, H_NODE) ? (sim_node *)h : NULL;
    if (!n || !p || n->type != CU_GRAPH_NODE_TYPE_MEMSET)
        return CUDA_ERROR_INVALID_VALUE;
    *p = (CUDA_MEMSET_NODE_PARAMS){n->s.dst, n->s.pitch, n->s.value, n->s.elem, n->s.width, n->s.height};
    return CUDA_SUCCESS;
}

SIM_API CUresult cuGraphMemsetNodeGetParams(CUgraphNode h, CUDA_MEMSET_NODE_PARAMS *p) {
    SIM_LOCKED(memset_get(h, p));
}
