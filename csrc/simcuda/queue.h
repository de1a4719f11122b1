/* simcuda's deferred execution (queue.c, wait.c) and race checker (race*.c), included by
 * internal.h after the types they use. */
#ifndef SIMCUDA_QUEUE_H
#define SIMCUDA_QUEUE_H

/* ---- deferred execution (queue.c): work runs later, ordered only as CUDA orders it ---- */
enum sim_optype { OP_KERNEL = 1, OP_MEMCPY, OP_MEMSET, OP_HOST, OP_RECORD, OP_WAIT, OP_GRAPH, OP_FREE };

/* A vector clock: t[i] is the last operation of the stream with race index i ordered before. */
struct sim_vc {
    uint32_t refs, n;
    uint64_t t[];
};
/* An operation's clock: vc, with t[own] = tick (so consecutive operations share one vc). */
typedef struct sim_clock {
    sim_vc *vc;
    uint32_t own;
    uint64_t tick;
} sim_clock;

struct sim_exec_image;
struct sim_op {
    sim_op *next; /* in its stream */
    int type;
    uint32_t refs;       /* its stream's while pending; waiters'; an event's; the race history's */
    bool done, running;  /* running: some thread executes it now */
    sim_stream *stream;  /* valid while it is pending */
    uintptr_t stream_handle; /* for messages: the CUstream, or 0 for a default stream */
    bool per_thread;         /* for messages: which default stream */
    uint64_t ticket;     /* its place in its stream */
    uint32_t race;       /* its stream's race index */
    uint32_t num_waits;
    sim_op **waits;      /* operations of other streams it waits for (held) */
    sim_clock clock;     /* racecheck */
    double submitted_ms;
    union {
        sim_kernel_op k;
        struct {
            sim_memcpy_op c;
            void *staging;    /* a pageable source copied at submission, freed when done */
            uintptr_t source; /* the caller's source (a captured node copies from it) */
        } copy;
        sim_memset_op s;
        double time_ms;               /* OP_RECORD: when it completed */
        struct {
            struct sim_exec_image *img; /* held */
            uint32_t *order;            /* the nodes in the order they run, drawn at launch */
        } graph;
        uintptr_t free_ptr;           /* OP_FREE */
        CUDA_HOST_NODE_PARAMS host;   /* OP_HOST */
    } u;
};

sim_op *sim_op_new(int type);
void sim_op_unref(sim_op *op); /* lock held */
/* Queues op (which the stream now owns) after the work it must follow: its stream's, the legacy
 * stream's implicit ordering, and deps (event records: joined for the race checker, waited for
 * while pending). Lock held. */
void sim_enqueue(sim_stream *st, sim_op *op, sim_op *const *deps, size_t num_deps);
/* wait.c: runs what the targets need until they are all done, then joins their clocks into the
 * calling thread's. Lock held (released while work runs). Returns the context's sticky error. */
CUresult sim_wait_ops(sim_op *const *targets, size_t n);
CUresult sim_wait_stream(sim_stream *st); /* all its work (the legacy stream: blocking ones' too) */
CUresult sim_wait_all(void);              /* every stream's work */
CUresult sim_query_stream(sim_stream *st); /* one step of sim_wait_stream; CUDA_ERROR_NOT_READY */
/* One step of what the targets need (a query's progress); true when all are done. Lock held. */
bool sim_step_ops(sim_op *const *targets, size_t n);
void sim_stream_release(sim_stream *st); /* lock held: the handle is gone */
void sim_stream_maybe_free(sim_stream *st); /* a released stream goes once its work is done */
bool sim_stream_blocking(const sim_stream *st); /* ordered with the legacy stream */
void sim_op_execute(sim_op *op); /* runs it (lock let go meanwhile), then completes it */
bool sim_op_ready(const sim_op *op); /* every operation it waits for is done */
void sim_device_thread_start(void);
sim_stream *sim_stream_new(unsigned flags, int priority); /* lock held */
uint64_t sim_rand(void);                                  /* lock held: the schedule's RNG */
/* Fails the context (every later call returns e, as after a fault on a GPU); the message goes to
 * stderr and is each thread's simcudaGetLastMessage from then on. */
CUresult sim_sticky(CUresult e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
CUresult sim_sticky_locked(CUresult e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A host function or host node: runs on whichever thread runs the work, where CUDA calls are not
 * permitted (they fail with CUDA_ERROR_NOT_PERMITTED, as cuda.h allows). */
void sim_run_host(const CUDA_HOST_NODE_PARAMS *h);
extern __thread bool sim_in_host_fn;

/* ---- race checker (race.c), MEDUSA_SIM_RACECHECK=1; every call with the lock held ---- */
void sim_race_stream(sim_stream *st);                   /* a new stream's clock */
void sim_race_join_stream(sim_stream *st, const sim_vc *vc);
void sim_race_join_clock(sim_stream *st, const sim_clock *c);
void sim_race_stamp(sim_stream *st, sim_op *op);        /* op's clock from its stream's */
void sim_race_host_join(const sim_clock *c); /* the calling host thread saw c complete */
void sim_race_host_join_vc(const sim_vc *vc);
void sim_race_host_into(sim_stream *st); /* the thread's later work follows what it saw */
void sim_vc_unref(sim_vc *vc);
/* Checks an access by op (node: its graph node, or -1) against unordered ones and records it.
 * Returns a sticky error (the race, reported) or CUDA_SUCCESS. */
CUresult sim_race_access(sim_op *op, int32_t node, uintptr_t p, size_t n, int mode);
void sim_race_forget(uintptr_t p, size_t n); /* freed memory: its history goes */
/* Kernel accesses: simcudaAccess calls collected while a checked kernel runs (thread-local). */
void sim_race_collect_begin(void);
CUresult sim_race_collect_end(sim_op *op, int32_t node, const sim_kernel_op *k);
#define SIM_READ 1
#define SIM_WRITE 2

#endif
