/* cuda_internal.h - what the CUDA backend's files share with each other, with
 * its test and with its benchmark; not part of the backend API (backend.h).
 *
 * The kernels (kernels.cu) take device pointers and a stream and return a
 * cudaError_t; the backend (cuda.cu) owns the weight cache, the scratch and
 * the sticky error.  bcu_linear_dev is the device-resident form of be_linear
 * that the later all-on-device graph will call; the benchmark times it. */
#ifndef BACKEND_CUDA_INTERNAL_H
#define BACKEND_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h"

/* How dense bf16 weights meet fp32 activations (FP8/FP4/f16/f32 weights always
 * use fp32 activations and fp32 accumulation, whatever the mode). */
typedef enum {
    BCU_MATH_BF16X3 = 0, /* x = hi + mid + lo, three bf16 planes in one cuBLAS GEMM (N = 3T) */
    BCU_MATH_BF16 = 1,   /* x rounded to bf16, one cuBLAS GEMM */
    BCU_MATH_FP32 = 2,   /* fp32 weight copy, cublasSgemm, pedantic math (no TF32) */
} bcu_math;

const char *bcu_math_name(bcu_math m);
/* DEEPINFER_CUDA_MATH / DEEPINFER_CUDA_FP32 from the environment; -1 if unparsable */
int bcu_math_from_env(void);

be_backend *bcu_create(int device, int threads, bcu_math math, char *err, size_t errlen);
bcu_math bcu_get_math(const be_backend *be);
cudaStream_t bcu_stream(const be_backend *be);
/* "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" */
const char *bcu_device_name(const be_backend *be);
size_t bcu_weight_bytes(const be_backend *be); /* device bytes held by the weight cache */
size_t bcu_arena_bytes(const be_backend *be);  /* device bytes of the device graph's activation arenas */

/* y[t, 0:rows] = x[t, 0:cols] . W^T with x, y device pointers, dense rows,
 * asynchronous on bcu_stream.  0 or -1 (then be_cuda_error says why). */
int bcu_linear_dev(be_backend *be, float *dy, const float *dx, size_t T, const be_weight *w);

/* ---- kernels.cu */

/* scale dtype codes the kernels understand */
enum { BCU_SC_E8M0 = 0, BCU_SC_F32 = 1, BCU_SC_BF16 = 2 };
/* weight formats of the row kernel */
enum { BCU_RW_BF16 = 0, BCU_RW_F16 = 1, BCU_RW_F32 = 2, BCU_RW_FP8 = 3, BCU_RW_FP4 = 4 };

/* y[t, o] = x[t, 0:K] . W[r0 + o, c0 : c0 + K] for o in [0, n), t in [0, T):
 * FP8 / FP4 / f16 (and bf16 / f32) weights in their stored format, fp32
 * activations, fp32 sums.  W is [wrows, wcols]; x dense (ld K), y dense [T, n].
 * scale: FP8 [ceil(wrows/bs), ceil(wcols/bs)] of sc_dtype; FP4 [wrows, wcols/bs] E8M0.
 * Two kernels (kernels.cu): "mma" (tensor cores, bf16x3 activations, the
 * default for FP8 with power-of-two blocks >= 64 and FP4 with 1x32 ue8m0
 * scales, 16-byte aligned rows, c0 and K multiples of 16 (FP8) / 32 (FP4))
 * and "simple" (one warp per output, fp32 FFMA; everything else).  Each is
 * batch-invariant: y[t] does not depend on T or on the other rows of x.
 * path / tile / split are for tests and benchmarks; zero (what the backend
 * passes) means automatic, and DEEPINFER_CUDA_ROWDOT=simple (read once)
 * makes automatic mean simple. */
enum { BCU_ROWDOT_AUTO = 0, BCU_ROWDOT_SIMPLE = 1, BCU_ROWDOT_MMA = 2 };
enum {
    BCU_ROWDOT_TILE_DEC = -1, /* bcu_rowdot_args.tile of the decode kernel */
    BCU_ROWDOT_TILE_GEMV = -2 /* of the GEMV kernel (bcu_rowdot_gemv_ok; tile 0 takes it where bcu_rowdot_gemv_auto) */
};
/* grouped calls (bcu_rowdot_args.groups) of at most this many rows run as one launch of the decode kernel (5 rows a
 * block, the weights read once per 5 rows, mostly from L2): the wo_a of a decode batch of 8 was 8 launches of rowmma */
