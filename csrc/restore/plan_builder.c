/* Every graph of a restore plan in one call: each graph's arrays put together from its template
 * and its own rows, parameter bytes and relocations, as the artifact stores them, then built by
 * mr_build_graph. One call for all graphs: the interpreter's cost per graph was a visible share
 * of a restore. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "restore.h"

#define EXPORT __attribute__((visibility("default")))

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* [off, off + len) lies in [0, total), without an addition that could wrap around. */
static int in_range(uint64_t off, uint64_t len, uint64_t total) {
    return len <= total && off <= total - len;
}

/* Why graph g's ranges do not lie in the plan's tables, or NULL. */
static const char *check_ref(const mr_plan *p, const mr_graph_ref *g) {
    if (g->template_index >= p->num_templates)
        return "its template is not in the template table";
    const mr_template *t = &p->templates[g->template_index];
    if (!in_range(t->node_off, t->num_nodes, p->num_nodes) ||
        !in_range(t->param_off, t->params_len, p->params_len) ||
        !in_range(t->reloc_off, t->num_relocs, p->num_relocs) ||
        !in_range(t->edge_off, t->num_edges, p->num_edges))
        return "its template's ranges lie outside the plan's tables";
    if (!in_range(g->row_off, g->num_rows, p->num_rows) ||
        !in_range(g->param_off, g->params_len, p->params_len) ||
        !in_range(g->reloc_off, g->num_relocs, p->num_relocs) ||
        !in_range(g->attr_off, g->num_attrs, p->num_attrs))
        return "its ranges lie outside the plan's tables";
    if ((uint64_t)t->num_relocs + g->num_relocs > UINT32_MAX)
        return "it has more relocations than one graph may";
    for (uint32_t i = 0; i < g->num_rows; i++)
        if (p->idx[g->row_off + i] >= t->num_nodes)
            return "a row of its own replaces a node its template does not have";
    return NULL;
}

/* Graph g's arrays: the template's rows with its own in their places, the template's parameter
 * bytes and relocations followed by its own (its rows' offsets count from the template's
 * start). The caller frees the three buffers. */
static int compose(const mr_plan *p, const mr_graph_ref *g, mr_graph *out) {
    const mr_template *t = &p->templates[g->template_index];
    mr_node *nodes = malloc(((size_t)t->num_nodes + 1) * sizeof *nodes);
    uint8_t *params = malloc(t->params_len + g->params_len + 1);
    mr_reloc *relocs = malloc(((size_t)t->num_relocs + g->num_relocs + 1) * sizeof *relocs);
    if (!nodes || !params || !relocs) {
        free(nodes), free(params), free(relocs);
        return -1;
    }
    memcpy(nodes, p->nodes + t->node_off, (size_t)t->num_nodes * sizeof *nodes);
    for (uint32_t i = 0; i < g->num_rows; i++)
        nodes[p->idx[g->row_off + i]] = p->rows[g->row_off + i];
    memcpy(params, p->params + t->param_off, t->params_len);
    memcpy(params + t->params_len, p->params + g->param_off, g->params_len);
    memcpy(relocs, p->relocs + t->reloc_off, (size_t)t->num_relocs * sizeof *relocs);
    memcpy(relocs + t->num_relocs, p->relocs + g->reloc_off, (size_t)g->num_relocs * sizeof *relocs);
    *out = (mr_graph){.nodes = nodes, .num_nodes = t->num_nodes, .params = params,
                      .params_len = t->params_len + g->params_len, .relocs = relocs,
                      .num_relocs = t->num_relocs + g->num_relocs,
                      .edges = t->num_edges ? p->edges + t->edge_off : NULL,
                      .num_edges = t->num_edges,
                      .attrs = g->num_attrs ? p->attrs + g->attr_off : NULL,
                      .num_attrs = g->num_attrs};
    return 0;
}

static int build_one(const mr_plan *p, uint32_t i, const mr_kernels *k,
                     const uint64_t *const bases[MR_KINDS], const uint64_t nb[MR_KINDS],
                     CUstream stream, CUgraphExec *exec, char *err, size_t errlen) {
    const char *why = check_ref(p, &p->graphs[i]);
    if (why) {
        snprintf(err, errlen, "%s", why);
        return CUDA_ERROR_INVALID_VALUE;
    }
    mr_graph g;
    if (compose(p, &p->graphs[i], &g)) {
        snprintf(err, errlen, "out of host memory");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int e = mr_build_graph(&g, k, bases, nb, stream, exec, err, errlen);
    free((void *)g.nodes), free((void *)g.params), free((void *)g.relocs);
    return e;
}

EXPORT int mr_build_plan(const mr_plan *p, const mr_kernels *k,
                         const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                         CUstream stream, CUgraphExec *execs, double *secs, uint32_t *built,
                         char *err, size_t errlen) {
    *built = 0;
    for (uint32_t i = 0; i < p->num_graphs; i++) {
        double t0 = seconds();
        execs[i] = NULL;
        int e = build_one(p, i, k, bases, num_bases, stream, &execs[i], err, errlen);
        if (e)
            return e;
        secs[i] = seconds() - t0;
        *built = i + 1;
    }
    return CUDA_SUCCESS;
}
