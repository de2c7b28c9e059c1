/* moe_wg.cu - the routed experts' GEMM stages on wgmma (sm_90a), for act_quant'd activations (moe_wg.h).
 *
 * Built for sm_90a alone (CMakeLists.txt): wgmma is an arch-specific feature, so this file's cubin loads only on
 * a compute capability 9.0 device, and bcu_wg_available() says whether it did.
 *
 * The bits.  An e2m1 code s E1 E0 m (dtype.c: element 2k in the low nibble of byte k) placed as the e4m3 byte
 * s 0 0 E1 E0 m 0 0 has the value code * 2^-6 for every code (E = 0 lands on e4m3's subnormals, which have the
 * same step), so one word of 8 codes becomes two words of 4 e4m3 bytes in 5-7 logic operations: the low nibbles
 * (fp4lo) and the high nibbles (fp4hi).  A 32-column ue8m0 block is 16 bytes; lane q of a quad takes its bytes
 * 4q..4q+3, and the A fragment of `wgmma .m64nNk32 .e4m3` (a0: row g, k 4q..4q+3; a1: row g + 8, same k; a2:
 * row g, k 16 + 4q..; a3: row g + 8) takes fp4lo as a0 / a1 and fp4hi as a2 / a3.  So k position p of a step is
 * column 2p (p < 16) or 2(p - 16) + 1 of the block, and the activations are stored in that order ("B order":
 * a step's even columns, then its odd ones).  bcu_wg_probe checks the fragment on the device.
 *
 * The same bits as the high byte of an f16 (s 0 0 0 E1 E0 m 0, low byte 0) are the code's value * 2^-14: the
 * f16 variant (F16 = 1) takes two bytes into an f16 pair with one prmt (hb_lo / hb_hi, h2_01 / h2_23) and runs two
 * k16 wgmmas a scale block.  Its products are exact and the tensor core sums them in fp32 (the probe measures 0
 * error), where the e4m3 wgmma keeps ~13 bits of its sums (1e-4 of the sum of |terms|): F16 is the default maths.
 *
 * The kernel (wg_kernel<G, F16, ST>, one warpgroup a block): 64 weight rows of one expert (G = 1: 32 features, W1's
 * row as A row g and W3's as A row g + 8 of each warp's 16, so a thread holds gate and up of the same (feature,
 * token) and the SwiGLU is its epilogue; G = 2: 64 rows of W2) against up to 8 of the expert's rows (tokens) a
 * pass.  B is in shared memory without swizzle (a step is two 8 x 16-byte core matrices, 128 bytes apart), one
 * WG_WIN-column window at a time.  Each warp streams its own 16 weight rows through a ring of WG_STAGES chunks
 * (128 columns: 64 bytes a row, and the chunk's four scale bytes) with cp.async, reads a step's words with
 * conflict-free 4-byte shared loads (rows 80 bytes apart), and issues a chunk's wgmmas (each scale block's from
 * zero) into four accumulator sets; while they run it decodes the next chunk; then each block's sums are scaled by
 * their weight scale and the chunk's by the activation scale (x 2^6 or 2^14; powers of two, exact), so every
 * output is a fixed-order sum over the blocks, independent of the other tokens of the pass.
 *
 * Prefill-sized batches take the tiles instead (wt_kernel, bcu_wg_tiles, below): 128 tokens of one expert against
 * 256 weight rows a block, the weights decoded to bf16 with their scale, the activations as bf16 values, so one
 * fp32 accumulator set sums the whole K. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <stdint.h>
#include <stdlib.h>

#include <type_traits>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/fp8_tile.h"
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_ops.cuh"
#include "backend/cuda/moe_wg.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sm_count.cuh"
#include "backend/cuda/wgmma.cuh"

#define WG_THREADS 128 /* one warpgroup */
#define WG_N 8         /* tokens a pass: the wgmma's n */
#ifndef WG_STAGES
#define WG_STAGES 5    /* weight chunks in flight per warp (a stage each) */
#endif
#ifndef WG_STAGES_DEEP
#define WG_STAGES_DEEP 8 /* the same for grids of at most three blocks an SM (wg_launch) */
#endif
#ifndef WG_WIN
#define WG_WIN 1024    /* columns of B in shared memory at a time (restaged between windows) */
#endif
#define WG_PITCH 80    /* bytes per weight row in a stage: 64 + 16, so the 4-byte reads of a step miss no bank */
#define WG_STAGE_BYTES (16 * WG_PITCH + 64) /* 16 rows, then their 4 scale bytes each */

namespace {

/* e2m1 x 8 (a word) -> e4m3 x 4: the codes of the low nibbles, and of the high nibbles (value * 2^-6) */
__device__ __forceinline__ uint32_t fp4lo(uint32_t w) { return ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu); }
__device__ __forceinline__ uint32_t fp4hi(uint32_t w) { return (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu); }

#if WG_ON
/* d = A B: m64n8k32, A (e4m3) from registers, B (e4m3) through a shared-memory descriptor */
__device__ __forceinline__ void wg_mma(float (&d)[4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 0, 1, 1;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
/* d (+)= A B: m64n8k16, A (f16) from registers, B (f16) through a descriptor; ACC 0: d = A B, 1: d += A B */
template <int ACC> __device__ __forceinline__ void wg_mma_h(float (&d)[4], const uint32_t (&a)[4], uint64_t desc)
{
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, %9, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC));
}
/* d[0 .. NN / 2) += A B: m64nNNk16 for NN = 16, 32, .., 128 (the first NN tokens of a tile's B, for tiles of at most
 * that many rows), A (bf16) from registers, B (bf16, K-major) through a descriptor.  The instruction names the first
 * NN / 2 accumulators; the rest are operands it leaves alone (the same registers in every variant) */
#define WT_MMA(n)                                                                                                    \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 {" WT_D##n "}, "                         \
                 "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"                                                        \
                 : WT_F8(0), WT_F8(8), WT_F8(16), WT_F8(24), WT_F8(32), WT_F8(40), WT_F8(48), WT_F8(56)             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc))
template <int NN> __device__ __forceinline__ void wt_mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc)
{
    static_assert(NN % 16 == 0 && NN >= 16 && NN <= 128, "n: a multiple of 16 up to 128");
    if constexpr (NN == 16) WT_MMA(16);
    else if constexpr (NN == 32) WT_MMA(32);
    else if constexpr (NN == 48) WT_MMA(48);
    else if constexpr (NN == 64) WT_MMA(64);
    else if constexpr (NN == 80) WT_MMA(80);
    else if constexpr (NN == 96) WT_MMA(96);
    else if constexpr (NN == 112) WT_MMA(112);
    else WT_MMA(128);
}
#endif

/* e2m1 x 8 (a word) -> the high bytes of f16 values code * 2^-14 (their low bytes are 0): of the low nibbles
 * (n0, n2, n4, n6), of the high nibbles (n1, n3, n5, n7) */
__device__ __forceinline__ uint32_t hb_lo(uint32_t w) { return ((w << 4) & 0x80808080u) | ((w << 1) & 0x0e0e0e0eu); }
__device__ __forceinline__ uint32_t hb_hi(uint32_t w) { return (w & 0x80808080u) | ((w >> 3) & 0x0e0e0e0eu); }
/* nonzero when a byte of x is 0 */
__device__ __forceinline__ uint32_t has_byte0(uint32_t x) { return (x - 0x01010101u) & ~x & 0x80808080u; }
/* an e4m3 code's value as f16 bits (exact: every e4m3 value is an f16 value) */
__device__ __forceinline__ uint32_t f16_of(uint32_t code) { return __half_as_ushort(__float2half_rn(gr_dec_e4m3(code))); }
/* two f16 from high bytes 0, 1 (lo) or 2, 3 (hi) of h */
__device__ __forceinline__ uint32_t h2_01(uint32_t h) { return __byte_perm(h, 0u, 0x1404u); }
__device__ __forceinline__ uint32_t h2_23(uint32_t h) { return __byte_perm(h, 0u, 0x3424u); }

/* no swizzle, K-major: start address, LBO (between the two core matrices along k), SBO (between 8-row groups) */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

