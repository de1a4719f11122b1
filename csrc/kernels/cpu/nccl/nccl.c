/* libmedusa_nccl: NCCL's C API subset (medusa/nccl_api.h) for simcuda, one process per rank.
 *
 * Like NCCL, a collective is a kernel launched on the caller's stream, so it orders with the
 * stream's other work and a stream capture records it into a graph; its module is registered at
 * the first communicator and its kernels are not exported (a new process cannot find them before
 * that, as with NCCL's). The kernels' parameters point to the communicator's state in device
 * memory. A kernel copies its rank's data into its slot of the shared segment, meets the other
 * ranks, and reduces every slot in rank order, so all ranks get bit-identical results; a rank
 * that does not arrive within the timeout (MEDUSA_NCCL_TIMEOUT seconds, default 30) aborts the
 * communicator and the kernel traps: the launch fails and the context is lost, never a hang. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "medusa/nccl_api.h"
#include "shm.h"
#include "simcuda/simcuda.h"

#define FAIL(code, ...) (snprintf(mnccl_last, sizeof mnccl_last, __VA_ARGS__), (code))

struct ncclComm {
    int rank, nranks;
    mnccl_header *shm;
    size_t bytes;
    mnccl_state *dev; /* device memory */
};

size_t mnccl_type_size(int t);
void mnccl_reduce(void *dst, const uint8_t *const *src, int n, size_t count, int type, int op);

