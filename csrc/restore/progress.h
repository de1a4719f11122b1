/* The loader's side of mr_progress (restore.h has the engine's). */
#ifndef MEDUSA_PROGRESS_H
#define MEDUSA_PROGRESS_H

#include <stdatomic.h>

#include "restore.h"

enum { MR_RUNNING = -1, MR_LOADED = 0, MR_MISMATCH = 1, MR_STOPPED = 2 };

/* Chunk i passed its checksum and its copies are queued. */
void mr_progress_chunk_done(mr_progress *p, uint32_t i);
/* The load ended: MR_LOADED, MR_MISMATCH (bad: the lowest bad chunk) or MR_STOPPED. */
void mr_progress_end(mr_progress *p, int state, uint32_t bad);
/* Waits while chunk i is held, unless *stop is set meanwhile. */
void mr_progress_hold(mr_progress *p, uint32_t i, atomic_int *stop);
/* Whether p was made for this chunk size and count. */
int mr_progress_fits(const mr_progress *p, uint64_t chunk_size, uint32_t num_chunks);

#endif
