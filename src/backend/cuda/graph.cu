/* graph.cu - the V4 graph's small non-GEMM ops on the device (graph.h has the
 * contract): each kernel is the host loop of src/model/v4.c it is named after,
 * over device fp32 rows, so the all-on-device forward never copies an
 * activation back to the host between GEMMs.
 *
 * Fidelity to the CPU, op by op:
 *  - Elementwise math uses explicitly rounded operations (__fmul_rn,
 *    __fadd_rn, __fdiv_rn, ...) in v4.c's order, so nvcc cannot fuse a
 *    multiply and an add into an FMA the CPU does not do.  What is pure IEEE
 *    arithmetic is therefore bit-identical to the CPU: embed, gather, scale,
 *    add, hc_post, the Hadamard butterflies (same stages, same pairs), the
 *    fake-quant round trips (the amax is a max, so its order does not matter;
 *    the encoders and decoders are dtype.c's bit manipulation, not cuda_fp8).
 *  - Transcendentals are CUDA's accurate expf / log1pf / cosf / sinf (a few
 *    ulp from glibc's): sigmoid, softplus, RoPE and SwiGLU agree to ~1e-7.
 *  - Long sums cannot keep the CPU's order in parallel; they keep a fixed
 *    one instead, which depends on the sizes alone, with no float atomics,
 *    so a call is deterministic.  Most: per-thread strided partials, then a
 *    shared-memory tree.  mHC's dot products (fp32 FMA) and mean square (in
 *    double, as on the CPU): a lane's chain over its elements of one of
 *    HC_S chunks of the row, a warp butterfly, then a butterfly over the
 *    chunks' partials, which the workspace holds between two kernels.
 *  - A row's result never depends on the other rows of the batch: every row
 *    is handled by one block (hadamard, route), by a fixed set of blocks
 *    (mHC: a row's chunks or column blocks; a block of the dot products
 *    holds HC_RB rows, each summed exactly as it would be alone) or by a
 *    fixed set of threads.
 * The small serial parts run operation for operation as in v4.c: the
 * routing weights on one thread; mHC's sigmoid / softmax / Sinkhorn (at most
 * 16 x 16 numbers) on one thread per element, each element getting exactly
 * the operations of the serial loops in their order (a row's or column's
 * sum is taken, in the serial order, by each thread that needs it), with a
 * barrier between phases: from the same sums, the bits the serial loops give.
 *
 * Sizes are checked first (cudaErrorInvalidValue for what a kernel cannot
 * take), then an empty batch returns cudaSuccess without a launch.  The
 * functions never allocate or synchronise; they return cudaGetLastError().
 *
 * Not here: the GEMMs, RMSNorm (kernels.cu), attention (attn.cu), the grouped
 * experts (moe.cu). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/graph.h"
#include "backend/cuda/sm_count.cuh"
#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rmsnorm.cuh"

#define GR_NT 256          /* threads per block, every kernel */
#define GR_GRID_CAP 8192u  /* blocks of a grid-stride kernel */
#define HC_MAX_N 16        /* mHC streams (hc_mult) at most */
#define HC_SMALL_N 4       /* streams of the lean instances of the column kernels (V4's hc_mult) */
#define HC_S 32            /* chunk partials per row of each mHC dot product / sum of squares (one a lane) */
#define HC_RB 4            /* rows a block of the mHC dot products takes (its weights are read once for them) */
#define HC_EPL 16          /* elements per lane in one pass over a chunk */
#define HC_PASS (32 * HC_EPL) /* elements of a pass, a multiple of GR_NT */
#define HC_VPT 2           /* columns per thread of the collapse and of hc_post */
#define HC_CPB (GR_NT * HC_VPT) /* columns per block */
#define HC_YMAX 65535      /* gridDim.y limit: the column blocks of a row loop beyond it */
#define RT_MAX_E 512
#define RT_MAX_K 16
#define HD_MAX_N 1024
#define AQ_BLOCK 128 /* v4.c's act_quant block (MD_ACT_BLOCK), where bcu_hc_pre_norm quantises a copy */

static_assert(256 % AQ_BLOCK == 0 && AQ_BLOCK % 32 == 0, "an act_quant block is whole warps of a norm block");
static_assert(HC_PASS % GR_NT == 0 && HC_RB <= 32 && HC_MAX_N * HC_MAX_N <= GR_NT,
              "mHC: a pass is whole blocks, a lane stores a row, C[i][k] is a thread each");

namespace {

/* ---------------------------------------------------------------- codecs (src/model/dtype.c, bit for bit) */

__device__ __forceinline__ float gr_dec_bf16(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ float gr_dec_f16(uint32_t h)
{
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t o = (h & 0x7fffu) << 13; /* exponent and mantissa in f32 place */
    const uint32_t exp = o & 0x0f800000u;
    o += (127u - 15u) << 23;
    if (exp == 0x0f800000u) o += (128u - 16u) << 23; /* inf / NaN: exponent 255 */
    /* zero / subnormal: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exactly */
    if (exp == 0) o = __float_as_uint(__fsub_rn(__uint_as_float(o + (1u << 23)), __uint_as_float(113u << 23)));
    return __uint_as_float(o | sign);
}

__device__ __forceinline__ float gr_dec_fp4(uint32_t c)
{
    const uint32_t sign = (c & 8u) << 28;
    const uint32_t em = c & 7u;
    const uint32_t v = em < 2 ? __float_as_uint(__fmul_rn((float)em, 0.5f)) : (em << 22) + (126u << 23);
    return __uint_as_float(v | sign);
}

/* md_f32_to_fp4: nearest even, saturating to +-6 (inf too), NaN -> 0 */
__device__ __forceinline__ uint32_t gr_enc_fp4(float f)
{
    uint32_t u = __float_as_uint(f);
    const uint32_t sign = (u >> 28) & 8u;
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return 0;
    if (u >= 0x40c00000u) return sign | 7u;
    if (u < 0x3f800000u) { /* < 1: the ulp of 2^22 is the subnormal step 0.5 */
        const float t = __fadd_rn(__uint_as_float(u), 4194304.0f);
        return sign | ((__float_as_uint(t) - 0x4a800000u) & 0xffu);
    }
    u += 0x1fffffu + ((u >> 22) & 1u);
    return sign | (((u - (126u << 23)) >> 22) & 0xffu);
}

/* ---------------------------------------------------------------- small math (v4.c) */

__device__ __forceinline__ float gr_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float gr_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }


unsigned gr_grid(size_t n)
{
    const size_t b = (n + GR_NT - 1) / GR_NT;
    return b < GR_GRID_CAP ? (unsigned)(b ? b : 1) : GR_GRID_CAP;
}

#define GR_TID ((size_t)blockIdx.x * blockDim.x + threadIdx.x)
#define GR_STEP ((size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------- embedding */

__global__ void __launch_bounds__(GR_NT)
    gr_embed_kernel(float *X, const void *table, int emb, const int32_t *ids, size_t R, size_t D, int ns)
{
    pdl_enter();
    for (size_t q = GR_TID; q < R * D; q += GR_STEP) {
        const size_t t = q / D, d = q % D, src = (size_t)ids[t] * D + d;
        float v;
        if (emb == BCU_EMB_F32) v = ((const float *)table)[src];
        else if (emb == BCU_EMB_BF16) v = gr_dec_bf16(((const uint16_t *)table)[src]);
        else v = gr_dec_f16(((const uint16_t *)table)[src]);
        float *x = X + t * (size_t)ns * D + d;
        for (int s = 0; s < ns; s++) x[(size_t)s * D] = v;
    }
}

/* ---------------------------------------------------------------- mHC */

/* Two kernels a call.  gr_hc_mix_kernel: the chunk partials of every row's dot products and sum of squares, into
 * the workspace, over row blocks x HC_S chunks x groups of 8 values, so one decode row keeps ~100 blocks busy
 * (gr_hc_ss_kernel instead when a GEMM gave the dot products).  gr_hc_pre_kernel: per row, column blocks of HC_CPB
 * columns that sum pre's partials and collapse, and (hc_pre) one block for post and comb.  hc_post: column blocks
 * of HC_CPB columns.  The column kernels come in a lean instance for n <= HC_SMALL_N (registers for 4 streams, not
 * 16). */

struct HcArgs {
    int n, D, iters, head, gemm; /* gemm: the dot products are already in the workspace, [R, mix] */
    float hc_eps, rms_eps;
    const float *fn, *base, *scale;
};

/* Chunk length of a row of N = n D floats: HC_S chunks, each a whole number of warp strides. */
__host__ __device__ __forceinline__ size_t hc_chunk(size_t N) { return ((N + HC_S - 1) / HC_S + 31) & ~(size_t)31; }

/* Stage 1: the HC_S chunk partials of each row's dot products fn[j] . x (fp32 FMA) and of its sum of squares
 * (double; the products are exact, so an FMA adds what the CPU adds).  Block (row block, chunk c, value group z):
 * warp w takes value j = 8 z + w: the dot product with fn[j] while j < mix, the sum of squares at j == mix; over
 * chunk c of HC_RB rows, a lane sums its elements c0 + lane, c0 + lane + 32, ... in order (one pass of HC_EPL at a
 * time; past the chunk's end it adds zeros, fmaf(0, 0, s), which at most turns a -0 into +0 and is as fixed as the
 * rest), then a butterfly over the warp.  The block stages the x chunk in shared memory once for its warps and reads
 * each weight once for its HC_RB rows.  Every order depends on N alone, never on R or on the block a row falls in. */
__global__ void __launch_bounds__(GR_NT)
    gr_hc_mix_kernel(HcArgs a, const float *X, size_t R, float *pmix, double *pss)
{
    __shared__ float xs[HC_RB * HC_PASS];
    const int tid = threadIdx.x, lane = tid & 31;
    const int mix = a.head ? a.n : (2 + a.n) * a.n;
    const int j = (int)blockIdx.z * (GR_NT / 32) + (tid >> 5);
    const bool dot = j < mix, sq = j == mix;
    const size_t N = (size_t)a.n * a.D, L = hc_chunk(N), c = blockIdx.y;
    const size_t c0 = c * L < N ? c * L : N, c1 = N - c0 < L ? N : c0 + L;
    const size_t t0 = (size_t)blockIdx.x * HC_RB;
    const int nr = R - t0 < HC_RB ? (int)(R - t0) : HC_RB;
    const float *f = a.fn + (dot ? (size_t)j * N : 0);
    float acc[HC_RB];
    double ss[HC_RB];
#pragma unroll
    for (int r = 0; r < HC_RB; r++) {
        acc[r] = 0.0f;
        ss[r] = 0.0;
    }
    /* the first pass's weights before the wait (no kernel writes them): launched early (pdl_launch), their round
     * trip overlaps the kernel before (at V4's sizes a chunk is one pass) */
    float fv[HC_EPL];
    auto load_fv = [&](size_t p) {
#pragma unroll
        for (int q = 0; q < HC_EPL; q++) {
            const size_t i = p + (size_t)(q * 32 + lane);
            fv[q] = dot && i < c1 ? f[i] : 0.0f;
        }
    };
    load_fv(c0);
    pdl_enter();
    for (size_t p = c0; p < c1; p += HC_PASS) {
        float xr[HC_RB * HC_PASS / GR_NT];
        if (p != c0) load_fv(p);
        /* the x chunk: every load issued before the first store waits for one */
#pragma unroll
        for (int u = 0; u < HC_RB * HC_PASS / GR_NT; u++) {
            const int r = u * GR_NT / HC_PASS; /* GR_NT divides HC_PASS: u's elements are in one row */
            const size_t i = p + (size_t)(u * GR_NT % HC_PASS + tid);
            xr[u] = r < nr && i < c1 ? X[(t0 + (size_t)r) * N + i] : 0.0f;
        }
        __syncthreads(); /* the last pass is done with xs */
#pragma unroll
        for (int u = 0; u < HC_RB * HC_PASS / GR_NT; u++) xs[u * GR_NT + tid] = xr[u];
        __syncthreads();
        /* no branch inside, so the rows' chains interleave (rows past R sum zeros and are not stored) */
        if (dot) {
#pragma unroll
            for (int q = 0; q < HC_EPL; q++)
#pragma unroll
                for (int r = 0; r < HC_RB; r++) acc[r] = fmaf(fv[q], xs[r * HC_PASS + q * 32 + lane], acc[r]);
        } else if (sq) {
#pragma unroll
            for (int q = 0; q < HC_EPL; q++)
#pragma unroll
                for (int r = 0; r < HC_RB; r++) {
                    const double xv = xs[r * HC_PASS + q * 32 + lane];
                    ss[r] = __fma_rn(xv, xv, ss[r]);
                }
        }
    }
    if (dot) {
#pragma unroll
        for (int o = 16; o; o >>= 1)
#pragma unroll
            for (int r = 0; r < HC_RB; r++) acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], o));
        float s = acc[0]; /* every lane holds every row's sum: lane r stores row r's */
