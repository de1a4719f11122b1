/* Weight-store chunks to the device through pinned staging slots, in C so that the load runs
 * beside the interpreter's start-up (tokenizer, graph restore) instead of waiting for its lock.
 * Runtime entry points come from the process's global scope (libcudart, simcuda, or the
 * recorder that wraps them), like the Python loader's ctypes calls. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

#include "progress.h"

#define EXPORT __attribute__((visibility("default")))
#define H2D 1 /* cudaMemcpyHostToDevice */

typedef int (*memcpy_async_fn)(void *, const void *, size_t, int, void *);
typedef int (*event_fn)(void *);
typedef int (*event_record_fn)(void *, void *);
typedef const char *(*error_name_fn)(int);

static struct {
    memcpy_async_fn memcpy_async;
    event_record_fn record;
    event_fn sync;
    error_name_fn name;
} R;
static pthread_once_t r_once = PTHREAD_ONCE_INIT;

static void resolve(void) {
    R.memcpy_async = (memcpy_async_fn)dlsym(RTLD_DEFAULT, "cudaMemcpyAsync");
    R.record = (event_record_fn)dlsym(RTLD_DEFAULT, "cudaEventRecord");
    R.sync = (event_fn)dlsym(RTLD_DEFAULT, "cudaEventSynchronize");
    R.name = (error_name_fn)dlsym(RTLD_DEFAULT, "cudaGetErrorName");
}

typedef struct {
    const mr_load *L;
    atomic_uint next;      /* the next chunk to take */
    atomic_int stop;       /* an error was found: take no more */
    pthread_mutex_t lock;  /* the fields below */
    pthread_cond_t freed;
    uint8_t busy[64], pending[64]; /* per slot: taken by a worker; its copies not yet waited for */
    uint32_t bad;          /* lowest mismatching chunk, or UINT32_MAX */
    uint32_t unread;       /* lowest chunk the file could not give, or UINT32_MAX */
    int read_errno;        /* why: an errno, or -1 for the end of the file */
    int cuda_code;
    char cuda_call[48];
} job;

static void cuda_failed(job *J, const char *call, int code) {
    pthread_mutex_lock(&J->lock);
    if (!J->cuda_code) {
        J->cuda_code = code;
        snprintf(J->cuda_call, sizeof J->cuda_call, "%s", call);
    }
    pthread_mutex_unlock(&J->lock);
    atomic_store(&J->stop, 1);
}

static void mismatch(job *J, uint32_t i) {
    pthread_mutex_lock(&J->lock);
    if (i < J->bad)
        J->bad = i;
    pthread_mutex_unlock(&J->lock);
    atomic_store(&J->stop, 1);
}

static void read_failed(job *J, uint32_t i, int why) {
    pthread_mutex_lock(&J->lock);
    if (i < J->unread) {
        J->unread = i;
        J->read_errno = why;
    }
    pthread_mutex_unlock(&J->lock);
    atomic_store(&J->stop, 1);
}

/* n bytes of fd at off into dst: 0, an errno, or -1 where the file ends first (cut short). */
static int read_at(int fd, uint8_t *dst, uint64_t n, uint64_t off) {
    while (n) {
        ssize_t got = pread(fd, dst, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errno ? errno : EIO;
        if (got == 0)
            return -1;
        dst += got, n -= (uint64_t)got, off += (uint64_t)got;
    }
    return 0;
}

/* [lo, lo + n) of the data into dst: from the mapping, or read from the file. */
static int fetch(const mr_load *L, uint8_t *dst, uint64_t lo, uint64_t n) {
    if (!L->data)
        return read_at(L->fd, dst, n, L->file_offset + lo);
    memcpy(dst, L->data + lo, n);
    return 0;
}

/* Chunk i (n bytes from lo) into its slot: all of it when it is checked (the bytes checked are the
 * bytes sent, or, without pieces, the bytes checked), else only its pieces. 0 or fetch's error. */
static int stage(const mr_load *L, uint8_t *staged, uint32_t i, uint64_t lo, uint64_t n) {
    uint64_t p0 = L->piece_start[i], p1 = L->piece_start[i + 1];
    if (L->digests || p0 == p1)
        return fetch(L, staged, lo, n);
    for (uint64_t p = p0; p < p1; p++) {
        int e = fetch(L, staged + L->pieces[p].src, lo + L->pieces[p].src, L->pieces[p].nbytes);
        if (e)
            return e;
    }
    return 0;
}

static int matches(const mr_load *L, uint32_t i, const void *p, size_t n) {
    XXH128_hash_t h = XXH3_128bits(p, n);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h); /* big-endian high64 then low64, as xxhash.digest() */
    return memcmp(c.digest, L->digests + (size_t)i * 16, 16) == 0;
}

