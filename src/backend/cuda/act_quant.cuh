/* act_quant.cuh - v4.c's FP8 act_quant on the device, bit for bit: the e4m3 codec of src/model/dtype.c and
 * pow2_ceil.  graph.cu's fq kernel and the row-dots' fused act_quant (kernels.cu, bcu_rowdot_args.xq = 2) both use
 * these, so the two quantise alike: the row-dots through the conversion instructions (aq_e4m3x2_h), which
 * test_e4m3_cvt finds equal to the software codec on every float.  Internal to each file that includes it. */
#ifndef DEEPINFER_CUDA_ACT_QUANT_CUH
#define DEEPINFER_CUDA_ACT_QUANT_CUH

#include <stdint.h>

namespace {

__device__ __forceinline__ float gr_dec_e4m3(uint32_t b)
{
    const uint32_t sign = (b & 0x80u) << 24;
    const uint32_t em = b & 0x7fu;
    uint32_t v = em < 8 ? __float_as_uint(__fmul_rn((float)em, 1.953125e-3f)) /* m/8 * 2^-6 */
                        : (em << 20) + (120u << 23);
    if (em == 0x7fu) v = 0x7fc00000u;
    return __uint_as_float(v | sign);
}

/* md_f32_to_e4m3: nearest even, saturating to +-448 (inf too), NaN -> 0x7f */
__device__ __forceinline__ uint32_t gr_enc_e4m3(float f)
{
    uint32_t u = __float_as_uint(f);
    const uint32_t sign = (u >> 24) & 0x80u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0x7fu;
    if (u >= 0x43e00000u) return sign | 0x7eu;
    if (u < 0x3c800000u) { /* < 2^-6: the ulp of 2^14 is the subnormal step 2^-9 */
        const float t = __fadd_rn(__uint_as_float(u), 16384.0f);
        return sign | ((__float_as_uint(t) - 0x46800000u) & 0xffu);
    }
    u += 0x7ffffu + ((u >> 20) & 1u);
    return sign | (((u - (120u << 23)) >> 20) & 0xffu);
}

/* the f16 values of two e4m3 codes, gr_enc_e4m3 then gr_dec_e4m3 of lo and hi (low and high half), in two
 * instructions: the H200's conversions round to nearest even and saturate to +-448 (inf too), as gr_enc_e4m3 does
 * (bcu_e4m3_cvt_check compares them over every float: on the H200 none differs; the test would let a NaN come back
 * with the other sign) */
__device__ __forceinline__ uint32_t aq_e4m3x2_h(float lo, float hi)
{
    uint16_t c;
    uint32_t h;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(hi), "f"(lo));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(c));
    return h;
}

/* v4.c pow2_ceil: 2^ceil(log2 v) through frexpf/ldexpf (exact on the device too) */
__device__ __forceinline__ float gr_pow2_ceil(float v)
{
    int e;
    const float f = frexpf(v, &e);
    return ldexpf(1.0f, f == 0.5f ? e - 1 : e);
}

/* the act_quant scale of a block whose largest |x| is amax (v4.c fq_fp8: amax starts at 1e-4, the kernels
 * multiply by 1/448) */
__device__ __forceinline__ float aq_scale_e4m3(float amax) { return gr_pow2_ceil(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f)); }

/* the act_quant scale of a block of 128 values a warp holds as one float4 a lane (the warp's amax, then
 * aq_scale_e4m3); every lane gets it */
__device__ __forceinline__ float aq_warp_scale_e4m3(float4 v)
{
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    return aq_scale_e4m3(amax);
}

/* 1 / sc for a scale of gr_pow2_ceil: a power of two, so its reciprocal is exact (2^-127 included, a subnormal)
 * and x * aq_inv(sc) rounds the same real number as x / sc does; one multiply where IEEE division costs a dozen
 * instructions (for sc = inf or NaN the two agree as well) */
__device__ __forceinline__ float aq_inv(float sc) { return __frcp_rn(sc); }

} /* namespace */

#endif