#pragma unroll
        for (int r = 1; r < HC_RB; r++) s = lane == r ? acc[r] : s;
        if (lane < nr) pmix[((t0 + (size_t)lane) * mix + j) * HC_S + c] = s;
    } else if (sq) {
#pragma unroll
        for (int o = 16; o; o >>= 1)
#pragma unroll
            for (int r = 0; r < HC_RB; r++) ss[r] = __dadd_rn(ss[r], __shfl_xor_sync(0xffffffffu, ss[r], o));
        double s = ss[0];
#pragma unroll
        for (int r = 1; r < HC_RB; r++) s = lane == r ? ss[r] : s;
        if (lane < nr) pss[(t0 + (size_t)lane) * HC_S + c] = s;
    }
}

/* The sums of squares alone (the GEMM gave the dot products): a warp per row chunk w = t HC_S + c (grid-stride);
 * a lane sums the same elements in the same order as gr_hc_mix_kernel, so the partials are the same bits. */
__global__ void __launch_bounds__(GR_NT) gr_hc_ss_kernel(HcArgs a, const float *X, size_t R, double *pss)
{
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const size_t N = (size_t)a.n * a.D, L = hc_chunk(N);
    for (size_t w = GR_TID / 32; w < R * HC_S; w += GR_STEP / 32) {
        const size_t t = w / HC_S, c = w % HC_S;
        const size_t c0 = c * L < N ? c * L : N, c1 = N - c0 < L ? N : c0 + L;
        const float *x = X + t * N;
        double ss = 0.0;
        for (size_t p = c0; p < c1; p += HC_PASS) {
            float xv[HC_EPL];
#pragma unroll
            for (int q = 0; q < HC_EPL; q++) {
                const size_t i = p + (size_t)(q * 32 + lane);
                xv[q] = i < c1 ? x[i] : 0.0f;
            }
#pragma unroll
            for (int q = 0; q < HC_EPL; q++) ss = __fma_rn((double)xv[q], (double)xv[q], ss);
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o));
        if (lane == 0) pss[w] = ss;
    }
}

/* Row t's dot products j0 .. j0 + nv - 1 (nv * HC_S <= K * NT, NT the block's threads) into val[0 .. nv) and its sum of squares into
 * *ssq.  All threads copy the partials into shared memory first (sp, sd: every load issued before the first store,
 * one round trip), then a warp per value sums its HC_S partials by a butterfly, whose additions are commutative
 * pairs, so every lane ends with the same bits (the GEMM's dot products are taken as they are).  Ends with a
 * barrier. */
template <int K, int NT = GR_NT>
__device__ __forceinline__ void hc_sums(const HcArgs &a, const float *pmix, const double *pss, size_t t, int mix,
                                        int j0, int nv, float *sp, double *sd, float *val, double *ssq)
{
    const int tid = threadIdx.x, lane = tid & 31, w = a.gemm ? 1 : HC_S;
    const float *src = pmix + (t * mix + j0) * w;
    float v[K];
#pragma unroll
    for (int u = 0; u < K; u++) v[u] = u * NT + tid < nv * w ? src[u * NT + tid] : 0.0f;
    const double d = tid < HC_S ? pss[t * HC_S + tid] : 0.0;
#pragma unroll
    for (int u = 0; u < K; u++)
        if (u * NT + tid < nv * w) sp[u * NT + tid] = v[u];
    if (tid < HC_S) sd[tid] = d;
    __syncthreads();
    for (int u = tid >> 5; u <= nv; u += NT / 32) {
        if (u < nv) {
            float s = sp[u * w + (a.gemm ? 0 : lane)];
            if (!a.gemm)
#pragma unroll
                for (int o = 16; o; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
            if (lane == 0) val[u] = s;
        } else {
            double s = sd[lane];
#pragma unroll
            for (int o = 16; o; o >>= 1) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
            if (lane == 0) *ssq = s;
        }
    }
    __syncthreads();
}

/* v4.c: rs = 1 / sqrt(mean square + rms_eps) */
__device__ __forceinline__ float hc_rs(const HcArgs &a, double ss)
{
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(ss / (double)((size_t)a.n * a.D)), a.rms_eps)));
}

/* v4.c: pre[i] = sigmoid(mixes[i] * rs * scale[0] + base[i]) + hc_eps, from the dot product m and the sum of squares */
__device__ __forceinline__ float hc_pre_w(const HcArgs &a, float m, double ss, float s0, float bp)
{
    return __fadd_rn(gr_sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(m, hc_rs(a, ss)), s0), bp)), a.hc_eps);
}

/* 0 + v[0] + v[s] + ... + v[(n - 1) s], in that order (v4.c's float s = 0; s += ...), the loads issued first */
template <int NS> __device__ __forceinline__ float hc_sum(const float *v, int s, int n)
{
    float x[NS];
#pragma unroll
    for (int m = 0; m < NS; m++) x[m] = m < n ? v[m * s] : 0.0f;
    float sum = 0;
#pragma unroll
    for (int m = 0; m < NS; m++)
        if (m < n) sum = __fadd_rn(sum, x[m]);
    return sum;
}

/* the barrier between two phases of the small math: its threads are one warp when n*n <= 32 */
__device__ __forceinline__ void hc_sync(bool one)
{
    if (one) __syncwarp();
    else __syncthreads();
}

/* hc_pre_task's small math for row t: post and comb.  Thread q = i n + k owns C[i][k] (q < n: also post[q]) and
 * does exactly the operations the serial loops do on that element, in their order: a row's max and sum in k order
 * and a column's sum in i order, each taken by every thread of that row or column (same operations, same bits);
 * the n*n elements of a phase are independent, and a barrier separates the phases (softmax, then Sinkhorn:
 * columns; then rows and columns, iters - 1 times).  The matrix alternates between two shared buffers, so one
 * barrier a phase also keeps the next phase's writes from a slow reader. */
