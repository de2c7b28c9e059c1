/* fp8_tile.cu - the FP8 linears of act_quant'd decode batches on wgmma (sm_90a): fp8_tile.h.
 *
 * Built for sm_90a alone, as moe_wg.cu (CMakeLists.txt's cuda_wg), so bcu_wg_available() tells whether it runs.
 *
 * The sums.  Official semantics quantise x to e4m3 codes with a power-of-two scale per 128 columns, and an FP8
 * weight is e4m3 codes with a ue8m0 scale per 128 x 128 block.  Every e4m3 value is an f16 value, so both codes go
 * into f16 wgmma operands as they are (the weight by one cvt.rn.f16x2.e4m3x2 per pair) and their products are
 * exact; a 128-column chunk's sums start from zero, the tensor core adds them in fp32, and the chunk's sum is then
 * scaled by the weight block's scale times the token's activation scale (a power of two: exact) into an fp32
 * accumulator, chunk after chunk.  That is DeepSeek's FP8 GEMM's structure (block sums promoted into fp32) with
 * the block sums' products exact where its e4m3 tensor core keeps ~13 bits; against the dequantised GEMM it
 * replaces (cuBLAS on a bf16 copy of the weight) it is the same values added in another order.
 *
 * The layout.  A block is two warpgroups: 128 weight rows (one 128-row scale block; 64 a warpgroup, the wgmma's
 * m) against up to 64 tokens (the wgmma's n, rounded up to 16), over a slice of the chunks, in a ring of three
 * chunks (two in flight while one is read; two blocks an SM).  Thread 0 fills a stage with three copies onto its
 * mbarrier.  The weights come as one TMA box of 128 rows x 128 bytes (a tensor map of the weight, the 128-byte
 * swizzle applied, rows past n zeros), so lane (g, q) reads the 32 bytes of its rows g and g + 8 as 16-byte pieces
 * 2 q ^ g and 2 q + 1 ^ g without bank conflicts; those 32 bytes of a chunk row are the lane's A fragments for all
 * eight k16 steps: word s of them is columns 32 q + 4 s .. + 3, its low pair k positions 2 q, 2 q + 1 of step s
 * (a0 / a1), its high pair 8 + 2 q, 9 + 2 q (a2 / a3).  The activations follow that order: bcu_wg_code mode 3
 * writes each (64-token tile, chunk) as the 16 KB stage image itself (step s at byte 32 (s % 4) of 128-byte swizzle
 * atom s / 4, the swizzle applied, the tile's rows past T zeros) and its 64 scales, two bulk copies.  No thread
 * copies anything else and no proxy fence comes before the wgmmas.  The weights of the first chunks are asked for
 * before the PDL wait (nothing writes them).
 *
 * Measured on the way (H200, bench_gpu_fp8_tiles, T = 64): the first version (one warpgroup and 64 rows a block,
 * four stages, B copied by every thread from a row-major code buffer) took 56.8 us on wq_b and 59.3 on wo_b, now
 * 24.3 and 28.5; B's stage image copied by every thread with cp.async instead of the two bulk copies, 32 us on
 * wq_b; the weights as 128 bulk copies of a row, 10-35% slower than the cp.async of every thread, which the TMA box
 * beats by 3-13% (wq_b at T = 128 30.7 -> 27.4 us, wo_b 44.1 -> 39.5).  Not taken (docs/CUDA.md): the next chunk's
 * wgmmas running while the last one's sums are scaled (two accumulator sets: ptxas serialises wgmmas around any
 * read of an accumulator while another is in flight, warning C7514); the e4m3 -> f16 decode by bit logic instead
 * of cvt (measured no faster); persistent clusters at one block an SM; the scales folded into the f16 operands so
 * that one accumulator runs over K (no faster: the loads, not the maths, set a call's time).
 *
 * The grid: x = slices of K (a thread-block cluster of up to 8, so that a narrow weight still fills the GPU: the
 * slices' accumulators meet in distributed shared memory and are added in slice order), y = tiles of 64 tokens,
 * z = tiles of 128 rows; the token tiles of a row tile run side by side, so its weights come from HBM once. */
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdlib.h>

