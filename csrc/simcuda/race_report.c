/* The race checker's messages, and what a kernel accesses: the byte ranges it names with
 * simcudaAccess while it runs, clipped to the block each starts in. NOTE (deliberate exemption):
 * a kernel that never calls simcudaAccess is taken to read and write the whole of every block its
 * pointer arguments point into, and nothing else (pointers it finds in memory are not followed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "race.h"

static void stream_name(const sim_op *op, char *buf, size_t n) {
    if (op->stream_handle)
        snprintf(buf, n, "stream %p", (void *)op->stream_handle);
    else
        snprintf(buf, n, "the %s default stream", op->per_thread ? "per-thread" : "legacy");
}

static const char *side(uintptr_t p) {
    if (p - g_sim.va_base < g_sim.va_size)
        return "device";
    return rs_find(&g_sim.hosts, p) ? "pinned host" : "host";
}

static void describe_copy(const sim_memcpy_op *c, char *buf, size_t n) {
    snprintf(buf, n, "a %zu-byte copy from %s to %s memory", c->bytes, side(c->src), side(c->dst));
}

static void describe_node(const sim_exec_image *img, int32_t i, char *buf, size_t n) {
    const sim_exec_node *x = &img->v[i];
    char what[160];
    if (x->type == CU_GRAPH_NODE_TYPE_KERNEL)
        snprintf(what, sizeof what, "kernel %s", x->k.func->name);
    else if (x->type == CU_GRAPH_NODE_TYPE_MEMCPY)
        describe_copy(&x->c, what, sizeof what);
    else
        snprintf(what, sizeof what, "a memset");
    snprintf(buf, n, "graph node %d (%s) of a graph launch", (int)i, what);
}

static void describe(who_t w, char *buf, size_t n) {
    const sim_op *op = w.op;
    char what[256], st[64];
    switch (op->type) {
    case OP_KERNEL: snprintf(what, sizeof what, "kernel %s", op->u.k.func->name); break;
    case OP_MEMCPY: describe_copy(&op->u.copy.c, what, sizeof what); break;
    case OP_MEMSET:
        snprintf(what, sizeof what, "a %zu-byte memset", op->u.s.width * op->u.s.elem);
        break;
    case OP_FREE:
        snprintf(what, sizeof what, "cudaFreeAsync(0x%lx)", (unsigned long)op->u.free_ptr);
        break;
    case OP_GRAPH: describe_node(op->u.graph.img, w.node, what, sizeof what); break;
    default: snprintf(what, sizeof what, "an operation"); break;
    }
    stream_name(op, st, sizeof st);
    snprintf(buf, n, "%s on %s (its operation #%llu)", what, st, (unsigned long long)op->ticket);
}

/* The block holding p: a device allocation, module global, VMM mapping or pinned host range. */
bool sim_race_block_of(uintptr_t p, uintptr_t *lo, uintptr_t *hi) {
    const sim_range *r = rs_find(&g_sim.allocs, p);
    if (r && r->kind == A_RESERVE)
        r = rs_find(&g_sim.maps, p);
    if (!r)
        r = rs_find(&g_sim.hosts, p);
    if (r) {
        *lo = r->base;
        *hi = r->base + r->size;
    }
    return r != NULL;
}

CUresult sim_race_report(who_t now, int now_mode, who_t then, int then_mode, uintptr_t lo,
                         uintptr_t hi) {
    char a[512], b[512], where[160] = "";
    describe(now, a, sizeof a);
    describe(then, b, sizeof b);
    uintptr_t blo, bhi;
    if (sim_race_block_of(lo, &blo, &bhi))
        snprintf(where, sizeof where, " (bytes %lu..%lu of the %lu-byte block at 0x%lx)",
                 (unsigned long)(lo - blo), (unsigned long)(hi - blo), (unsigned long)(bhi - blo),
                 (unsigned long)blo);
    bool same_graph = now.op == then.op;
    return sim_sticky_locked(
        CUDA_ERROR_LAUNCH_FAILED,
        "racecheck: a race on [0x%lx, +%lu)%s: %s %s it, and %s %s it, with nothing ordering "
        "the two (%s). Make one wait for the other: %s. Schedule: MEDUSA_SIM_SCHEDULE_SEED=%llu",
        (unsigned long)lo, (unsigned long)(hi - lo), where, a,
        now_mode & SIM_WRITE ? "writes" : "reads", b, then_mode & SIM_WRITE ? "wrote" : "read",
        same_graph ? "no path between the two nodes in the graph"
                   : "no stream order, event wait or host synchronization",
        same_graph ? "an edge between the nodes"
                   : "cudaEventRecord on one's stream after it, cudaStreamWaitEvent on the other's "
                     "before it (or one stream, or a synchronization between them)",
        (unsigned long long)g_sim.cfg.schedule_seed);
}

/* ---- what a kernel touches ---- */
typedef struct {
    uintptr_t p;
    size_t n;
    int mode;
} acc_t;

static __thread struct {
    bool on, named; /* named: the kernel said what it accesses (maybe nothing) */
    size_t n, cap;
    acc_t *v;
} t_acc;

SIM_API void simcudaAccess(const void *ptr, size_t bytes, int mode) {
    if (!t_acc.on)
        return;
    t_acc.named = true;
    if (!ptr || !bytes)
        return;
    if (t_acc.n == t_acc.cap) {
        size_t cap = t_acc.cap ? 2 * t_acc.cap : 32;
        acc_t *v = realloc(t_acc.v, cap * sizeof *v);
        if (!v)
            return;
        t_acc.v = v;
        t_acc.cap = cap;
    }
    t_acc.v[t_acc.n++] = (acc_t){(uintptr_t)ptr, bytes, mode & (SIM_READ | SIM_WRITE)};
}

void sim_race_collect_begin(void) {
    t_acc.on = true;
    t_acc.named = false;
    t_acc.n = 0;
}

/* A kernel that named nothing: every block its pointer arguments point into, read and written. */
static CUresult whole_blocks(sim_op *op, int32_t node, const sim_kernel_op *k) {
    CUresult e = CUDA_SUCCESS;
    for (uint32_t i = 0; !e && i < k->func->num_ptr_words; i++) {
        uint64_t v;
        uintptr_t lo, hi;
        memcpy(&v, k->params + k->func->ptr_words[i], 8);
        if (v && sim_race_block_of(v, &lo, &hi))
            e = sim_race_access(op, node, lo, hi - lo, SIM_READ | SIM_WRITE);
    }
    return e;
}

CUresult sim_race_collect_end(sim_op *op, int32_t node, const sim_kernel_op *k) {
    t_acc.on = false;
    if (!k) /* the kernel failed: the context did */
        return g_sim.sticky;
    sim_lock();
    CUresult e = t_acc.named ? CUDA_SUCCESS : whole_blocks(op, node, k);
    for (size_t i = 0; !e && i < t_acc.n; i++)
        if (t_acc.v[i].mode)
            e = sim_race_access(op, node, t_acc.v[i].p, t_acc.v[i].n, t_acc.v[i].mode);
    sim_unlock();
    return e;
}