template <int F16>
__global__ void __launch_bounds__(WG_THREADS) wg_probe_kernel(const uint32_t *a, const uint8_t *b, float *d)
{
#if WG_ON
    __shared__ __align__(128) uint8_t bs[256];
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31, g = lane >> 2, q = lane & 3;
    for (int x = t; x < 256; x += WG_THREADS) { /* byte x of row n = x / 32: k half x % 32 / 16 */
        const int n = x >> 5, k = x & 31;
        bs[(k >> 4) * 128 + n * 16 + (k & 15)] = b[x];
    }
    fence_async_smem();
    __syncthreads();
    const uint32_t ar[4] = {a[4 * t], a[4 * t + 1], a[4 * t + 2], a[4 * t + 3]};
    float dr[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    wg_fence();
    if (F16) wg_mma_h<0>(dr, ar, wg_desc(smem_u32(bs), 128, 256));
    else wg_mma(dr, ar, wg_desc(smem_u32(bs), 128, 256));
    wg_commit();
    wg_wait<0>();
    wg_hold(dr);
    for (int i = 0; i < 4; i++) d[(16 * warp + g + 8 * (i >> 1)) * 8 + 2 * q + (i & 1)] = dr[i];
#endif
}

/* act_quant of rows of 128-column chunks, a warp per (row, chunk), into B-order codes: MODE = 0, e4m3 bytes (a
 * 32-column block's even columns, then its odd ones); MODE = 1, the codes' values as f16 (a block is two k16
 * steps: step s holds the columns of parity s, k position 8h + 2q + i of a step is column 8q + 4h + 2i + s);
 * MODE = 2, the quantised values (code x scale, exact) as bf16 in the tiles' order (wt_kernel: a chunk is eight
 * k16 steps, k position 8h + 2q + j of step s is column 32q + 8(s / 2) + 2(s % 2) + h + 4j); MODE = 3, the codes'
 * values as f16 in fp8_tile.h's stage images, the scales [tile][chunk][BCU_FT_TOK] (below) */
/* chunk gw (row r, 128 columns c) of wg_code_kernel, its float4 v loaded */
template <int MODE>
__device__ __forceinline__ void wg_code_chunk(float4 v, int64_t gw, int64_t nch, int64_t K, uint8_t *codes,
                                              float *scales, float *wb)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = gw / nch, c = gw - r * nch;
    const float sc = aq_warp_scale_e4m3(v);
    const float inv = aq_inv(sc); /* v / sc, exactly */
    const uint32_t c0 = gr_enc_e4m3(__fmul_rn(v.x, inv)), c1 = gr_enc_e4m3(__fmul_rn(v.y, inv)),
                   c2 = gr_enc_e4m3(__fmul_rn(v.z, inv)), c3 = gr_enc_e4m3(__fmul_rn(v.w, inv));
    /* columns m0 .. m0 + 3 of block c * 4 + lane / 8, m0 = 4 (lane % 8) */
    if (MODE == 3) {
        /* fp8_tile.cu's B stage image: [64-row tile][chunk][k atom 2][row 64][128 bytes, 128B-swizzled].  Column
         * 32 q + 4 s + j of a chunk (q = lane / 8, s = lane % 8) is k position 2 q + j (j < 2) or 8 + 2 q + j - 2 of
         * k16 step s, which sits at byte 32 (s % 4) + 2 p of atom s / 4's row: pieces 2 (s % 4) and + 1, each at
         * 16-byte slot piece ^ (row % 8) */
        const uint64_t ur = (uint64_t)r; /* unsigned: the tile and row by a shift and a mask */
        const int q = lane >> 3, s = lane & 7, t = (int)(ur % BCU_FT_TOK), p0 = 2 * (s & 3);
        uint8_t *o = codes + ((int64_t)(ur / BCU_FT_TOK) * nch + c) * BCU_FT_IMAGE + (s >> 2) * (BCU_FT_IMAGE / 2) +
                     t * 128 + 4 * q;
        *(uint32_t *)(o + ((p0 ^ (t & 7)) << 4)) = f16_of(c0) | f16_of(c1) << 16;
        *(uint32_t *)(o + (((p0 + 1) ^ (t & 7)) << 4)) = f16_of(c2) | f16_of(c3) << 16;
    } else if (MODE == 2) {
        /* column 4 lane + t is k position 8 h + 2 q + j of step s: q = lane / 8, j = lane % 2, s = s0 + t / 2
         * (s0 = 2 (lane / 2 % 4)), h = t % 2.  Lanes l and l ^ 1 hold the two j of each (s, h): they swap halves
         * so that each stores two 4-byte words (j = 0, 1) of its h, for steps s0 and s0 + 1 */
        uint32_t b[4];
        b[0] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(gr_dec_e4m3(c0), sc)));
        b[1] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(gr_dec_e4m3(c1), sc)));
        b[2] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(gr_dec_e4m3(c2), sc)));
        b[3] = __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(gr_dec_e4m3(c3), sc)));
        const int j = lane & 1, s0 = 2 * ((lane >> 1) & 3);
        const uint32_t got = __shfl_xor_sync(0xffffffffu, j ? b[0] | b[2] << 16 : b[1] | b[3] << 16, 1);
        uint32_t *o = (uint32_t *)((uint16_t *)codes + r * K + c * 128 + 2 * (lane >> 3) + 8 * j);
        o[8 * s0] = j ? (got & 0xffffu) | b[1] << 16 : b[0] | got << 16;
        o[8 * (s0 + 1)] = j ? (got >> 16) | b[3] << 16 : b[2] | (got >> 16) << 16;
    } else if (MODE == 1) {
        const int m0 = 4 * (lane & 7), q = m0 >> 3, h = (m0 >> 2) & 1;
        uint8_t *o = codes + 2 * (r * K + (c * 4 + (lane >> 3)) * 32) + 2 * (8 * h + 2 * q);
        const uint32_t e0 = f16_of(c0), e1 = f16_of(c1), e2 = f16_of(c2), e3 = f16_of(c3);
        *(uint32_t *)o = e0 | e2 << 16;        /* step 0 (even columns m0, m0 + 2) */
        *(uint32_t *)(o + 32) = e1 | e3 << 16; /* step 1 (odd columns) */
    } else {
        uint8_t *o = codes + r * K + (c * 4 + (lane >> 3)) * 32 + 2 * (lane & 7);
        *(uint16_t *)o = (uint16_t)(c0 | c2 << 8);        /* even columns m0, m0 + 2 */
        *(uint16_t *)(o + 16) = (uint16_t)(c1 | c3 << 8); /* odd columns m0 + 1, m0 + 3 */
    }
    if (lane == 0 && scales) {
        const uint64_t ur = (uint64_t)r; /* mode 3: [tile][chunk][row of the tile] */
        scales[MODE == 3 ? ((int64_t)(ur / BCU_FT_TOK) * nch + c) * BCU_FT_TOK + (int64_t)(ur % BCU_FT_TOK)
                         : r * nch + c] = sc;
    }
    if (wb)
        *(float4 *)(wb + r * K + c * 128 + 4 * lane) =
            make_float4(__fmul_rn(gr_dec_e4m3(c0), sc), __fmul_rn(gr_dec_e4m3(c1), sc),
                        __fmul_rn(gr_dec_e4m3(c2), sc), __fmul_rn(gr_dec_e4m3(c3), sc));
}

/* a warp a 128-column chunk, the warps striding over the chunks two at a time (both loads out before either is
 * coded; each chunk writes only its own columns, so wb may be x) on a grid that fills the GPU */
template <int MODE>
__global__ void wg_code_kernel(const float *x, int64_t R, int64_t K, uint8_t *codes, float *scales, float *wb)
{
    pdl_enter();
    /* mode 3 codes its last tile whole: the rows past R as zeros (their images are copied with the rest) */
    const int64_t nch = K / 128, real = R * nch,
                  total = (MODE == 3 ? (R + BCU_FT_TOK - 1) / BCU_FT_TOK * BCU_FT_TOK : R) * nch,
                  nw = (int64_t)gridDim.x * (blockDim.x >> 5);
    const int lane = threadIdx.x & 31;
    const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; gw < total; gw += 2 * nw) {
        const int64_t g2 = gw + nw; /* warp-uniform, as gw */
        const float4 v = gw < real ? *(const float4 *)(x + (gw / nch) * K + (gw % nch) * 128 + 4 * lane) : z4;
        const float4 v2 = g2 < real ? *(const float4 *)(x + (g2 / nch) * K + (g2 % nch) * 128 + 4 * lane) : z4;
        wg_code_chunk<MODE>(v, gw, nch, K, codes, scales, wb);
        if (g2 < total) wg_code_chunk<MODE>(v2, g2, nch, K, codes, scales, wb);
    }
}

