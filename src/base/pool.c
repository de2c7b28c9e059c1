/* pool.c - persistent worker threads for fork-join parallel loops.
 *
 * Workers sleep on a condition variable until a job generation bumps; each
 * job is a (fn, arg, n) triple whose indices are handed out through an atomic
 * counter.  The caller works too and then waits until every worker has left
 * the job, so the job's stack-allocated arg stays valid for its whole life.
 * Persistent threads matter: the tokenizer's BPE caches are per thread, and a
 * pool that keeps its threads keeps its caches warm across requests. */
#include "base/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct rc_pool {
    int nthreads;
    pthread_t *th;
    pthread_mutex_t run_lock; /* one rc_pool_run at a time */
    pthread_mutex_t mu;       /* guards everything below */
    pthread_cond_t cv_work, cv_done;
    unsigned long gen;        /* bumped per job */
    int busy;                 /* workers still inside the current job */
    int stop;
    rc_task_fn fn;
    void *arg;
    size_t n;
    atomic_size_t next;
};

static void drain(rc_pool *p, rc_task_fn fn, void *arg, size_t n) {
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= n) break;
        fn(arg, i);
    }
}

static void *worker(void *vp) {
    rc_pool *p = vp;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        rc_task_fn fn = p->fn;
        void *arg = p->arg;
        size_t n = p->n;
        pthread_mutex_unlock(&p->mu);
        drain(p, fn, arg, n);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

rc_pool *rc_pool_create(int nthreads) {
    if (nthreads < 1) nthreads = 1;
    rc_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (nthreads > 1) {
        p->th = calloc((size_t)nthreads - 1, sizeof *p->th);
        if (!p->th) {
            free(p);
            return NULL;
        }
        for (int i = 0; i < nthreads - 1; i++) {
            if (pthread_create(&p->th[i], NULL, worker, p) != 0) {
                p->nthreads = i + 1; /* run with what we got */
                break;
            }
        }
    }
    return p;
}

int rc_pool_threads(const rc_pool *p) { return p ? p->nthreads : 1; }

void rc_pool_run(rc_pool *p, size_t n, rc_task_fn fn, void *arg) {
    if (!p || p->nthreads == 1 || n <= 1) {
        for (size_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store(&p->next, 0);
    p->busy = p->nthreads - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    drain(p, fn, arg, n);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_lock);
}

void rc_pool_destroy(rc_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}