#include <atomic>
#include <type_traits>

#include "backend/cuda/fp8_tile.h"
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/moe_ops.cuh"
#include "backend/cuda/moe_wg.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sm_count.cuh"
#include "backend/cuda/wgmma.cuh"

#define FT_WG 2                     /* warpgroups a block */
#define FT_THREADS (128 * FT_WG)
#define FT_ROWS (64 * FT_WG)         /* weight rows a block: the wgmma's m for each warpgroup */
#define FT_TOK BCU_FT_TOK            /* tokens a tile */
#define FT_STAGES 3                  /* chunks in the ring: two loading while one is read */
#define FT_BSTAGE BCU_FT_IMAGE       /* a chunk of B: [k atom 2][token 64][128 bytes, swizzled] */
#define FT_WSTAGE (FT_ROWS * 128)    /* a chunk of the weights: [row 128][128 bytes, 128B-swizzled] (one TMA box) */
#define FT_RPITCH (FT_ROWS + 4)      /* floats a token takes in the slices' sums */
#define FT_MAXCH 512                 /* chunks a slice may have (K up to 65536) */
#define FT_SMEM (FT_STAGES * (FT_BSTAGE + FT_WSTAGE + FT_TOK * 4) + FT_MAXCH * 4 + FT_STAGES * 8 + 1024)
static_assert(FT_STAGES * FT_BSTAGE >= FT_RPITCH * FT_TOK * 4, "the slices' sums reuse B's ring");

namespace {

#if WG_ON
/* d (+)= A B: m64nNNk16, A (f16) from registers, B (f16, K-major, 128-byte swizzle) through a descriptor; the
 * instruction names the first NN / 2 of d's 32 registers; ACC 0: d = A B, 1: d += A B */
#define FT_MMA(n)                                                                                                    \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.f16.f16 {" WT_D##n "}, "                          \
                 "{%32, %33, %34, %35}, %36, %37, 1, 1, 0;\n"                                                      \
                 : WT_F8(0), WT_F8(8), WT_F8(16), WT_F8(24)                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ACC))
template <int NN, int ACC> __device__ __forceinline__ void ft_mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc)
{
    static_assert(NN % 16 == 0 && NN >= 16 && NN <= 64, "n: a multiple of 16 up to 64");
    if constexpr (NN == 16) FT_MMA(16);
    else if constexpr (NN == 32) FT_MMA(32);
    else if constexpr (NN == 48) FT_MMA(48);
    else FT_MMA(64);
}

