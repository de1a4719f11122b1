/* simcuda internals: the one registry (guarded by g_sim.lock) and the helpers the API files share. */
#ifndef SIMCUDA_INTERNAL_H
#define SIMCUDA_INTERNAL_H


#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "simcuda/simcuda.h"

#define SIM_API __attribute__((visibility("default")))
#define SIM_ALLOC_ALIGN 256u
#define SIM_VMM_GRANULARITY (2u << 20)
#define SIM_LARGE_ALLOC (1u << 20) /* from here on cudaMalloc takes whole 2 MiB pages */
#define SIM_MAX_PARAMS 64
#define SIM_MAX_PARAM_BYTES 32764u
#define SIM_MAX_ATTRS 8
#define SIM_LAUNCH_ATTRIBUTE_LAST 63 /* launch attribute ids are small; the enum has no MAX */

/* ---- handle registry: every handle given out is checked before it is dereferenced ---- */
/* NOTE: CUlibrary, CUmodule, CUkernel and CUfunction are four kinds, as in the driver: a handle of
 * one kind passed as another is CUDA_ERROR_INVALID_HANDLE (module.c converts between them). */
enum sim_htype { H_STREAM = 1, H_EVENT, H_GRAPH, H_NODE, H_EXEC, H_LIBRARY, H_FUNC, H_MEMHANDLE, H_KERNEL };
void sim_handle_add(const void *h, int type);
void sim_handle_del(const void *h);
bool sim_handle_is(const void *h, int type);
size_t sim_handle_count(int type); /* live handles of one type; under the lock */

/* ---- sorted range sets (allocations, free VA, host ranges, mappings) ---- */
typedef struct sim_range {
    uintptr_t base;
    size_t size;
    int kind;
    uint64_t aux; /* kind-specific: flags, size asked, access */
    void *obj;    /* kind-specific: the physical handle of a mapping */
} sim_range;
typedef struct sim_rangeset {
    sim_range *v;
    size_t n, cap;
} sim_rangeset;
sim_range *rs_find(const sim_rangeset *rs, uintptr_t p); /* the range holding p, or NULL */
sim_range *rs_exact(const sim_rangeset *rs, uintptr_t base);
sim_range *rs_overlap(const sim_rangeset *rs, uintptr_t base, size_t size); /* the lowest, or NULL */
int rs_insert(sim_rangeset *rs, sim_range r);
void rs_remove(sim_rangeset *rs, sim_range *r);

enum sim_akind { A_DEVICE = 1, A_GLOBAL, A_RESERVE, A_MAPPING, A_HOST };
/* A host range's aux: its CU_MEMHOSTALLOC_* / CU_MEMHOSTREGISTER_* flags, and these. */
#define SIM_HOST_OWNED (1ull << 32)        /* from cuMemHostAlloc: simcuda unmaps it on free */
#define SIM_HOST_CPU_WRITABLE (1ull << 33) /* registered memory the CPU maps writable */
/* A device block's aux: the size asked, and this while a cudaFreeAsync of it is queued. */
#define SIM_FREE_PENDING (1ull << 62)

/* ---- configuration (environment, read once) ---- */
typedef struct sim_config {
    char name[256];
    size_t total_mem;
    int sms;
    int board; /* MEDUSA_SIM_DEVICE_INDEX: which board of a multi-GPU machine this process has */
    int cc_major, cc_minor;
    uint64_t seed;
    bool seeded;
    bool memcheck;
    bool eager_loading;
    bool poison;         /* fresh device memory holds stale bytes (MEDUSA_SIM_POISON, default on) */
    uint64_t poison_key; /* per process, never from the seed: two runs' stale bytes differ */
    double slowdown;     /* a device this many times slower than the CPU (MEDUSA_SIM_SLOWDOWN) */
    bool racecheck;      /* MEDUSA_SIM_RACECHECK: unordered conflicting accesses fail (race.c) */
    uint64_t schedule_seed; /* MEDUSA_SIM_SCHEDULE_SEED: picks among the orders CUDA allows */
    bool launch_blocking;   /* CUDA_LAUNCH_BLOCKING=1 or access recording: work runs at submission */
    unsigned char uuid[16];
} sim_config;

/* ---- kernels, libraries ---- */
typedef struct sim_param {
    uint32_t offset, size;
} sim_param;

