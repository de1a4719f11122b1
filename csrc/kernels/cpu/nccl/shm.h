/* The rank processes' meeting place: one shared-memory segment per communicator, made by rank 0
 * (exclusive, 0600, its name and a secret in the unique id), unlinked once every rank joined. */
#ifndef MEDUSA_NCCL_SHM_H
#define MEDUSA_NCCL_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MNCCL_MAX_RANKS 8
#define MNCCL_SECRET 32
#define MNCCL_NAME 48
#define MNCCL_HEADER 4096 /* the slots start here */
#define MNCCL_MAX_SLOT ((uint64_t)1 << 30)

/* What ncclGetUniqueId writes (NCCL's 128-byte id). */
typedef struct {
    uint64_t magic;
    char name[MNCCL_NAME]; /* "/medusa-nccl-<32 hex>" */
    uint8_t secret[MNCCL_SECRET];
} mnccl_id;

typedef struct {
    _Atomic uint64_t magic; /* set last by rank 0: the header below is ready */
    uint8_t secret[MNCCL_SECRET];
    int32_t nranks;
    uint32_t pad;
    uint64_t slot_bytes;
    _Atomic uint32_t arrived, gen; /* the barrier: arrivals this round, rounds completed */
    _Atomic uint32_t aborted;      /* a rank gave up waiting or aborted: every wait fails */
    _Atomic int32_t pids[MNCCL_MAX_RANKS];
    /* what each rank's current collective is (kind, type, op, count, its sequence number), so
     * that ranks which called different collectives find out at the first meeting */
    uint64_t calls[MNCCL_MAX_RANKS][5];
    _Atomic uint32_t active[MNCCL_MAX_RANKS]; /* a collective of this rank is running */
    char why[256];
} mnccl_header;

/* The communicator's state in device memory; collective kernels' parameters point to it. */
typedef struct {
    uint64_t magic;
    mnccl_header *shm;
    uint64_t seq; /* collectives this rank has run (device memory: replays count too) */
    int32_t rank, nranks;
    uint64_t slot_bytes;
    uint64_t timeout_ns;
} mnccl_state;

/* Rank r's slot. */
static inline uint8_t *mnccl_slot(const mnccl_state *s, int r) {
    return (uint8_t *)s->shm + MNCCL_HEADER + (size_t)r * s->slot_bytes;
}

/* Makes (rank 0) or opens the segment of ID for NRANKS with SLOT_BYTES per rank; *hdr and *bytes
 * on success. 0, or an ncclResult_t with the reason in mnccl_last. */
int mnccl_join(const mnccl_id *id, int nranks, int rank, uint64_t slot_bytes, uint64_t timeout_ns,
               mnccl_header **hdr, size_t *bytes);
/* Waits until every rank arrived; 0, or -1 (aborted or timed out: the header says why). */
int mnccl_barrier(mnccl_header *h, int nranks, uint64_t timeout_ns, int rank);
void mnccl_abort(mnccl_header *h, const char *why);
uint64_t mnccl_now_ns(void);

extern __thread char mnccl_last[256];
#define MNCCL_ID_MAGIC 0x314c43434e4d444dULL /* "MDMNCCL1" */
#define MNCCL_STATE_MAGIC 0x3174617473434e4dULL

#endif