template <int NS, int NT = GR_NT>
__device__ void hc_small(const HcArgs &a, size_t t, const float *pmix, const double *pss, float *post, float *comb)
{
    __shared__ float sp[(1 + NS) * NS * HC_S];
    __shared__ double sd[HC_S];
    __shared__ float mixes[(1 + NS) * NS]; /* the dot products j = n .. mix - 1, at j - n */
    __shared__ float cm[2 * NS * NS];
    __shared__ double ssq;
    const int tid = threadIdx.x, n = a.n, nn = n * n, mix = (2 + n) * n;
    const int q = tid, i = q / n, k = q - i * n;
    const bool on = q < nn;
    /* the parameters, loaded with the partials */
    const float s1 = a.scale[1], s2 = a.scale[2];
    const float bp = q < n ? a.base[n + q] : 0.0f, bc = on ? a.base[2 * n + q] : 0.0f;
    /* the dot products post and comb use (j >= n) and the sum of squares */
    hc_sums<((1 + NS) * NS * HC_S + NT - 1) / NT, NT>(a, pmix, pss, t, mix, n, mix - n, sp, sd, mixes, &ssq);
    const bool one = nn <= 32;
    if (one && tid >= 32) return;
    const float rs = hc_rs(a, ssq), eps = a.hc_eps;
    if (q < n) post[t * n + q] = __fmul_rn(2.0f, gr_sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(mixes[q], rs), s1), bp)));
    /* C[i][k]: from stream i (row) to stream k (column); softmax along rows (+ eps) */
    float *cur = cm, *nxt = cm + NS * NS, c = 0.0f;
    if (on) {
        c = __fadd_rn(__fmul_rn(__fmul_rn(mixes[n + q], rs), s2), bc);
        cur[q] = c;
    }
    hc_sync(one);
    if (on) {
        float mx = -INFINITY;
#pragma unroll
        for (int m = 0; m < NS; m++)
            if (m < n) mx = fmaxf(mx, cur[i * n + m]);
        c = expf(__fsub_rn(c, mx));
        nxt[q] = c;
    }
    hc_sync(one);
    if (on) {
        c = __fadd_rn(__fdiv_rn(c, hc_sum<NS>(nxt + i * n, 1, n)), eps);
        cur[q] = c;
    }
    hc_sync(one);
    /* Sinkhorn: round 0 columns only, later rounds rows then columns; each divides by (sum + eps).  A phase reads
     * cur, writes nxt, and they swap. */
    for (int it = 0; it < a.iters; it++) {
        if (it > 0) {
            if (on) {
                c = __fdiv_rn(c, __fadd_rn(hc_sum<NS>(cur + i * n, 1, n), eps));
                nxt[q] = c;
            }
            hc_sync(one);
            float *const tmp = cur;
            cur = nxt;
            nxt = tmp;
        }
        if (on) {
            c = __fdiv_rn(c, __fadd_rn(hc_sum<NS>(cur + k, n, n), eps));
            nxt[q] = c;
        }
        hc_sync(one);
        float *const tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    if (on) comb[t * nn + q] = c;
}

/* column block cb's columns of row x (n <= NS streams of D): HC_VPT per thread, all loads issued together */
template <int NS>
__device__ __forceinline__ void hc_load_cols(float (&xv)[HC_VPT][NS], const float *x, int n, int D, int cb, int tid)
{
#pragma unroll
    for (int v = 0; v < HC_VPT; v++) {
        const size_t d = (size_t)cb * HC_CPB + (size_t)(v * GR_NT + tid);
#pragma unroll
        for (int i = 0; i < NS; i++) xv[v][i] = i < n && d < (size_t)D ? x[(size_t)i * D + d] : 0.0f;
    }
}

/* Stage 2, block (t, cb) of a kernel for n <= NS streams: for cb < ncb, the collapse coll[t, d] = sum_i pre[i]
 * x[t, i, d] over column blocks cb, cb + ncb, ...; each such block first sums the row's n pre dot products and its
 * sum of squares (hc_sums) and computes pre as v4.c does: the same operations on the same partials, so every block
 * of the row gets the same bits.  Its x columns are loaded first, so they arrive with the partials.  hc_pre only:
 * block (t, ncb) does the rest of the small math, post and comb, once for the row (hc_small).  No block waits for
 * another. */
template <int NS>
__global__ void __launch_bounds__(GR_NT)
    gr_hc_pre_kernel(HcArgs a, const float *X, const float *pmix, const double *pss, float *coll, float *post,
                     float *comb, int ncb)
{
    pdl_enter();
    __shared__ float sp[NS * HC_S];
    __shared__ double sd[HC_S];
    __shared__ float pmx[NS];
    __shared__ float pre[NS];
    __shared__ double ssq;
    const size_t t = blockIdx.x;
    if (!a.head && (int)blockIdx.y == ncb) {
        hc_small<NS>(a, t, pmix, pss, post, comb);
        return;
    }
    const int tid = threadIdx.x, n = a.n, D = a.D;
    const int mix = a.head ? n : (2 + n) * n, nb = (D - 1) / HC_CPB + 1;
    const float *x = X + t * (size_t)n * D;
    float *y = coll + t * (size_t)D;
    int cb = blockIdx.y;
    float xv[HC_VPT][NS];
    hc_load_cols(xv, x, n, D, cb, tid);
    const float s0 = a.scale[0], bp = tid < n ? a.base[tid] : 0.0f;
    hc_sums<(NS * HC_S + GR_NT - 1) / GR_NT>(a, pmix, pss, t, mix, 0, n, sp, sd, pmx, &ssq);
    if (tid < n) pre[tid] = hc_pre_w(a, pmx[tid], ssq, s0, bp);
    __syncthreads();
    for (;;) {
#pragma unroll
        for (int v = 0; v < HC_VPT; v++) {
            const size_t d = (size_t)cb * HC_CPB + (size_t)(v * GR_NT + tid);
            if (d < (size_t)D) {
                float acc = 0;
#pragma unroll
                for (int i = 0; i < NS; i++)
                    if (i < n) acc = __fadd_rn(acc, __fmul_rn(pre[i], xv[v][i]));
                y[d] = acc;
            }
        }
        cb += ncb;
        if (cb >= nb) break;
        hc_load_cols(xv, x, n, D, cb, tid);
    }
}

/* Stage 2 with the RMSNorm of coll after it (bcu_hc_pre_norm), for rows of D <= RMS_KEEP NT, NT = RMS_NT(D): block
 * (t, 0) sums pre's partials and computes pre as gr_hc_pre_kernel's blocks do, collapses the row's columns d = tid
 * + k NT (k < RMS_KEEP) with the same operations, keeps them in registers and normalises them as rmsnorm_kernel
 * does (rms_row_inv, the same order); hc_pre: block (t, 1) computes post and comb (hc_small).  So every output has
 * the bits of gr_hc_pre_kernel then rmsnorm_kernel, in one launch instead of two, and without the round trip of
 * coll through memory between them. */
template <int NS, int NT>
__global__ void __launch_bounds__(NT)
    gr_hc_pre_norm_kernel(HcArgs a, const float *X, const float *pmix, const double *pss, float *coll, float *post,
                          float *comb, const float *w, float eps, float *xq)
{
    pdl_trigger(); /* the decode row-dot that reads coll may start its weight loads (it waits for coll) */
    const int tid = threadIdx.x, n = a.n, D = a.D;
    /* block (t, 0)'s weights (the norm's, hc's scale and base), asked for before the wait: no kernel writes them */
    float wk[RMS_KEEP];
    float s0 = 0.0f, bp = 0.0f;
    if (a.head || blockIdx.y == 0) {
#pragma unroll
        for (int k = 0; k < RMS_KEEP; k++) wk[k] = tid + k * NT < D && w ? w[tid + k * NT] : 1.0f;
        s0 = a.scale[0];
        bp = tid < n ? a.base[tid] : 0.0f;
    }
    pdl_wait();
    __shared__ float sp[NS * HC_S];
    __shared__ double sd[HC_S];
    __shared__ float pmx[NS];
    __shared__ float pre[NS];
    __shared__ double ssq;
    __shared__ double part[NT / 32];
    __shared__ float wmax[RMS_KEEP][NT / 32];
    const size_t t = blockIdx.x;
    if (!a.head && blockIdx.y == 1) {
        hc_small<NS, NT>(a, t, pmix, pss, post, comb);
        return;
    }
    const int mix = a.head ? n : (2 + n) * n;
    const float *x = X + t * (size_t)n * D;
    float xv[RMS_KEEP][NS];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int d = tid + k * NT;
#pragma unroll
        for (int i = 0; i < NS; i++) xv[k][i] = i < n && d < D ? x[(size_t)i * D + d] : 0.0f;
    }
    hc_sums<(NS * HC_S + NT - 1) / NT, NT>(a, pmix, pss, t, mix, 0, n, sp, sd, pmx, &ssq);
    if (tid < n) pre[tid] = hc_pre_w(a, pmx[tid], ssq, s0, bp);
    __syncthreads();
    float keep[RMS_KEEP];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        float acc = 0;
#pragma unroll
        for (int i = 0; i < NS; i++)
            if (i < n) acc = __fadd_rn(acc, __fmul_rn(pre[i], xv[k][i]));
        keep[k] = tid + k * NT < D ? acc : 0.0f;
    }
    const float inv = rms_row_inv<NT>(keep, nullptr, (size_t)D, eps, part);
    float *y = coll + t * (size_t)D;
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int d = tid + k * NT;
        keep[k] = d < D ? wk[k] * (keep[k] * inv) : 0.0f;
        if (d < D) y[d] = keep[k];
    }
    if (!xq) return;
    /* xq: v4.c's act_quant of the row (gr_fq_kernel<0>'s blocks of AQ_BLOCK columns, its amax, scale and codes):
     * a block is 4 whole warps at one k (NT is a multiple of AQ_BLOCK), its amax the largest of theirs */
    const int lane = tid & 31, wp = tid >> 5;
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        float m = fmaxf(1e-4f, fabsf(keep[k]));
#pragma unroll
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) wmax[k][wp] = m;
    }
    __syncthreads();
    float *q = xq + t * (size_t)D;
    const int w0 = wp & ~(AQ_BLOCK / 32 - 1);
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int d = tid + k * NT;
        if (d >= D) continue;
        float amax = wmax[k][w0];
