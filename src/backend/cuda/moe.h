/* moe.h - the routed experts of a V4 MoE layer on the GPU, grouped over
 * experts, with the FP4 expert weights decoded inside the kernels.
 *
 *   y[t] = sum_{k < topk} w[t,k] * W2_e . swiglu(W1_e x[t], W3_e x[t]),  e = ids[t,k]
 *
 * with the clamped SwiGLU of src/model/v4.c (g = min(g, limit), u = clamp(u,
 * -limit, limit), h = g / (1 + exp(-g)) * u) and its two ways of applying the
 * routing weight.  Everything runs on the stream the caller gives, from
 * device pointers, with no host round trip and no allocation: the caller
 * passes a workspace of bcu_moe_workspace_bytes().  The shared expert and the
 * routing itself (gate, top-k) are not here.  docs/CUDA.md, section "Grouped
 * FP4 expert FFN", tells the design and the measured speed. */
#ifndef BACKEND_CUDA_MOE_H
#define BACKEND_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BCU_MOE_BLOCK 32        /* ue8m0 scale block along the input dim (V4: 1 x 32) */
#define BCU_MOE_MAX_EXPERTS 512 /* the routing kernel keeps one counter per expert and per chunk */
#define BCU_MOE_MAX_TOPK 16
#define BCU_MOE_TILE_M 128      /* rows (token, expert pairs) per tile of the tiled kernels, at most */

/* An expert's cnt rows are cut into ceil(cnt / BCU_MOE_TILE_M) tiles of this many rows each (the last one shorter by
 * fewer rows than there are tiles): 130 rows are 65 + 65, not 128 + 2, so no tile wastes a weight pass on a few rows */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int64_t bcu_moe_tile_span(int64_t cnt)
{
    const int64_t nt = (cnt + BCU_MOE_TILE_M - 1) / BCU_MOE_TILE_M;
    return nt > 0 ? (cnt + nt - 1) / nt : 0;
}

/* One layer's routed experts, resident on the device in checkpoint format.
 * Each of w1..s2 is a DEVICE array of n_experts DEVICE pointers, so the
 * experts may live anywhere (a weight cache uploads them one by one):
 *   w1[e], w3[e]: packed e2m1 [inter, dim/2] (element 2k in the low nibble of
 *                 byte k, as dtype.c); s1[e], s3[e]: ue8m0 [inter, dim/32]
 *   w2[e]:        packed e2m1 [dim, inter/2]; s2[e]: ue8m0 [dim, inter/32]
 * dim and inter must be multiples of 32; weight pointers 16-byte aligned (and, for BCU_MOE_WGMMA and
 * BCU_MOE_WGTILES, which copy scales four bytes at a time, scale pointers 4-byte aligned). */
typedef struct {
    int n_experts;
    int64_t dim, inter;
    float swiglu_limit;   /* > 0: the clamp; <= 0: plain SwiGLU (v4.c's rule) */
    int weight_before_w2; /* 1: official semantics (h *= w, then W2, then a plain sum);
                             0: transformers (y += w * (W2 h)); v4.c does the same */
    int act_fp8_h;        /* 1: h (after the weight) through v4.c's fq_fp8 in blocks of 128 before W2 (the
                             official act_quant; be_ops.moe's BE_MOE_ACT_FP8_H); x comes quantised */
    const uint8_t *const *w1, *const *s1;
    const uint8_t *const *w3, *const *s3;
    const uint8_t *const *w2, *const *s2;
} bcu_moe_experts;

/* How the activations meet the decoded weights.  The rows path always
 * computes in fp32; the mma rows only in bf16 planes (BF16X3 or BF16 take
 * the same three planes: ~1e-6). */
typedef enum {
    BCU_MOE_FP32 = 0,   /* fp32 FFMA: the CPU's numbers to ~1e-7 relative */
    BCU_MOE_BF16X3 = 1, /* x = hi + mid + lo bf16 planes on mma.sync tensor cores: ~1e-6 */
    BCU_MOE_BF16 = 2,   /* x rounded to bf16, one mma per product: ~3e-3 */
} bcu_moe_math;

typedef enum {
    BCU_MOE_AUTO = 0,  /* rows while the average tokens per expert is small, else tiled */
    BCU_MOE_ROWS = 1,  /* a warp per output feature, all of an expert's tokens per weight read */
    BCU_MOE_TILED = 2, /* 128 x 128 tiles of (rows of one expert) x (weight rows) */
    BCU_MOE_MMAROWS = 3, /* tensor cores, weights streamed into registers, 5-21 rows per weight read (bf16 maths) */
    BCU_MOE_WGMMA = 4,   /* sm_90a wgmma, the FP4 codes' bits placed as f16 (bf16x3 maths: exact products, fp32
                            sums) or as e4m3 (bf16 maths: the FP8 tensor core's ~13-bit sums), x and h as act_quant
                            codes; only for act_fp8_h (x comes quantised), dim and inter multiples of 128, and a
                            device that runs the sm_90a kernels (moe_wg.h) */
    BCU_MOE_WGTILES = 5, /* sm_90a wgmma over the tiles of BCU_MOE_TILE_M rows (prefill-sized batches): the FP4
                            weights decoded to bf16 with their scales, x and h as bf16 values of their codes; exact
                            products, fp32 sums, either tensor-core maths; the same conditions as BCU_MOE_WGMMA, and
                            dim a multiple of 256 */
    BCU_MOE_WGGEMV = 6,  /* a GEMV on mma.sync for decode batches of a row or two an expert (moe_wg.h's
                            bcu_wg_gemv): the FP4 codes as f16, x and h as act_quant codes, exact products and
                            fp32 sums under either maths (BCU_MOE_WGMMA's f16 order of sums); the same conditions
                            as BCU_MOE_WGMMA.  An expert's rows go in passes of two, each reading its weights */
} bcu_moe_path;
/* AUTO with bf16 / bf16x3 maths takes the mma rows while T * topk <= this * n_experts */
#define BCU_MOE_MMAROWS_MAX 32

