/* sample_rows.h - the sampling benchmarks' synthetic logits rows and timing helpers (bench_sampler,
 * bench_gpu_sample), so that both measure the same rows.
 *
 *   kind 0, flat       uniform in [-4, 4]: nothing far below the top (a random-weight model's rows)
 *   kind 1, body+head  a Gaussian body (sd 2.5) under eight tokens 15-22 above its mean (a model unsure between a few
 *                      continuations)
 *   kind 2, confident  the same body under one token 35 above it */
#ifndef BENCH_SAMPLE_ROWS_H
#define BENCH_SAMPLE_ROWS_H

#include <math.h>
#include <stdint.h>
#include <time.h>

#include "engine/sampler.h"

static inline double sr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double sr_unif(uint64_t *st) { return (double)(eng_rng_next(st) >> 11) * 0x1.0p-53; }
static inline double sr_gauss(uint64_t *st)
{
    const double u = sr_unif(st) + 0x1.0p-60, v = sr_unif(st);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* row l of n logits of the given kind (above), from seed */
static inline void sr_make_row(float *l, int n, int kind, uint64_t seed)
{
    uint64_t st = eng_rng_init(seed);
    for (int i = 0; i < n; i++) l[i] = kind == 0 ? (float)(8.0 * sr_unif(&st) - 4.0) : (float)(2.5 * sr_gauss(&st));
    if (kind == 1)
        for (int h = 0; h < 8; h++) l[(int)(sr_unif(&st) * n)] = (float)(15.0 + 7.0 * sr_unif(&st));
    if (kind == 2) l[(int)(sr_unif(&st) * n)] = 35.0f;
}

/* qsort's comparison of doubles, ascending */
static inline int sr_cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#endif
