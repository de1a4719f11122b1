/* Symbol tables generated from hooks.def, the real functions behind the hooks, the exported dlsym,
 * start-up configuration, fork handling and logging. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

const char *const mi_hook_name[H_COUNT] = {
    "",
#define H(sym, base, version, ptsz, family) #sym,
#include "hooks.def"
#undef H
};

static void *const hook_addr[H_COUNT] = {
    NULL,
#define H(sym, base, version, ptsz, family) (void *)&sym,
#include "hooks.def"
#undef H
};

static void *g_real[H_COUNT];
__thread unsigned mi_t_nest;

/* ---- the real dlsym ---- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_dlsym;

static dlsym_fn real_dlsym_fn(void) {
    dlsym_fn f = __atomic_load_n(&g_dlsym, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    /* NOTE: dlvsym, not dlsym: ours is the dlsym everyone else gets. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !f; i++)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&g_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

void *mi_real_dlsym(void *handle, const char *name) {
    dlsym_fn f = real_dlsym_fn();
    return f ? f(handle, name) : NULL;
}

/* ---- hook table ---- */
void *mi_hook_addr(hook_id id) { return hook_addr[id]; }

int mi_hook_lookup(const char *name) {
    for (int i = 1; i < H_COUNT; i++)
        if (strcmp(mi_hook_name[i], name) == 0)
            return i;
    return -1;
}

bool mi_bind_real(hook_id id, void *fn) {
    void *expected = NULL;
    if (fn == hook_addr[id])
        return true;
    if (__atomic_compare_exchange_n(&g_real[id], &expected, fn, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
        return true;
    if (expected == fn)
        return true;
    mi_log("two implementations of %s are loaded; calls to the second are not recorded",
           mi_hook_name[id]);
    return false;
}

/* A driver loaded privately (cudart's dlopen("libcuda.so.1") with RTLD_LOCAL) is invisible to
 * RTLD_NEXT: look in it by name, without loading anything. */
static void *driver_sym(const char *name) {
    static const char *const drivers[] = {"libcuda.so.1", "libsimcuda.so"};
    void *f = NULL;
    for (size_t i = 0; i < sizeof drivers / sizeof drivers[0] && !f; i++) {
        void *h = dlopen(drivers[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        f = mi_real_dlsym(h, name);
        dlclose(h);
    }
    return f;
}

void *mi_real(hook_id id) {
    void *f = __atomic_load_n(&g_real[id], __ATOMIC_ACQUIRE);
    if (f)
        return f;
    f = mi_real_dlsym(RTLD_NEXT, mi_hook_name[id]);
    if (!f)
        f = driver_sym(mi_hook_name[id]);
    if (f)
        mi_bind_real(id, f);
    return __atomic_load_n(&g_real[id], __ATOMIC_ACQUIRE);
}

void *mi_sibling(hook_id id, const char *name) {
    void *real = mi_real(id);
    Dl_info info;
    if (!real || !dladdr(real, &info) || !info.dli_fname)
        return NULL;
    void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    void *f = h ? mi_real_dlsym(h, name) : NULL;
    if (h)
        dlclose(h);
    return f;
}

/* ---- the exported dlsym ---- */
/* NOTE: no CUDA call and no lock in here: libcudart calls it while the loader lock is held.
 * A caller's RTLD_NEXT is resolved relative to this library (a dlsym wrapper cannot do better). */
MI_EXPORT void *dlsym(void *handle, const char *name) {
    void *r = mi_real_dlsym(handle, name);
    if (!r || name[0] != 'c' || name[1] != 'u')
        return r;
    int id = mi_hook_lookup(name);
    if (id < 0 || !mi_bind_real((hook_id)id, r))
        return r;
    return hook_addr[id];
}

/* ---- logging and failure ---- */
void mi_log(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    dprintf(STDERR_FILENO, "medusa-interpose[%d]: %.*s", (int)getpid(), n, buf);
}

static int g_failed;

void mi_fail(const char *what) {
    if (!__atomic_exchange_n(&g_failed, 1, __ATOMIC_ACQ_REL))
        mi_log("recording stopped: %s (the program goes on unchanged)", what);
}

void mi_stop(const char *why) {
    if (__atomic_load_n(&g_failed, __ATOMIC_ACQUIRE) || !mi_recording_on())
        return;
    medusa_trace_record r = {.type = MEDUSA_EV_STOPPED};
    mi_emit(&r, why, strlen(why), LIVE_NONE);
    mi_flush();
    mi_fail(why);
}

/* ---- configuration, pause, gate ---- */
static int g_paused;

bool mi_wants(unsigned family) {
    if (!mi_recording_on() || __atomic_load_n(&g_failed, __ATOMIC_RELAXED) ||
        __atomic_load_n(&g_paused, __ATOMIC_RELAXED))
        return false;
    /* Restore mode needs where allocations landed (to relocate against) and which images were
     * loaded (to find hidden kernels in them). */
    return mi_mode() == MEDUSA_MODE_RECORD || family == F_MEM || family == F_MODULE;
}

static void fork_prepare(void) { mi_writer_fork_prepare(); }
static void fork_parent(void) { mi_writer_fork_parent(); }
static void fork_child(void) { mi_writer_fork_child(); }

__attribute__((constructor)) static void mi_init(void) {
    real_dlsym_fn();
    const char *path = getenv("MEDUSA_TRACE");
    if (!path || !*path)
        return;
    const char *mode = getenv("MEDUSA_MODE");
    unsigned m = MEDUSA_MODE_RECORD;
    if (mode && *mode && strcmp(mode, "record") != 0) {
        if (strcmp(mode, "restore") != 0) {
            mi_log("MEDUSA_MODE=%s is not 'record' or 'restore'; not recording", mode);
            return;
        }
        m = MEDUSA_MODE_RESTORE;
    }
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    mi_writer_config(path, m);
}

__attribute__((destructor)) static void mi_fini(void) { mi_writer_close(); }

/* ---- the control API ---- */
MI_EXPORT int medusa_trace_active(void) {
    return mi_recording_on() && !__atomic_load_n(&g_failed, __ATOMIC_RELAXED);
}

MI_EXPORT void medusa_trace_pause(void) {
    if (!medusa_trace_active() || __atomic_load_n(&g_paused, __ATOMIC_RELAXED))
        return;
    medusa_trace_record r = {.type = MEDUSA_EV_PAUSE};
    mi_emit(&r, NULL, 0, LIVE_NONE);
    __atomic_store_n(&g_paused, 1, __ATOMIC_RELEASE);
}

MI_EXPORT void medusa_trace_resume(void) {
    if (!medusa_trace_active() || !__atomic_exchange_n(&g_paused, 0, __ATOMIC_ACQ_REL))
        return;
    medusa_trace_record r = {.type = MEDUSA_EV_RESUME};
    mi_emit(&r, NULL, 0, LIVE_NONE);
}

MI_EXPORT void medusa_trace_mark(const char *phase) {
    if (!medusa_trace_active() || !phase)
        return;
    medusa_trace_record r = {.type = MEDUSA_EV_MARK};
    mi_emit(&r, phase, strlen(phase), LIVE_NONE);
    mi_note_phase(phase, r.seq);
    if (strcmp(phase, "ready") == 0 && mi_mode() == MEDUSA_MODE_RECORD)
        mi_snapshot_live();
    mi_flush();
}

MI_EXPORT int medusa_trace_flush(void) { return medusa_trace_active() ? mi_flush() : -1; }

MI_EXPORT const char *medusa_trace_api_name(unsigned api) {
    return api < H_COUNT ? mi_hook_name[api] : NULL;
}
