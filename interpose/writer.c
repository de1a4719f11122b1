/* The recorder's one registry: the trace files and their buffers, the live-allocation map, the
 * function table and the host-stub set, all behind one lock. Files open at the first event, so a
 * child that never touches CUDA writes nothing. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define BUF_LIMIT (1u << 20)

typedef struct {
    uint64_t key, size, seq, type;
} live_slot; /* key 0: empty, 1: deleted; type: the event that made it (ALLOC, HOST_*) */

typedef struct {
    const void *key;
    mi_func_info info;
} func_slot;

typedef struct {
    unsigned char *v;
    size_t n, cap;
} buf;

static struct {
    pthread_mutex_t lock;
    unsigned mode;      /* 0: off */
    bool opened, broken;
    char path[4096];
    int fd, bfd, ifd; /* ifd: the images directory, held so that no link swapped in is followed */
    buf rec, blob;
    uint64_t blob_file_off; /* file offset of blob.v[0] */
    uint64_t seq, t0;
    uint64_t capture_start; /* seq where the capture phase began (0: not yet) */
    live_slot *live;
    size_t live_cap, live_used;
    func_slot *funcs;
    size_t func_cap, func_used;
    const void **stubs;
    size_t stub_cap, stub_used;
} W = {.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .bfd = -1, .ifd = -1};

static uint64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

bool mi_recording_on(void) { return __atomic_load_n(&W.mode, __ATOMIC_RELAXED) != 0; }
unsigned mi_mode(void) { return W.mode; }

void mi_writer_config(const char *path, unsigned mode) {
    /* %p becomes the pid, so that several processes can record side by side. */
    size_t o = 0;
    for (const char *s = path; *s && o + 16 < sizeof W.path; s++) {
        if (s[0] == '%' && s[1] == 'p') {
            o += (size_t)snprintf(W.path + o, sizeof W.path - o, "%d", (int)getpid());
            s++;
        } else {
            W.path[o++] = *s;
        }
    }
    W.path[o] = 0;
    W.mode = mode;
}

static bool put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1u << 16;
        while (cap < b->n + n)
            cap *= 2;
        unsigned char *v = realloc(b->v, cap);
        if (!v)
            return false;
        b->v = v, b->cap = cap;
    }
    memcpy(b->v + b->n, p, n);
    b->n += n;
    return true;
}

static bool write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        c += w, n -= (size_t)w;
    }
    return true;
}

/* Blobs first: a record on disk never points past the end of the blob file. */
static bool flush_locked(void) {
    if (!W.opened || W.broken)
        return !W.broken;
    if (!write_all(W.bfd, W.blob.v, W.blob.n) || !write_all(W.fd, W.rec.v, W.rec.n)) {
        W.broken = true;
        return false;
    }
    W.blob_file_off += W.blob.n;
    W.blob.n = W.rec.n = 0;
    return true;
}

static void append(medusa_trace_record *r, const void *blob, size_t len);

static void emit_preamble(void) {
    medusa_trace_record r = {.type = MEDUSA_EV_PROCESS, .u = {(uint64_t)getpid(), (uint64_t)getppid()}};
    char argv[4096];
    size_t n = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t got = read(fd, argv, sizeof argv);
        n = got > 0 ? (size_t)got : 0;
        close(fd);
    }
    append(&r, argv, n);
    /* The api names, so that a trace reads the same whichever build wrote it. */
    char names[4096];
    size_t o = 0;
    /* api 0 is "none": its name is the empty string, so the list starts with a NUL. */
    for (int i = 0; i < H_COUNT; i++) {
        size_t l = strlen(mi_hook_name[i]) + 1;
        if (o + l > sizeof names)
            break;
        memcpy(names + o, mi_hook_name[i], l);
        o += l;
    }
    medusa_trace_record a = {.type = MEDUSA_EV_APIS, .u = {H_COUNT}};
    append(&a, names, o);
}

/* Fail-open on a name that is taken: a file already there, or a link planted to another file, is
 * never truncated, written through or followed. */
static bool refuse_path(const char *path) {
    char msg[4400];
    snprintf(msg, sizeof msg, "cannot create %s (%s)%s", path, strerror(errno),
             errno == EEXIST ? "; remove it, or pick another name (put %p in MEDUSA_TRACE for one "
                               "file per process)"
                             : "");
    mi_fail(msg);
    return false;
}