ncclResult_t ncclGetVersion(int *version) {
    if (!version)
        return FAIL(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = 22800; /* the API of NCCL 2.28 that this subset follows */
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uid) {
    if (!uid)
        return FAIL(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    mnccl_id id = {.magic = MNCCL_ID_MAGIC};
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != sizeof r || getrandom(id.secret, MNCCL_SECRET, 0) != MNCCL_SECRET)
        return FAIL(ncclSystemError, "getrandom failed");
    int n = snprintf(id.name, sizeof id.name, "/medusa-nccl-");
    for (int i = 0; i < 16; i++)
        n += snprintf(id.name + n, sizeof id.name - (size_t)n, "%02x", r[i]);
    memset(uid, 0, sizeof *uid);
    memcpy(uid->internal, &id, sizeof id);
    return ncclSuccess;
}

static uint64_t env_u64(const char *name, uint64_t dflt, uint64_t scale) {
    const char *v = getenv(name);
    char *end;
    double d = v && *v ? strtod(v, &end) : 0;
    return v && *v && !*end && d > 0 ? (uint64_t)(d * (double)scale) : dflt;
}

static void kernels_register(void);

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank) {
    if (!comm)
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > MNCCL_MAX_RANKS || rank < 0 || rank >= nranks)
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d (1 to %d ranks)", rank,
                    nranks, MNCCL_MAX_RANKS);
    mnccl_id id;
    memcpy(&id, uid.internal, sizeof id);
    if (id.magic != MNCCL_ID_MAGIC || !memchr(id.name, 0, sizeof id.name) ||
        strncmp(id.name, "/medusa-nccl-", 13) || strchr(id.name + 1, '/'))
        return FAIL(ncclInvalidArgument, "ncclCommInitRank: not an id from ncclGetUniqueId");
    if (cudaFree(0) != cudaSuccess)
        return FAIL(ncclUnhandledCudaError, "ncclCommInitRank: no CUDA device: %s",
                    cudaGetErrorString(cudaGetLastError()));
    uint64_t slot = env_u64("MEDUSA_NCCL_SLOT_BYTES", 4u << 20, 1);
    slot = slot > MNCCL_MAX_SLOT ? MNCCL_MAX_SLOT + 64 : slot & ~(uint64_t)63; /* over: refused */
    uint64_t timeout = env_u64("MEDUSA_NCCL_TIMEOUT", 30000000000u, 1000000000u);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return FAIL(ncclSystemError, "out of host memory");
    int e = mnccl_join(&id, nranks, rank, slot ? slot : 64, timeout, &c->shm, &c->bytes);
    if (e) {
        free(c);
        return (ncclResult_t)e;
    }
    mnccl_state st = {MNCCL_STATE_MAGIC, c->shm, 0, rank, nranks, slot ? slot : 64, timeout};
    if (cudaMalloc((void **)&c->dev, sizeof st) != cudaSuccess ||
        cudaMemcpy(c->dev, &st, sizeof st, cudaMemcpyHostToDevice) != cudaSuccess) {
        munmap(c->shm, c->bytes);
        free(c);
        return FAIL(ncclUnhandledCudaError, "ncclCommInitRank: device state: %s",
                    cudaGetErrorString(cudaGetLastError()));
    }
    kernels_register();
    c->rank = rank, c->nranks = nranks;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm)
        return FAIL(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    cudaFree(comm->dev);
    munmap(comm->shm, comm->bytes);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm)
        return FAIL(ncclInvalidArgument, "ncclCommAbort: comm is NULL");
    char why[64];
    snprintf(why, sizeof why, "rank %d aborted the communicator", comm->rank);
    mnccl_abort(comm->shm, why);
    return ncclCommDestroy(comm);
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count)
        return FAIL(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank)
        return FAIL(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    if (!comm || !err)
        return FAIL(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *err = atomic_load(&comm->shm->aborted) ? ncclRemoteError : ncclSuccess;
    if (*err)
        snprintf(mnccl_last, sizeof mnccl_last, "%s", comm->shm->why);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    static const char *const names[] = {
        "no error", "unhandled cuda error", "unhandled system error", "internal error",
        "invalid argument", "invalid usage", "remote process exited or there was a network error",
        "NCCL operation in progress"};
    return (unsigned)r < sizeof names / sizeof *names ? names[r] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return mnccl_last;
}

static __thread int t_group;

ncclResult_t ncclGroupStart(void) {
    t_group++;
    return ncclSuccess;
}

/* NOTE: calls between start and end are launched as they come, each its own kernel: every rank
 * issues them in the same order, which is what NCCL requires of its callers too. */
ncclResult_t ncclGroupEnd(void) {
    if (t_group == 0)
        return FAIL(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    t_group--;
    return ncclSuccess;
}

/* ---- kernels ---- */

struct coll_args {
    const mnccl_state *st;
    const uint8_t *send;
    uint8_t *recv;
    uint64_t count;
    int32_t type, op;
};

static void trap(const mnccl_state *s, const char *what) {
    atomic_store(&s->shm->active[s->rank], 0); /* the kernel ends here */
    char why[320];
    snprintf(why, sizeof why, "%s: %.255s", what, s->shm->why);
    simcudaTrap(why);
}

/* Marks this rank's collective running and publishes what it is; after the first meeting,
 * every rank checks that all called the same one (as NCCL requires of its callers: different
 * calls would otherwise pair slots wrongly and return wrong sums without an error). */
static void begin(mnccl_state *s, const struct coll_args *a, uint64_t kind) {
    if (atomic_exchange(&s->shm->active[s->rank], 1))
        simcudaTrap("two collectives of one communicator ran at once (NCCL runs them in issue "
                    "order: launch them on one stream, or order the streams)");
    uint64_t *c = s->shm->calls[s->rank];
    c[0] = kind, c[1] = (uint64_t)a->type, c[2] = (uint64_t)a->op, c[3] = a->count, c[4] = s->seq++;
}

static void check_calls(const mnccl_state *s) {
    for (int r = 0; r < s->nranks; r++)
        if (memcmp(s->shm->calls[r], s->shm->calls[s->rank], sizeof s->shm->calls[r])) {
            char why[200];
            snprintf(why, sizeof why, "ranks %d and %d called different collectives (kind, type, "
                     "op, count or order differ)", s->rank, r);
            mnccl_abort(s->shm, why);
            trap(s, "collective");
        }
}

static void end(const mnccl_state *s) { atomic_store(&s->shm->active[s->rank], 0); }

/* Waits for every rank; a rank that does not come aborts the communicator and the kernel traps. */
static void meet(mnccl_state *s, const char *what) {
    if (mnccl_barrier(s->shm, s->nranks, s->timeout_ns, s->rank))
        trap(s, what);
}

/* This rank's N bytes into its slot, then the meeting; at a call's first chunk every rank also
 * checks that all called the same collective. */
static void share(mnccl_state *s, const uint8_t *src, size_t n, int first, const char *what) {
    memcpy(mnccl_slot(s, s->rank), src, n);
    meet(s, what);
    if (first)
        check_calls(s);
}

static void all_reduce(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct coll_args *a = p;
    mnccl_state *s = (mnccl_state *)a->st;
    size_t es = mnccl_type_size(a->type), total = a->count * es;
    simcudaAccess(s, sizeof *s, SIMCUDA_READ | SIMCUDA_WRITE);
    simcudaAccess(a->send, total, SIMCUDA_READ);
    simcudaAccess(a->recv, total, SIMCUDA_WRITE);
    size_t chunk = s->slot_bytes / es * es;
    const uint8_t *src[MNCCL_MAX_RANKS];
    begin(s, a, 1);
    for (size_t off = 0; off < total; off += chunk) {
        size_t n = total - off < chunk ? total - off : chunk;
        share(s, a->send + off, n, off == 0, "ncclAllReduce");
        for (int r = 0; r < s->nranks; r++)
            src[r] = mnccl_slot(s, r);
        mnccl_reduce(a->recv + off, src, s->nranks, n / es, a->type, a->op);
        meet(s, "ncclAllReduce");
    }
    end(s);
}

static void all_gather(const simcuda_kctx *ctx, const void *p) {
    (void)ctx;
    const struct coll_args *a = p;
    mnccl_state *s = (mnccl_state *)a->st;
    size_t es = mnccl_type_size(a->type), each = a->count * es;
    simcudaAccess(s, sizeof *s, SIMCUDA_READ | SIMCUDA_WRITE);
    simcudaAccess(a->send, each, SIMCUDA_READ);
    simcudaAccess(a->recv, each * (size_t)s->nranks, SIMCUDA_WRITE);
    size_t chunk = s->slot_bytes;
    begin(s, a, 2);
    for (size_t off = 0; off < each; off += chunk) {
        size_t n = each - off < chunk ? each - off : chunk;
        share(s, a->send + off, n, off == 0, "ncclAllGather");
        for (int r = 0; r < s->nranks; r++)
            memcpy(a->recv + (size_t)r * each + off, mnccl_slot(s, r), n);
        meet(s, "ncclAllGather");
    }
    end(s);
}

SIMCUDA_HIDDEN_STUB(all_reduce_stub)
SIMCUDA_HIDDEN_STUB(all_gather_stub)

static const simcuda_kernel_desc kernels[] = {
    {"ncclDevKernel_AllReduce", "p p p l i i", all_reduce, (const void *)all_reduce_stub},
    {"ncclDevKernel_AllGather", "p p p l i i", all_gather, (const void *)all_gather_stub},
};

SIMCUDA_MODULE_LAZY(medusa_nccl, kernels, NULL, 0)

static void kernels_register(void) {
    static int done;
    if (!__atomic_exchange_n(&done, 1, __ATOMIC_ACQ_REL))
        simcudaRegisterModule(&__simcuda_module_medusa_nccl);
}

static ncclResult_t launch(const void *stub, const void *send, void *recv, size_t count,
                           ncclDataType_t type, int op, ncclComm_t comm, cudaStream_t stream,
                           const char *what) {
    if (!comm)
        return FAIL(ncclInvalidArgument, "%s: comm is NULL", what);
    size_t es = mnccl_type_size(type);
    if (!es || (unsigned)op > ncclAvg)
        return FAIL(ncclInvalidArgument, "%s: data type %d or op %d is not supported", what,
                    (int)type, op);
    if (count > ((size_t)1 << 40) / es || (count && (!send || !recv)))
        return FAIL(ncclInvalidArgument, "%s: %zu elements from %p to %p", what, count, send,
                    recv);
    if (!count)
        return ncclSuccess;
    const mnccl_state *st = comm->dev;
    uint64_t n = count;
    int32_t t = type, o = op;
    void *args[] = {&st, &send, &recv, &n, &t, &o};
    cudaError_t e = cudaLaunchKernel(stub, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, stream);
    if (e != cudaSuccess)
        return FAIL(ncclUnhandledCudaError, "%s: %s", what, cudaGetErrorString(e));
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return launch((const void *)all_reduce_stub, send, recv, count, type, op, comm, stream,
                  "ncclAllReduce");
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
    return launch((const void *)all_gather_stub, send, recv, count, type, ncclSum, comm, stream,
                  "ncclAllGather");
}
