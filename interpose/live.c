/* The live-allocation map (open addressing on the address): what each free ends, and at "ready"
 * the contents of the buffers the capture phase allocated, recorded as CONTENT events. Its state is
 * the registry's, behind mi_registry_lock. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "registry.h"

typedef struct {
    uint64_t key, size, seq, type;
} live_slot; /* key 0: empty, 1: deleted; type: the event that made it (ALLOC, HOST_*) */

static struct {
    uint64_t capture_start; /* seq where the capture phase began (0: not yet) */
    live_slot *live;
    size_t live_cap, live_used;
} W;

static bool live_grow(void) {
    size_t cap = W.live_cap ? W.live_cap * 2 : 4096;
    live_slot *n = calloc(cap, sizeof *n);
    if (!n)
        return false;
    for (size_t i = 0; i < W.live_cap; i++)
        if (W.live[i].key > 1) {
            size_t j = mi_slot_of(W.live[i].key, cap);
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

bool mi_live_add(uint64_t key, uint64_t size, uint64_t seq, uint64_t type) {
    if (key <= 1)
        return true; /* 0 and 1 mark empty and deleted slots: no allocation has them */
    if ((W.live_used + 1) * 2 > W.live_cap && !live_grow())
        return false;
    size_t i = mi_slot_of(key, W.live_cap);
    while (W.live[i].key > 1 && W.live[i].key != key)
        i = (i + 1) & (W.live_cap - 1);
    W.live_used += W.live[i].key <= 1;
    W.live[i] = (live_slot){key, size, seq, type};
    return true;
}

/* The allocation event a free ends. NOTE: a free of the wrong kind (cudaFreeHost on registered
 * memory, cudaHostUnregister on pinned memory) fails in CUDA and must not end the allocation. */
static uint64_t freed_type(const medusa_trace_record *r) {
    if (r->type == MEDUSA_EV_FREE)
        return MEDUSA_EV_ALLOC;
    bool unregister = r->api == H_cuMemHostUnregister || r->api == H_cudaHostUnregister;
    return unregister ? MEDUSA_EV_HOST_REGISTER : MEDUSA_EV_HOST_ALLOC;
}

void mi_live_del(medusa_trace_record *r) {
    uint64_t key = r->u[0], type = freed_type(r);
    if (!W.live_cap || key <= 1)
        return;
    for (size_t i = mi_slot_of(key, W.live_cap); W.live[i].key; i = (i + 1) & (W.live_cap - 1))
        if (W.live[i].key == key && W.live[i].type == type) {
            r->u[1] = W.live[i].size, r->u[3] = W.live[i].seq;
            W.live[i].key = 1;
            return;
        }
}

/* ---- the capture phase's buffers: their contents, when "ready" is marked ---- */
void mi_note_phase(const char *phase, uint64_t seq) {
    pthread_mutex_lock(&mi_registry_lock);
    if (!W.capture_start && (!*phase || strncmp(phase, "graph_capture", 13) == 0))
        W.capture_start = seq;
    pthread_mutex_unlock(&mi_registry_lock);
}

#define SNAPSHOT_MAX ((uint64_t)256 << 20)

void mi_snapshot_live(void) {
    pthread_mutex_lock(&mi_registry_lock);
    size_t n = 0;
    live_slot *take = W.capture_start ? malloc((W.live_used + 1) * sizeof *take) : NULL;
    for (size_t i = 0; take && i < W.live_cap; i++)
        if (W.live[i].key > 1 && W.live[i].seq > W.capture_start)
            take[n++] = W.live[i];
    pthread_mutex_unlock(&mi_registry_lock);
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
