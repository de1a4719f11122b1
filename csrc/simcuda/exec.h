/* Executable graphs, shared by exec.c (building and changing them) and graph_run.c (running). */
#ifndef SIMCUDA_EXEC_H
#define SIMCUDA_EXEC_H

#include "internal.h"

typedef struct sim_exec_node {
    CUgraphNodeType type;
    const sim_node *origin; /* the node handle of the instantiated graph, kept across updates */
    size_t num_deps;
    sim_kernel_op k;
    sim_memcpy_op c;
    sim_memset_op s;
    CUDA_HOST_NODE_PARAMS h;
} sim_exec_node;

/* The nodes of an exec in a topological order, with their dependencies as indices. Held by the
 * exec and by each queued launch of it; immutable while more than one holds it. */
typedef struct sim_exec_image {
    uint32_t refs;
    size_t n;
    sim_exec_node *v;
    size_t *dep_start; /* node i depends on dep[dep_start[i] .. dep_start[i + 1]) */
    uint32_t *dep;
    uint64_t *reach; /* racecheck: row i has bit j set when a path leads from node j to node i */
    unsigned char *params; /* the kernel nodes' parameters as instantiated (pooled), or NULL */
} sim_exec_image;

typedef struct sim_exec {
    sim_exec_image *img;
    sim_op *last; /* its last launch: the next one is ordered after it, as in CUDA */
} sim_exec;

sim_exec *sim_as_exec(CUgraphExec h);
void sim_exec_image_unref(sim_exec_image *img);
/* race.c: whether node `from` precedes node `to` in every run of the image (lock held). */
bool sim_exec_precedes(sim_exec_image *img, uint32_t from, uint32_t to);

#endif
