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
 *    one instead (per-thread strided partials, then a shared-memory tree),
 *    with no float atomics, so a call is deterministic.  The mHC mean square
 *    is summed in double as on the CPU; its dot products in fp32 (FMA).
 *  - Every row is handled by one block (hc_pre/head/post, hadamard, route) or
 *    by a fixed set of threads, so a row's result never depends on the other
 *    rows of the batch.
 * The small serial parts (mHC's sigmoid / softmax / Sinkhorn on at most 16 x
 * 16 numbers, the routing weights) run on one thread of the row's block,
 * operation for operation as in v4.c.
 *
 * Sizes are checked first (cudaErrorInvalidValue for what a kernel cannot
 * take), then an empty batch returns cudaSuccess without a launch.  The
 * functions never allocate or synchronise; they return cudaGetLastError().
 *
 * Not here: the GEMMs, RMSNorm (kernels.cu), attention (attn.cu), the grouped
 * experts (moe.cu). */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/graph.h"

#define GR_NT 256          /* threads per block, every kernel */
#define GR_GRID_CAP 8192u  /* blocks of a grid-stride kernel */
#define HC_MAX_N 16
#define HC_MAX_MIX ((2 + HC_MAX_N) * HC_MAX_N)
#define HC_MIXC 24         /* dot products per pass over a row (V4's (2+4)*4 in one) */
#define RT_MAX_E 512
#define RT_MAX_K 16
#define HD_MAX_N 1024

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

__device__ __forceinline__ float gr_dec_e4m3(uint32_t b)
{
    const uint32_t sign = (b & 0x80u) << 24;
    const uint32_t em = b & 0x7fu;
    uint32_t v = em < 8 ? __float_as_uint(__fmul_rn((float)em, 1.953125e-3f)) /* m/8 * 2^-6 */
                        : (em << 20) + (120u << 23);
    if (em == 0x7fu) v = 0x7fc00000u;
    return __uint_as_float(v | sign);
}

