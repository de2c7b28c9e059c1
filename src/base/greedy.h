/* greedy.h - the greedy token of a row of logits, one rule for the whole
 * engine: the first index of the largest value, NaN counted as -inf, 0 when
 * nothing beats -inf.  The sampler's temperature-0 draw (engine/sampler.c),
 * the model's top1 segments (model/v4.c) and the device's bcu_argmax all give
 * this. */
#ifndef BASE_GREEDY_H
#define BASE_GREEDY_H

#include <math.h>
#include <stddef.h>

static inline size_t rc_greedy(const float *row, size_t n)
{
    size_t best = 0;
    float bv = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        const float v = isnan(row[i]) ? -INFINITY : row[i];
        if (v > bv) {
            bv = v;
            best = i;
        }
    }
    return best;
}

#endif
