/* rmsnorm.cuh - the RMSNorm of one row by one block: kernels.cu's rmsnorm_kernel and graph.cu's fused mHC pre +
 * norm (gr_hc_pre_norm_kernel) both use it, so the two give a row the same bits.  Internal to each file that
 * includes it. */
#ifndef DEEPINFER_CUDA_RMSNORM_CUH
#define DEEPINFER_CUDA_RMSNORM_CUH

#include <stddef.h>

#define RMS_KEEP 4 /* elements a thread keeps in registers between the two passes */
/* threads a row: a function of dim alone (1024 from dim 2048: a decode step's single row is then 4 independent loads
 * per thread instead of a chain of 16), so a row's result never depends on the batch */
#define RMS_NT(dim) ((dim) >= 2048 ? 1024 : 256)

namespace {

/* 1 / sqrt(mean square + eps) of a row of dim elements, the sum of squares in double (as the CPU reference): thread
 * tid's elements tid + k NT, k < RMS_KEEP, are keep[k] (zero past dim), the ones from RMS_KEEP NT on are read from
 * xr (unused when dim <= RMS_KEEP NT); its partial sums its elements in that order, then a warp butterfly and the
 * warps' partials in warp order.  part: NT / 32 doubles of shared memory.  Every thread of the block calls it (one
 * barrier inside). */
template <int NT>
__device__ __forceinline__ float rms_row_inv(const float (&keep)[RMS_KEEP], const float *xr, size_t dim, float eps,
                                             double *part)
{
    double ss = 0;
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) ss += (double)keep[k] * keep[k];
    for (size_t i = threadIdx.x + (size_t)RMS_KEEP * NT; i < dim; i += NT) ss += (double)xr[i] * xr[i];
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0;
    for (int k = 0; k < NT / 32; k++) tot += part[k];
    return 1.0f / sqrtf((float)(tot / (double)dim) + eps);
}

} // namespace

#endif