#pragma unroll
        for (int i = 1; i < AQ_BLOCK / 32; i++) amax = fmaxf(amax, wmax[k][w0 + i]);
        const float sc = gr_pow2_ceil(__fmul_rn(amax, 1.0f / 448.0f));
        q[d] = __fmul_rn(gr_dec_e4m3(gr_enc_e4m3(__fmul_rn(keep[k], aq_inv(sc)))), sc);
    }
}

/* Block (t, cb): column blocks cb, cb + gridDim.y, ... of row t; a thread owns HC_VPT columns d of all n streams
 * (reads all, then writes all: in place is safe).  The x and f loads go out before post and comb arrive. */
template <int NS>
__global__ void __launch_bounds__(GR_NT)
    gr_hc_post_kernel(float *X, const float *f, const float *f2, const float *post, const float *comb, int n, int D)
{
    pdl_enter();
    __shared__ float ps[NS];
    __shared__ float cs[NS * NS];
    const int tid = threadIdx.x, nb = (D - 1) / HC_CPB + 1;
    const size_t t = blockIdx.x;
    float *x = X + t * (size_t)n * D;
    const float *fr = f + t * (size_t)D;
    int cb = blockIdx.y;
    float xv[HC_VPT][NS], fv[HC_VPT];
    for (;;) {
        hc_load_cols(xv, x, n, D, cb, tid);
#pragma unroll
        for (int v = 0; v < HC_VPT; v++) {
            const size_t d = (size_t)cb * HC_CPB + (size_t)(v * GR_NT + tid);
            fv[v] = d >= (size_t)D ? 0.0f : f2 ? __fadd_rn(fr[d], f2[t * (size_t)D + d]) : fr[d];
        }
        if (cb == (int)blockIdx.y) {
            for (int q = tid; q < n * n; q += GR_NT) cs[q] = comb[t * n * n + q];
            if (tid < n) ps[tid] = post[t * n + tid];
            __syncthreads();
        }
#pragma unroll
        for (int v = 0; v < HC_VPT; v++) {
            const size_t d = (size_t)cb * HC_CPB + (size_t)(v * GR_NT + tid);
            if (d < (size_t)D)
#pragma unroll
                for (int k = 0; k < NS; k++) {
                    if (k < n) {
                        float acc = __fmul_rn(ps[k], fv[v]);
#pragma unroll
                        for (int i = 0; i < NS; i++)
                            if (i < n) acc = __fadd_rn(acc, __fmul_rn(cs[i * n + k], xv[v][i]));
                        x[(size_t)k * D + d] = acc;
                    }
                }
        }
        cb += gridDim.y;
        if (cb >= nb) break;
    }
}

/* ---------------------------------------------------------------- RoPE, fake quant, Hadamard */

__global__ void __launch_bounds__(GR_NT) gr_rope_kernel(float *x, size_t rows, size_t stride, size_t off, int half,
                                                        const float *inv, const int64_t *pos, int per, int inverse)
{
    pdl_trigger(); /* wkv follows the RoPE of q */
    pdl_wait();
    for (size_t q = GR_TID; q < rows * half; q += GR_STEP) {
        const size_t r = q / half;
        const int i = (int)(q % half);
        const float ang = __fmul_rn((float)pos[r / per], inv[i]);
        const float c = cosf(ang);
        float s = sinf(ang);
        if (inverse) s = -s;
        float *p = x + r * stride + off + 2 * (size_t)i;
        const float x0 = p[0], x1 = p[1];
        p[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        p[1] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

/* RMSNorm of each row (rms_row_inv, the bits of rmsnorm_kernel) and then RoPE on its last rd channels at pos[r /
 * per] (the bits of gr_rope_kernel on what the norm wrote): one block of NT = RMS_NT(dim) threads a row, dim <=
 * RMS_KEEP NT.  A pair's two channels are at the same k of lanes lane and lane ^ 1 (its first channel is even), so
 * the partner's normed value is a shuffle away. */
template <int NT>
__global__ void __launch_bounds__(NT) gr_norm_rope_kernel(float *x, int dim, const float *w, float eps, int rd,
                                                          const float *inv, const int64_t *pos, int per)
{
    pdl_trigger(); /* the decode row-dot after it may start its weight loads */
    const int tid = threadIdx.x, off = dim - rd;
    float wk[RMS_KEEP], fk[RMS_KEEP]; /* the norm's weights and RoPE's frequencies, before the wait (constants) */
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int i = tid + k * NT;
        wk[k] = i < dim && w ? w[i] : 1.0f;
        fk[k] = i >= off && i < dim ? inv[(i - off) >> 1] : 0.0f;
    }
    pdl_wait();
    __shared__ double part[NT / 32];
    const size_t r = blockIdx.x;
    float *xr = x + r * (size_t)dim;
    float keep[RMS_KEEP];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int i = tid + k * NT;
        keep[k] = i < dim ? xr[i] : 0.0f;
    }
    const float rinv = rms_row_inv<NT>(keep, nullptr, (size_t)dim, eps, part);
    const float pf = (float)pos[r / per];
#pragma unroll
    for (int k = 0; k < RMS_KEEP; k++) {
        const int i = tid + k * NT;
        const float y = i < dim ? wk[k] * (keep[k] * rinv) : 0.0f;
        const float o = __shfl_xor_sync(0xffffffffu, y, 1); /* the pair's other channel */
        if (i >= dim) continue;
        float v = y;
        if (i >= off) {
            const float ang = __fmul_rn(pf, fk[k]);
            const float c = cosf(ang), sn = sinf(ang);
            v = (i - off) & 1 ? __fadd_rn(__fmul_rn(y, c), __fmul_rn(o, sn)) : __fsub_rn(__fmul_rn(y, c), __fmul_rn(o, sn));
        }
        xr[i] = v;
    }
}

/* gr_norm_rope_kernel<256> for many rows of dim <= 1024: a warp a row, 8 rows a block.  Lane l plays the lanes l of
 * the 256-thread block's 8 warps: it holds element 32 v + l + 256 k for v < 8 and k < KK (KK = ceil(dim / 256)),
 * sums each v's squares in k order, runs that warp's butterfly and takes lane 0's total, then adds the 8 totals in
 * v order: the block kernel's sums, bit for bit (its k >= KK terms are + 0).  RoPE pairs are lanes l, l ^ 1 of the
 * same v, as there. */
#define NR_ROWS_MIN 512 /* rows from which bcu_norm_rope takes it (below, the block kernel's shorter chain) */

/* DEEPINFER_CUDA_ROW_KERNELS (default 1; 0: the block-a-row kernels): the warp-a-row forms of norm_rope, Hadamard and
 * fake quantisation below, which give the same bits; read once */
static int gr_row_kernels(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("DEEPINFER_CUDA_ROW_KERNELS");
        on = !(e && *e == '0');
    }
    return on;
}
template <int KK>
__global__ void __launch_bounds__(256) gr_norm_rope_rows_kernel(float *x, size_t rows, int dim, const float *w,
                                                                float eps, int rd, const float *inv,
                                                                const int64_t *pos, int per)
{
    pdl_trigger();
    const int lane = threadIdx.x & 31, off = dim - rd;
    float wk[8][KK], fk[8][KK];
#pragma unroll
    for (int v = 0; v < 8; v++)
#pragma unroll
        for (int k = 0; k < KK; k++) {
            const int i = 32 * v + lane + 256 * k;
            wk[v][k] = i < dim && w ? w[i] : 1.0f;
            fk[v][k] = i >= off && i < dim ? inv[(i - off) >> 1] : 0.0f;
        }
    pdl_wait();
    const size_t r = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return; /* warp-uniform; nothing below syncs the block */
    float *xr = x + r * (size_t)dim;
    float keep[8][KK];
    double tot = 0;
#pragma unroll
    for (int v = 0; v < 8; v++) {
        double ss = 0;
#pragma unroll
        for (int k = 0; k < KK; k++) {
            const int i = 32 * v + lane + 256 * k;
            keep[v][k] = i < dim ? xr[i] : 0.0f;
            ss += (double)keep[v][k] * keep[v][k];
        }
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        tot += __shfl_sync(0xffffffffu, ss, 0);
    }
    const float rinv = 1.0f / sqrtf((float)(tot / (double)dim) + eps);
    const float pf = (float)pos[r / per];
#pragma unroll
    for (int v = 0; v < 8; v++)
#pragma unroll
        for (int k = 0; k < KK; k++) {
            const int i = 32 * v + lane + 256 * k;
            const float y = i < dim ? wk[v][k] * (keep[v][k] * rinv) : 0.0f;
            const float o = __shfl_xor_sync(0xffffffffu, y, 1);
            if (i >= dim) continue;
            float val = y;
            if (i >= off) {
                const float ang = __fmul_rn(pf, fk[v][k]);
                const float c = cosf(ang), sn = sinf(ang);
                val = (i - off) & 1 ? __fadd_rn(__fmul_rn(y, c), __fmul_rn(o, sn))
                                    : __fsub_rn(__fmul_rn(y, c), __fmul_rn(o, sn));
            }
            xr[i] = val;
        }
}

/* gr_fq_kernel for rows of whole 128-column chunks (n % 128 == 0, stride % 4 == 0, x 16-byte aligned) and blocks of
 * 128 (FP8) or 32 (FP4): a warp a chunk, a float4 a lane; a block's amax over its 32 or 8 lanes.  Element for element
 * gr_fq_kernel's arithmetic (the amax is a max, in any order). */
