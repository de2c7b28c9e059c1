/* kernels.cu - the CUDA backend's own kernels: a dequantising row-dot for
 * weights cuBLAS cannot take as they are (FP8 e4m3 with block scales, packed
 * FP4 e2m1 with ue8m0 1xN scales, f16), RMSNorm, and the small conversions
 * around the cuBLAS GEMMs.
 *
 * The decoders are bit-for-bit those of src/model/dtype.c (e4m3fn with its
 * subnormals and NaN, ue8m0 with 2^-127 as an f32 subnormal), and the scale
 * is applied by one fp32 multiply as there, so every weight the GPU sees is
 * the f32 value the CPU reference sees.  Nothing is built with fast-math:
 * subnormals are kept and sqrtf/division are IEEE.
 *
 * bcu_rowdot is batch-invariant: the order in which a warp sums output o for
 * token t does not depend on T or on which tile t falls in.  It is the simple
 * correct kernel (issue 7 still wants the grouped FP4 expert GEMM); it reads
 * each weight row once per tile of BCU_TT tokens. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

#define BCU_WARPS 4 /* warps (output rows) per block */
#define BCU_TT 8    /* tokens per warp */

/* ---- decoders (src/model/dtype.c) */

__device__ __forceinline__ float dec_e4m3(uint32_t b)
{
    uint32_t sign = (b & 0x80u) << 24;
    uint32_t em = b & 0x7fu;
    uint32_t v = em < 8 ? __float_as_uint((float)em * 1.953125e-3f) /* m/8 * 2^-6 */
                        : (em << 20) + (120u << 23);
    if (em == 0x7fu) v = 0x7fc00000u;
    return __uint_as_float(v | sign);
}

__device__ __forceinline__ float dec_fp4(uint32_t c)
{
    uint32_t sign = (c & 8u) << 28;
    uint32_t em = c & 7u;
    uint32_t v = em < 2 ? __float_as_uint((float)em * 0.5f) : (em << 22) + (126u << 23);
    return __uint_as_float(v | sign);
}

__device__ __forceinline__ float dec_ue8m0(uint32_t b)
{
    uint32_t u = b << 23;
    if (b == 0) u = 0x00400000u; /* 2^-127 */
    if (b == 255) u |= 1u << 22; /* NaN */
    return __uint_as_float(u);
}

__device__ __forceinline__ float dec_bf16(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float scale_at(const void *s, int dt, size_t i)
{
    switch (dt) {
    case BCU_SC_E8M0: return dec_ue8m0(((const uint8_t *)s)[i]);
    case BCU_SC_F32: return ((const float *)s)[i];
    default: return dec_bf16(((const uint16_t *)s)[i]);
    }
}

/* ---- the row-dot */

struct RowArgs {
    const void *w, *scale;
    int sc_dtype, block;
    int64_t wcols, nsb; /* FP8: scale blocks per scale row */
    int64_t r0, n, c0, K, T;
    const float *x;
    float *y;
};

/* W[r, c] as f32 */
template <int FMT>
__device__ __forceinline__ float wget(const RowArgs &a, int64_t r, int64_t c)
{
    if (FMT == BCU_RW_BF16) return dec_bf16(((const uint16_t *)a.w)[r * a.wcols + c]);
    if (FMT == BCU_RW_F16) return __half2float(((const __half *)a.w)[r * a.wcols + c]);
    if (FMT == BCU_RW_F32) return ((const float *)a.w)[r * a.wcols + c];
    if (FMT == BCU_RW_FP8)
        return dec_e4m3(((const uint8_t *)a.w)[r * a.wcols + c]) *
               scale_at(a.scale, a.sc_dtype, (size_t)((r / a.block) * a.nsb + c / a.block));
    /* FP4: element 2k in the low nibble of byte k */
    uint32_t byte = ((const uint8_t *)a.w)[r * (a.wcols / 2) + c / 2];
    return dec_fp4(c & 1 ? byte >> 4 : byte & 15u) *
           dec_ue8m0(((const uint8_t *)a.scale)[r * (a.wcols / a.block) + c / a.block]);
}

/* W[r, c..c+7] as f32; c % 8 == 0, wcols % 8 == 0, and (quantised) the 8
 * lie in one scale block.  One 16/8/4-byte load per lane. */
template <int FMT>
__device__ __forceinline__ void wget8(const RowArgs &a, int64_t r, int64_t c, float *v)
{
    if (FMT == BCU_RW_BF16 || FMT == BCU_RW_F16) {
        uint4 q = *(const uint4 *)((const uint16_t *)a.w + r * a.wcols + c);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (FMT == BCU_RW_BF16) {
                v[2 * k] = dec_bf16(u[k] & 0xffffu);
                v[2 * k + 1] = dec_bf16(u[k] >> 16);
            } else {
                v[2 * k] = __half2float(__ushort_as_half((unsigned short)(u[k] & 0xffffu)));
                v[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(u[k] >> 16)));
            }
        }
    } else if (FMT == BCU_RW_F32) {
        const float4 *p = (const float4 *)((const float *)a.w + r * a.wcols + c);
        float4 p0 = p[0], p1 = p[1];
        v[0] = p0.x; v[1] = p0.y; v[2] = p0.z; v[3] = p0.w;
        v[4] = p1.x; v[5] = p1.y; v[6] = p1.z; v[7] = p1.w;
    } else if (FMT == BCU_RW_FP8) {
        uint2 q = *(const uint2 *)((const uint8_t *)a.w + r * a.wcols + c);
        float s = scale_at(a.scale, a.sc_dtype, (size_t)((r / a.block) * a.nsb + c / a.block));
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = dec_e4m3((q.x >> (8 * k)) & 0xffu) * s;
            v[4 + k] = dec_e4m3((q.y >> (8 * k)) & 0xffu) * s;
        }
    } else {
        uint32_t q = *(const uint32_t *)((const uint8_t *)a.w + r * (a.wcols / 2) + c / 2);
        float s = dec_ue8m0(((const uint8_t *)a.scale)[r * (a.wcols / a.block) + c / a.block]);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = dec_fp4((q >> (4 * k)) & 15u) * s;
    }
}

