/* pool.h - a fixed thread pool with one operation: run n tasks and wait.
 *
 * rc_pool_run(pool, n, fn, arg) calls fn(arg, i) for every i in [0, n) on the
 * pool's workers *and the calling thread*, and returns when all are done.
 * Tasks are claimed with an atomic counter, so uneven tasks balance.  One
 * rc_pool_run at a time per pool (a mutex serialises concurrent callers). */
#ifndef BASE_POOL_H
#define BASE_POOL_H

#include <stddef.h>

typedef struct rc_pool rc_pool;
typedef void (*rc_task_fn)(void *arg, size_t i);

/* nthreads counts the caller: nthreads=1 creates no worker threads. */
rc_pool *rc_pool_create(int nthreads);
void rc_pool_destroy(rc_pool *p);
int rc_pool_threads(const rc_pool *p);
void rc_pool_run(rc_pool *p, size_t n, rc_task_fn fn, void *arg);

#endif
