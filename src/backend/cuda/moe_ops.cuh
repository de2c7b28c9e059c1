/* moe_ops.cuh - scalar pieces the FP4 kernels share (moe.cu, moe_wg.cu, dequant.cu): the ue8m0 scale and v4.c's
 * clamped SwiGLU, bit for bit.  Internal to each file that includes it. */
#ifndef DEEPINFER_CUDA_MOE_OPS_CUH
#define DEEPINFER_CUDA_MOE_OPS_CUH

#include <stdint.h>

namespace {

/* dtype.c's md_ue8m0_to_f32: 2^(b-127), b = 0 the subnormal 2^-127, 255 NaN */
__device__ __forceinline__ float ue8m0(uint32_t b)
{
    uint32_t u = b << 23;
    if (b == 0) u = 0x00400000u;
    if (b == 255) u |= 1u << 22;
    return __uint_as_float(u);
}

/* v4.c's swiglu, operation for operation */
__device__ __forceinline__ float swiglu1(float g, float u, float limit)
{
    if (limit > 0.0f) {
        g = fminf(g, limit);
        u = fmaxf(-limit, fminf(u, limit));
    }
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

} /* namespace */

#endif