template <int FMT, bool VEC>
__global__ void __launch_bounds__(32 * BCU_WARPS) rowdot_kernel(RowArgs a)
{
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * BCU_WARPS + (threadIdx.x >> 5);
    if (o >= a.n) return; /* warp-uniform */
    const int64_t t0 = (int64_t)blockIdx.y * BCU_TT;
    const int64_t nt = a.T - t0 < BCU_TT ? a.T - t0 : BCU_TT;
    const int64_t r = a.r0 + o;
    float acc[BCU_TT];
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) acc[i] = 0.0f;
    if (VEC) {
        for (int64_t j = (int64_t)lane * 8; j < a.K; j += 32 * 8) {
            float wv[8];
            wget8<FMT>(a, r, a.c0 + j, wv);
#pragma unroll
            for (int i = 0; i < BCU_TT; i++) {
                if (i < nt) {
                    const float4 *xp = (const float4 *)(a.x + (t0 + i) * a.K + j);
                    float4 x0 = xp[0], x1 = xp[1];
                    float s = acc[i];
                    s = fmaf(wv[0], x0.x, s); s = fmaf(wv[1], x0.y, s);
                    s = fmaf(wv[2], x0.z, s); s = fmaf(wv[3], x0.w, s);
                    s = fmaf(wv[4], x1.x, s); s = fmaf(wv[5], x1.y, s);
                    s = fmaf(wv[6], x1.z, s); s = fmaf(wv[7], x1.w, s);
                    acc[i] = s;
                }
            }
        }
    } else {
        for (int64_t j = lane; j < a.K; j += 32) {
            float wv = wget<FMT>(a, r, a.c0 + j);
#pragma unroll
            for (int i = 0; i < BCU_TT; i++)
                if (i < nt) acc[i] = fmaf(wv, a.x[(t0 + i) * a.K + j], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) {
        float v = acc[i];
#pragma unroll
        for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && i < nt) a.y[(t0 + i) * a.n + o] = v;
    }
}

