/* parallel.h - the CPU's threads (parallel.c), part of the core.
 */
#ifndef NECTAR_PARALLEL_H
#define NECTAR_PARALLEL_H

/* The CPU's parallelism is one pool of threads, the caller among them;
 * OpenBLAS runs single-threaded inside its tasks (parallel_set_threads and
 * the first parallel_for set it so). parallel_for runs task(ctx, i) for
 * i = 0 .. n_tasks - 1, in any order and on any of the pool's threads, and
 * returns when all are done; a call made inside a task, or while another
 * thread's call runs, runs its tasks in the caller, one after another. */
typedef void (*ParallelTask)(void *ctx, int task);
void parallel_for(int n_tasks, ParallelTask task, void *ctx);
/* The pool's size, the caller included: 0 is one thread per online CPU (the
 * default), 1 runs every task in the caller. -1 with a sentence when out of
 * range. */
int  parallel_set_threads(int n);
int  parallel_threads(void);

#endif
