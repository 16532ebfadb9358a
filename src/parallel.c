/* parallel.c - the CPU's threads: one pool of workers that run the tasks of
 * one parallel_for at a time, the calling thread among them.
 *
 * OpenBLAS runs single-threaded inside every task: its own threads would
 * compete with the pool's for the same cores (after a call they spin,
 * waiting for the next one, while the pool's threads want to run the loops
 * between the calls). So the pool is the only parallelism: the products of
 * src/kernels.c split their output over it, and so do the loops around them.
 *
 * How a parallel_for runs: the caller writes the job (task, ctx), then one
 * 64-bit ticket, (generation << 40) | (n_tasks << 20) | next task, then the
 * generation, which the idle workers watch; it wakes the ones that sleep
 * and claims tasks like any worker. A task is claimed by a compare-and-swap
 * on the ticket that keeps its generation, so a worker holding an older job
 * can never claim a task of a newer one: a successful claim also proves
 * that the job it read had not been replaced (the caller writes a new job
 * only after every task of the last one was claimed and has finished). The
 * caller returns when every task has finished. Between jobs a worker spins
 * for a while (a decode step runs hundreds of short jobs, and waking a
 * sleeping thread costs more than one of them), then sleeps on a condition
 * variable.
 */
#include "parallel.h"
#include "util.h"

#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_THREADS = 64, MAX_TASKS = (1 << 20) - 1 };
/* how long an idle worker spins before it sleeps */
#define SPIN_SECONDS 2e-3

static struct {
    pthread_mutex_t lock;          /* guards starting workers and sleeping on `wake` */
    pthread_cond_t wake;           /* broadcast when a job is published while workers sleep */
    atomic_int threads;            /* the pool's size, the caller included; 0: not chosen yet */
    int workers;                   /* worker threads running (threads - 1 at most take part) */
    atomic_int sleeping;           /* workers waiting on `wake` */
    atomic_int busy;               /* 1 while a parallel_for runs: a nested or concurrent one runs inline */
    atomic_uint generation;        /* the job's number (24 bits) */
    _Atomic(ParallelTask) task;    /* the job: task(ctx, i) for every i, on job_threads threads */
    _Atomic(void *) ctx;
    atomic_int job_threads;
    _Atomic uint64_t ticket;       /* (generation << 40) | (n_tasks << 20) | the next unclaimed task */
    atomic_int finished;           /* tasks of this generation done */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

/* Claims and runs tasks of generation `gen` until none is left. */
static void run_tasks(unsigned gen, ParallelTask task, void *ctx) {
    uint64_t t = atomic_load(&pool.ticket);
    while ((unsigned)(t >> 40) == gen && (t & MAX_TASKS) < ((t >> 20) & MAX_TASKS)) {
        if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;  /* t reloaded */
        task(ctx, (int)(t & MAX_TASKS));
        atomic_fetch_add(&pool.finished, 1);
        t = atomic_load(&pool.ticket);
    }
}

/* Returns the generation once it differs from `seen`: spinning first, then
 * asleep on the condition variable. */
static unsigned wait_for_job(unsigned seen) {
    double t0 = now_seconds();
    for (long i = 1;; i++) {
        unsigned gen = atomic_load(&pool.generation);
        if (gen != seen) return gen;
        if (i % 1024 == 0 && now_seconds() - t0 > SPIN_SECONDS) break;
    }
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(&pool.sleeping, 1);  /* before the check: the caller reads it after publishing */
    while (atomic_load(&pool.generation) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
    atomic_fetch_sub(&pool.sleeping, 1);
    pthread_mutex_unlock(&pool.lock);
    return atomic_load(&pool.generation);
}

static void *worker_main(void *arg) {
    int index = (int)(intptr_t)arg;  /* 1 .. threads - 1; the caller is 0 */
    unsigned seen = atomic_load(&pool.generation);
    for (;;) {
        seen = wait_for_job(seen);
        ParallelTask task = atomic_load(&pool.task);
        void *ctx = atomic_load(&pool.ctx);
        if (index < atomic_load(&pool.job_threads)) run_tasks(seen, task, ctx);
    }
    return NULL;
}

/* A forked child has only the thread that forked: its pool starts again. */
static void pool_after_fork_in_child(void) {
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pool.workers = 0;
    atomic_store(&pool.sleeping, 0);
    atomic_store(&pool.busy, 0);
}

/* OpenBLAS built for many CPUs (DYNAMIC_ARCH, as Debian's is) picks its
 * kernels by the CPU's model, and a model newer than the library gets its
 * generic SSE3 ones, "Prescott": Debian 12's 0.3.21 on an Emerald Rapids
 * Xeon (model 207) runs sgemm at 31 GFLOP/s on 2 cores there, against 190
 * with its AVX-512 ("SkylakeX") kernels. Nothing is wrong but the speed,
 * so say it once, with the setting that fixes it. */
static void warn_generic_blas(void) {
    const char *fast = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
    if (!fast || getenv("OPENBLAS_CORETYPE") || strcmp(openblas_get_corename(), "Prescott") != 0) return;
    fprintf(stderr, "warning: OpenBLAS does not know this CPU and runs its generic SSE3 kernels (Prescott), several "
            "times slower than its %s ones, which this CPU can run: OPENBLAS_CORETYPE=%s selects them (make demo, "
            "demo-real, bench and scripts/results.sh set it)\n", fast, fast);
}

static void pool_setup(void) {
    pthread_atfork(NULL, NULL, pool_after_fork_in_child);
    warn_generic_blas();
}

static int online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
}

int parallel_set_threads(int n) {
    if (n < 0 || n > MAX_THREADS) {
        fprintf(stderr, "error: %d threads: the pool takes 0 (one per CPU) to %d\n", n, MAX_THREADS);
        return -1;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_setup);
    openblas_set_num_threads(1);  /* the pool is the only parallelism */
    atomic_store(&pool.threads, n ? n : online_cpus());
    return 0;
}

int parallel_threads(void) {
    if (atomic_load(&pool.threads) == 0) parallel_set_threads(0);
    return atomic_load(&pool.threads);
}

/* Starts workers until threads - 1 are running. */
static void start_workers(int threads) {
    pthread_mutex_lock(&pool.lock);
    while (pool.workers < threads - 1) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker_main, (void *)(intptr_t)(pool.workers + 1)) != 0) break;
        pthread_detach(thread);
        pool.workers++;
    }
    pthread_mutex_unlock(&pool.lock);
}