template <int FP4>
__global__ void __launch_bounds__(GR_NT) gr_fq_vec_kernel(float *x, size_t rows, size_t stride, size_t nch)
{
    pdl_trigger();
    pdl_wait();
    const size_t g = GR_TID / 32;
    const int lane = threadIdx.x & 31;
    if (g >= rows * nch) return;
    float *p = x + (g / nch) * stride + (g % nch) * 128 + 4 * lane;
    float4 v = *(float4 *)p;
    float amax = fmaxf(fmaxf(FP4 ? __uint_as_float(0x01c00000u) : 1e-4f, fmaxf(fabsf(v.x), fabsf(v.y))),
                       fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = FP4 ? 4 : 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = gr_pow2_ceil(__fmul_rn(amax, FP4 ? 1.0f / 6.0f : 1.0f / 448.0f));
    const float inv = aq_inv(sc);
    float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const float q = __fmul_rn(e[k], inv);
        e[k] = __fmul_rn(FP4 ? gr_dec_fp4(gr_enc_fp4(q)) : gr_dec_e4m3(gr_enc_e4m3(q)), sc);
    }
    *(float4 *)p = make_float4(e[0], e[1], e[2], e[3]);
}

/* One warp per (row, block) group; the group index is warp-uniform, so the
 * early return keeps whole warps and the shuffles see all 32 lanes. */
template <int FP4>
__global__ void __launch_bounds__(GR_NT)
    gr_fq_kernel(float *x, size_t rows, size_t stride, size_t n, size_t block, size_t nb)
{
    pdl_trigger();
    pdl_wait();
    const size_t g = GR_TID / 32;
    const int lane = threadIdx.x & 31;
    if (g >= rows * nb) return;
    float *xr = x + (g / nb) * stride;
    const size_t b0 = (g % nb) * block, b1 = n - b0 < block ? n : b0 + block;
    float amax = FP4 ? __uint_as_float(0x01c00000u) /* 6 * 2^-126 */ : 1e-4f;
    for (size_t i = b0 + lane; i < b1; i += 32) amax = fmaxf(amax, fabsf(xr[i]));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = gr_pow2_ceil(__fmul_rn(amax, FP4 ? 1.0f / 6.0f : 1.0f / 448.0f)); /* the kernels multiply */
    const float inv = aq_inv(sc); /* xr[i] / sc, exactly */
    for (size_t i = b0 + lane; i < b1; i += 32) {
        const float v = __fmul_rn(xr[i], inv);
        xr[i] = __fmul_rn(FP4 ? gr_dec_fp4(gr_enc_fp4(v)) : gr_dec_e4m3(gr_enc_e4m3(v)), sc);
    }
}

/* bcu_aq_bf16: gr_fq_kernel<0> on a copy of 128-column blocks, written as bf16 (exact: an e4m3 value times a power
 * of two) instead of in place: a warp a block, four columns a lane (one float4 in, 8 bytes out), the warps striding
 * over the blocks two at a time (both loads out before either is coded) on a grid that fills the GPU */