/* A warp's two weight rows g and g + 8 of a block of `rows` weight rows (G = 1: rows / 2 features, W1's row of
 * feature fA as A row g and W3's as g + 8, fB = fA; G = 2: W2's rows fA and fB = fA + 8): codes and ue8m0 scales */
struct wg_rows {
    int64_t fA, fB;
    const uint8_t *wA, *wB, *sA, *sB;
};
template <int G>
__device__ __forceinline__ wg_rows wg_rows_of(const bcu_wg_args &a, int e, int64_t K, int rows, int warp, int g)
{
    const int nkb = (int)(K / 32);
    wg_rows r;
    if (G == 1) {
        r.fA = r.fB = (int64_t)blockIdx.x * (rows / 2) + warp * 8 + g;
        r.wA = a.w1[e] + r.fA * (K / 2);
        r.wB = a.w3[e] + r.fA * (K / 2);
        r.sA = a.s1[e] + r.fA * nkb;
        r.sB = a.s3[e] + r.fA * nkb;
    } else {
        r.fA = (int64_t)blockIdx.x * rows + warp * 16 + g;
        r.fB = r.fA + 8;
        r.wA = a.w2[e] + r.fA * (K / 2);
        r.wB = a.w2[e] + r.fB * (K / 2);
        r.sA = a.s2[e] + r.fA * nkb;
        r.sB = a.s2[e] + r.fB * nkb;
    }
    return r;
}

/* a stage's output for (row, rows fA / fB): G = 1, h = swiglu(gate vA, up vB) (times the row's routing weight rw
 * under official semantics); G = 2, yp */
template <int G>
__device__ __forceinline__ void wg_store(const bcu_wg_args &a, int64_t row, const wg_rows &w, float vA, float vB,
                                         float rw)
{
    if (G == 1) {
        float hv = swiglu1(vA, vB, a.limit);
        if (a.official) hv = __fmul_rn(hv, rw);
        a.h[row * a.I + w.fA] = hv;
    } else {
        a.yp[row * a.D + w.fA] = vA;
        a.yp[row * a.D + w.fB] = vB;
    }
}

/* grid: x = groups of 64 weight rows (G = 1: 32 features), y = active-expert slot.  F16 = 0: one e4m3 k32
 * wgmma a scale block; F16 = 1: two f16 k16 wgmmas (the weights as f16 code * 2^-14), fp32-exact products.
 * Register caps: f16 128 (four blocks an SM; stage 2 used 134, three), e4m3 102 (five; 128 let it take 111, four
 * blocks, 3% slower at T = 256).  No spill, the same bits; on the H200 the f16 experts 2-3% faster at T = 8..256. */
