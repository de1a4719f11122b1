/* The trace files and their buffers: opened at the first event (so a child that never touches CUDA
 * writes nothing), filled under the recorder's one lock (registry.h), flushed, closed, and left to
 * the parent by a forked child. Module images go beside them, by content. */
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
#include "registry.h"

#define BUF_LIMIT (1u << 20)

typedef struct {
    unsigned char *v;
    size_t n, cap;
} buf;

pthread_mutex_t mi_registry_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
    unsigned mode;      /* 0: off */
    bool opened, broken;
    char path[4096];
    int fd, bfd, ifd; /* ifd: the images directory, held so that no link swapped in is followed */
    buf rec, blob;
    uint64_t blob_file_off; /* file offset of blob.v[0] */
    uint64_t seq, t0;
} W = {.fd = -1, .bfd = -1, .ifd = -1};

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

void mi_emit(medusa_trace_record *r, const void *blob, size_t len, live_op op) {
    pthread_mutex_lock(&mi_registry_lock);
    if (W.mode && !W.broken && (W.opened || open_locked())) {
        if (op == LIVE_DEL)
            mi_live_del(r);
        append(r, blob, len);
        if (op == LIVE_ADD && r->result == 0 && !mi_live_add(r->u[0], r->u[1], r->seq, r->type))
            W.broken = true;
        if (W.rec.n + W.blob.n >= BUF_LIMIT)
            flush_locked();
    }
    bool broken = W.broken && W.opened;
    pthread_mutex_unlock(&mi_registry_lock);
    if (broken)
        mi_fail("writing the trace failed (disk full?)");
}

int mi_flush(void) {
    pthread_mutex_lock(&mi_registry_lock);
    bool ok = flush_locked();
    pthread_mutex_unlock(&mi_registry_lock);
    return ok ? 0 : -1;
}

void mi_writer_close(void) {
    pthread_mutex_lock(&mi_registry_lock);
    if (W.opened && !W.broken) {
        medusa_trace_record r = {.type = MEDUSA_EV_END, .u = {W.seq + 1}};
        append(&r, NULL, 0);
        flush_locked();
        close(W.fd), close(W.bfd), close(W.ifd);
        W.opened = false;
    }
    W.mode = 0;
    pthread_mutex_unlock(&mi_registry_lock);
}

/* ---- module images, by content: an image already saved is not written again ---- */
void mi_save_image(const char *hex, const void *data, size_t size) {
    char name[80];
    snprintf(name, sizeof name, "%s.img", hex);
    pthread_mutex_lock(&mi_registry_lock);
    int dir = W.opened ? dup(W.ifd) : -1; /* the descriptor outlives a close meanwhile */
    pthread_mutex_unlock(&mi_registry_lock);
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

/* ---- fork: the child stops recording; its copy of the buffers belongs to the parent ---- */
void mi_writer_fork_prepare(void) { pthread_mutex_lock(&mi_registry_lock); }
void mi_writer_fork_parent(void) { pthread_mutex_unlock(&mi_registry_lock); }
void mi_writer_fork_child(void) {
    if (W.opened)
        close(W.fd), close(W.bfd), close(W.ifd);
    W.opened = false;
    W.mode = 0;
    W.rec.n = W.blob.n = 0;
    pthread_mutex_init(&mi_registry_lock, NULL);
}
