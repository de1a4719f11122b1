/* simcudaParallel: a kernel's independent parts on several host threads, as a GPU runs a kernel's
 * blocks on many SMs at once. The kernel's own thread takes parts too; the others come from a
 * pool started at the first call: MEDUSA_SIM_THREADS threads in all (default: the CPUs this
 * process may run on, at most MAX_THREADS). A fault or trap in any part is the kernel's, raised
 * on its thread once every part under way has ended. Under a checker that watches one thread
 * (memcheck, racecheck, access tracing) or the slowdown, outside a kernel, or while another
 * kernel holds the pool, the parts run one after another on the calling thread. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

enum { MAX_THREADS = 16 };

typedef struct {
    void (*fn)(void *, int);
    void *arg;
    int parts;
    _Atomic int next;
    _Atomic int failed;   /* a part faulted: no more are started */
    sim_part_fault fault; /* the first one's (written once, by whoever set failed) */
} job_t;

static struct {
    pthread_mutex_t lock; /* the fields below */
    pthread_mutex_t busy; /* held by the kernel whose parts the pool runs */
    pthread_cond_t work, done;
    pid_t pid; /* the process that started the helpers (a forked child starts its own) */
    int helpers;
    unsigned long generation; /* one per job: a helper takes each exactly once */
    int running;              /* helpers not yet done with the current job */
    job_t *job;
} g_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
            PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL};

static void run_parts(job_t *j) {
    int i;
    while (!atomic_load(&j->failed) && (i = atomic_fetch_add(&j->next, 1)) < j->parts) {
        sim_part_fault f;
        if (sim_part_run(j->fn, j->arg, i, &f) && !atomic_exchange(&j->failed, 1))
            j->fault = f;
    }
}

/* START: the generation when it was made (a job published before it runs is still its). */
static void *helper(void *start) {
    unsigned long seen = (unsigned long)(uintptr_t)start;
    pthread_mutex_lock(&g_pool.lock);
    for (;;) {
        while (g_pool.generation == seen)
            pthread_cond_wait(&g_pool.work, &g_pool.lock);
        seen = g_pool.generation;
        job_t *j = g_pool.job;
        pthread_mutex_unlock(&g_pool.lock);
        run_parts(j);
        pthread_mutex_lock(&g_pool.lock);
        if (--g_pool.running == 0)
            pthread_cond_signal(&g_pool.done);
    }
    return NULL;
}

static int wanted_threads(void) {
    const char *e = getenv("MEDUSA_SIM_THREADS");
    int n = e && atoi(e) > 0 ? atoi(e) : 0;
    cpu_set_t set;
    if (n == 0)
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return n < MAX_THREADS ? n : MAX_THREADS;
}

/* Under g_pool.lock. Helpers block every signal but a fault's: those are the kernel's. */
static void start_helpers(void) {
    g_pool.pid = getpid();
    g_pool.helpers = 0;
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 1; i < wanted_threads(); i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, helper, (void *)(uintptr_t)g_pool.generation) != 0)
            break;
        pthread_detach(t);
        g_pool.helpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

SIMCUDA_EXPORT void simcudaParallel(int parts, void (*fn)(void *, int), void *arg) {
    if (parts <= 0 || !fn)
        return;
    if (parts == 1 || !sim_parts_parallel() || pthread_mutex_trylock(&g_pool.busy) != 0) {
        for (int i = 0; i < parts; i++)
            fn(arg, i);
        return;
    }
    job_t j = {fn, arg, parts, 0, 0, {0}};
    pthread_mutex_lock(&g_pool.lock);
    if (g_pool.pid != getpid())
        start_helpers();
    g_pool.job = &j;
    g_pool.running = g_pool.helpers;
    g_pool.generation++;
    pthread_cond_broadcast(&g_pool.work);
    pthread_mutex_unlock(&g_pool.lock);
    run_parts(&j);
    pthread_mutex_lock(&g_pool.lock);
    while (g_pool.running > 0)
        pthread_cond_wait(&g_pool.done, &g_pool.lock);
    g_pool.job = NULL;
    pthread_mutex_unlock(&g_pool.lock);
    pthread_mutex_unlock(&g_pool.busy);
    if (atomic_load(&j.failed))
        sim_part_raise(&j.fault);
}