template <int G, int F16, int ST>
__global__ void __launch_bounds__(WG_THREADS, F16 ? 4 : 5) wg_kernel(bcu_wg_args a)
{
    pdl_enter();
#if WG_ON
    constexpr int SPB = F16 ? 2 : 1;        /* wgmma steps a scale block */
    constexpr int WSTEPS = WG_WIN / 32 * SPB; /* steps of B in the window */
    extern __shared__ __align__(128) uint8_t smem[];
    const int e = a.act[blockIdx.y];
    if (e < 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int64_t K = G == 1 ? a.D : a.I;
    const int nkb = (int)(K / 32), nch = nkb / 4; /* scale blocks, chunks */
    const int64_t r0 = a.off[e], nrows = a.off[e + 1] - r0;
    uint8_t *bsm = smem;                              /* B window: [step][k half][token][16 bytes] */
    float *xsm = (float *)(smem + WSTEPS * 256);      /* activation scales: [chunk][token] */
    uint8_t *ring = smem + WSTEPS * 256 + (size_t)nch * WG_N * 4 + (size_t)warp * ST * WG_STAGE_BYTES;

    const wg_rows wr = wg_rows_of<G>(a, e, K, 64, warp, g);
    const uint8_t *const wA = wr.wA, *const wB = wr.wB, *const sA = wr.sA, *const sB = wr.sB;
    /* chunk c of this warp's 16 rows into stage c % ST: lane (g, q) copies bytes 16q.. of rows g and
     * g + 8, lanes q = 0 / 1 the four scale bytes of row g / g + 8; one cp.async group per chunk, empty or not */
    auto issue = [&](int c) {
        if (c < nch) {
            const uint32_t s = smem_u32(ring + (c % ST) * WG_STAGE_BYTES);
            cp16(s + g * WG_PITCH + 16 * q, wA + 64 * (int64_t)c + 16 * q);
            cp16(s + (8 + g) * WG_PITCH + 16 * q, wB + 64 * (int64_t)c + 16 * q);
            if (q == 0) cp4(s + 16 * WG_PITCH + 4 * g, sA + 4 * c);
            if (q == 1) cp4(s + 16 * WG_PITCH + 32 + 4 * g, sB + 4 * c);
        }
        rd_cp_commit();
    };
    /* chunk c's A fragments (four scale blocks, SPB steps each) from its stage */
    auto convert = [&](int c, uint32_t (&A)[4][SPB][4]) {
        const uint8_t *stg = ring + (c % ST) * WG_STAGE_BYTES;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t wa = *(const uint32_t *)(stg + g * WG_PITCH + 16 * j + 4 * q);
            const uint32_t wb = *(const uint32_t *)(stg + (8 + g) * WG_PITCH + 16 * j + 4 * q);
            if (F16) { /* step 0: the low nibbles (n0 n2 | n4 n6), step 1: the high ones */
                const uint32_t la = hb_lo(wa), lb = hb_lo(wb), ha = hb_hi(wa), hb = hb_hi(wb);
                A[j][0][0] = h2_01(la);
                A[j][0][1] = h2_01(lb);
                A[j][0][2] = h2_23(la);
                A[j][0][3] = h2_23(lb);
                A[j][SPB - 1][0] = h2_01(ha);
                A[j][SPB - 1][1] = h2_01(hb);
                A[j][SPB - 1][2] = h2_23(ha);
                A[j][SPB - 1][3] = h2_23(hb);
            } else {
                A[j][0][0] = fp4lo(wa);
                A[j][0][1] = fp4lo(wb);
                A[j][0][2] = fp4hi(wa);
                A[j][0][3] = fp4hi(wb);
            }
        }
    };
    /* the descriptors differ in their address field alone (bits 0..13: B is under 256 KB, so adding a step's 16 to
     * the low word never carries out of it): the high word once, a 32-bit add a wgmma */
    const uint64_t desc0 = wg_desc(smem_u32(bsm), 128, 256);
    const uint32_t dlo0 = (uint32_t)desc0, dhi = (uint32_t)(desc0 >> 32);
    const int n_me = tid & 7; /* the token this thread stages: the staging strides are multiples of 8 */
    const uint8_t *csrc = G == 1 ? a.xc : a.hc;
    const float *ssrc0 = G == 1 ? a.xs : a.hs;
    const float unit = F16 ? 16384.0f : 64.0f; /* the weights' 2^-14 (f16) or 2^-6 (e4m3) */
    const uint8_t *src = NULL;
    /* B's window holding chunk c (WG_WIN columns), this thread's token; after a barrier, before one */
    auto stage_window = [&](int c) {
        const int s0 = c * 4 * SPB; /* the window's first step */
        const int ns = (nkb - c * 4) * SPB < WSTEPS ? (nkb - c * 4) * SPB : WSTEPS;
        for (int u = tid; u < ns * 16; u += WG_THREADS) { /* u = (step, half) * 8 + token */
            const int si = u >> 3;
            const uint4 v = src ? __ldg((const uint4 *)(src + 16 * (2 * s0 + si))) : make_uint4(0u, 0u, 0u, 0u);
            *(uint4 *)(bsm + si * 128 + n_me * 16) = v;
        }
        fence_async_smem();
    };

    for (int64_t t0 = 0; t0 < nrows; t0 += WG_N) {
        const int ntk = nrows - t0 < WG_N ? (int)(nrows - t0) : WG_N;
        __syncthreads(); /* the previous pass has read B and the scales */
        for (int c = 0; c < ST - 1; c++) issue(c); /* the weights' first loads overlap the staging */
        src = NULL;
        const float *ssrc = NULL;
        if (n_me < ntk) {
            const int64_t row = r0 + t0 + n_me;
            const int64_t xr = G == 1 ? (int64_t)(a.sorted[row] / a.topk) : row;
            src = csrc + xr * K * SPB;
            ssrc = ssrc0 + xr * nch;
        }
        stage_window(0);
        for (int u = tid; u < nch * WG_N; u += WG_THREADS) xsm[u] = ssrc ? __ldg(ssrc + (u >> 3)) : 0.0f;
        __syncthreads();

        /* Chunk by chunk: its four scale blocks' wgmmas in flight together (four accumulator sets, each from
         * zero); while they run, the next chunk's fragments are decoded; then the sums are scaled into acc in
         * block order (ptxas serialises wgmmas whose accumulators are read while another is in flight, so the
         * scaling waits for all four). */
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, dd[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) dd[j][i] = 0.0f;
        uint32_t A0[4][SPB][4], A1[4][SPB][4];
        rd_cp_wait_group<ST - 2>(); /* chunk 0 */
        __syncwarp();
        convert(0, A0);
        auto chunk = [&](int c, uint32_t (&Ac)[4][SPB][4], uint32_t (&An)[4][SPB][4]) {
            const int wl = (c % (WG_WIN / 128)) * 4 * SPB; /* chunk c's first step in the window */
            wg_fence();
#pragma unroll
            for (int j = 0; j < 4; j++) /* the descriptor's address field counts 16 bytes: a step is 256 */
#pragma unroll
                for (int h = 0; h < SPB; h++) {
                    const uint64_t dsc = (uint64_t)dhi << 32 | (uint32_t)(dlo0 + (uint32_t)((wl + SPB * j + h) * 16));
                    if (!F16) wg_mma(dd[j], Ac[j][0], dsc);
                    else if (h == 0) wg_mma_h<0>(dd[j], Ac[j][h], dsc);
                    else wg_mma_h<1>(dd[j], Ac[j][h], dsc);
                }
            wg_commit();
            const uint8_t *stg = ring + (c % ST) * WG_STAGE_BYTES;
            const uint32_t swA = *(const uint32_t *)(stg + 16 * WG_PITCH + 4 * g);
            const uint32_t swB = *(const uint32_t *)(stg + 16 * WG_PITCH + 32 + 4 * g);
            const float x0 = xsm[c * WG_N + 2 * q] * unit, x1 = xsm[c * WG_N + 2 * q + 1] * unit;
            __syncwarp(); /* every lane has read the stage that issue() refills (chunk c - 1's) */
            issue(c + ST - 1);
            if (c + 1 < nch) {
                rd_cp_wait_group<ST - 2>(); /* chunk c + 1 */
                __syncwarp();
                convert(c + 1, An);
            }
            /* the weight scales as floats: 2^(b - 127) is the byte shifted into the exponent, except for dtype.c's
             * two special bytes 0 (2^-127, a subnormal) and 255 (NaN), which take ue8m0().  Whether any lane has
             * one is asked of the warp, so the common case is a branch, not both paths predicated (H200 SASS: the
             * predicated form cost ~35 of a chunk's ~300 instructions) */
            float fa[4], fb[4];
            if (__all_sync(0xffffffffu, !(has_byte0(swA) | has_byte0(swB) | has_byte0(~swA) | has_byte0(~swB)))) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    fa[j] = __uint_as_float(((swA >> (8 * j)) & 255u) << 23);
                    fb[j] = __uint_as_float(((swB >> (8 * j)) & 255u) << 23);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    fa[j] = ue8m0((swA >> (8 * j)) & 255u);
                    fb[j] = ue8m0((swB >> (8 * j)) & 255u);
                }
            }
            wg_wait<0>();
            /* the chunk's sums per (row, token): its blocks' sums times their weight scales in block order, then
             * times the token's activation scale (one per 128 columns) */
            float cs[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                wg_hold(dd[j]);
                cs[0] = j ? fmaf(dd[j][0], fa[j], cs[0]) : dd[j][0] * fa[j];
                cs[1] = j ? fmaf(dd[j][1], fa[j], cs[1]) : dd[j][1] * fa[j];
                cs[2] = j ? fmaf(dd[j][2], fb[j], cs[2]) : dd[j][2] * fb[j];
                cs[3] = j ? fmaf(dd[j][3], fb[j], cs[3]) : dd[j][3] * fb[j];
            }
            acc[0] = fmaf(cs[0], x0, acc[0]);
            acc[1] = fmaf(cs[1], x1, acc[1]);
            acc[2] = fmaf(cs[2], x0, acc[2]);
            acc[3] = fmaf(cs[3], x1, acc[3]);
            if (c + 1 < nch && (c + 1) % (WG_WIN / 128) == 0) { /* chunk c + 1 opens the next window of B */
                __syncthreads();
                stage_window(c + 1);
                __syncthreads();
            }
        };
        for (int c = 0; c < nch; c += 2) {
            chunk(c, A0, A1);
            if (c + 1 < nch) chunk(c + 1, A1, A0);
        }
        rd_cp_wait_group<0>(); /* the ring's empty tail groups */

        /* acc: (row A, token 2q), (row A, 2q + 1), (row B, 2q), (row B, 2q + 1) */
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int tk = 2 * q + u;
            if (tk >= ntk) continue;
            wg_store<G>(a, r0 + t0 + tk, wr, acc[u], acc[2 + u],
                        G == 1 && a.official ? a.w[a.sorted[r0 + t0 + tk]] : 1.0f);
        }
    }
#endif
}

/* ---- the tiles: a prefill-sized batch, up to WT_N of an expert's rows against 256 weight rows a block.
 *
 * Each weight element is decoded once per tile, so its cost is spread over up to 128 tokens and the decode may
 * take the scale with it: an e2m1 code's bits placed in a bf16 (sign to bit 15, E1 E0 m to bits 8..6) are the
 * code's value times 2^-126 (E = 0 lands on bf16's subnormals, which have the same step), and one bf16 multiply by
 * 2^(b - 1) (b the ue8m0 byte) makes it the weight's value, exactly.  The activations come as bf16 values of their
 * codes times their scales (also exact), so both scales are inside the operands: a k16 wgmma takes any four
 * columns of a thread's scale block, every product is exact and one fp32 accumulator set sums the whole K.  That
 * frees the k order: lane q takes scale block q of each 128-column chunk whole (16 bytes a row), and the
 * activations are stored in the matching order (wg_code_kernel MODE 2).
 *
 * Four warpgroups a block share each chunk of B (128 tokens x 128 columns, 32 KB): the decode of the next half
 * chunk (four k16 steps) runs while the wgmmas of the current one do, and with four warps a scheduler the decode's
 * latency is hidden (two warpgroups of 128 rows each measured 20% of the tensor peak: their warps were the critical
 * path, and the B traffic per FLOP twice this). */
#define WT_N 128       /* tokens a tile: moe.cu's BCU_MOE_TILE_M, the wgmma's n */
#define WT_WARPS 16
#define WT_THREADS (32 * WT_WARPS) /* four warpgroups: 256 weight rows (G = 1: 128 features, W1 and W3) */
#define WT_ROWS (16 * WT_WARPS)
#ifndef WT_STAGES
#define WT_STAGES 4 /* stages of B and of the weights: two chunks loading while one is read and one is decoded */
#endif
#define WT_BSTAGE (WT_N * 256)    /* a chunk of B: [k atom 2][token WT_N][128 bytes, 128B-swizzled] */
#define WT_WSTAGE (16 * 64 + 64)  /* a warp's chunk of weights: 16 rows x 64 bytes, then their 4 scale bytes each */
#define WT_SMEM (WT_STAGES * (WT_BSTAGE + WT_WARPS * WT_WSTAGE) + 1024) /* + the swizzle atoms' alignment */
static_assert(WT_THREADS == 4 * WT_N, "a chunk of B is four 16-byte units a thread");

