/* The registry: configuration, the lock, handle table, range sets, messages. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

sim_state g_sim = {.lock = PTHREAD_MUTEX_INITIALIZER};

void sim_lock(void) { pthread_mutex_lock(&g_sim.lock); }
void sim_unlock(void) { pthread_mutex_unlock(&g_sim.lock); }

double sim_coarse_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double sim_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- messages ---- */
static __thread char t_message[1024];

SIM_API const char *simcudaGetLastMessage(void) { return t_message; }

CUresult sim_fail(CUresult r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t_message, sizeof t_message, fmt, ap);
    va_end(ap);
    if (getenv("MEDUSA_SIM_VERBOSE"))
        fprintf(stderr, "simcuda: %s\n", t_message);
    return r;
}

/* ---- handle table: open addressing on the pointer value ---- */
typedef struct {
    const void *h;
    int type;
} hslot;
static hslot *h_tab;
static size_t h_cap, h_used, h_tomb;
#define H_TOMB ((const void *)1)

static size_t h_hash(const void *h) {
    uint64_t x = (uint64_t)(uintptr_t)h;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void h_grow(void) {
    hslot *old = h_tab;
    size_t oldcap = h_cap;
    h_cap = h_cap ? h_cap * 2 : 1024;
    h_tab = calloc(h_cap, sizeof *h_tab);
    h_used = h_tomb = 0;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].h && old[i].h != H_TOMB)
            sim_handle_add(old[i].h, old[i].type);
    free(old);
}

void sim_handle_add(const void *h, int type) {
    if ((h_used + h_tomb + 1) * 2 > h_cap)
        h_grow();
    size_t i = h_hash(h) & (h_cap - 1);
    while (h_tab[i].h && h_tab[i].h != H_TOMB)
        i = (i + 1) & (h_cap - 1);
    if (h_tab[i].h == H_TOMB)
        h_tomb--;
    h_tab[i] = (hslot){h, type};
    h_used++;
}

static hslot *h_lookup(const void *h) {
    if (!h_cap || !h || h == H_TOMB)
        return NULL;
    size_t i = h_hash(h) & (h_cap - 1);
    while (h_tab[i].h) {
        if (h_tab[i].h == h)
            return &h_tab[i];
        i = (i + 1) & (h_cap - 1);
    }
    return NULL;
}

void sim_handle_del(const void *h) {
    hslot *s = h_lookup(h);
    if (s) {
        s->h = H_TOMB;
        h_used--;
        h_tomb++;
    }
}

bool sim_handle_is(const void *h, int type) {
    hslot *s = h_lookup(h);
    return s && s->type == type;
}

size_t sim_handle_count(int type) {
    size_t n = 0;
    for (size_t i = 0; i < h_cap; i++)
        n += h_tab[i].h && h_tab[i].h != H_TOMB && h_tab[i].type == type;
    return n;
}

SIM_API uint64_t simcudaCountLive(int kind) {
    int type = kind == SIMCUDA_LIVE_GRAPHS ? H_GRAPH : kind == SIMCUDA_LIVE_EXECS ? H_EXEC : 0;
    sim_lock();
    size_t n = type ? sim_handle_count(type) : 0;
    sim_unlock();
    return n;
}

/* ---- range sets, sorted by base ---- */
static size_t rs_lower(const sim_rangeset *rs, uintptr_t p) {
    size_t lo = 0, hi = rs->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rs->v[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo; /* first index with base > p */
}

sim_range *rs_find(const sim_rangeset *rs, uintptr_t p) {
    size_t i = rs_lower(rs, p);
    if (i == 0)
        return NULL;
    sim_range *r = &rs->v[i - 1];
    return p - r->base < r->size ? r : NULL;
}

sim_range *rs_exact(const sim_rangeset *rs, uintptr_t base) {
    size_t i = rs_lower(rs, base);
    return i && rs->v[i - 1].base == base ? &rs->v[i - 1] : NULL;
}

sim_range *rs_overlap(const sim_rangeset *rs, uintptr_t base, size_t size) {
    size_t i = rs_lower(rs, base);
    if (i && base - rs->v[i - 1].base < rs->v[i - 1].size)
        return &rs->v[i - 1];
    return i < rs->n && rs->v[i].base < base + size ? &rs->v[i] : NULL;
}

int rs_insert(sim_rangeset *rs, sim_range r) {
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 64;
        sim_range *v = realloc(rs->v, cap * sizeof *v);
        if (!v)
            return -1;
        rs->v = v;
        rs->cap = cap;
    }
    size_t i = rs_lower(rs, r.base);
    memmove(&rs->v[i + 1], &rs->v[i], (rs->n - i) * sizeof *rs->v);
    rs->v[i] = r;
    rs->n++;
    return 0;
}

void rs_remove(sim_rangeset *rs, sim_range *r) {
    size_t i = (size_t)(r - rs->v);
    memmove(&rs->v[i], &rs->v[i + 1], (rs->n - i - 1) * sizeof *rs->v);
    rs->n--;
}

/* ---- configuration ---- */
static size_t parse_size(const char *s, size_t dflt) {
    if (!s || !*s)
        return dflt;
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; break;
    case 'm': case 'M': v *= 1024.0 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return v > 0 ? (size_t)v : dflt;
}