__device__ __forceinline__ float gr_dec_fp4(uint32_t c)
{
    const uint32_t sign = (c & 8u) << 28;
    const uint32_t em = c & 7u;
    const uint32_t v = em < 2 ? __float_as_uint(__fmul_rn((float)em, 0.5f)) : (em << 22) + (126u << 23);
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

/* v4.c pow2_ceil: 2^ceil(log2 v) through frexpf/ldexpf (exact on the device too) */
__device__ __forceinline__ float gr_pow2_ceil(float v)
{
    int e;
    const float f = frexpf(v, &e);
    return ldexpf(1.0f, f == 0.5f ? e - 1 : e);
}

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

struct HcArgs {
    int n, D, iters, head;
    float hc_eps, rms_eps;
    const float *fn, *base, *scale;
};

/* Stage 1, block (t, j): j < mix: the dot product fn[j] . x_t (fp32 FMA partials per thread, then a tree);
 * j == mix: ss = sum x_t^2 in double (the products are exact).  Every (t, j) is its own block, so a decode
 * step (R = 1) spreads over mix + 1 SMs instead of one, and the order of each sum is fixed. */
__global__ void __launch_bounds__(GR_NT) gr_hc_mix_kernel(HcArgs a, const float *X, float *wmix, double *wss, int j0)
{
    __shared__ double dpart[GR_NT];
    __shared__ float part[GR_NT];
    const int tid = threadIdx.x, n = a.n, D = a.D, N = n * D;
    const int mix = a.head ? n : (2 + n) * n;
    const size_t t = blockIdx.x;
    const int j = (int)blockIdx.y + j0;
    const float *x = X + t * (size_t)N;
    if (j == mix) {
        double ss = 0;
        for (int i = tid; i < N; i += GR_NT) ss += (double)x[i] * x[i];
        dpart[tid] = ss;
        __syncthreads();
        for (int s = GR_NT / 2; s > 0; s >>= 1) {
            if (tid < s) dpart[tid] += dpart[tid + s];
            __syncthreads();
        }
        if (tid == 0) wss[t] = dpart[0];
        return;
    }
    const float *f = a.fn + (size_t)j * N;
    float acc = 0.0f;
    for (int i = tid; i < N; i += GR_NT) acc = fmaf(f[i], x[i], acc);
    part[tid] = acc;
    __syncthreads();
    for (int s = GR_NT / 2; s > 0; s >>= 1) {
        if (tid < s) part[tid] += part[tid + s];
        __syncthreads();
    }
    if (tid == 0) wmix[t * (size_t)mix + j] = part[0];
}

/* Stage 2, one block per row t: thread 0 does hc_pre_task's tiny math in its order from the stage-1 sums;
 * then the collapse. */
__global__ void __launch_bounds__(GR_NT)
    gr_hc_pre_kernel(HcArgs a, const float *X, const float *wmix, const double *wss, float *coll, float *post,
                     float *comb)
{
    __shared__ float mixes[HC_MAX_MIX];
    __shared__ float C[HC_MAX_N * HC_MAX_N];
    __shared__ float pre[HC_MAX_N];
    const int tid = threadIdx.x, n = a.n, D = a.D, N = n * D;
    const int mix = a.head ? n : (2 + n) * n;
    const size_t t = blockIdx.x;
    const float *x = X + t * (size_t)N;
    for (int q = tid; q < mix; q += GR_NT) mixes[q] = wmix[t * (size_t)mix + q];
    __syncthreads();

    if (tid == 0) {
        const float eps = a.hc_eps;
        const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn((float)(wss[t] / (double)N), a.rms_eps)));
        for (int k = 0; k < mix; k++) mixes[k] = __fmul_rn(mixes[k], rs);
        for (int i = 0; i < n; i++) {
            pre[i] = __fadd_rn(gr_sigmoid(__fadd_rn(__fmul_rn(mixes[i], a.scale[0]), a.base[i])), eps);
            if (!a.head)
                post[t * n + i] =
                    __fmul_rn(2.0f, gr_sigmoid(__fadd_rn(__fmul_rn(mixes[n + i], a.scale[1]), a.base[n + i])));
        }
        if (!a.head) {
            /* C[i][k]: from stream i (row) to stream k (column); softmax along
             * rows, then Sinkhorn: column, (row, column) x (iters - 1) */
            for (int i = 0; i < n; i++) {
                float mx = -INFINITY;
                for (int k = 0; k < n; k++) {
                    const int q = 2 * n + i * n + k;
                    C[i * n + k] = __fadd_rn(__fmul_rn(mixes[q], a.scale[2]), a.base[q]);
                    mx = fmaxf(mx, C[i * n + k]);
                }
                float s = 0;
                for (int k = 0; k < n; k++) s = __fadd_rn(s, C[i * n + k] = expf(__fsub_rn(C[i * n + k], mx)));
                for (int k = 0; k < n; k++) C[i * n + k] = __fadd_rn(__fdiv_rn(C[i * n + k], s), eps);
            }
            for (int it = 0; it < a.iters; it++) {
                if (it > 0)
                    for (int i = 0; i < n; i++) {
                        float s = 0;
                        for (int k = 0; k < n; k++) s = __fadd_rn(s, C[i * n + k]);
                        for (int k = 0; k < n; k++) C[i * n + k] = __fdiv_rn(C[i * n + k], __fadd_rn(s, eps));
                    }
                for (int k = 0; k < n; k++) {
                    float s = 0;
                    for (int i = 0; i < n; i++) s = __fadd_rn(s, C[i * n + k]);
                    for (int i = 0; i < n; i++) C[i * n + k] = __fdiv_rn(C[i * n + k], __fadd_rn(s, eps));
                }
            }
        }
    }
    __syncthreads();
    if (!a.head)
        for (int q = tid; q < n * n; q += GR_NT) comb[t * n * n + q] = C[q];
    float *y = coll + t * (size_t)D;
    for (int d = tid; d < D; d += GR_NT) {
        float acc = 0;
        for (int i = 0; i < n; i++) acc = __fadd_rn(acc, __fmul_rn(pre[i], x[(size_t)i * D + d]));
        y[d] = acc;
    }
}

/* One block per row; a thread owns column d of all n streams (read all, then
 * write all: in place is safe). */
__global__ void __launch_bounds__(GR_NT)
    gr_hc_post_kernel(float *X, const float *f, const float *post, const float *comb, int n, int D)
{
    __shared__ float ps[HC_MAX_N], cs[HC_MAX_N * HC_MAX_N];
    const int tid = threadIdx.x;
    const size_t t = blockIdx.x;
    for (int q = tid; q < n * n; q += GR_NT) cs[q] = comb[t * n * n + q];
    if (tid < n) ps[tid] = post[t * n + tid];
    __syncthreads();
    float *x = X + t * (size_t)n * D;
    const float *fr = f + t * (size_t)D;
    for (int d = tid; d < D; d += GR_NT) {
        float xv[HC_MAX_N];
#pragma unroll
        for (int i = 0; i < HC_MAX_N; i++) xv[i] = i < n ? x[(size_t)i * D + d] : 0.0f;
        const float fv = fr[d];
#pragma unroll
        for (int k = 0; k < HC_MAX_N; k++) {
            if (k < n) {
                float acc = __fmul_rn(ps[k], fv);
#pragma unroll
                for (int i = 0; i < HC_MAX_N; i++)
                    if (i < n) acc = __fadd_rn(acc, __fmul_rn(cs[i * n + k], xv[i]));
                x[(size_t)k * D + d] = acc;
            }
        }
    }
}

