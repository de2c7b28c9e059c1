/* moe_wg.h - the routed experts' two GEMM stages on Hopper's wgmma (moe_wg.cu, built for sm_90a only).
 *
 * For act_quant'd activations (official semantics: x and h are e4m3 codes times a power of two per 128
 * columns) the FP4 weights need no table decode: an e2m1 code's bits placed into an e4m3 byte are the same
 * value times 2^-6, exactly (subnormals included), and into an f16's high byte the value times 2^-14.  A ue8m0
 * 1x32 scale block is one k32 step of `wgmma .e4m3` or two k16 steps of `.f16`; each block's sums start from
 * zero, are scaled by the block's weight scale and summed in block order, and a chunk of four blocks (128
 * columns) is then scaled by the activation scale into fp32 accumulators.  f16 (the default maths) has exact
 * products and fp32 sums; e4m3 is faster but the FP8 tensor core keeps ~13 bits of its sums.
 *
 * The weights are the A operand (64 rows a warpgroup, in registers), the activations the B operand (8 tokens a
 * pass, in shared memory, no swizzle).  For prefill-sized batches bcu_wg_tiles runs tiles of 128 tokens, the
 * weights decoded to bf16 with their scale (each element once per tile), the activations as bf16 values.  moe.cu's bcu_moe_forward calls these between its routing and combine
 * kernels (path BCU_MOE_WGMMA); docs/CUDA.md, "Routed experts on wgmma", tells the layouts and the numbers. */
#ifndef BACKEND_CUDA_MOE_WG_H
#define BACKEND_CUDA_MOE_WG_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One call's pointers, all on the device.  Codes are in "B order": per row, per 32-column step s, 32 bytes:
 * the step's even columns (16 bytes), then its odd columns; scales one float per row and 128 columns. */
typedef struct {
    const uint8_t *const *w1, *const *s1, *const *w3, *const *s3, *const *w2, *const *s2;
    int64_t D, I;
    int topk, official;
    float limit;
    const float *w;                          /* routing weights [T * topk] */
    const int32_t *off, *act, *sorted;       /* the routing plan (moe.cu's route_kernel) */
    const int32_t *tile_e, *tile_r0;         /* its tiles of up to 128 rows (bcu_wg_tiles only) */
    const uint8_t *xc; const float *xs;      /* x codes [T][D], scales [T][D / 128] */
    const uint8_t *hc; const float *hs;      /* h codes [P][I], scales [P][I / 128] */
    float *h, *yp;                           /* stage 1 writes h [P][I] (fp32), stage 2 yp [P][D] */
    int f16;                                 /* 0: e4m3 codes, k32 wgmma (fast; the tensor core's FP8 sums keep
                                                ~13 bits); 1: f16 values, two k16 wgmmas (fp32-exact products) */
} bcu_wg_args;

/* 1 when this build has the sm_90a kernels and the current device runs them (compute capability 9.0) */
int bcu_wg_available(void);

/* act_quant (v4.c fq_fp8, blocks of 128) of rows x [R][K] into codes (mode 0: e4m3 bytes [R][K]; 1: their
 * values as f16 [R][K]; 2: the quantised values, code x scale, as bf16 [R][K] in bcu_wg_tiles' order; 3: the
 * codes' values as f16 in fp8_tile.h's stage images, [ceil(R / BCU_FT_TOK)][K / 128][BCU_FT_IMAGE bytes], the last
 * tile's rows past R zeros) and scales [R][K / 128] (modes 0 and 1; mode 3: [tile][K / 128][BCU_FT_TOK]; mode 2
 * takes NULL); writeback (may be NULL or x itself) gets the quantised values, as bcu_fq_fp8 would leave them.
 * K % 128 == 0. */
cudaError_t bcu_wg_code(const float *x, int64_t R, int64_t K, int mode, uint8_t *codes, float *scales,
                        float *writeback, cudaStream_t st);

/* Stage g (1: h = swiglu(W1 x, W3 x) [* w]; 2: yp = W2 h) over the n_slots active-expert slots.  D and I
 * multiples of 128. */
cudaError_t bcu_wg_stage(const bcu_wg_args *a, int g, unsigned n_slots, cudaStream_t st);

/* Stage g as bcu_wg_stage, for decode batches of a row or two an expert (the backend: up to 32 tokens): a GEMV on
 * mma.sync (16 weight rows a warp, straight into registers; an expert's rows in passes of two, each pass reading
 * its weights again).  Codes as mode 1 (f16 values), whatever a->f16 says; the same order of sums as the f16 wgmma
 * kernel.  D and I multiples of 128. */
cudaError_t bcu_wg_gemv(const bcu_wg_args *a, int g, unsigned n_slots, cudaStream_t st);

/* Stage g as bcu_wg_stage, for prefill-sized batches: over the routing plan's n_tiles tiles (up to 128 rows of one
 * expert each) against 256 weight rows a block, on bf16 wgmma m64n128k16 with both scales inside the operands
 * (exact products, one fp32 sum over K); xc / hc are mode-2 codes, xs / hs unused, f16 ignored.  D a multiple
 * of 256, I of 128. */
cudaError_t bcu_wg_tiles(const bcu_wg_args *a, int g, unsigned n_tiles, cudaStream_t st);

/* The probe behind the layouts: one wgmma with A from registers, m64n8k32 e4m3 (f16 = 0) or m64n8k16 f16.
 * a: [128 threads][4] words, thread t's A registers as they go into the instruction; b: [8][32] bytes, row n =
 * column n of B (32 e4m3 or 16 f16); d: [64][8] floats, written through the accumulator fragment (row 16 w + g +
 * 8 (i / 2), column 2 q + (i & 1) for register i of lane 4 g + q in warp w).  Device pointers; synchronous. */
cudaError_t bcu_wg_probe(int f16, const uint32_t *a, const uint8_t *b, float *d);

#ifdef __cplusplus
}
#endif

#endif
