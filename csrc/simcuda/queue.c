/* The device's queues: operations and their streams. Work submitted to a stream is queued in
 * order behind what it must follow (its stream's work, the legacy stream's implicit ordering, the
 * event records it waits for) and runs later: wait.c says when and on which thread. */
#include <stdlib.h>

#include "internal.h"

void sim_exec_image_unref(struct sim_exec_image *img); /* exec.c */
void sim_graph_run(sim_op *op);                        /* graph_run.c */
CUresult sim_run_free(sim_op *op);                     /* memory_async.c */

__thread bool sim_in_host_fn;

void sim_run_host(const CUDA_HOST_NODE_PARAMS *h) {
    sim_in_host_fn = true;
    h->fn(h->userData);
    sim_in_host_fn = false;
}

uint64_t sim_rand(void) { /* splitmix64 */
    uint64_t z = (g_sim.rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

sim_op *sim_op_new(int type) {
    sim_op *op = calloc(1, sizeof *op);
    if (op) {
        op->type = type;
        op->refs = 1;
    }
    return op;
}

static void free_payload(sim_op *op) {
    if (op->type == OP_KERNEL)
        sim_kernel_op_free(&op->u.k);
    else if (op->type == OP_MEMCPY) {
        free(op->u.copy.staging);
        op->u.copy.staging = NULL;
    } else if (op->type == OP_GRAPH) {
        free(op->u.graph.order);
        op->u.graph.order = NULL;
    }
}

void sim_op_unref(sim_op *op) {
    if (!op || --op->refs)
        return;
    free_payload(op);
    if (op->type == OP_GRAPH)
        sim_exec_image_unref(op->u.graph.img);
    for (uint32_t i = 0; i < op->num_waits; i++)
        sim_op_unref(op->waits[i]);
    free(op->waits);
    sim_vc_unref(op->clock.vc);
    free(op);
}

/* ---- streams ---- */
sim_stream *sim_stream_new(unsigned flags, int priority) {
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->flags = flags;
    s->priority = priority;
    s->id = g_sim.next_stream_id++;
    sim_race_stream(s);
    s->next_live = g_sim.streams;
    g_sim.streams = s;
    return s;
}

static void unlink_stream(sim_stream *s) {
    for (sim_stream **p = &g_sim.streams; *p; p = &(*p)->next_live)
        if (*p == s) {
            *p = s->next_live;
            return;
        }
}

void sim_stream_maybe_free(sim_stream *s) {
    if (!s->destroyed || s->head || s->pins || s->cap)
        return;
    unlink_stream(s);
    sim_vc_unref(s->vc);
    sim_vc_unref(s->snap);
    sim_deps_free(&s->deps);
    free(s);
}

void sim_stream_release(sim_stream *s) {
    s->destroyed = true;
    sim_stream_maybe_free(s);
}

bool sim_stream_blocking(const sim_stream *s) { return !(s->flags & CU_STREAM_NON_BLOCKING); }

/* ---- submission ---- */
static void add_wait(sim_op *op, sim_op *dep) {
    sim_op **v = realloc(op->waits, (op->num_waits + 1) * sizeof *v);
    if (!v)
        return;
    dep->refs++;
    v[op->num_waits++] = dep;
    op->waits = v;
}

/* The legacy stream's implicit ordering with blocking streams, both ways. */
static void implicit_waits(sim_stream *st, sim_op *op) {
    bool race = g_sim.cfg.racecheck;
    if (st == &g_sim.legacy) {
        for (sim_stream *b = g_sim.streams; b; b = b->next_live) {
            if (b == st || !sim_stream_blocking(b))
                continue;
            if (b->tail)
                add_wait(op, b->tail);
            if (race)
                sim_race_join_stream(st, b->vc);
        }
    } else if (sim_stream_blocking(st)) {
        if (g_sim.legacy.tail)
            add_wait(op, g_sim.legacy.tail);
        if (race)
            sim_race_join_stream(st, g_sim.legacy.vc);
    }
}

void sim_enqueue(sim_stream *st, sim_op *op, sim_op *const *deps, size_t num_deps) {
    op->stream = st;
    op->stream_handle = st == &g_sim.legacy || st->per_thread ? 0 : (uintptr_t)st;
    op->per_thread = st->per_thread;
    op->race = st->race;
    op->submitted_ms = sim_coarse_ms();
    implicit_waits(st, op);
    for (size_t i = 0; i < num_deps; i++) {
        if (!deps[i]->done)
            add_wait(op, deps[i]);
        if (g_sim.cfg.racecheck)
            sim_race_join_clock(st, &deps[i]->clock);
    }
    op->ticket = ++st->submitted;
    if (g_sim.cfg.racecheck) {
        sim_race_host_into(st);
        sim_race_stamp(st, op);
    }
    if (st->tail)
        st->tail->next = op;
    else
        st->head = op;
    st->tail = op;
    if (!g_sim.device_thread)
        sim_device_thread_start();
    if (g_sim.pending++ == 0) /* the device thread sleeps until there is work */
        pthread_cond_signal(&g_sim.work);
}

/* ---- running ---- */
static void run_op(sim_op *op) {
    CUresult e = CUDA_SUCCESS;
    switch (op->type) {
    case OP_KERNEL:
        if (g_sim.cfg.racecheck)
            sim_race_collect_begin();
        e = sim_run_kernel(&op->u.k);
        if (g_sim.cfg.racecheck)
            e = sim_race_collect_end(op, -1, e ? NULL : &op->u.k);
        break;
    case OP_MEMCPY: e = sim_run_memcpy_op(op, -1, &op->u.copy.c); break;
    case OP_MEMSET: e = sim_run_memset_op(op, -1, &op->u.s); break;
    case OP_HOST: sim_run_host(&op->u.host); break;
    case OP_RECORD: op->u.time_ms = sim_now_ms(); break;
    case OP_GRAPH: sim_graph_run(op); break;
    case OP_FREE: e = sim_run_free(op); break;
    default: break;
    }
    (void)e; /* an operation's failure is the context's sticky error, set where it failed */
}

static void complete(sim_op *op) {
    sim_stream *st = op->stream;
    st->head = op->next;
    if (!st->head)
        st->tail = NULL;
    op->next = NULL;
    op->done = true;
    op->running = false;
    for (uint32_t i = 0; i < op->num_waits; i++)
        sim_op_unref(op->waits[i]);
    free(op->waits);
    op->waits = NULL;
    op->num_waits = 0;
    free_payload(op);
    op->stream = NULL;
    g_sim.pending--;
    pthread_cond_broadcast(&g_sim.progress);
    sim_stream_maybe_free(st);
    sim_op_unref(op);
}

void sim_op_execute(sim_op *op) {
    op->running = true;
    sim_unlock();
    if (!g_sim.sticky) /* a failed context runs nothing more */
        run_op(op);
    sim_lock();
    complete(op);
}

bool sim_op_ready(const sim_op *op) {
    for (uint32_t i = 0; i < op->num_waits; i++)
        if (!op->waits[i]->done)
            return false;
    return true;
}
