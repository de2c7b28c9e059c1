/* moe.cu - the routed-expert FFN of a V4 MoE layer, grouped over experts,
 * fully on the device (moe.h has the API, docs/CUDA.md the measurements).
 *
 * One call is four steps on one stream, with no host round trip:
 *   1. route_kernel (one block; route_small_kernel up to 32 pairs, the rm_
 *      kernels from 4096): a stable counting sort of the T*topk
 *      (token, expert) pairs by expert.  16 warps each own a contiguous chunk
 *      of pairs; each counts its chunk per expert (__match_any_sync groups
 *      equal ids, the group's last lane adds the group size: no atomics), a
 *      block scan turns the counts into offsets, and each warp scatters its
 *      chunk in order.  So within an expert the pairs stay in (t, k) order,
 *      the order v4.c gathers them in.  It also writes the list of active
 *      experts, the table of 128-row tiles, and per token the rows of its
 *      pairs in ascending expert order (the combine order).
 *   2. gate/up GEMM with the clamped SwiGLU in its epilogue -> h [rows, inter]
 *   3. down GEMM -> yp [rows, dim]
 *      Kernel families do 2 and 3, chosen by the caller (bcu_moe_path): the
 *      two below, the mma rows (further down), and wgmma on act_quant codes
 *      (moe_wg.cu, sm_90a):
 *      - rows (decode): a warp owns 2 gate/up features (4 weight rows) or 4
 *        down features, streams each weight row once with 16-byte loads (one
 *        lane = one 1x32 scale block = 32 nibbles), and serves all of the
 *        expert's tokens from it in passes of up to 4 (later passes hit L1/L2).  The
 *        FP4 codes are decoded in registers to exactly dtype.c's f32 values
 *        (code * scale).  fp32 FFMA, so the CPU's numbers to ~1e-7.
 *      - tiled (prefill): a block computes 128 rows of one expert x 128
 *        weight rows.  Per 32-column step the weight tile is decoded into
 *        shared memory once (fp32, or exact bf16), the activations are
 *        staged beside it (fp32, or split into 1 or 3 bf16 planes), and the
 *        block multiplies with fp32 FFMA (8x8 per thread) or with mma.sync
 *        m16n8k16 bf16 tensor cores (fp32 accumulate).
 *      No copy of the expert weights is ever made in any other format.
 *   4. combine_kernel: y[t] = sum over its pairs in ascending expert order,
 *      a fixed order: the result does not change from run to run.
 * The weight-application rule and the fp32 operation order of the SwiGLU and
 * of the combine are v4.c's (official: h *= w before W2; transformers:
 * y += (W2 h) * w), with explicitly rounded operations so nvcc does not fuse
 * them into FMAs the CPU does not do.
 *
 * What this file does not do: the gate / top-k (v4.c), the shared expert,
 * FP8 activations, V4.1's 1x16 scale blocks (BCU_MOE_BLOCK is 32). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/graph.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/moe_ops.cuh"
#include "backend/cuda/moe_wg.h"

#define RT_THREADS 512 /* routing kernel: threads, >= BCU_MOE_MAX_EXPERTS */
#define RT_WARPS 16    /* routing kernel: chunks of pairs */
#define RM_PAIRS 512   /* multi-block routing: pairs a chunk (a one-warp block) */
#define RM_MIN_P 4096  /* from this many pairs the routing runs on many blocks */
#define RW_WARPS 8     /* rows kernel: warps per block */
#define TL_M BCU_MOE_TILE_M
#define TL_W 128 /* weight rows per tile */
#define TL_K 32  /* columns per step: one scale block */

static_assert(RT_THREADS >= BCU_MOE_MAX_EXPERTS, "one routing thread per expert");
static_assert(RT_WARPS * 32 <= RT_THREADS, "chunk warps are routing threads");
static_assert(TL_M == 128 && TL_K == BCU_MOE_BLOCK, "the tile loaders assume these");

namespace {

/* ---------------------------------------------------------------- decoders */

/* e2m1 code J of the word (element J of 8 consecutive ones), unscaled: the
 * code's bits placed as an f32 with exponent bias 127 is lut[c] * 2^-126
 * (codes 0 and 1 land on f32 subnormals exactly as e2m1's own subnormals
 * behave), and * 2^126 is exact.  nvcc does not flush subnormals unless
 * built with -ftz / fast-math, which this file never is. */
template <int J>
__device__ __forceinline__ float fp4u(uint32_t q)
{
    const uint32_t t = q >> (4 * J);
    return __uint_as_float(((t & 7u) << 22) | ((t & 8u) << 28)) * 0x1p126f;
}

__device__ __forceinline__ void dec8(uint32_t q, float v[8])
{
    v[0] = fp4u<0>(q); v[1] = fp4u<1>(q); v[2] = fp4u<2>(q); v[3] = fp4u<3>(q);
    v[4] = fp4u<4>(q); v[5] = fp4u<5>(q); v[6] = fp4u<6>(q); v[7] = fp4u<7>(q);
}

__device__ __forceinline__ uint32_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/* ---------------------------------------------------------------- routing */

struct RouteArgs {
    const int32_t *ids;
    const float *w;
    int64_t T, P, n_slots, max_tiles;
    int topk, E;
    int32_t *hdr, *cnt, *off, *act, *tile_e, *tile_r0, *sorted, *pos, *comb;
    float *combw;
};

/* exclusive scan of one int per thread over the block; buf: 32 ints of shared */
__device__ int block_scan_excl(int v, int *total, int *buf)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) buf[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < nw ? buf[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < nw) buf[lane] = s;
    }
    __syncthreads();
    const int excl = (warp ? buf[warp - 1] : 0) + x - v;
    *total = buf[nw - 1];
    __syncthreads(); /* buf is reused by the next scan */
    return excl;
}

/* a warp's chunk [c0, c1) of pairs, 32 at a time: per-expert counts into h (shared); returns the pairs with an
 * out-of-range id (on every lane) */
__device__ int count_chunk(const RouteArgs &a, int64_t c0, int64_t c1, int *h, int lane)
{
    int bad = 0;
    for (int64_t base = c0; base < c1; base += 32) { /* the same trip count on every lane */
        const int64_t i = base + lane;
        int e = -1;
        if (i < c1) {
            e = a.ids[i];
            if (e < 0 || e >= a.E) {
                e = -1;
                bad++;
            }
        }
        const unsigned m = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && lane == 31 - __clz(m)) h[e] += __popc(m);
        __syncwarp();
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
    return bad;
}

/* the stable scatter of a warp's chunk: h[e] holds the row of the chunk's first pair of expert e (and moves on);
 * a group of equal ids in one step ranks by lane */
__device__ void scatter_chunk(const RouteArgs &a, int64_t c0, int64_t c1, int *h, int lane)
{
    for (int64_t base = c0; base < c1; base += 32) {
        const int64_t i = base + lane;
        int e = -1;
        if (i < c1) {
            e = a.ids[i];
            if (e < 0 || e >= a.E) e = -1;
        }
        const unsigned m = __match_any_sync(0xffffffffu, e);
        const int b = e >= 0 ? h[e] : 0;
        __syncwarp();
        if (i < c1) {
            if (e >= 0) {
                const int r = b + __popc(m & ((1u << lane) - 1u));
                a.sorted[r] = (int32_t)i;
                a.pos[i] = r;
            } else {
                a.pos[i] = -1;
            }
        }
        if (e >= 0 && lane == 31 - __clz(m)) h[e] = b + __popc(m);
        __syncwarp();
    }
}

/* the plan's unused slots and tiles (-1) past n_act and n_tiles, and hdr; every thread of the block calls it */
__device__ void plan_tail(const RouteArgs &a, int n_act, int n_tiles, int bad)
{
    const int tid = threadIdx.x;
    for (int64_t s = n_act + tid; s < a.n_slots; s += blockDim.x) a.act[s] = -1;
    for (int64_t s = n_tiles + tid; s < a.max_tiles; s += blockDim.x) {
        a.tile_e[s] = -1;
        a.tile_r0[s] = 0;
    }
    if (tid == 0) {
        a.hdr[0] = n_act;
        a.hdr[1] = n_tiles;
        a.hdr[2] = bad;
    }
}

/* thread e < E of the block holds cnt, the pairs of expert e: writes cnt, off, act, the tiles and hdr; returns
 * off[e].  Every thread of the block calls it. */
__device__ int plan_experts(const RouteArgs &a, int cnt, int bad, int *buf)
{
    const int tid = threadIdx.x;
    int total, n_act, n_tiles;
    const int off = block_scan_excl(cnt, &total, buf);
    const int ai = block_scan_excl(cnt > 0, &n_act, buf);
    const int nt = (cnt + TL_M - 1) / TL_M;
    const int ti = block_scan_excl(nt, &n_tiles, buf);
    if (tid < a.E) {
        a.cnt[tid] = cnt;
        a.off[tid] = off;
        if (tid == a.E - 1) a.off[a.E] = off + cnt;
        if (cnt > 0) {
            a.act[ai] = tid;
            const int span = (int)bcu_moe_tile_span(cnt);
            for (int j = 0; j < nt; j++) {
                a.tile_e[ti + j] = tid;
                a.tile_r0[ti + j] = off + j * span;
            }
        }
    }
    plan_tail(a, n_act, n_tiles, bad);
    (void)total;
    return off;
}

/* token t's rows of its pairs ascending (ascending expert, then k) and their routing weights, from pos (on the
 * device, and in bcu_moe_route_host) */