struct sim_library;
typedef struct sim_func {
    struct sim_library *lib;
    const char *name;
    simcuda_kernel_fn fn;
    uint32_t num_params, param_bytes;
    sim_param params[SIM_MAX_PARAMS];
    uint32_t num_ptr_words;
    uint32_t *ptr_words; /* byte offsets of pointer words in the packed parameter buffer */
    bool loaded;
    int max_dynamic_smem;
    int attr_values[CU_FUNC_ATTRIBUTE_MAX];
    char func_tag; /* its address is the CUfunction; the sim_func's own is the CUkernel */
} sim_func;

typedef struct sim_library {
    unsigned char *image;
    size_t image_size;
    char module_name[128];
    void *dl;
    unsigned num_funcs;
    sim_func *funcs;
    unsigned num_globals;
    char **global_names;
    size_t *global_sizes;
    void **globals; /* device addresses */
    bool as_module; /* created by cuModuleLoadData: cuModuleUnload frees it */
    int module_tag; /* address taken as the CUmodule handle */
} sim_library;

int sim_parse_signature(sim_func *f, const char *sig);
CUresult sim_library_from_image(const void *image, sim_library **out);
void sim_library_free(sim_library *lib);
/* Opens the shared object an image names, if it may be (codeobj.c); refuses any other. */
CUresult sim_open_code(const char *path, void **dl);
sim_library *sim_library_of_module(CUmodule m);
CUresult sim_func_load(sim_func *f);
sim_func *sim_func_of(CUfunction h);       /* a CUfunction, or NULL */
sim_func *sim_kernel_of(CUkernel h);       /* a CUkernel, or NULL */
sim_func *sim_launchable_of(CUfunction h); /* either: cuLaunchKernel takes a CUkernel too */
sim_func *sim_param_func(const CUDA_KERNEL_NODE_PARAMS *p); /* graph.c: func or kern, checked */
#define SIM_FUNC_HANDLE(f) ((CUfunction) & (f)->func_tag)
/* The CUDA version this driver claims (MEDUSA_SIM_DRIVER_VERSION, default CUDA_VERSION); entry
 * points newer than it are hidden from cuGetProcAddress and fail when called directly. */