template <int FMT>
static cudaError_t launch_rowdot(const RowArgs &a, bool vec, cudaStream_t st)
{
    dim3 grid((unsigned)((a.n + BCU_WARPS - 1) / BCU_WARPS), (unsigned)((a.T + BCU_TT - 1) / BCU_TT));
    if (vec) rowdot_kernel<FMT, true><<<grid, 32 * BCU_WARPS, 0, st>>>(a);
    else rowdot_kernel<FMT, false><<<grid, 32 * BCU_WARPS, 0, st>>>(a);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_rowdot(const bcu_rowdot_args *p, cudaStream_t st)
{
    if (p->n <= 0 || p->T <= 0) return cudaSuccess;
    if ((p->n + BCU_WARPS - 1) / BCU_WARPS > 0x7fffffff || (p->T + BCU_TT - 1) / BCU_TT > 65535)
        return cudaErrorInvalidConfiguration;
    RowArgs a;
    a.w = p->w;
    a.scale = p->scale;
    a.sc_dtype = p->sc_dtype;
    a.block = p->block > 0 ? p->block : 1;
    a.wcols = p->wcols;
    a.nsb = (p->wcols + a.block - 1) / a.block;
    a.r0 = p->r0;
    a.n = p->n;
    a.c0 = p->c0;
    a.K = p->K;
    a.T = p->T;
    a.x = p->x;
    a.y = p->y;
    /* 8 columns per lane per step when every group of 8 is aligned, whole,
     * and (quantised formats) inside one scale block */
    bool vec = p->K % 8 == 0 && p->c0 % 8 == 0 && p->wcols % 8 == 0;
    if (p->fmt == BCU_RW_FP8 || p->fmt == BCU_RW_FP4) vec = vec && a.block % 8 == 0;
    switch (p->fmt) {
    case BCU_RW_BF16: return launch_rowdot<BCU_RW_BF16>(a, vec, st);
    case BCU_RW_F16: return launch_rowdot<BCU_RW_F16>(a, vec, st);
    case BCU_RW_F32: return launch_rowdot<BCU_RW_F32>(a, vec, st);
    case BCU_RW_FP8: return launch_rowdot<BCU_RW_FP8>(a, vec, st);
    case BCU_RW_FP4: return launch_rowdot<BCU_RW_FP4>(a, vec, st);
    }
    return cudaErrorInvalidValue;
}

/* ---- RMSNorm: one block per row; the sum of squares in double, as the CPU
 * reference does, so the two agree to the last bit nearly always */

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *y, const float *x, size_t dim, const float *w, float eps)
{
    __shared__ double part[RMS_THREADS / 32];
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    double ss = 0;
    for (size_t i = threadIdx.x; i < dim; i += RMS_THREADS) ss += (double)xr[i] * xr[i];
    for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0;
    for (int k = 0; k < RMS_THREADS / 32; k++) tot += part[k];
    const float inv = 1.0f / sqrtf((float)(tot / (double)dim) + eps);
    /* each element is read and written by the same thread: in place is safe */
    for (size_t i = threadIdx.x; i < dim; i += RMS_THREADS) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv);
}

extern "C" cudaError_t bcu_rmsnorm(float *y, const float *x, size_t rows, size_t dim, const float *w, float eps,
                                   cudaStream_t st)
{
    if (!rows || !dim) return cudaSuccess;
    if (rows > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    rmsnorm_kernel<<<(unsigned)rows, RMS_THREADS, 0, st>>>(y, x, dim, w, eps);
    return cudaGetLastError();
}

/* ---- conversions */

__global__ void split_kernel(uint16_t *dst, const float *x, size_t n, int planes)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float r = x[i];
        for (int p = 0; p < planes; p++) {
            __nv_bfloat16 h = __float2bfloat16_rn(r);
            dst[(size_t)p * n + i] = __bfloat16_as_ushort(h);
            r = r - __bfloat162float(h); /* exact: h is r rounded to 8 bits */
        }
    }
}

__global__ void sum3_kernel(float *y, const float *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = p[i] + (p[n + i] + p[2 * n + i]);
}

__global__ void widen_kernel(float *dst, const uint16_t *src, size_t n, int is_f16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = is_f16 ? __half2float(__ushort_as_half(src[i])) : dec_bf16(src[i]);
}

static unsigned grid_for(size_t n)
{
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 4096 ? (b ? b : 1) : 4096);
}

extern "C" cudaError_t bcu_split_bf16(uint16_t *dst, const float *x, size_t n, int planes, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    split_kernel<<<grid_for(n), 256, 0, st>>>(dst, x, n, planes);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_sum3(float *y, const float *p, size_t n, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    sum3_kernel<<<grid_for(n), 256, 0, st>>>(y, p, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_widen(float *dst, const uint16_t *src, size_t n, int is_f16, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    widen_kernel<<<grid_for(n), 256, 0, st>>>(dst, src, n, is_f16);
    return cudaGetLastError();
}
