/* Building one graph from its arrays (graph_builder.c), in the steps a plan's graphs share
 * (plan_builder.c); internal to libmedusa_restore. */
#ifndef MEDUSA_GRAPH_BUILD_H
#define MEDUSA_GRAPH_BUILD_H

#include "restore.h"

/* Scratch for one node: its relocated parameter bytes and kernelParams pointing into them. */
typedef struct {
    uint8_t *bytes;
    void **ptrs;
} mr_scratch;

/* bases[kind][target] + addend for a relocation: 0, or -1 when it names nothing restored. */
int mr_resolve(const mr_reloc *r, const uint64_t *const bases[MR_KINDS],
               const uint64_t num_bases[MR_KINDS], uint64_t *out);

/* 0, or -1 when out of memory (nothing to free then). */
int mr_scratch_init(mr_scratch *s, const mr_kernels *k);
void mr_scratch_free(mr_scratch *s);

/* Every node of g checked against the tables it indexes; else err names the first that is not. */
CUresult mr_check_nodes(const mr_graph *g, const mr_kernels *k, char *err, size_t errlen);

/* A new graph with g's nodes (nodes[i]: node i), edges and attributes, its nodes checked first
 * (mr_check_nodes). On failure nothing is left and *out is NULL. */
CUresult mr_populate(const mr_graph *g, const mr_kernels *k, const uint64_t *const bases[MR_KINDS],
                     const uint64_t nb[MR_KINDS], mr_scratch *s, CUgraph *out, CUgraphNode *nodes,
                     char *err, size_t errlen);

/* Kernel node `node` given node i of g's parameters (g's nodes checked, node i a kernel's). */
CUresult mr_set_kernel(const mr_graph *g, uint32_t i, const mr_kernels *k,
                       const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                       mr_scratch *s, CUgraphNode node, char *err, size_t errlen);

/* The graph instantiated and uploaded into *exec; the graph stays. */
CUresult mr_instantiate(CUgraph graph, CUstream stream, CUgraphExec *exec, char *err,
                        size_t errlen);

#endif
