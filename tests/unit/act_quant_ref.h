/* act_quant_ref.h - the official act_quant (v4.c's fq_fp8 in blocks of
 * 128) written for the CUDA tests from dtype.c's codecs, not from v4.c: each
 * block of a row gets the scale 2^ceil(log2(max(amax, 1e-4) * fl32(1/448)))
 * and its values round to e4m3 at that scale.  gap[i] (may be NULL): the
 * relative distance of x/scale to the nearest e4m3 rounding midpoint, where a
 * device computing x in another order may round the other way. */
#ifndef TEST_ACT_QUANT_REF_H
#define TEST_ACT_QUANT_REF_H

#include <math.h>
#include <stdint.h>

#include "model/dtype.h"

static inline float aq_ref_scale(const float *x, int64_t n)
{
    float amax = 1e-4f;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    int e;
    const float f = frexpf(amax * (1.0f / 448.0f), &e);
    return ldexpf(1.0f, f == 0.5f ? e - 1 : e);
}

static inline void aq_ref_row(float *x, int64_t n, double *gap)
{
    for (int64_t b0 = 0; b0 < n; b0 += 128) {
        const int64_t b1 = b0 + 128 < n ? b0 + 128 : n;
        const float sc = aq_ref_scale(x + b0, b1 - b0);
        for (int64_t i = b0; i < b1; i++) {
            const float v = x[i] / sc, q = md_e4m3_to_f32(md_f32_to_e4m3(v));
            if (gap) { /* the neighbour on the far side of v, and the midpoint between */
                const uint8_t c = md_f32_to_e4m3(v);
                const float o = md_e4m3_to_f32((uint8_t)(fabsf(v) > fabsf(q) ? c + 1 : c - 1));
                gap[i] = fabs(fabs((double)v) - (fabs((double)q) + fabs((double)o)) / 2) / (fabs((double)v) + 1e-30);
            }
            x[i] = q * sc;
        }
    }
}

#endif
