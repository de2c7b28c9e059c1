/* kernels.cu - the CUDA backend's own kernels: a dequantising row-dot for
 * weights cuBLAS cannot take as they are (FP8 e4m3 with block scales, packed
 * FP4 e2m1 with ue8m0 1xN scales, f16), RMSNorm, and the small conversions
 * around the cuBLAS GEMMs.
 *
 * The decoders are bit-for-bit those of src/model/dtype.c (e4m3fn with its
 * subnormals and NaN, ue8m0 with 2^-127 as an f32 subnormal), so every weight
 * the GPU multiplies is the value the CPU reference decodes.  Nothing is built
 * with fast-math: subnormals are kept and sqrtf/division are IEEE.
 *
 * bcu_rowdot (y[t, o] = x[t, :] . W[r0 + o, c0 : c0 + K]) has these kernels:
 *
 *  - mma, the default for FP8 (power-of-two blocks >= 64) and FP4 (1x32 ue8m0
 *    scales) whose rows allow 16-byte loads.  Tensor cores, mma.sync m16n8k16
 *    bf16 -> fp32.  The weights are the B operand: each lane streams 16 bytes
 *    of one weight row per 64-byte chunk, straight from global memory into
 *    registers (several chunks in flight), and decodes them there to bf16,
 *    which holds every e4m3 and e2m1 value exactly (FP8: cvt e4m3x2 -> f16x2
 *    -> f32 -> top 16 bits; FP4: a byte-table lookup with prmt, then the
 *    power-of-two ue8m0 scale by one exact bf16x2 multiply).  The activations
 *    are the A operand: each token is split into three bf16 planes, x = hi +
 *    mid + lo exactly (rows 3t, 3t+1, 3t+2 of the tile), staged per chunk in
 *    shared memory, so the products are exact and the sums fp32.  The order
 *    of the k16 steps inside a chunk is a fixed permutation of its columns
 *    that both operands follow (it lets a lane use one 16-byte load).
 *    The fixed summation order, for every (t, o) and whatever the tiling:
 *      P   = the tensor-core sum over one 64-byte chunk of the row (FP8 64
 *            columns, inside one scale block; FP4 128), from zero;
 *      S_j = fmaf(P, scale, S_j) over the chunks of slice j, from zero (FP8:
 *            the block scale; FP4: 1, the scale is already in the weight);
 *            a row's chunks are cut into at most 8 slices;
 *      A   = ((0 + S_0) + S_1) + ... per plane;  y = A_hi + (A_mid + A_lo).
 *    Slices are a function of (c0, K) only.  Three tilings (5, 16 or 32
 *    tokens per block, picked by T), the decode kernel below and the K split
 *    (one slice per block of a thread-block cluster, reduced through
 *    distributed shared memory in slice order, when the grid would otherwise
 *    not fill the GPU) therefore all give the same bits: the result for
 *    token t does not depend on T or on the other tokens, provided the tensor
 *    core computes each output element from its own row and column only,
 *    wherever they sit in the tile (what cuBLAS's bit-exact chunked prefill
 *    on the H200 suggests; unit_cuda checks it, on the decode kernel too).
 *    The decode kernel (rowdec_kernel, what T <= 5 runs, T <= 16 on
 *    act_quant'd x in its f16 form, see bcu_rowdot_args.xq; tile
 *    BCU_ROWDOT_TILE_DEC forces it at any T, 5 tokens a block) computes the
 *    one-tile sums above and moves the data differently.  rowmma_kernel
 *    stages x per chunk behind a barrier, with the next chunk's x one L2
 *    round trip ahead, and fetches an FP8 block scale right before its use;
 *    at decode that left it at ~20% of the copy bandwidth.  A decode block
 *    copies x for its whole chunk range (its slice under a K split, else the
 *    row) into shared memory once (cp.async), splits it there into the three
 *    planes laid out as A fragments (one 16-byte load a k16 step, no
 *    register moves), puts the FP8 scales of its rows and chunks beside
 *    them, and after that one barrier runs its chunk loop with none: each
 *    lane streams 16 bytes a chunk of 1 or 2 weight rows, 8 or 4 chunks
 *    ahead in registers (128 bytes in flight a lane; FP4 scale bytes with
 *    them), and two chunks' products are computed together (independent
 *    tensor-core chains), their S updates then in chunk order.  Where its
 *    shared memory would pass 96 KB (a long row that cannot be split) tile 1
 *    runs instead, with the same bits.  Measured (bench_cuda_linear's decode
 *    table, H200, 2026-11-30, T = 1, tile 1 -> decode kernel, % of the
 *    device-to-device copy bandwidth): 32768x1024 36.8 -> 15.4 us (22 ->
 *    52%), 4096x8192 39.6 -> 20.7 us (20 -> 38%), 2048x4096 and 4096x2048
 *    13.7 -> 10.0 us (14 -> 20%), 1024x4096 12.1 -> 7.7 us, 512x4096 11.4 ->
 *    6.7 us; T = 5 1.2x to 1.7x.  What bounds it now (ncu): issue, ~125
 *    instructions a KB of FP8 weights (half of them the exact e4m3 -> bf16
 *    decode) at 16-20 warps an SM; below ~8 MB, a block's latency (its x
 *    staging, then up to 8 dependent chunks) and the launch.
 *  - the GEMV kernel (rowgv_kernel, below the decode kernel): the decode
 *    kernel's sums for T <= 24 act_quant'd tokens (T <= 8 raw ones) with the
 *    weights as the A operand and the K split inside the block or across
 *    a thread-block cluster (gv_plan); the automatic tile takes it where the
 *    H200 measured it faster (gv_pick, gv_chunk).
 *  - simple, for everything else (f16, unaligned slices, other block sizes)
 *    and for DEEPINFER_CUDA_ROWDOT=simple (read once): one warp per output
 *    feature, 8 tokens per warp, 8 weights per lane per step decoded in
 *    registers, fp32 FFMA on fp32 activations, a fixed warp reduction.  It
 *    reads each weight row once per tile of BCU_TT tokens.
 * mma and simple agree to rounding (~1e-7 relative), not bit for bit; which
 * one runs depends on the weight's format and alignment and on x being
 * 16-byte aligned (the backend's always is), never on T.  (The GEMV kernel
 * gives mma's bits; the T it runs at does not move a token's result.)
 *
 * The row-dot's inline PTX, cluster calls and launches sit between the
 * "rowdot primitives" markers.  Before any device time, the code after them
 * was compiled as C++ and run on the build machine under a CPU emulation of
 * those primitives and of the CUDA execution model (threads as fibers, real
 * barriers, mma from the PTX ISA's fragment tables, cp.async landing only at
 * its wait, clusters with distributed shared memory); the decode kernel too,
 * bit for bit against rowmma_kernel at the V4-Flash shapes.  The emulator is
 * not in the tree. */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sm_count.cuh"
#include "backend/cuda/rmsnorm.cuh"