static bool open_locked(void) {
    char bpath[4200], ipath[4200];
    snprintf(bpath, sizeof bpath, "%s.blobs", W.path);
    snprintf(ipath, sizeof ipath, "%s.images", W.path);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    W.fd = open(W.path, flags, 0600);
    if (W.fd < 0)
        return refuse_path(W.path);
    const char *taken = NULL;
    W.bfd = open(bpath, flags, 0600);
    if (W.bfd < 0)
        taken = bpath;
    else if (mkdir(ipath, 0700) != 0 ||
             (W.ifd = open(ipath, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        taken = ipath;
    if (taken) {
        /* Only what this call created goes: the trace a re-run would otherwise trip over. */
        int err = errno;
        if (W.bfd >= 0)
            close(W.bfd), unlink(bpath);
        if (taken == ipath && err != EEXIST)
            rmdir(ipath);
        close(W.fd), unlink(W.path);
        W.fd = W.bfd = W.ifd = -1;
        errno = err;
        return refuse_path(taken);
    }
    medusa_trace_header h = {.magic = MEDUSA_TRACE_MAGIC,
                             .version = MEDUSA_TRACE_VERSION,
                             .header_size = MEDUSA_TRACE_HEADER_SIZE,
                             .record_size = MEDUSA_TRACE_RECORD_SIZE,
                             .pid = (uint32_t)getpid(),
                             .start_unix_ns = now_ns(CLOCK_REALTIME),
                             .mode = W.mode,
                             .minor = MEDUSA_TRACE_MINOR};
    if (!write_all(W.fd, &h, sizeof h) ||
        !write_all(W.bfd, MEDUSA_TRACE_BLOB_MAGIC, 8)) {
        mi_fail("cannot write the trace header");
        return false;
    }
    W.blob_file_off = 8;
    W.t0 = now_ns(CLOCK_MONOTONIC);
    W.opened = true;
    emit_preamble();
    return true;
}

static void append(medusa_trace_record *r, const void *blob, size_t len) {
    r->seq = ++W.seq;
    r->t_ns = now_ns(CLOCK_MONOTONIC) - W.t0;
    r->blob = 0;
    if (blob && len) {
        static const unsigned char pad[8];
        uint32_t l = (uint32_t)len;
        r->blob = W.blob_file_off + W.blob.n;
        bool ok = put(&W.blob, &l, 4) && put(&W.blob, blob, len) &&
                  put(&W.blob, pad, (8 - (4 + len) % 8) % 8);
        if (!ok)
            W.broken = true;
    }
    if (!put(&W.rec, r, sizeof *r))
        W.broken = true;
}

/* ---- live allocations: open addressing on the address ---- */
static size_t slot_of(uint64_t key, size_t cap) {
    uint64_t x = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

static bool live_grow(void) {
    size_t cap = W.live_cap ? W.live_cap * 2 : 4096;
    live_slot *n = calloc(cap, sizeof *n);
    if (!n)
        return false;
    for (size_t i = 0; i < W.live_cap; i++)
        if (W.live[i].key > 1) {
            size_t j = slot_of(W.live[i].key, cap);
            while (n[j].key)
                j = (j + 1) & (cap - 1);
            n[j] = W.live[i];
        }
    free(W.live);
    W.live = n, W.live_cap = cap;
    W.live_used = 0;
    for (size_t i = 0; i < cap; i++)
        W.live_used += n[i].key > 1;
    return true;
}

static void live_add(uint64_t key, uint64_t size, uint64_t seq, uint64_t type) {
    if (key <= 1 || ((W.live_used + 1) * 2 > W.live_cap && !live_grow())) {
        W.broken = key > 1;
        return;
    }
    size_t i = slot_of(key, W.live_cap);
    while (W.live[i].key > 1 && W.live[i].key != key)
        i = (i + 1) & (W.live_cap - 1);
    W.live_used += W.live[i].key <= 1;
    W.live[i] = (live_slot){key, size, seq, type};
}

/* The allocation event a free ends. NOTE: a free of the wrong kind (cudaFreeHost on registered
 * memory, cudaHostUnregister on pinned memory) fails in CUDA and must not end the allocation. */
static uint64_t freed_type(const medusa_trace_record *r) {
    if (r->type == MEDUSA_EV_FREE)
        return MEDUSA_EV_ALLOC;
    bool unregister = r->api == H_cuMemHostUnregister || r->api == H_cudaHostUnregister;
    return unregister ? MEDUSA_EV_HOST_REGISTER : MEDUSA_EV_HOST_ALLOC;
}

static void live_del(uint64_t key, uint64_t type, uint64_t *size, uint64_t *seq) {
    if (!W.live_cap || key <= 1)
        return;
    for (size_t i = slot_of(key, W.live_cap); W.live[i].key; i = (i + 1) & (W.live_cap - 1))
        if (W.live[i].key == key && W.live[i].type == type) {
            *size = W.live[i].size, *seq = W.live[i].seq;
            W.live[i].key = 1;
            return;
        }
}

void mi_emit(medusa_trace_record *r, const void *blob, size_t len, live_op op) {
    pthread_mutex_lock(&W.lock);
    if (W.mode && !W.broken && (W.opened || open_locked())) {
        if (op == LIVE_DEL)
            live_del(r->u[0], freed_type(r), &r->u[1], &r->u[3]);
        append(r, blob, len);
        if (op == LIVE_ADD && r->result == 0)
            live_add(r->u[0], r->u[1], r->seq, r->type);
        if (W.rec.n + W.blob.n >= BUF_LIMIT)
            flush_locked();
    }
    bool broken = W.broken && W.opened;
    pthread_mutex_unlock(&W.lock);
    if (broken)
        mi_fail("writing the trace failed (disk full?)");
}

int mi_flush(void) {
    pthread_mutex_lock(&W.lock);
    bool ok = flush_locked();
    pthread_mutex_unlock(&W.lock);
    return ok ? 0 : -1;
}

void mi_writer_close(void) {
    pthread_mutex_lock(&W.lock);
    if (W.opened && !W.broken) {
        medusa_trace_record r = {.type = MEDUSA_EV_END, .u = {W.seq + 1}};
        append(&r, NULL, 0);
        flush_locked();
        close(W.fd), close(W.bfd), close(W.ifd);
        W.opened = false;
    }
    W.mode = 0;
    pthread_mutex_unlock(&W.lock);
}

/* ---- module images, by content: an image already saved is not written again ---- */
void mi_save_image(const char *hex, const void *data, size_t size) {
    char name[80];
    snprintf(name, sizeof name, "%s.img", hex);
    pthread_mutex_lock(&W.lock);
    int dir = W.opened ? dup(W.ifd) : -1; /* the descriptor outlives a close meanwhile */
    pthread_mutex_unlock(&W.lock);
    if (dir < 0)
        return; /* not recording (or refused): nothing to save, nothing to say */
    int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno != EEXIST)
            mi_log("cannot save image %s.images/%s (%s); its kernels can only be found by "
                   "triggering", W.path, name, strerror(errno));
        close(dir);
        return;
    }
    bool ok = write_all(fd, data, size);
    close(fd);
    if (!ok) {
        unlinkat(dir, name, 0);
        mi_log("cannot write image %s.images/%s; its kernels can only be found by triggering",
               W.path, name);
    }
    close(dir);
}

/* ---- the capture phase's buffers: their contents, when "ready" is marked ---- */
void mi_note_phase(const char *phase, uint64_t seq) {
    pthread_mutex_lock(&W.lock);
    if (!W.capture_start && (!*phase || strncmp(phase, "graph_capture", 13) == 0))
        W.capture_start = seq;
    pthread_mutex_unlock(&W.lock);
}

#define SNAPSHOT_MAX ((uint64_t)256 << 20)

void mi_snapshot_live(void) {
    pthread_mutex_lock(&W.lock);
    size_t n = 0;
    live_slot *take = W.capture_start ? malloc((W.live_used + 1) * sizeof *take) : NULL;
    for (size_t i = 0; take && i < W.live_cap; i++)
        if (W.live[i].key > 1 && W.live[i].seq > W.capture_start)
            take[n++] = W.live[i];
    pthread_mutex_unlock(&W.lock);
    const mi_driver *d = mi_drv();
    if (n && d->ctxSynchronize)
        d->ctxSynchronize();
    for (size_t i = 0; i < n; i++) {
        medusa_trace_record r = {.type = MEDUSA_EV_CONTENT,
                                 .u = {take[i].key, take[i].size, take[i].seq}};
        void *buf = take[i].size <= SNAPSHOT_MAX ? malloc(take[i].size ? take[i].size : 1) : NULL;
        bool host = take[i].type != MEDUSA_EV_ALLOC; /* pinned or registered: read directly */
        bool ok = buf && (host ? (memcpy(buf, (void *)(uintptr_t)take[i].key, take[i].size), true)
                               : d->memcpyDtoH && !d->memcpyDtoH(buf, take[i].key, take[i].size));
        if (!ok)
            r.result = -1; /* too large or unreadable: recorded without its bytes */
        mi_emit(&r, ok ? buf : NULL, ok ? take[i].size : 0, LIVE_NONE);
        free(buf);
    }
    free(take);
}

/* ---- fork: the child stops recording; its copy of the buffers belongs to the parent ---- */
void mi_writer_fork_prepare(void) { pthread_mutex_lock(&W.lock); }
void mi_writer_fork_parent(void) { pthread_mutex_unlock(&W.lock); }
void mi_writer_fork_child(void) {
    if (W.opened)
        close(W.fd), close(W.bfd), close(W.ifd);
    W.opened = false;
    W.mode = 0;
    W.rec.n = W.blob.n = 0;
    pthread_mutex_init(&W.lock, NULL);
}

/* ---- functions and stubs ---- */
static func_slot *func_find(const void *key) {
    if (!W.func_cap)
        return NULL;
    for (size_t i = slot_of((uint64_t)(uintptr_t)key, W.func_cap); W.funcs[i].key;
         i = (i + 1) & (W.func_cap - 1))
        if (W.funcs[i].key == key)
            return &W.funcs[i];
    return NULL;
}

static func_slot *func_insert(const void *key) {
    if ((W.func_used + 1) * 2 > W.func_cap) {
        size_t cap = W.func_cap ? W.func_cap * 2 : 1024;
        func_slot *n = calloc(cap, sizeof *n);
        if (!n)
            return NULL;
        for (size_t i = 0; i < W.func_cap; i++)
            if (W.funcs[i].key) {
                size_t j = slot_of((uint64_t)(uintptr_t)W.funcs[i].key, cap);
                while (n[j].key)
                    j = (j + 1) & (cap - 1);
                n[j] = W.funcs[i];
            }
        free(W.funcs);
        W.funcs = n, W.func_cap = cap;
    }
    size_t i = slot_of((uint64_t)(uintptr_t)key, W.func_cap);
    while (W.funcs[i].key)
        i = (i + 1) & (W.func_cap - 1);
    W.funcs[i].key = key;
    W.func_used++;
    return &W.funcs[i];
}

/* Parameter i of f: a CUfunction (cuFuncGetParamInfo, 12.4+) or a CUkernel (cuKernelGetParamInfo,
 * 12.4+; without it, through its function). */
static CUresult param_info(const mi_driver *d, CUfunction f, CUkernel k, size_t i, size_t *off,
                           size_t *size) {
    if (k && d->kernelGetParamInfo)
        return d->kernelGetParamInfo(k, i, off, size);
    return d->funcGetParamInfo ? d->funcGetParamInfo(f, i, off, size) : CUDA_ERROR_NOT_FOUND;
}

/* The layout of f's parameters into fi; false when the driver cannot tell it. NOTE: only
 * CUDA_ERROR_INVALID_VALUE past the last index ends the list: any other error is no layout at
 * all, never "no parameters" (the graph would be rebuilt with empty parameter buffers). */
static bool param_layout(const mi_driver *d, CUfunction f, CUkernel k, mi_func_info *fi) {
    uint32_t cap = 16, n = 0;
    uint32_t(*lay)[2] = malloc(cap * sizeof *lay);
    size_t off, size;
    CUresult e = CUDA_SUCCESS;
    while (lay && n < 4096 && !(e = param_info(d, f, k, n, &off, &size))) {
        if (n == cap) {
            uint32_t(*m)[2] = realloc(lay, (cap *= 2) * sizeof *lay);
            if (!m)
                break;
            lay = m;
        }
        lay[n][0] = (uint32_t)off, lay[n][1] = (uint32_t)size;
        fi->bytes = fi->bytes > off + size ? fi->bytes : (uint32_t)(off + size);
        n++;
    }
    fi->num_params = lay ? n : 0;
    fi->layout = lay;
    return lay && e == CUDA_ERROR_INVALID_VALUE;
}

static void stop_no_layout(const mi_driver *d, CUfunction f, const char *name, bool kernel) {
    int v = 0;
    if (d->driverGetVersion)
        d->driverGetVersion(&v);
    char msg[400];
    snprintf(msg, sizeof msg,
             "the parameter layout of kernel %s cannot be read: the driver (CUDA %d.%d) %s; an "
             "artifact needs a CUDA 12.4 or newer driver (cuFuncGetParamInfo, cuKernelGetParamInfo)",
             name ? name : "?", v / 1000, v % 1000 / 10,
             !d->funcGetParamInfo && !(kernel && d->kernelGetParamInfo)
                 ? "has neither cuFuncGetParamInfo nor cuKernelGetParamInfo"
                 : "refused the query");
    (void)f;
    mi_stop(msg);
}

static void func_query(CUfunction f, mi_func_info *fi, medusa_trace_record *r, char **blob,
                       size_t *len) {
    const mi_driver *d = mi_drv();
    /* f is a CUfunction, or a CUkernel (cuLaunchKernel takes both): a kernel is asked through the
     * function it gives, for its module. */
    const char *name = NULL;
    CUfunction fn = f;
    CUkernel k = NULL;
    CUresult named = d->funcGetName ? d->funcGetName(&name, f) : CUDA_ERROR_NOT_FOUND;
    if (named == CUDA_ERROR_INVALID_HANDLE && d->kernelGetFunction &&
        d->kernelGetFunction(&fn, (CUkernel)f) == CUDA_SUCCESS) {
        k = (CUkernel)f;
        if (d->funcGetName)
            d->funcGetName(&name, fn);
    }
    if (!param_layout(d, fn, k, fi))
        stop_no_layout(d, f, name, k != NULL);
    CUlibrary lib = NULL;
    CUmodule mod = NULL;
    if (k && d->kernelGetLibrary && d->kernelGetLibrary(&lib, k) != CUDA_SUCCESS)
        lib = NULL;
    if (d->funcGetModule && d->funcGetModule(&mod, fn) != CUDA_SUCCESS)
        mod = NULL;
    *r = (medusa_trace_record){.type = MEDUSA_EV_FUNC,
                               .u = {(uint64_t)(uintptr_t)f, (uint64_t)(uintptr_t)lib,
                                     (uint64_t)(uintptr_t)mod, fi->num_params, fi->bytes}};
    size_t nl = name ? strlen(name) : 0;
    *len = fi->num_params * 8u + nl;
    *blob = malloc(*len + 1);
    if (*blob) {
        if (fi->num_params)
            memcpy(*blob, fi->layout, fi->num_params * 8u);
        if (nl)
            memcpy(*blob + fi->num_params * 8u, name, nl);
    }
}

const mi_func_info *mi_func(CUfunction f) {
    static const mi_func_info none;
    pthread_mutex_lock(&W.lock);
    func_slot *s = func_find(f);
    pthread_mutex_unlock(&W.lock);
    if (s)
        return &s->info;
    /* First sight: ask the driver outside the lock (it may take its own). */
    mi_func_info fi = {0};
    medusa_trace_record r;
    char *blob = NULL;
    size_t len = 0;
    func_query(f, &fi, &r, &blob, &len);
    pthread_mutex_lock(&W.lock);
    s = func_find(f);
    bool fresh = !s;
    if (fresh && (s = func_insert(f)))
        s->info = fi;
    pthread_mutex_unlock(&W.lock);
    if (fresh && s)
        mi_emit(&r, blob, len, LIVE_NONE);
    else
        free(fi.layout);
    free(blob);
    return s ? &s->info : &none;
}

bool mi_stub_seen(const void *stub) {
    pthread_mutex_lock(&W.lock);
    bool seen = false;
    if ((W.stub_used + 1) * 2 > W.stub_cap) {
        size_t cap = W.stub_cap ? W.stub_cap * 2 : 256;
        const void **n = calloc(cap, sizeof *n);
        if (n) {
            for (size_t i = 0; i < W.stub_cap; i++)
                if (W.stubs[i]) {
                    size_t j = slot_of((uint64_t)(uintptr_t)W.stubs[i], cap);
                    while (n[j])
                        j = (j + 1) & (cap - 1);
                    n[j] = W.stubs[i];
                }
            free(W.stubs);
            W.stubs = n, W.stub_cap = cap;
        }
    }
    if (W.stub_cap) {
        size_t i = slot_of((uint64_t)(uintptr_t)stub, W.stub_cap);
        while (W.stubs[i] && W.stubs[i] != stub)
            i = (i + 1) & (W.stub_cap - 1);
        seen = W.stubs[i] == stub;
        if (!seen)
            W.stubs[i] = stub, W.stub_used++;
    }
    pthread_mutex_unlock(&W.lock);
    return seen;
}
