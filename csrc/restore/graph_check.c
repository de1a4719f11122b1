/* What a graph's arrays may index, checked before any driver call reads them, and relocation
 * (a plan comes from a file: a bad index is an error, never a read or write out of bounds). */
#include <stdio.h>
#include <string.h>

#include "graph_build.h"

#define EXPORT __attribute__((visibility("default")))

int mr_resolve(const mr_reloc *r, const uint64_t *const bases[MR_KINDS],
               const uint64_t num_bases[MR_KINDS], uint64_t *out) {
    if (r->kind >= MR_KINDS || r->target >= num_bases[r->kind] || !bases[r->kind][r->target])
        return -1;
    *out = bases[r->kind][r->target] + (uint64_t)r->addend;
    return 0;
}

EXPORT int mr_relocate(uint8_t *data, size_t len, const mr_reloc *relocs, uint32_t n,
                       const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS]) {
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        if ((uint64_t)relocs[i].offset + 8 > len || mr_resolve(&relocs[i], bases, num_bases, &v))
            return i < INT32_MAX ? -1 - (int)i : INT32_MIN;
        memcpy(data + relocs[i].offset, &v, 8);
    }
    return 0;
}

/* Why a kernel node's parameters cannot be passed as kernelParams, or NULL: every parameter of
 * its kernel's recorded layout must lie in the node's parameter bytes. */
static const char *check_layout(const mr_kernels *k, const mr_node *n) {
    const mr_func *f = &k->funcs[n->func];
    if ((uint64_t)f->layout_off + f->layout_len > k->num_params ||
        f->layout_len > MR_MAX_PARAM_BYTES)
        return "its kernel's parameter layout lies outside the layout table";
    if (!f->layout_len && n->param_len)
        return "its kernel's parameter layout was not recorded (cuFuncGetParamInfo), so its "
               "parameters cannot be passed as kernelParams";
    for (uint32_t j = 0; j < f->layout_len; j++) {
        const mr_param *p = &k->params[f->layout_off + j];
        if ((uint64_t)p->offset + p->size > n->param_len)
            return "a parameter of its kernel's layout lies outside its parameter bytes";
    }
    return NULL;
}

/* Why a node cannot be built from the tables it indexes (64-bit sums: no wrap-around), or NULL. */
static const char *check_node(const mr_graph *g, const mr_node *n, const mr_kernels *k) {
    if ((uint64_t)n->reloc_off + n->reloc_len > g->num_relocs)
        return "its relocations lie outside the relocation table";
    switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
        if (n->func >= k->num_funcs)
            return "its kernel is not in the kernel table";
        if (n->param_len > MR_MAX_PARAM_BYTES ||
            (uint64_t)n->param_off + n->param_len > g->params_len)
            return "its parameters lie outside the parameter bytes";
        return check_layout(k, n);
    case CU_GRAPH_NODE_TYPE_MEMCPY:
        if (n->height > 1 || n->depth > 1)
            return "it is a 2-D or 3-D copy, and the recording keeps no pitches: restore "
                   "rebuilds 1-D copies only (copy row by row, or leave it out of the graph)";
        return NULL;
    case CU_GRAPH_NODE_TYPE_MEMSET:
        if (n->height > 1)
            return "it is a 2-D fill, and the recording keeps no pitch: restore rebuilds 1-D "
                   "fills only (fill row by row, or leave it out of the graph)";
        return NULL;
    case CU_GRAPH_NODE_TYPE_EMPTY: return NULL;
    default: return "its type is not one restore builds";
    }
}

CUresult mr_check_nodes(const mr_graph *g, const mr_kernels *k, char *err, size_t errlen) {
    for (uint32_t i = 0; i < g->num_nodes; i++) {
        const char *why = check_node(g, &g->nodes[i], k);
        if (why) {
            snprintf(err, errlen, "node %u (type %u): %s", i, g->nodes[i].type, why);
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}