__host__ __device__ void comb_token(const int32_t *pos, const float *w, int topk, int64_t t, int32_t *comb,
                                    float *combw)
{
    int32_t r[BCU_MOE_MAX_TOPK];
    float f[BCU_MOE_MAX_TOPK];
    int n = 0;
    for (int k = 0; k < topk; k++) {
        const int32_t rk = pos[t * topk + k];
        if (rk < 0) continue;
        int j = n++;
        for (; j > 0 && r[j - 1] > rk; j--) {
            r[j] = r[j - 1];
            f[j] = f[j - 1];
        }
        r[j] = rk;
        f[j] = w[t * topk + k];
    }
    for (int k = 0; k < topk; k++) {
        comb[t * topk + k] = k < n ? r[k] : -1;
        combw[t * topk + k] = k < n ? f[k] : 0.0f;
    }
}

/* the routing plan in one block (decode-sized batches: one launch) */
__global__ void __launch_bounds__(RT_THREADS) route_kernel(RouteArgs a)
{
    pdl_enter();
    extern __shared__ int hist[]; /* [RT_WARPS][E]: per chunk, counts, then running rows */
    __shared__ int buf[32];
    __shared__ int s_bad;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, E = a.E;
    for (int i = tid; i < RT_WARPS * E; i += RT_THREADS) hist[i] = 0;
    if (tid == 0) s_bad = 0;
    __syncthreads();

    /* 1: per-chunk counts.  Warps >= RT_WARPS have no chunk. */
    const int64_t C = (a.P + RT_WARPS - 1) / RT_WARPS;
    int64_t c0 = (int64_t)warp * C, c1;
    if (warp >= RT_WARPS || c0 > a.P) c0 = a.P;
    c1 = c0 + C < a.P ? c0 + C : a.P;
    int *h = hist + (warp < RT_WARPS ? warp : 0) * E;
    const int bad = count_chunk(a, c0, c1, h, lane);
    if (bad && lane == 0) atomicAdd(&s_bad, bad); /* an integer count: order does not matter */
    __syncthreads();

    /* 2: thread e turns its column into chunk offsets; scans over experts */
    int cnt = 0;
    if (tid < E)
        for (int w = 0; w < RT_WARPS; w++) {
            const int v = hist[w * E + tid];
            hist[w * E + tid] = cnt;
            cnt += v;
        }
    const int off = plan_experts(a, cnt, s_bad, buf);
    if (tid < E)
        for (int w = 0; w < RT_WARPS; w++) hist[w * E + tid] += off;
    __syncthreads();

    /* 3: stable scatter */
    scatter_chunk(a, c0, c1, h, lane);
    __syncthreads(); /* pos is read back below by other threads (plain loads, not __ldg) */

    /* 4: per token, the rows of its pairs ascending */
    for (int64_t t = tid; t < a.T; t += RT_THREADS) comb_token(a.pos, a.w, a.topk, t, a.comb, a.combw);
}

/* The same plan for decode batches of at most 32 pairs (a token or five at top-6), without a barrier: each warp
 * holds the pairs' ids one a lane and thread e counts, for its expert, the pairs before it (off), its own (cnt)
 * and the distinct experts before it (its slot) by 32 shuffles; warp 0 places the pairs (a pair's row is the
 * pairs of lower experts plus the earlier pairs of its own) and then each token's rows.  route_kernel's five
 * barriers and three block scans took 5-8 us at batch 1 (ncu, H200), every layer on the MoE's critical path. */
#define RS_MAX_P 32
__global__ void __launch_bounds__(RT_THREADS) route_small_kernel(RouteArgs a)
{
    pdl_enter();
    const int tid = threadIdx.x, lane = tid & 31, E = a.E, P = (int)a.P;
    int id = -1;
    if (lane < P) {
        id = a.ids[lane];
        if (id < 0 || id >= E) id = -1;
    }
    const unsigned m = __match_any_sync(0xffffffffu, id);
    const bool first = id >= 0 && lane == __ffs(m) - 1; /* the lowest pair of its expert */
    const int fid = first ? id : -1;
    const int bad = __popc(__ballot_sync(0xffffffffu, lane < P && id < 0));
    const int n_act = __popc(__ballot_sync(0xffffffffu, first));
    int cnt = 0, off = 0, slot = 0, below = 0;
    const int e = tid;
    for (int j = 0; j < P; j++) {
        const int v = __shfl_sync(0xffffffffu, id, j), vf = __shfl_sync(0xffffffffu, fid, j);
        cnt += v == e;
        off += v >= 0 && v < e;
        slot += vf >= 0 && vf < e;
        below += v >= 0 && v < id; /* warp 0: the pairs of lower experts than lane's pair */
    }
    if (e < E) {
        a.cnt[e] = cnt;
        a.off[e] = off;
        if (e == E - 1) a.off[E] = off + cnt;
        if (cnt > 0) { /* cnt <= 32: one tile */
            a.act[slot] = e;
            a.tile_e[slot] = e;
            a.tile_r0[slot] = off;
        }
    }
    plan_tail(a, n_act, n_act, bad);
    if (tid < 32) {
        if (lane < P) {
            const int r = id >= 0 ? below + __popc(m & ((1u << lane) - 1u)) : -1;
            if (r >= 0) a.sorted[r] = lane;
            a.pos[lane] = r;
        }
        __syncwarp(); /* pos is read back by other lanes (plain loads) */
        if (lane < a.T) comb_token(a.pos, a.w, a.topk, lane, a.comb, a.combw);
    }
}

/* The same plan from prefill-sized batches (route_kernel's one block took ~100 us at 24576 pairs) in four launches:
 * counts per chunk of RM_PAIRS pairs (a warp a block), one block turning them into each chunk's first row per
 * expert (bh: [chunks][E], then the chunks' bad counts), the scatter per chunk, the combine lists per token. */
__global__ void __launch_bounds__(32) rm_count_kernel(RouteArgs a, int32_t *bh)
{
    pdl_enter();
    extern __shared__ int hc[]; /* [E] */
    const int lane = threadIdx.x, E = a.E;
    for (int i = lane; i < E; i += 32) hc[i] = 0;
    __syncwarp();
    const int64_t c0 = (int64_t)blockIdx.x * RM_PAIRS, c1 = c0 + RM_PAIRS < a.P ? c0 + RM_PAIRS : a.P;
    const int bad = count_chunk(a, c0, c1, hc, lane);
    __syncwarp();
    for (int i = lane; i < E; i += 32) bh[(int64_t)blockIdx.x * E + i] = hc[i];
    if (lane == 0) bh[(int64_t)gridDim.x * E + blockIdx.x] = bad;
}

__global__ void __launch_bounds__(RT_THREADS) rm_scan_kernel(RouteArgs a, int32_t *bh, int nb)
{
    pdl_enter();
    __shared__ int buf[32];
    const int tid = threadIdx.x, E = a.E;
    int cnt = 0;
    if (tid < E)
        for (int b = 0; b < nb; b++) {
            const int v = bh[(int64_t)b * E + tid];
            bh[(int64_t)b * E + tid] = cnt;
            cnt += v;
        }
    int bad = 0, bad_all;
    for (int b = tid; b < nb; b += RT_THREADS) bad += bh[(int64_t)nb * E + b];
    block_scan_excl(bad, &bad_all, buf);
    const int off = plan_experts(a, cnt, bad_all, buf);
    if (tid < E)
        for (int b = 0; b < nb; b++) bh[(int64_t)b * E + tid] += off;
}

__global__ void __launch_bounds__(32) rm_scatter_kernel(RouteArgs a, const int32_t *bh)
{
    pdl_enter();
    extern __shared__ int hc[]; /* [E] */
    const int lane = threadIdx.x, E = a.E;
    for (int i = lane; i < E; i += 32) hc[i] = bh[(int64_t)blockIdx.x * E + i];
    __syncwarp();
    const int64_t c0 = (int64_t)blockIdx.x * RM_PAIRS, c1 = c0 + RM_PAIRS < a.P ? c0 + RM_PAIRS : a.P;
    scatter_chunk(a, c0, c1, hc, lane);
}

__global__ void rm_comb_kernel(RouteArgs a)
{
    pdl_enter();
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < a.T) comb_token(a.pos, a.w, a.topk, t, a.comb, a.combw);
}

/* ---------------------------------------------------------------- GEMM arguments */

struct MoeArgs {
    const uint8_t *const *w1, *const *s1, *const *w3, *const *s3, *const *w2, *const *s2;
    int64_t D, I;
    int topk, official;
    int act_fp8_h; /* h goes through fq_fp8 (blocks of 128) before W2: the mma rows write it to h, not to hq */
    float limit;
    const float *x, *w;
    const int32_t *off, *act, *tile_e, *tile_r0, *sorted;
    float *h, *yp;
    uint16_t *xq, *hq; /* mma rows: bf16 planes of x and of h (mr_kernel) */
};

/* ---------------------------------------------------------------- rows (decode) kernels
 * G = 1: the warp owns features f0, f0+1 of W1 and W3 (rows W1[f0], W3[f0],
 * W1[f0+1], W3[f0+1]); x rows gathered through sorted; writes h.
 * G = 2: the warp owns features f0..f0+3 of W2; x = h rows; writes yp.
 * One pass serves TT consecutive rows (tokens) of expert e from row0. */