#define BCU_ROWDOT_GROUPED_T 32
typedef struct {
    int fmt;
    const void *w;
    const void *scale;
    int sc_dtype;
    int64_t wrows, wcols;
    int block;
    int64_t r0, n, c0, K;
    const float *x;
    int64_t T;
    float *y;
    int64_t ldx, ldy; /* row strides of x and y in floats; 0: dense (K, n) */
    int path;  /* BCU_ROWDOT_*; MMA on a weight it cannot take returns cudaErrorInvalidValue */
    int tile;  /* mma: 1, 3 or 6 m16 tiles of x rows per block (5, 16, 32 tokens), or BCU_ROWDOT_TILE_DEC (the
                  decode kernel: 5 tokens per block, x staged once; tile 1 where its shared memory is too
                  small); 0: by T (BCU_ROWDOT_TILE_DEC at T <= 5, T <= 16 with xq).  All give the same bits. */
    int split; /* mma: 1 no K split, 2 split the slices over a cluster, 0: when the grid is small */
    int groups;      /* > 1: a grouped projection in one launch: for g < groups, rows [r0 + g n, +n) of W on
                        x + g xg into y + g yg (ldx, ldy as usual).  Only the decode kernel takes it (tile
                        BCU_ROWDOT_TILE_DEC, or 0 with T <= BCU_ROWDOT_GROUPED_T, and its shared memory fits): else
                        cudaErrorNotSupported with nothing launched.  Each group's bits are those of its own call. */
    int64_t xg, yg;  /* floats between groups in x (a multiple of 4) and in y */
    int xq;          /* FP8 only: 1: x holds act_quant'd rows (every 64 columns of a row inside one block of act_quant:
                        e4m3 values times one power of two).  The decode kernel then takes up to 16 tokens a block
                        (tile BCU_ROWDOT_TILE_DEC at T <= 16) and multiplies f16 codes on the tensor cores: the
                        bf16 decode kernel's sums (test_rowdot_xq).  Other x gives wrong results.
                        2: x is raw and the decode kernel act_quants it as it stages it (v4.c fq_fp8, blocks of 128
                        columns): the product of xq = 1 on fq_fp8(x), without the copy and the fq launch.  Only where
                        bcu_rowdot_aq_ok says so; else cudaErrorNotSupported with nothing launched. */
} bcu_rowdot_args;
cudaError_t bcu_rowdot(const bcu_rowdot_args *a, cudaStream_t st);
/* the arguments for rows [r0, r0+n), columns [c0, cols) of an FP8 / FP4 / f16 weight w whose device copies are
 * dw (codes) and ds (scales), on x [T, cols - c0] -> y [T, n] (automatic path, tile and split) */
bcu_rowdot_args bcu_rowdot_for(const be_weight *w, const void *dw, const void *ds, int64_t r0, int64_t n, int64_t c0,
                               const float *dx, int64_t T, float *dy);
/* whether bcu_rowdot takes xq = 2 for these arguments: FP8, whole rows (c0 = 0, K % 128 = 0), T <= 16, no groups,
 * the decode kernel (automatic or forced tile) */
int bcu_rowdot_aq_ok(const bcu_rowdot_args *a);
/* whether the GEMV kernel can take these arguments (tile 0 or BCU_ROWDOT_TILE_GEMV): FP8 weights, xq 1 or 2 at
 * 1 <= T <= 24 (f16 codes) or xq 0 at T <= 8 (three bf16 planes a token), c0 and K multiples of 64, r0 (and grouped,
 * n) multiples of 16, and the T or 3 T rows of one slice's K + 8 f16 (mm_geom's slices: at most 8 a row) in 56 KB
 * (where the whole row's do not, the row's slices are split over the blocks of a cluster of at most 8; with xq 2 a
 * block's chunks must then be even), and DEEPINFER_CUDA_GEMV not 0.  Its bits are the decode kernel's.  A forced
 * BCU_ROWDOT_TILE_GEMV runs it where it can and is cudaErrorNotSupported, nothing launched, elsewhere. */
int bcu_rowdot_gemv_ok(const bcu_rowdot_args *a);
/* whether bcu_rowdot runs it for these arguments as they are (tile 0: where it measured faster; bf16 planes of 9 ..
 * BCU_ROWDOT_GROUPED_T tokens in launches of 8 where it takes 8) */
int bcu_rowdot_gemv_auto(const bcu_rowdot_args *a);
/* reads bytes of buf (16-byte aligned) as a plain stream: 512 bytes a warp, 8 loads of 16 bytes in flight a lane,
 * per_sm (1 .. 8) blocks of 256 threads an SM (bench_cuda_linear's read rows); sink: 256 words a write could land in
 * (it never does for random data) */
cudaError_t bcu_read_probe(const void *buf, size_t bytes, uint32_t *sink, int per_sm, cudaStream_t st);
/* every float's e4m3 round trip to f16 in software (v4.c's codec) against the conversion instructions: counts[0] the
 * floats whose f16 bits differ, counts[1] those of them where both are NaN */
