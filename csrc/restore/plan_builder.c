/* Every graph of a restore plan in one call (the interpreter's cost per graph was a visible share
 * of a restore). Each graph's arrays are put together from its template and its own rows,
 * parameter bytes and relocations, as the artifact stores them. The first graph of a template is
 * built node by node; a later one reuses that graph, its kernel nodes whose parameters differ
 * set anew, and is instantiated from it (one graph per template, DESIGN.md). A graph with node
 * attributes, or whose copies or fills differ, is built anew. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph_build.h"
#include "graph_driver.h"

#define EXPORT __attribute__((visibility("default")))
#define D (*mr_driver_api())

/* A template's graph as the last graph built from it left it. */
typedef struct {
    CUgraph graph; /* NULL: none */
    CUgraphNode *nodes;
    mr_graph arrays; /* that graph's arrays, put together by compose() (owned) */
} mr_kept;

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
    memcpy(relocs + t->num_relocs, p->relocs + g->reloc_off,
           (size_t)g->num_relocs * sizeof *relocs);
    *out = (mr_graph){.nodes = nodes, .num_nodes = t->num_nodes, .params = params,
                      .params_len = t->params_len + g->params_len, .relocs = relocs,
                      .num_relocs = t->num_relocs + g->num_relocs,
                      .edges = t->num_edges ? p->edges + t->edge_off : NULL,
                      .num_edges = t->num_edges,
                      .attrs = g->num_attrs ? p->attrs + g->attr_off : NULL,
                      .num_attrs = g->num_attrs};
    return 0;
}

static void free_arrays(mr_graph *g) {
    free((void *)g->nodes), free((void *)g->params), free((void *)g->relocs);
    *g = (mr_graph){0};
}

static void drop(mr_kept *kp) {
    if (kp->graph)
        D.destroy(kp->graph);
    free(kp->nodes);
    free_arrays(&kp->arrays);
    *kp = (mr_kept){0};
}

/* Node i holds the same parameters in both graphs, wherever they lie in each one's tables (both
 * graphs' nodes checked). */
static int same_node(const mr_graph *a, const mr_graph *b, uint32_t i) {
    mr_node x = a->nodes[i], y = b->nodes[i];
    if (x.param_len != y.param_len || x.reloc_len != y.reloc_len ||
        memcmp(a->params + x.param_off, b->params + y.param_off, x.param_len) ||
        (x.reloc_len && memcmp(a->relocs + x.reloc_off, b->relocs + y.reloc_off,
                               (size_t)x.reloc_len * sizeof(mr_reloc))))
        return 0;
    x.param_off = y.param_off = x.reloc_off = y.reloc_off = 0;
    return !memcmp(&x, &y, sizeof x);
}

/* Whether graph g (its nodes checked) can be had from the kept graph by setting kernel nodes'
 * parameters alone: the same nodes and edges, no attributes, no copy or fill that differs. */
static int reusable(const mr_kept *kp, const mr_graph *g) {
    const mr_graph *a = &kp->arrays;
    if (!kp->graph || !D.kernel_set || a->num_attrs || g->num_attrs ||
        a->num_nodes != g->num_nodes || a->edges != g->edges || a->num_edges != g->num_edges)
        return 0;
    for (uint32_t i = 0; i < g->num_nodes; i++)
        if (a->nodes[i].type != g->nodes[i].type ||
            (g->nodes[i].type != CU_GRAPH_NODE_TYPE_KERNEL && !same_node(a, g, i)))
            return 0;
    return 1;
}

typedef struct {
    const mr_kernels *k;
    const uint64_t *const *bases;
    const uint64_t *nb;
    mr_scratch s;
    CUstream stream;
    char *err;
    size_t errlen;
} mr_ctx;

/* Graph g in kp: its kernel nodes that differ set anew, or a new graph; then instantiated. */
static CUresult build(mr_ctx *c, mr_kept *kp, const mr_graph *g, CUgraphExec *exec) {
    CUresult e = CUDA_SUCCESS;
    if (reusable(kp, g)) {
        for (uint32_t i = 0; !e && i < g->num_nodes; i++)
            if (g->nodes[i].type == CU_GRAPH_NODE_TYPE_KERNEL && !same_node(&kp->arrays, g, i))
                e = mr_set_kernel(g, i, c->k, c->bases, c->nb, &c->s, kp->nodes[i], c->err,
                                  c->errlen);
        return e ? e : mr_instantiate(kp->graph, c->stream, exec, c->err, c->errlen);
    }
    mr_kept fresh = {.nodes = calloc(g->num_nodes ? g->num_nodes : 1, sizeof(CUgraphNode))};
    if (!fresh.nodes) {
        snprintf(c->err, c->errlen, "out of host memory for %u nodes", g->num_nodes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e = mr_populate(g, c->k, c->bases, c->nb, &c->s, &fresh.graph, fresh.nodes, c->err, c->errlen);
    if (!e)
        e = mr_instantiate(fresh.graph, c->stream, exec, c->err, c->errlen);
    drop(kp);
    *kp = fresh; /* NOTE: on failure too: the caller drops every kept graph then */
    return e;
}

/* Graph i: its ranges checked, its arrays put together, built; its arrays then belong to the
 * template's kept graph. */
static CUresult build_one(mr_ctx *c, const mr_plan *p, mr_kept *kept, uint32_t i,
                          CUgraphExec *exec) {
    const char *why = check_ref(p, &p->graphs[i]);
    if (why) {
        snprintf(c->err, c->errlen, "%s", why);
        return CUDA_ERROR_INVALID_VALUE;
    }
    mr_graph g;
    if (compose(p, &p->graphs[i], &g)) {
        snprintf(c->err, c->errlen, "out of host memory");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mr_kept *kp = &kept[p->graphs[i].template_index];
    CUresult e = mr_check_nodes(&g, c->k, c->err, c->errlen);
    if (!e)
        e = build(c, kp, &g, exec);
    if (e) {
        free_arrays(&g);
        return e;
    }
    free_arrays(&kp->arrays);
    kp->arrays = g;
    return CUDA_SUCCESS;
}

EXPORT int mr_build_plan(const mr_plan *p, const mr_kernels *k,
                         const uint64_t *const bases[MR_KINDS], const uint64_t num_bases[MR_KINDS],
                         CUstream stream, CUgraphExec *execs, double *secs, uint32_t *built,
                         char *err, size_t errlen) {
    *built = 0;
    mr_ctx c = {k, bases, num_bases, {0}, stream, err, errlen};
    mr_kept *kept = calloc(p->num_templates ? p->num_templates : 1, sizeof *kept);
    if (!kept || mr_scratch_init(&c.s, k)) {
        free(kept);
        snprintf(err, errlen, "out of host memory");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult e = CUDA_SUCCESS;
    for (uint32_t i = 0; !e && i < p->num_graphs; i++) {
        double t0 = seconds();
        execs[i] = NULL;
        if (!(e = build_one(&c, p, kept, i, &execs[i]))) {
            secs[i] = seconds() - t0;
            *built = i + 1;
        }
    }
    for (uint32_t t = 0; t < p->num_templates; t++)
        drop(&kept[t]);
    free(kept);
    mr_scratch_free(&c.s);
    return e;
}