template <int G, int TT>
__device__ __forceinline__ void rows_pass(const MoeArgs &a, int e, int64_t row0, int64_t f0, int lane)
{
    constexpr int NR = 4;
    const int64_t N = G == 1 ? a.I : a.D, K = G == 1 ? a.D : a.I, nkb = K / 32;
    /* weight row j: G = 1: matrix j & 1 (W1, W3), feature f0 + (j >> 1); G = 2:
     * W2, feature f0 + j.  Two base rows and a row stride keep registers low;
     * f0 + NR/2 or f0 + NR - 1 < N always holds (N % 32 == 0, f0 % FPW == 0). */
    const int64_t wstride = K / 2;
    const uint8_t *wb0, *wb1, *sb0, *sb1;
    if (G == 1) {
        wb0 = a.w1[e] + f0 * wstride;
        wb1 = a.w3[e] + f0 * wstride;
        sb0 = a.s1[e] + f0 * nkb;
        sb1 = a.s3[e] + f0 * nkb;
    } else {
        wb0 = wb1 = a.w2[e] + f0 * wstride;
        sb0 = sb1 = a.s2[e] + f0 * nkb;
    }
    int64_t xo[TT]; /* element offsets of the activation rows in x (G = 1) or h (G = 2) */
#pragma unroll
    for (int i = 0; i < TT; i++) xo[i] = G == 1 ? (int64_t)(a.sorted[row0 + i] / a.topk) * a.D : (row0 + i) * a.I;
    const float *xbase = G == 1 ? a.x : a.h;

    float acc[NR][TT];
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int i = 0; i < TT; i++) acc[j][i] = 0.0f;

    for (int64_t kb = lane; kb < nkb; kb += 32) {
        uint4 q[NR];
        float s[NR];
#pragma unroll
        for (int j = 0; j < NR; j++) {
            const int64_t rj = G == 1 ? (j >> 1) : j; /* row offset from the base row */
            const uint8_t *wrow = (G == 1 && (j & 1) ? wb1 : wb0) + rj * wstride;
            const uint8_t *srow = (G == 1 && (j & 1) ? sb1 : sb0) + rj * nkb;
            q[j] = __ldg((const uint4 *)(wrow + kb * 16));
            s[j] = ue8m0(__ldg(srow + kb));
        }
#pragma unroll
        for (int wd = 0; wd < 4; wd++) {
            float xv[TT][8];
#pragma unroll
            for (int i = 0; i < TT; i++) {
                const float4 *xp = (const float4 *)(xbase + xo[i] + kb * 32 + wd * 8);
                const float4 u0 = __ldg(xp), u1 = __ldg(xp + 1);
                xv[i][0] = u0.x; xv[i][1] = u0.y; xv[i][2] = u0.z; xv[i][3] = u0.w;
                xv[i][4] = u1.x; xv[i][5] = u1.y; xv[i][6] = u1.z; xv[i][7] = u1.w;
            }
#pragma unroll
            for (int j = 0; j < NR; j++) {
                const uint32_t qq = wd == 0 ? q[j].x : wd == 1 ? q[j].y : wd == 2 ? q[j].z : q[j].w;
                float v[8];
                dec8(qq, v);
#pragma unroll
                for (int c = 0; c < 8; c++) v[c] *= s[j]; /* exact: lut * 2^k, dtype.c's value */
#pragma unroll
                for (int i = 0; i < TT; i++)
#pragma unroll
                    for (int c = 0; c < 8; c++) acc[j][i] = fmaf(v[c], xv[i][c], acc[j][i]);
            }
        }
    }
    /* butterfly: every lane ends with every sum (each lane in its own
     * association order); one fixed lane writes each output, so the result
     * does not vary from run to run */
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int i = 0; i < TT; i++)
#pragma unroll
            for (int o = 16; o; o >>= 1) acc[j][i] += __shfl_xor_sync(0xffffffffu, acc[j][i], o);

    if (G == 1) {
#pragma unroll
        for (int ff = 0; ff < 2; ff++)
#pragma unroll
            for (int i = 0; i < TT; i++)
                if (lane == ff * TT + i && f0 + ff < N) {
                    const int64_t row = row0 + i;
                    float hv = swiglu1(acc[2 * ff][i], acc[2 * ff + 1][i], a.limit);
                    if (a.official) hv = __fmul_rn(hv, a.w[a.sorted[row]]);
                    a.h[row * a.I + f0 + ff] = hv;
                }
    } else {
#pragma unroll
        for (int j = 0; j < NR; j++)
#pragma unroll
            for (int i = 0; i < TT; i++)
                if (lane == j * TT + i && f0 + j < N) a.yp[(row0 + i) * a.D + f0 + j] = acc[j][i];
    }
}

/* grid: x = feature groups, y = active-expert slot */
template <int G>
__global__ void __launch_bounds__(32 * RW_WARPS, 2) rows_kernel(MoeArgs a)
{
    pdl_enter();
    const int e = a.act[blockIdx.y];
    if (e < 0) return;
    const int64_t r0 = a.off[e], n = a.off[e + 1] - r0;
    constexpr int FPW = G == 1 ? 2 : 4;
    const int64_t f0 = ((int64_t)blockIdx.x * RW_WARPS + (threadIdx.x >> 5)) * FPW;
    if (f0 >= (G == 1 ? a.I : a.D)) return; /* warp-uniform */
    const int lane = threadIdx.x & 31;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) rows_pass<G, 4>(a, e, r0 + i, f0, lane);
    if (n - i >= 2) {
        rows_pass<G, 2>(a, e, r0 + i, f0, lane);
        i += 2;
    }
    if (n - i >= 1) rows_pass<G, 1>(a, e, r0 + i, f0, lane);
}

/* ---------------------------------------------------------------- tiled (prefill) kernels */

struct Tile {
    int e;
    int64_t r0, n, n0; /* first row, rows in the tile (<= TL_M), first feature */
};

/* the tile of this block, or e < 0 if the slot is past the last tile */
template <int G>
__device__ __forceinline__ Tile tile_of(const MoeArgs &a)
{
    Tile t;
    t.e = a.tile_e[blockIdx.y];
    t.r0 = t.n = t.n0 = 0;
    if (t.e < 0) return t;
    t.r0 = a.tile_r0[blockIdx.y];
    const int64_t end = a.off[t.e + 1], span = bcu_moe_tile_span(end - a.off[t.e]);
    t.n = end - t.r0 < span ? end - t.r0 : span;
    t.n0 = (int64_t)blockIdx.x * (G == 1 ? TL_W / 2 : TL_W);
    return t;
}

/* Weight row r of the tile: its row pointer and scale row, or NULL past N.
 * G = 1 holds gate and up rows of TL_W/2 features.  The FFMA kernel puts all
 * gate rows first (r < 64: W1[n0 + r], else W3[n0 + r - 64]); the mma kernel
 * interleaves by warp (r = 32 wm + i: i < 16 W1[n0 + 16 wm + i], else
 * W3[n0 + 16 wm + i - 16]) so a warp holds both halves of its 16 features. */
template <int G, bool MMA>
__device__ __forceinline__ void tile_wrow(const MoeArgs &a, const Tile &t, int r, const uint8_t **wp,
                                          const uint8_t **sp)
{
    const int64_t K = G == 1 ? a.D : a.I, N = G == 1 ? a.I : a.D;
    int64_t f;
    bool up = false;
    if (G == 1) {
        if (MMA) {
            up = (r & 31) >= 16;
            f = t.n0 + (r >> 5) * 16 + (r & 15);
        } else {
            up = r >= 64;
            f = t.n0 + (r & 63);
        }
    } else {
        f = t.n0 + r;
    }
    if (f >= N) {
        *wp = NULL;
        *sp = NULL;
        return;
    }
    const uint8_t *W = G == 1 ? (up ? a.w3[t.e] : a.w1[t.e]) : a.w2[t.e];
    const uint8_t *S = G == 1 ? (up ? a.s3[t.e] : a.s1[t.e]) : a.s2[t.e];
    *wp = W + f * (K / 2);
    *sp = S + f * (K / 32);
}

/* what one thread carries from global memory for one 32-column step: 16
 * activations of row m = tid & 127 and 16 codes of weight row r = tid & 127,
 * columns half*16 .. half*16+15 of the step (half = tid >> 7) */
struct Stage {
    float4 xv[4];
    uint2 wq;
    uint32_t sb;
};