cudaError_t bcu_e4m3_cvt_check(unsigned long long counts[2]);
/* the same bytes as a rows x rowbytes matrix in the GEMV kernel's pattern (rows % 16 == 0, rowbytes % 512 == 0) */
cudaError_t bcu_read_probe_rows(const void *buf, int64_t rows, int64_t rowbytes, uint32_t *sink, cudaStream_t st);
/* the kernel bcu_rowdot would run: BCU_ROWDOT_SIMPLE or BCU_ROWDOT_MMA */
int bcu_rowdot_path(const bcu_rowdot_args *a);
/* The same product for x whose rows went through act_quant (v4.c, official semantics: every value an e4m3 code
 * times a power of two per block of 128 columns), e4m3 x e4m3 on the tensor cores, no weight decode.  Whole rows
 * only (c0 = 0, K = wcols, K % 128 = 0), FP8 weights with blocks of >= 32, T <= 16, r0 % 8 = 0; path, tile and
 * split are ignored.  cudaErrorNotSupported (nothing launched) for anything else.  A token's result does not
 * depend on T; it equals bcu_rowdot's to fp32 rounding (~1e-6), not bit for bit. */
cudaError_t bcu_rowdot_x8(const bcu_rowdot_args *a, cudaStream_t st);

/* y[r] = w * (x[r] / sqrt(mean(x[r]^2) + eps)); w may be NULL; in place allowed */
cudaError_t bcu_rmsnorm(float *y, const float *x, size_t rows, size_t dim, const float *w, float eps,
                        cudaStream_t st);
/* planes = 1: dst[i] = bf16(x[i]); planes = 3: dst[p*n + i] = the p-th bf16 term of x[i] */
cudaError_t bcu_split_bf16(uint16_t *dst, const float *x, size_t n, int planes, cudaStream_t st);
/* y[i] = p[i] + (p[n+i] + p[2n+i]) for the three partial products of bf16x3 */
cudaError_t bcu_sum3(float *y, const float *p, size_t n, cudaStream_t st);
/* x [rows, L] in two f16 planes, dst [2][rows][L] (hi, lo), each row scaled by 2^rsh[row] so that its largest
 * magnitude lies in [2^14, 2^15) (f16x2.h): x[t, i] 2^rsh[t] = hi + lo + e with |e| <= 2^-22 |x[t, i] 2^rsh[t]| or
 * 2^-25.  dst 8-byte aligned. */
cudaError_t bcu_split_f16x2(uint16_t *dst, int *rsh, const float *x, size_t rows, size_t L, cudaStream_t st);
/* y [rows, L] = (p[0] + p[1]) 2^-(rsh[t] + g), p [2][rows][L] the products of bcu_split_f16x2's planes with a weight
 * scaled by 2^g */
cudaError_t bcu_sum2_unscale(float *y, const float *p, const int *rsh, size_t rows, size_t L, int g, cudaStream_t st);
/* fp32 copies of bf16 / f16 weights (FP32 mode) */
cudaError_t bcu_widen(float *dst, const uint16_t *src, size_t n, int is_f16, cudaStream_t st);

/* ---- dequant.cu */

/* dst [n, cols] (dense, row-major bf16) = rows [r0, r0 + n) of the weight
 * W [rows, cols], for prefill GEMMs through cuBLAS bf16 on a transient copy.
 * fmt BCU_RW_FP8: w holds e4m3 codes [rows, cols], scale [ceil(rows/block),
 * ceil(cols/block)]; BCU_RW_FP4: w holds e2m1 codes two per byte (element 2k
 * in the low nibble of byte k), scale [rows, cols/block].  w and scale are
 * the whole weight's (row 0 first).  The scales must be E8M0 (sc_dtype
 * BCU_SC_E8M0; F32 / BF16 scales are refused).  Every element is bit for bit
 * md_f32_to_bf16(decode(code) * scale) of src/model/dtype.c, i.e. the fp32
 * product rounded to nearest even; it is the exact product for scales that
 * keep it in bf16's normal range (every realistic one), the rounded one
 * beyond; a NaN code (0x7f / 0xff) or scale (255) gives a NaN, not
 * necessarily with dtype.c's bits.  Needs cols a multiple of 16 (FP8) or 32
 * (FP4), block a power of two >= 16 (FP4: dividing cols), 0 <= r0 <= r0 + n
 * <= rows, dst and w 16-byte aligned; else cudaErrorInvalidValue, before any
 * CUDA call.  Asynchronous on st; n = 0 does nothing. */
cudaError_t bcu_dequant_bf16(uint16_t *dst, int fmt, const void *w, const void *scale, int sc_dtype, int64_t rows,
                             int64_t cols, int block, int64_t r0, int64_t n, cudaStream_t st);
