/* How far a weight load has got (mr_progress in restore.h): a watermark of done chunks that an
 * engine blocks on, layer by layer, without the interpreter's lock. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "progress.h"

#define EXPORT __attribute__((visibility("default")))

struct mr_progress {
    pthread_mutex_t lock; /* everything below */
    pthread_cond_t moved; /* the watermark, the state or the hold changed */
    uint64_t chunk_size;
    uint32_t num_chunks, watermark, hold, bad;
    int state;
    uint8_t *done; /* per chunk, for those above the watermark that finished first */
};

EXPORT mr_progress *mr_progress_new(uint64_t chunk_size, uint32_t num_chunks, uint32_t hold) {
    mr_progress *p = calloc(1, sizeof *p);
    if (!p || !(p->done = calloc(num_chunks ? num_chunks : 1, 1))) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->moved, NULL);
    p->chunk_size = chunk_size;
    p->num_chunks = num_chunks;
    p->hold = hold;
    p->state = MR_RUNNING;
    return p;
}

EXPORT void mr_progress_free(mr_progress *p) {
    if (!p)
        return;
    pthread_cond_destroy(&p->moved);
    pthread_mutex_destroy(&p->lock);
    free(p->done);
    free(p);
}

int mr_progress_fits(const mr_progress *p, uint64_t chunk_size, uint32_t num_chunks) {
    return p->chunk_size == chunk_size && p->num_chunks == num_chunks;
}

void mr_progress_chunk_done(mr_progress *p, uint32_t i) {
    pthread_mutex_lock(&p->lock);
    p->done[i] = 1;
    uint32_t w = p->watermark;
    while (w < p->num_chunks && p->done[w])
        w++;
    if (w != p->watermark) {
        p->watermark = w;
        pthread_cond_broadcast(&p->moved);
    }
    pthread_mutex_unlock(&p->lock);
}

void mr_progress_end(mr_progress *p, int state, uint32_t bad) {
    pthread_mutex_lock(&p->lock);
    if (p->state == MR_RUNNING) {
        p->state = state;
        p->bad = bad;
        pthread_cond_broadcast(&p->moved);
    }
    pthread_mutex_unlock(&p->lock);
}

EXPORT void mr_progress_stop(mr_progress *p) { mr_progress_end(p, MR_STOPPED, 0); }

EXPORT int mr_progress_wait(mr_progress *p, uint64_t offset, uint32_t *bad) {
    uint64_t need = (offset + p->chunk_size - 1) / p->chunk_size; /* chunks [0, need) */
    if (need > p->num_chunks)
        need = p->num_chunks;
    pthread_mutex_lock(&p->lock);
    while (p->watermark < need && p->state == MR_RUNNING)
        pthread_cond_wait(&p->moved, &p->lock);
    /* NOTE: chunks under the watermark are good even when a later one is not. */
    int code = p->watermark >= need ? 0 : p->state == MR_MISMATCH ? 1 : 2;
    if (code == 1 && bad)
        *bad = p->bad;
    pthread_mutex_unlock(&p->lock);
    return code;
}

EXPORT uint32_t mr_progress_done(mr_progress *p) {
    pthread_mutex_lock(&p->lock);
    uint32_t w = p->watermark;
    pthread_mutex_unlock(&p->lock);
    return w;
}

EXPORT void mr_progress_release(mr_progress *p, uint32_t hold) {
    pthread_mutex_lock(&p->lock);
    p->hold = hold;
    pthread_cond_broadcast(&p->moved);
    pthread_mutex_unlock(&p->lock);
}

void mr_progress_hold(mr_progress *p, uint32_t i, atomic_int *stop) {
    pthread_mutex_lock(&p->lock);
    while (i >= p->hold && !atomic_load(stop)) {
        /* NOTE: timed: a worker that stops the load does not signal this condition. */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += 10 * 1000 * 1000;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&p->moved, &p->lock, &t);
    }
    pthread_mutex_unlock(&p->lock);
}