__device__ __forceinline__ void stage_load(Stage &s, const float *xsrc, const uint8_t *wsrc, const uint8_t *ssrc,
                                           int64_t kb, int half)
{
    if (xsrc) {
        const float4 *p = (const float4 *)(xsrc + kb * TL_K + half * 16);
#pragma unroll
        for (int c = 0; c < 4; c++) s.xv[c] = __ldg(p + c);
    } else {
#pragma unroll
        for (int c = 0; c < 4; c++) s.xv[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (wsrc) {
        s.wq = __ldg((const uint2 *)(wsrc + kb * 16 + half * 8));
        s.sb = __ldg(ssrc + kb);
    } else {
        s.wq = make_uint2(0u, 0u); /* code 0 is +0 */
        s.sb = 127u;
    }
}

/* the activation row of tile row m, or NULL past the tile's rows */
template <int G>
__device__ __forceinline__ const float *tile_xrow(const MoeArgs &a, const Tile &t, int m)
{
    if (m >= t.n) return NULL;
    const int64_t row = t.r0 + m;
    return G == 1 ? a.x + (int64_t)(a.sorted[row] / a.topk) * a.D : a.h + row * a.I;
}

/* ---- fp32 FFMA tile.  Thread (tw = tid & 15, tm = tid >> 4) owns rows
 * {4tm..4tm+3, 64+4tm..} and weight rows {4tw..4tw+3, 64+4tw..}; warp w thus
 * owns rows [8w, 8w+8) and [64+8w, 64+8w+8), and skips a half with no rows. */
template <int G>
__global__ void __launch_bounds__(256, 2) simt_kernel(MoeArgs a)
{
    pdl_enter();
    __shared__ __align__(16) float xs[TL_K][TL_M];
    __shared__ __align__(16) float ws[TL_K][TL_W];
    const Tile t = tile_of<G>(a);
    if (t.e < 0) return;
    const int tid = threadIdx.x, half = tid >> 7, lr = tid & 127;
    const int tw = tid & 15, tm = tid >> 4, warp = tid >> 5;
    const bool lo = 8 * warp < t.n, hi = 64 + 8 * warp < t.n;
    const float *xsrc = tile_xrow<G>(a, t, lr);
    const uint8_t *wsrc, *ssrc;
    tile_wrow<G, false>(a, t, lr, &wsrc, &ssrc);
    const int64_t nkb = (G == 1 ? a.D : a.I) / TL_K;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;

    Stage st;
    stage_load(st, xsrc, wsrc, ssrc, 0, half);
    for (int64_t kb = 0; kb < nkb; kb++) {
        __syncthreads(); /* the previous step's reads of xs / ws are done */
        {
            const float *xf = (const float *)st.xv;
#pragma unroll
            for (int c = 0; c < 16; c++) xs[half * 16 + c][lr] = xf[c];
            const float sc = ue8m0(st.sb);
            float v[8];
            dec8(st.wq.x, v);
#pragma unroll
            for (int c = 0; c < 8; c++) ws[half * 16 + c][lr] = v[c] * sc;
            dec8(st.wq.y, v);
#pragma unroll
            for (int c = 0; c < 8; c++) ws[half * 16 + 8 + c][lr] = v[c] * sc;
        }
        __syncthreads();
        if (kb + 1 < nkb) stage_load(st, xsrc, wsrc, ssrc, kb + 1, half);
        if (hi) {
#pragma unroll
            for (int k = 0; k < TL_K; k++) {
                const float4 b0 = *(const float4 *)&ws[k][tw * 4], b1 = *(const float4 *)&ws[k][64 + tw * 4];
                const float4 a0 = *(const float4 *)&xs[k][tm * 4], a1 = *(const float4 *)&xs[k][64 + tm * 4];
                const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
                const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
                for (int i = 0; i < 8; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
        } else if (lo) {
#pragma unroll
            for (int k = 0; k < TL_K; k++) {
                const float4 b0 = *(const float4 *)&ws[k][tw * 4], b1 = *(const float4 *)&ws[k][64 + tw * 4];
                const float4 a0 = *(const float4 *)&xs[k][tm * 4];
                const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
                const float av[4] = {a0.x, a0.y, a0.z, a0.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int64_t m = (i < 4 ? 0 : 64) + tm * 4 + (i & 3);
        if (m >= t.n) continue;
        const int64_t row = t.r0 + m;
        if (G == 1) {
            const int64_t f = t.n0 + tw * 4;
            if (f >= a.I) continue;
            const float wt = a.official ? a.w[a.sorted[row]] : 1.0f;
            float o[4];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                o[c] = swiglu1(acc[i][c], acc[i][4 + c], a.limit);
                if (a.official) o[c] = __fmul_rn(o[c], wt);
            }
            *(float4 *)(a.h + row * a.I + f) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
            for (int jh = 0; jh < 2; jh++) {
                const int64_t f = t.n0 + jh * 64 + tw * 4;
                if (f < a.D)
                    *(float4 *)(a.yp + row * a.D + f) =
                        make_float4(acc[i][4 * jh], acc[i][4 * jh + 1], acc[i][4 * jh + 2], acc[i][4 * jh + 3]);
            }
        }
    }
}

/* ---- bf16 tensor-core tile (mma.sync m16n8k16, fp32 accumulate).
 * Weights are the A operand (M = weight rows), rows/tokens the B operand
 * (N = tokens): a warp (wm = warp & 3, wn = warp >> 2) owns weight rows
 * [32 wm, 32 wm + 32) (two m16 tiles) x tokens [64 wn, 64 wn + 64) (eight n8
 * tiles).  The decoded weights are exact in bf16 (at most two significant
 * bits times a power of two).  PL = 3 splits each activation into hi + mid +
 * lo bf16 planes (24 bits: the fp32 value), PL = 1 rounds it to bf16. */
#define SM_LD 40 /* shared row length in bf16: 32 + 8 pad, 80 B (ldmatrix rows land on distinct banks) */

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int G, int PL>
__global__ void __launch_bounds__(256, 2) mma_kernel(MoeArgs a)
{
    pdl_enter();
    __shared__ __align__(16) uint16_t Ws[TL_W][SM_LD];
    __shared__ __align__(16) uint16_t Xs[PL][TL_M][SM_LD];
    const Tile t = tile_of<G>(a);
    if (t.e < 0) return;
    const int tid = threadIdx.x, half = tid >> 7, lr = tid & 127;
    const int lane = tid & 31, warp = tid >> 5, wm = warp & 3, wn = warp >> 2;
    const float *xsrc = tile_xrow<G>(a, t, lr);
    const uint8_t *wsrc, *ssrc;
    tile_wrow<G, true>(a, t, lr, &wsrc, &ssrc);
    const int64_t nkb = (G == 1 ? a.D : a.I) / TL_K;
    /* n8 tiles of this warp that hold any row of the tile (warp-uniform) */
    int64_t nv = t.n - 64 * wn;
    const int n8 = nv <= 0 ? 0 : nv >= 64 ? 8 : (int)((nv + 7) / 8);

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;

    Stage st;
    stage_load(st, xsrc, wsrc, ssrc, 0, half);
    for (int64_t kb = 0; kb < nkb; kb++) {
        __syncthreads();
        {
            /* activations -> PL bf16 planes, 16 per thread, two 16-byte stores per plane */
            const float *xf = (const float *)st.xv;
            uint32_t pk[PL][8];
#pragma unroll
            for (int c = 0; c < 16; c += 2) {
                float r0 = xf[c], r1 = xf[c + 1];
#pragma unroll
                for (int p = 0; p < PL; p++) {
                    const uint32_t h0 = bf16_bits(r0), h1 = bf16_bits(r1);
                    pk[p][c / 2] = h0 | (h1 << 16);
                    r0 -= __uint_as_float(h0 << 16); /* exact: h0 is r0 rounded to 8 bits */
                    r1 -= __uint_as_float(h1 << 16);
                }
            }
#pragma unroll
            for (int p = 0; p < PL; p++) {
                uint4 *dst = (uint4 *)&Xs[p][lr][half * 16];
                dst[0] = make_uint4(pk[p][0], pk[p][1], pk[p][2], pk[p][3]);
                dst[1] = make_uint4(pk[p][4], pk[p][5], pk[p][6], pk[p][7]);
            }
            /* weights: decoded and scaled in fp32 (exact), then the top 16 bits */
            const float sc = ue8m0(st.sb);
            float v[16];
            dec8(st.wq.x, v);
            dec8(st.wq.y, v + 8);
            uint32_t wk[8];
#pragma unroll
            for (int c = 0; c < 8; c++)
                wk[c] = (__float_as_uint(v[2 * c] * sc) >> 16) | (__float_as_uint(v[2 * c + 1] * sc) & 0xffff0000u);
            uint4 *wd = (uint4 *)&Ws[lr][half * 16];
            wd[0] = make_uint4(wk[0], wk[1], wk[2], wk[3]);
            wd[1] = make_uint4(wk[4], wk[5], wk[6], wk[7]);
        }
        __syncthreads();
        if (kb + 1 < nkb) stage_load(st, xsrc, wsrc, ssrc, kb + 1, half);
        if (n8 == 0) continue;
#pragma unroll
        for (int ks = 0; ks < TL_K; ks += 16) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                ldsm_x4(af[mi], &Ws[wm * 32 + mi * 16 + (lane & 7) + ((lane >> 3) & 1) * 8][ks + (lane >> 4) * 8]);
#pragma unroll
            for (int p = 0; p < PL; p++)
#pragma unroll
                for (int nj = 0; nj < 4; nj++) {
                    if (2 * nj >= n8) continue;
                    uint32_t bf[4];
                    ldsm_x4(bf, &Xs[p][wn * 64 + nj * 16 + (lane & 7) + (lane >> 4) * 8][ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) {
                        mma_bf16(acc[mi][2 * nj], af[mi], bf[0], bf[1]);
                        if (2 * nj + 1 < n8) mma_bf16(acc[mi][2 * nj + 1], af[mi], bf[2], bf[3]);
                    }
                }
        }
    }

    /* c[0], c[1]: weight row g, tokens 2q, 2q+1; c[2], c[3]: row g + 8 */
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int ni = 0; ni < 8; ni++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int64_t m = 64 * wn + 8 * ni + 2 * q + (c & 1);
            if (m >= t.n) continue;
            const int64_t row = t.r0 + m;
            if (G == 1) {
                const int64_t f = t.n0 + 16 * wm + g + 8 * (c >> 1);
                if (f >= a.I) continue;
                float hv = swiglu1(acc[0][ni][c], acc[1][ni][c], a.limit);
                if (a.official) hv = __fmul_rn(hv, a.w[a.sorted[row]]);
                a.h[row * a.I + f] = hv;
            } else {
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const int64_t f = t.n0 + 32 * wm + 16 * mi + g + 8 * (c >> 1);
                    if (f < a.D) a.yp[row * a.D + f] = acc[mi][ni][c];
                }
            }
        }
}

/* ---------------------------------------------------------------- mma rows (decode and small batches)
 * The weights are the B operand of mma.sync m16n8k16, streamed straight
 * from global memory into registers as in the row-dot (kernels.cu): lane
 * (g, q) of a warp loads 16 bytes (32 e2m1 codes = one 1x32 scale block) of
 * weight row g of each of its n8 tiles per 128-column chunk, several chunks
 * ahead, and decodes them to exact bf16 (byte-table lookup, then the ue8m0
 * scale by one exact bf16x2 multiply).  The activations are the A operand:
 * row m of the pass's m16 tiles is bf16 plane m % NP of the expert's row
 * m / NP (NP = 3 for bf16x3, 1 for bf16: the hi plane alone; a tile need not
 * hold whole tokens), read from planes split once per
 * call (mr_split_kernel for x, the gate/up epilogue for h) in the chunk
 * layout the fragments want, so a lane's A operand for a step pair is one
 * 16-byte load that stays in L1 across the block's warps.  No barrier in the
 * main loop.
 * The sums, for every (row, feature), whatever the other rows: per plane
 * (and per quarter of K with KS = 4), the tensor-core sum over the chunks in
 * order from zero; the quarters in order; then hi + (mid + lo).
 * G = 1: a warp owns 8 features: n8 tile 0 their W1 rows, tile 1 their W3
 * rows, so gate and up of a (token, feature) meet in one lane; G = 2: 16
 * rows of W2.  MT m16 tiles (5, 10 or 21 rows of the expert) share one
 * decode of the weights; more rows take more passes.
 * H200 (bench_gpu_moe, V4-Flash experts): T = 1 82 us (23% of the bandwidth
 * floor, like the fp32 rows kernel), T = 64 1.81 ms (rows: 2.94), T = 256
 * 3.38 ms (rows: 10.4, tiled bf16x3: 11.0), T = 1024 11.0 ms (tiled: 13.4).
 * The kernel issues ~270 instructions per warp per 1 KB of weights (the
 * e2m1 decode is most of them): at T = 1 it is issue- and latency-bound
 * (ncu: SM throughput 48%, DRAM 20%, 12 warps per SM by registers).  Two
 * tiles per pass beat four even at 24 rows per expert; splitting K over the
 * block's warps (KS = 4) was slower everywhere. */
#define MR_WARPS 4 /* warps per block */
#define MR_WN 2    /* n8 tiles per warp */
#define MR_PD 4    /* chunks of weights in flight per lane */
#define MR_CH 128  /* columns per chunk: 64 bytes of a weight row */

/* 16 bytes of weights, not kept in L1 (they are read once; the activations live there) */
__device__ __forceinline__ uint4 mr_ldw(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* the place of column c in a plane row: 8-column groups stored x0 x4 x1 x5 x2 x6 x3 x7 (rd_fp4x8's pairs) */
__device__ __forceinline__ int64_t mr_perm(int64_t c) { return (c & ~(int64_t)7) + ((c & 3) << 1) + ((c >> 2) & 1); }

/* planes of x [T, D] -> xq [T][3][Dp] (Dp = D rounded up to a chunk, zero past D); a thread per 8-column group */
__global__ void mr_split_kernel(uint16_t *xq, const float *x, int64_t T, int64_t D, int64_t Dp)
{
    pdl_enter();
    const int64_t ng = Dp / 8;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < T * ng; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / ng, c0 = (i - t * ng) * 8;
        float v[8];
        if (c0 < D) {
            const float4 a = __ldg((const float4 *)(x + t * D + c0)), b = __ldg((const float4 *)(x + t * D + c0 + 4));
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = 0.0f;
        }
        uint32_t s[8][3];
#pragma unroll
        for (int j = 0; j < 8; j++) rd_split3(v[j], s[j]);
#pragma unroll
        for (int p = 0; p < 3; p++)
            *(uint4 *)(xq + (t * 3 + p) * Dp + c0) =
                make_uint4(s[0][p] | (s[4][p] << 16), s[1][p] | (s[5][p] << 16), s[2][p] | (s[6][p] << 16),
                           s[3][p] | (s[7][p] << 16));
    }
}

/* MT m16 tiles per pass (NP = 3: 5 rows for MT = 1, 10 for 2, 21 for 4; NP = 1: 16 rows a tile).  KS = 1: grid
 * x = groups of MR_WARPS x 8 (G = 1) or MR_WARPS x 8 MR_WN (G = 2) weight rows, a warp's own rows over all of K.
 * KS = MR_WARPS: grid x = groups of 8 or 8 MR_WN rows that the block's warps share, each over a fixed quarter of
 * K's chunks; their partial sums meet in shared memory in warp order.  y = active-expert slot.  NP: the bf16
 * planes of an activation row the A rows take (3: hi, mid, lo; 1: hi only, the bf16 maths, exact when every
 * activation is a bf16 value, as act_quant'd ones are: then planes mid and lo are zero and the hi plane's sums are
 * the three-plane result bit for bit, the per-row tensor-core sums not depending on the other rows of a tile). */
template <int G, int MT, int KS, int NP>
__global__ void __launch_bounds__(32 * MR_WARPS) mr_kernel(MoeArgs a)
{
    pdl_enter();
    constexpr int TOK = 16 * MT / NP;
    __shared__ float red[MR_WARPS][16 * MT][8 * MR_WN + 1];
    const int e = a.act[blockIdx.y];
    if (e < 0) return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int64_t K = G == 1 ? a.D : a.I, N = G == 1 ? a.I : a.D;
    const int64_t Kp = (K + MR_CH - 1) / MR_CH * MR_CH, nch = Kp / MR_CH, nkb = K / 32;
    const int64_t f0 = ((int64_t)blockIdx.x * (MR_WARPS / KS) + (KS == 1 ? warp : 0)) * 8 * (G == 1 ? 1 : MR_WN);
    const int ks = KS == 1 ? 0 : warp;
    const int64_t cs = nch * ks / KS, ce = nch * (ks + 1) / KS; /* this warp's chunks */
    if (KS == 1 && f0 >= N) return; /* warp-uniform; KS = 1 has no block barrier */
    const int64_t r0 = a.off[e], nrows = a.off[e + 1] - r0;

    /* this lane's weight row in each n8 tile, its first scale, and whether it exists */
    const uint8_t *wp[MR_WN], *sp[MR_WN];
    bool wok[MR_WN];
#pragma unroll
    for (int nt = 0; nt < MR_WN; nt++) {
        const int64_t f = G == 1 ? f0 + g : f0 + 8 * nt + g;
        wok[nt] = f < N;
        const int64_t fr = wok[nt] ? f : 0;
        const uint8_t *W = G == 1 ? (nt ? a.w3[e] : a.w1[e]) : a.w2[e];
        const uint8_t *S = G == 1 ? (nt ? a.s3[e] : a.s1[e]) : a.s2[e];
        wp[nt] = W + fr * (K / 2) + 16 * q;
        sp[nt] = S + fr * nkb + q;
    }
    /* lane q's 32 columns of chunk c: [128 c + 32 q, +32), inside K or not at all (K % 32 == 0) */
    auto wload = [&](int64_t c, uint4 (&w)[MR_WN], uint32_t (&s)[MR_WN]) {
        const bool cok = MR_CH * c + 32 * q < K;
#pragma unroll
        for (int nt = 0; nt < MR_WN; nt++) {
            const bool ok = cok && wok[nt];
            w[nt] = ok ? mr_ldw(wp[nt] + 64 * c) : make_uint4(0u, 0u, 0u, 0u);
            s[nt] = ok ? (uint32_t)__ldg(sp[nt] + 4 * c) : 127u;
        }
    };
    const uint16_t *src = G == 1 ? a.xq : a.hq;

    for (int64_t t0 = 0; t0 < nrows; t0 += TOK) {
        const int ntk = nrows - t0 < TOK ? (int)(nrows - t0) : TOK;
        const int mtv = (NP * ntk + 15) / 16; /* m16 tiles holding a row */
        /* the A rows of this lane: 16 im + g and 16 im + 8 + g, NULL if no row */
        const unsigned char *xr[MT][2];
#pragma unroll
        for (int im = 0; im < MT; im++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int m = 16 * im + 8 * hh + g, tau = m / NP, p = m - NP * tau;
                xr[im][hh] = NULL;
                if (tau < ntk) {
                    const int64_t row = r0 + t0 + tau;
                    const int64_t s = G == 1 ? (int64_t)(a.sorted[row] / a.topk) : row;
                    xr[im][hh] = (const unsigned char *)(src + (s * 3 + p) * Kp) + 64 * q;
                }
            }
        float acc[MT][MR_WN][4];
#pragma unroll
        for (int im = 0; im < MT; im++)
#pragma unroll
            for (int nt = 0; nt < MR_WN; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[im][nt][c] = 0.0f;

        uint4 wr[MR_PD][MR_WN];
        uint32_t sr[MR_PD][MR_WN];
#pragma unroll
        for (int i = 0; i < MR_PD; i++)
            if (cs + i < ce) wload(cs + i, wr[i], sr[i]);
        for (int64_t c = cs; c < ce; c += MR_PD) {
#pragma unroll
            for (int i = 0; i < MR_PD; i++) {
                const int64_t cc = c + i;
                if (cc >= ce) break; /* warp-uniform */
                uint4 wv[MR_WN];
                uint32_t s2[MR_WN];
#pragma unroll
                for (int nt = 0; nt < MR_WN; nt++) {
                    wv[nt] = wr[i][nt];
                    s2[nt] = ue8m0_bf16x2(sr[i][nt]);
                }
                if (cc + MR_PD < ce) wload(cc + MR_PD, wr[i], sr[i]);
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    uint32_t b[MR_WN][4];
#pragma unroll
                    for (int nt = 0; nt < MR_WN; nt++) rd_bfrag<true>(wv[nt], h, s2[nt], b[nt]);
#pragma unroll
                    for (int im = 0; im < MT; im++) {
                        if (im >= mtv) break; /* warp-uniform */
                        const int64_t o = 256 * cc + 16 * h;
                        const uint4 va = xr[im][0] ? __ldg((const uint4 *)(xr[im][0] + o)) : make_uint4(0u, 0u, 0u, 0u);
                        const uint4 vb = xr[im][1] ? __ldg((const uint4 *)(xr[im][1] + o)) : make_uint4(0u, 0u, 0u, 0u);
                        const uint32_t ae[4] = {va.x, vb.x, va.y, vb.y}, ao[4] = {va.z, vb.z, va.w, vb.w};
#pragma unroll
                        for (int nt = 0; nt < MR_WN; nt++) {
                            rd_mma(acc[im][nt], ae, b[nt][0], b[nt][1]);
                            rd_mma(acc[im][nt], ao, b[nt][2], b[nt][3]);
                        }
                    }
                }
            }
        }

        /* each warp's partial sums to shared memory; a (row, weight column)'s planes and K ranges then meet */
        float(*R)[8 * MR_WN + 1] = red[warp];
#pragma unroll
        for (int im = 0; im < MT; im++) {
            if (im >= mtv) break;
#pragma unroll
            for (int nt = 0; nt < MR_WN; nt++) {
                R[16 * im + g][8 * nt + 2 * q] = acc[im][nt][0];
                R[16 * im + g][8 * nt + 2 * q + 1] = acc[im][nt][1];
                R[16 * im + 8 + g][8 * nt + 2 * q] = acc[im][nt][2];
                R[16 * im + 8 + g][8 * nt + 2 * q + 1] = acc[im][nt][3];
            }
        }
        if (KS == 1) __syncwarp();
        else __syncthreads();
        /* row NP tau + p, column j: the K ranges in warp order, then hi + (mid + lo) */
        auto sum = [&](int tau, int j) {
            float v[NP];
#pragma unroll
            for (int p = 0; p < NP; p++) {
                float s = red[KS == 1 ? warp : 0][NP * tau + p][j];
#pragma unroll
                for (int w = 1; w < KS; w++) s = s + red[w][NP * tau + p][j];
                v[p] = s;
            }
            float r = v[0];
            if (NP == 3) r = v[0] + (v[1 % NP] + v[2 % NP]);
            return r;
        };
        const int ti0 = KS == 1 ? lane : (int)threadIdx.x, tstep = KS == 1 ? 32 : 32 * MR_WARPS;
        if (G == 1) {
            const int64_t Ip = (a.I + MR_CH - 1) / MR_CH * MR_CH; /* h rows: I rounded up to a chunk */
            for (int it = ti0; it < 8 * ntk; it += tstep) {
                const int tau = it >> 3, j = it & 7;
                const int64_t row = r0 + t0 + tau, f = f0 + j;
                if (f >= N) continue;
                float hv = swiglu1(sum(tau, j), sum(tau, 8 + j), a.limit);
                if (a.official) hv = __fmul_rn(hv, a.w[a.sorted[row]]);
                if (a.act_fp8_h) { /* quantised by whole blocks of 128 features, then split (bcu_moe_forward) */
                    a.h[row * a.I + f] = hv;
                    continue;
                }
                uint32_t s[3];
                rd_split3(hv, s);
                const int64_t pc = mr_perm(f);
#pragma unroll
                for (int p = 0; p < 3; p++) a.hq[(row * 3 + p) * Ip + pc] = (uint16_t)s[p];
            }
        } else {
            for (int it = ti0; it < 8 * MR_WN * ntk; it += tstep) {
                const int tau = it / (8 * MR_WN), j = it - tau * 8 * MR_WN;
                const int64_t f = f0 + j;
                if (f < N) a.yp[(r0 + t0 + tau) * a.D + f] = sum(tau, j);
            }
        }
        if (KS == 1) __syncwarp(); /* red is rewritten by the next pass */
        else __syncthreads();
    }
}

/* ---------------------------------------------------------------- combine */

/* y[t, d..d+3] = sum over the token's rows in comb order, starting from 0 as
 * v4.c's memset does; transformers semantics multiply each by its weight */
__global__ void combine_kernel(float *y, const float *yp, const int32_t *comb, const float *combw, int64_t T,
                               int topk, int64_t D, int use_w)
{
    pdl_enter();
    const int64_t d = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (d >= D) return;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int j = 0; j < topk; j++) {
            const int32_t r = __ldg(comb + t * topk + j);
            if (r < 0) break;
            float4 v = __ldg((const float4 *)(yp + (int64_t)r * D + d));
            if (use_w) {
                const float f = __ldg(combw + t * topk + j);
                v.x = __fmul_rn(v.x, f);
                v.y = __fmul_rn(v.y, f);
                v.z = __fmul_rn(v.z, f);
                v.w = __fmul_rn(v.w, f);
            }
            s.x = __fadd_rn(s.x, v.x);
            s.y = __fadd_rn(s.y, v.y);
            s.z = __fadd_rn(s.z, v.z);
            s.w = __fadd_rn(s.w, v.w);
        }
        *(float4 *)(y + t * D + d) = s;
    }
}

} /* namespace */

/* ---------------------------------------------------------------- host side */

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* stage g of the mma rows: 1 (gate / up -> h) or 2 (W2 h) */
template <int MT, int KS, int NP>
static void mr_launch_v(const MoeArgs &a, unsigned ny, int g, cudaStream_t st)
{
    const int64_t r1 = 8 * (MR_WARPS / KS), r2 = 8 * MR_WN * (MR_WARPS / KS); /* weight rows per block */
    if (g == 1) pdl_launch(mr_kernel<1, MT, KS, NP>, dim3((unsigned)((a.I + r1 - 1) / r1), ny), 32 * MR_WARPS, 0, st, a);
    else pdl_launch(mr_kernel<2, MT, KS, NP>, dim3((unsigned)((a.D + r2 - 1) / r2), ny), 32 * MR_WARPS, 0, st, a);
}

template <int NP>
static cudaError_t mr_launch_np(int mt, int ks, const MoeArgs &a, unsigned ny, int g, cudaStream_t st)
{
    if (ks == 1 && mt == 1) mr_launch_v<1, 1, NP>(a, ny, g, st);
    else if (ks == 1 && mt == 2) mr_launch_v<2, 1, NP>(a, ny, g, st);
    else if (ks == 1 && mt == 4) mr_launch_v<4, 1, NP>(a, ny, g, st);
    else if (ks == MR_WARPS && mt == 1) mr_launch_v<1, MR_WARPS, NP>(a, ny, g, st);
    else if (ks == MR_WARPS && mt == 4) mr_launch_v<4, MR_WARPS, NP>(a, ny, g, st);
    else return cudaErrorInvalidValue;
    return cudaSuccess;
}

static cudaError_t mr_launch(int np, int mt, int ks, const MoeArgs &a, unsigned ny, int g, cudaStream_t st)
{
    return np == 1 ? mr_launch_np<1>(mt, ks, a, ny, g, st) : mr_launch_np<3>(mt, ks, a, ny, g, st);
}

extern "C" int bcu_moe_plan_layout(void *base, int64_t T, int topk, int n_experts, int64_t dim, int64_t inter,
                                   bcu_moe_plan *p)
{
    memset(p, 0, sizeof *p);
    if (T < 0 || topk < 1 || topk > BCU_MOE_MAX_TOPK || n_experts < 1 || n_experts > BCU_MOE_MAX_EXPERTS ||
        dim < BCU_MOE_BLOCK || inter < BCU_MOE_BLOCK || dim % BCU_MOE_BLOCK || inter % BCU_MOE_BLOCK)
        return -1;
    if (T > ((int64_t)1 << 30) / topk) return -1; /* rows are int32 */
    const int64_t P = T * topk;
    const int64_t n_slots = P < n_experts ? P : n_experts;
    const int64_t max_tiles = (P + TL_M - 1) / TL_M + n_slots; /* each active expert adds at most one partial tile */
    if (max_tiles > 65535) return -1;                        /* gridDim.y */
    const uintptr_t b = (uintptr_t)base;
    size_t o = 0;
#define TAKE(field, type, count)                                                                                       \
    do {                                                                                                               \
        p->field = (type *)(b + o);                                                                                    \
        o = align256(o + (size_t)(count) * sizeof(type));                                                              \
    } while (0)
    TAKE(hdr, int32_t, 16);
    TAKE(cnt, int32_t, n_experts);
    TAKE(off, int32_t, n_experts + 1);
    TAKE(act, int32_t, n_slots);
    TAKE(tile_e, int32_t, max_tiles);
    TAKE(tile_r0, int32_t, max_tiles);
    TAKE(sorted, int32_t, P);
    TAKE(pos, int32_t, P);
    TAKE(comb, int32_t, P);
    TAKE(combw, float, P);
    p->route_bytes = o;
    TAKE(h, float, P * inter);
    TAKE(yp, float, P * dim);
    TAKE(xq, uint16_t, T * 3 * ((dim + MR_CH - 1) / MR_CH * MR_CH));
    TAKE(hq, uint16_t, P * 3 * ((inter + MR_CH - 1) / MR_CH * MR_CH));
#undef TAKE
    p->bytes = o;
    p->P = P;
    p->n_slots = n_slots;
    p->max_tiles = max_tiles;
    return 0;
}

extern "C" size_t bcu_moe_workspace_bytes(int64_t T, int topk, int n_experts, int64_t dim, int64_t inter)
{
    bcu_moe_plan p;
    return bcu_moe_plan_layout(NULL, T, topk, n_experts, dim, inter, &p) ? 0 : p.bytes;
}

/* route_kernel's algorithm, step for step, on the host */
extern "C" void bcu_moe_route_host(const int32_t *ids, const float *w, int64_t T, int topk, int n_experts,
                                   const bcu_moe_plan *p)
{
    const int E = n_experts;
    const int64_t P = T * topk, C = (P + RT_WARPS - 1) / RT_WARPS;
    int *hist = (int *)calloc((size_t)RT_WARPS * (size_t)E, sizeof(int));
    if (!hist) abort();
    int bad = 0;
    for (int wp = 0; wp < RT_WARPS; wp++) {
        const int64_t c0 = (int64_t)wp * C < P ? (int64_t)wp * C : P, c1 = c0 + C < P ? c0 + C : P;
        for (int64_t i = c0; i < c1; i++) {
            if (ids[i] < 0 || ids[i] >= E) bad++;
            else hist[wp * E + ids[i]]++;
        }
    }
    int run = 0, n_act = 0, n_tiles = 0;
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int wp = 0; wp < RT_WARPS; wp++) {
            const int v = hist[wp * E + e];
            hist[wp * E + e] = cnt + run;
            cnt += v;
        }
        p->cnt[e] = cnt;
        p->off[e] = run;
        if (cnt > 0) {
            p->act[n_act++] = e;
            const int span = (int)bcu_moe_tile_span(cnt);
            for (int j = 0; j < (cnt + TL_M - 1) / TL_M; j++) {
                p->tile_e[n_tiles] = e;
                p->tile_r0[n_tiles++] = run + j * span;
            }
        }
        run += cnt;
    }
    p->off[E] = run;
    for (int64_t s = n_act; s < p->n_slots; s++) p->act[s] = -1;
    for (int64_t s = n_tiles; s < p->max_tiles; s++) {
        p->tile_e[s] = -1;
        p->tile_r0[s] = 0;
    }
    p->hdr[0] = n_act;
    p->hdr[1] = n_tiles;
    p->hdr[2] = bad;
    for (int wp = 0; wp < RT_WARPS; wp++) {
        const int64_t c0 = (int64_t)wp * C < P ? (int64_t)wp * C : P, c1 = c0 + C < P ? c0 + C : P;
        for (int64_t i = c0; i < c1; i++) {
            if (ids[i] < 0 || ids[i] >= E) {
                p->pos[i] = -1;
                continue;
            }
            const int r = hist[wp * E + ids[i]]++;
            p->sorted[r] = (int32_t)i;
            p->pos[i] = r;
        }
    }
    for (int64_t t = 0; t < T; t++) comb_token(p->pos, w, topk, t, p->comb, p->combw);
    free(hist);
}

