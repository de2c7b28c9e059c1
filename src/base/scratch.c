/* scratch.c - see scratch.h.  One pthread key holds a small per-thread table;
 * its destructor frees every slot when the thread ends. */
#include "base/scratch.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    void *p[RC_SCRATCH_SLOTS];
    size_t cap[RC_SCRATCH_SLOTS];
} table;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void destroy(void *arg)
{
    table *t = arg;
    for (int i = 0; i < RC_SCRATCH_SLOTS; i++) free(t->p[i]);
    free(t);
}

static void make_key(void) { pthread_key_create(&key, destroy); }

void *rc_scratch(int slot, size_t bytes)
{
    pthread_once(&once, make_key);
    table *t = pthread_getspecific(key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t || pthread_setspecific(key, t)) {
            free(t);
            return NULL;
        }
    }
    if (bytes > t->cap[slot]) {
        free(t->p[slot]);
        t->p[slot] = malloc(bytes);
        t->cap[slot] = t->p[slot] ? bytes : 0;
    }
    return t->p[slot];
}