static int take_slot(job *J) {
    pthread_mutex_lock(&J->lock);
    for (;;) {
        for (uint32_t s = 0; s < J->L->num_slots; s++)
            if (!J->busy[s]) {
                J->busy[s] = 1;
                pthread_mutex_unlock(&J->lock);
                return (int)s;
            }
        pthread_cond_wait(&J->freed, &J->lock);
    }
}

static void give_slot(job *J, int s, int pending) {
    pthread_mutex_lock(&J->lock);
    J->busy[s] = 0;
    J->pending[s] = (uint8_t)pending;
    pthread_cond_signal(&J->freed);
    pthread_mutex_unlock(&J->lock);
}

/* Queues the copies of chunk i's pieces from slot s and gives the slot back. */
static void send(job *J, uint32_t i, int s) {
    const mr_load *L = J->L;
    uint8_t *staged = L->slots[s];
    uint64_t p0 = L->piece_start[i], p1 = L->piece_start[i + 1];
    for (uint64_t p = p0; p < p1; p++) {
        const mr_piece *q = &L->pieces[p];
        int e = R.memcpy_async((void *)(uintptr_t)q->dst, staged + q->src, q->nbytes, H2D,
                               L->stream);
        if (e) {
            /* NOTE: stop the others before the slot goes back, and keep it pending when pieces
             * before this one were queued: they may still read it. */
            cuda_failed(J, "cudaMemcpyAsync", e);
            give_slot(J, s, p > p0 && R.record(L->events[s], L->stream) == 0);
            return;
        }
    }
    int e = R.record(L->events[s], L->stream);
    if (e)
        cuda_failed(J, "cudaEventRecord", e);
    give_slot(J, s, e == 0);
    if (!e && L->progress)
        mr_progress_chunk_done(L->progress, i);
}

static void chunk(job *J, uint32_t i) {
    const mr_load *L = J->L;
    uint64_t lo = (uint64_t)i * L->chunk_size;
    uint64_t n = lo + L->chunk_size <= L->data_size ? L->chunk_size : L->data_size - lo;
    int copies = L->piece_start[i] != L->piece_start[i + 1];
    if (!copies && (L->data || !L->digests)) { /* host-resident: checked in place, or unchecked */
        if (L->digests && !matches(L, i, L->data + lo, n))
            mismatch(J, i);
        else if (L->progress)
            mr_progress_chunk_done(L->progress, i);
        return;
    }
    int s = take_slot(J);
    if (J->pending[s]) { /* only this worker holds slot s now */
        int e = R.sync(L->events[s]);
        if (e) {
            cuda_failed(J, "cudaEventSynchronize", e); /* stop first: the slot may still be read */
            give_slot(J, s, 1);
            return;
        }
    }
    int e = stage(L, L->slots[s], i, lo, n);
    if (e || (L->digests && !matches(L, i, L->slots[s], n))) {
        give_slot(J, s, 0);
        if (e)
            read_failed(J, i, e);
        else
            mismatch(J, i);
        return;
    }
    if (copies) {
        send(J, i, s);
        return;
    }
    give_slot(J, s, 0); /* a file's chunk with nothing to copy: read to be checked */
    if (L->progress)
        mr_progress_chunk_done(L->progress, i);
}