extern "C" const char *bcu_moe_math_name(bcu_moe_math m)
{
    switch (m) {
    case BCU_MOE_FP32: return "fp32";
    case BCU_MOE_BF16X3: return "bf16x3";
    case BCU_MOE_BF16: return "bf16";
    }
    return "?";
}

extern "C" const char *bcu_moe_path_name(bcu_moe_path p)
{
    switch (p) {
    case BCU_MOE_AUTO: return "auto";
    case BCU_MOE_ROWS: return "rows";
    case BCU_MOE_TILED: return "tiled";
    case BCU_MOE_MMAROWS: return "mma-rows";
    case BCU_MOE_WGMMA: return "wgmma";
    case BCU_MOE_WGTILES: return "wg-tiles";
    case BCU_MOE_WGGEMV: return "wg-gemv";
    }
    return "?";
}

/* Rows while the average expert has few tokens: the rows kernel decodes a
 * weight once per 4 tokens, the tiled kernels once per 128 (and the FFMA tile
 * pays for its empty rows in 8-row steps). */
/* bcu_moe_set_tiling's variant, MT << 4 | KS; 0: by the batch */
static std::atomic<int> mr_forced(0);

extern "C" int bcu_moe_set_tiling(int mt, int ks)
{
    if (!mt && !ks) {
        mr_forced.store(0, std::memory_order_relaxed);
        return 0;
    }
    if (!(mt == 1 || mt == 2 || mt == 4) || !(ks == 1 || ks == MR_WARPS) || (ks == MR_WARPS && mt == 2)) return -1;
    mr_forced.store(mt << 4 | ks, std::memory_order_relaxed);
    return 0;
}