int sim_driver_version(void);
CUresult sim_since(int version, const char *name);
#define SIM_SINCE(v, name)                                                                         \
    do {                                                                                           \
        CUresult s_ = sim_since(v, #name);                                                         \
        if (s_)                                                                                    \
            return s_;                                                                             \
    } while (0)

/* ---- streams, events, capture ---- */
typedef struct sim_node sim_node;
typedef struct sim_graph sim_graph;
typedef struct sim_dep {
    sim_node *node;
    CUgraphEdgeData data;
} sim_dep;
typedef struct sim_deps {
    sim_dep *v;
    size_t n, cap;
} sim_deps;

#define SIM_MAX_CAPTURE_STREAMS 64
#define SIM_MAX_CAPTURES 64
typedef struct sim_capture {
    sim_graph *graph;
    CUstreamCaptureMode mode;
    uint64_t id;
    bool invalidated;
    pthread_t thread;
    struct sim_stream *streams[SIM_MAX_CAPTURE_STREAMS]; /* [0] is the origin */
    int num_streams;
} sim_capture;

typedef struct sim_op sim_op;
typedef struct sim_vc sim_vc;

typedef struct sim_stream {
    unsigned flags;
    int priority;
    sim_capture *cap;
    sim_deps deps; /* the capture's current dependencies on this stream */
    uint64_t id;
    /* deferred execution (queue.c) */
    sim_op *head, *tail;          /* submitted, not yet complete, oldest first */
    uint64_t submitted;           /* tickets handed out: an operation's place in the stream */
    bool destroyed;               /* its handle is gone; freed once its work is done */
    bool per_thread;              /* a per-thread default stream */
    uint32_t pins;                /* waiters that look at its queue: it stays while they do */
    uint32_t race;                /* its index in vector clocks */
    sim_vc *vc;                   /* racecheck: the clock after its last submitted operation */
    sim_vc *snap;                 /* an immutable copy of vc shared by its operations, or NULL */
    struct sim_stream *next_live; /* the list of live streams, g_sim.streams */
} sim_stream;

typedef struct sim_event {
    unsigned flags;
    sim_op *rec;      /* the record operation of its last record outside capture, or NULL */
    sim_capture *cap; /* set when last recorded in a capturing stream */
    sim_deps deps;
} sim_event;

sim_stream *sim_stream_resolve(CUstream s, bool ptsz, CUresult *err);
void sim_deps_set(sim_deps *d, const sim_dep *src, size_t n);
void sim_deps_add(sim_deps *d, sim_dep dep);
void sim_deps_free(sim_deps *d);
bool sim_capture_active_global(void);
void sim_capture_invalidate_all(void);
CUresult sim_capture_check_unsafe(void);

/* ---- graphs ---- */
typedef struct sim_kernel_op {
    sim_func *func;
    unsigned grid[3], block[3], smem;
    unsigned char *params; /* packed, func->param_bytes long */
    bool pooled;           /* params lie in a block its owner frees (an exec image's) */
} sim_kernel_op;

typedef struct sim_memcpy_op {
    uintptr_t dst, src;
    size_t bytes;
} sim_memcpy_op;

typedef struct sim_memset_op {
    uintptr_t dst;
    size_t pitch, width, height;
    unsigned value, elem;
} sim_memset_op;

struct sim_node {
    CUgraphNodeType type;
    uint64_t mark; /* traversal stamp */
    sim_graph *graph;
    sim_deps deps;
    sim_kernel_op k;
    bool params_by_extra; /* given as a packed buffer (extra): refused for a cooperative node */
    void **param_ptrs; /* kernelParams as returned by GetParams (made on the first call) */
    sim_memcpy_op c;
    sim_memset_op s;
    CUDA_HOST_NODE_PARAMS h;
    int num_attrs;
    CUlaunchAttributeID attr_ids[SIM_MAX_ATTRS];
    CUlaunchAttributeValue attr_vals[SIM_MAX_ATTRS];
};

/* Nodes live in blocks that their graph frees (no node is ever freed alone): one allocation per
 * block, not per node, which was a visible share of building a graph. */
#define SIM_NODE_BLOCK 32
typedef struct sim_node_block {
    struct sim_node_block *next;
    size_t used;
    sim_node v[SIM_NODE_BLOCK];
} sim_node_block;

struct sim_graph {
    sim_node **nodes;
    size_t n, cap;
    sim_node_block *blocks; /* the newest first */
};

CUresult sim_graph_add_node(sim_graph *g, CUgraphNodeType type, const sim_dep *deps, size_t ndeps,
                            sim_node **out);
CUresult sim_kernel_op_init(sim_kernel_op *op, sim_func *f, const unsigned grid[3],
                            const unsigned block[3], unsigned smem, void **kernelParams,
                            void **extra);
/* As sim_kernel_op_init on an op that holds parameters already: their buffer is kept when the
 * function stays the same. On failure the op is as it was. */
CUresult sim_kernel_op_set(sim_kernel_op *op, sim_func *f, const unsigned grid[3],
                           const unsigned block[3], unsigned smem, void **kernelParams,
                           void **extra);
void sim_kernel_op_free(sim_kernel_op *op);

/* ---- execution ---- */
CUresult sim_run_kernel(const sim_kernel_op *op);
CUresult sim_run_memcpy(const sim_memcpy_op *op);
CUresult sim_run_memset(const sim_memset_op *op);
CUresult sim_check_range(uintptr_t p, size_t n, bool device_only);
/* accesses.c: MEDUSA_SIM_ACCESSES=1 records the pages each kernel run touches. */
/* simcudaParallel (parts.c): a part of the running kernel, run with its faults and traps caught
 * as the kernel's are (launch.c), on any thread; 0, or 1 with *out filled. sim_part_raise, on the
 * kernel's own thread once every part has ended, makes such a fault the kernel's. */
typedef struct {
    uintptr_t addr;
    int sig, code;
    char why[256];
} sim_part_fault;
int sim_part_run(void (*fn)(void *, int), void *arg, int part, sim_part_fault *out);
_Noreturn void sim_part_raise(const sim_part_fault *f);
bool sim_parts_parallel(void); /* inside a kernel no checker watches thread by thread */
bool sim_acc_begin(void);
void sim_acc_end(const sim_func *f, bool completed);
bool sim_acc_fault(uintptr_t addr, const void *uc); /* from the fault handler */
void sim_acc_set_node(const void *node);            /* the graph node about to run, or NULL */
bool sim_acc_enabled(void); /* MEDUSA_SIM_ACCESSES is on: page mappings must stay as they are */
/* memcheck of a kernel's pointer argument: inside a live allocation, or anywhere in a reserved
 * range. NOTE: an elastic KV cache's per-layer pointers lie in a page that may not be mapped; as on
 * a GPU, only an access to an unmapped page is an error, and the fault guard reports that one. */
CUresult sim_check_pointer(uintptr_t p);
CUresult sim_memcheck_locked(const sim_kernel_op *op); /* launch.c: a launch's pointer arguments */
CUresult sim_fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- memory ---- */
CUresult sim_dev_alloc(size_t size, int kind, uintptr_t *out);
CUresult sim_dev_free(uintptr_t p, int kind);
int sim_mem_class(uintptr_t p); /* SIMCUDA_TRAFFIC_* */
void sim_poison(uintptr_t p, size_t size); /* fill with the process's stale-byte pattern */
#define SIM_POISON_CHUNK ((size_t)8 << 20) /* the pattern repeats every 8 MiB of a large block */
void sim_pattern(uint64_t *w, size_t words, uint64_t offset); /* the pattern from byte `offset` */
/* Before a copy of [src, +src_n) to [dst, +n): pages of a cudaMalloc block the copy (mostly)
 * overwrites get fresh memory instead of the copy-on-write stale-byte mapping (memory.c). Device
 * writes (kernels, copies, memsets) run between sim_writes_begin/end: shared, while a partly
 * covered page is checked and remapped exclusively. */
void sim_fresh_pages(uintptr_t dst, size_t n, uintptr_t src, size_t src_n);
void sim_writes_begin(void);
void sim_writes_end(void);
void sim_poison_fd(int fd, size_t size);
const sim_range *sim_host_read_only(uintptr_t p, size_t n); /* host.c; lock held */

/* ---- state ---- */
typedef struct sim_state {
    pthread_mutex_t lock;
    bool initialized;
    sim_config cfg;
    uintptr_t va_base;
    size_t va_size;
    size_t mem_used;
    sim_rangeset va_free;
    sim_rangeset allocs; /* device allocations, globals, reservations */
    sim_rangeset maps;   /* VMM mappings inside reservations */
    sim_rangeset hosts;  /* pinned / registered host memory */
    int poison_fd;       /* a memfd holding the pattern, mapped copy-on-write over large blocks */
    sim_stream legacy;
    uint64_t next_capture_id;
    uint64_t next_stream_id;
    uint64_t next_mark;
    sim_capture *caps[SIM_MAX_CAPTURES];
    int num_captures;
    CUresult sticky; /* an illegal address poisons the context, as on a GPU */
    char sticky_message[1024];
    /* deferred execution (queue.c) */
    sim_stream *streams;     /* live streams: the legacy one, per-thread ones, created ones */
    pthread_cond_t progress; /* an operation completed */
    pthread_cond_t work;     /* work was queued (the device thread waits for it) */
    uint64_t pending;        /* operations queued and not complete */
    uint64_t rng;            /* the schedule's RNG state */
    bool device_thread;      /* started */
    uint32_t next_race;      /* race indices handed out */
    struct sim_race_history *history; /* racecheck */
} sim_state;

extern sim_state g_sim;
void sim_lock(void);
void sim_unlock(void);
CUresult sim_ensure_init(void); /* CUDA_ERROR_NOT_INITIALIZED until cuInit */
double sim_now_ms(void);
double sim_coarse_ms(void); /* cheaper, a few ms coarse: for the device thread's idle check */

/* Expand the header's name macros (cuMemcpyHtoD -> cuMemcpyHtoD_v2) before adding a suffix. */
#define SIM_CAT_(a, b) a##b
#define SIM_CAT(a, b) SIM_CAT_(a, b)

/* Records o into the stream's capture or queues it (wait: returns once it ran); takes o. */
CUresult sim_submit(CUstream s, bool ptsz, sim_op *o, const CUlaunchAttribute *attrs,
                    unsigned num_attrs, bool wait);
CUresult sim_submit_locked(CUstream s, bool ptsz, sim_op *o, const CUlaunchAttribute *attrs,
                           unsigned num_attrs, bool wait); /* lock held */
/* Submission checks of an operation about to be queued (copies: their ranges, and whether the
 * call must wait, as cudaMemcpy's rules say; kernels: memcheck). Lock held. */
CUresult sim_check_op(sim_op *o, bool *wait);
CUresult sim_check_memcpy(const sim_memcpy_op *op); /* its ranges; lock held */
CUresult sim_check_memset(const sim_memset_op *op);
CUresult sim_run_memcpy_op(sim_op *op, int32_t node, const sim_memcpy_op *c);
CUresult sim_run_memset_op(sim_op *op, int32_t node, const sim_memset_op *m);
CUresult sim_sync_guard(void);
CUresult sim_sync_guard_locked(void);
CUresult sim_legacy_implicit(void);
void sim_graph_destroy(sim_graph *g);

#define SIM_LOCKED(expr)                                                                           \
    do {                                                                                           \
        sim_lock();                                                                                \
        CUresult r_ = (expr);                                                                      \
        sim_unlock();                                                                              \
        return r_;                                                                                 \
    } while (0)

#include "queue.h"

#endif