/* the same rows as f16 times 2^g: every element decode(code) * 2^(s - 127 + g) for its scale byte s, rounded to
 * nearest; exact for every code where g is f16x2_shift's for the weight's scale bytes (src/backend/f16x2.h).  The
 * same arguments and checks as bcu_dequant_bf16, and |g| <= 254. */
cudaError_t bcu_dequant_f16(uint16_t *dst, int fmt, const void *w, const void *scale, int sc_dtype, int64_t rows,
                            int64_t cols, int block, int64_t r0, int64_t n, int g, cudaStream_t st);

/* ---- fp8_gemm.cu: prefill GEMMs of FP8 weights on the FP8 tensor cores (cuBLASLt block scaling) */

/* v4.c's act_quant (fq_fp8, blocks of 128 columns) of x [T, K] (row stride ldx floats) as what the FP8 GEMM
 * reads: codes [T, K] e4m3 (row-major, dense), scales [K / 128][T] fp32 (tokens contiguous).  The codes times the
 * scales are fq_fp8(x) value for value; on x that already went through fq_fp8 they are x itself.  K % 128 == 0,
 * ldx % 4 == 0, x 16-byte and codes 4-byte aligned; else cudaErrorInvalidValue. */
cudaError_t bcu_code_e4m3(uint8_t *codes, float *scales, const float *x, int64_t T, int64_t K, int64_t ldx,
                          cudaStream_t st);
/* dst[r * ldd + c] = the ue8m0 scale byte src[r * cols + c] as fp32 (dtype.c's decode), 0 in the padding
 * columns cols <= c < ldd */
cudaError_t bcu_e8m0_to_f32(float *dst, int64_t ldd, const uint8_t *src, int64_t rows, int64_t cols, cudaStream_t st);
/* the row stride, in floats, of bcu_fp8lt_gemm's weight scales for K / 128 blocks of columns */
static inline int64_t bcu_fp8lt_sw_ld(int64_t K) { return (K / 128 + 3) / 4 * 4; }
typedef struct bcu_fp8lt bcu_fp8lt; /* a cuBLASLt handle, its workspace, the algorithms of the shapes seen */
bcu_fp8lt *bcu_fp8lt_create(void);  /* NULL: no cuBLASLt or no device memory */
void bcu_fp8lt_destroy(bcu_fp8lt *f);
/* y [T, n] fp32 = (xc with scales sx, bcu_code_e4m3's layout) . (W [n, K] e4m3 with fp32 scales sw
 * [ceil(n / 128)] rows of bcu_fp8lt_sw_ld(K) floats, the first K / 128 used)^T, every product exact, each
 * 128-column block's sum on the FP8 tensor core (fewer bits than fp32: ~1e-4 of max |y|).  K % 128 == 0 and
 * T % 4 == 0.  cudaErrorNotSupported (nothing launched) when
 * cuBLASLt has no algorithm for the shape; asynchronous on st. */
cudaError_t bcu_fp8lt_gemm(bcu_fp8lt *f, float *y, const uint8_t *w, const float *sw, const uint8_t *xc,
                           const float *sx, int64_t n, int64_t T, int64_t K, cudaStream_t st);
/* FP8 GEMMs the backend ran through bcu_fp8lt_gemm since it was created (tests: the path was taken) */
size_t bcu_fp8_gemm_calls(const be_backend *be);
/* GEMMs that took two f16 planes of x (DEEPINFER_CUDA_F16X2) */
size_t bcu_f16x2_calls(const be_backend *be);
/* linear_aq calls that act_quant'd x straight into its bf16 plane (DEEPINFER_CUDA_AQ_BF16) */
size_t bcu_aq_bf16_calls(const be_backend *be);
/* linear_aq calls the FP8 tiles (fp8_tile.cu) took */
size_t bcu_ft_calls(const be_backend *be);
/* the device graph's regions (be_dev_ops.graph_begin) so far: recorded as CUDA graphs, replayed, run eagerly */
void bcu_graph_stats(const be_backend *be, size_t *captured, size_t *replayed, size_t *eager);
/* the device graph's pinned upload ring: its size, how often a forward outgrew it (a larger one, no wait), and the
 * uploads that had to wait for the stream instead (a larger ring could not be had) */
void bcu_upload_stats(const be_backend *be, size_t *cap, size_t *grows, size_t *waits);
/* the attention's KV mirror: full-block lookups that hit, blocks uploaded; the per-sequence pointer cache: sequences
 * served from it, and caches filled */
void bcu_kv_stats(const be_backend *be, size_t *hits, size_t *uploads, size_t *pc_hits, size_t *pc_fills);
/* tests: the device-graph attention's error flags word set to fl, as a kernel that found bad input leaves it (the
 * next download must fail and name it); -1 where the attention has not run yet (no workspace) */
int bcu_attn_flags_set(be_backend *be, int fl);

#ifdef __cplusplus
}
#endif

#endif
