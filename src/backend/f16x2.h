/* f16x2.h - when a block-scaled FP8 / FP4 weight is exact in f16, and at what shift.
 *
 * The bf16x3 maths multiplies an fp32 activation x by an exact bf16 copy of the weight in three bf16 planes of x
 * (8 + 8 + 8 significant bits).  Two f16 planes carry 11 + 11 bits with the rounding of the first giving the
 * second a sign, so x to about 2^-22 of each element, in two thirds of the tensor-core work.  f16's exponent range
 * is short (normal from 2^-14, largest 65504), so both operands go over scaled by powers of two:
 *   - x row by row (the row's largest magnitude to [2^14, 2^15): bcu_split_f16x2), undone after the GEMM;
 *   - the weight by one shift G for the whole matrix: element = code * 2^(s - 127 + G) for its ue8m0 scale byte s.
 * This header says for which scale bytes one G makes every element of the weight an f16 value exactly, and picks
 * the largest such G (the small elements furthest from f16's subnormals).
 *
 * e4m3 values are m * 2^e with m < 16 and e in [-9, 5] (448 = 14 * 2^5 the largest); e2m1 values are m * 2^-1
 * with m < 16 too (6 the largest).  An f16 holds m * 2^e exactly when its lowest set bit is at 2^-24 or above and
 * it is at most 65504.  So, over the weight's scale bytes s:
 *   FP8: s + G >= 112 (the lowest bit 2^(-9 + s - 127 + G) >= 2^-24) and s + G <= 134 (448 * 2^7 = 57344);
 *   FP4: s + G >= 104 (2^(-1 + s - 127 + G) >= 2^-24) and s + G <= 140 (6 * 2^13 = 49152).
 * One G serves iff max(s) - min(s) <= 22 (FP8) or 36 (FP4); G = 134 - max(s) or 140 - max(s).  A scale byte 255
 * (NaN) serves none.  In those ranges 2^(s - 127 + G) is a normal fp32, so the device forms it as ue8m0(s + G).
 *
 * Plain C, no CUDA: the rule is checked on the build machine (tests/unit/test_f16x2.c) and used at weight upload
 * (src/backend/cuda/cuda.cu). */
#ifndef DEEPINFER_BACKEND_F16X2_H
#define DEEPINFER_BACKEND_F16X2_H

#include <stddef.h>
#include <stdint.h>

#define F16X2_NONE (-1000) /* no shift makes the weight exact in f16 */

/* the bounds on s + G for the format: fp4 != 0 e2m1, else e4m3 */
static inline int f16x2_lo(int fp4) { return fp4 ? 104 : 112; }
static inline int f16x2_hi(int fp4) { return fp4 ? 140 : 134; }

/* the shift G for a weight whose n ue8m0 scale bytes are sc (every byte a block of the weight uses), or F16X2_NONE */
static inline int f16x2_shift(int fp4, const uint8_t *sc, size_t n)
{
    if (!sc || !n) return F16X2_NONE;
    int lo = 255, hi = 0;
    for (size_t i = 0; i < n; i++) {
        const int s = sc[i];
        if (s == 255) return F16X2_NONE;
        if (s < lo) lo = s;
        if (s > hi) hi = s;
    }
    const int G = f16x2_hi(fp4) - hi;
    return lo + G >= f16x2_lo(fp4) ? G : F16X2_NONE;
}

#endif