static void load_config(sim_config *c) {
    const char *e;
    snprintf(c->name, sizeof c->name, "%s",
             (e = getenv("MEDUSA_SIM_DEVICE_NAME")) && *e ? e : "simcuda H100 80GB HBM3 (CPU)");
    c->total_mem = parse_size(getenv("MEDUSA_SIM_MEMORY"), (size_t)8 << 30);
    c->total_mem = (c->total_mem + SIM_VMM_GRANULARITY - 1) & ~(size_t)(SIM_VMM_GRANULARITY - 1);
    c->sms = (e = getenv("MEDUSA_SIM_SMS")) && atoi(e) > 0 ? atoi(e) : 132;
    c->board = (e = getenv("MEDUSA_SIM_DEVICE_INDEX")) && atoi(e) > 0 && atoi(e) < 64 ? atoi(e) : 0;
    c->cc_major = 9;
    c->cc_minor = 0;
    if ((e = getenv("MEDUSA_SIM_CC")) && *e)
        sscanf(e, "%d.%d", &c->cc_major, &c->cc_minor);
    if ((e = getenv("MEDUSA_SIM_SEED")) && *e) {
        c->seed = strtoull(e, NULL, 0);
        c->seeded = true;
    } else if (getrandom(&c->seed, sizeof c->seed, 0) != sizeof c->seed) {
        c->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    }
    c->memcheck = (e = getenv("MEDUSA_SIM_MEMCHECK")) && *e && strcmp(e, "0") != 0;
    c->eager_loading = (e = getenv("CUDA_MODULE_LOADING")) && strcasecmp(e, "EAGER") == 0;
    c->slowdown = 1.0;
    if ((e = getenv("MEDUSA_SIM_SLOWDOWN")) && *e) {
        char *end;
        double f = strtod(e, &end);
        if (*end || !(f >= 1.0 && f <= 1000.0))
            fprintf(stderr, "simcuda: MEDUSA_SIM_SLOWDOWN=%s ignored: give a factor from 1 to "
                            "1000 (how many times slower than this CPU the device runs)\n", e);
        else
            c->slowdown = f;
    }
    c->racecheck = (e = getenv("MEDUSA_SIM_RACECHECK")) && *e && strcmp(e, "0") != 0;
    c->schedule_seed = (e = getenv("MEDUSA_SIM_SCHEDULE_SEED")) && *e ? strtoull(e, NULL, 0) : 1;
    c->launch_blocking = ((e = getenv("CUDA_LAUNCH_BLOCKING")) && !strcmp(e, "1")) ||
                         ((e = getenv("MEDUSA_SIM_ACCESSES")) && *e && strcmp(e, "0") != 0);
    e = getenv("MEDUSA_SIM_POISON");
    c->poison = !(e && (!strcmp(e, "0") || !strcasecmp(e, "false") || !strcasecmp(e, "no") ||
                        !strcasecmp(e, "off")));
    if (getrandom(&c->poison_key, sizeof c->poison_key, 0) != sizeof c->poison_key)
        c->poison_key = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ULL ^ (uint64_t)getpid();
    /* A device UUID stable for a given name, memory size and board index, like a board's. */
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = c->name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h ^= c->total_mem;
    h ^= (uint64_t)c->board * 0x9e3779b97f4a7c15ULL;
    memcpy(c->uuid, &h, 8);
    h = h * 6364136223846793005ULL + (uint64_t)c->sms;
    memcpy(c->uuid + 8, &h, 8);
}

CUresult sim_arena_init(void); /* memory.c */

/* The legacy stream and the queue's condition variables (the device thread waits on `work` with
 * a CLOCK_MONOTONIC timeout). */
static void init_conds(void) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_sim.work, &a);
    pthread_condattr_destroy(&a);
    pthread_cond_init(&g_sim.progress, NULL);
}

/* A fork takes the lock first (the device thread may hold it), and the child, which has no
 * device thread, starts one when it next queues work. */
static void fork_prepare(void) { sim_lock(); }
static void fork_parent(void) { sim_unlock(); }
static void fork_child(void) {
    pthread_mutex_init(&g_sim.lock, NULL);
    init_conds();
    g_sim.device_thread = false;
}

static void start_device(void) {
    init_conds();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    g_sim.rng = g_sim.cfg.schedule_seed;
    g_sim.legacy.id = g_sim.next_stream_id++;
    sim_race_stream(&g_sim.legacy);
    g_sim.legacy.next_live = g_sim.streams;
    g_sim.streams = &g_sim.legacy;
}

/* A failed context fails every call, with the failure's message on every thread. */
CUresult sim_ensure_init(void) {
    if (!g_sim.initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_in_host_fn)
        return sim_fail(CUDA_ERROR_NOT_PERMITTED, "a host function called CUDA (cuLaunchHostFunc: "
                        "it must not)");
    CUresult e = __atomic_load_n(&g_sim.sticky, __ATOMIC_ACQUIRE);
    if (e) /* written once, before sticky was set */
        snprintf(t_message, sizeof t_message, "%s", g_sim.sticky_message);
    return e;
}

SIM_API CUresult cuInit(unsigned int flags) {
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_lock();
    CUresult r = CUDA_SUCCESS;
    if (!g_sim.initialized) {
        load_config(&g_sim.cfg);
        r = sim_arena_init();
        if (r == CUDA_SUCCESS) {
            start_device();
            g_sim.initialized = true;
        }
    }
    sim_unlock();
    return r;
}

SIM_API CUresult cuDriverGetVersion(int *v) {
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = sim_driver_version();
    return CUDA_SUCCESS;
}