/* ==== rowdot primitives (begin) ==== */
namespace {


__device__ __forceinline__ uint4 rd_ldg16(const void *p) { return __ldg((const uint4 *)p); }
__device__ __forceinline__ float4 rd_ldg_f4(const float *p) { return __ldg((const float4 *)p); }

/* the thread-block cluster of a split launch (cluster dims (gridDim.x, 1, 1)) */
__device__ __forceinline__ void rd_cluster_sync() { cooperative_groups::this_cluster().sync(); }
__device__ __forceinline__ const float *rd_cluster_peer(float *p, int rank)
{
    return cooperative_groups::this_cluster().map_shared_rank(p, (unsigned)rank);
}

/* allow kern more than 48 KB of dynamic shared memory (on the current device) */
template <typename... P>
cudaError_t rd_smem_attr(void (*kern)(P...), size_t smem)
{
    if (smem <= 48 * 1024) return cudaSuccess;
    return cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

/* whether a cluster of cluster_x blocks of kern can be resident at all */
/* cfg launches clusters of cluster_x blocks along x (at: the caller's one attribute slot) */
static void rd_cluster_attr(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int cluster_x)
{
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)cluster_x;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg->attrs = at;
    cfg->numAttrs = 1;
}

/* Programmatic dependent launch (pdl.cuh): the decode row-dot triggers first and issues its first weight loads
 * (which no kernel writes) before pdl_wait, so they overlap the previous kernel's tail and the launch. */

/* launch kern<<<grid, block, smem, st>>>(args), as a cluster of cluster_x blocks along x when cluster_x > 1, with
 * programmatic dependent launch when pdl (and DEEPINFER_CUDA_PDL is not 0) */
template <typename... P, typename... A>
cudaError_t rd_launch_ex(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, int cluster_x, bool pdl,
                         cudaStream_t st, A... args)
{
    cudaLaunchConfig_t cfg = launch_cfg(grid, block, smem, st);
    cudaLaunchAttribute at[2] = {};
    if (cluster_x > 1) rd_cluster_attr(&cfg, at, cluster_x);
    if (pdl) pdl_attr(&cfg, at);
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

template <typename... P, typename... A>
cudaError_t rd_launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, int cluster_x, cudaStream_t st,
                      A... args)
{
    return rd_launch_ex(kern, grid, block, smem, cluster_x, false, st, args...);
}

/* how many clusters of cluster_x blocks of kern (cluster_x = 1: blocks), threads and smem bytes each, the
 * device can hold at once; 0 if none or unknown */
template <typename... P>
int rd_max_clusters(void (*kern)(P...), int cluster_x, int threads, size_t smem)
{
    int n = 0;
    if (cluster_x <= 1) {
        int dev = 0, sms = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, threads, smem) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        return n * sms;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)cluster_x, 1, 1);
    cfg.blockDim = dim3((unsigned)threads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1] = {};
    rd_cluster_attr(&cfg, at, cluster_x);
    if (cudaOccupancyMaxActiveClusters(&n, kern, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* whether one cluster of cluster_x blocks of kern fits the device */
template <typename... P>
bool rd_cluster_fits(void (*kern)(P...), int cluster_x, int threads, size_t smem)
{
    return rd_max_clusters(kern, cluster_x, threads, smem) > 0;
}

/* the current device, 0 if unknown */
int rd_device(void)
{
    int dev = 0;
    return cudaGetDevice(&dev) == cudaSuccess ? dev : 0;
}

/* kern's dynamic shared-memory limit raised to smem on the current device, once: done holds a bit for each device
 * (below 64) where that is done; the caller keeps one done per kernel */
template <typename... P>
cudaError_t rd_smem_attr_once(std::atomic<unsigned long long> &done, void (*kern)(P...), size_t smem)
{
    const int dev = rd_device();
    const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
    if (done.load(std::memory_order_relaxed) & bit) return cudaSuccess;
    const cudaError_t e = rd_smem_attr(kern, smem);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
    return e;
}

} /* namespace */
/* ==== rowdot primitives (end) ==== */

#define BCU_WARPS 4 /* simple kernel: warps (output rows) per block */
#define BCU_TT 8    /* simple kernel: tokens per warp */

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

/* ---- the simple row-dot */

struct RowArgs {
    const void *w, *scale;
    int sc_dtype, block;
    int64_t wcols, nsb; /* FP8: scale blocks per scale row */
    int64_t r0, n, c0, K, T;
    int64_t ldx, ldy; /* row strides of x and y, floats */
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
/* bf16 / f16: the 16 bytes of W[r, c..c+7], and their values */
template <int FMT>
__device__ __forceinline__ uint4 wraw8(const RowArgs &a, int64_t r, int64_t c)
{
    return *(const uint4 *)((const uint16_t *)a.w + r * a.wcols + c);
}
template <int FMT>
__device__ __forceinline__ void wdec8(uint4 q, float *v)
{
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
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
}

template <int FMT>
__device__ __forceinline__ void wget8(const RowArgs &a, int64_t r, int64_t c, float *v)
{
    if (FMT == BCU_RW_BF16 || FMT == BCU_RW_F16) {
        wdec8<FMT>(wraw8<FMT>(a, r, c), v);
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

/* acc[i] += wv[0..7] . x[t0 + i][j .. j+7] for the tile's nt tokens, in column order (the simple kernels' lane step) */
__device__ __forceinline__ void fma8_tokens(const RowArgs &a, const float (&wv)[8], int64_t t0, int64_t nt, int64_t j,
                                            float (&acc)[BCU_TT])
{
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) {
        if (i < nt) {
            const float4 *xp = (const float4 *)(a.x + (t0 + i) * a.ldx + j);
            const float4 x0 = xp[0], x1 = xp[1];
            float s = acc[i];
            s = fmaf(wv[0], x0.x, s); s = fmaf(wv[1], x0.y, s);
            s = fmaf(wv[2], x0.z, s); s = fmaf(wv[3], x0.w, s);
            s = fmaf(wv[4], x1.x, s); s = fmaf(wv[5], x1.y, s);
            s = fmaf(wv[6], x1.z, s); s = fmaf(wv[7], x1.w, s);
            acc[i] = s;
        }
    }
}

template <int FMT, bool VEC>
__global__ void __launch_bounds__(32 * BCU_WARPS) rowdot_kernel(RowArgs a)
{
    pdl_enter();
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
        /* bf16 / f16 (the small decode GEMVs: the router, the compressors, the indexer): four steps unrolled, their
         * loads in flight together (a few warps an SM, bound by load latency; not measured yet); the order of each
         * lane's FMAs is the loop's, so the bits do not change */
#pragma unroll(FMT == BCU_RW_BF16 || FMT == BCU_RW_F16 ? 4 : 1)
        for (int64_t j = (int64_t)lane * 8; j < a.K; j += 32 * 8) {
            float wv[8];
            wget8<FMT>(a, r, a.c0 + j, wv);
            fma8_tokens(a, wv, t0, nt, j, acc);
        }
    } else {
        for (int64_t j = lane; j < a.K; j += 32) {
            float wv = wget<FMT>(a, r, a.c0 + j);
#pragma unroll
            for (int i = 0; i < BCU_TT; i++)
                if (i < nt) acc[i] = fmaf(wv, a.x[(t0 + i) * a.ldx + j], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) {
        float v = acc[i];
#pragma unroll
        for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && i < nt) a.y[(t0 + i) * a.ldy + o] = v;
    }
}

/* The simple kernel with each output's K cut into KS contiguous parts, a warp each (bf16 / f16, the vector path):
 * KS warps of a block share an output, 8 / KS outputs a block.  Each warp sums its part in the order of
 * rowdot_kernel's lane loop and reduces across lanes the same way; the parts are then added in order,
 * ((0 + p_0) + p_1) + ...  For the small decode GEMVs (the router, the compressors, the indexer: n of 64 to
 * 2048 rows): with a warp per output their grid is 16 to 512 blocks of 4 warps, each lane a chain of K / 256
 * dependent loads; KS is a function of (n, K) only, so a token's result does not depend on T. */
#define BCU_KS_WARPS 8
template <int FMT, int KS>
__global__ void __launch_bounds__(32 * BCU_KS_WARPS) rowdot_ks_kernel(RowArgs a)
{
    __shared__ float part[BCU_KS_WARPS][BCU_TT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS;
    const int64_t o = (int64_t)blockIdx.x * (BCU_KS_WARPS / KS) + warp / KS;
    const int64_t t0 = (int64_t)blockIdx.y * BCU_TT;
    const int64_t nt = a.T - t0 < BCU_TT ? a.T - t0 : BCU_TT;
    const int64_t r = a.r0 + (o < a.n ? o : 0);
    const int64_t kp = (a.K / 8 + KS - 1) / KS * 8; /* columns per part, a multiple of 8 */
    const int64_t k0 = ks * kp, k1 = k0 + kp < a.K ? k0 + kp : a.K;
    /* the lane's first KS_PRE steps of weights, loaded before the wait (no kernel writes a weight): launched early
     * (pdl_launch), the GEMV's first round trip overlaps the kernel before it */
    constexpr int KS_PRE = 4;
    uint4 pre[KS_PRE];
    const int64_t j0 = k0 + (int64_t)lane * 8;
#pragma unroll
    for (int u = 0; u < KS_PRE; u++) {
        const int64_t j = j0 + (int64_t)u * 32 * 8;
        pre[u] = j < k1 ? wraw8<FMT>(a, r, a.c0 + j) : make_uint4(0u, 0u, 0u, 0u);
    }
    pdl_enter();
    float acc[BCU_TT];
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) acc[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < KS_PRE; u++) { /* in column order, as the loop below continues it */
        const int64_t j = j0 + (int64_t)u * 32 * 8;
        if (j < k1) {
            float wv[8];
            wdec8<FMT>(pre[u], wv);
            fma8_tokens(a, wv, t0, nt, j, acc);
        }
    }
#pragma unroll 4
    for (int64_t j = j0 + (int64_t)KS_PRE * 32 * 8; j < k1; j += 32 * 8) {
        float wv[8];
        wget8<FMT>(a, r, a.c0 + j, wv);
        fma8_tokens(a, wv, t0, nt, j, acc);
    }
#pragma unroll
    for (int i = 0; i < BCU_TT; i++) {
        float v = acc[i];
#pragma unroll
        for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) part[warp][i] = v;
    }
    __syncthreads();
    if (ks == 0 && lane < nt && o < a.n) {
        float v = 0.0f;
#pragma unroll
        for (int p = 0; p < KS; p++) v = v + part[warp + p][lane];
        a.y[(t0 + lane) * a.ldy + o] = v;
    }
}

/* the K split of the vector path for bf16 / f16: 1 (rowdot_kernel) unless the grid of a warp per output would be
 * under ~4 warps an SM's worth on a 132-SM part (n < 512... a function of n and K alone) and K has room */
static int simple_ks(int fmt, int64_t n, int64_t K)
{
    if (fmt != BCU_RW_BF16 && fmt != BCU_RW_F16) return 1;
    int ks = 1;
    while (ks < BCU_KS_WARPS && n * ks < 4096 && K / (2 * ks) >= 512) ks *= 2;
    return ks;
}

template <int FMT>
static cudaError_t launch_rowdot(const RowArgs &a, bool vec, cudaStream_t st)
{
    const int ks = vec ? simple_ks(FMT, a.n, a.K) : 1;
    if constexpr (FMT == BCU_RW_BF16 || FMT == BCU_RW_F16) {
        if (ks > 1) {
            const int rpb = BCU_KS_WARPS / ks;
            dim3 g((unsigned)((a.n + rpb - 1) / rpb), (unsigned)((a.T + BCU_TT - 1) / BCU_TT));
            void (*kern)(RowArgs) = ks == 2   ? rowdot_ks_kernel<FMT, 2>
                                    : ks == 4 ? rowdot_ks_kernel<FMT, 4>
                                              : rowdot_ks_kernel<FMT, 8>;
            return rd_launch_ex(kern, g, dim3(32 * BCU_KS_WARPS), 0, 1, true, st, a);
        }
    }
    dim3 grid((unsigned)((a.n + BCU_WARPS - 1) / BCU_WARPS), (unsigned)((a.T + BCU_TT - 1) / BCU_TT));
    if (vec) return rd_launch_ex(rowdot_kernel<FMT, true>, grid, dim3(32 * BCU_WARPS), 0, 1, true, st, a);
    return rd_launch_ex(rowdot_kernel<FMT, false>, grid, dim3(32 * BCU_WARPS), 0, 1, true, st, a);
}

static cudaError_t simple_rowdot(const bcu_rowdot_args *p, cudaStream_t st)
{
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
    a.ldx = p->ldx ? p->ldx : p->K;
    a.ldy = p->ldy ? p->ldy : p->n;
    /* 8 columns per lane per step when every group of 8 is aligned, whole,
     * and (quantised formats) inside one scale block */
    bool vec = p->K % 8 == 0 && p->c0 % 8 == 0 && p->wcols % 8 == 0 && a.ldx % 4 == 0;
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

/* ---- the tensor-core row-dot (see the top of the file for the numbers) */

struct MmArgs {
    const uint8_t *w; /* W [wrows, rowbytes] */
    const void *scale;
    const float *x;
    float *y;
    int64_t rowbytes;
    int64_t r0, n, c0, K, T;
    int64_t ldx, ldy; /* row strides of x and y, floats */
    int64_t cb;       /* the first 64-byte chunk of a row that columns [c0, c0+K) touch */
    int nch, cps;     /* chunks, chunks per slice */
    int sc_dtype;     /* FP8 */
    int bshift;       /* FP8: log2(block) */
    int64_t nsb;      /* FP8: scale blocks per scale row; FP4: scales per row */
    int groups;       /* decode kernel only, > 1: group gi = blockIdx.y / gtiles is rows r0 + gi n of W on */
    int gtiles;       /* x + gi xg into y + gi yg (bcu_rowdot_args.groups) */
    int64_t xg, yg;
    int aq;           /* the decode kernel on f16 codes (XQ): x is raw, act_quant it (bcu_rowdot_args.xq = 2) */
};

/* A block: WGM x WGN warps; warp (wm, wn) owns x rows [16 MTW wm, 16 MTW (wm+1)) (MTW m16 tiles)
 * and weight rows [8 WN wn, 8 WN (wn+1)) (WN n8 tiles) of the block's tile. */
template <int FMT, int MTW, int WN, int WGM, int WGN>
struct MmCfg {
    static constexpr int NT = 32 * WGM * WGN;
    static constexpr int MROWS = 16 * MTW * WGM;           /* x rows: token tau's planes are rows 3 tau + p */
    static constexpr int TB = MROWS / 3;                   /* tokens per block */
    static constexpr int RB = 8 * WN * WGN;                /* outputs (weight rows) per block */
    static constexpr int RBP = RB + 8;                     /* Sx row stride, floats (RBP % 32 == 8: no conflicts) */
    static constexpr int EPB = FMT == BCU_RW_FP4 ? 2 : 1;  /* elements per byte */
    static constexpr int STEPS = 4 * EPB;                  /* k16 steps per 64-byte chunk */
    static constexpr int RS = FMT == BCU_RW_FP4 ? 288 : 144; /* Xs row stride, bytes (see xoff) */
    static constexpr int XPT = (16 * TB + NT - 1) / NT;    /* staging items (4 EPB columns) per thread */
    static constexpr int PD = MTW * WGM == 1 ? 8 : MTW * WGM == 3 ? 4 : 2; /* chunks of weights in flight */
    static constexpr int MINB = NT == 128 ? 3 : 1;
    static constexpr int NPL = 3;                          /* planes (A rows) per token */
    static constexpr size_t SMEM = (size_t)MROWS * RBP * 4 + 2 * (size_t)MROWS * RS;
};


/* Byte offset, in an Xs row, of the 16 bytes that hold the A operand of
 * lane q for the step pair h.  FP8: chunk column c at byte 2c, lane q's 16
 * columns at 32q.  FP4: 8-column groups (x0 x4 x1 x5 x2 x6 x3 x7) of 16
 * bytes, 16 bytes of padding after the 8th group; lane q owns groups 4q..4q+3.
 * With RS = 144 / 288 the 16-byte loads of a quarter warp hit distinct banks. */
template <int FMT>
__device__ __forceinline__ int xoff(int q, int h)
{
    if (FMT == BCU_RW_FP4) return 64 * q + 16 * h + 16 * ((4 * q + h) >> 3);
    return 32 * q + 16 * h;
}

/* y = A_hi + (A_mid + A_lo), A = ((0 + S_0) + S_1) + ... over the slices, from the per-plane sums in Sx
 * [rows 3 tau + p][RBP] (C::NPL = 1, the decode kernel on act_quant'd x: y = A of row tau); in a split (ns > 1)
 * the blocks of the cluster share the outputs.  rowmma_kernel and rowdec_kernel end with it. */
template <class C>
__device__ __forceinline__ void rd_store_y(const MmArgs &a, float *y, float *Sx, int ns, int tid, int tbv, int64_t ob,
                                           int64_t t0)
{
    if (ns > 1) rd_cluster_sync();
    else __syncthreads();
    const int rank = ns > 1 ? (int)blockIdx.x : 0;
    for (int e = rank * C::NT + tid; e < tbv * C::RB; e += ns * C::NT) {
        const int tau = e / C::RB, ol = e - tau * C::RB;
        const int64_t o = ob + ol;
        if (o >= a.n) continue;
        float A0 = 0.0f, A1 = 0.0f, A2 = 0.0f;
        for (int j = 0; j < ns; j++) {
            const float *src = (ns > 1 ? rd_cluster_peer(Sx, j) : Sx) + C::NPL * tau * C::RBP + ol;
            A0 = A0 + src[0];
            if (C::NPL == 3) {
                A1 = A1 + src[C::RBP];
                A2 = A2 + src[2 * C::RBP];
            }
        }
        y[(t0 + tau) * a.ldy + o] = C::NPL == 3 ? A0 + (A1 + A2) : A0;
    }
    if (ns > 1) rd_cluster_sync(); /* the peers' shared memory stays until every block has read it */
}

template <int FMT, int MTW, int WN, int WGM, int WGN>
__global__ void __launch_bounds__(MmCfg<FMT, MTW, WN, WGM, WGN>::NT, MmCfg<FMT, MTW, WN, WGM, WGN>::MINB)
    rowmma_kernel(MmArgs a)
{
    typedef MmCfg<FMT, MTW, WN, WGM, WGN> C;
    extern __shared__ __align__(16) unsigned char rd_smem[];
    float *Sx = (float *)rd_smem; /* [MROWS][RBP]: per-lane accumulators, then the block's partial result */
    unsigned char *Xs = rd_smem + (size_t)C::MROWS * C::RBP * 4; /* 2 x [MROWS][RS]: x planes of a chunk */

    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WGN, wn = warp - wm * WGN;
    const int g = lane >> 2, q = lane & 3;
    const int ns = (int)gridDim.x; /* blocks of the K split (a cluster), 1 = none */
    const int64_t ob = (int64_t)blockIdx.y * C::RB;
    const int64_t t0 = (int64_t)blockIdx.z * C::TB;
    const int tbv = a.T - t0 < C::TB ? (int)(a.T - t0) : C::TB;
    const int mtv = (3 * tbv + 15) >> 4; /* m16 tiles that hold a token */
    const int cs = ns == 1 ? 0 : (int)blockIdx.x * a.cps;
    const int ce = ns == 1 ? a.nch : min(a.nch, cs + a.cps);

    /* the weight row this lane streams in each of its n8 tiles (row g of the tile) */
    const uint8_t *wp[WN];
    bool wok[WN];
    int64_t srow[WN]; /* FP4: the row's first scale */
#pragma unroll
    for (int nt = 0; nt < WN; nt++) {
        const int64_t o = ob + 8 * (wn * WN + nt) + g;
        wok[nt] = o < a.n;
        const int64_t r = a.r0 + (wok[nt] ? o : 0);
        wp[nt] = a.w + r * a.rowbytes + 16 * q;
        srow[nt] = r * a.nsb;
    }
    /* FP8: the scale row of the outputs this lane accumulates (columns 2q, 2q+1 of each n8 tile), -1 if none
     * (the host checks that the scale table has fewer than 2^31 entries) */
    int sbase[WN][2];
#pragma unroll
    for (int nt = 0; nt < WN; nt++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int64_t o = ob + 8 * (wn * WN + nt) + 2 * q + hh;
            sbase[nt][hh] = o < a.n ? (int)(((a.r0 + o) >> a.bshift) * a.nsb) : -1;
        }

    /* the x rows of no token (past the last token of the tile, and row 15 of a 5-token tile) are zero in both
     * buffers for the whole kernel; only the tile's tokens are staged per chunk */
    const int xi = 16 * tbv;                          /* staging items per chunk */
    const int zu = (C::MROWS - 3 * tbv) * C::RS / 16; /* 16-byte units per buffer */
    for (int i = tid; i < 2 * zu; i += C::NT) {
        const int b = i >= zu, k = i - b * zu;
        *(uint4 *)(Xs + (size_t)b * C::MROWS * C::RS + 3 * tbv * C::RS + 16 * k) = make_uint4(0u, 0u, 0u, 0u);
    }
    /* this lane's accumulator slots of Sx start at 0 */
#pragma unroll
    for (int im = 0; im < MTW; im++)
#pragma unroll
        for (int nt = 0; nt < WN; nt++) {
            const int m = 16 * (wm * MTW + im) + g, nl = 8 * (wn * WN + nt) + 2 * q;
            *(float2 *)&Sx[m * C::RBP + nl] = make_float2(0.0f, 0.0f);
            *(float2 *)&Sx[(m + 8) * C::RBP + nl] = make_float2(0.0f, 0.0f);
        }

    /* the lane's 16 bytes of chunk c in each of its rows (zero outside [c0, c0+K) and past n) */
    auto wload = [&](int c, uint4(&dst)[WN]) {
        const int64_t col = (64 * (a.cb + c) + 16 * q) * C::EPB;
        const bool cok = col >= a.c0 && col < a.c0 + a.K;
#pragma unroll
        for (int nt = 0; nt < WN; nt++)
            dst[nt] = cok && wok[nt] ? rd_ldg16(wp[nt] + 64 * (a.cb + c)) : make_uint4(0u, 0u, 0u, 0u);
    };
    /* the x values of chunk c this thread stages: item it = (token it / 16, columns 4 EPB (it % 16) ...),
     * zero outside [c0, c0+K) */
    auto xload = [&](int c, float4(&xr)[C::XPT][C::EPB]) {
        const int64_t col0 = 64 * (a.cb + c) * C::EPB - a.c0;
#pragma unroll
        for (int k = 0; k < C::XPT; k++) {
            const int it = tid + k * C::NT, tau = it >> 4, j = it & 15;
            const int64_t xc = col0 + 4 * C::EPB * j;
            const bool ok = it < xi && xc >= 0 && xc < a.K;
            const float *src = a.x + (ok ? (t0 + tau) * a.ldx + xc : 0);
#pragma unroll
            for (int e = 0; e < C::EPB; e++)
                xr[k][e] = ok ? rd_ldg_f4(src + 4 * e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    /* ... split into three bf16 planes, in the layout xoff reads */
    auto xstore = [&](const float4(&xr)[C::XPT][C::EPB], unsigned char *xb) {
        constexpr int H4 = 4 * C::EPB - 4; /* FP4: the pairs (x0, x4), (x1, x5), (x2, x6), (x3, x7) */
#pragma unroll
        for (int k = 0; k < C::XPT; k++) {
            const int it = tid + k * C::NT, tau = it >> 4, j = it & 15;
            if (it < xi) {
                float v[4 * C::EPB];
#pragma unroll
                for (int e = 0; e < C::EPB; e++) {
                    v[4 * e] = xr[k][e].x;
                    v[4 * e + 1] = xr[k][e].y;
                    v[4 * e + 2] = xr[k][e].z;
                    v[4 * e + 3] = xr[k][e].w;
                }
                uint32_t s[4 * C::EPB][3];
#pragma unroll
                for (int e = 0; e < 4 * C::EPB; e++) rd_split3(v[e], s[e]);
#pragma unroll
                for (int p = 0; p < 3; p++) {
                    unsigned char *row = xb + (3 * tau + p) * C::RS;
                    if (FMT == BCU_RW_FP4)
                        *(uint4 *)(row + 16 * j + 16 * (j >> 3)) =
                            make_uint4(s[0][p] | (s[H4][p] << 16), s[1][p] | (s[H4 + 1][p] << 16),
                                       s[2][p] | (s[H4 + 2][p] << 16), s[3][p] | (s[H4 + 3][p] << 16));
                    else
                        *(uint2 *)(row + 8 * j) = make_uint2(s[0][p] | (s[1][p] << 16), s[2][p] | (s[3][p] << 16));
                }
            }
        }
    };

    float S[MTW][WN][4];
    uint4 wr[C::PD][WN];
    float4 xr[C::XPT][C::EPB];
#pragma unroll
    for (int i = 0; i < C::PD; i++)
        if (cs + i < ce) wload(cs + i, wr[i]);
    xload(cs, xr);
    int sp = 0;           /* position of the chunk in its slice */
    float sc[WN][2];      /* the scales of this lane's outputs for the column block sc_cb */
    int64_t sc_cb = -1;
    for (int c = cs; c < ce; c += C::PD) {
#pragma unroll
        for (int i = 0; i < C::PD; i++) {
            const int cc = c + i;
            if (cc >= ce) break; /* block-uniform */
            unsigned char *xb = Xs + (size_t)((cc - cs) & 1) * C::MROWS * C::RS;
            xstore(xr, xb);
            __syncthreads(); /* also: every thread is past chunk cc - 2, which read this buffer */
            if (cc + 1 < ce) xload(cc + 1, xr);
            uint4 wv[WN];
#pragma unroll
            for (int nt = 0; nt < WN; nt++) wv[nt] = wr[i][nt];
            if (cc + C::PD < ce) wload(cc + C::PD, wr[i]);
            if (sp == 0) {
#pragma unroll
                for (int im = 0; im < MTW; im++)
#pragma unroll
                    for (int nt = 0; nt < WN; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) S[im][nt][e] = 0.0f;
            }
            float P[MTW][WN][4];
#pragma unroll
            for (int im = 0; im < MTW; im++)
#pragma unroll
                for (int nt = 0; nt < WN; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) P[im][nt][e] = 0.0f;
            uint32_t s2[WN]; /* FP4: the lane's scale, as a bf16 pair */
            if (FMT == BCU_RW_FP4) {
                const int64_t col = (64 * (a.cb + cc) + 16 * q) * 2;
                const bool cok = col >= a.c0 && col < a.c0 + a.K;
#pragma unroll
                for (int nt = 0; nt < WN; nt++)
                    s2[nt] = cok && wok[nt]
                                 ? ue8m0_bf16x2(((const uint8_t *)a.scale)[srow[nt] + 4 * (a.cb + cc) + q])
                                 : 0u;
            }
#pragma unroll
            for (int h = 0; h < C::STEPS / 2; h++) {
                /* B for the steps 2h (b[nt][0..1]) and 2h+1 (b[nt][2..3]) */
                uint32_t b[WN][4];
#pragma unroll
                for (int nt = 0; nt < WN; nt++)
                    rd_bfrag<FMT == BCU_RW_FP4>(wv[nt], h, FMT == BCU_RW_FP4 ? s2[nt] : 0u, b[nt]);
                const int off = xoff<FMT>(q, h);
#pragma unroll
                for (int im = 0; im < MTW; im++) {
                    const int mt = wm * MTW + im;
                    if (mt < mtv) { /* warp-uniform */
                        const uint4 va = *(const uint4 *)(xb + (16 * mt + g) * C::RS + off);
                        uint4 vb = make_uint4(0u, 0u, 0u, 0u);
                        if (16 * mt + 8 < 3 * tbv) vb = *(const uint4 *)(xb + (16 * mt + 8 + g) * C::RS + off);
                        const uint32_t ae[4] = {va.x, vb.x, va.y, vb.y}, ao[4] = {va.z, vb.z, va.w, vb.w};
#pragma unroll
                        for (int nt = 0; nt < WN; nt++) {
                            rd_mma(P[im][nt], ae, b[nt][0], b[nt][1]);
                            rd_mma(P[im][nt], ao, b[nt][2], b[nt][3]);
                        }
                    }
                }
            }
            /* S += P * scale (FP8: the chunk's column block and each output's row block, reloaded when the
             * column block changes; FP4: 1) */
            const int64_t cbk = FMT == BCU_RW_FP4 ? 0 : (64 * (a.cb + cc)) >> a.bshift;
            if (cbk != sc_cb) { /* block-uniform */
                sc_cb = cbk;
#pragma unroll
                for (int nt = 0; nt < WN; nt++)
#pragma unroll
                    for (int hh = 0; hh < 2; hh++) {
                        if (FMT == BCU_RW_FP4) sc[nt][hh] = 1.0f;
                        else
                            sc[nt][hh] = sbase[nt][hh] >= 0
                                             ? scale_at(a.scale, a.sc_dtype, (size_t)sbase[nt][hh] + (size_t)cbk)
                                             : 0.0f;
                    }
            }
            const bool flush = ++sp == a.cps || cc + 1 == a.nch;
#pragma unroll
            for (int im = 0; im < MTW; im++) {
                if (wm * MTW + im >= mtv) continue; /* warp-uniform */
#pragma unroll
                for (int nt = 0; nt < WN; nt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) S[im][nt][e] = fmaf(P[im][nt][e], sc[nt][e & 1], S[im][nt][e]);
                    if (flush) {
                        const int m = 16 * (wm * MTW + im) + g, nl = 8 * (wn * WN + nt) + 2 * q;
                        float2 *d0 = (float2 *)&Sx[m * C::RBP + nl], *d1 = (float2 *)&Sx[(m + 8) * C::RBP + nl];
                        float2 v0 = *d0, v1 = *d1;
                        v0.x = v0.x + S[im][nt][0];
                        v0.y = v0.y + S[im][nt][1];
                        v1.x = v1.x + S[im][nt][2];
                        v1.y = v1.y + S[im][nt][3];
                        *d0 = v0;
                        *d1 = v1;
                    }
                }
            }
            if (flush) sp = 0;
        }
    }

    rd_store_y<C>(a, a.y, Sx, ns, tid, tbv, ob, t0);
}

/* ---- the decode row-dot (T <= 5; see the top of the file)
 *
 * The sums of rowmma_kernel with one m16 tile (5 tokens, token tau's planes in rows 3 tau + p), in a block
 * that stages its x planes once: the block's whole range of chunks [cs, ce) (its slice in a K split, else the
 * row) is copied to shared memory (cp.async, fp32), split into the three bf16 planes as the A fragments of
 * rowmma's registers, and the FP8 scales of its rows and chunks are put beside them; after that one barrier
 * the chunk loop has none.  Each lane streams 16 bytes per chunk of WN weight rows, PD chunks ahead in
 * registers (PD WN = 8: 128 bytes in flight per lane, FP4 scale bytes with them); 4 warps, 32 WN outputs per
 * block. */
template <int FMT, int WN, bool XQ>
struct DecCfg {
    static constexpr int NT = 128;                         /* 4 warps */
    static constexpr int NPL = XQ ? 1 : 3;                 /* A rows per token: the bf16 planes, or the f16 codes */
    static constexpr int TB = 16 / NPL;                    /* tokens per block (grid z): 5, or 16 */
    static constexpr int RB = 32 * WN;                     /* outputs (weight rows) per block */
    static constexpr int RBP = RB + 8;                     /* Sx row stride, floats (RBP % 32 == 8) */
    static constexpr int EPB = FMT == BCU_RW_FP4 ? 2 : 1;  /* elements per byte */
    static constexpr int STEPS = 4 * EPB;                  /* k16 steps per 64-byte chunk */
    static constexpr int PD = 8 / WN;                      /* chunks of weights in flight (even: two a step) */
    /* blocks per SM the registers must allow: 5 where that costs no spill (FP8, one n8 tile: 96 registers) */
    static constexpr int MINB = FMT == BCU_RW_FP8 && WN == 1 ? 5 : 4;
};

/* The shared memory of a decode block, for tbl = min(T, TB) tokens and room for ncm chunks:
 * Sx [16][RBP] f32 (rowmma's), the planes as A fragments [ncm][STEPS][32 lanes][16 bytes], the fp32 copy of x
 * [ncm][tbl][16 items of 16 EPB bytes], the FP8 scales [2][ncm] f32 (a block's RB <= 64 <= block rows span at
 * most two row blocks); XQ: the powers of two of the A rows [ncm][16] f32. */
struct DecSmem {
    size_t xp, xr, ss, xs, total;
};
template <int FMT, int WN, bool XQ>
__host__ __device__ __forceinline__ DecSmem dec_smem(int tbl, int ncm)
{
    typedef DecCfg<FMT, WN, XQ> C;
    DecSmem m;
    m.xp = (size_t)16 * C::RBP * 4;
    m.xr = m.xp + (size_t)ncm * C::STEPS * 512;
    m.ss = m.xr + (XQ ? 0 : (size_t)ncm * tbl * 256 * C::EPB); /* XQ reads x from global memory */
    m.xs = m.ss + (FMT == BCU_RW_FP8 ? (size_t)2 * ncm * 4 : 0);
    m.total = m.xs + (XQ ? (size_t)16 * ncm * 4 : 0);
    return m;
}

/* XQ (FP8 weights, x act_quant'd: bcu_rowdot_args.xq): each token's 64 columns of a chunk are e4m3 values times
 * one power of two, so x / 2^k with k = floor(log2 amax) - 8 (amax over the token's chunk) is exact in f16
 * (below 512, every set bit at or above 2^-9); the A rows are those f16 values, one row per token (16 tokens a
 * block), the weights go to f16 by one cvt per two codes (the bf16 decode takes four instructions), the tensor
 * cores take f16 x f16 -> fp32, and the chunk's sum P goes into S = fmaf(P, scale * 2^k, S).  P is the bf16
 * planes' P divided by 2^k exactly where the tensor core's sum is (scaling every product by a power of two),
 * so the sums are those of the bf16 kernel (test_rowdot_xq counts the outputs that differ). */
template <int FMT, int WN, bool XQ>
__global__ void __launch_bounds__(DecCfg<FMT, WN, XQ>::NT, DecCfg<FMT, WN, XQ>::MINB) rowdec_kernel(MmArgs a)
{
    typedef DecCfg<FMT, WN, XQ> C;
    extern __shared__ __align__(16) unsigned char rd_smem[];
    pdl_trigger(); /* a decode row-dot after this one may start its weight loads */
    const int tid = (int)threadIdx.x, lane = tid & 31, wn = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int ns = (int)gridDim.x; /* blocks of the K split (a cluster), 1 = none */
    /* groups: the block's group is rows ar0 .. of W on ax into ay (one group: a's own) */
    const int gi = a.groups > 1 ? (int)blockIdx.y / a.gtiles : 0;
    const int64_t ob = (int64_t)((int)blockIdx.y - gi * (a.groups > 1 ? a.gtiles : 0)) * C::RB;
    const float *ax = a.x + gi * a.xg;
    float *ay = a.y + gi * a.yg;
    const int64_t ar0 = a.r0 + gi * a.n;
    const int64_t t0 = (int64_t)blockIdx.z * C::TB;
    const int tbv = a.T - t0 < C::TB ? (int)(a.T - t0) : C::TB; /* this block's tokens */
    const int tbl = a.T < C::TB ? (int)a.T : C::TB;             /* the layout's */
    const int cs = ns == 1 ? 0 : (int)blockIdx.x * a.cps;
    const int ce = ns == 1 ? a.nch : min(a.nch, cs + a.cps);
    const int nc = ce - cs;
    const DecSmem L = dec_smem<FMT, WN, XQ>(tbl, ns == 1 ? a.nch : a.cps);
    float *Sx = (float *)rd_smem;          /* [16][RBP]: per-lane accumulators, then the block's partial result */
    unsigned char *Xp = rd_smem + L.xp;    /* [nc][STEPS][32 lanes][16]: the planes as A fragments */
    unsigned char *Xr = rd_smem + L.xr;    /* x as fp32, each item read back by the thread that copied it */
    float *Ss = (float *)(rd_smem + L.ss); /* FP8: [2][ncb] the block's scales */
    float *Xs = (float *)(rd_smem + L.xs); /* XQ: [chunk][A row] 2^k */
    constexpr int CH = C::STEPS * 512;     /* bytes per chunk of Xp */

    /* The lane's 16 bytes of chunk c in each of its rows (row g of each n8 tile) are wq[nt] + 64 c; they are
     * inside [c0, c0+K) and its row inside [0, n) iff (unsigned)(c - clo[nt]) < cn[nt] (else zero, as rowmma). */
    const uint8_t *wq[WN];
    const uint8_t *sq[WN]; /* FP4: the scale byte of those 32 columns is sq[nt][4 c] */
    int clo[WN];
    unsigned cn[WN];
    {
        /* the first chunk whose lane column (64 (cb + c) + 16 q) EPB is >= v */
        auto first = [&](int64_t v) -> int64_t {
            const int64_t x = v / C::EPB - 16 * q; /* v is a multiple of 16 EPB */
            return (x >= 0 ? (x + 63) >> 6 : -((-x) >> 6)) - a.cb;
        };
        const int64_t lo = first(a.c0), hi = first(a.c0 + a.K);
#pragma unroll
        for (int nt = 0; nt < WN; nt++) {
            const int64_t o = ob + 8 * (wn * WN + nt) + g;
            const int64_t r = ar0 + (o < a.n ? o : 0);
            wq[nt] = a.w + r * a.rowbytes + 64 * a.cb + 16 * q;
            sq[nt] = (const uint8_t *)a.scale + r * a.nsb + 4 * a.cb + q;
            clo[nt] = (int)lo;
            cn[nt] = o < a.n && hi > lo ? (unsigned)(hi - lo) : 0u;
        }
    }
    auto cok = [&](int nt, int c) { return (unsigned)(c - clo[nt]) < cn[nt]; };
    /* the ring: chunk c in slot (c - cs) % PD; FP4: the scale byte with it, 0x100 where the weights are zero */
    uint4 wr[C::PD][WN];
    uint32_t sr[C::PD][WN];
    auto wload = [&](int c, uint4(&dst)[WN], uint32_t(&sdst)[WN]) {
#pragma unroll
        for (int nt = 0; nt < WN; nt++) {
            const bool ok = cok(nt, c);
            dst[nt] = ok ? rd_ldg16_stream(wq[nt] + 64 * c) : make_uint4(0u, 0u, 0u, 0u);
            sdst[nt] = FMT == BCU_RW_FP4 && ok ? (uint32_t)__ldg(sq[nt] + 4 * c) : 0x100u;
        }
    };
#pragma unroll
    for (int i = 0; i < C::PD; i++)
        if (i < nc) wload(cs + i, wr[i], sr[i]);
    /* FP8: the scales of the block's row blocks (at most two) and the range's column blocks, [row block][column
     * block], asked for before the wait (no kernel writes them; only shared memory is written); the lane's outputs
     * (columns 2q, 2q+1 of each n8 tile) find theirs at Ss[sb[nt][hh] + column block] (an output past n reads row
     * block 0: its sums are never written) */
    const int cbs = FMT == BCU_RW_FP4 ? 0 : a.bshift - 6; /* chunk -> column block: >> cbs */
    const int cb32 = (int)a.cb;
    int sb[WN][2] = {};
    if (FMT == BCU_RW_FP8) {
        const int rb0 = (int)((ar0 + ob) >> a.bshift);
        const int cb0 = (cb32 + cs) >> cbs;
        const int ncb = ((cb32 + ce - 1) >> cbs) - cb0 + 1;
        const int64_t ol = (ob + C::RB < a.n ? ob + C::RB : a.n) - 1; /* the block's last output */
        const int nrb = (int)((ar0 + ol) >> a.bshift) - rb0 + 1;
        for (int i = tid; i < nrb * ncb; i += C::NT) {
            const int ri = i / ncb;
            Ss[i] = scale_at(a.scale, a.sc_dtype, (size_t)(rb0 + ri) * (size_t)a.nsb + (size_t)(cb0 + i - ri * ncb));
        }
#pragma unroll
        for (int nt = 0; nt < WN; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int64_t o = ob + 8 * (wn * WN + nt) + 2 * q + hh;
                sb[nt][hh] = (o < a.n ? (int)((ar0 + o) >> a.bshift) - rb0 : 0) * ncb - cb0;
            }
    }
    pdl_wait(); /* launched early (rd_launch_ex, pdl): x and y are the previous kernels' from here on */

    /* x of the range: item it = (chunk i, token tau, 4 EPB columns j), fp32 into Xr, zero outside [c0, c0+K) */
    const int ipc = 16 * tbv; /* items per chunk */
    for (int it = tid; !XQ && it < nc * ipc; it += C::NT) {
        const int i = it / ipc, tau = (it - i * ipc) >> 4, j = it & 15;
        const int64_t xc = 64 * (a.cb + cs + i) * C::EPB - a.c0 + 4 * C::EPB * j;
        unsigned char *dst = Xr + (size_t)it * 16 * C::EPB;
#pragma unroll
        for (int e = 0; e < C::EPB; e++) {
            if (xc >= 0 && xc < a.K) rd_cp16(dst + 16 * e, ax + (t0 + tau) * a.ldx + xc + 4 * e);
            else *(uint4 *)(dst + 16 * e) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    /* this lane's accumulator slots of Sx start at 0; the A fragments too (the rows of no token stay so) */
#pragma unroll
    for (int nt = 0; nt < WN; nt++) {
        const int nl = 8 * (wn * WN + nt) + 2 * q;
        *(float2 *)&Sx[g * C::RBP + nl] = make_float2(0.0f, 0.0f);
        *(float2 *)&Sx[(g + 8) * C::RBP + nl] = make_float2(0.0f, 0.0f);
    }
    for (int i = tid; i < nc * CH / 16; i += C::NT) *(uint4 *)(Xp + 16 * i) = make_uint4(0u, 0u, 0u, 0u);
    if (XQ)
        for (int i = tid; i < 16 * nc; i += C::NT) Xs[i] = 0.0f; /* rows of no token: P = 0 */
    __syncthreads(); /* the zeros are in before the planes */
    /* the copies of this thread land; split them into the planes, as the A fragments of rowmma_kernel's
     * registers: for the step pair h, lane 4g + q holds {a0, a1, a2, a3} of the even step at
     * Xp[chunk][2h][lane] and of the odd step at Xp[chunk][2h + 1][lane]; a0 / a2 are plane row g, a1 / a3 row
     * g + 8 (rowmma's va / vb), so one 16-byte load gives the fragment */
    rd_cp_wait();
    for (int it = tid; it < nc * ipc; it += C::NT) {
        const int j = it & 15;
        int i, tau;
        if (XQ && a.aq) { /* a warp's 32 items: the two chunks of one block of 128 columns of one token */
            const int pr = it / (2 * ipc), rem = it - pr * 2 * ipc;
            tau = rem >> 5;
            i = 2 * pr + ((rem >> 4) & 1);
        } else {
            i = it / ipc;
            tau = (it - i * ipc) >> 4;
        }
        const float4 *src = (const float4 *)(Xr + (size_t)it * 16 * C::EPB);
        float v[4 * C::EPB];
#pragma unroll
        for (int e = 0; e < C::EPB; e++) {
            float4 f;
            if (XQ) { /* straight from global memory (FP8: EPB = 1), zero outside [c0, c0+K) */
                const int64_t xc = 64 * (a.cb + cs + i) - a.c0 + 4 * j;
                f = xc >= 0 && xc < a.K ? rd_ldg_f4(ax + (t0 + tau) * a.ldx + xc) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            } else {
                f = src[e];
            }
            v[4 * e] = f.x;
            v[4 * e + 1] = f.y;
            v[4 * e + 2] = f.z;
            v[4 * e + 3] = f.w;
        }
        uint32_t s[4 * C::EPB][3];
        if (XQ && a.aq) {
            /* v4.c act_quant of the token's block (the whole warp): its scale, and the e4m3 codes' values, which
             * f16 holds exactly; the chunk's power of two is that scale */
            float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
            for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float sc = aq_scale_e4m3(m), inv = aq_inv(sc); /* v / sc, exactly */
#pragma unroll
            for (int e = 0; e < 4 * C::EPB; e += 2) { /* the conversion instructions (test_e4m3_cvt) */
                const uint32_t h = aq_e4m3x2_h(__fmul_rn(v[e], inv), __fmul_rn(v[e + 1], inv));
                s[e][0] = h & 0xffffu;
                s[e + 1][0] = h >> 16;
            }
            if (j == 0) Xs[16 * i + tau] = sc;
        } else if (XQ) {
            /* the 16 items of (chunk i, token tau) are 16 lanes of one half-warp (it = tid + 128 r, ipc % 16 = 0),
             * which all run this iteration */
            float m = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
            const unsigned hm = 0xffffu << (lane & 16);
#pragma unroll
            for (int o = 8; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(hm, m, o));
            int k = 0;
            if (m > 0.0f && m <= 3.4e38f) {
                int ex;
                (void)frexpf(m, &ex); /* m in [2^(ex-1), 2^ex) */
                k = ex - 9 < -126 ? -126 : ex - 9;
            }
            const float inv = ldexpf(1.0f, -k);
#pragma unroll
            for (int e = 0; e < 4 * C::EPB; e++) s[e][0] = __half_as_ushort(__float2half_rn(v[e] * inv));
            if (j == 0) Xs[16 * i + tau] = ldexpf(1.0f, k);
        } else {
#pragma unroll
            for (int e = 0; e < 4 * C::EPB; e++) rd_split3(v[e], s[e]);
        }
        /* rowmma's va (row g) at xoff(q, h): FP8 columns 16q + 8h .. +7 = items j = 4q + 2h (.x .y: the even
         * step's a0, a2) and 4q + 2h + 1 (.z .w: the odd step's); FP4 item j = 4q + h, the pairs (x0, x4) (x1,
         * x5) | (x2, x6) (x3, x7) */
        unsigned char *xc = Xp + (size_t)i * CH;
#pragma unroll
        for (int p = 0; p < C::NPL; p++) {
            const int m = C::NPL * tau + p, hf = m >> 3, ln = 4 * (m & 7);
            if (FMT == BCU_RW_FP4) {
                const int qq = j >> 2, h = j & 3;
                uint32_t *ev = (uint32_t *)(xc + (2 * h * 32 + ln + qq) * 16);
                uint32_t *od = (uint32_t *)(xc + ((2 * h + 1) * 32 + ln + qq) * 16);
                ev[hf] = s[0][p] | (s[4][p] << 16);
                ev[2 + hf] = s[1][p] | (s[5][p] << 16);
                od[hf] = s[2][p] | (s[6][p] << 16);
                od[2 + hf] = s[3][p] | (s[7][p] << 16);
            } else {
                const int qq = j >> 2, h = (j >> 1) & 1, odd = j & 1;
                uint32_t *f = (uint32_t *)(xc + ((2 * h + odd) * 32 + ln + qq) * 16);
                f[hf] = s[0][p] | (s[1][p] << 16);
                f[2 + hf] = s[2][p] | (s[3][p] << 16);
            }
        }
    }
    __syncthreads(); /* the planes and the scales are in; no barrier until the end */

    /* The chunk loop, two chunks a step: their products P (independent, each from zero) interleaved for the
     * tensor cores, then S += P * scale for the first and then the second, in chunk order. */
    float S[WN][4];
#pragma unroll
    for (int nt = 0; nt < WN; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) S[nt][e] = 0.0f;
    int sp = 0; /* chunks of the current slice done */
    /* the B operand of one chunk for the k16 steps 2h (b[nt][h][0..1]) and 2h+1 (b[nt][h][2..3]) */
    auto decode = [&](const uint4(&wv)[WN], const uint32_t(&s2)[WN], int h, uint32_t(&b)[WN][4]) {
#pragma unroll
        for (int nt = 0; nt < WN; nt++) {
            if (XQ) {
                const uint32_t w0 = word_of(wv[nt], 2 * h), w1 = word_of(wv[nt], 2 * h + 1);
                b[nt][0] = rd_e4m3x2_h(w0);
                b[nt][1] = rd_e4m3x2_h(w0 >> 16);
                b[nt][2] = rd_e4m3x2_h(w1);
                b[nt][3] = rd_e4m3x2_h(w1 >> 16);
            } else {
                rd_bfrag<FMT == BCU_RW_FP4>(wv[nt], h, s2[nt], b[nt]);
            }
        }
    };
    auto mma = [&](float(&d)[4], const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
        if (XQ) rd_mma_h(d, af, b0, b1);
        else rd_mma(d, af, b0, b1);
    };
    /* S += P * scale for chunk cc, and the slice's flush into Sx: ((0 + S_0) + S_1) + ... */
    auto update = [&](int cc, const float(&P)[WN][4]) {
        float sc[WN][2];
#pragma unroll
        for (int nt = 0; nt < WN; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
                sc[nt][hh] = FMT == BCU_RW_FP4 ? 1.0f : Ss[sb[nt][hh] + ((cb32 + cc) >> cbs)];
        if (XQ) { /* the powers of two of A rows g and g + 8 (outputs e = 0, 1 and 2, 3) */
            const float xg = Xs[16 * (cc - cs) + g], xg8 = Xs[16 * (cc - cs) + g + 8];
#pragma unroll
            for (int nt = 0; nt < WN; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    S[nt][e] = fmaf(P[nt][e], __fmul_rn(sc[nt][e & 1], e < 2 ? xg : xg8), S[nt][e]);
        } else {
#pragma unroll
            for (int nt = 0; nt < WN; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] = fmaf(P[nt][e], sc[nt][e & 1], S[nt][e]);
        }
        if (++sp == a.cps || cc + 1 == a.nch) { /* block-uniform */
            sp = 0;
#pragma unroll
            for (int nt = 0; nt < WN; nt++) {
                const int nl = 8 * (wn * WN + nt) + 2 * q;
                float2 *d0 = (float2 *)&Sx[g * C::RBP + nl], *d1 = (float2 *)&Sx[(g + 8) * C::RBP + nl];
                float2 v0 = *d0, v1 = *d1;
                v0.x = v0.x + S[nt][0];
                v0.y = v0.y + S[nt][1];
                v1.x = v1.x + S[nt][2];
                v1.y = v1.y + S[nt][3];
                *d0 = v0;
                *d1 = v1;
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] = 0.0f;
            }
        }
    };
    for (int c = cs; c < ce; c += C::PD) {
#pragma unroll
        for (int i = 0; i < C::PD; i += 2) {
            const int ca = c + i, cb2 = ca + 1;
            if (ca >= ce) break;       /* block-uniform */
            const bool hb = cb2 < ce; /* block-uniform: the step has a second chunk */
            uint4 wa[WN], wb[WN];
            uint32_t s2a[WN], s2b[WN];
#pragma unroll
            for (int nt = 0; nt < WN; nt++) {
                wa[nt] = wr[i][nt];
                wb[nt] = wr[i + 1][nt];
                s2a[nt] = FMT == BCU_RW_FP4 && sr[i][nt] < 0x100u ? ue8m0_bf16x2(sr[i][nt]) : 0u;
                s2b[nt] = FMT == BCU_RW_FP4 && sr[i + 1][nt] < 0x100u ? ue8m0_bf16x2(sr[i + 1][nt]) : 0u;
            }
            if (ca + C::PD < ce) wload(ca + C::PD, wr[i], sr[i]);
            if (cb2 + C::PD < ce) wload(cb2 + C::PD, wr[i + 1], sr[i + 1]);
            const unsigned char *xa = Xp + (size_t)(ca - cs) * CH, *xb = hb ? xa + CH : xa;
            float Pa[WN][4], Pb[WN][4];
#pragma unroll
            for (int nt = 0; nt < WN; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    Pa[nt][e] = 0.0f;
                    Pb[nt][e] = 0.0f;
                }
#pragma unroll
            for (int h = 0; h < C::STEPS / 2; h++) {
                uint32_t ba[WN][4], bb[WN][4];
                decode(wa, s2a, h, ba);
                decode(wb, s2b, h, bb);
                const uint4 fae = *(const uint4 *)(xa + (2 * h * 32 + lane) * 16);
                const uint4 fao = *(const uint4 *)(xa + ((2 * h + 1) * 32 + lane) * 16);
                const uint4 fbe = *(const uint4 *)(xb + (2 * h * 32 + lane) * 16);
                const uint4 fbo = *(const uint4 *)(xb + ((2 * h + 1) * 32 + lane) * 16);
                const uint32_t ae[4] = {fae.x, fae.y, fae.z, fae.w}, ao[4] = {fao.x, fao.y, fao.z, fao.w};
                const uint32_t be[4] = {fbe.x, fbe.y, fbe.z, fbe.w}, bo[4] = {fbo.x, fbo.y, fbo.z, fbo.w};
#pragma unroll
                for (int nt = 0; nt < WN; nt++) {
                    mma(Pa[nt], ae, ba[nt][0], ba[nt][1]);
                    mma(Pb[nt], be, bb[nt][0], bb[nt][1]);
                }
#pragma unroll
                for (int nt = 0; nt < WN; nt++) {
                    mma(Pa[nt], ao, ba[nt][2], ba[nt][3]);
                    mma(Pb[nt], bo, bb[nt][2], bb[nt][3]);
                }
            }
            update(ca, Pa);
            if (hb) update(cb2, Pb);
        }
    }

    rd_store_y<C>(a, ay, Sx, ns, tid, tbv, ob, t0); /* as rowmma_kernel */
}

/* the chunking of [c0, c0+K) and the slices: a function of the weight and the slice only */
struct MmGeom {
    int64_t cb;
    int nch, cps, nsl;
};

/* log2 of a power-of-two block size (the weight scales' block: 1 << shift columns or rows) */
static int block_shift(int block)
{
    int bs = 0;
    while ((1 << bs) < block) bs++;
    return bs;
}

static MmGeom mm_geom(const bcu_rowdot_args *p)
{
    const int epb = p->fmt == BCU_RW_FP4 ? 2 : 1;
    const int64_t b0 = p->c0 / epb, b1 = (p->c0 + p->K) / epb; /* bytes [b0, b1) of a row */
    MmGeom g;
    g.cb = b0 >> 6;
    g.nch = (int)(((b1 + 63) >> 6) - g.cb);
    int nsl = (g.nch + 7) / 8;
    if (nsl > 8) nsl = 8;
    g.cps = (g.nch + nsl - 1) / nsl;
    g.nsl = (g.nch + g.cps - 1) / g.cps;
    return g;
}

static bool mm_supported(const bcu_rowdot_args *p)
{
    const int64_t ng = p->groups > 1 ? p->groups : 1;
    if (p->K <= 0 || p->c0 < 0 || p->r0 < 0 || p->c0 + p->K > p->wcols || p->r0 + ng * p->n > p->wrows) return false;
    if (ng > 1 && (p->xg < 0 || p->xg % 4 || p->yg < 0 || ng > 65535)) return false; /* x + g xg: 16-byte aligned */
    if ((uintptr_t)p->x % 16 || (uintptr_t)p->w % 16 || !p->scale) return false;
    if ((p->ldx ? p->ldx : p->K) % 4 || (p->ldx && p->ldx < p->K) || (p->ldy && p->ldy < p->n)) return false;
    if ((p->K + 63) / 64 > 0x3fffffff) return false;
    if (p->fmt == BCU_RW_FP8) {
        const int b = p->block;
        if (b < 64 || (b & (b - 1))) return false;
        if (((p->wrows + b - 1) / b) * ((p->wcols + b - 1) / b) >= ((int64_t)1 << 31)) return false;
        if (p->sc_dtype != BCU_SC_E8M0 && p->sc_dtype != BCU_SC_F32 && p->sc_dtype != BCU_SC_BF16) return false;
        return p->wcols % 16 == 0 && p->c0 % 16 == 0 && p->K % 16 == 0;
    }
    if (p->fmt == BCU_RW_FP4)
        return p->block == 32 && p->sc_dtype == BCU_SC_E8M0 && p->wcols % 32 == 0 && p->c0 % 32 == 0 &&
               p->K % 32 == 0;
    return false;
}

template <int FMT, int MTW, int WN, int WGM, int WGN>
static cudaError_t mm_launch_cfg(const MmArgs &a, int64_t n, int64_t T, int nsl, int split, cudaStream_t st)
{
    typedef MmCfg<FMT, MTW, WN, WGM, WGN> C;
    void (*kern)(MmArgs) = rowmma_kernel<FMT, MTW, WN, WGM, WGN>;
    const int64_t gy = (n + C::RB - 1) / C::RB, gz = (T + C::TB - 1) / C::TB;
    if (gy > 65535 || gz > 65535) return cudaErrorInvalidConfiguration;
    static std::atomic<unsigned long long> attr_set(0);
    if (const cudaError_t e = rd_smem_attr_once(attr_set, kern, C::SMEM); e != cudaSuccess) return e;
    int ns = 1;
    if (nsl > 1 && (split == 2 || (split == 0 && gy * gz < 2 * (int64_t)bcu_sm_count()))) ns = nsl;
    if (ns > 1 && split != 2) {
        static std::atomic<int> fits[9]; /* per cluster size: 0 not asked, 1 fits, 2 does not */
        int f = fits[ns].load(std::memory_order_relaxed);
        if (!f) {
            f = rd_cluster_fits(kern, ns, C::NT, C::SMEM) ? 1 : 2;
            fits[ns].store(f, std::memory_order_relaxed);
        }
        if (f != 1) ns = 1; /* the same sums, without the split */
    }
    cudaError_t e = rd_launch(kern, dim3((unsigned)ns, (unsigned)gy, (unsigned)gz), dim3(C::NT), C::SMEM, ns, st, a);
    if (e != cudaSuccess && ns > 1 && split != 2) {
        (void)cudaGetLastError(); /* a cluster launch refused: the same sums without the split */
        e = rd_launch(kern, dim3(1u, (unsigned)gy, (unsigned)gz), dim3(C::NT), C::SMEM, 1, st, a);
    }
    return e;
}

#define DEC_SMEM_MAX (96 * 1024) /* the decode kernel's shared memory: at most this (two blocks per SM) */

/* the decode kernel of WN n8 tiles per warp may take DEC_SMEM_MAX of shared memory (set once per device) */
template <int FMT, int WN, bool XQ>
static cudaError_t dec_prepare(void)
{
    static std::atomic<unsigned long long> attr_set(0);
    return rd_smem_attr_once(attr_set, rowdec_kernel<FMT, WN, XQ>, DEC_SMEM_MAX);
}

/* how many clusters of ns blocks of it with smem bytes each fit the device at once (cached per device, ns and
 * smem in KB; after dec_prepare) */
template <int FMT, int WN, bool XQ>
static int dec_capacity(int ns, size_t smem)
{
    static std::atomic<unsigned long long> cache[64]; /* (key << 16) | (capacity + 1), 0: empty */
    const int dev = rd_device();
    const unsigned long long key = ((unsigned long long)(dev & 63) << 32) | ((unsigned long long)ns << 24) |
                                   (unsigned long long)((smem + 1023) / 1024);
    for (int i = 0; i < 64; i++) {
        const unsigned long long v = cache[i].load(std::memory_order_relaxed);
        if (!v) break;
        if (v >> 16 == key) return (int)(v & 0xffff) - 1;
    }
    int cap = rd_max_clusters(rowdec_kernel<FMT, WN, XQ>, ns, DecCfg<FMT, WN, XQ>::NT, ((smem + 1023) / 1024) * 1024);
    if (cap > 65534) cap = 65534;
    for (int i = 0; i < 64; i++) {
        unsigned long long e = 0;
        if (cache[i].compare_exchange_strong(e, (key << 16) | (unsigned long long)(cap + 1)) || e >> 16 == key) break;
    }
    return cap;
}

/* The decode kernel's shape.  Two n8 tiles per warp (64 outputs per block) where that grid, with every slice a
 * block, fills the GPU twice over, else one (32 outputs per block; more blocks per SM: its registers allow 5).
 * The K split (every slice a block of a cluster) where the grid would not fill the GPU twice over, or where the
 * whole row does not fit DEC_SMEM_MAX.  (What the H200 said, 2026-11-30: fewer waves of bigger blocks beat more
 * waves of smaller ones unless the grid is small; a model of waves x bytes per block chose worse.)  *took false
 * (nothing launched) where the shape does not fit DEC_SMEM_MAX as asked (split 1, or split 2 with too long
 * slices). */
template <int FMT, bool XQ>
static cudaError_t dec_launch(const MmArgs &a, int64_t n, int64_t T, int nsl, int split, cudaStream_t st, bool *took)
{
    *took = false;
    constexpr int TB = DecCfg<FMT, 1, XQ>::TB;
    const int tbl = T < TB ? (int)T : TB;
    const int64_t gz = (T + TB - 1) / TB, sms = bcu_sm_count(), ng = a.groups > 1 ? a.groups : 1;
    const int wn = (n * ng + 63) / 64 * nsl * gz >= 2 * sms ? 2 : 1;
    const int64_t gyg = (n + 32 * wn - 1) / (32 * wn), gy = gyg * ng; /* row tiles per group, in all */
    if (gy > 65535 || gz > 65535) return cudaErrorInvalidConfiguration;
    MmArgs b = a;
    b.gtiles = (int)gyg;
    cudaError_t e = wn == 2 ? dec_prepare<FMT, 2, XQ>() : dec_prepare<FMT, 1, XQ>();
    if (e != cudaSuccess) return e;
    const size_t s1 = wn == 2 ? dec_smem<FMT, 2, XQ>(tbl, a.nch).total : dec_smem<FMT, 1, XQ>(tbl, a.nch).total;
    const size_t sk = wn == 2 ? dec_smem<FMT, 2, XQ>(tbl, a.cps).total : dec_smem<FMT, 1, XQ>(tbl, a.cps).total;
    int ns = 1;
    if (nsl > 1 && (split == 2 || (split == 0 && (gy * gz < 2 * sms || s1 > DEC_SMEM_MAX)))) ns = nsl;
    if (ns > 1 && split != 2 &&
        (sk > DEC_SMEM_MAX || (wn == 2 ? dec_capacity<FMT, 2, XQ>(ns, sk) : dec_capacity<FMT, 1, XQ>(ns, sk)) <= 0))
        ns = 1; /* the same sums without the split */
    if (a.aq && ns > 1 && a.cps % 2) { /* act_quant's blocks of 128 columns are two chunks: whole in a slice */
        if (split == 2) return cudaSuccess;
        ns = 1;
    }
    const size_t sm = ns > 1 ? sk : s1;
    if (sm > DEC_SMEM_MAX) return cudaSuccess;
    *took = true;
    void (*kern)(MmArgs) = wn == 2 ? rowdec_kernel<FMT, 2, XQ> : rowdec_kernel<FMT, 1, XQ>;
    e = rd_launch_ex(kern, dim3((unsigned)ns, (unsigned)gy, (unsigned)gz), dim3(128), sm, ns, true, st, b);
    if (e != cudaSuccess && ns > 1 && split != 2) {
        (void)cudaGetLastError(); /* a cluster launch refused: the same sums without the split, if they fit */
        if (s1 > DEC_SMEM_MAX) {
            *took = false;
            return cudaSuccess;
        }
        e = rd_launch_ex(kern, dim3(1u, (unsigned)gy, (unsigned)gz), dim3(128), s1, 1, true, st, b);
    }
    return e;
}

/* the decode kernel on f16 codes: FP8 weights and x act_quant'd (bcu_rowdot_args.xq) */
static bool dec_xq(const bcu_rowdot_args *p) { return p->xq && p->fmt == BCU_RW_FP8; }

template <int FMT>
static cudaError_t dec_launch_p(const MmArgs &a, const bcu_rowdot_args *p, int nsl, cudaStream_t st, bool *took)
{
    if constexpr (FMT == BCU_RW_FP8)
        if (dec_xq(p)) return dec_launch<FMT, true>(a, p->n, p->T, nsl, p->split, st, took);
    return dec_launch<FMT, false>(a, p->n, p->T, nsl, p->split, st, took);
}

/* ---- the GEMV kernel (T <= 24 act_quant'd tokens on f16 codes, or T <= 8 raw tokens as bf16 planes)
 *
 * The decode kernel's sums with the operands' roles swapped and the K split inside the block.  The weights are the
 * A operand (m16 = 16 weight rows; lane (g, q) streams 16 bytes of rows g and g + 8 a chunk, the same bytes a
 * decode-kernel lane streams of its row), the B operand's 8 columns are the tokens (xq: x as f16 codes) or each
 * token's three bf16 planes (xq = 0), 16 bytes of a column's row a lane and step from shared memory.  A warp owns
 * one or two 16-row tiles and one slice of their chunks, so its chain S = fmaf(P, sw sx, S) runs over its own
 * chunks only, and the slices meet in slice order through shared memory at the end: no cluster, no distributed
 * shared memory.  The products and their order are the decode kernel's (the same 16 k positions a k16 step, P from
 * zero over a chunk's four steps, one fmaf a chunk, ((0 + S_0) + S_1) + ..., the planes as A_hi + (A_mid + A_lo)),
 * and on the H200 the tensor core sums a (row, column) element the same whichever operand holds which:
 * test_rowdot_gemv and test_rowdot_grouped find no bit that differs.
 * What it buys (bench_cuda_linear, H200, 2026-12-01): where the decode kernel needs its cluster split of long rows,
 * the grouped wo_a (8 x 1024 x 4096, T = 1: 20.1 -> 14.8 us) and wo_b (4096 x 8192: 20.0 -> 16.9 us); in one
 * decode step of the 4-layer slice (ncu) the row-dots' kernel time went 445 -> 413 us.  Not the instruction count:
 * at T = 1 the decode kernel issues 177 warp instructions a KB (ncu), this kernel's chunk loop 65 (SASS), yet
 * without its maths this kernel (DEEPINFER_CUDA_GEMV_NOMATH) is only 10% faster than with it, and a plain stream
 * of the same bytes (bcu_read_probe) takes 10.2 us for 32 MB and 4.3-5.3 us for 2-8 MB: the small weights are at
 * a kernel's latency floor, where the decode kernel stays (gv_pick). */
struct GvSmem {
    size_t xs, ws, sp, z, total;
};
#define GV_NRB 6 /* row blocks of weight scales a block may span: 256 rows, blocks of >= 64, misaligned */
#define GV_NG 3  /* n8 groups of B columns at most: 24 columns (8 act_quant'd tokens' planes, or 24 tokens' codes) */
/* shared memory for nb B columns in ng groups of 8 (nc = 8 ng) over the block's kx columns of x (nchl chunks): x
 * codes [nb][kx + 8] f16, x scales [nchl][nc] f32, weight scales [GV_NRB][ncb] f32, slice sums [8 warps][32
 * rows][nc] f32, 32 zero bytes */
__host__ __device__ __forceinline__ GvSmem gv_smem(int nb, int64_t kx, int nchl, int ncb, int nc)
{
    GvSmem m;
    m.xs = ((size_t)nb * (size_t)(kx + 8) * 2 + 15) & ~(size_t)15;
    m.ws = m.xs + (size_t)nchl * (size_t)nc * 4;
    m.sp = (m.ws + (size_t)GV_NRB * ncb * 4 + 15) & ~(size_t)15;
    m.z = m.sp + (size_t)8 * 32 * nc * 4;
    m.total = m.z + 32;
    return m;
}
#define GV_XMAX (56 * 1024) /* the x codes' (planes') shared memory at most */
/* the whole block's at most: x in GV_XMAX caps a block's columns at 28664 (one B column), so the x scales (32
 * bytes a chunk: 14 KB), the weight scales (GV_NRB x 4 bytes a column block: 11 KB at blocks of 64) and the slice
 * sums (8 KB a group of 8 columns) stay under it */
#define GV_SMAX (96 * 1024)

/* four units u0 + s k (k < 4) of x, a float4 each from at(u), zeros from nu on: the four loads in flight before
 * any is used */
template <typename F>
__device__ __forceinline__ void gv_load4(float4 (&v)[4], int u0, int s, int nu, F at)
{
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int u = u0 + s * k;
        v[k] = u < nu ? at(u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

/* PD chunks of weights in flight a lane, WT 16-row tiles a warp (a lane streams 2 WT rows: 32 WT PD bytes in
 * flight), MINB blocks an SM, NG n8 groups of B columns.  Grid (ns x tile groups, groups), clusters of ns along x:
 * the K split.  The nsl slices of a row are dealt to the ns blocks of a cluster, slr each (rank r: slices [r slr,
 * r slr + slr)), and a block stages only its slices' columns of x; a block's warp w owns tiles [WT (rt b + w /
 * slr), +WT) and slice r slr + w % slr.  The sums meet in slice order across the cluster through distributed
 * shared memory, so the split changes no bit. */
template <int PD, int WT, int MINB, bool MATH, bool PL, int NG, bool KS>
__global__ void __launch_bounds__(256, MINB) rowgv_kernel(MmArgs a, int rt, int slr, int nsl, int nsa, int ncb, int nostage)
{
    extern __shared__ __align__(16) unsigned char rd_smem[];
    constexpr int NC = 8 * NG; /* B columns the block's mma cover */
    const int ns = KS ? nsa : 1; /* KS false: no split (and no registers for one) */
    pdl_trigger(); /* a row-dot after this one may start its weight loads */
    const int tid = (int)threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int T = (int)a.T, NB = PL ? 3 * T : T; /* B columns: tokens, or their planes */
    const int rank = ns > 1 ? (int)(blockIdx.x % (unsigned)ns) : 0;
    const int gi = (int)blockIdx.y;
    const float *ax = a.x + gi * a.xg;
    float *ay = a.y + gi * a.yg;
    const int64_t ar0 = a.r0 + gi * a.n;
    const int64_t ntl = (a.n + 15) >> 4;
    const int64_t tile0 = (int64_t)(blockIdx.x / (unsigned)ns) * rt * WT; /* the block's first tile */
    const int sl = KS ? slr : nsl;
    const int tl = w / sl, js = rank * sl + (w - tl * sl);
    const int64_t tw = tile0 + (int64_t)tl * WT; /* the warp's first tile */
    const bool act = tl < rt && tw < ntl && js < nsl;
    const int cs = js * a.cps, ce = min(a.nch, cs + a.cps);
    /* the block's chunks [kc0, kc0 + nchl): x columns [64 kc0, 64 (kc0 + nchl)); the layout is the same in every
     * block of the cluster (the last one's chunks may be fewer), so that a peer's Sp is at this block's offset */
    const int kc0 = rank * sl * a.cps, nchl = min(a.nch, kc0 + sl * a.cps) - kc0, nchm = min(a.nch, sl * a.cps);
    const int KX = 64 * nchl, XLD = 64 * nchm + 8;
    const GvSmem L = gv_smem(NB, 64 * nchm, nchm, ncb, NC);
    __half *Xh = (__half *)rd_smem;
    float *Xs = (float *)(rd_smem + L.xs);
    float *Ws = (float *)(rd_smem + L.ws);
    float *Sp = (float *)(rd_smem + L.sp);
    uint4 *Z = (uint4 *)(rd_smem + L.z);

    /* the lane's rows g and g + 8 of each tile: 16 bytes at 16 q of each chunk; zeros past n */
    const uint8_t *wr[2 * WT]; /* rows 8 i apart: one base and a stride (a row past n is never read) */
    bool ok[2 * WT];
    {
        const uint8_t *wb = a.w + (ar0 + (act ? tw * 16 + g : 0)) * a.rowbytes + 64 * a.cb + 16 * q;
#pragma unroll
        for (int i = 0; i < 2 * WT; i++) {
            ok[i] = act && tw * 16 + g + 8 * i < a.n;
            wr[i] = wb + 8 * i * a.rowbytes;
        }
    }
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    /* the ring's first chunks are asked for before the wait (no kernel writes weights), and so are the weight scales
     * of the block's row blocks and the chunks' column blocks (into shared memory: nothing global is written).  After
     * x they were one more round trip, queued behind the ring's loads: wo_b at T = 1 16.9 -> 14.3 us (H200) */
    uint4 ring[PD][2 * WT];
#pragma unroll
    for (int p = 0; p < PD; p++)
#pragma unroll
        for (int i = 0; i < 2 * WT; i++)
            ring[p][i] = ok[i] && cs + p < ce ? rd_ldg16_stream(wr[i] + 64 * (cs + p)) : zero;
    const int cbs = a.bshift - 6;
    const int cb0 = (int)(a.cb >> cbs);
    const int64_t rb0 = (ar0 + tile0 * 16) >> a.bshift;
    {
        const int64_t last = min(ar0 + (tile0 + (int64_t)rt * WT) * 16, ar0 + a.n) - 1;
        const int nrb = (int)((last >> a.bshift) - rb0 + 1);
        for (int i = tid; i < nrb * ncb; i += 256) {
            const int ri = i / ncb;
            Ws[i] = scale_at(a.scale, a.sc_dtype, (size_t)(rb0 + ri) * (size_t)a.nsb + (size_t)(cb0 + i - ri * ncb));
        }
    }
    pdl_wait(); /* x and y are the previous kernels' from here on */
    const float *axk = ax + 64 * kc0;
    auto xat = [&](int tau, int col) { return rd_ldg_f4(axk + tau * a.ldx + col); }; /* x's float4 (tau, kc0 + col) */

    /* x as f16 codes and the scale of each (chunk, token); tokens >= T: scale 0 (and no codes: those lanes read
     * Z).  Four units of x a lane are loaded before any is used.  (nostage: a timing probe without it, wrong sums) */
    if (nostage) {
    } else if (PL) { /* raw x: the three bf16 planes of each value (rd_split3), plane p of token tau in row 3 tau + p */
        const int n4 = KX >> 2, nu = T * n4;
        for (int u0 = tid; u0 < nu; u0 += 1024) {
            float4 v[4];
            gv_load4(v, u0, 256, nu, [&](int u) { return xat(u / n4, 4 * (u % n4)); });
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int u = u0 + 256 * k, tau = u / n4, i = u - tau * n4;
                if (u >= nu) break;
                uint32_t s0[3], s1[3], s2[3], s3[3];
                rd_split3(v[k].x, s0);
                rd_split3(v[k].y, s1);
                rd_split3(v[k].z, s2);
                rd_split3(v[k].w, s3);
#pragma unroll
                for (int pl = 0; pl < 3; pl++)
                    *(uint2 *)(Xh + (size_t)(3 * tau + pl) * XLD + 4 * i) =
                        make_uint2(s0[pl] | (s1[pl] << 16), s2[pl] | (s3[pl] << 16));
            }
        }
    } else if (a.aq) { /* act_quant (v4.c fq_fp8) of each block of 128 columns of a token: one warp, a float4 a lane
                        * (kc0 is even: gv_deal) */
        const int nb = KX >> 7, nu = T * nb;
        for (int u0 = w; u0 < nu; u0 += 32) {
            float4 v[4];
            gv_load4(v, u0, 8, nu, [&](int u) { return xat(u / nb, 128 * (u % nb) + 4 * lane); });
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int u = u0 + 8 * k, tau = u / nb, b = u - tau * nb;
                if (u >= nu) break; /* warp-uniform */
                const float sc = aq_warp_scale_e4m3(v[k]), inv = aq_inv(sc); /* v / sc, exactly */
                uint2 st;
                st.x = aq_e4m3x2_h(__fmul_rn(v[k].x, inv), __fmul_rn(v[k].y, inv));
                st.y = aq_e4m3x2_h(__fmul_rn(v[k].z, inv), __fmul_rn(v[k].w, inv));
                *(uint2 *)(Xh + (size_t)tau * XLD + 128 * b + 4 * lane) = st;
                if (lane == 0) Xs[(2 * b) * NC + tau] = Xs[(2 * b + 1) * NC + tau] = sc;
            }
        }
    } else { /* x act_quant'd already: each (token, chunk) over a half-warp, x / 2^k exact in f16 as the decode kernel */
        const int nu = T * nchl, hl = lane & 15;
        for (int u0 = 2 * w; u0 < nu; u0 += 64) {
            float4 f[4];
            gv_load4(f, u0 + (lane >> 4), 16, nu, [&](int u) { return xat(u / nchl, 64 * (u % nchl) + 4 * hl); });
#pragma unroll
            for (int k = 0; k < 4; k++) {
                if (u0 + 16 * k >= nu) break; /* warp-uniform */
                const int u = u0 + 16 * k + (lane >> 4), tau = u / nchl, c = u - tau * nchl;
                float m = fmaxf(fmaxf(fabsf(f[k].x), fabsf(f[k].y)), fmaxf(fabsf(f[k].z), fabsf(f[k].w)));
#pragma unroll
                for (int o = 8; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                int e = 0;
                if (m > 0.0f && m <= 3.4e38f) {
                    int ex;
                    (void)frexpf(m, &ex);
                    e = ex - 9 < -126 ? -126 : ex - 9;
                }
                const float inv = ldexpf(1.0f, -e);
                const __half2 h01 = __halves2half2(__float2half_rn(f[k].x * inv), __float2half_rn(f[k].y * inv));
                const __half2 h23 = __halves2half2(__float2half_rn(f[k].z * inv), __float2half_rn(f[k].w * inv));
                if (u < nu) {
                    uint2 st;
                    st.x = *(const uint32_t *)&h01;
                    st.y = *(const uint32_t *)&h23;
                    *(uint2 *)(Xh + (size_t)tau * XLD + 64 * c + 4 * hl) = st;
                    if (hl == 0) Xs[c * NC + tau] = ldexpf(1.0f, e);
                }
            }
        }
    }
    for (int i = tid; !PL && !nostage && i < nchl * (NC - T); i += 256) {
        const int c = i / (NC - T);
        Xs[c * NC + T + (i - c * (NC - T))] = 0.0f;
    }
    if (tid < 2) Z[tid] = zero;
    __syncthreads();

    float S[WT][NG][4];
#pragma unroll
    for (int t = 0; t < WT; t++)
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) S[t][j][e] = 0.0f;
    if (act) {
        /* B column 8 j + g's 16 codes (planes) of chunk c: xp[j] + 64 c, the block's first chunk kc0 folded into
         * the base (lanes of no column read the zeros); its scales Xk[NC c + column] */
        const __half *xp[NG];
        int xst[NG];
#pragma unroll
        for (int j = 0; j < NG; j++) {
            const int col = 8 * j + g;
            xp[j] = col < NB ? Xh + (size_t)col * XLD + 16 * q - 64 * kc0 : (const __half *)Z;
            xst[j] = col < NB ? 64 : 0;
        }
        const float *Xk = Xs - NC * kc0;
        const float *wsr[WT]; /* tile t's scale row, by column block */
#pragma unroll
        for (int t = 0; t < WT; t++) wsr[t] = Ws + (int)(((ar0 + (tw + t) * 16) >> a.bshift) - rb0) * ncb - cb0;
        const int cbb = (int)a.cb;
        for (int base = cs; base < ce; base += PD) {
#pragma unroll
            for (int p = 0; p < PD; p++) {
                const int c = base + p;
                if (c >= ce) break; /* warp-uniform */
                const uint4 *v = ring[p];
                uint4 xa[NG], xb[NG];
                float2 sx[NG];
#pragma unroll
                for (int j = 0; j < NG; j++) {
                    xa[j] = *(const uint4 *)(xp[j] + c * xst[j]);
                    xb[j] = *(const uint4 *)(xp[j] + c * xst[j] + 8);
                    sx[j] = PL ? make_float2(1.0f, 1.0f) : *(const float2 *)&Xk[c * NC + 8 * j + 2 * q];
                }
#pragma unroll
                for (int t = 0; t < WT && !MATH; t++) { /* a probe of the loads alone (DEEPINFER_CUDA_GEMV_NOMATH) */
                    S[t][0][0] += __uint_as_float((v[2 * t].x ^ v[2 * t + 1].y) & 0x3fffffffu);
                    S[t][0][1] += __uint_as_float((v[2 * t].y ^ v[2 * t + 1].z) & 0x3fffffffu);
                    S[t][0][2] += __uint_as_float((v[2 * t].z ^ v[2 * t + 1].w ^ xa[0].x) & 0x3fffffffu);
                    S[t][0][3] += __uint_as_float((v[2 * t].w ^ v[2 * t + 1].x ^ xb[0].y) & 0x3fffffffu) * sx[0].x;
                }
#pragma unroll
                for (int t = 0; t < WT && MATH; t++) {
                    float P[NG][4];
#pragma unroll
                    for (int j = 0; j < NG; j++) P[j][0] = P[j][1] = P[j][2] = P[j][3] = 0.0f;
#pragma unroll
                    for (int s4 = 0; s4 < 4; s4++) {
                        const uint32_t wa = word_of(v[2 * t], s4), wb = word_of(v[2 * t + 1], s4);
                        if (PL) { /* e4m3 -> bf16 exactly, bf16 planes */
                            const uint32_t af[4] = {rd_e4m3x2(wa), rd_e4m3x2(wb), rd_e4m3x2(wa >> 16), rd_e4m3x2(wb >> 16)};
#pragma unroll
                            for (int j = 0; j < NG; j++) {
                                const uint4 &xv = s4 < 2 ? xa[j] : xb[j];
                                rd_mma(P[j], af, word_of(xv, (2 * s4) & 3), word_of(xv, (2 * s4 + 1) & 3));
                            }
                        } else {
                            const uint32_t af[4] = {rd_e4m3x2_h(wa), rd_e4m3x2_h(wb), rd_e4m3x2_h(wa >> 16),
                                                    rd_e4m3x2_h(wb >> 16)};
#pragma unroll
                            for (int j = 0; j < NG; j++) {
                                const uint4 &xv = s4 < 2 ? xa[j] : xb[j];
                                rd_mma_h(P[j], af, word_of(xv, (2 * s4) & 3), word_of(xv, (2 * s4 + 1) & 3));
                            }
                        }
                    }
                    const float sw = wsr[t][(cbb + c) >> cbs];
#pragma unroll
                    for (int j = 0; j < NG; j++) {
                        const float m0 = PL ? sw : __fmul_rn(sw, sx[j].x), m1 = PL ? sw : __fmul_rn(sw, sx[j].y);
                        S[t][j][0] = fmaf(P[j][0], m0, S[t][j][0]);
                        S[t][j][1] = fmaf(P[j][1], m1, S[t][j][1]);
                        S[t][j][2] = fmaf(P[j][2], m0, S[t][j][2]);
                        S[t][j][3] = fmaf(P[j][3], m1, S[t][j][3]);
                    }
                }
                if (c + PD < ce) /* the slot is free: chunk c + PD into it */
#pragma unroll
                    for (int i = 0; i < 2 * WT; i++) ring[p][i] = ok[i] ? rd_ldg16_stream(wr[i] + 64 * (c + PD)) : zero;
            }
        }
    }
    /* tile t's rows g, g + 8, columns 8 j + 2q, 8 j + 2q + 1 of this warp's slice: Sp[w][16 t + row][column] */
#pragma unroll
    for (int t = 0; t < WT; t++)
#pragma unroll
        for (int j = 0; j < NG; j++) {
            *(float2 *)&Sp[(w * 32 + 16 * t + g) * NC + 8 * j + 2 * q] = make_float2(S[t][j][0], S[t][j][1]);
            *(float2 *)&Sp[(w * 32 + 16 * t + g + 8) * NC + 8 * j + 2 * q] = make_float2(S[t][j][2], S[t][j][3]);
        }
    if (ns > 1) rd_cluster_sync();
    else __syncthreads();
    /* ((0 + S_0) + S_1) + ... over the row's nsl slices in order, wherever in the cluster each was summed; the
     * cluster's blocks share the block's outputs */
    const int rows = rt * WT * 16;
    for (int e = rank * 256 + tid; e < rows * T; e += ns * 256) {
        const int rb = e / T, tau = e - rb * T; /* the block's row rb: warp group rb / (16 WT) */
        const int t2 = rb / (16 * WT), rw = rb - t2 * 16 * WT;
        const int64_t o = tile0 * 16 + rb;
        if (o >= a.n) continue;
        const int col = PL ? 3 * tau : tau;
        float acc = 0.0f, a1 = 0.0f, a2 = 0.0f;
        for (int j = 0; j < nsl; j++) {
            const int r = KS ? j / sl : 0;
            const float *sp = (ns > 1 ? rd_cluster_peer(Sp, r) : Sp) + ((t2 * sl + j - r * sl) * 32 + rw) * NC + col;
            acc = acc + sp[0];
            if (PL) {
                a1 = a1 + sp[1];
                a2 = a2 + sp[2];
            }
        }
        ay[tau * a.ldy + o] = PL ? acc + (a1 + a2) : acc;
    }
    if (ns > 1) rd_cluster_sync(); /* the peers' shared memory stays until every block has read it */
}

/* the environment variable name, read once into cache: 1 + the index of its value among the n vals, 0 if it is
 * unset or none of them */
static int env_once(std::atomic<int> &cache, const char *name, const char *const *vals, int n)
{
    int v = cache.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv(name);
        v = 0;
        for (int i = 0; e && i < n && !v; i++)
            if (!strcmp(e, vals[i])) v = 1 + i;
        cache.store(v, std::memory_order_relaxed);
    }
    return v;
}

/* DEEPINFER_CUDA_GEMV: 0 turns the GEMV kernel off (the decode kernel runs, the same bits); 2 runs it wherever it
 * can (an experiment's setting); else 1, where gv_pick takes it */
static int gv_env(void)
{
    static std::atomic<int> cache(-1);
    static const char *const vals[] = {"0", "2"};
    const int v = env_once(cache, "DEEPINFER_CUDA_GEMV", vals, 2);
    return v == 1 ? 0 : v == 2 ? 2 : 1;
}

/* The GEMV kernel's plan for these arguments: its B columns (tokens, or three planes a token) in n8 groups, and
 * its K split: the row's nsl slices dealt to the ns blocks of a cluster, slr a block. */
struct GvPlan {
    int nb, ng;  /* B columns, n8 groups of them */
    int ns, slr; /* blocks of the cluster (1: no split), slices a block */
    int nsl;     /* slices of a row (mm_geom) */
    int ncb;     /* column blocks of weight scales the row spans */
    size_t sm;   /* a block's shared memory */
};

/* the deal of ns blocks a cluster, if it is one (no fewer blocks give it) and a block's columns of x fit GV_XMAX
 * (act_quant in the kernel: an even number of chunks a block, so that its blocks of 128 columns stay whole) */
static bool gv_deal(const bcu_rowdot_args *p, const MmGeom &gm, int nb, int ncb, int ns, GvPlan *pl)
{
    const int slr = (gm.nsl + ns - 1) / ns;
    if ((gm.nsl + slr - 1) / slr != ns) return false;
    if (ns > 1 && p->xq == 2 && (slr * gm.cps) % 2) return false;
    const int nchl = gm.nch < slr * gm.cps ? gm.nch : slr * gm.cps;
    if ((size_t)nb * (size_t)(64 * nchl + 8) * 2 > GV_XMAX) return false;
    const size_t sm = gv_smem(nb, 64 * nchl, nchl, ncb, 8 * ((nb + 7) / 8)).total;
    if (sm > GV_SMAX) return false;
    pl->nb = nb;
    pl->ng = (nb + 7) / 8;
    pl->ns = ns;
    pl->slr = slr;
    pl->nsl = gm.nsl;
    pl->ncb = ncb;
    pl->sm = sm;
    return true;
}

/* Which deal.  A block of 8 warps reads 8 x 16 rows x cps chunks of weights whatever the deal, and stages its
 * slices' columns of x, which it reads as fp32: T slr / 32 of its weight bytes, read again by every block on the
 * same columns.  The fewest blocks (no split where x fits) unless that share passes 1/2 or the fewest blocks need a
 * split anyway, or, from T = 2, where one slice a block takes at most one block an SM; then one slice a block (or
 * the fewest slices the parity allows).  What the H200 said (bench_cuda_linear's act_quant and decode tables,
 * 2026-12-01, twentieth session, us, fewest -> one slice a block): 1024 x 4096 T = 2 7.68 -> 6.24, T = 8 12.31 ->
 * 7.17 (the decode kernel 12.03); wo_b T = 8 39.73 (three blocks a cluster) -> 23.75 (decode kernel 36.86), but T = 1
 * 13.87 -> 18.57 and wq_b T = 1 11.09 -> 17.37: a split of a grid of 256-512 blocks costs ~5 us, a cluster launched
 * beside the kernel before it.  DEEPINFER_CUDA_GEMV_SLR=k (read once, 1..8) instead takes the fewest blocks of at
 * most k slices (8: the fewest blocks that fit). */
static bool gv_plan(const bcu_rowdot_args *p, GvPlan *pl)
{
    if (p->T < 1 || p->T > 8 * GV_NG) return false;
    const int nb = p->xq ? (int)p->T : 3 * (int)p->T;
    if (nb > 8 * GV_NG) return false;
    const MmGeom gm = mm_geom(p);
    const int cbs = block_shift(p->block) - 6;
    const int ncb = (int)(((gm.cb + gm.nch - 1) >> cbs) - (gm.cb >> cbs) + 1);
    static std::atomic<int> slr_env(-1);
    int smax = slr_env.load(std::memory_order_relaxed);
    if (smax < 0) {
        const char *e = getenv("DEEPINFER_CUDA_GEMV_SLR");
        smax = e && atoi(e) >= 1 && atoi(e) <= 8 ? atoi(e) : 0;
        slr_env.store(smax, std::memory_order_relaxed);
    }
    int ns = 1;
    while (ns <= 8 && (!gv_deal(p, gm, nb, ncb, ns, pl) || (smax && pl->slr > smax))) ns++;
    if (smax) {
        if (ns <= 8) return true;
        for (ns = 1; ns <= 8 && !gv_deal(p, gm, nb, ncb, ns, pl); ns++) {} /* none that small: the fewest */
    }
    if (ns > 8) return false;
    bool most = pl->ns > 1 || p->T * pl->slr > 16;
    if (!most && p->T >= 2) {
        const int64_t ntl = (p->n + 15) / 16, ng = p->groups > 1 ? p->groups : 1;
        most = (ntl + 7) / 8 * ng * gm.nsl <= bcu_sm_count();
    }
    if (most) {
        GvPlan m;
        for (int k = 8; k > pl->ns; k--)
            if (gv_deal(p, gm, nb, ncb, k, &m)) {
                *pl = m;
                break;
            }
    }
    return true;
}

/* whether the GEMV kernel can take these arguments (after mm_supported): FP8 weights; act_quant'd x (xq) at
 * 1 <= T <= 24, or raw x as three bf16 planes (xq = 0) at T <= 8; whole chunks (c0, K multiples of 64), 16-row
 * tiles inside a row block of scales (r0 and, grouped, n multiples of 16), a plan (gv_plan: a slice's x in GV_XMAX),
 * the automatic or the GEMV tile, DEEPINFER_CUDA_GEMV not 0 */
static bool gv_can(const bcu_rowdot_args *p)
{
    GvPlan pl;
    if (p->fmt != BCU_RW_FP8 || p->T < 1 || (p->tile != 0 && p->tile != BCU_ROWDOT_TILE_GEMV)) return false;
    if (p->c0 % 64 || p->K % 64 || p->r0 % 16 || (p->groups > 1 && p->n % 16)) return false;
    return gv_plan(p, &pl) && gv_env() != 0;
}

/* whether it runs: forced, or (tile 0) where the H200 measured it faster than the decode kernel (bench_cuda_linear's
 * act_quant and decode tables).  On codes or act_quant'd x: every shape to T = 16 since the twentieth session's K
 * split and second n8 group (2026-12-01, us, decode kernel -> GEMV: 1024 x 4096 T = 2 7.61 -> 6.24, T = 8 12.03 ->
 * 7.17, T = 16 17.77 -> 9.65; wo_b T = 8 36.86 -> 23.75, T = 16 55.99 -> 33.63; wq_b T = 8 22.01 -> 14.92, T = 16
 * 32.45 -> 29.18; 4096 x 2048 T = 2 8.50 -> 7.18); before it, T = 1 everywhere (seventeenth session: wq_b 12.7 ->
 * 10.9, wo_b 19.8 -> 13.8), long slices and 4096 rows and more to T = 8.  On bf16 planes (xq = 0): the grouped wo_a
 * and long slices at T <= 2 (sixteenth session: wo_a T = 1 20.1 -> 14.8) and T = 6..8 (three n8 groups, one slice
 * a block: T = 8 40.50 -> 30.67); at T = 3..5 the decode kernel's one token block beats the split (23.97 against
 * 28.55). */
static bool gv_pick(const bcu_rowdot_args *p)
{
    if (!gv_can(p)) return false;
    if (p->tile == BCU_ROWDOT_TILE_GEMV || gv_env() == 2) return true;
    const MmGeom gm = mm_geom(p);
    if (!p->xq) return (p->groups > 1 || gm.cps >= 16) && (p->T <= 2 || p->T >= 6);
    return p->T <= 16;
}

/* The GEMV kernel's shape (both 256 bytes in flight a lane, two blocks an SM): one tile a warp and 8 chunks in
 * flight where that grid is at most one wave (and wherever B takes more than one n8 group: the registers), else two
 * tiles a warp and 4 chunks in flight (half the blocks).  DEEPINFER_CUDA_GEMV_SHAPE (read once) forces one: "8x1" or
 * "4x2" (one group). */
template <int PD, int WT, int MINB, bool MATH, bool PL, int NG, bool KS>
static cudaError_t gv_launch_t(const MmArgs &a, const GvPlan &pl, cudaStream_t st, int nostage = 0)
{
    void (*kern)(MmArgs, int, int, int, int, int, int) = rowgv_kernel<PD, WT, MINB, MATH, PL, NG, KS>;
    static std::atomic<unsigned long long> attr_set(0);
    if (const cudaError_t e = rd_smem_attr_once(attr_set, kern, (size_t)GV_SMAX); e != cudaSuccess) return e;
    const int rt = 8 / pl.slr;
    const int64_t ntl = (a.n + 15) >> 4, gx = (ntl + (int64_t)rt * WT - 1) / ((int64_t)rt * WT) * pl.ns;
    if (gx > 0x7fffffff || a.groups > 65535) return cudaErrorInvalidConfiguration;
    if (pl.ns > 1) {
        static std::atomic<int> fits[9]; /* per cluster size: 0 not asked, 1 fits, 2 does not */
        int f = fits[pl.ns].load(std::memory_order_relaxed);
        if (!f) {
            f = rd_cluster_fits(kern, pl.ns, 256, (size_t)GV_SMAX) ? 1 : 2;
            fits[pl.ns].store(f, std::memory_order_relaxed);
        }
        if (f != 1) return cudaErrorNotSupported;
    }
    const cudaError_t e = rd_launch_ex(kern, dim3((unsigned)gx, (unsigned)(a.groups > 1 ? a.groups : 1)), dim3(256),
                                       pl.sm, pl.ns, true, st, a, rt, pl.slr, pl.nsl, pl.ns, pl.ncb, nostage);
    if (e != cudaSuccess && pl.ns > 1) {
        (void)cudaGetLastError(); /* a cluster launch refused */
        return cudaErrorNotSupported;
    }
    return e;
}

/* the instances: one n8 group without a split in both shapes (and the probes), everything else (a split, more
 * groups) in the 8x1 shape alone */
template <bool PL, int NG>
static cudaError_t gv_launch_ng(const MmArgs &a, const GvPlan &pl, bool one, int nm, cudaStream_t st)
{
    if constexpr (NG == 1 && !PL)
        if (nm && pl.ns == 1) /* a probe: no maths (wrong sums); 2: no x staging either */
            return one ? gv_launch_t<8, 1, 2, false, false, 1, false>(a, pl, st, nm == 2)
                       : gv_launch_t<4, 2, 2, false, false, 1, false>(a, pl, st, nm == 2);
    if constexpr (NG == 1)
        if (pl.ns == 1)
            return one ? gv_launch_t<8, 1, 2, true, PL, 1, false>(a, pl, st) : gv_launch_t<4, 2, 2, true, PL, 1, false>(a, pl, st);
    return gv_launch_t<NG == 3 ? 6 : 8, 1, 2, true, PL, NG, true>(a, pl, st); /* three groups: 6 chunks in flight (registers) */
}

/* cudaErrorNotSupported: no plan, or its cluster cannot run (nothing launched) */
static cudaError_t gv_launch(const MmArgs &a, const bcu_rowdot_args *p, cudaStream_t st)
{
    GvPlan pl;
    if (!gv_plan(p, &pl)) return cudaErrorNotSupported;
    static std::atomic<int> force(-1);
    static const char *const shapes[] = {"8x1", "4x2"};
    const int f = env_once(force, "DEEPINFER_CUDA_GEMV_SHAPE", shapes, 2); /* 0 auto, 1 "8x1", 2 "4x2" */
    const int rt = 8 / pl.slr;
    const int64_t ntl = (a.n + 15) >> 4, ng = a.groups > 1 ? a.groups : 1, sms = bcu_sm_count();
    const int64_t b1 = (ntl + rt - 1) / rt * ng * pl.ns; /* blocks of one tile a warp */
    const bool one = f ? f == 1 : b1 <= 2 * sms;
    static std::atomic<int> nomath(-1);
    static const char *const on[] = {"1", "2"};
    const int nm = env_once(nomath, "DEEPINFER_CUDA_GEMV_NOMATH", on, 2); /* 1: the loads alone, wrong sums; 2: no x staging either */
    const bool pln = !p->xq;
    switch (pl.ng) {
    case 1: return pln ? gv_launch_ng<true, 1>(a, pl, one, nm, st) : gv_launch_ng<false, 1>(a, pl, one, nm, st);
    case 2: return pln ? gv_launch_ng<true, 2>(a, pl, one, nm, st) : gv_launch_ng<false, 2>(a, pl, one, nm, st);
    default: return pln ? gv_launch_ng<true, 3>(a, pl, one, nm, st) : gv_launch_ng<false, 3>(a, pl, one, nm, st);
    }
}

/* A probe of the read bandwidth a GEMV could reach (bench_cuda_linear): the bytes of buf in 512-byte runs a warp
 * (16 bytes a lane), 8 loads in flight a lane, per_sm blocks of 256 threads an SM; nothing is written unless the
 * bytes' XOR is 0x12345678 (never, for random weights). */
__global__ void __launch_bounds__(256) read_probe_kernel(const uint4 *buf, size_t n16, uint32_t *sink)
{
    const size_t stride = (size_t)gridDim.x * 256 * 8;
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * 256 * 8 + (threadIdx.x >> 5) * 256 + (threadIdx.x & 31); i < n16; i += stride) {
        uint4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = i + 32 * k < n16 ? rd_ldg16_stream(buf + i + 32 * k) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int k = 0; k < 8; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

extern "C" cudaError_t bcu_read_probe(const void *buf, size_t bytes, uint32_t *sink, int per_sm, cudaStream_t st)
{
    if (per_sm < 1 || per_sm > 8) return cudaErrorInvalidValue;
    read_probe_kernel<<<per_sm * bcu_sm_count(), 256, 0, st>>>((const uint4 *)buf, bytes / 16, sink);
    return cudaGetLastError();
}

/* The same probe in the GEMV kernel's pattern (bench_cuda_linear's "rows" figure): a matrix of rows x rowbytes read as
 * units of 16 rows x 8 chunks of 64 bytes, lane (g, q) 16 bytes of rows g and g + 8 at 16 q of each chunk, all 16
 * loads of a unit in flight, warps striding over the units; two blocks of 256 threads an SM */
__global__ void __launch_bounds__(256) read_rows_kernel(const uint8_t *buf, int64_t rows, int64_t rowbytes, uint32_t *sink)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t ncg = rowbytes / 512, nu = (rows / 16) * ncg; /* units: (tile, 8 chunks) */
    const int64_t nw = (int64_t)gridDim.x * 8;
    uint32_t acc = 0;
    for (int64_t u = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); u < nu; u += nw) {
        const int64_t t = u / ncg, cg = u - t * ncg;
        const uint8_t *p = buf + (16 * t + g) * rowbytes + 512 * cg + 16 * q;
        uint4 v[16];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            v[2 * k] = rd_ldg16_stream(p + 64 * k);
            v[2 * k + 1] = rd_ldg16_stream(p + 8 * rowbytes + 64 * k);
        }
#pragma unroll
        for (int k = 0; k < 16; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
    }
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

extern "C" cudaError_t bcu_read_probe_rows(const void *buf, int64_t rows, int64_t rowbytes, uint32_t *sink, cudaStream_t st)
{
    if (rows % 16 || rowbytes % 512) return cudaErrorInvalidValue;
    read_rows_kernel<<<2 * bcu_sm_count(), 256, 0, st>>>((const uint8_t *)buf, rows, rowbytes, sink);
    return cudaGetLastError();
}

/* every float's e4m3 round trip, software (gr_enc_e4m3, gr_dec_e4m3, f16) against the conversion instructions
 * (aq_e4m3x2_h): counts[0] the floats whose f16 bits differ, counts[1] of those where both are NaN */
__global__ void e4m3_cvt_check_kernel(unsigned long long *counts)
{
    unsigned long long bad = 0, nan = 0;
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (1ull << 31); i += (uint64_t)gridDim.x * blockDim.x) {
        const float f0 = __uint_as_float((uint32_t)(2 * i)), f1 = __uint_as_float((uint32_t)(2 * i + 1));
        const uint32_t hw = aq_e4m3x2_h(f0, f1);
        const uint32_t sw = (uint32_t)__half_as_ushort(__float2half_rn(gr_dec_e4m3(gr_enc_e4m3(f0)))) |
                            (uint32_t)__half_as_ushort(__float2half_rn(gr_dec_e4m3(gr_enc_e4m3(f1)))) << 16;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a = (hw >> (16 * h)) & 0xffffu, b = (sw >> (16 * h)) & 0xffffu;
            if (a != b) {
                bad++;
                nan += (a & 0x7fffu) > 0x7c00u && (b & 0x7fffu) > 0x7c00u;
            }
        }
    }
    atomicAdd(&counts[0], bad);
    atomicAdd(&counts[1], nan);
}

extern "C" cudaError_t bcu_e4m3_cvt_check(unsigned long long counts[2])
{
    unsigned long long *d;
    cudaError_t e = cudaMalloc(&d, 2 * sizeof *d);
    if (e != cudaSuccess) return e;
    e = cudaMemset(d, 0, 2 * sizeof *d);
    if (e == cudaSuccess) {
        e4m3_cvt_check_kernel<<<4 * bcu_sm_count(), 256>>>(d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(counts, d, 2 * sizeof *d, cudaMemcpyDeviceToHost);
    cudaFree(d);
    return e;
}

static int mm_tile(const bcu_rowdot_args *p)
{
    if (p->tile == 1 || p->tile == 3 || p->tile == 6 || p->tile == BCU_ROWDOT_TILE_DEC) return p->tile;
    return p->T <= (dec_xq(p) ? 16 : 5) ? BCU_ROWDOT_TILE_DEC : p->T <= 16 ? 3 : 6;
}

template <int FMT>
static cudaError_t mm_launch_fmt(const MmArgs &a, const bcu_rowdot_args *p, int nsl, cudaStream_t st)
{
    if constexpr (FMT == BCU_RW_FP8) {
        if (gv_pick(p)) {
            const cudaError_t e = gv_launch(a, p, st);
            if (e != cudaErrorNotSupported || p->tile == BCU_ROWDOT_TILE_GEMV) return e;
            /* its cluster cannot run here: the decode kernel, the same bits */
        } else if (p->tile == BCU_ROWDOT_TILE_GEMV) return cudaErrorNotSupported;
    }
    const int tile = mm_tile(p);
    if (a.groups > 1) { /* grouped: the decode kernel (automatic tile: up to BCU_ROWDOT_GROUPED_T rows) or nothing */
        bool took = false;
        if (tile != BCU_ROWDOT_TILE_DEC && !(p->tile == 0 && p->T <= BCU_ROWDOT_GROUPED_T)) return cudaErrorNotSupported;
        cudaError_t e = dec_launch_p<FMT>(a, p, nsl, st, &took);
        return e != cudaSuccess || took ? e : cudaErrorNotSupported;
    }
    if (tile == BCU_ROWDOT_TILE_DEC) {
        bool took = false;
        cudaError_t e = dec_launch_p<FMT>(a, p, nsl, st, &took);
        if (took || e != cudaSuccess) return e;
        if (a.aq) return cudaErrorNotSupported; /* only the decode kernel quantises */
        /* its chunk range does not fit its shared memory: tile 1, the same sums */
    }
    switch (tile == BCU_ROWDOT_TILE_DEC ? 1 : tile) {
    case 1: return mm_launch_cfg<FMT, 1, 2, 1, 4>(a, p->n, p->T, nsl, p->split, st);
    case 3: return mm_launch_cfg<FMT, 3, 2, 1, 4>(a, p->n, p->T, nsl, p->split, st);
    default: return mm_launch_cfg<FMT, 3, 4, 2, 4>(a, p->n, p->T, nsl, p->split, st);
    }
}

/* The tokens a launch of the GEMV when the automatic tile runs these arguments as several (0: one launch): bf16
 * planes (xq 0) of 9 .. GV_CHUNK_T tokens in launches of 8, act_quant'd x of 17 .. GV_CHUNK_T in launches of 16
 * (the last fewer), each launch taking the kernel gv_pick gives it, where the GEMV takes a full launch.  The GEMV's
 * bits are the decode kernel's and rowmma's, so a token's result does not move.  H200 (bench_cuda_linear, the
 * twentieth session, 2026-12-01, us): the grouped wo_a, one decode-kernel launch -> launches of 8, T = 16 75.3 ->
 * 60.2, T = 32 132.3 -> 118.9; codes at T = 32, rowmma -> launches of 16: wq_b 96.1 -> 56.8, wo_b 125.9 -> 65.2,
 * 2048 x 4096 47.8 -> 22.5; at T = 64, wo_b 207.6 -> 128.5.  (The backend's FP8 linears of 17 tokens and more take
 * dequantise + cuBLAS, DEEPINFER_CUDA_DEQUANT_T, measured faster in the step in the twenty-first session, so by
 * default these launches run only where that threshold is raised.)  DEEPINFER_CUDA_GEMV_CHUNK=0 (read once): one launch. */
#define GV_CHUNK_T 64 /* the most tokens gv_chunk splits into launches */
static int gv_chunk(const bcu_rowdot_args *p)
{
    static std::atomic<int> cache(-1);
    static const char *const off[] = {"0"};
    if (p->fmt != BCU_RW_FP8 || p->tile != 0 || p->T > GV_CHUNK_T || env_once(cache, "DEEPINFER_CUDA_GEMV_CHUNK", off, 1))
        return 0;
    const int cs = p->xq ? 16 : 8;
    if (p->T <= cs) return 0;
    /* more than two launches re-read a small weight too often: 512 x 4096 at T = 64 24.8 -> 36.9 us (rowmma: 1024 x
     * 4096 47.2 -> 40.1, wq_b 165.6 -> 112.2) */
    if ((p->T + cs - 1) / cs > 2 && p->n * (p->groups > 1 ? p->groups : 1) * p->K < ((int64_t)4 << 20)) return 0;
    bcu_rowdot_args q = *p;
    q.T = cs;
    return gv_pick(&q) ? cs : 0;
}

static cudaError_t mm_rowdot(const bcu_rowdot_args *p, cudaStream_t st)
{
    if (const int cs = gv_chunk(p)) {
        const int64_t ldx = p->ldx ? p->ldx : p->K, ldy = p->ldy ? p->ldy : p->n;
        for (int64_t t0 = 0; t0 < p->T; t0 += cs) {
            bcu_rowdot_args q = *p;
            q.T = p->T - t0 < cs ? p->T - t0 : cs;
            q.x = p->x + t0 * ldx;
            q.y = p->y + t0 * ldy;
            q.ldx = ldx;
            q.ldy = ldy;
            const cudaError_t e = mm_rowdot(&q, st);
            if (e != cudaSuccess) return e;
        }
        return cudaSuccess;
    }
    const MmGeom gm = mm_geom(p);
    MmArgs a;
    memset(&a, 0, sizeof a);
    a.w = (const uint8_t *)p->w;
    a.scale = p->scale;
    a.x = p->x;
    a.y = p->y;
    a.rowbytes = p->fmt == BCU_RW_FP4 ? p->wcols / 2 : p->wcols;
    a.r0 = p->r0;
    a.n = p->n;
    a.c0 = p->c0;
    a.K = p->K;
    a.T = p->T;
    a.ldx = p->ldx ? p->ldx : p->K;
    a.ldy = p->ldy ? p->ldy : p->n;
    a.cb = gm.cb;
    a.nch = gm.nch;
    a.cps = gm.cps;
    a.sc_dtype = p->sc_dtype;
    a.bshift = block_shift(p->block);
    a.nsb = p->fmt == BCU_RW_FP4 ? p->wcols / 32 : (p->wcols + p->block - 1) / p->block;
    a.groups = p->groups > 1 ? p->groups : 1;
    a.xg = p->xg;
    a.yg = p->yg;
    a.aq = p->xq == 2;
    if (p->fmt == BCU_RW_FP4) return mm_launch_fmt<BCU_RW_FP4>(a, p, gm.nsl, st);
    return mm_launch_fmt<BCU_RW_FP8>(a, p, gm.nsl, st);
}

/* DEEPINFER_CUDA_ROWDOT, read once: "simple" forces the simple kernel */
static int rowdot_env(void)
{
    static std::atomic<int> mode(-1);
    static const char *const simple[] = {"simple"};
    return env_once(mode, "DEEPINFER_CUDA_ROWDOT", simple, 1) ? BCU_ROWDOT_SIMPLE : BCU_ROWDOT_AUTO;
}

extern "C" int bcu_rowdot_aq_ok(const bcu_rowdot_args *p)
{
    const int path = p->path ? p->path : rowdot_env();
    const int tile = p->tile ? p->tile : BCU_ROWDOT_TILE_DEC;
    return p->fmt == BCU_RW_FP8 && path != BCU_ROWDOT_SIMPLE && mm_supported(p) && p->c0 == 0 && p->K % 128 == 0 &&
           p->groups <= 1 && p->T >= 1 && p->T <= 16 &&
           (tile == BCU_ROWDOT_TILE_DEC || (tile == BCU_ROWDOT_TILE_GEMV && gv_can(p)));
}

extern "C" int bcu_rowdot_gemv_ok(const bcu_rowdot_args *p)
{
    const int path = p->path ? p->path : rowdot_env();
    bcu_rowdot_args f = *p;
    f.tile = BCU_ROWDOT_TILE_GEMV;
    return path != BCU_ROWDOT_SIMPLE && mm_supported(p) && (p->tile == 0 || p->tile == BCU_ROWDOT_TILE_GEMV) &&
           gv_can(&f);
}

extern "C" int bcu_rowdot_gemv_auto(const bcu_rowdot_args *p)
{
    const int path = p->path ? p->path : rowdot_env();
    return path != BCU_ROWDOT_SIMPLE && mm_supported(p) && (gv_pick(p) || gv_chunk(p));
}

extern "C" int bcu_rowdot_path(const bcu_rowdot_args *p)
{
    const int path = p->path ? p->path : rowdot_env();
    return path != BCU_ROWDOT_SIMPLE && mm_supported(p) ? BCU_ROWDOT_MMA : BCU_ROWDOT_SIMPLE;
}

extern "C" bcu_rowdot_args bcu_rowdot_for(const be_weight *w, const void *dw, const void *ds, int64_t r0, int64_t n,
                                          int64_t c0, const float *dx, int64_t T, float *dy)
{
    bcu_rowdot_args a;
    memset(&a, 0, sizeof a);
    a.fmt = w->fmt == BE_W_FP8 ? BCU_RW_FP8 : w->fmt == BE_W_FP4 ? BCU_RW_FP4 : BCU_RW_F16;
    a.w = dw;
    a.scale = ds;
    a.sc_dtype = w->scale_dtype == MD_F8_E8M0 ? BCU_SC_E8M0 : w->scale_dtype == MD_F32 ? BCU_SC_F32 : BCU_SC_BF16;
    a.wrows = w->rows;
    a.wcols = w->cols;
    a.block = w->block;
    a.r0 = r0;
    a.n = n;
    a.c0 = c0;
    a.K = w->cols - c0;
    a.x = dx;
    a.T = T;
    a.y = dy;
    return a;
}

extern "C" cudaError_t bcu_rowdot(const bcu_rowdot_args *p, cudaStream_t st)
{
    if (p->n <= 0 || p->T <= 0) return cudaSuccess;
    const int path = p->path ? p->path : rowdot_env();
    if (p->xq == 2 && !bcu_rowdot_aq_ok(p)) return cudaErrorNotSupported;
    if (path != BCU_ROWDOT_SIMPLE && mm_supported(p)) return mm_rowdot(p, st);
    if (p->groups > 1) return cudaErrorNotSupported;         /* grouped: the decode kernel only */
    if (path == BCU_ROWDOT_MMA) return cudaErrorInvalidValue; /* forced, but this weight cannot take it */
    return simple_rowdot(p, st);
}

/* ---- the FP8-activation row-dot (bcu_rowdot_x8)
 *
 * For x whose rows went through act_quant (v4.c, official semantics): every
 * value is an e4m3 code times the power of two of its block of 128 columns.
 * The block stages x once as those codes (the scale recomputed from the
 * block's amax as act_quant does; the codes are exact whatever side of a
 * power of two the rounded amax fell) and the tensor cores take codes
 * against codes: mma.sync m16n8k32 e4m3 x e4m3 -> fp32, with no decode of
 * the weights at all (the rowdot kernels above spend half their instructions
 * decoding e4m3 to bf16).  Tokens are the A rows (T <= 16: one m16 tile),
 * eight weight rows the n8 tile; a lane streams 8 + 8 bytes of its weight
 * row per 64-column chunk (32 columns per k32 step, so a step never crosses
 * a weight scale block of 32 or more, nor an activation block).  Products of
 * two e4m3 values are exact in fp32; each k32 step's sum P, from zero, goes
 * into S = fmaf(P, sx * sw, S), the steps in column order; with the K split
 * (4 warps on the same rows) the quarters meet in warp order.  A token's
 * result does not depend on T (the split is chosen by n alone).  On the
 * H200 (2026-11-30, fifth session) test_rowdot_x8 holds it within 4.7e-7 of
 * the CPU and batch-invariant, but it is slower than the bf16 decode kernel
 * (sm_90 unpacks e4m3 to f16 per element for this mma): the backend takes it
 * only with DEEPINFER_CUDA_ROWQ8=1. */
#define RQ_TW 2 /* n8 tiles per warp */
#define RQ_PD 4 /* chunks of weights in flight per lane */

struct RowQ8Args {
    const uint8_t *w;
    const void *scale;
    int sc_dtype, bshift;
    int64_t wcols, nsb, r0, n;
    const float *x;
    int64_t ldx, ldy;
    float *y;
    int T, K;
};

__device__ __forceinline__ void rq_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two f32 -> e4m3 codes (lo in the low byte), round to nearest, saturating */
__device__ __forceinline__ uint32_t rq_e4m3x2(float lo, float hi)
{
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 16 bytes of a weight row read once: 8 at p, 8 at p + 32 */
__device__ __forceinline__ uint4 rq_ldw(const uint8_t *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.z), "=r"(v.w) : "l"(p + 32));
    return v;
}


template <int KS>
__global__ void __launch_bounds__(128) rowq8_kernel(RowQ8Args a)
{
    pdl_enter();
    extern __shared__ __align__(16) unsigned char rq_smem[];
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int T = a.T, K = a.K, nb = K / 128, nch = K / 64;
    unsigned char *xc = rq_smem;                              /* [T][K] codes */
    float *xs = (float *)(rq_smem + (((size_t)T * K + 15) & ~(size_t)15)); /* [T][nb] scales */
    float *red = xs + ((T * nb + 3) & ~3);                    /* KS = 4: [4 warps][RQ_TW][4][32 lanes] */

    /* the weight rows of this lane's tiles: row g of each n8 tile */
    const int64_t rb0 = (int64_t)blockIdx.x * (KS == 1 ? 4 : 1) * 8 * RQ_TW + (KS == 1 ? warp * 8 * RQ_TW : 0);
    const uint8_t *wr[RQ_TW];
    bool rok[RQ_TW];
    int srow[RQ_TW]; /* the tile's row block, times nsb */
#pragma unroll
    for (int nt = 0; nt < RQ_TW; nt++) {
        const int64_t o = rb0 + 8 * nt + g;
        rok[nt] = o < a.n;
        wr[nt] = a.w + (a.r0 + (rok[nt] ? o : 0)) * a.wcols + 8 * q;
        /* a tile wholly past n (zero weights) reads row block 0's scales, never past the scale array */
        const int64_t tr = rb0 + 8 * nt;
        srow[nt] = tr < a.n ? (int)(((a.r0 + tr) >> a.bshift) * a.nsb) : 0;
    }
    const int c_lo = KS == 1 ? 0 : warp * nch / 4, c_hi = KS == 1 ? nch : (warp + 1) * nch / 4;
    uint4 ring[RQ_PD][RQ_TW];
#pragma unroll
    for (int i = 0; i < RQ_PD; i++)
#pragma unroll
        for (int nt = 0; nt < RQ_TW; nt++)
            ring[i][nt] = c_lo + i < c_hi && rok[nt] ? rq_ldw(wr[nt] + 64 * (c_lo + i)) : make_uint4(0u, 0u, 0u, 0u);

    /* x as codes: a warp per (token, block of 128) */
    for (int it = warp; it < T * nb; it += 4) {
        const int t = it / nb, b = it - t * nb;
        const float4 v = __ldg((const float4 *)(a.x + (int64_t)t * a.ldx + 128 * b + 4 * lane));
        float m = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float sc = aq_scale_e4m3(m); /* act_quant.cuh */
        const uint32_t lo = rq_e4m3x2(__fdiv_rn(v.x, sc), __fdiv_rn(v.y, sc));
        const uint32_t hi = rq_e4m3x2(__fdiv_rn(v.z, sc), __fdiv_rn(v.w, sc));
        *(uint32_t *)(xc + (size_t)t * K + 128 * b + 4 * lane) = lo | (hi << 16);
        if (lane == 0) xs[t * nb + b] = sc;
    }
    __syncthreads();

    const bool r0ok = g < T, r8ok = g + 8 < T;
    const unsigned char *x0 = xc + (size_t)(r0ok ? g : 0) * K + 8 * q;
    const unsigned char *x8 = xc + (size_t)(r8ok ? g + 8 : 0) * K + 8 * q;
    float S[RQ_TW][4];
#pragma unroll
    for (int nt = 0; nt < RQ_TW; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) S[nt][e] = 0.0f;
    for (int c0 = c_lo; c0 < c_hi; c0 += RQ_PD) {
#pragma unroll
        for (int i = 0; i < RQ_PD; i++) {
            const int c = c0 + i;
            if (c >= c_hi) break; /* warp-uniform */
            uint4 wv[RQ_TW];
#pragma unroll
            for (int nt = 0; nt < RQ_TW; nt++) {
                wv[nt] = ring[i][nt];
                ring[i][nt] = c + RQ_PD < c_hi && rok[nt] ? rq_ldw(wr[nt] + 64 * (c + RQ_PD)) : make_uint4(0u, 0u, 0u, 0u);
            }
            const uint2 a00 = r0ok ? *(const uint2 *)(x0 + 64 * c) : make_uint2(0u, 0u);
            const uint2 a01 = r0ok ? *(const uint2 *)(x0 + 64 * c + 32) : make_uint2(0u, 0u);
            const uint2 a80 = r8ok ? *(const uint2 *)(x8 + 64 * c) : make_uint2(0u, 0u);
            const uint2 a81 = r8ok ? *(const uint2 *)(x8 + 64 * c + 32) : make_uint2(0u, 0u);
            const int ab = c >> 1; /* activation block of 128 */
            const float sx0 = r0ok ? xs[g * nb + ab] : 0.0f, sx8 = r8ok ? xs[(g + 8) * nb + ab] : 0.0f;
#pragma unroll
            for (int st = 0; st < 2; st++) {
                const uint32_t af[4] = {st ? a01.x : a00.x, st ? a81.x : a80.x, st ? a01.y : a00.y,
                                        st ? a81.y : a80.y};
                const int wcb = (64 * c + 32 * st) >> a.bshift;
#pragma unroll
                for (int nt = 0; nt < RQ_TW; nt++) {
                    float P[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    rq_mma(P, af, st ? wv[nt].z : wv[nt].x, st ? wv[nt].w : wv[nt].y);
                    const float sw = scale_at(a.scale, a.sc_dtype, (size_t)(srow[nt] + wcb));
                    const float f0 = __fmul_rn(sx0, sw), f8 = __fmul_rn(sx8, sw);
                    S[nt][0] = fmaf(P[0], f0, S[nt][0]);
                    S[nt][1] = fmaf(P[1], f0, S[nt][1]);
                    S[nt][2] = fmaf(P[2], f8, S[nt][2]);
                    S[nt][3] = fmaf(P[3], f8, S[nt][3]);
                }
            }
        }
    }

    /* the lane's sums: token g (e = 0, 1) and g + 8 (e = 2, 3), outputs 2q, 2q + 1 of each tile */
    if (KS > 1) {
#pragma unroll
        for (int nt = 0; nt < RQ_TW; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[((warp * RQ_TW + nt) * 4 + e) * 32 + lane] = S[nt][e];
        __syncthreads();
        if (warp) return;
#pragma unroll
        for (int nt = 0; nt < RQ_TW; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = red[((0 * RQ_TW + nt) * 4 + e) * 32 + lane];
#pragma unroll
                for (int w = 1; w < KS; w++) v = v + red[((w * RQ_TW + nt) * 4 + e) * 32 + lane];
                S[nt][e] = v;
            }
    }
#pragma unroll
    for (int nt = 0; nt < RQ_TW; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int t = e < 2 ? g : g + 8;
            const int64_t o = rb0 + 8 * nt + 2 * q + (e & 1);
            if (t < T && o < a.n) a.y[(int64_t)t * a.ldy + o] = S[nt][e];
        }
}

#define RQ_SMEM_MAX (96 * 1024)

static size_t rq_smem_bytes(int T, int K)
{
    const int nb = K / 128;
    return (((size_t)T * K + 15) & ~(size_t)15) + (size_t)((T * nb + 3) & ~3) * 4 + (size_t)4 * RQ_TW * 4 * 32 * 4;
}

extern "C" cudaError_t bcu_rowdot_x8(const bcu_rowdot_args *p, cudaStream_t st)
{
    if (p->n <= 0 || p->T <= 0) return cudaSuccess;
    const int b = p->block;
    if (p->fmt != BCU_RW_FP8 || b < 32 || (b & (b - 1)) || p->c0 != 0 || p->K != p->wcols || p->K % 128 ||
        p->K > (1 << 24) || p->T > 16 || p->r0 % 8 || p->r0 < 0 || p->r0 + p->n > p->wrows || p->wcols % 8 ||
        (uintptr_t)p->x % 16 || (uintptr_t)p->w % 8 || (p->ldx && (p->ldx % 4 || p->ldx < p->K)) ||
        (p->ldy && p->ldy < p->n) ||
        (p->sc_dtype != BCU_SC_E8M0 && p->sc_dtype != BCU_SC_F32 && p->sc_dtype != BCU_SC_BF16) ||
        rq_smem_bytes((int)p->T, (int)p->K) > RQ_SMEM_MAX)
        return cudaErrorNotSupported;
    RowQ8Args a;
    a.w = (const uint8_t *)p->w;
    a.scale = p->scale;
    a.sc_dtype = p->sc_dtype;
    a.bshift = __builtin_ctz((unsigned)b);
    a.wcols = p->wcols;
    a.nsb = (p->wcols + b - 1) / b;
    a.r0 = p->r0;
    a.n = p->n;
    a.x = p->x;
    a.ldx = p->ldx ? p->ldx : p->K;
    a.ldy = p->ldy ? p->ldy : p->n;
    a.y = p->y;
    a.T = (int)p->T;
    a.K = (int)p->K;
    const size_t sm = rq_smem_bytes(a.T, a.K);
    /* the K split (4 warps on the same 16 rows) while 64 rows per block would not fill the GPU twice over */
    const int64_t blocks1 = (p->n + 4 * 8 * RQ_TW - 1) / (4 * 8 * RQ_TW);
    const int ks = blocks1 < 2 * (int64_t)bcu_sm_count() ? 4 : 1;
    void (*kern)(RowQ8Args) = ks == 4 ? rowq8_kernel<4> : rowq8_kernel<1>;
    static std::atomic<unsigned long long> attr_set[2];
    if (const cudaError_t e = rd_smem_attr_once(attr_set[ks == 4], kern, RQ_SMEM_MAX); e != cudaSuccess) return e;
    const int64_t grid = ks == 4 ? (p->n + 8 * RQ_TW - 1) / (8 * RQ_TW) : blocks1;
    if (grid > 0x7fffffff) return cudaErrorNotSupported;
    pdl_launch(kern, (unsigned)grid, 128, sm, st, a);
    return cudaGetLastError();
}

/* ---- RMSNorm: one block per row, RMS_NT(dim) threads (rmsnorm.cuh: the sum of squares in double, as the CPU
 * reference does, so the two agree to the last bit nearly always).  Each thread keeps its RMS_KEEP first elements
 * in registers between the two passes. */

template <int NT>
__global__ void __launch_bounds__(NT) rmsnorm_kernel(float *y, const float *x, size_t dim, const float *w, float eps)
{
    pdl_trigger(); /* the decode row-dot that reads y may start its weight loads (it waits for y) */
    float wk[RMS_KEEP]; /* the weights of the kept elements, asked for before the wait (no kernel writes them) */
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const size_t i = threadIdx.x + (size_t)k * NT;
        wk[k] = i < dim && w ? w[i] : 1.0f;
    }
    pdl_wait();
    __shared__ double part[NT / 32];
    const float *xr = x + blockIdx.x * dim;
    float *yr = y + blockIdx.x * dim;
    float keep[RMS_KEEP];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const size_t i = threadIdx.x + (size_t)k * NT;
        keep[k] = i < dim ? xr[i] : 0.0f;
    }
    const float inv = rms_row_inv<NT>(keep, xr, dim, eps, part);
    /* each element is read and written by the same thread: in place is safe */
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const size_t i = threadIdx.x + (size_t)k * NT;
        if (i < dim) yr[i] = wk[k] * (keep[k] * inv);
    }
    for (size_t i = threadIdx.x + (size_t)RMS_KEEP * NT; i < dim; i += NT) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv);
}

extern "C" cudaError_t bcu_rmsnorm(float *y, const float *x, size_t rows, size_t dim, const float *w, float eps,
                                   cudaStream_t st)
{
    if (!rows || !dim) return cudaSuccess;
    if (rows > 0x7fffffffu) return cudaErrorInvalidConfiguration;
    if (RMS_NT(dim) == 1024) pdl_launch(rmsnorm_kernel<1024>, (unsigned)rows, 1024, 0, st, y, x, dim, w, eps);
    else pdl_launch(rmsnorm_kernel<256>, (unsigned)rows, 256, 0, st, y, x, dim, w, eps);
    return cudaGetLastError();
}

/* ---- conversions */

__global__ void split_kernel(uint16_t *dst, const float *x, size_t n, int planes)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float r = x[i];
        for (int p = 0; p < planes; p++) {
            __nv_bfloat16 h = __float2bfloat16_rn(r);
            dst[(size_t)p * n + i] = __bfloat16_as_ushort(h);
            r = r - __bfloat162float(h); /* exact: h is r rounded to 8 bits */
        }
    }
}

/* split_kernel four elements a thread: a float4 in, 8 bytes out a plane (n a multiple of 4, x and dst aligned) */
__global__ void split4_kernel(uint16_t *dst, const float4 *x, size_t n4, size_t n, int planes)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = x[i];
        float r[4] = {v.x, v.y, v.z, v.w};
        for (int p = 0; p < planes; p++) {
            uint32_t w[2];
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const __nv_bfloat16 a = __float2bfloat16_rn(r[2 * k]), b = __float2bfloat16_rn(r[2 * k + 1]);
                w[k] = (uint32_t)__bfloat16_as_ushort(a) | (uint32_t)__bfloat16_as_ushort(b) << 16;
                r[2 * k] -= __bfloat162float(a);
                r[2 * k + 1] -= __bfloat162float(b);
            }
            *(uint2 *)(dst + (size_t)p * n + 4 * i) = make_uint2(w[0], w[1]);
        }
    }
}

