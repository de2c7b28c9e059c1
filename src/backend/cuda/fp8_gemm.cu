/* fp8_gemm.cu - prefill GEMMs of FP8 weights on the FP8 tensor cores (issue 7, tenth session).
 *
 * Under official semantics every FP8 linear's input goes through act_quant first (e4m3 codes times a power of two
 * per 128 columns), and the checkpoint's FP8 weights are e4m3 codes times a power of two per 128 x 128 block.  So
 * both operands are already what Hopper's FP8 tensor cores multiply, and cuBLASLt (CUDA >= 12.9) applies exactly
 * these scales: one fp32 scale per 128 elements of a row of the activation (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
 * and one per 128 x 128 block of the weight (BLK128x128_32F).  Against dequantise + cuBLAS bf16 (dequant.cu) that
 * skips the bf16 copy of the weight and the bf16 copy of x, and the MMA runs at twice the bf16 rate: 1.5-2.1x at
 * the V4-Flash slice's shapes for 4096 and 16384 tokens (tools/fp8lt_probe.cu on the H200, docs/BENCHMARKS.md).
 *
 * The price is the FP8 MMA's sums: the products are exact, but the tensor core adds each 128-column block's 128
 * of them with fewer bits than fp32 (the probe: 4.5e-4 of max |y| at worst with codes spread over the whole e4m3
 * range), where the bf16 path adds them in fp32 (~1e-6).  So the backend takes this path by default only in the
 * bf16 maths (whose activations lose 8 bits anyway) and on request in bf16x3 (DEEPINFER_CUDA_FP8GEMM, cuda.cu).
 *
 * What the scale tensors look like (found by the probe against a double reference, every pairing of orders and
 * strides tried): the weight's [ceil(n / 128)][K / 128] row-major, the checkpoint's own order, but each row padded
 * to a multiple of 4 floats (16 bytes; with K / 128 = 2, 3 or 5 the dense order gives wrong sums, and nothing
 * reports it); the activation's [K / 128][T], tokens contiguous, T itself the stride (T must be a multiple of 4:
 * else cuBLASLt has no algorithm).  A ragged last block of weight rows is fine.  bcu_code_e4m3 writes the
 * activation's codes and scales in those orders, bcu_e8m0_to_f32 the weight's padded rows. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/moe_ops.cuh"

#define F8_WS_BYTES ((size_t)32 << 20) /* cuBLASLt's workspace */
#define F8_ALGOS 32                    /* shapes whose algorithm is remembered */

namespace {

/* one warp a (row, block of 128 columns): v4.c's act_quant of the block (the fq kernel's scale and rounding), the
 * codes in row order, the scale at [block][row] */
__global__ void f8_code_kernel(const float *x, int64_t T, int64_t K, int64_t ldx, uint8_t *codes, float *scales)
{
    const int64_t nkb = K / 128, gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gw >= T * nkb) return; /* warp-uniform */
    const int64_t t = gw / nkb, kb = gw - t * nkb;
    const float4 v = *(const float4 *)(x + t * ldx + kb * 128 + 4 * lane);
    const float sc = aq_warp_scale_e4m3(v), inv = aq_inv(sc);
    const uint32_t w = gr_enc_e4m3(__fmul_rn(v.x, inv)) | gr_enc_e4m3(__fmul_rn(v.y, inv)) << 8 |
                       gr_enc_e4m3(__fmul_rn(v.z, inv)) << 16 | gr_enc_e4m3(__fmul_rn(v.w, inv)) << 24;
    *(uint32_t *)(codes + t * K + kb * 128 + 4 * lane) = w;
    if (lane == 0) scales[kb * T + t] = sc;
}

/* the ue8m0 bytes as fp32 (moe_ops.cuh's ue8m0, dtype.c's decode); src [rows][cols] dense, dst rows ldd apart (the
 * padding columns 0) */
__global__ void f8_e8m0_kernel(float *dst, int64_t ldd, const uint8_t *src, int64_t rows, int64_t cols)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * ldd) return;
    const int64_t r = i / ldd, c = i - r * ldd;
    dst[i] = c < cols ? ue8m0(src[r * cols + c]) : 0.0f;
}

} /* namespace */

extern "C" cudaError_t bcu_code_e4m3(uint8_t *codes, float *scales, const float *x, int64_t T, int64_t K, int64_t ldx,
                                     cudaStream_t st)
{
    if (T < 0 || K <= 0 || K % 128 || ldx < K || ldx % 4 || ((uintptr_t)x & 15) || ((uintptr_t)codes & 3))
        return cudaErrorInvalidValue;
    if (!T) return cudaSuccess;
    const int64_t warps = T * (K / 128);
    f8_code_kernel<<<(unsigned)((warps + 7) / 8), 256, 0, st>>>(x, T, K, ldx, codes, scales);
    return cudaGetLastError();
}