/* the pair of e2m1 codes (n_i, n_{i+4}) of a word w (nibble n_j at bits 4 j), i = 0..3, as bf16 values code * 2^-126
 * (sign to bit 15 / 31, E1 E0 m to bits 6..8 / 22..24).  The two shifts are one multiply: the nibbles masked out of
 * w (i >= 2: out of w >> 8, passed as w8) times 2^a + 2^b land on bits that do not overlap, so nothing carries */
template <int I> __device__ __forceinline__ uint32_t wt_pair(uint32_t w, uint32_t w8)
{
    const uint32_t x = I < 2 ? w : w8;
    return I & 1 ? ((x & 0x00f000f0u) * 0x104u) & 0x81c081c0u : ((x & 0x000f000fu) * 0x1040u) & 0x81c081c0u;
}
__device__ __forceinline__ uint32_t bf2_mul(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* grid: x = groups of WT_ROWS weight rows, y = tiles (moe.cu's tile_e / tile_r0) */
template <int G>
__global__ void __launch_bounds__(WT_THREADS, 1) wt_kernel(bcu_wg_args a)
{
    pdl_enter();
#if WG_ON
    extern __shared__ __align__(128) uint8_t smem[];
    const int e = a.tile_e[blockIdx.y];
    if (e < 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int64_t K = G == 1 ? a.D : a.I;
    const int nkb = (int)(K / 32), nch = nkb / 4;
    const int64_t r0 = a.tile_r0[blockIdx.y];
    const int64_t span = bcu_moe_tile_span(a.off[e + 1] - a.off[e]);
    const int ntk = (int)(a.off[e + 1] - r0 < span ? a.off[e + 1] - r0 : span);

    uint8_t *bring = smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u); /* 128B-swizzle atoms: 1 KB aligned */
    uint8_t *wring = bring + WT_STAGES * WT_BSTAGE + warp * WT_STAGES * WT_WSTAGE;

    const wg_rows wr = wg_rows_of<G>(a, e, K, WT_ROWS, warp, g);
    const uint8_t *const wA = wr.wA, *const wB = wr.wB, *const sA = wr.sA, *const sB = wr.sB;
    /* the tile's routing weights (stage 1, official semantics) for the epilogue, fetched now: read there from
     * global memory, each behind the stores before it, they were a third of stage 1's time */
    __shared__ float rws[WT_N];
    if (tid < WT_N) rws[tid] = G == 1 && a.official && tid < ntk ? a.w[a.sorted[r0 + tid]] : 1.0f;
    /* B: thread t copies 16-byte units of token t / 4, units 4 i + t % 4 of its chunk row (16 (step, half) units of
     * 8 bf16), so a warp reads 64 contiguous bytes of 8 tokens and writes 128 contiguous bytes for each t % 4.  Rows
     * past the tile's end are not copied: the wgmma reads them (its n rounds up) into sums no one stores */
    const int bn = tid >> 2, bq = tid & 3;
    const bool bcopy = bn < ntk;
    const uint8_t *bsrc = a.xc;
    if (bcopy) {
        const int64_t row = r0 + bn;
        bsrc = (G == 1 ? a.xc + (int64_t)(a.sorted[row] / a.topk) * K * 2 : a.hc + row * K * 2) + 16 * bq;
    }
    /* unit u = 2 step + half of a chunk (8 k positions) is 16-byte piece u % 8 of k atom u / 8 (64 k positions,
     * a 128-byte row per token), stored at piece (u % 8) ^ (token % 8): the 128-byte swizzle, so the wgmma's
     * reads of B miss no bank (without it, measured 28% of the tensor peak) */
    const uint32_t bdst0 = smem_u32(bring) + bn * 128 + ((bq ^ (bn & 7)) << 4);
    const uint32_t bdst1 = smem_u32(bring) + bn * 128 + (((bq ^ (bn & 7)) ^ 4) << 4);

    /* chunk c into stage c % WT_STAGES, one cp.async group per thread: B, and this warp's weights (lane (g, q):
     * bytes 16 q.. of rows g and g + 8, lanes q = 0 / 1 the four scale bytes of row g / g + 8) */
    auto issue = [&](int c) {
        if (c < nch) {
            const uint8_t *src = bsrc + 256 * (int64_t)c;
            const uint32_t so = (c % WT_STAGES) * WT_BSTAGE;
            if (bcopy)
#pragma unroll
                for (int i = 0; i < 4; i++) /* unit 4 i + bq: k atom i / 2, piece 4 (i % 2) + bq */
                    cp16((i & 1 ? bdst1 : bdst0) + so + (i >> 1) * (WT_N * 128), src + 64 * i);
            const uint32_t s = smem_u32(wring + (c % WT_STAGES) * WT_WSTAGE);
            cp16(s + g * 64 + 16 * q, wA + 64 * (int64_t)c + 16 * q);
            cp16(s + (8 + g) * 64 + 16 * q, wB + 64 * (int64_t)c + 16 * q);
            if (q == 0) cp4(s + 1024 + 4 * g, sA + 4 * c);
            if (q == 1) cp4(s + 1024 + 32 + 4 * g, sB + 4 * c);
        }
        rd_cp_commit();
    };
    /* half chunk k's A fragments (chunk k / 2, steps 4 (k % 2) ..), scales inside: step s of the chunk takes word
     * s / 2 of this lane's scale block q, pairs i = 2 (s % 2) (a0 / a1: rows g / g + 8) and i + 1 (a2 / a3) */
    auto convert = [&](int k, uint32_t (&A)[4][4]) {
        const uint8_t *stg = wring + ((k >> 1) % WT_STAGES) * WT_WSTAGE;
        const uint2 ra = *(const uint2 *)(stg + g * 64 + 16 * q + 8 * (k & 1));
        const uint2 rb = *(const uint2 *)(stg + (8 + g) * 64 + 16 * q + 8 * (k & 1));
        const uint32_t ba = stg[1024 + 4 * g + q], bb = stg[1024 + 32 + 4 * g + q];
        /* 2^(b - 1) as bf16 while b <= 128; above, 2^126 then 2^(b - 127) (b = 255: NaN, as dtype.c) */
        const bool big = __any_sync(0xffffffffu, ba > 128u || bb > 128u);
        const uint32_t ma = (ba <= 128u ? ba + 126u : 253u) << 7, mb = (bb <= 128u ? bb + 126u : 253u) << 7;
        const uint32_t wa[2] = {ra.x, ra.y}, wb[2] = {rb.x, rb.y};
        const uint32_t sa = ma | ma << 16, sb = mb | mb << 16;
#pragma unroll
        for (int m = 0; m < 2; m++) {
            const uint32_t a8 = wa[m] >> 8, b8 = wb[m] >> 8;
            A[2 * m][0] = bf2_mul(wt_pair<0>(wa[m], a8), sa);
            A[2 * m][1] = bf2_mul(wt_pair<0>(wb[m], b8), sb);
            A[2 * m][2] = bf2_mul(wt_pair<1>(wa[m], a8), sa);
            A[2 * m][3] = bf2_mul(wt_pair<1>(wb[m], b8), sb);
            A[2 * m + 1][0] = bf2_mul(wt_pair<2>(wa[m], a8), sa);
            A[2 * m + 1][1] = bf2_mul(wt_pair<2>(wb[m], b8), sb);
            A[2 * m + 1][2] = bf2_mul(wt_pair<3>(wa[m], a8), sa);
            A[2 * m + 1][3] = bf2_mul(wt_pair<3>(wb[m], b8), sb);
        }
        if (big) { /* rare (scales above 2): a branch, not 16 predicated multiplies in every half chunk */
            const uint32_t m2a = ba <= 128u ? 127u << 7 : ba == 255u ? 0x7fc0u : ba << 7;
            const uint32_t m2b = bb <= 128u ? 127u << 7 : bb == 255u ? 0x7fc0u : bb << 7;
            const uint32_t s2a = m2a | m2a << 16, s2b = m2b | m2b << 16;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                A[r][0] = bf2_mul(A[r][0], s2a);
                A[r][1] = bf2_mul(A[r][1], s2b);
                A[r][2] = bf2_mul(A[r][2], s2a);
                A[r][3] = bf2_mul(A[r][3], s2b);
            }
        }
    };

    /* the loop and the epilogue for wgmmas of NN tokens: the tile's rows rounded up to a multiple of 16 (the
     * instruction's n is fixed; one variant a block keeps the loop free of branches) */
    auto run = [&](auto nn) {
        constexpr int NN = decltype(nn)::value;
        float acc[64];
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        uint32_t A0[4][4], A1[4][4];
        for (int c = 0; c < WT_STAGES - 2; c++) issue(c);
        rd_cp_wait_group<WT_STAGES - 3>(); /* chunk 0 */
        __syncwarp();
        convert(0, A0);
        /* half chunk k: on entering chunk c = k / 2 its B is made visible to all (each thread waited for its own
         * copies) and the stage of chunk c - 2 (every warp is done with it: each waited for half k - 1's wgmmas before
         * this barrier) takes chunk c + WT_STAGES - 2; k's four wgmmas queue behind k - 1's, and once those are done
         * half k + 1 is decoded into their registers while k's run */
        const uint32_t b0 = smem_u32(bring);
        const int nk = 2 * nch;
        auto half = [&](int k, uint32_t (&Ac)[4][4], uint32_t (&An)[4][4]) {
            const int c = k >> 1;
            if (!(k & 1)) {
                fence_async_smem();
                __syncthreads();
            }
            wg_fence();
            const uint32_t bk = b0 + (c % WT_STAGES) * WT_BSTAGE + (k & 1) * (WT_N * 128);
#pragma unroll
            for (int s = 0; s < 4; s++) wt_mma<NN>(acc, Ac[s], wt_desc(bk + s * 32));
            wg_commit();
            if (!(k & 1)) issue(c + WT_STAGES - 2);
            wg_wait<1>(); /* half k - 1 */
            if (k + 1 < nk) {
                if (k & 1) {
                    rd_cp_wait_group<WT_STAGES - 3>(); /* chunk c + 1 */
                    __syncwarp();
                }
                convert(k + 1, An);
            }
        };
        for (int k = 0; k < nk; k += 2) {
            half(k, A0, A1);
            half(k + 1, A1, A0);
        }
        wg_wait<0>();
        rd_cp_wait_group<0>(); /* the empty tail groups */
        wg_hold_all(acc);
        wg_each_token<NN>(acc, q, ntk,
                          [&](int tk, float vA, float vB) { wg_store<G>(a, r0 + tk, wr, vA, vB, rws[tk]); });
    };
    switch ((ntk + 15) >> 4) { /* the wgmma's n */
    case 1: run(std::integral_constant<int, 16>{}); break;
    case 2: run(std::integral_constant<int, 32>{}); break;
    case 3: run(std::integral_constant<int, 48>{}); break;
    case 4: run(std::integral_constant<int, 64>{}); break;
    case 5: run(std::integral_constant<int, 80>{}); break;
    case 6: run(std::integral_constant<int, 96>{}); break;
    case 7: run(std::integral_constant<int, 112>{}); break;
    default: run(std::integral_constant<int, 128>{}); break;
    }
#endif
}

/* ---- the GEMV: decode batches of up to 32 tokens (wv_kernel, bcu_wg_gemv).
 *
 * At batch 1 wg_kernel spends ~257 instructions a KB of weights (the ring and B in shared memory, the descriptors,
 * eight tokens' columns for one) and reaches ~31% of the weights' bandwidth (with routing and combine).  Here each
 * warp streams one 16-row tile straight into registers, 16 bytes of rows g and g + 8 a lane and chunk, and a
 * lane's 16 bytes are scale block q of the 128-column chunk, whole.  One m16n8k16 f16 mma takes four codes of each
 * row from every lane of a quad, so one mma mixes the four blocks of a chunk; they are kept apart in the B
 * operand's columns instead: column 4 tau + j holds token tau's codes of block j at the k positions of lane j and
 * zeros at the others, so after a chunk's eight mmas column 4 tau + j holds block j's sum for token tau (the other
 * products are exact zeros).  Only the lanes whose column's block is their own (g % 4 == q) read activations; the
 * others read zeros.  The chunk is then scaled as wg_kernel scales it, in the same order: the block sums times
 * their weight scales in block order, then times the activation scale, into acc (lane q even holds blocks 0 and 1
 * of its rows and token, lane q + 1 blocks 2 and 3: one shuffle passes the partial sum on, and the odd lanes keep
 * acc).  The products are exact (the codes as f16 high bytes, x as f16 values) and the tensor core sums them in
 * fp32, so the outputs are wg_kernel's bits wherever a block's sum is exact in fp32 (test_cuda_moe compares the
 * two: no bit differs).  Passes of WV_T tokens: an expert with more rows re-reads its weights, yet up to 32 tokens
 * (~1.4 rows an expert at top-6 of 256) the GEMV beat wg_kernel on the H200, so the backend sends it batches of up
 * to 32 tokens (cuda.cu).  The loop spends ~192 SASS instructions a chunk (1 KB of weights: the decode ~120, 8
 * mmas, the scaling ~25; H200). */
/* W 16-row tiles (warps) a block, 12 / W blocks an SM (168 registers; ptxas spills at 128); W = 2 (128 blocks an
 * expert; on the H200 2-3% faster than 4 at T = 1..32, and one warp slower) unless DEEPINFER_CUDA_WV_WARPS says 4 */
#define WV_WARPS 2
#define WV_PD 6 /* chunks of weights in flight a lane (DEEPINFER_CUDA_WV_PD=8: eight); on the H200 six measured faster
                  * than eight (T = 1 45.2 -> 43.5 us, the slice's batch 16 3.58 -> 3.47 ms) and than four at 128
                  * registers and 16 warps an SM (which spilled: T = 1 46.1 us, batch 1 1.09-1.14 ms against 1.06) */
#define WV_T 2  /* tokens a pass: two tokens of four blocks are the mma's eight columns */

/* shared memory: the pass's codes [WV_T][K] f16, the activation scales [chunk][WV_T], 64 zero bytes, each warp's
 * weight scales [16 rows][K / 32] */
__host__ __device__ __forceinline__ size_t wv_xs_bytes(int64_t K)
{
    return ((size_t)(K / 128) * WV_T * 4 + 15) & ~(size_t)15;
}
static size_t wv_smem_bytes(int64_t K, int W)
{
    return (size_t)WV_T * (size_t)K * 2 + wv_xs_bytes(K) + 64 + (size_t)W * 16 * (size_t)(K / 32);
}

/* grid: x = groups of W tiles (G = 1: 8 features a tile, W1's row as A row g, W3's as g + 8; G = 2: 16 rows
 * of W2), y = active-expert slot; codes as bcu_wg_code mode 1 (f16 values in B order) */
template <int G, int W, int PD>
__global__ void __launch_bounds__(32 * W, 12 / W) wv_kernel(bcu_wg_args a)
{
    pdl_enter(); /* the expert, its rows and their codes are the routing's and the code kernel's */
#if WG_ON
    extern __shared__ __align__(128) uint8_t smem[];
    const int e = a.act[blockIdx.y];
    if (e < 0) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int64_t K = G == 1 ? a.D : a.I;
    const int nch = (int)(K / 128), ku = (int)(K / 8); /* chunks; 16-byte units of a token's codes */
    const int64_t r0 = a.off[e], nrows = a.off[e + 1] - r0;
    __half *X = (__half *)smem;
    float *Xs = (float *)(smem + (size_t)WV_T * K * 2);
    uint4 *Z = (uint4 *)((uint8_t *)Xs + wv_xs_bytes(K)); /* 16-byte aligned: K is a multiple of 128 */
    const int nkb = 4 * nch;
    uint8_t *Ws = (uint8_t *)(Z + 4) + (size_t)warp * 16 * nkb; /* the warp's rows' scale bytes: row g, then g + 8 */
    const wg_rows wr = wg_rows_of<G>(a, e, K, 16 * W, warp, g);
    const uint8_t *const wA = wr.wA + 16 * q, *const wB = wr.wB + 16 * q;
    /* the weight scales of the warp's rows into shared memory once (cp.async: no registers held), 4 bytes a copy */
    for (int i = q; i < nch; i += 4) {
        cp4(smem_u32(Ws + g * nkb + 4 * i), wr.sA + 4 * i);
        cp4(smem_u32(Ws + (g + 8) * nkb + 4 * i), wr.sB + 4 * i);
    }
    rd_cp_commit();
    const uint32_t *const sA = (const uint32_t *)(Ws + g * nkb), *const sB = (const uint32_t *)(Ws + (g + 8) * nkb);
    const uint8_t *const csrc = G == 1 ? a.xc : a.hc;
    const float *const ssrc = G == 1 ? a.xs : a.hs;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    if (tid < 4) Z[tid] = zero;
    const int sh = 16 * (q & 1); /* the lane's two blocks of a chunk's scale word: 0, 1 (q even) or 2, 3 */
    bool gen = false;            /* a special scale byte in the warp's rows (the first pass finds out) */

    for (int64_t t0 = 0; t0 < nrows; t0 += WV_T) {
        const int ntk = nrows - t0 < WV_T ? (int)(nrows - t0) : WV_T;
        /* the pass's two activation rows, as the codes' addresses (a pass of one token: both the first) */
        const int64_t ra0 = r0 + t0, ra1 = r0 + t0 + (ntk > 1);
        const int64_t xr0 = G == 1 ? (int64_t)(a.sorted[ra0] / a.topk) : ra0;
        const int64_t xr1 = G == 1 ? (int64_t)(a.sorted[ra1] / a.topk) : ra1;
        const uint4 *const cx0 = (const uint4 *)(csrc + xr0 * K * 2), *const cx1 = (const uint4 *)(csrc + xr1 * K * 2);
        if (t0) __syncthreads(); /* the previous pass has read X and Xs */
        /* the codes' first loads, then the weights' ring, then the codes into shared memory (one round trip) */
        const int nu = ntk * ku;
        uint4 xv[4 * 4 / W];
#pragma unroll
        for (int k = 0; k < 4 * 4 / W; k++) {
            const int u = tid + 32 * W * k;
            xv[k] = u < nu ? __ldg(u < ku ? cx0 + u : cx1 + (u - ku)) : zero;
        }
        uint4 ra[PD], rb[PD];
#pragma unroll
        for (int p = 0; p < PD; p++) {
            const bool in = p < nch;
            ra[p] = in ? rd_ldg16_stream(wA + 64 * p) : zero;
            rb[p] = in ? rd_ldg16_stream(wB + 64 * p) : zero;
        }
#pragma unroll
        for (int k = 0; k < 4 * 4 / W; k++) {
            const int u = tid + 32 * W * k;
            if (u < nu) *(uint4 *)(X + 8 * (size_t)u) = xv[k];
        }
        for (int u = tid + 16 * 32; u < nu; u += 32 * W) { /* K past 4096 (T = 1) or 2048 (T = 2) */
            *(uint4 *)(X + 8 * (size_t)u) = __ldg(u < ku ? cx0 + u : cx1 + (u - ku));
        }
        for (int u = tid; u < nch * WV_T; u += 32 * W) {
            const int c = u / WV_T, t = u - c * WV_T;
            /* times 2^14: the weights' f16 placement */
            Xs[u] = t < ntk ? ssrc[(t ? xr1 : xr0) * nch + c] * 16384.0f : 0.0f;
        }
        rd_cp_wait_group<0>(); /* the weight scales (the first pass's; later passes have none in flight) */
        __syncthreads();
        /* dtype.c's special scale bytes 0 and 255 anywhere in the warp's rows: the general ue8m0 below for every
         * chunk (asked once here; per chunk it was ~15 of the loop's instructions) */
        if (!t0) {
            for (int i = lane; i < 4 * nch; i += 32) {
                const uint32_t va = ((const uint32_t *)Ws)[i];
                gen |= (has_byte0(va) | has_byte0(~va)) != 0;
            }
            gen = __any_sync(0xffffffffu, gen);
        }

        /* the lane's B column g: token g / 4, block g % 4, codes only where that block is the lane's own */
        const bool bl = (g & 3) == q && (g >> 2) < ntk;
        const __half *xp = bl ? X + (size_t)(g >> 2) * K + 32 * q : (const __half *)Z;
        const int xst = bl ? 128 : 0;
        const float *xsp = Xs + (q >> 1);
        float acc0 = 0.0f, acc1 = 0.0f; /* rows g, g + 8 for token q / 2 (the odd lanes') */
        for (int base = 0; base < nch; base += PD) {
#pragma unroll
            for (int p = 0; p < PD; p++) {
                const int c = base + p;
                if (c >= nch) break; /* warp-uniform */
                const uint4 *xq = (const uint4 *)(xp + c * xst);
                const uint4 x0 = xq[0], x1 = xq[1], x2 = xq[2], x3 = xq[3];
                const uint32_t xw[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                                         x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
                /* two chains of four mmas (words 0, 1 and 2, 3), added at the end: the same exact sums, half the
                 * dependent latency */
                float P[4] = {0.0f, 0.0f, 0.0f, 0.0f}, Q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int i = 0; i < 4; i++) { /* word i: columns 8i .. 8i + 7 of the block; even, then odd ones */
                    const uint32_t ua = word_of(ra[p], i), ub = word_of(rb[p], i);
                    const uint32_t la = hb_lo(ua), lb = hb_lo(ub), ha = hb_hi(ua), hb = hb_hi(ub);
                    const uint32_t A0[4] = {h2_01(la), h2_01(lb), h2_23(la), h2_23(lb)};
                    const uint32_t A1[4] = {h2_01(ha), h2_01(hb), h2_23(ha), h2_23(hb)};
                    rd_mma_h(i < 2 ? P : Q, A0, xw[i], xw[4 + i]);
                    rd_mma_h(i < 2 ? P : Q, A1, xw[8 + i], xw[12 + i]);
                }
#pragma unroll
                for (int k = 0; k < 4; k++) P[k] += Q[k];
                if (c + PD < nch) { /* the slot is free: chunk c + PD into it */
                    ra[p] = rd_ldg16_stream(wA + 64 * (c + PD));
                    rb[p] = rd_ldg16_stream(wB + 64 * (c + PD));
                }
                const uint32_t swa = sA[c], swb = sB[c];
                float fa0, fa1, fb0, fb1; /* the weight scales of the lane's two blocks: 2^(b - 127) */
                if (!gen) {
                    fa0 = __uint_as_float(((swa >> sh) & 255u) << 23);
                    fa1 = __uint_as_float(((swa >> (sh + 8)) & 255u) << 23);
                    fb0 = __uint_as_float(((swb >> sh) & 255u) << 23);
                    fb1 = __uint_as_float(((swb >> (sh + 8)) & 255u) << 23);
                } else {
                    fa0 = ue8m0((swa >> sh) & 255u);
                    fa1 = ue8m0((swa >> (sh + 8)) & 255u);
                    fb0 = ue8m0((swb >> sh) & 255u);
                    fb1 = ue8m0((swb >> (sh + 8)) & 255u);
                }
                /* blocks 0, 1 (even lanes), passed to the odd lane, which adds blocks 2, 3 and scales the chunk */
                const float eA = fmaf(P[1], fa1, __fmul_rn(P[0], fa0)), eB = fmaf(P[3], fb1, __fmul_rn(P[2], fb0));
                const float pA = __shfl_xor_sync(0xffffffffu, eA, 1), pB = __shfl_xor_sync(0xffffffffu, eB, 1);
                const float xsc = xsp[c * WV_T];
                acc0 = fmaf(fmaf(P[1], fa1, fmaf(P[0], fa0, pA)), xsc, acc0);
                acc1 = fmaf(fmaf(P[3], fb1, fmaf(P[2], fb0, pB)), xsc, acc1);
            }
        }
        const int t = q >> 1;
        if ((q & 1) && t < ntk) {
            const int64_t row = r0 + t0 + t;
            wg_store<G>(a, row, wr, acc0, acc1, G == 1 && a.official ? a.w[a.sorted[row]] : 1.0f);
        }
    }
#endif
}

template <int G> cudaError_t wt_launch(const bcu_wg_args *a, unsigned n_tiles, cudaStream_t st)
{
    static int attr_done;
    if (!attr_done) {
        cudaError_t r = cudaFuncSetAttribute(wt_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, WT_SMEM);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    const unsigned gx = (unsigned)(G == 1 ? a->I / (WT_ROWS / 2) : a->D / WT_ROWS);
    pdl_launch(wt_kernel<G>, dim3(gx, n_tiles), WT_THREADS, WT_SMEM, st, *a);
    return cudaGetLastError();
}

template <int G, int W, int PD> cudaError_t wv_launch_w(const bcu_wg_args *a, unsigned n_slots, cudaStream_t st)
{
    static int attr_done;
    if (!attr_done) {
        cudaError_t r =
            cudaFuncSetAttribute(wv_kernel<G, W, PD>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    const size_t smem = wv_smem_bytes(G == 1 ? a->D : a->I, W);
    if (smem > 227 * 1024) return cudaErrorInvalidValue;
    const unsigned gx = (unsigned)(G == 1 ? a->I / (8 * W) : a->D / (16 * W));
    pdl_launch(wv_kernel<G, W, PD>, dim3(gx, n_slots), 32 * W, smem, st, *a);
    return cudaGetLastError();
}

/* an environment variable's first character, read once into cache (0: unset) */
static int env_char_once(std::atomic<int> &cache, const char *name)
{
    int v = cache.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv(name);
        v = e ? (unsigned char)*e : 0;
        cache.store(v, std::memory_order_relaxed);
    }
    return v;
}

template <int G> cudaError_t wv_launch(const bcu_wg_args *a, unsigned n_slots, cudaStream_t st)
{
    static std::atomic<int> warps(-1), depth(-1);
    if (env_char_once(warps, "DEEPINFER_CUDA_WV_WARPS") == '4') return wv_launch_w<G, 4, WV_PD>(a, n_slots, st);
    if (env_char_once(depth, "DEEPINFER_CUDA_WV_PD") == '8') return wv_launch_w<G, WV_WARPS, 8>(a, n_slots, st);
    return wv_launch_w<G, WV_WARPS, WV_PD>(a, n_slots, st);
}

size_t wg_smem_bytes(int64_t K, int f16, int stages)
{
    return (size_t)(WG_WIN / 32) * (f16 ? 512 : 256) + (size_t)(K / 128) * WG_N * 4 +
           4 * (size_t)stages * WG_STAGE_BYTES;
}

template <int G, int F16, int ST> cudaError_t wg_launch_st(const bcu_wg_args *a, unsigned n_slots, cudaStream_t st)
{
    static int attr_done; /* above 48 KB a kernel must ask for its dynamic shared memory */
    if (!attr_done) {
        cudaError_t r = cudaFuncSetAttribute(wg_kernel<G, F16, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    const size_t smem = wg_smem_bytes(G == 1 ? a->D : a->I, F16, ST);
    if (smem > 227 * 1024) return cudaErrorInvalidValue;
    const unsigned gx = (unsigned)(G == 1 ? a->I / 32 : a->D / 64);
    pdl_launch(wg_kernel<G, F16, ST>, dim3(gx, n_slots), WG_THREADS, smem, st, *a);
    return cudaGetLastError();
}

/* A grid of at most three blocks an SM (a decode batch of a token or two: 6 experts x 64 blocks at top-6) leaves
 * shared memory to spare and few warps to hide the weights' latency: its warps keep WG_STAGES_DEEP chunks in
 * flight instead of WG_STAGES (DEEPINFER_CUDA_WG_DEEP=0, read once: never).  The ring's depth moves no output
 * bit.  f16 only: on the H200 slice the bf16 maths' e4m3 experts measured no gain (batch 1 1.235 -> 1.241 ms). */
template <int G, int F16> cudaError_t wg_launch(const bcu_wg_args *a, unsigned n_slots, cudaStream_t st)
{
    static std::atomic<int> deep(-1); /* -1: not read yet */
    int on = deep.load(std::memory_order_relaxed);
    if (on < 0) {
        const char *e = getenv("DEEPINFER_CUDA_WG_DEEP");
        on = !(e && *e == '0');
        deep.store(on, std::memory_order_relaxed);
    }
    const int64_t blocks = (int64_t)(G == 1 ? a->I / 32 : a->D / 64) * n_slots;
    if (F16 && on && WG_STAGES_DEEP > WG_STAGES && blocks <= 3 * (int64_t)bcu_sm_count())
        return wg_launch_st<G, F16, WG_STAGES_DEEP>(a, n_slots, st);
    return wg_launch_st<G, F16, WG_STAGES>(a, n_slots, st);
}

} /* namespace */

extern "C" int bcu_wg_available(void)
{
    static int cached = -1; /* one device per process here */
    if (cached >= 0) return cached;
    int dev = 0, major = 0, minor = 0;
    cudaFuncAttributes fa;
    int ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
             minor == 0 && cudaFuncGetAttributes(&fa, wg_kernel<1, 1, WG_STAGES>) == cudaSuccess;
    (void)cudaGetLastError();
    cached = ok;
    return ok;
}

extern "C" cudaError_t bcu_wg_code(const float *x, int64_t R, int64_t K, int mode, uint8_t *codes, float *scales,
                                   float *writeback, cudaStream_t st)
{
    if (R < 0 || K <= 0 || K % 128 || !x || !codes || (mode != 2 && !scales) || mode < 0 || mode > 3)
        return cudaErrorInvalidValue;
    if (R == 0) return cudaSuccess;
    const int64_t rows = mode == 3 ? (R + BCU_FT_TOK - 1) / BCU_FT_TOK * BCU_FT_TOK : R; /* mode 3: whole tiles */
    const int64_t threads = rows * (K / 128) * 32, need = (threads + 255) / 256, fill = (int64_t)bcu_sm_count() * 8;
    const unsigned grid = (unsigned)(need < fill ? need : fill); /* 8 blocks of 256: a full SM's warps */
    if (mode == 2) pdl_launch(wg_code_kernel<2>, grid, 256, 0, st, x, R, K, codes, (float *)NULL, writeback);
    else if (mode == 3) pdl_launch(wg_code_kernel<3>, grid, 256, 0, st, x, R, K, codes, scales, writeback);
    else if (mode == 1) pdl_launch(wg_code_kernel<1>, grid, 256, 0, st, x, R, K, codes, scales, writeback);
    else pdl_launch(wg_code_kernel<0>, grid, 256, 0, st, x, R, K, codes, scales, writeback);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_wg_stage(const bcu_wg_args *a, int g, unsigned n_slots, cudaStream_t st)
{
    if (!a || (g != 1 && g != 2) || a->D <= 0 || a->I <= 0 || a->D % 128 || a->I % 128) return cudaErrorInvalidValue;
    if (!n_slots) return cudaSuccess;
    if (g == 1) return a->f16 ? wg_launch<1, 1>(a, n_slots, st) : wg_launch<1, 0>(a, n_slots, st);
    return a->f16 ? wg_launch<2, 1>(a, n_slots, st) : wg_launch<2, 0>(a, n_slots, st);
}

extern "C" cudaError_t bcu_wg_gemv(const bcu_wg_args *a, int g, unsigned n_slots, cudaStream_t st)
{
    if (!a || (g != 1 && g != 2) || a->D <= 0 || a->I <= 0 || a->D % 128 || a->I % 128) return cudaErrorInvalidValue;
    if (!n_slots) return cudaSuccess;
    return g == 1 ? wv_launch<1>(a, n_slots, st) : wv_launch<2>(a, n_slots, st);
}

extern "C" cudaError_t bcu_wg_tiles(const bcu_wg_args *a, int g, unsigned n_tiles, cudaStream_t st)
{
    if (!a || (g != 1 && g != 2) || a->D <= 0 || a->I <= 0 || a->D % WT_ROWS || a->I % (WT_ROWS / 2) ||
        !a->tile_e || !a->tile_r0)
        return cudaErrorInvalidValue;
    if (!n_tiles) return cudaSuccess;
    return g == 1 ? wt_launch<1>(a, n_tiles, st) : wt_launch<2>(a, n_tiles, st);
}

extern "C" cudaError_t bcu_wg_probe(int f16, const uint32_t *a, const uint8_t *b, float *d)
{
    if (f16) wg_probe_kernel<1><<<1, WG_THREADS>>>(a, b, d);
    else wg_probe_kernel<0><<<1, WG_THREADS>>>(a, b, d);
    cudaError_t r = cudaGetLastError();
    return r != cudaSuccess ? r : cudaDeviceSynchronize();
}
