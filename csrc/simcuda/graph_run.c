/* Launching an executable graph: one operation in its stream. Its nodes run in a topological
 * order the schedule's RNG draws at launch, so nodes with no path between them run in either
 * order; the race checker treats them as unordered (graph_run.c's sim_exec_precedes). */
#include <stdlib.h>
#include <string.h>

#include "exec.h"

/* A random topological order (Kahn's algorithm, the next node drawn among the ready ones). */
static uint32_t *draw_order(const sim_exec_image *img) {
    size_t n = img->n, edges = img->dep_start[n];
    uint32_t *order = malloc((n + 1) * sizeof *order), *indeg = calloc(n + 1, sizeof *indeg);
    size_t *cstart = calloc(n + 2, sizeof *cstart), *fill = calloc(n + 1, sizeof *fill);
    uint32_t *child = malloc((edges + 1) * sizeof *child), *ready = malloc((n + 1) * sizeof *ready);
    if (!order || !indeg || !cstart || !fill || !child || !ready) {
        free(order);
        order = NULL;
        goto out;
    }
    for (size_t k = 0; k < edges; k++)
        cstart[img->dep[k] + 1]++;
    for (size_t i = 0; i < n; i++)
        cstart[i + 1] += cstart[i];
    for (size_t i = 0; i < n; i++)
        for (size_t k = img->dep_start[i]; k < img->dep_start[i + 1]; k++)
            child[cstart[img->dep[k]] + fill[img->dep[k]]++] = (uint32_t)i;
    size_t num_ready = 0, done = 0;
    for (size_t i = 0; i < n; i++)
        if (!(indeg[i] = (uint32_t)(img->dep_start[i + 1] - img->dep_start[i])))
            ready[num_ready++] = (uint32_t)i;
    while (num_ready) {
        size_t r = num_ready == 1 ? 0 : sim_rand() % num_ready;
        uint32_t p = ready[r];
        ready[r] = ready[--num_ready];
        order[done++] = p;
        for (size_t k = cstart[p]; k < cstart[p + 1]; k++)
            if (--indeg[child[k]] == 0)
                ready[num_ready++] = child[k];
    }
out:
    free(indeg);
    free(cstart);
    free(fill);
    free(child);
    free(ready);
    return order;
}

/* Memcpy and memset nodes' ranges are checked at launch, as simcuda's launch always did. */
static CUresult check_nodes(const sim_exec_image *img) {
    CUresult e = CUDA_SUCCESS;
    for (size_t i = 0; !e && i < img->n; i++)
        if (img->v[i].type == CU_GRAPH_NODE_TYPE_MEMCPY)
            e = sim_check_memcpy(&img->v[i].c);
        else if (img->v[i].type == CU_GRAPH_NODE_TYPE_MEMSET)
            e = sim_check_memset(&img->v[i].s);
    return e;
}

/* Checks the exec and the stream; launching into a capture or next to one is refused. */
static CUresult prepare_launch(CUgraphExec h, CUstream s, bool ptsz, sim_exec **x, sim_stream **st) {
    CUresult e = CUDA_SUCCESS;
    *x = sim_as_exec(h);
    *st = sim_stream_resolve(s, ptsz, &e);
    if (!*x)
        e = CUDA_ERROR_INVALID_VALUE;
    else if (*st && (*st)->cap) {
        (*st)->cap->invalidated = true;
        e = sim_fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "simcuda cannot capture a graph launch");
    } else if (*st == &g_sim.legacy)
        e = sim_legacy_implicit();
    return e;
}

static CUresult launch(CUgraphExec h, CUstream s, bool ptsz) {
    sim_exec *x;
    sim_stream *st;
    CUresult e = prepare_launch(h, s, ptsz, &x, &st);
    if (!e)
        e = check_nodes(x->img);
    sim_op *op = e ? NULL : sim_op_new(OP_GRAPH);
    if (!e && op && !(op->u.graph.order = draw_order(x->img)))
        e = CUDA_ERROR_OUT_OF_MEMORY;
    if (e || !op) {
        free(op);
        return e ? e : CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->u.graph.img = x->img;
    x->img->refs++;
    sim_enqueue(st, op, x->last ? &x->last : NULL, x->last ? 1 : 0);
    sim_op_unref(x->last);
    op->refs++; /* the exec's: its next launch follows this one */
    x->last = op;
    return g_sim.cfg.launch_blocking ? sim_wait_ops(&op, 1) : CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec h, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    SIM_LOCKED(launch(h, s, ptsz));
}

SIM_API CUresult cuGraphLaunch(CUgraphExec h, CUstream s) { return graph_launch(h, s, false); }
SIM_API CUresult cuGraphLaunch_ptsz(CUgraphExec h, CUstream s) { return graph_launch(h, s, true); }

static CUresult upload(CUgraphExec h, CUstream s, bool ptsz) {
    CUresult e = sim_ensure_init();
    if (e)
        return e;
    sim_exec *x;
    sim_stream *st;
    SIM_LOCKED(prepare_launch(h, s, ptsz, &x, &st));
}

SIM_API CUresult cuGraphUpload(CUgraphExec h, CUstream s) { return upload(h, s, false); }
SIM_API CUresult cuGraphUpload_ptsz(CUgraphExec h, CUstream s) { return upload(h, s, true); }

/* ---- running a launch: its stream reached it ---- */
static CUresult run_node(sim_op *op, uint32_t i) {
    const sim_exec_node *n = &op->u.graph.img->v[i];
    switch (n->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
        if (g_sim.cfg.racecheck)
            sim_race_collect_begin();
        sim_acc_set_node(n->origin);
        CUresult e = sim_run_kernel(&n->k);
        sim_acc_set_node(NULL);
        return g_sim.cfg.racecheck ? sim_race_collect_end(op, (int32_t)i, e ? NULL : &n->k) : e;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: return sim_run_memcpy_op(op, (int32_t)i, &n->c);
    case CU_GRAPH_NODE_TYPE_MEMSET: return sim_run_memset_op(op, (int32_t)i, &n->s);
    case CU_GRAPH_NODE_TYPE_HOST: sim_run_host(&n->h); return CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
    }
}

void sim_graph_run(sim_op *op) {
    CUresult e = CUDA_SUCCESS;
    for (size_t k = 0; !e && k < op->u.graph.img->n; k++)
        e = run_node(op, op->u.graph.order[k]);
}

/* ---- for the race checker: the image's reachability, computed on first use ---- */
static bool compute_reach(sim_exec_image *img) {
    size_t n = img->n, words = (n + 63) / 64;
    img->reach = calloc(n * words + 1, sizeof *img->reach);
    if (!img->reach)
        return false;
    for (size_t i = 0; i < n; i++) { /* in topological order: dependencies' rows are complete */
        uint64_t *row = img->reach + i * words;
        for (size_t k = img->dep_start[i]; k < img->dep_start[i + 1]; k++) {
            uint32_t d = img->dep[k];
            const uint64_t *drow = img->reach + (size_t)d * words;
            for (size_t w = 0; w < words; w++)
                row[w] |= drow[w];
            row[d / 64] |= 1ull << (d % 64);
        }
    }
    return true;
}

bool sim_exec_precedes(sim_exec_image *img, uint32_t from, uint32_t to) {
    if (from == to)
        return true;
    if (!img->reach && !compute_reach(img))
        return true; /* NOTE: out of memory: no race is reported within the graph */
    size_t words = (img->n + 63) / 64;
    return (img->reach[(size_t)to * words + from / 64] >> (from % 64)) & 1;
}
