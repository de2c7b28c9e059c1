/* vec.h - growable arrays of int32 ids and of bytes.
 *
 * Both are plain structs the caller owns ({0} is a valid empty value) and
 * frees with the matching *_free.  Growth is geometric; push functions return
 * RC_ENOMEM instead of aborting so a server can fail one request, not all. */
#ifndef BASE_VEC_H
#define BASE_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"

typedef struct rc_ids {
    int32_t *v;
    size_t n, cap;
} rc_ids;

typedef struct rc_bytes {
    char *v;
    size_t n, cap;
} rc_bytes;

static inline int rc_ids_reserve(rc_ids *a, size_t extra) {
    if (a->n + extra <= a->cap) return 0;
    size_t cap = a->cap ? a->cap : 64;
    while (cap < a->n + extra) cap *= 2;
    int32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) return RC_ENOMEM;
    a->v = v;
    a->cap = cap;
    return 0;
}

static inline int rc_ids_push(rc_ids *a, int32_t x) {
    if (a->n == a->cap && rc_ids_reserve(a, 1)) return RC_ENOMEM;
    a->v[a->n++] = x;
    return 0;
}

static inline int rc_ids_append(rc_ids *a, const int32_t *x, size_t n) {
    if (rc_ids_reserve(a, n)) return RC_ENOMEM;
    if (n) memcpy(a->v + a->n, x, n * sizeof *x);
    a->n += n;
    return 0;
}

static inline void rc_ids_free(rc_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

static inline int rc_bytes_reserve(rc_bytes *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0; /* +1 keeps room for a NUL */
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *v = realloc(b->v, cap);
    if (!v) return RC_ENOMEM;
    b->v = v;
    b->cap = cap;
    return 0;
}

static inline int rc_bytes_append(rc_bytes *b, const void *p, size_t n) {
    if (rc_bytes_reserve(b, n)) return RC_ENOMEM;
    if (n) memcpy(b->v + b->n, p, n);
    b->n += n;
    b->v[b->n] = 0;
    return 0;
}

static inline void rc_bytes_free(rc_bytes *b) {
    free(b->v);
    b->v = NULL;
    b->n = b->cap = 0;
}

#endif
