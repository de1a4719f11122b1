/* Rendezvous and barrier of the rank processes over one shared-memory segment (shm.h).
 *
 * NOTE: the segment is reachable by every local user who can guess its name while it exists, so
 * rank 0 creates it O_CREAT|O_EXCL at 0600 (a name someone planted fails the creation), the
 * others accept it only if it is ours, 0600, the expected size, and holds the id's secret; and
 * rank 0 unlinks it as soon as every rank has mapped it. */
#define _GNU_SOURCE
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "medusa/nccl_api.h"

__thread char mnccl_last[256];

#define FAIL(code, ...) (snprintf(mnccl_last, sizeof mnccl_last, __VA_ARGS__), (code))

uint64_t mnccl_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *p, uint32_t v, long ns) {
    struct timespec t = {ns / 1000000000, ns % 1000000000};
    syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT, v, &t, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *p) {
    syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void nap(void) {
    struct timespec t = {0, 2000000};
    nanosleep(&t, NULL);
}

void mnccl_abort(mnccl_header *h, const char *why) {
    uint32_t was = 0;
    if (atomic_compare_exchange_strong(&h->aborted, &was, 1))
        snprintf(h->why, sizeof h->why, "%s", why);
    futex_wake(&h->gen);
}

int mnccl_barrier(mnccl_header *h, int nranks, uint64_t timeout_ns, int rank) {
    uint32_t g = atomic_load(&h->gen);
    if (atomic_load(&h->aborted))
        return -1;
    if (atomic_fetch_add(&h->arrived, 1) + 1 == (uint32_t)nranks) {
        atomic_store(&h->arrived, 0);
        atomic_fetch_add(&h->gen, 1);
        futex_wake(&h->gen);
        return 0;
    }
    uint64_t deadline = mnccl_now_ns() + timeout_ns;
    while (atomic_load(&h->gen) == g) {
        if (atomic_load(&h->aborted))
            return -1;
        if (mnccl_now_ns() > deadline) {
            char why[160];
            snprintf(why, sizeof why,
                     "rank %d waited %.1f s for the other ranks (one is dead or stopped)", rank,
                     (double)timeout_ns / 1e9);
            mnccl_abort(h, why);
            return -1;
        }
        futex_wait(&h->gen, g, 50000000);
    }
    return 0;
}

static int create(const mnccl_id *id, int nranks, uint64_t slot_bytes, size_t bytes) {
    int fd = shm_open(id->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return FAIL(-ncclSystemError, "shm_open(%s) for rank 0: %s (another process made that "
                    "name: use a fresh ncclGetUniqueId)", id->name, strerror(errno));
    /* NOTE: reserved now, so that another user filling /dev/shm fails this start, not a
     * collective half-way (a SIGBUS) */
    int err = fchmod(fd, 0600) ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    if (err) {
        errno = err;
        close(fd);
        shm_unlink(id->name);
        return FAIL(-ncclSystemError, "sizing %s: %s", id->name, strerror(errno));
    }
    (void)nranks, (void)slot_bytes;
    return fd;
}

/* Opens the segment rank 0 made, waiting for it; -ncclResult_t on failure. */
static int open_made(const mnccl_id *id, size_t bytes, uint64_t deadline) {
    for (;;) {
        int fd = shm_open(id->name, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) || st.st_uid != geteuid() ||
                (st.st_size != 0 && (size_t)st.st_size != bytes)) {
                close(fd);
                return FAIL(-ncclSystemError, "%s is not the segment rank 0 made (owner, mode or "
                            "size differ): refusing it", id->name);
            }
            if ((st.st_mode & 0777) == 0600 && (size_t)st.st_size == bytes)
                return fd;
            close(fd); /* rank 0 made it and is still sizing it: wait */
            if (mnccl_now_ns() > deadline)
                return FAIL(-ncclSystemError, "%s stayed unsized or not 0600: refusing it",
                            id->name);
            nap();
            continue;
        }
        if (errno != ENOENT)
            return FAIL(-ncclSystemError, "shm_open(%s): %s", id->name, strerror(errno));
        if (mnccl_now_ns() > deadline)
            return FAIL(-ncclSystemError, "rank 0 did not create %s in time (is it running, "
                        "and was it given the same nranks?)", id->name);
        nap();
    }
}

static int check_header(mnccl_header *h, const mnccl_id *id, int nranks, uint64_t slot_bytes,
                        uint64_t deadline) {
    while (atomic_load(&h->magic) != MNCCL_ID_MAGIC) {
        if (mnccl_now_ns() > deadline)
            return FAIL(ncclSystemError, "rank 0 did not finish setting up %s", id->name);
        nap();
    }
    unsigned diff = 0;
    for (int i = 0; i < MNCCL_SECRET; i++)
        diff |= (unsigned)(h->secret[i] ^ id->secret[i]);
    if (diff)
        return FAIL(ncclInvalidUsage, "%s holds another communicator's secret", id->name);
    if (h->nranks != nranks || h->slot_bytes != slot_bytes)
        return FAIL(ncclInvalidUsage, "rank 0 made the communicator for %d ranks, this rank was "
                    "given %d", h->nranks, nranks);
    return ncclSuccess;
}

int mnccl_join(const mnccl_id *id, int nranks, int rank, uint64_t slot_bytes, uint64_t timeout_ns,
               mnccl_header **hdr, size_t *bytes) {
    if (slot_bytes == 0 || slot_bytes > MNCCL_MAX_SLOT)
        return FAIL(ncclInvalidArgument, "MEDUSA_NCCL_SLOT_BYTES must be 64 bytes to 1 GiB");
    size_t n = MNCCL_HEADER + (size_t)nranks * slot_bytes; /* at most 8 GiB + 4 KiB: no wrap */
    uint64_t deadline = mnccl_now_ns() + timeout_ns;
    int fd = rank == 0 ? create(id, nranks, slot_bytes, n) : open_made(id, n, deadline);
    if (fd < 0)
        return -fd;
    mnccl_header *h = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (h == MAP_FAILED) {
        if (rank == 0)
            shm_unlink(id->name);
        return FAIL(ncclSystemError, "mmap of %s: %s", id->name, strerror(errno));
    }
    int e = ncclSuccess;
    if (rank == 0) {
        memcpy(h->secret, id->secret, MNCCL_SECRET);
        h->nranks = nranks, h->slot_bytes = slot_bytes;
        atomic_store(&h->magic, MNCCL_ID_MAGIC);
    } else {
        e = check_header(h, id, nranks, slot_bytes, deadline);
    }
    int32_t none = 0;
    if (!e && !atomic_compare_exchange_strong(&h->pids[rank], &none, (int32_t)getpid()))
        e = FAIL(ncclInvalidUsage, "rank %d joined the communicator twice", rank);
    if (!e && mnccl_barrier(h, nranks, timeout_ns, rank))
        e = FAIL(ncclSystemError, "not every rank joined %.48s: %.160s", id->name, h->why);
    if (rank == 0)
        shm_unlink(id->name); /* joined or failed: nobody opens it again */
    if (e) {
        munmap(h, n);
        return e;
    }
    *hdr = h, *bytes = n;
    return ncclSuccess;
}