/* ---------------------------------------------------------------- RoPE, fake quant, Hadamard */

__global__ void __launch_bounds__(GR_NT) gr_rope_kernel(float *x, size_t rows, size_t stride, size_t off, int half,
                                                        const float *inv, const int64_t *pos, int per, int inverse)
{
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

/* One warp per (row, block) group; the group index is warp-uniform, so the
 * early return keeps whole warps and the shuffles see all 32 lanes. */
template <int FP4>
__global__ void __launch_bounds__(GR_NT)
    gr_fq_kernel(float *x, size_t rows, size_t stride, size_t n, size_t block, size_t nb)
{
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
    for (size_t i = b0 + lane; i < b1; i += 32) {
        const float v = __fdiv_rn(xr[i], sc);
        xr[i] = __fmul_rn(FP4 ? gr_dec_fp4(gr_enc_fp4(v)) : gr_dec_e4m3(gr_enc_e4m3(v)), sc);
    }
}

/* One block per row, in shared memory; stage h pairs (j, j + h) exactly as
 * hadamard() (the pairs of a stage are independent, the stages ordered). */
__global__ void __launch_bounds__(GR_NT) gr_hadamard_kernel(float *x, int n)
{
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

/* ---------------------------------------------------------------- elementwise */

__global__ void __launch_bounds__(GR_NT)
    gr_swiglu_kernel(float *g, const float *up, size_t rows, size_t I, float limit, const float *rw)
{
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
    for (size_t q = GR_TID; q < n; q += GR_STEP) x[q] = __fmul_rn(x[q], s);
}

__global__ void __launch_bounds__(GR_NT) gr_add_kernel(float *y, const float *x, size_t n)
{
    for (size_t q = GR_TID; q < n; q += GR_STEP) y[q] = __fadd_rn(y[q], x[q]);
}

__global__ void __launch_bounds__(GR_NT)
    gr_gather_kernel(float *dst, const float *src, const int32_t *rows, size_t n, size_t width)
{
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

/* One block per row: scores, then (non-hash) K rounds of a parallel argmax
 * with gr_better, which is a total order, so the tree's shape does not change
 * the winner; then thread 0 sums the K scores in k order. */
__global__ void __launch_bounds__(GR_NT) gr_route_kernel(RouteArgs a, const float *logits, int32_t *idx, float *wt)
{
    __shared__ float score[RT_MAX_E], biased[RT_MAX_E];
    __shared__ unsigned char taken[RT_MAX_E];
    __shared__ float rv[GR_NT];
    __shared__ int ri[GR_NT];
    __shared__ int sel[RT_MAX_K];
    const int tid = threadIdx.x, E = a.E, K = a.K;
    const size_t t = blockIdx.x;
    const float *lg = logits + t * E;
    for (int e = tid; e < E; e += GR_NT) {
        const float v = lg[e];
        const float s = a.score_func == 1 ? gr_sigmoid(v) : __fsqrt_rn(gr_softplus(v));
        score[e] = s;
        taken[e] = 0;
        if (!a.tid2eid) biased[e] = __fadd_rn(s, a.bias[e]);
    }
    if (a.tid2eid && tid < K) sel[tid] = a.tid2eid[(size_t)a.ids[t] * K + tid];
    __syncthreads();
    for (int k = 0; !a.tid2eid && k < K; k++) {
        float bv = 0.0f;
        int be = -1;
        for (int e = tid; e < E; e += GR_NT)
            if (!taken[e] && gr_better(biased[e], e, bv, be)) {
                bv = biased[e];
                be = e;
            }
        rv[tid] = bv;
        ri[tid] = be;
        __syncthreads();
        for (int s = GR_NT / 2; s > 0; s >>= 1) {
            if (tid < s && gr_better(rv[tid + s], ri[tid + s], rv[tid], ri[tid])) {
                rv[tid] = rv[tid + s];
                ri[tid] = ri[tid + s];
            }
            __syncthreads();
        }
        if (tid == 0) {
            int first = 0; /* the scan's first candidate; k < K <= E, so one is free */
            while (taken[first]) first++;
            const int pick = biased[first] != biased[first] ? first : ri[0];
            sel[k] = pick;
            taken[pick] = 1;
        }
        __syncthreads();
    }
    if (tid == 0) {
        float w[RT_MAX_K], sum = 0;
        for (int k = 0; k < K; k++) {
            const int e = sel[k];
            w[k] = e >= 0 && e < E ? score[e] : NAN; /* a hash table entry out of range poisons the row */
            sum = __fadd_rn(sum, w[k]);
        }
        if (!a.official) sum = __fadd_rn(sum, 1e-20f);
        for (int k = 0; k < K; k++) {
            idx[t * K + k] = sel[k];
            wt[t * K + k] = __fmul_rn(__fdiv_rn(w[k], sum), a.route_scale);
        }
    }
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
    gr_embed_kernel<<<gr_grid(R * (size_t)D), GR_NT, 0, st>>>(X, table, emb, ids, R, (size_t)D, n_streams);
    return cudaGetLastError();
}

extern "C" float *bcu_hc_ws_mixes(void *ws, size_t R) { return (float *)((double *)ws + R); }

extern "C" size_t bcu_hc_ws_bytes(size_t R, int n)
{
    const size_t mix = (size_t)(2 + n) * (size_t)n;
    return R * sizeof(double) + ((R * mix * sizeof(float) + 7) & ~(size_t)7) + 16;
}

static cudaError_t hc_launch(const bcu_hc_site *s, int head, const float *X, size_t R, float *coll, float *post,
                             float *comb, void *ws, size_t ws_bytes, cudaStream_t st)
{
    if (!s || s->n < 1 || s->n > HC_MAX_N || s->D < 1 || s->D > INT_MAX / HC_MAX_N) return GR_INVALID;
    if (R > INT_MAX) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!s->fn || !s->base || !s->scale || !X || !coll || (!head && (!post || !comb))) return GR_INVALID;
    if (!ws || ws_bytes < bcu_hc_ws_bytes(R, s->n) || ((uintptr_t)ws & 7)) return GR_INVALID;
    const HcArgs a = {s->n, s->D, s->iters, head, s->hc_eps, s->rms_eps, s->fn, s->base, s->scale};
    const int mix = head ? s->n : (2 + s->n) * s->n;
    double *wss = (double *)ws;
    float *wmix = bcu_hc_ws_mixes(ws, R);
    /* the dot products (unless given) and the sum of squares */
    const int j0 = s->mixes_in_ws ? mix : 0;
    gr_hc_mix_kernel<<<dim3((unsigned)R, (unsigned)(mix + 1 - j0)), GR_NT, 0, st>>>(a, X, wmix, wss, j0);
    gr_hc_pre_kernel<<<(unsigned)R, GR_NT, 0, st>>>(a, X, wmix, wss, coll, post, comb);
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

extern "C" cudaError_t bcu_hc_post(float *X, const float *f, const float *post, const float *comb, int n, int D,
                                   size_t R, cudaStream_t st)
{
    if (n < 1 || n > HC_MAX_N || D < 1 || R > INT_MAX) return GR_INVALID;
    if (!R) return cudaSuccess;
    if (!X || !f || !post || !comb) return GR_INVALID;
    gr_hc_post_kernel<<<(unsigned)R, GR_NT, 0, st>>>(X, f, post, comb, n, D);
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
    gr_rope_kernel<<<gr_grid(rows * half), GR_NT, 0, st>>>(x, rows, stride, off, (int)half, inv_freq, pos, per,
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
    if (fp4) gr_fq_kernel<1><<<(unsigned)grid, GR_NT, 0, st>>>(x, rows, stride, n, (size_t)block, nb);
    else gr_fq_kernel<0><<<(unsigned)grid, GR_NT, 0, st>>>(x, rows, stride, n, (size_t)block, nb);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_fq_fp8(float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st)
{
    return fq_launch(0, x, rows, stride, n, block, st);
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
    gr_hadamard_kernel<<<(unsigned)rows, GR_NT, 0, st>>>(x, (int)n);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_swiglu(float *g, const float *up, size_t rows, int I, float limit, const float *rw,
                                  cudaStream_t st)
{
    if (I <= 0) return GR_INVALID;
    if (!rows) return cudaSuccess;
    if (!g || !up) return GR_INVALID;
    gr_swiglu_kernel<<<gr_grid(rows * (size_t)I), GR_NT, 0, st>>>(g, up, rows, (size_t)I, limit, rw);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_scale(float *x, size_t n, float s, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (!x) return GR_INVALID;
    gr_scale_kernel<<<gr_grid(n), GR_NT, 0, st>>>(x, n, s);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_add(float *y, const float *x, size_t n, cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (!y || !x) return GR_INVALID;
    gr_add_kernel<<<gr_grid(n), GR_NT, 0, st>>>(y, x, n);
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
    gr_route_kernel<<<(unsigned)R, GR_NT, 0, st>>>(ra, logits, idx, wt);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_gather_rows(float *dst, const float *src, const int32_t *rows, size_t n, size_t width,
                                       cudaStream_t st)
{
    if (!n || !width) return cudaSuccess;
    if (!dst || !src || !rows) return GR_INVALID;
    gr_gather_kernel<<<gr_grid(n * width), GR_NT, 0, st>>>(dst, src, rows, n, width);
    return cudaGetLastError();
}