extern "C" bcu_moe_path bcu_moe_auto_path(int64_t T, int topk, int n_experts, bcu_moe_math math, int mmarows_max)
{
    if (mmarows_max <= 0) mmarows_max = BCU_MOE_MMAROWS_MAX;
    if (math == BCU_MOE_FP32) return T * topk <= 8 * n_experts ? BCU_MOE_ROWS : BCU_MOE_TILED;
    /* tensor cores: the mma rows decode a weight once per 5-21 rows, the tiles once per 128 */
    return T * topk <= (int64_t)mmarows_max * n_experts ? BCU_MOE_MMAROWS : BCU_MOE_TILED;
}

/* the routing plan p of ids / w on the device: route_small_kernel up to RS_MAX_P pairs, route_kernel below
 * RM_MIN_P pairs, else the four rm_ kernels, whose scratch is p's h (stage 1 writes it afterwards) */
static void route_launch(const bcu_moe_plan &p, const int32_t *ids, const float *w, int64_t T, int topk, int E,
                         cudaStream_t st)
{
    RouteArgs r;
    r.ids = ids;
    r.w = w;
    r.T = T;
    r.P = p.P;
    r.n_slots = p.n_slots;
    r.max_tiles = p.max_tiles;
    r.topk = topk;
    r.E = E;
    r.hdr = p.hdr;
    r.cnt = p.cnt;
    r.off = p.off;
    r.act = p.act;
    r.tile_e = p.tile_e;
    r.tile_r0 = p.tile_r0;
    r.sorted = p.sorted;
    r.pos = p.pos;
    r.comb = p.comb;
    r.combw = p.combw;
    if (p.P <= RS_MAX_P) {
        pdl_launch(route_small_kernel, 1, RT_THREADS, 0, st, r);
        return;
    }
    if (p.P < RM_MIN_P) {
        pdl_launch(route_kernel, 1, RT_THREADS, (size_t)RT_WARPS * (size_t)E * sizeof(int), st, r);
        return;
    }
    const int64_t nb = (p.P + RM_PAIRS - 1) / RM_PAIRS;
    int32_t *bh = (int32_t *)p.h; /* (nb + 1) E ints at most: P / 512 (E + 1) <= P inter floats */
    pdl_launch(rm_count_kernel, (unsigned)nb, 32, (size_t)E * sizeof(int), st, r, bh);
    pdl_launch(rm_scan_kernel, 1, RT_THREADS, 0, st, r, bh, (int)nb);
    pdl_launch(rm_scatter_kernel, (unsigned)nb, 32, (size_t)E * sizeof(int), st, r, bh);
    pdl_launch(rm_comb_kernel, (unsigned)((T + 255) / 256), 256, 0, st, r);
}