/* bcu_split_f16x2: one block a row.  The row's largest magnitude m = f 2^e (f in [0.5, 1)) gives the shift r = 15 - e
 * (clamped to [-120, 120]), so that x 2^r stays below 2^15; then hi = f16(x 2^r), lo = f16(x 2^r - hi), both rounded
 * to nearest (x 2^r - hi is exact in fp32).  Per element |x 2^r - hi - lo| <= 2^-22 |x 2^r|, or 2^-25 where lo is an
 * f16 subnormal: 2^-40 of the row's largest.  Rows of up to SPLIT_F16_KEEP float4s a thread stay in registers (one
 * read of x); longer ones are read twice. */
#define SPLIT_F16_NT 256
#define SPLIT_F16_KEEP 4

__device__ __forceinline__ int split_f16_shift(float m)
{
    int r = 0;
    if (m > 0.0f && m <= 3.4028235e38f) { /* NaN and inf rows keep r = 0: their products are NaN / inf anyway */
        int e;
        (void)frexpf(m, &e);
        r = 15 - e;
        r = r < -120 ? -120 : r > 120 ? 120 : r;
    }
    return r;
}

/* four scaled elements -> their hi and lo f16 quadruples */
__device__ __forceinline__ void split_f16_quad(float4 v, float sc, uint2 *hi, uint2 *lo)
{
    const float a[4] = {v.x * sc, v.y * sc, v.z * sc, v.w * sc};
    uint32_t h[2], l[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const __half h0 = __float2half_rn(a[2 * k]), h1 = __float2half_rn(a[2 * k + 1]);
        const __half l0 = __float2half_rn(a[2 * k] - __half2float(h0));
        const __half l1 = __float2half_rn(a[2 * k + 1] - __half2float(h1));
        h[k] = (uint32_t)__half_as_ushort(h0) | (uint32_t)__half_as_ushort(h1) << 16;
        l[k] = (uint32_t)__half_as_ushort(l0) | (uint32_t)__half_as_ushort(l1) << 16;
    }
    *hi = make_uint2(h[0], h[1]);
    *lo = make_uint2(l[0], l[1]);
}