extern "C" cudaError_t bcu_e8m0_to_f32(float *dst, int64_t ldd, const uint8_t *src, int64_t rows, int64_t cols,
                                       cudaStream_t st)
{
    if (rows < 0 || cols < 0 || ldd < cols) return cudaErrorInvalidValue;
    const int64_t n = rows * ldd;
    if (!n) return cudaSuccess;
    f8_e8m0_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(dst, ldd, src, rows, cols);
    return cudaGetLastError();
}

struct bcu_fp8lt {
    cublasLtHandle_t lt;
    void *ws;
    struct {
        int64_t n, T, K; /* n = 0: empty */
        int ok;          /* 0: cuBLASLt had no algorithm for the shape */
        cublasLtMatmulAlgo_t algo;
    } seen[F8_ALGOS];
    int next;
};

extern "C" bcu_fp8lt *bcu_fp8lt_create(void)
{
    bcu_fp8lt *f = (bcu_fp8lt *)calloc(1, sizeof *f);
    if (!f) return NULL;
    if (cublasLtCreate(&f->lt) != CUBLAS_STATUS_SUCCESS) {
        free(f);
        return NULL;
    }
    if (cudaMalloc(&f->ws, F8_WS_BYTES) != cudaSuccess) {
        cublasLtDestroy(f->lt);
        free(f);
        return NULL;
    }
    return f;
}

extern "C" void bcu_fp8lt_destroy(bcu_fp8lt *f)
{
    if (!f) return;
    cudaFree(f->ws);
    cublasLtDestroy(f->lt);
    free(f);
}

/* the descriptors of one call; each create is checked, and what was made is destroyed by f8_descs_free */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
} f8_descs;

static void f8_descs_free(f8_descs *d)
{
    if (d->c) cublasLtMatrixLayoutDestroy(d->c);
    if (d->b) cublasLtMatrixLayoutDestroy(d->b);
    if (d->a) cublasLtMatrixLayoutDestroy(d->a);
    if (d->op) cublasLtMatmulDescDestroy(d->op);
}

static cublasStatus_t f8_descs_make(f8_descs *d, const float *sw, const float *sx, int64_t n, int64_t T, int64_t K)
{
    memset(d, 0, sizeof *d);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    cublasStatus_t s = cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
    /* column-major: the weight [n, K] row-major is A (K x n, transposed), x [T, K] is B (K x T), y [T, n] is D (n x T) */
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&d->a, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)n, K);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&d->b, CUDA_R_8F_E4M3, (uint64_t)K, (uint64_t)T, K);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatrixLayoutCreate(&d->c, CUDA_R_32F, (uint64_t)n, (uint64_t)T, n);
    return s;
}

extern "C" cudaError_t bcu_fp8lt_gemm(bcu_fp8lt *f, float *y, const uint8_t *w, const float *sw, const uint8_t *xc,
                                      const float *sx, int64_t n, int64_t T, int64_t K, cudaStream_t st)
{
    if (!f || n <= 0 || T <= 0 || K <= 0 || K % 128 || n > 0x7fffffff || T > 0x7fffffff || K > 0x7fffffff)
        return cudaErrorInvalidValue;
    int slot = -1;
    for (int i = 0; i < F8_ALGOS; i++)
        if (f->seen[i].n == n && f->seen[i].T == T && f->seen[i].K == K) slot = i;
    if (slot >= 0 && !f->seen[slot].ok) return cudaErrorNotSupported;
    f8_descs d;
    cublasStatus_t s = f8_descs_make(&d, sw, sx, n, T, K);
    if (s == CUBLAS_STATUS_SUCCESS && slot < 0) {
        /* first call of this shape: ask the heuristic once and remember its answer (a ring of F8_ALGOS shapes) */
        cublasLtMatmulPreference_t pref = NULL;
        const size_t wsb = F8_WS_BYTES;
        cublasLtMatmulHeuristicResult_t h;
        int got = 0;
        s = cublasLtMatmulPreferenceCreate(&pref);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatmulAlgoGetHeuristic(f->lt, d.op, d.a, d.b, d.c, d.c, pref, 1, &h, &got);
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        slot = f->next;
        f->next = (f->next + 1) % F8_ALGOS;
        f->seen[slot].n = n;
        f->seen[slot].T = T;
        f->seen[slot].K = K;
        f->seen[slot].ok = s == CUBLAS_STATUS_SUCCESS && got > 0;
        if (f->seen[slot].ok) f->seen[slot].algo = h.algo;
        if (!f->seen[slot].ok) {
            f8_descs_free(&d);
            return cudaErrorNotSupported;
        }
    }
    const float one = 1.0f, zero = 0.0f;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(f->lt, d.op, &one, w, d.a, xc, d.b, &zero, y, d.c, y, d.c, &f->seen[slot].algo, f->ws,
                           F8_WS_BYTES, st);
    f8_descs_free(&d);
    return s == CUBLAS_STATUS_SUCCESS ? cudaGetLastError() : cudaErrorUnknown;
}