void parallel_for(int n_tasks, ParallelTask task, void *ctx) {
    int threads = parallel_threads();
    if (n_tasks <= 0) return;
    /* one thread, one task, more tasks than a ticket holds, or called from
     * a task or while another thread's parallel_for runs: the tasks run
     * here, in order */
    if (threads == 1 || n_tasks == 1 || n_tasks > MAX_TASKS || atomic_exchange(&pool.busy, 1)) {
        for (int i = 0; i < n_tasks; i++) task(ctx, i);
        return;
    }
    if (pool.workers < threads - 1) start_workers(threads);
    unsigned gen = (atomic_load(&pool.generation) + 1) & 0xffffff;
    atomic_store(&pool.task, task);
    atomic_store(&pool.ctx, ctx);
    atomic_store(&pool.job_threads, threads);
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.ticket, (uint64_t)gen << 40 | (uint64_t)n_tasks << 20);
    atomic_store(&pool.generation, gen);
    if (atomic_load(&pool.sleeping) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    run_tasks(gen, task, ctx);
    /* wait for the tasks other threads claimed, spinning: the pool's threads
     * are on other cores, and yielding this one hands it to another process
     * (a decode step took 16 ms at best with a yield after 4096 spins, 14
     * without); only past a millisecond (more threads than cores) yield */
    double t0 = 0;
    for (long i = 1; atomic_load(&pool.finished) < n_tasks; i++)
        if (i % 1024 == 0) {
            if (t0 == 0) t0 = now_seconds();
            else if (now_seconds() - t0 > 1e-3) sched_yield();
        }
    atomic_store(&pool.busy, 0);
}