extern "C" cudaError_t bcu_moe_route(const int32_t *ids, const float *w, int64_t T, int topk, int n_experts,
                                     int64_t dim, int64_t inter, void *ws, size_t ws_bytes, cudaStream_t st)
{
    bcu_moe_plan p;
    if (bcu_moe_plan_layout(ws, T, topk, n_experts, dim, inter, &p)) return cudaErrorInvalidValue;
    if (T == 0) return cudaSuccess;
    if (!ids || !w || !ws || ws_bytes < p.bytes || (uintptr_t)ws % 256) return cudaErrorInvalidValue;
    route_launch(p, ids, w, T, topk, n_experts, st);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_moe_forward(const bcu_moe_experts *ex, float *y, const float *x, const int32_t *ids,
                                       const float *w, int64_t T, int topk, bcu_moe_math math, bcu_moe_path path,
                                       void *ws, size_t ws_bytes, cudaStream_t st)
{
    if (!ex) return cudaErrorInvalidValue;
    bcu_moe_plan p;
    if (bcu_moe_plan_layout(ws, T, topk, ex->n_experts, ex->dim, ex->inter, &p)) return cudaErrorInvalidValue;
    if (T == 0) return cudaSuccess;
    if (!y || !x || !ids || !w || !ws || ws_bytes < p.bytes || !ex->w1 || !ex->s1 || !ex->w3 || !ex->s3 || !ex->w2 ||
        !ex->s2 || (uintptr_t)ws % 256 || (uintptr_t)x % 16 || (uintptr_t)y % 16)
        return cudaErrorInvalidValue;
    if (math != BCU_MOE_FP32 && math != BCU_MOE_BF16X3 && math != BCU_MOE_BF16) return cudaErrorInvalidValue;
    if (path == BCU_MOE_AUTO) path = bcu_moe_auto_path(T, topk, ex->n_experts, math, 0);
    if (path != BCU_MOE_ROWS && path != BCU_MOE_TILED && path != BCU_MOE_MMAROWS && path != BCU_MOE_WGMMA &&
        path != BCU_MOE_WGTILES && path != BCU_MOE_WGGEMV)
        return cudaErrorInvalidValue;
    if (path == BCU_MOE_MMAROWS && math == BCU_MOE_FP32) return cudaErrorInvalidValue; /* bf16 planes only */
    if (path == BCU_MOE_WGTILES && ex->dim % 256) return cudaErrorInvalidValue; /* 256 weight rows a block */
    const int wg = path == BCU_MOE_WGMMA || path == BCU_MOE_WGTILES || path == BCU_MOE_WGGEMV;
    if (wg &&
        (!ex->act_fp8_h || math == BCU_MOE_FP32 || ex->dim % 128 || ex->inter % 128 || !bcu_wg_available()))
        return cudaErrorInvalidValue;

    route_launch(p, ids, w, T, topk, ex->n_experts, st);

    MoeArgs a;
    a.w1 = ex->w1;
    a.s1 = ex->s1;
    a.w3 = ex->w3;
    a.s3 = ex->s3;
    a.w2 = ex->w2;
    a.s2 = ex->s2;
    a.D = ex->dim;
    a.I = ex->inter;
    a.topk = topk;
    a.official = ex->weight_before_w2 != 0;
    a.act_fp8_h = ex->act_fp8_h != 0;
    a.limit = ex->swiglu_limit;
    a.x = x;
    a.w = w;
    a.off = p.off;
    a.act = p.act;
    a.tile_e = p.tile_e;
    a.tile_r0 = p.tile_r0;
    a.sorted = p.sorted;
    a.h = p.h;
    a.yp = p.yp;

    a.xq = p.xq;
    a.hq = p.hq;

    if (wg) {
        /* x and h as act_quant codes in the plane buffers (6 bytes per element there, at most 2 + 1/32 needed) */
        bcu_wg_args g;
        g.w1 = a.w1;
        g.s1 = a.s1;
        g.w3 = a.w3;
        g.s3 = a.s3;
        g.w2 = a.w2;
        g.s2 = a.s2;
        g.D = a.D;
        g.I = a.I;
        g.topk = topk;
        g.official = a.official;
        g.limit = a.limit;
        g.w = w;
        g.off = p.off;
        g.act = p.act;
        g.sorted = p.sorted;
        g.tile_e = p.tile_e;
        g.tile_r0 = p.tile_r0;
        g.xc = (const uint8_t *)p.xq;
        g.xs = (const float *)((const uint8_t *)p.xq + 2 * T * a.D);
        g.hc = (const uint8_t *)p.hq;
        g.hs = (const float *)((const uint8_t *)p.hq + 2 * p.P * a.I);
        g.h = p.h;
        g.yp = p.yp;
        const unsigned ny = (unsigned)p.n_slots;
        /* bf16x3: exact products on f16; bf16 (fast): e4m3; the GEMV: f16 under either maths */
        g.f16 = math != BCU_MOE_BF16 || path == BCU_MOE_WGGEMV;
        /* the tiles: bf16 values (exact products whichever maths), one block row per tile */
        const int tiles = path == BCU_MOE_WGTILES, mode = tiles ? 2 : g.f16;
        const unsigned nt = (unsigned)p.max_tiles;
        cudaError_t e = bcu_wg_code(x, T, a.D, mode, (uint8_t *)g.xc, tiles ? NULL : (float *)g.xs, NULL, st);
        /* stage g on the tiles, the GEMV or the wgmma decode kernel */
        auto stage = [&](int sg) {
            return tiles ? bcu_wg_tiles(&g, sg, nt, st) : path == BCU_MOE_WGGEMV ? bcu_wg_gemv(&g, sg, ny, st)
                                                                                  : bcu_wg_stage(&g, sg, ny, st);
        };
        if (e == cudaSuccess) e = stage(1);
        /* h coded for stage 2 (and, for the decode kernel, quantised in place as bcu_fq_fp8 leaves it; the tiles'
         * bf16 values are the quantised h themselves, so they skip that write of P x I floats) */
        if (e == cudaSuccess)
            e = bcu_wg_code(p.h, p.P, a.I, mode, (uint8_t *)g.hc, tiles ? NULL : (float *)g.hs, tiles ? NULL : p.h, st);
        if (e == cudaSuccess) e = stage(2);
        if (e != cudaSuccess) return e;
    } else if (path == BCU_MOE_MMAROWS) {
        const int64_t Dp = (a.D + MR_CH - 1) / MR_CH * MR_CH, Ip = (a.I + MR_CH - 1) / MR_CH * MR_CH;
        if (Ip != a.I) { /* the columns of h past I are read (times zero weights): they must be finite */
            cudaError_t e = cudaMemsetAsync(p.hq, 0, (size_t)(p.P * 3 * Ip) * sizeof(uint16_t), st);
            if (e != cudaSuccess) return e;
        }
        const int64_t ng = T * (Dp / 8);
        pdl_launch(mr_split_kernel, (unsigned)(ng < 4096 * 256 ? (ng + 255) / 256 : 4096), 256, 0, st, p.xq, x, T, a.D, Dp);
        const unsigned ny = (unsigned)p.n_slots;
        /* planes: three for bf16x3, the hi plane alone for the bf16 maths (exact for act_quant'd x and h, which
         * the backend sends here as bf16).  MT by the average rows per expert (H200, bench_gpu_moe, three planes:
         * 1 tile up to 2 rows, else 2 tiles: 2 beat 4 even at 24 rows per expert, by occupancy; one plane: a tile
         * holds 16 rows), unless bcu_moe_set_tiling forced a variant */
        const int np = math == BCU_MOE_BF16 ? 1 : 3;
        const int64_t avg = (p.P + ex->n_experts - 1) / ex->n_experts;
        const int forced = mr_forced.load(std::memory_order_relaxed);
        const int mt = forced ? forced >> 4 : avg <= (np == 1 ? 16 : 2) ? 1 : 2, ks = forced ? forced & 15 : 1;
        cudaError_t e = mr_launch(np, mt, ks, a, ny, 1, st);
        if (e == cudaSuccess && a.act_fp8_h) { /* h in fp32 from stage 1: quantise, then the planes stage 2 reads */
            e = bcu_fq_fp8(p.h, (size_t)p.P, (size_t)a.I, (size_t)a.I, 128, st);
            const int64_t nh = p.P * (Ip / 8);
            if (e == cudaSuccess)
                pdl_launch(mr_split_kernel, (unsigned)(nh < 4096 * 256 ? (nh + 255) / 256 : 4096), 256, 0, st, p.hq, p.h, p.P,
                                                                                                    a.I, Ip);
        }
        if (e == cudaSuccess) e = mr_launch(np, mt, ks, a, ny, 2, st);
        if (e != cudaSuccess) return e;
    } else if (path == BCU_MOE_ROWS) {
        const unsigned ny = (unsigned)p.n_slots;
        pdl_launch(rows_kernel<1>, dim3((unsigned)((a.I + 2 * RW_WARPS - 1) / (2 * RW_WARPS)), ny), 32 * RW_WARPS, 0, st, a);
        if (ex->act_fp8_h) {
            cudaError_t e = bcu_fq_fp8(p.h, (size_t)p.P, (size_t)a.I, (size_t)a.I, 128, st);
            if (e != cudaSuccess) return e;
        }
        pdl_launch(rows_kernel<2>, dim3((unsigned)((a.D + 4 * RW_WARPS - 1) / (4 * RW_WARPS)), ny), 32 * RW_WARPS, 0, st, a);
    } else {
        const unsigned ny = (unsigned)p.max_tiles;
        const dim3 g1((unsigned)((a.I + TL_W / 2 - 1) / (TL_W / 2)), ny), g2((unsigned)((a.D + TL_W - 1) / TL_W), ny);
        switch (math) { /* stage 1: h */
        case BCU_MOE_FP32: pdl_launch(simt_kernel<1>, g1, 256, 0, st, a); break;
        case BCU_MOE_BF16X3: pdl_launch(mma_kernel<1, 3>, g1, 256, 0, st, a); break;
        case BCU_MOE_BF16: pdl_launch(mma_kernel<1, 1>, g1, 256, 0, st, a); break;
        }
        if (ex->act_fp8_h) {
            cudaError_t e = bcu_fq_fp8(p.h, (size_t)p.P, (size_t)a.I, (size_t)a.I, 128, st);
            if (e != cudaSuccess) return e;
        }
        switch (math) { /* stage 2: W2 h */
        case BCU_MOE_FP32: pdl_launch(simt_kernel<2>, g2, 256, 0, st, a); break;
        case BCU_MOE_BF16X3: pdl_launch(mma_kernel<2, 3>, g2, 256, 0, st, a); break;
        case BCU_MOE_BF16: pdl_launch(mma_kernel<2, 1>, g2, 256, 0, st, a); break;
        }
    }
    const unsigned gy = (unsigned)(T < 65535 ? T : 65535);
    pdl_launch(combine_kernel, dim3((unsigned)((a.D / 4 + 255) / 256), gy), 256, 0, st, y, p.yp, p.comb, p.combw, T, topk, a.D,
                                                                                 !a.official);
    return cudaGetLastError();
}