/* an mbarrier in shared memory: count arrivals a phase */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* this thread's arrival, and bytes more for the phase to wait for */
__device__ __forceinline__ void mbar_expect(uint32_t bar, int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* until the phase of parity ph has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int ph)
{
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(bar), "r"(ph)
                     : "memory");
}
/* bytes (a multiple of 16) from global to shared memory by the copy engine, counted on the mbarrier bar */
__device__ __forceinline__ void bulk_in(uint32_t dst, const void *src, int bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* the box at (column x, row y) of the tensor map tm into dst (1 KB aligned for the 128-byte swizzle), counted on bar */
__device__ __forceinline__ void tma_in(uint32_t dst, const CUtensorMap *tm, int x, int y, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst), "l"(tm), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
#endif

/* grid: x = K slices (the cluster), y = token tiles, z = row tiles */
__global__ void __launch_bounds__(FT_THREADS, 2) ft_kernel(bcu_ft_args a, const __grid_constant__ CUtensorMap tw)
{
#if WG_ON
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t *bring = smem + ((1024u - (smem_u32(smem) & 1023u)) & 1023u); /* 128B-swizzle atoms: 1 KB aligned */
    uint8_t *wring = bring + FT_STAGES * FT_BSTAGE;               /* a chunk of the block's weight rows */
    float *xring = (float *)(wring + FT_STAGES * FT_WSTAGE);      /* a chunk's activation scales, a float a token */
    float *swf = xring + FT_STAGES * FT_TOK;                      /* the slice's weight scales, a float a chunk */
    const uint32_t full = smem_u32(swf + FT_MAXCH);               /* a stage's mbarrier (8 bytes each) */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int ks = (int)gridDim.x, kr = (int)blockIdx.x;
    const int64_t tile = blockIdx.y, t0 = tile * FT_TOK, r0 = (int64_t)blockIdx.z * FT_ROWS;
    const int ntk = a.T - t0 < FT_TOK ? (int)(a.T - t0) : FT_TOK;
    const int nch = (int)(a.K / 128), c0 = (int)((int64_t)kr * nch / ks), nc = (int)((int64_t)(kr + 1) * nch / ks) - c0;

    /* A stage is one mbarrier phase for three copies by thread 0: the weights' 128 x 128-byte box by the tensor map
     * (rows past n zeros), the 128-byte swizzle applied, so that lane (g, q)'s 32 bytes of rows g and g + 8 are
     * pieces 2 q ^ g and 2 q + 1 ^ g, conflict-free; B's stage image and its 64 scales as bcu_wg_code mode 3 left
     * them (the tile's rows past T are zeros).  The weights' copy is asked for first (before the PDL wait in the
     * prologue: nothing writes them), with the phase's whole byte count. */
    const uint8_t *bsrc = (const uint8_t *)a.xc + (tile * nch + c0) * FT_BSTAGE;
    const float *xsrc = a.xs + (tile * nch + c0) * FT_TOK;
    auto issue_w = [&](int i, int st) {
        mbar_expect(full + 8 * st, FT_WSTAGE + FT_BSTAGE + FT_TOK * 4);
        tma_in(smem_u32(wring) + st * FT_WSTAGE, &tw, (c0 + i) * 128, (int)r0, full + 8 * st);
    };
    auto issue_b = [&](int i, int st) {
        bulk_in(smem_u32(bring) + st * FT_BSTAGE, bsrc + (int64_t)i * FT_BSTAGE, FT_BSTAGE, full + 8 * st);
        bulk_in(smem_u32(xring + st * FT_TOK), xsrc + (int64_t)i * FT_TOK, FT_TOK * 4, full + 8 * st);
    };
    constexpr int LA = FT_STAGES - 1; /* chunks asked for ahead of the one in use */
    if (!tid) {
        for (int i = 0; i < FT_STAGES; i++) mbar_init(full + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int i = 0; i < LA && i < nc; i++) issue_w(i, i);
    }
    const uint8_t *wsr = a.ws + (r0 / 128) * a.nsb + c0;
    for (int i = tid; i < nc; i += FT_THREADS) swf[i] = ue8m0(wsr[i]);
    __syncthreads(); /* the mbarriers before anyone waits on them, the weight scales */
    pdl_enter();     /* x's codes and scales are the code kernel's */
    if (!tid)
        for (int i = 0; i < LA && i < nc; i++) issue_b(i, i);

    auto run = [&](auto nn) {
        constexpr int NN = decltype(nn)::value;
        float acc[32], dd[32];
#pragma unroll
        for (int i = 0; i < 32; i++) acc[i] = dd[i] = 0.0f;
        for (int i = 0, st = 0, ph = 0; i < nc; i++) { /* st: chunk i's stage, ph: the parity of its use */
            __syncthreads(); /* everyone done with chunk i - 1's stage */
            if (!tid && i + LA < nc) { /* into chunk i - 1's stage */
                const int sn = st ? st - 1 : FT_STAGES - 1;
                issue_w(i + LA, sn);
                issue_b(i + LA, sn);
            }
            mbar_wait(full + 8 * st, ph); /* chunk i's weights, B and scales */
            /* lane (g, q)'s A fragments: bytes 32 q .. + 31 of its rows g and g + 8 (warp w: rows 16 w ..), 16-byte
             * pieces 2 q and 2 q + 1 at slots piece ^ g (both rows are g mod 8) */
            const uint8_t *ws = wring + st * FT_WSTAGE + (16 * warp + g) * 128;
            const int p0 = ((2 * q) ^ g) << 4, p1 = ((2 * q + 1) ^ g) << 4;
            const uint4 u0 = *(const uint4 *)(ws + p0), u1 = *(const uint4 *)(ws + p1);
            const uint4 v0 = *(const uint4 *)(ws + 8 * 128 + p0), v1 = *(const uint4 *)(ws + 8 * 128 + p1);
            const uint32_t wa[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
            const uint32_t wb[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
            uint32_t A[8][4];
#pragma unroll
            for (int s = 0; s < 8; s++) { /* one cvt a pair (a bit-logic decode, code * 2^-8, measured slower) */
                A[s][0] = rd_e4m3x2_h(wa[s]);
                A[s][1] = rd_e4m3x2_h(wb[s]);
                A[s][2] = rd_e4m3x2_h(wa[s] >> 16);
                A[s][3] = rd_e4m3x2_h(wb[s] >> 16);
            }
            /* the descriptors differ in their address field alone (bits 0..13, in 16 bytes; B's ring is under 256 KB,
             * so adding to the low word never carries out of it) */
            const uint64_t d0 = wt_desc(smem_u32(bring) + st * FT_BSTAGE);
            const uint32_t dlo = (uint32_t)d0, dhi = (uint32_t)(d0 >> 32);
            wg_fence();
            ft_mma<NN, 0>(dd, A[0], d0);
#pragma unroll
            for (int s = 1; s < 8; s++) {
                const uint32_t off = (uint32_t)((s >> 2) * (FT_TOK * 128) + (s & 3) * 32) >> 4; /* in 16 bytes */
                ft_mma<NN, 1>(dd, A[s], (uint64_t)dhi << 32 | (dlo + off));
            }
            wg_commit();
            wg_wait<0>();
            wg_hold_all(dd);
            /* dd[4 j + i]: row g (i < 2) or g + 8, token 8 j + 2 q + (i & 1) */
            const float fw = swf[i];
            const float *xs = xring + st * FT_TOK;
#pragma unroll
            for (int j = 0; j < NN / 8; j++) {
                const float2 x2 = *(const float2 *)(xs + 8 * j + 2 * q);
                const float f0 = __fmul_rn(fw, x2.x), f1 = __fmul_rn(fw, x2.y);
                acc[4 * j] = fmaf(dd[4 * j], f0, acc[4 * j]);
                acc[4 * j + 1] = fmaf(dd[4 * j + 1], f1, acc[4 * j + 1]);
                acc[4 * j + 2] = fmaf(dd[4 * j + 2], f0, acc[4 * j + 2]);
                acc[4 * j + 3] = fmaf(dd[4 * j + 3], f1, acc[4 * j + 3]);
            }
            if (++st == FT_STAGES) {
                st = 0;
                ph ^= 1;
            }
        }
        const int64_t rA = r0 + 16 * warp + g, rB = rA + 8;
        if (ks == 1) {
            wg_each_token<NN>(acc, q, ntk, [&](int tk, float vA, float vB) {
                float *yr = a.y + (t0 + tk) * a.ldy;
                if (rA < a.n) yr[rA] = vA;
                if (rB < a.n) yr[rB] = vB;
            });
            return;
        }
        /* the slices' sums: each block's into its own B ring as [token][row], then block kr adds its share of the
         * tile's outputs over the slices in slice order */
        float *red = (float *)bring; /* [token][FT_RPITCH]: lanes q of a row group 8 banks apart */
        __syncthreads();             /* every warp's last wgmma has read B */
#pragma unroll
        for (int j = 0; j < NN / 8; j++)
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int tk = 8 * j + 2 * q + u;
                red[tk * FT_RPITCH + 16 * warp + g] = acc[4 * j + u];
                red[tk * FT_RPITCH + 16 * warp + g + 8] = acc[4 * j + 2 + u];
            }
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        cl.sync();
        /* a float4 of four rows a thread and step: block kr takes the kr-th of ks runs of the tile's ntk x 32 */
        const float4 *peer[8];
#pragma unroll
        for (int r = 0; r < 8; r++) peer[r] = (const float4 *)cl.map_shared_rank(red, (unsigned)(r < ks ? r : 0));
        const int tot = ntk * (FT_ROWS / 4), per = (tot + ks - 1) / ks;
        const int e1 = (kr + 1) * per < tot ? (kr + 1) * per : tot;
        for (int o = kr * per + tid; o < e1; o += FT_THREADS) {
            const int tk = o / (FT_ROWS / 4), rl = 4 * (o - tk * (FT_ROWS / 4)), ro = (tk * FT_RPITCH + rl) / 4;
            float4 sum = peer[0][ro];
#pragma unroll
            for (int r = 1; r < 8; r++)
                if (r < ks) {
                    const float4 v = peer[r][ro];
                    sum.x += v.x;
                    sum.y += v.y;
                    sum.z += v.z;
                    sum.w += v.w;
                }
            float *yo = a.y + (t0 + tk) * a.ldy + r0 + rl;
            if (r0 + rl + 3 < a.n && !(((uintptr_t)yo) & 15u)) {
                *(float4 *)yo = sum;
            } else {
                const float sv[4] = {sum.x, sum.y, sum.z, sum.w};
                for (int j = 0; j < 4; j++)
                    if (r0 + rl + j < a.n) yo[j] = sv[j];
            }
        }
        cl.sync(); /* the peers' sums stay until every block has read them */
    };
    switch ((ntk + 15) >> 4) { /* the wgmma's n */
    case 1: run(std::integral_constant<int, 16>{}); break;
    case 2: run(std::integral_constant<int, 32>{}); break;
    case 3: run(std::integral_constant<int, 48>{}); break;
    default: run(std::integral_constant<int, 64>{}); break;
    }
#endif
}

} // namespace

/* bytes of x's stage images (bcu_wg_code mode 3): a 16 KB image a (64-token tile, chunk) */
static size_t ft_code_bytes(int64_t T, int64_t K)
{
    return (size_t)((T + FT_TOK - 1) / FT_TOK) * (size_t)(K / 128) * FT_BSTAGE;
}

extern "C" size_t bcu_ft_scratch(int64_t T, int64_t K)
{
    return ft_code_bytes(T, K) + (size_t)((T + FT_TOK - 1) / FT_TOK) * (size_t)(K / 128) * FT_TOK * 4;
}

/* The K split: the most slices (1, 2, 4 or 8) that keep at least four chunks a slice and a grid of at most two
 * blocks an SM in clusters of one or two, one block an SM in clusters of four or eight.  Measured on the H200
 * (bench_gpu_fp8_tiles with each split forced, docs/BENCHMARKS.md): clusters of four or eight past one block an SM
 * ran 1.3-1.5x slower than half as many slices (wo_b at T = 256: 59.7 us in clusters of four, 43.3 in pairs), where
 * pairs and single blocks gain from the second block an SM (wo_b at T = 256 alone: 69.0 us); and the old rule (split
 * while under two blocks an SM) cut wq_b at T = 17 into pairs, 19.5 us against 14.6.  DEEPINFER_CUDA_FT_KS = 1, 2, 4
 * or 8 forces the split wherever K has that many chunks (read at the first call; bcu_ft_force_splits sets it later). */
static int ft_ks_valid(int k)
{
    return k == 1 || k == 2 || k == 4 || k == 8;
}
static std::atomic<int> ft_forced{-1}; /* -1: DEEPINFER_CUDA_FT_KS not read yet */
static int ft_force_ks(void)
{
    int k = ft_forced.load(std::memory_order_relaxed);
    if (k < 0) {
        const char *e = getenv("DEEPINFER_CUDA_FT_KS");
        const int v = e ? atoi(e) : 0;
        int expect = -1;
        ft_forced.compare_exchange_strong(expect, ft_ks_valid(v) ? v : 0);
        k = ft_forced.load(std::memory_order_relaxed);
    }
    return k;
}

extern "C" int bcu_ft_force_splits(int ks)
{
    if (ks != 0 && !ft_ks_valid(ks)) return -1;
    ft_forced.store(ks, std::memory_order_relaxed);
    return 0;
}

extern "C" int bcu_ft_splits(int64_t T, int64_t n, int64_t K)
{
    const int64_t blocks = ((T + FT_TOK - 1) / FT_TOK) * ((n + FT_ROWS - 1) / FT_ROWS), nch = K / 128;
    const int64_t sms = bcu_sm_count();
    int ks = ft_force_ks();
    if (ks) {
        while (ks > 1 && nch < ks) ks /= 2;
        return ks;
    }
    ks = 1;
    for (int k = 2; k <= 8; k *= 2)
        if (nch >= 4 * (int64_t)k && blocks * k <= (k >= 4 ? 1 : 2) * sms) ks = k;
    return ks;
}

/* the driver's cuTensorMapEncodeTiled (through the runtime: no link to libcuda), NULL where there is none; looked up
 * once a process (a function-local static: thread-safe initialisation) */
static PFN_cuTensorMapEncodeTiled_v12000 ft_encoder(void)
{
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = NULL;
        (void)cudaGetLastError();
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

extern "C" cudaError_t bcu_ft_launch(const bcu_ft_args *a, cudaStream_t st)
{
    if (!a || a->T < 1 || a->n < 1 || a->K < 128 || a->K % 128 || a->ldy < a->n)
        return cudaErrorInvalidValue;
    if (!bcu_wg_available()) return cudaErrorNotSupported;
    static int attr_done;
    if (!attr_done) {
        const cudaError_t r = cudaFuncSetAttribute(ft_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, FT_SMEM);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    /* the weights as a tensor of n rows of K bytes, in boxes of 128 x 128 (a chunk of a row tile) */
    PFN_cuTensorMapEncodeTiled_v12000 enc = ft_encoder();
    if (!enc || ((uintptr_t)a->w & 15u)) return cudaErrorNotSupported;
    CUtensorMap tw;
    const cuuint64_t dims[2] = {(cuuint64_t)a->K, (cuuint64_t)a->n}, strides[1] = {(cuuint64_t)a->K};
    const cuuint32_t box[2] = {128, FT_ROWS}, es[2] = {1, 1};
    if (enc(&tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)a->w, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return cudaErrorNotSupported;
    const int ks = bcu_ft_splits(a->T, a->n, a->K);
    if ((a->K / 128 + ks - 1) / ks > FT_MAXCH) return cudaErrorInvalidValue; /* a slice's weight scales */
    const int64_t tt = (a->T + FT_TOK - 1) / FT_TOK, rt = (a->n + FT_ROWS - 1) / FT_ROWS;
    if (tt > 65535 || rt > 65535) return cudaErrorInvalidValue;
    cudaLaunchConfig_t cfg = launch_cfg(dim3((unsigned)ks, (unsigned)tt, (unsigned)rt), FT_THREADS, FT_SMEM, st);
    cudaLaunchAttribute at[2] = {};
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)ks;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = ks > 1; /* a cluster only where the slices meet */
    pdl_attr(&cfg, at);
    const cudaError_t r = cudaLaunchKernelEx(&cfg, ft_kernel, *a, tw);
    return r != cudaSuccess ? r : cudaGetLastError();
}

extern "C" cudaError_t bcu_ft_linear(float *y, int64_t ldy, const float *x, int64_t T, int64_t K, const uint8_t *w,
                                     const uint8_t *ws, int64_t n, void *scratch, cudaStream_t st)
{
    if (!y || !x || !w || !ws || !scratch || T < 1 || n < 1 || K < 128 || K % 128 || ((uintptr_t)x & 15u))
        return cudaErrorInvalidValue;
    /* where the weights' tensor map cannot be made, before any work */
    if (!bcu_wg_available() || !ft_encoder() || ((uintptr_t)w & 15u)) return cudaErrorNotSupported;
    bcu_ft_args a = {};
    a.w = w;
    a.ws = ws;
    a.n = n;
    a.K = K;
    a.nsb = K / 128;
    a.xc = (const uint16_t *)scratch;
    a.xs = (const float *)((char *)scratch + ft_code_bytes(T, K));
    a.T = T;
    a.y = y;
    a.ldy = ldy;
    const cudaError_t r = bcu_wg_code(x, T, K, 3, (uint8_t *)a.xc, (float *)a.xs, NULL, st);
    if (r != cudaSuccess) return r;
    return bcu_ft_launch(&a, st);
}
