/* libmedusa_restore.so: builds CUDA graphs from a restore plan, in C (no interpreter per node).
 * The Python restorer lays the plan out in these arrays (numpy dtypes mirror them exactly). */
#ifndef MEDUSA_RESTORE_H
#define MEDUSA_RESTORE_H

#include <cuda.h>
#include <stdint.h>

typedef struct {
    uint32_t type; /* CUgraphNodeType: kernel, memcpy, memset or empty */
    uint32_t func; /* kernel: index into funcs */
    uint32_t grid[3], block[3], shared;
    uint32_t param_off, param_len; /* kernel: the recorded parameter bytes, in params */
    uint32_t reloc_off, reloc_len; /* the node's relocations, in relocs */
    uint32_t depth;         /* memcpy: slices (0 or 1 for a 1-D or 2-D copy) */
    uint64_t width, height; /* memcpy: bytes per row, rows; memset: elements per row, rows */
    uint64_t value;         /* memset: the value */
    uint64_t elem;          /* memset: element size; memcpy: src memory type | dst type << 8 */
} mr_node;

/* Word `offset` (bytes; memcpy/memset: 0 = destination, 8 = source) becomes
 * bases[kind][target] + addend. */
typedef struct {
    uint32_t offset, kind;
    uint64_t target;
    int64_t addend;
} mr_reloc;

typedef struct {
    uint32_t from, to;
    uint8_t from_port, to_port, type, pad[5];
} mr_edge;

/* A kernel node attribute (CUlaunchAttributeValue); pointer words in it (an access-policy
 * window's base_ptr) are relocated like parameter words, offsets within value. */
typedef struct {
    uint32_t node, attr;
    uint8_t value[64];
    uint32_t reloc_off, reloc_len; /* in relocs */
} mr_attr;

/* A kernel: its handle and where its parameters lie in the parameter bytes (from
 * cuFuncGetParamInfo at record time), so that it is launched with kernelParams. */
typedef struct {
    uint64_t func; /* CUfunction */
    uint32_t layout_off, layout_len; /* in the layout table */
} mr_func;

typedef struct {
    uint32_t offset, size;
} mr_param;

typedef struct {
    const mr_func *funcs;
    uint32_t num_funcs;
    uint32_t num_params;
    const mr_param *params;
} mr_kernels;

/* Every index in a graph is checked against the length of the table it indexes: a plan comes
 * from a file, and a bad one must fail with an error, never read or write out of bounds. */
typedef struct {
    const mr_node *nodes;
    uint32_t num_nodes;
    const uint8_t *params;
    uint64_t params_len;
    const mr_reloc *relocs;
    uint32_t num_relocs;
    const mr_edge *edges;
    uint32_t num_edges;
    const mr_attr *attrs;
    uint32_t num_attrs;
} mr_graph;

#define MR_KINDS 4
#define MR_ABI_VERSION 3 /* 3: kernelParams from parameter layouts; attribute relocations; depth */
int mr_abi_version(void);
#define MR_MAX_PARAM_BYTES 32764u /* CUDA's limit on a kernel's parameter buffer */
/* Builds, instantiates and uploads one graph. Returns a CUresult; on failure err says which node. */
int mr_build_graph(const mr_graph *g, const mr_kernels *k,
                   const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                   CUstream stream, CUgraph *graph_out, CUgraphExec *exec_out, char *err,
                   size_t errlen);
/* Patches pointer words into a buffer (a permanent buffer's saved contents). Returns 0, or -1 - i
 * for the first relocation i that lies outside the buffer or has no target. */
int mr_relocate(uint8_t *data, size_t len, const mr_reloc *relocs, uint32_t n,
                const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS]);

#endif