/* Bytes of workspace bcu_moe_forward needs for these sizes (0 if they are out
 * of range).  About 4 * T * topk * (dim + inter) + small, so chunk very long
 * prefills: T = 16384, topk 6, V4-Flash dims is 2.4 GB. */
size_t bcu_moe_workspace_bytes(int64_t T, int topk, int n_experts, int64_t dim, int64_t inter);

/* y [T, dim] = the routed-expert FFN of x [T, dim] for ids, w [T, topk]; all
 * device pointers, 16-byte aligned (ws 256-byte aligned, as cudaMalloc
 * gives).  Asynchronous on st; deterministic (no
 * float atomics: every sum has a fixed order, and each token adds its experts
 * in ascending id as v4.c does).  A pair whose id is outside [0, n_experts)
 * contributes nothing and is counted (bcu_moe_plan.hdr[2]).  Returns
 * cudaErrorInvalidValue for bad sizes or a workspace that is too small, else
 * the launch status. */
cudaError_t bcu_moe_forward(const bcu_moe_experts *ex, float *y, const float *x, const int32_t *ids, const float *w,
                            int64_t T, int topk, bcu_moe_math math, bcu_moe_path path, void *ws, size_t ws_bytes,
                            cudaStream_t st);

const char *bcu_moe_math_name(bcu_moe_math m);
const char *bcu_moe_path_name(bcu_moe_path p);
/* the path AUTO picks for these sizes; mmarows_max: the mma rows' limit in pairs per expert (<= 0:
 * BCU_MOE_MMAROWS_MAX) */
bcu_moe_path bcu_moe_auto_path(int64_t T, int topk, int n_experts, bcu_moe_math math, int mmarows_max);
/* For the test and the benchmark, process-wide: force the mma rows' tiling, mt m16 tiles per pass (1, 2, 4) and
 * K split over ks warps (1; 4 with mt 1 or 4); (0, 0): chosen by the batch again.  -1 for other values. */
int bcu_moe_set_tiling(int mt, int ks);

/* ---- the workspace, for the test and for debugging.  A pair is p = t*topk + k;
 * a "row" is a pair's place in the expert-sorted order. */
typedef struct {
    int32_t *hdr;     /* [16]: [0] active experts, [1] tiles, [2] pairs with an out-of-range id */
    int32_t *cnt;     /* [E] pairs per expert */
    int32_t *off;     /* [E + 1] first row of each expert; off[E] = valid pairs */
    int32_t *act;     /* [n_slots] active experts, ascending, then -1 */
    int32_t *tile_e;  /* [max_tiles] expert of each tile (bcu_moe_tile_span rows), then -1 */
    int32_t *tile_r0; /* [max_tiles] its first row */
    int32_t *sorted;  /* [P] the pair at each row: by expert, pairs ascending within one */
    int32_t *pos;     /* [P] the row of each pair (-1: invalid id) */
    int32_t *comb;    /* [P] per token, the rows of its pairs ascending (= ascending expert, then k), -1 after */
    float *combw;     /* [P] the routing weight of each comb entry (0 after) */
    float *h;         /* [P, inter] swiglu output per row */
    float *yp;        /* [P, dim] W2 output per row */
    uint16_t *xq;     /* [T, 3, dim rounded up to 128] bf16 planes of x (mma rows) */
    uint16_t *hq;     /* [P, 3, inter rounded up to 128] bf16 planes of h (mma rows) */
    int64_t P, n_slots, max_tiles;
    size_t route_bytes; /* bytes from the base up to h (the routing plan) */
    size_t bytes;       /* the whole workspace */
} bcu_moe_plan;

/* the layout of a workspace at base (base may be NULL: sizes only); -1 if the
 * sizes are out of range */
int bcu_moe_plan_layout(void *base, int64_t T, int topk, int n_experts, int64_t dim, int64_t inter,
                        bcu_moe_plan *p);
/* The routing plan alone, on the device (what bcu_moe_forward does first) into a workspace laid out as
 * bcu_moe_plan_layout(ws, ...): one warp's plan up to 32 pairs, one block below 4096 pairs, four launches over
 * chunks of 512 pairs above (for the test: each must give bcu_moe_route_host's plan) */
cudaError_t bcu_moe_route(const int32_t *ids, const float *w, int64_t T, int topk, int n_experts, int64_t dim,
                          int64_t inter, void *ws, size_t ws_bytes, cudaStream_t st);
/* The routing plan computed on the host by the same chunked algorithm as the
 * kernel (16 chunks of pairs, per-chunk counts, stable scatter), into the
 * route_bytes of a plan laid out over host memory.  The test checks it
 * against a plain stable sort, and the kernel's plan against it. */
void bcu_moe_route_host(const int32_t *ids, const float *w, int64_t T, int topk, int n_experts,
                        const bcu_moe_plan *p);

#ifdef __cplusplus
}
#endif

#endif