__global__ void __launch_bounds__(SPLIT_F16_NT) split_f16x2_kernel(uint16_t *dst, int *rsh, const float *x,
                                                                    size_t rows, size_t L)
{
    __shared__ float wmax[SPLIT_F16_NT / 32];
    pdl_enter();
    const float *xr = x + blockIdx.x * L;
    const int vec = (L % 4) == 0 && ((uintptr_t)x & 15u) == 0;
    const int keep = vec && L / 4 <= (size_t)SPLIT_F16_KEEP * SPLIT_F16_NT;
    float4 kv[SPLIT_F16_KEEP];
    float m = 0.0f;
    if (keep) {
#pragma unroll
        for (int k = 0; k < SPLIT_F16_KEEP; k++) {
            const size_t i = threadIdx.x + (size_t)k * SPLIT_F16_NT;
            kv[k] = i < L / 4 ? ((const float4 *)xr)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            m = fmaxf(m, fmaxf(fmaxf(fabsf(kv[k].x), fabsf(kv[k].y)), fmaxf(fabsf(kv[k].z), fabsf(kv[k].w))));
        }
    } else if (vec) {
        for (size_t i = threadIdx.x; i < L / 4; i += SPLIT_F16_NT) {
            const float4 v = ((const float4 *)xr)[i];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
    } else {
        for (size_t i = threadIdx.x; i < L; i += SPLIT_F16_NT) m = fmaxf(m, fabsf(xr[i]));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = m;
    __syncthreads();
    m = wmax[0];
#pragma unroll
    for (int k = 1; k < SPLIT_F16_NT / 32; k++) m = fmaxf(m, wmax[k]);
    const int r = split_f16_shift(m);
    if (threadIdx.x == 0) rsh[blockIdx.x] = r;
    const float sc = __int_as_float((127 + r) << 23); /* 2^r, a normal fp32 for r in [-120, 120] */
    uint16_t *hi = dst + blockIdx.x * L, *lo = dst + rows * L + blockIdx.x * L;
    if (keep) {
#pragma unroll
        for (int k = 0; k < SPLIT_F16_KEEP; k++) {
            const size_t i = threadIdx.x + (size_t)k * SPLIT_F16_NT;
            if (i < L / 4) split_f16_quad(kv[k], sc, (uint2 *)hi + i, (uint2 *)lo + i);
        }
    } else if (vec) {
        for (size_t i = threadIdx.x; i < L / 4; i += SPLIT_F16_NT)
            split_f16_quad(((const float4 *)xr)[i], sc, (uint2 *)hi + i, (uint2 *)lo + i);
    } else {
        for (size_t i = threadIdx.x; i < L; i += SPLIT_F16_NT) {
            const float a = xr[i] * sc;
            const __half h0 = __float2half_rn(a);
            hi[i] = __half_as_ushort(h0);
            lo[i] = __half_as_ushort(__float2half_rn(a - __half2float(h0)));
        }
    }
}

/* y[t, j] = (p[t, j] + p[rows + t, j]) 2^-(rsh[t] + g): the two planes' products of bcu_split_f16x2, unscaled.
 * Rows over blockIdx.y (strided past 65535), columns over x; four a thread where L allows */
__global__ void sum2_unscale_kernel(float *y, const float *p, const int *rsh, size_t rows, size_t L, int g)
{
    pdl_enter();
    const size_t n = rows * L;
    const int vec = L % 4 == 0 && !((uintptr_t)y & 15u) && !((uintptr_t)p & 15u);
    for (size_t t = blockIdx.y; t < rows; t += gridDim.y) {
        const int e = -(rsh[t] + g);
        const int mul = e >= -126 && e <= 127; /* 2^e a normal fp32: one exact multiply */
        const float f = mul ? __int_as_float((127 + e) << 23) : 1.0f;
        const float *a = p + t * L, *b = p + n + t * L;
        float *yr = y + t * L;
        if (vec)
            for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < L / 4;
                 i += (size_t)gridDim.x * blockDim.x) {
                const float4 u = ((const float4 *)a)[i], v = ((const float4 *)b)[i];
                float4 o = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
                if (mul) o = make_float4(o.x * f, o.y * f, o.z * f, o.w * f);
                else o = make_float4(ldexpf(o.x, e), ldexpf(o.y, e), ldexpf(o.z, e), ldexpf(o.w, e));
                ((float4 *)yr)[i] = o;
            }
        else
            for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < L; i += (size_t)gridDim.x * blockDim.x) {
                const float o = a[i] + b[i];
                yr[i] = mul ? o * f : ldexpf(o, e);
            }
    }
}