__device__ __forceinline__ uint2 aq_bf16_quad(float4 v)
{
    float amax = fmaxf(fmaxf(1e-4f, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = gr_pow2_ceil(__fmul_rn(amax, 1.0f / 448.0f));
    const float inv = aq_inv(sc);
    const float in[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const float a = __fmul_rn(gr_dec_e4m3(gr_enc_e4m3(__fmul_rn(in[2 * k], inv))), sc);
        const float b = __fmul_rn(gr_dec_e4m3(gr_enc_e4m3(__fmul_rn(in[2 * k + 1], inv))), sc);
        o[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
               (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16;
    }
    return make_uint2(o[0], o[1]);
}

__global__ void __launch_bounds__(GR_NT)
    gr_aq_bf16_kernel(uint16_t *dst, const float *x, size_t rows, size_t stride, size_t n, size_t nb)
{
    pdl_trigger();
    pdl_wait();
    const size_t nw = (size_t)gridDim.x * (GR_NT / 32), total = rows * nb;
    const int lane = threadIdx.x & 31;
    for (size_t g = GR_TID / 32; g < total; g += 2 * nw) { /* warp-uniform */
        const size_t g2 = g + nw;
        const size_t r = g / nb, c = (g % nb) * 128 + 4 * (size_t)lane;
        const size_t r2 = g2 / nb, c2 = (g2 % nb) * 128 + 4 * (size_t)lane;
        const float4 v = *(const float4 *)(x + r * stride + c);
        const float4 v2 = g2 < total ? *(const float4 *)(x + r2 * stride + c2) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(uint2 *)(dst + r * n + c) = aq_bf16_quad(v);
        if (g2 < total) *(uint2 *)(dst + r2 * n + c2) = aq_bf16_quad(v2);
    }
}

/* One block per row, in shared memory; stage h pairs (j, j + h) exactly as
 * hadamard() (the pairs of a stage are independent, the stages ordered). */
__global__ void __launch_bounds__(GR_NT) gr_hadamard_kernel(float *x, int n)
{
    pdl_enter();
    __shared__ float v[HD_MAX_N];
    const int tid = threadIdx.x;
    float *xr = x + (size_t)blockIdx.x * n;
    for (int i = tid; i < n; i += GR_NT) v[i] = xr[i];
    __syncthreads();
    for (int h = 1; h < n; h *= 2) {
        for (int p = tid; p < n / 2; p += GR_NT) {
            const int j = (p / h) * 2 * h + p % h;
            const float a = v[j], b = v[j + h];
            v[j] = __fadd_rn(a, b);
            v[j + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
    const float s = __fdiv_rn(1.0f, __fsqrt_rn((float)n));
    for (int i = tid; i < n; i += GR_NT) xr[i] = __fmul_rn(v[i], s);
}

/* gr_hadamard_kernel for rows of n = 32 E: a warp a row, 8 rows a block, element l + 32 m in lane l's v[m].  Stage h
 * pairs (j, j + h) as there, a the lower element: h < 32 across lanes l, l ^ h (a shuffle), h >= 32 inside a lane
 * (m, m ^ h / 32).  The same additions, so the same bits. */
template <int E>
__global__ void __launch_bounds__(GR_NT) gr_hadamard_rows_kernel(float *x, size_t rows)
{
    pdl_enter();
    const size_t r = (size_t)blockIdx.x * (GR_NT / 32) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    float *xr = x + r * (size_t)(32 * E);
    float v[E];
#pragma unroll
    for (int m = 0; m < E; m++) v[m] = xr[lane + 32 * m];
#pragma unroll
    for (int h = 1; h < 32 && h < 32 * E; h *= 2) {
        const int upper = lane & h;
#pragma unroll
        for (int m = 0; m < E; m++) {
            const float p = __shfl_xor_sync(0xffffffffu, v[m], h);
            v[m] = upper ? __fsub_rn(p, v[m]) : __fadd_rn(v[m], p);
        }
    }
#pragma unroll
    for (int hm = 1; hm < E; hm *= 2) {
        float t[E];
#pragma unroll
        for (int m = 0; m < E; m++) t[m] = m & hm ? __fsub_rn(v[m ^ hm], v[m]) : __fadd_rn(v[m], v[m ^ hm]);
#pragma unroll
        for (int m = 0; m < E; m++) v[m] = t[m];
    }
    const float s = __fdiv_rn(1.0f, __fsqrt_rn((float)(32 * E)));
#pragma unroll
    for (int m = 0; m < E; m++) xr[lane + 32 * m] = __fmul_rn(v[m], s);
}

/* ---------------------------------------------------------------- elementwise */

__global__ void __launch_bounds__(GR_NT)
    gr_swiglu_kernel(float *g, const float *up, size_t rows, size_t I, float limit, const float *rw)
{
    pdl_trigger(); /* the shared expert's w2 follows */
    pdl_wait();
    for (size_t q = GR_TID; q < rows * I; q += GR_STEP) {
        float gv = g[q], u = up[q];
        if (limit > 0) {
            gv = fminf(gv, limit);
            u = fmaxf(-limit, fminf(u, limit));
        }
        float y = __fmul_rn(__fdiv_rn(gv, __fadd_rn(1.0f, expf(-gv))), u);
        if (rw) y = __fmul_rn(y, rw[q / I]);
        g[q] = y;
    }
}

__global__ void __launch_bounds__(GR_NT) gr_scale_kernel(float *x, size_t n, float s)
{
    pdl_enter();
    for (size_t q = GR_TID; q < n; q += GR_STEP) x[q] = __fmul_rn(x[q], s);
}

/* One block per row: base/greedy.h's rc_greedy, the first index of the largest value with NaN as -inf.  Each thread
 * keeps the first maximum of its strided columns (it starts at its own first column, so a row with nothing
 * above -inf gives 0); the block keeps the larger value, the lower index on a tie. */
/* the first index of a row's largest value (NaN never is): 1024 threads a row, 16-byte loads where V % 4 == 0,
 * each thread's candidates in index order, then the warps' (value, index) pairs by value, ties to the lower index.
 * (A block of 256 threads with 4-byte loads took 30 us for one 129,280-entry row on the H200.) */
#define GR_AM_NT 1024
__device__ __forceinline__ void gr_am_take(float &bv, unsigned &bi, float v, unsigned i)
{
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

__global__ void __launch_bounds__(GR_AM_NT) gr_argmax_kernel(int32_t *ids, const float *x, size_t V)
{
    pdl_enter();
    __shared__ float sv[GR_AM_NT / 32];
    __shared__ unsigned si[GR_AM_NT / 32];
    const float *row = x + (size_t)blockIdx.x * V;
    float bv = -INFINITY;
    unsigned bi = 0xffffffffu;
    if (V % 4 == 0) {
        const float4 *r4 = (const float4 *)row;
        for (size_t i = threadIdx.x; i < V / 4; i += GR_AM_NT) {
            const float4 v = __ldg(r4 + i);
            const unsigned b = (unsigned)(4 * i);
            if (v.x > bv) { bv = v.x; bi = b; }
            if (v.y > bv) { bv = v.y; bi = b + 1; }
            if (v.z > bv) { bv = v.z; bi = b + 2; }
            if (v.w > bv) { bv = v.w; bi = b + 3; }
        }
    } else {
        for (size_t i = threadIdx.x; i < V; i += GR_AM_NT) {
            const float v = __ldg(row + i);
            if (v > bv) {
                bv = v;
                bi = (unsigned)i;
            }
        }
    }
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
        gr_am_take(bv, bi, ov, oi);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = sv[lane];
        bi = si[lane];
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
            gr_am_take(bv, bi, ov, oi);
        }
        /* a row of NaN (or of -inf only) gives index 0, as the first element when nothing is larger */
        if (lane == 0) ids[blockIdx.x] = bi == 0xffffffffu ? 0 : (int32_t)bi;
    }
}

__global__ void __launch_bounds__(GR_NT) gr_add_kernel(float *y, const float *x, size_t n)
{
    pdl_enter();
    for (size_t q = GR_TID; q < n; q += GR_STEP) y[q] = __fadd_rn(y[q], x[q]);
}

__global__ void __launch_bounds__(GR_NT)
    gr_gather_kernel(float *dst, const float *src, const int32_t *rows, size_t n, size_t width)
{
    pdl_enter();
    for (size_t q = GR_TID; q < n * width; q += GR_STEP) dst[q] = src[(size_t)rows[q / width] * width + q % width];
}

/* ---------------------------------------------------------------- routing */

struct RouteArgs {
    int E, K, score_func, official;
    float route_scale;
    const float *bias;
    const int32_t *tid2eid, *ids;
};

/* Is candidate (v, e) picked before (bv, be) by v4.c's scan?  The scan keeps
 * the first candidate, then takes a later one only if strictly greater:
 * among non-NaN values that is the lowest index of the maximum.  A NaN is
 * never greater, so it is picked only as the scan's first candidate; the
 * kernel handles that case apart, and here NaN ranks below every number
 * (lowest index among NaNs, so an all-NaN set gives the first).  e < 0: none. */
__device__ __forceinline__ bool gr_better(float v, int e, float bv, int be)
{
    if (e < 0) return false;
    if (be < 0) return true;
    const bool vn = v != v, bn = bv != bv;
    if (vn != bn) return bn;
    if (!vn && v != bv) return v > bv;
    return e < be;
}

/* One warp per row, RT_WARP_ROWS rows a block: scores, then (non-hash) K rounds of v4.c's scan, then the weights.
 * Lane l holds experts l + 32 j in registers; each round takes the lane's best untaken candidate (gr_better), then
 * the warp's by five shuffles (gr_better is a total order, so the shape of the reduction does not change the
 * winner and every lane ends with it), and the scan's first candidate (the lowest untaken expert, which the scan
 * keeps where its value is NaN) by a min over the lanes.  Lane k keeps pick k; the weights' sum runs in k order
 * on every lane.  It replaced a block a row (a block-wide tree a round, ~60 barriers), whose results it matched
 * bit for bit on the H200 over test_route's 45 cases (nineteenth session, docs/CUDA.md). */
#define RT_WARP_ROWS 4
static_assert(RT_MAX_K <= 32 && RT_MAX_E / 32 <= 32, "a pick a lane, a taken bit a register slot");

/* RT_NJ: experts a lane holds (E <= 32 RT_NJ) */
template <int RT_NJ>
__global__ void __launch_bounds__(32 * RT_WARP_ROWS)
    gr_route_warp_kernel(RouteArgs a, const float *logits, int32_t *idx, float *wt, int R)
{
    const int lane = threadIdx.x & 31, E = a.E, K = a.K;
    const int t = (int)blockIdx.x * RT_WARP_ROWS + (int)(threadIdx.x >> 5);
    float bias[RT_NJ];
#pragma unroll
    for (int j = 0; j < RT_NJ; j++) /* a weight: no kernel writes it, so it is asked for before the wait */
        bias[j] = !a.tid2eid && t < R && lane + 32 * j < E ? a.bias[lane + 32 * j] : 0.0f;
    pdl_enter();
    if (t >= R) return;
    const float *lg = logits + (size_t)t * E;
    float sc[RT_NJ], bi[RT_NJ];
    unsigned taken = 0; /* bit j: expert lane + 32 j is taken, or does not exist */
#pragma unroll
    for (int j = 0; j < RT_NJ; j++) {
        const int e = lane + 32 * j;
        sc[j] = bi[j] = 0.0f;
        if (e < E) {
            const float v = lg[e];
            const float s = a.score_func == 1 ? gr_sigmoid(v) : __fsqrt_rn(gr_softplus(v));
            sc[j] = s;
            bi[j] = __fadd_rn(s, bias[j]);
        } else {
            taken |= 1u << j;
        }
    }
    int mine = -1; /* lane k: pick k */
    if (a.tid2eid) {
        if (lane < K) mine = a.tid2eid[(size_t)a.ids[t] * K + lane];
    } else {
        for (int k = 0; k < K; k++) {
            /* the best untaken (bv, be) and the first untaken with its value (fv: biased[first]); the registers
             * are only ever indexed by the unrolled j (a select on a computed j became local memory) */
            float bv = 0.0f, fv = 0.0f;
            int be = -1, first = INT_MAX;
#pragma unroll
            for (int j = 0; j < RT_NJ; j++) {
                const int e = lane + 32 * j;
                if (!(taken >> j & 1u)) {
                    if (first == INT_MAX) {
                        first = e;
                        fv = bi[j];
                    }
                    if (gr_better(bi[j], e, bv, be)) {
                        bv = bi[j];
                        be = e;
                    }
                }
            }
#pragma unroll
            for (int o = 16; o; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o), of_v = __shfl_xor_sync(0xffffffffu, fv, o);
                const int oe = __shfl_xor_sync(0xffffffffu, be, o), of = __shfl_xor_sync(0xffffffffu, first, o);
                if (gr_better(ov, oe, bv, be)) {
                    bv = ov;
                    be = oe;
                }
                if (of < first) {
                    first = of;
                    fv = of_v;
                }
            }
            const int pick = fv != fv ? first : be; /* k < K <= E: some expert is untaken */
            if (lane == k) mine = pick;
            if ((pick & 31) == lane) taken |= 1u << (pick >> 5);
        }
    }
    float sum = 0.0f, w = 0.0f;
    for (int k = 0; k < K; k++) {
        const int e = __shfl_sync(0xffffffffu, mine, k);
        float v = 0.0f; /* score[e], from the lane that holds it */
#pragma unroll
        for (int j = 0; j < RT_NJ; j++) {
            const float o = __shfl_sync(0xffffffffu, sc[j], e & 31);
            if (j == e >> 5) v = o;
        }
        if (e < 0 || e >= E) v = NAN; /* a hash table entry out of range poisons the row */
        if (lane == k) w = v;
        sum = __fadd_rn(sum, v);
    }
    if (!a.official) sum = __fadd_rn(sum, 1e-20f);
    if (lane < K) {
        idx[(size_t)t * K + lane] = mine;
        wt[(size_t)t * K + lane] = __fmul_rn(__fdiv_rn(w, sum), a.route_scale);
    }
}

/* ---------------------------------------------------------------- the PDL probe (bcu_pdl_probe) */

__device__ __forceinline__ unsigned long long gr_now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* one thread: lets the next kernel launch, spins for spin_ns, then writes the flag and the time it did */
__global__ void gr_pdl_slow_kernel(int *flag, unsigned long long *t, unsigned long long spin_ns)
{
    pdl_trigger();
    pdl_wait();
    const unsigned long long t0 = gr_now_ns();
    while (gr_now_ns() - t0 < spin_ns) {
    }
    *(volatile int *)flag = 1;
    __threadfence();
    t[0] = gr_now_ns();
}

/* one thread: the time it started (before its wait), then what it reads of the flag after it */
__global__ void gr_pdl_check_kernel(const int *flag, int *seen, unsigned long long *t)
{
    const unsigned long long t1 = gr_now_ns();
    pdl_wait();
    pdl_trigger();
    t[1] = t1;
    *seen = *(volatile const int *)flag;
}

} /* namespace */

/* ---------------------------------------------------------------- API */

#define GR_INVALID cudaErrorInvalidValue

extern "C" cudaError_t bcu_embed(float *X, const void *table, int emb, const int32_t *ids, size_t R, int D,
                                 int n_streams, cudaStream_t st)
{
    if (emb < BCU_EMB_F32 || emb > BCU_EMB_F16 || D <= 0 || n_streams <= 0) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!X || !table || !ids) return GR_INVALID;
    pdl_launch(gr_embed_kernel, gr_grid(R * (size_t)D), GR_NT, 0, st, X, table, emb, ids, R, (size_t)D, n_streams);
    return cudaGetLastError();
}

/* The workspace: [R, HC_S] double partials of the sums of squares, then [R, mix, HC_S] float partials of the dot
 * products; a GEMM's dot products [R, mix] (mixes_in_ws) take the start of the latter instead. */
extern "C" float *bcu_hc_ws_mixes(void *ws, size_t R) { return (float *)((double *)ws + R * HC_S); }

extern "C" size_t bcu_hc_ws_bytes(size_t R, int n)
{
    const size_t mix = (size_t)(2 + n) * (size_t)n;
    return R * HC_S * sizeof(double) + R * mix * HC_S * sizeof(float) + 16;
}

/* Checks a call's arguments and launches stage 1 (the chunk partials of the dot products, unless given, and of the
 * sums of squares); *a and the workspace's halves for stage 2.  cudaSuccess with nothing launched for R = 0. */
static cudaError_t hc_stage1(const bcu_hc_site *s, int head, const float *X, size_t R, float *coll, float *post,
                             float *comb, void *ws, size_t ws_bytes, cudaStream_t st, HcArgs *a, float **pmix,
                             double **pss)
{
    if (!s || s->n < 1 || s->n > HC_MAX_N || s->D < 1 || s->D > INT_MAX / HC_MAX_N) return GR_INVALID;
    if (R > INT_MAX) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!s->fn || !s->base || !s->scale || !X || !coll || (!head && (!post || !comb))) return GR_INVALID;
    if (!ws || ws_bytes < bcu_hc_ws_bytes(R, s->n) || ((uintptr_t)ws & 7)) return GR_INVALID;
    *a = HcArgs{s->n,      s->D,       s->iters, head,    s->mixes_in_ws != 0,
                s->hc_eps, s->rms_eps, s->fn,    s->base, s->scale};
    const int mix = head ? s->n : (2 + s->n) * s->n;
    *pss = (double *)ws;
    *pmix = bcu_hc_ws_mixes(ws, R);
    if (a->gemm) {
        /* the sums of squares alone: a warp per row chunk */
        pdl_launch(gr_hc_ss_kernel, gr_grid(R * HC_S * 32), GR_NT, 0, st, *a, X, R, *pss);
    } else {
        /* the dot products and the sum of squares: values 0 .. mix, 8 a block */
        const dim3 g1((unsigned)((R + HC_RB - 1) / HC_RB), HC_S, (unsigned)(mix / (GR_NT / 32) + 1));
        pdl_launch(gr_hc_mix_kernel, g1, GR_NT, 0, st, *a, X, R, *pmix, *pss);
    }
    return cudaGetLastError();
}

static cudaError_t hc_launch(const bcu_hc_site *s, int head, const float *X, size_t R, float *coll, float *post,
                             float *comb, void *ws, size_t ws_bytes, cudaStream_t st)
{
    HcArgs a;
    float *pmix = NULL;
    double *pss = NULL;
    cudaError_t e = hc_stage1(s, head, X, R, coll, post, comb, ws, ws_bytes, st, &a, &pmix, &pss);
    if (e != cudaSuccess || !R) return e;
    /* the collapse over column blocks, and (hc_pre) one more block per row for post and comb */
    const int nb = (s->D - 1) / HC_CPB + 1, ncb = nb < HC_YMAX ? nb : HC_YMAX - 1;
    const dim3 g2((unsigned)R, (unsigned)(ncb + !head));
    if (s->n <= HC_SMALL_N) pdl_launch(gr_hc_pre_kernel<HC_SMALL_N>, g2, GR_NT, 0, st, a, X, pmix, pss, coll, post, comb, ncb);
    else pdl_launch(gr_hc_pre_kernel<HC_MAX_N>, g2, GR_NT, 0, st, a, X, pmix, pss, coll, post, comb, ncb);
    return cudaGetLastError();
}

extern "C" int bcu_hc_pre_norm_fits(int n, int D, size_t R)
{
    return n >= 1 && n <= HC_MAX_N && D >= 1 && D <= RMS_KEEP * RMS_NT(D) && R >= 1 && R <= 65535;
}

extern "C" cudaError_t bcu_hc_pre_norm(const bcu_hc_site *s, int head, const float *X, size_t R, float *coll,
                                       float *post, float *comb, const float *w, float eps, float *xq, void *ws,
                                       size_t ws_bytes, cudaStream_t st)
{
    if (s && R && !bcu_hc_pre_norm_fits(s->n, s->D, R)) return cudaErrorNotSupported;
    HcArgs a;
    float *pmix = NULL;
    double *pss = NULL;
    cudaError_t e = hc_stage1(s, head, X, R, coll, post, comb, ws, ws_bytes, st, &a, &pmix, &pss);
    if (e != cudaSuccess || !R) return e;
    const dim3 g((unsigned)R, head ? 1u : 2u);
    const bool small = s->n <= HC_SMALL_N;
    if (RMS_NT(s->D) == 1024) {
        if (small) pdl_launch(gr_hc_pre_norm_kernel<HC_SMALL_N, 1024>, g, 1024, 0, st, a, X, pmix, pss, coll, post, comb, w, eps, xq);
        else pdl_launch(gr_hc_pre_norm_kernel<HC_MAX_N, 1024>, g, 1024, 0, st, a, X, pmix, pss, coll, post, comb, w, eps, xq);
    } else {
        if (small) pdl_launch(gr_hc_pre_norm_kernel<HC_SMALL_N, 256>, g, 256, 0, st, a, X, pmix, pss, coll, post, comb, w, eps, xq);
        else pdl_launch(gr_hc_pre_norm_kernel<HC_MAX_N, 256>, g, 256, 0, st, a, X, pmix, pss, coll, post, comb, w, eps, xq);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_hc_pre(const bcu_hc_site *s, const float *X, size_t R, float *coll, float *post,
                                  float *comb, void *ws, size_t ws_bytes, cudaStream_t st)
{
    return hc_launch(s, 0, X, R, coll, post, comb, ws, ws_bytes, st);
}

extern "C" cudaError_t bcu_hc_head(const bcu_hc_site *s, const float *X, size_t R, float *coll, void *ws,
                                   size_t ws_bytes, cudaStream_t st)
{
    return hc_launch(s, 1, X, R, coll, NULL, NULL, ws, ws_bytes, st);
}

extern "C" cudaError_t bcu_hc_post_add(float *X, const float *f, const float *f2, const float *post,
                                       const float *comb, int n, int D, size_t R, cudaStream_t st)
{
    if (n < 1 || n > HC_MAX_N || D < 1 || R > INT_MAX) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!X || !f || !post || !comb) return GR_INVALID;
    const int nb = (D - 1) / HC_CPB + 1;
    const dim3 g((unsigned)R, (unsigned)(nb < HC_YMAX ? nb : HC_YMAX));
    if (n <= HC_SMALL_N) pdl_launch(gr_hc_post_kernel<HC_SMALL_N>, g, GR_NT, 0, st, X, f, f2, post, comb, n, D);
    else pdl_launch(gr_hc_post_kernel<HC_MAX_N>, g, GR_NT, 0, st, X, f, f2, post, comb, n, D);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_hc_post(float *X, const float *f, const float *post, const float *comb, int n, int D,
                                   size_t R, cudaStream_t st)
{
    return bcu_hc_post_add(X, f, NULL, post, comb, n, D, R, st);
}

extern "C" int bcu_norm_rope_fits(size_t dim, int rd)
{
    return dim >= 2 && dim <= (size_t)RMS_KEEP * RMS_NT(dim) && rd >= 0 && rd % 2 == 0 && (size_t)rd <= dim &&
           (dim - (size_t)rd) % 2 == 0;
}

extern "C" cudaError_t bcu_norm_rope(float *x, size_t rows, size_t dim, const float *w, float eps, int rd,
                                     const float *inv_freq, const int64_t *pos, int per, cudaStream_t st)
{
    if (!bcu_norm_rope_fits(dim, rd) || per <= 0) return cudaErrorNotSupported;
    if (rows > 0x7fffffffu) return GR_INVALID;
    if (!rows) return cudaSuccess;
    if (!x || (rd && (!inv_freq || !pos))) return GR_INVALID;
    if (RMS_NT(dim) == 1024)
        pdl_launch(gr_norm_rope_kernel<1024>, (unsigned)rows, 1024, 0, st, x, (int)dim, w, eps, rd, inv_freq, pos, per);
    else if (rows >= NR_ROWS_MIN && gr_row_kernels()) { /* a warp a row (the same bits), ceil(dim / 256) per lane */
        void (*const kern[4])(float *, size_t, int, const float *, float, int, const float *, const int64_t *, int) = {
            gr_norm_rope_rows_kernel<1>, gr_norm_rope_rows_kernel<2>, gr_norm_rope_rows_kernel<3>,
            gr_norm_rope_rows_kernel<4>};
        pdl_launch(kern[(dim - 1) / 256], (unsigned)((rows + 7) / 8), 256, 0, st, x, rows, (int)dim, w, eps, rd,
                   inv_freq, pos, per);
    } else
        pdl_launch(gr_norm_rope_kernel<256>, (unsigned)rows, 256, 0, st, x, (int)dim, w, eps, rd, inv_freq, pos, per);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_rope(float *x, size_t rows, size_t stride, size_t off, int rd, const float *inv_freq,
                                const int64_t *pos, int per, int inverse, cudaStream_t st)
{
    /* rows must not overlap: a pair rotated twice would race */
    if (rd < 0 || rd % 2 || per <= 0 || (rows > 1 && stride < off + (size_t)rd)) return GR_INVALID;
    if (!rows || !rd) return cudaSuccess;
    if (!x || !inv_freq || !pos) return GR_INVALID;
    const size_t half = (size_t)rd / 2;
    pdl_launch(gr_rope_kernel, gr_grid(rows * half), GR_NT, 0, st, x, rows, stride, off, (int)half, inv_freq, pos, per,
                                                          inverse);
    return cudaGetLastError();
}

static cudaError_t fq_launch(int fp4, float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st)
{
    if (block <= 0 || (rows > 1 && stride < n)) return GR_INVALID;
    if (!rows || !n) return cudaSuccess;
    if (!x) return GR_INVALID;
    const size_t nb = (n + (size_t)block - 1) / (size_t)block, warps = rows * nb;
    const size_t grid = (warps + GR_NT / 32 - 1) / (GR_NT / 32);
    if (nb > SIZE_MAX / rows || grid > INT_MAX) return GR_INVALID;
    if (gr_row_kernels() && n % 128 == 0 && stride % 4 == 0 && !((uintptr_t)x & 15u) && block == (fp4 ? 32 : 128)) {
        /* whole 128-column chunks: a float4 a lane (the same bits) */
        const size_t nch = n / 128, vgrid = (rows * nch + GR_NT / 32 - 1) / (GR_NT / 32);
        if (vgrid <= INT_MAX) {
            if (fp4) pdl_launch(gr_fq_vec_kernel<1>, (unsigned)vgrid, GR_NT, 0, st, x, rows, stride, nch);
            else pdl_launch(gr_fq_vec_kernel<0>, (unsigned)vgrid, GR_NT, 0, st, x, rows, stride, nch);
            return cudaGetLastError();
        }
    }
    if (fp4) pdl_launch(gr_fq_kernel<1>, (unsigned)grid, GR_NT, 0, st, x, rows, stride, n, (size_t)block, nb);
    else pdl_launch(gr_fq_kernel<0>, (unsigned)grid, GR_NT, 0, st, x, rows, stride, n, (size_t)block, nb);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_fq_fp8(float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st)
{
    return fq_launch(0, x, rows, stride, n, block, st);
}

extern "C" cudaError_t bcu_aq_bf16(uint16_t *dst, const float *x, size_t rows, size_t stride, size_t n,
                                   cudaStream_t st)
{
    if (!rows || !n) return cudaSuccess;
    if (!dst || !x || n % 128 || stride % 4 || stride < n || ((uintptr_t)x & 15u) || ((uintptr_t)dst & 7u))
        return GR_INVALID;
    const size_t nb = n / 128, warps = rows * nb, need = (warps + GR_NT / 32 - 1) / (GR_NT / 32);
    if (nb > SIZE_MAX / rows) return GR_INVALID;
    const size_t fill = (size_t)bcu_sm_count() * (2048 / GR_NT); /* a full SM's worth of warps on each */
    pdl_launch(gr_aq_bf16_kernel, (unsigned)(need < fill ? need : fill), GR_NT, 0, st, dst, x, rows, stride, n, nb);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_fq_fp4(float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st)
{
    return fq_launch(1, x, rows, stride, n, block, st);
}

extern "C" cudaError_t bcu_hadamard(float *x, size_t rows, size_t n, cudaStream_t st)
{
    if (!n || (n & (n - 1)) || n > HD_MAX_N || rows > INT_MAX) return GR_INVALID;
    if (!rows) return cudaSuccess;
    if (!x) return GR_INVALID;
    const unsigned g = (unsigned)((rows + GR_NT / 32 - 1) / (GR_NT / 32)); /* n >= 32: a warp a row (the same bits) */
    switch (gr_row_kernels() ? n : 0) {
    case 32: pdl_launch(gr_hadamard_rows_kernel<1>, g, GR_NT, 0, st, x, rows); break;
    case 64: pdl_launch(gr_hadamard_rows_kernel<2>, g, GR_NT, 0, st, x, rows); break;
    case 128: pdl_launch(gr_hadamard_rows_kernel<4>, g, GR_NT, 0, st, x, rows); break;
    case 256: pdl_launch(gr_hadamard_rows_kernel<8>, g, GR_NT, 0, st, x, rows); break;
    case 512: pdl_launch(gr_hadamard_rows_kernel<16>, g, GR_NT, 0, st, x, rows); break;
    case 1024: pdl_launch(gr_hadamard_rows_kernel<32>, g, GR_NT, 0, st, x, rows); break;
    default: pdl_launch(gr_hadamard_kernel, (unsigned)rows, GR_NT, 0, st, x, (int)n);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_swiglu(float *g, const float *up, size_t rows, int I, float limit, const float *rw,
                                  cudaStream_t st)
{
    if (I <= 0) return GR_INVALID;
    if (!rows) return cudaSuccess;
    if (!g || !up) return GR_INVALID;
    pdl_launch(gr_swiglu_kernel, gr_grid(rows * (size_t)I), GR_NT, 0, st, g, up, rows, (size_t)I, limit, rw);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_scale(float *x, size_t n, float s, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (!x) return GR_INVALID;
    pdl_launch(gr_scale_kernel, gr_grid(n), GR_NT, 0, st, x, n, s);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_argmax(int32_t *ids, const float *x, size_t rows, size_t V, cudaStream_t st)
{
    if (!rows) return cudaSuccess;
    if (!ids || !x || !V || rows > INT_MAX || V > INT_MAX) return GR_INVALID;
    pdl_launch(gr_argmax_kernel, (unsigned)rows, GR_AM_NT, 0, st, ids, x, V);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_add(float *y, const float *x, size_t n, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (!y || !x) return GR_INVALID;
    pdl_launch(gr_add_kernel, gr_grid(n), GR_NT, 0, st, y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_route(const bcu_route_args *a, const float *logits, size_t R, int32_t *idx, float *wt,
                                 cudaStream_t st)
{
    if (!a || a->E < 1 || a->E > RT_MAX_E || a->K < 1 || a->K > RT_MAX_K || a->K > a->E || R > INT_MAX)
        return GR_INVALID;
    /* a hash layer needs the token ids; any other layer its bias (v4.c reads gate_bias unconditionally) */
    if (a->tid2eid ? !a->ids : !a->bias) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!logits || !idx || !wt) return GR_INVALID;
    const RouteArgs ra = {a->E, a->K, a->score_func, a->official, a->route_scale, a->bias, a->tid2eid, a->ids};
    if (a->E <= 256)
        pdl_launch(gr_route_warp_kernel<8>, (unsigned)((R + RT_WARP_ROWS - 1) / RT_WARP_ROWS), 32 * RT_WARP_ROWS, 0,
                   st, ra, logits, idx, wt, (int)R);
    else
        pdl_launch(gr_route_warp_kernel<RT_MAX_E / 32>, (unsigned)((R + RT_WARP_ROWS - 1) / RT_WARP_ROWS),
                   32 * RT_WARP_ROWS, 0, st, ra, logits, idx, wt, (int)R);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_gather_rows(float *dst, const float *src, const int32_t *rows, size_t n, size_t width,
                                       cudaStream_t st)
{
    if (!n || !width) return cudaSuccess;
    if (!dst || !src || !rows) return GR_INVALID;
    pdl_launch(gr_gather_kernel, gr_grid(n * width), GR_NT, 0, st, dst, src, rows, n, width);
    return cudaGetLastError();
}

/* ---- the compressors' pooling (v4.c comp_pool_slots): one thread per (entry, channel), the slot descriptors of
 * the block's entry in shared memory; the three passes of the host loop, each in slot order, with explicitly
 * rounded operations (no contraction into FMAs the host does not do) */
__global__ void gr_comp_pool_kernel(float *out, int ns, int hd, const bcu_comp_slot *slots, const float *ape)
{
    pdl_enter();
    __shared__ bcu_comp_slot sl[BCU_COMP_MAX_SLOTS];
    const size_t i = blockIdx.y;
    for (int s = threadIdx.x; s < ns; s += blockDim.x) sl[s] = slots[i * (size_t)ns + s];
    __syncthreads();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hd) return;
    float mx = -INFINITY;
    for (int s = 0; s < ns; s++)
        if (sl[s].kv) mx = fmaxf(mx, sl[s].ape >= 0 ? __fadd_rn(sl[s].g[c], ape[sl[s].ape + c]) : sl[s].g[c]);
    float den = 0.0f, num = 0.0f;
    for (int s = 0; s < ns; s++)
        if (sl[s].kv) den = __fadd_rn(den, expf(__fsub_rn(sl[s].ape >= 0 ? __fadd_rn(sl[s].g[c], ape[sl[s].ape + c]) : sl[s].g[c], mx)));
    for (int s = 0; s < ns; s++)
        if (sl[s].kv) {
            const float g = sl[s].ape >= 0 ? __fadd_rn(sl[s].g[c], ape[sl[s].ape + c]) : sl[s].g[c];
            num = __fadd_rn(num, __fmul_rn(sl[s].kv[c], __fdiv_rn(expf(__fsub_rn(g, mx)), den)));
        }
    out[i * (size_t)hd + c] = num;
}

extern "C" cudaError_t bcu_comp_pool(float *out, size_t n, int ns, int hd, const bcu_comp_slot *slots, const float *ape,
                                     cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (!out || !slots || ns < 1 || ns > BCU_COMP_MAX_SLOTS || hd < 1) return GR_INVALID;
    const int nt = hd < 256 ? ((hd + 31) / 32) * 32 : 256;
    for (size_t i0 = 0; i0 < n; i0 += 65535) { /* grid.y is at most 65535 entries */
        const size_t k = n - i0 < 65535 ? n - i0 : 65535;
        const dim3 grid((unsigned)((hd + nt - 1) / nt), (unsigned)k);
        pdl_launch(gr_comp_pool_kernel, grid, nt, 0, st, out + i0 * (size_t)hd, ns, hd, slots + i0 * (size_t)ns, ape);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

extern "C" cudaError_t bcu_pdl_probe(int *ws, unsigned long long *t, double spin_us, cudaStream_t st)
{
    if (!ws || !t || !(spin_us >= 0.0 && spin_us <= 1e6)) return GR_INVALID;
    cudaError_t e = cudaMemsetAsync(ws, 0, 2 * sizeof(int), st);
    if (e != cudaSuccess) return e;
    e = pdl_launch(gr_pdl_slow_kernel, 1, 1, 0, st, ws, t, (unsigned long long)(spin_us * 1e3));
    if (e != cudaSuccess) return e;
    e = pdl_launch(gr_pdl_check_kernel, 1, 1, 0, st, (const int *)ws, ws + 1, t);
    return e != cudaSuccess ? e : cudaGetLastError();
}
