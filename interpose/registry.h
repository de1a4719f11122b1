/* What writer.c, live.c and funcs.c share: the recorder's one lock (the trace, the live-allocation
 * map and the function table are one registry behind it, so that fork takes it once) and the hash
 * their open-addressing tables use. Private to those three files. */
#ifndef MEDUSA_INTERPOSE_REGISTRY_H
#define MEDUSA_INTERPOSE_REGISTRY_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

extern pthread_mutex_t mi_registry_lock;

static inline size_t mi_slot_of(uint64_t key, size_t cap) {
    uint64_t x = key * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 17) & (cap - 1);
}

/* ---- live.c, called with the lock held ---- */
/* false when the map could not grow: the allocation is not tracked, and the trace is broken. */
bool mi_live_add(uint64_t key, uint64_t size, uint64_t seq, uint64_t type);
/* Ends the allocation r (a free) ends, filling its size and sequence into r->u[1] and r->u[3]. */
void mi_live_del(medusa_trace_record *r);

#endif