__global__ void sum3_kernel(float *y, const float *p, size_t n)
{
    pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = p[i] + (p[n + i] + p[2 * n + i]);
}

__global__ void widen_kernel(float *dst, const uint16_t *src, size_t n, int is_f16)
{
    pdl_enter();
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
    if (n % 4 == 0 && !((uintptr_t)x & 15u) && !((uintptr_t)dst & 7u))
        pdl_launch(split4_kernel, grid_for(n / 4), 256, 0, st, dst, (const float4 *)x, n / 4, n, planes);
    else pdl_launch(split_kernel, grid_for(n), 256, 0, st, dst, x, n, planes);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_split_f16x2(uint16_t *dst, int *rsh, const float *x, size_t rows, size_t L, cudaStream_t st)
{
    if (!rows || !L) return cudaSuccess;
    if (rows > 0x7fffffffu) return cudaErrorInvalidValue;
    if (((uintptr_t)dst & 7u) || (L % 4 && ((uintptr_t)dst & 1u))) return cudaErrorInvalidValue;
    pdl_launch(split_f16x2_kernel, (unsigned)rows, SPLIT_F16_NT, 0, st, dst, rsh, x, rows, L);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_sum2_unscale(float *y, const float *p, const int *rsh, size_t rows, size_t L, int g,
                                        cudaStream_t st)
{
    if (!rows || !L) return cudaSuccess;
    const size_t cols = L % 4 ? L : L / 4, bx = (cols + 255) / 256;
    const size_t gy = rows < 65535 ? rows : 65535, gx = bx * gy > 8192 ? (8192 / gy ? 8192 / gy : 1) : bx;
    pdl_launch(sum2_unscale_kernel, dim3((unsigned)gx, (unsigned)gy), 256, 0, st, y, p, rsh, rows, L, g);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_sum3(float *y, const float *p, size_t n, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    pdl_launch(sum3_kernel, grid_for(n), 256, 0, st, y, p, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_widen(float *dst, const uint16_t *src, size_t n, int is_f16, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    pdl_launch(widen_kernel, grid_for(n), 256, 0, st, dst, src, n, is_f16);
    return cudaGetLastError();
}