static void *work(void *arg) {
    job *J = arg;
    for (;;) {
        if (atomic_load(&J->stop))
            return NULL;
        uint32_t i = atomic_fetch_add(&J->next, 1);
        if (i >= J->L->num_chunks)
            return NULL;
        if (J->L->progress) {
            mr_progress_hold(J->L->progress, i, &J->stop);
            if (atomic_load(&J->stop))
                return NULL;
        }
        chunk(J, i);
    }
}

static int bad_args(const mr_load *L, char *err, size_t errlen) {
    const char *why = NULL;
    if (!L->num_slots || L->num_slots > 64)
        why = "between 1 and 64 staging slots";
    else if (L->slot_bytes < L->chunk_size || !L->chunk_size)
        why = "a staging slot smaller than a chunk";
    else if ((uint64_t)L->num_chunks != (L->data_size + L->chunk_size - 1) / L->chunk_size)
        why = "a chunk count that does not cover the data";
    else if (!L->data && L->fd < 0 && L->num_chunks)
        why = "neither the data nor a file to read it from";
    else if (L->progress && !mr_progress_fits(L->progress, L->chunk_size, L->num_chunks))
        why = "a progress made for another chunk size or count";
    for (uint32_t i = 0; !why && i < L->num_chunks; i++) {
        uint64_t lo = (uint64_t)i * L->chunk_size;
        uint64_t n = lo + L->chunk_size <= L->data_size ? L->chunk_size : L->data_size - lo;
        if (L->piece_start[i + 1] < L->piece_start[i])
            why = "piece ranges out of order";
        for (uint64_t p = L->piece_start[i]; !why && p < L->piece_start[i + 1]; p++)
            if (L->pieces[p].src > n || L->pieces[p].nbytes > n - L->pieces[p].src)
                why = "a piece outside its chunk";
    }
    if (why)
        snprintf(err, errlen, "mr_load_chunks: %s", why);
    return why != NULL;
}

static int load(const mr_load *L, uint32_t *bad, char *err, size_t errlen);

EXPORT int mr_load_chunks(const mr_load *L, uint32_t *bad, char *err, size_t errlen) {
    uint32_t first_bad = 0;
    int code = load(L, &first_bad, err, errlen);
    if (L->progress) /* NOTE: on every path, or an engine waiting on a layer would hang */
        mr_progress_end(L->progress, code == 0 ? MR_LOADED : code == 1 ? MR_MISMATCH : MR_STOPPED,
                        first_bad);
    if (code == 1 || code == 4)
        *bad = first_bad;
    return code;
}

static int load(const mr_load *L, uint32_t *bad, char *err, size_t errlen) {
    pthread_once(&r_once, resolve);
    if (!R.memcpy_async || !R.record || !R.sync) {
        snprintf(err, errlen, "mr_load_chunks: no CUDA runtime in this process");
        return 3;
    }
    if (bad_args(L, err, errlen))
        return 3;
    job J = {.L = L, .bad = UINT32_MAX, .unread = UINT32_MAX};
    atomic_init(&J.next, 0);
    atomic_init(&J.stop, 0);
    pthread_mutex_init(&J.lock, NULL);
    pthread_cond_init(&J.freed, NULL);
    uint32_t extra = L->workers > 1 ? L->workers - 1 : 0;
    pthread_t threads[8];
    uint32_t started = 0;
    for (; started < extra && started < 8; started++)
        if (pthread_create(&threads[started], NULL, work, &J))
            break;
    work(&J);
    for (uint32_t t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
    pthread_cond_destroy(&J.freed);
    pthread_mutex_destroy(&J.lock);
    if (J.cuda_code) {
        const char *name = R.name ? R.name(J.cuda_code) : NULL;
        snprintf(err, errlen, "%s failed: %s (%d)", J.cuda_call, name ? name : "?", J.cuda_code);
        return 2;
    }
    if (J.unread != UINT32_MAX) {
        *bad = J.unread;
        snprintf(err, errlen, "%s",
                 J.read_errno < 0 ? "the file ends before it (cut short while loading)"
                                  : strerror(J.read_errno));
        return 4;
    }
    if (J.bad != UINT32_MAX) {
        *bad = J.bad;
        return 1;
    }
    return 0;
}
