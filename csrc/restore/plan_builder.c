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

/* Why graph i's arrays cannot be put together, or NULL. */
static const char *check_ref(const mr_plan *p, uint32_t i) {
    uint32_t t = p->graph_template[i];
    if (t >= p->num_templates)
        return "its template is not in the template table";
    const uint64_t *tl = p->template_lens + (size_t)t * MR_T_ARRAYS;
    const uint64_t *gl = p->graph_lens + (size_t)i * MR_G_ARRAYS;
    if (tl[MR_T_NODES] % sizeof(mr_node) || tl[MR_T_RELOCS] % sizeof(mr_reloc) ||
        tl[MR_T_EDGES] % sizeof(mr_edge) || gl[MR_G_IDX] % sizeof(uint32_t) ||
        gl[MR_G_ROWS] % sizeof(mr_node) || gl[MR_G_RELOCS] % sizeof(mr_reloc) ||
        gl[MR_G_ATTRS] % sizeof(mr_attr))
        return "an array of it or its template does not hold whole records";
    if (gl[MR_G_IDX] / sizeof(uint32_t) != gl[MR_G_ROWS] / sizeof(mr_node))
        return "its idx and rows differ in length";
    if (tl[MR_T_NODES] / sizeof(mr_node) > UINT32_MAX ||
        (tl[MR_T_RELOCS] + gl[MR_G_RELOCS]) / sizeof(mr_reloc) > UINT32_MAX ||
        tl[MR_T_EDGES] / sizeof(mr_edge) > UINT32_MAX ||
        gl[MR_G_ATTRS] / sizeof(mr_attr) > UINT32_MAX)
        return "it has more nodes, relocations, edges or attributes than one graph may";
    const uint8_t *idx = p->graphs[(size_t)i * MR_G_ARRAYS + MR_G_IDX];
    for (uint64_t r = 0; r < gl[MR_G_IDX] / sizeof(uint32_t); r++) {
        uint32_t node;
        memcpy(&node, idx + r * sizeof node, sizeof node);
        if (node >= tl[MR_T_NODES] / sizeof(mr_node))
            return "a row of its own replaces a node its template does not have";
    }
    return NULL;
}

/* Graph i's arrays (check_ref passed): its template's rows with its own in their places, the
 * template's parameter bytes and relocations followed by its own; the edges and attributes where
 * the caller holds them. The caller frees the three it allocates (free_arrays). */
static int compose(const mr_plan *p, uint32_t i, mr_graph *out) {
    uint32_t t = p->graph_template[i];
    const uint8_t *const *ta = p->templates + (size_t)t * MR_T_ARRAYS;
    const uint8_t *const *ga = p->graphs + (size_t)i * MR_G_ARRAYS;
    const uint64_t *tl = p->template_lens + (size_t)t * MR_T_ARRAYS;
    const uint64_t *gl = p->graph_lens + (size_t)i * MR_G_ARRAYS;
    mr_node *nodes = malloc(tl[MR_T_NODES] + 1);
    uint8_t *params = malloc(tl[MR_T_PARAMS] + gl[MR_G_PARAMS] + 1);
    uint8_t *relocs = malloc(tl[MR_T_RELOCS] + gl[MR_G_RELOCS] + 1);
    if (!nodes || !params || !relocs) {
        free(nodes), free(params), free(relocs);
        return -1;
    }
    memcpy(nodes, ta[MR_T_NODES], tl[MR_T_NODES]);
    for (uint64_t r = 0; r < gl[MR_G_IDX] / sizeof(uint32_t); r++) {
        uint32_t node;
        memcpy(&node, ga[MR_G_IDX] + r * sizeof node, sizeof node);
        memcpy(&nodes[node], ga[MR_G_ROWS] + r * sizeof(mr_node), sizeof(mr_node));
    }
    memcpy(params, ta[MR_T_PARAMS], tl[MR_T_PARAMS]);
    memcpy(params + tl[MR_T_PARAMS], ga[MR_G_PARAMS], gl[MR_G_PARAMS]);
    memcpy(relocs, ta[MR_T_RELOCS], tl[MR_T_RELOCS]);
    memcpy(relocs + tl[MR_T_RELOCS], ga[MR_G_RELOCS], gl[MR_G_RELOCS]);
    /* NOTE: edges and attributes are read where they lie: the buffers of a Python bytes object
     * (CPython aligns them to 8 bytes or more, as their records need). */
    *out = (mr_graph){.nodes = nodes, .num_nodes = (uint32_t)(tl[MR_T_NODES] / sizeof(mr_node)),
                      .params = params, .params_len = tl[MR_T_PARAMS] + gl[MR_G_PARAMS],
                      .relocs = (const mr_reloc *)relocs,
                      .num_relocs =
                          (uint32_t)((tl[MR_T_RELOCS] + gl[MR_G_RELOCS]) / sizeof(mr_reloc)),
                      .edges = (const mr_edge *)ta[MR_T_EDGES],
                      .num_edges = (uint32_t)(tl[MR_T_EDGES] / sizeof(mr_edge)),
                      .attrs = (const mr_attr *)ga[MR_G_ATTRS],
                      .num_attrs = (uint32_t)(gl[MR_G_ATTRS] / sizeof(mr_attr))};
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
    const char *why = check_ref(p, i);
    if (why) {
        snprintf(c->err, c->errlen, "%s", why);
        return CUDA_ERROR_INVALID_VALUE;
    }
    mr_graph g;
    if (compose(p, i, &g)) {
        snprintf(c->err, c->errlen, "out of host memory");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    mr_kept *kp = &kept[p->graph_template[i]];
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
