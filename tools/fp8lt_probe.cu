/* fp8lt_probe.cu - what cuBLASLt's block-scaled FP8 GEMM takes on this GPU (issue 7, tenth session).
 *
 *   built by CMake (target fp8lt_probe) where nvcc is found; tools/gpu_check.sh pack carries it, tools/fp8_check.sh
 *   runs it on the GPU machine
 *
 * 1. layouts: y[T, n] = x[T, K] . W[n, K]^T with W e4m3 and one scale per 128 x 128 block (cuBLAS's A,
 *    BLK128x128_32F) and x e4m3 with one scale per 128 columns of a row (cuBLAS's B, VEC128_32F); every pairing
 *    of the two scale tensors' orders against a double reference, for fp32 and bf16 outputs;
 * 2. time at the V4-Flash slice's FP8 linear shapes: dequantise W to bf16 + cublasGemmEx bf16 (fp32 out: what the
 *    backend does today under official semantics) beside the FP8 GEMM (fp32 out). */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LT(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("%s:%d cublas %d\n", __FILE__, __LINE__, (int)s_); return -1; } } while (0)

static double e4m3_val(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static uint8_t rcode(void) { uint8_t b; do b = (uint8_t)rnd(); while ((b & 0x7f) == 0x7f); return b; }

static cublasLtHandle_t lt;
static void *ws;
static const size_t WS = 64u << 20;

/* D[n, T] (column-major; row-major y[T][n]) = A^T B with A = W [K x n col-major], B = x [K x T col-major] */
static int lt_gemm(void *D, cudaDataType dt, const uint8_t *W, const uint8_t *X, const float *sw, const float *sx,
                   int n, int T, int K, cudaStream_t st)
{
    cublasLtMatmulDesc_t op;
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx));
    cublasLtMatrixLayout_t la, lb, lc;
    LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, K, n, K));
    LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, K, T, K));
    LT(cublasLtMatrixLayoutCreate(&lc, dt, n, T, n));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    cublasLtMatmulHeuristicResult_t h;
    int got = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &h, &got);
    if (s != CUBLAS_STATUS_SUCCESS || !got) {
        printf("  no algorithm (status %d, %d results)\n", (int)s, got);
        return -1;
    }
    const float one = 1.0f, zero = 0.0f;
    LT(cublasLtMatmul(lt, op, &one, W, la, X, lb, &zero, D, lc, D, lc, &h.algo, ws, WS, st));
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
    return 0;
}

__global__ void deq_kernel(__nv_bfloat16 *o, const uint8_t *w, const float *s, int n, int K)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)n * K) return;
    int r = (int)(i / K), c = (int)(i % K);
    __nv_fp8_e4m3 v;
    v.__x = w[i];
    o[i] = __float2bfloat16((float)v * s[(r / 128) * (K / 128) + c / 128]);
}

int main(void)
{
    CK(cudaFree(0));
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
    CK(cudaMalloc(&ws, WS));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    /* 1. layouts */
    const int n = 384, T = 256, K = 512, nb = n / 128, kb = K / 128;
    uint8_t *hw = (uint8_t *)malloc((size_t)n * K), *hx = (uint8_t *)malloc((size_t)T * K);
    float *hsw = (float *)malloc(nb * kb * 4), *hsx = (float *)malloc((size_t)T * kb * 4);
    for (int i = 0; i < n * K; i++) hw[i] = rcode();
    for (int i = 0; i < T * K; i++) hx[i] = rcode();
    for (int i = 0; i < nb * kb; i++) hsw[i] = ldexpf(1.0f, (int)(rnd() % 9) - 4);   /* [nb][kb] */
    for (int i = 0; i < T * kb; i++) hsx[i] = ldexpf(1.0f, (int)(rnd() % 9) - 4);    /* [T][kb] */
    double *ref = (double *)malloc((size_t)T * n * 8);
    for (int t = 0; t < T; t++)
        for (int r = 0; r < n; r++) {
            double a = 0;
            for (int k = 0; k < K; k++)
                a += e4m3_val(hw[(size_t)r * K + k]) * hsw[(r / 128) * kb + k / 128] * e4m3_val(hx[(size_t)t * K + k]) *
                     hsx[t * kb + k / 128];
            ref[(size_t)t * n + r] = a;
        }
    uint8_t *dw, *dx;
    float *dsw, *dsx, *dy;
    CK(cudaMalloc(&dw, (size_t)n * K));
    CK(cudaMalloc(&dx, (size_t)T * K));
    CK(cudaMalloc(&dsw, nb * kb * 4));
    CK(cudaMalloc(&dsx, (size_t)T * kb * 4));
    CK(cudaMalloc(&dy, (size_t)T * n * 4));
    CK(cudaMemcpy(dw, hw, (size_t)n * K, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx, (size_t)T * K, cudaMemcpyHostToDevice));
    float *tsw = (float *)malloc(nb * kb * 4), *tsx = (float *)malloc((size_t)T * kb * 4), *hy = (float *)malloc((size_t)T * n * 4);
    for (int lw = 0; lw < 2; lw++)
        for (int lx = 0; lx < 2; lx++)
            for (int ot = 0; ot < 2; ot++) {
                for (int a = 0; a < nb; a++)
                    for (int b = 0; b < kb; b++) tsw[lw ? b * nb + a : a * kb + b] = hsw[a * kb + b];
                for (int t = 0; t < T; t++)
                    for (int b = 0; b < kb; b++) tsx[lx ? b * T + t : t * kb + b] = hsx[t * kb + b];
                CK(cudaMemcpy(dsw, tsw, nb * kb * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(dsx, tsx, (size_t)T * kb * 4, cudaMemcpyHostToDevice));
                CK(cudaMemset(dy, 0, (size_t)T * n * 4));
                printf("W scales %s, x scales %s, out %s:", lw ? "[kb][nb]" : "[nb][kb]", lx ? "[kb][T]" : "[T][kb]",
                       ot ? "bf16" : "fp32");
                if (lt_gemm(dy, ot ? CUDA_R_16BF : CUDA_R_32F, dw, dx, dsw, dsx, n, T, K, st)) continue;
                cudaError_t e = cudaStreamSynchronize(st);
                if (e != cudaSuccess) { printf(" %s\n", cudaGetErrorString(e)); return 1; }
                CK(cudaMemcpy(hy, dy, (size_t)T * n * 4, cudaMemcpyDeviceToHost));
                double mx = 0, mref = 0, sum = 0;
                for (size_t i = 0; i < (size_t)T * n; i++) {
                    double v = ot ? (double)__bfloat162float(((__nv_bfloat16 *)hy)[i]) : (double)hy[i];
                    double d = fabs(v - ref[i]);
                    if (d > mx) mx = d;
                    if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
                    sum += d;
                }
                printf(" max|d| %.3g (max|ref| %.3g, rel %.3g, mean|d| %.3g)\n", mx, mref, mx / mref, sum / ((double)T * n));
            }
    /* 1b. token counts that are not multiples of 128: which stride of the activation's [K / 128][T] scales does
     * cuBLASLt read (T itself, or T rounded up to 4 / 16 / 128)? */
    {
        static const int tsh[][3] = {{384, 256, 1000}, {384, 384, 1024}, {1024, 1024, 1000}, {200, 512, 256},
                                     {384, 640, 256}, {384, 1024, 1002}};
        for (size_t si = 0; si < sizeof tsh / sizeof tsh[0]; si++) {
            const int n2 = tsh[si][0], K2 = tsh[si][1], T2 = tsh[si][2], kb2 = K2 / 128, nb2 = (n2 + 127) / 128;
            const int pads[] = {1, 4, 16, 128}; /* the activation scales' stride: T rounded up to this */
            uint8_t *w2 = (uint8_t *)malloc((size_t)n2 * K2), *x2 = (uint8_t *)malloc((size_t)T2 * K2);
            float *sw2 = (float *)malloc((size_t)nb2 * kb2 * 4), *sx2 = (float *)malloc((size_t)T2 * kb2 * 4);
            for (int i = 0; i < n2 * K2; i++) w2[i] = rcode();
            for (int i = 0; i < T2 * K2; i++) x2[i] = rcode();
            for (int i = 0; i < nb2 * kb2; i++) sw2[i] = ldexpf(1.0f, (int)(rnd() % 9) - 4);
            for (int i = 0; i < T2 * kb2; i++) sx2[i] = ldexpf(1.0f, (int)(rnd() % 9) - 4); /* [T][kb] */
            double *r2 = (double *)malloc((size_t)T2 * n2 * 8);
            for (int t = 0; t < T2; t++)
                for (int r = 0; r < n2; r++) {
                    double a = 0;
                    for (int k = 0; k < K2; k++)
                        a += e4m3_val(w2[(size_t)r * K2 + k]) * sw2[(r / 128) * kb2 + k / 128] *
                             e4m3_val(x2[(size_t)t * K2 + k]) * sx2[t * kb2 + k / 128];
                    r2[(size_t)t * n2 + r] = a;
                }
            uint8_t *dw2, *dx2;
            float *dsw2, *dsx2, *dy2;
            const int Tmax = (T2 + 127) / 128 * 128;
            CK(cudaMalloc(&dw2, (size_t)n2 * K2));
            CK(cudaMalloc(&dx2, (size_t)Tmax * K2));
            CK(cudaMalloc(&dsw2, (size_t)nb2 * (kb2 + 3) * 4));
            CK(cudaMalloc(&dsx2, (size_t)Tmax * kb2 * 4));
            CK(cudaMalloc(&dy2, (size_t)Tmax * n2 * 4));
            CK(cudaMemcpy(dw2, w2, (size_t)n2 * K2, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dx2, x2, (size_t)T2 * K2, cudaMemcpyHostToDevice));
            const int nb2r = (n2 + 127) / 128;
            float *y2 = (float *)malloc((size_t)Tmax * n2 * 4), *tx = (float *)calloc((size_t)Tmax * kb2, 4);
            for (int pi = 0; pi < 6; pi++) {
                /* 0..3: weight scales dense, activation stride T up to pads[]; 4: both at 4; 5: weight at 4, T */
                const int pa = pi < 4 ? pads[pi] : pi == 4 ? 4 : 1, pw = pi < 4 ? 1 : 4;
                const int ld = (T2 + pa - 1) / pa * pa, ldw = (kb2 + pw - 1) / pw * pw;
                float *tw = (float *)calloc((size_t)nb2r * ldw, 4);
                for (int a = 0; a < nb2r; a++)
                    for (int b = 0; b < kb2; b++) tw[a * ldw + b] = sw2[a * kb2 + b];
                CK(cudaMemcpy(dsw2, tw, (size_t)nb2r * ldw * 4, cudaMemcpyHostToDevice));
                free(tw);
                for (int t = 0; t < T2; t++)
                    for (int b = 0; b < kb2; b++) tx[b * ld + t] = sx2[t * kb2 + b];
                CK(cudaMemcpy(dsx2, tx, (size_t)Tmax * kb2 * 4, cudaMemcpyHostToDevice));
                CK(cudaMemset(dy2, 0xff, (size_t)Tmax * n2 * 4));
                printf("n %d K %d T %d, x scales [kb][T up to %d = %d], W scales [nb][kb up to %d = %d]:", n2, K2, T2, pa,
                       ld, pw, ldw);
                if (lt_gemm(dy2, CUDA_R_32F, dw2, dx2, dsw2, dsx2, n2, T2, K2, st)) continue;
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(y2, dy2, (size_t)T2 * n2 * 4, cudaMemcpyDeviceToHost));
                double mx = 0, mref = 0;
                int bad0 = -1, bad1 = -1;
                for (int t = 0; t < T2; t++)
                    for (int r = 0; r < n2; r++) {
                        const double d = fabs(y2[(size_t)t * n2 + r] - r2[(size_t)t * n2 + r]);
                        mref = fmax(mref, fabs(r2[(size_t)t * n2 + r]));
                        if (!(d <= mx)) mx = d;
                    }
                for (int t = 0; t < T2; t++) {
                    double mt = 0;
                    for (int r = 0; r < n2; r++) mt = fmax(mt, fabs(y2[(size_t)t * n2 + r] - r2[(size_t)t * n2 + r]));
                    if (!(mt <= 1e-2 * mref)) { if (bad0 < 0) bad0 = t; bad1 = t; }
                }
                printf(" rel %.3g; tokens off by > 1e-2: %d..%d\n", mx / mref, bad0, bad1);
            }
            free(w2); free(x2); free(sw2); free(sx2); free(r2); free(y2); free(tx);
            cudaFree(dw2); cudaFree(dx2); cudaFree(dsw2); cudaFree(dsx2); cudaFree(dy2);
        }
    }
    /* 2. timing at the slice's shapes */
    static const int shapes[][2] = {{1024, 4096}, {32768, 1024}, {512, 4096}, {4096, 8192}, {2048, 4096}, {4096, 2048}, {8192, 1024}};
    cublasHandle_t bl;
    cublasCreate(&bl);
    cublasSetStream(bl, st);
    cublasSetWorkspace(bl, ws, WS);
    const int Ts[] = {4096, 16384};
    printf("\n%6s %6s %6s | %10s %10s %8s | %10s %8s | %6s\n", "T", "n", "K", "deq us", "bf16 us", "TF/s", "fp8 us", "TF/s", "ratio");
    for (int ti = 0; ti < 2; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int TT = Ts[ti], nn = shapes[si][0], KK = shapes[si][1];
            uint8_t *w8, *x8;
            float *s1, *s2, *y;
            __nv_bfloat16 *wb, *xb;
            CK(cudaMalloc(&w8, (size_t)nn * KK));
            CK(cudaMalloc(&x8, (size_t)TT * KK));
            CK(cudaMalloc(&s1, (size_t)(nn / 128) * (KK / 128) * 4));
            CK(cudaMalloc(&s2, (size_t)TT * (KK / 128) * 4));
            CK(cudaMalloc(&y, (size_t)TT * nn * 4));
            CK(cudaMalloc(&wb, (size_t)nn * KK * 2));
            CK(cudaMalloc(&xb, (size_t)TT * KK * 2));
            CK(cudaMemset(w8, 0x38, (size_t)nn * KK));
            CK(cudaMemset(x8, 0x30, (size_t)TT * KK));
            CK(cudaMemset(s1, 0, (size_t)(nn / 128) * (KK / 128) * 4));
            CK(cudaMemset(s2, 0, (size_t)TT * (KK / 128) * 4));
            CK(cudaMemset(xb, 0, (size_t)TT * KK * 2));
            cudaEvent_t e0, e1, e2;
            cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
            const float one = 1.0f, zero = 0.0f;
            float tdq = 0, tbf = 0, tf8 = 0;
            for (int rep = 0; rep < 6; rep++) {
                cudaEventRecord(e0, st);
                const size_t ne = (size_t)nn * KK;
                deq_kernel<<<(unsigned)((ne + 255) / 256), 256, 0, st>>>(wb, w8, s1, nn, KK);
                cudaEventRecord(e1, st);
                cublasGemmEx(bl, CUBLAS_OP_T, CUBLAS_OP_N, nn, TT, KK, &one, wb, CUDA_R_16BF, KK, xb, CUDA_R_16BF, KK, &zero, y,
                             CUDA_R_32F, nn, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
                cudaEventRecord(e2, st);
                CK(cudaEventSynchronize(e2));
                float a, b;
                cudaEventElapsedTime(&a, e0, e1);
                cudaEventElapsedTime(&b, e1, e2);
                if (rep >= 2) { tdq += a / 4; tbf += b / 4; }
                cudaEventRecord(e0, st);
                if (lt_gemm(y, CUDA_R_32F, w8, x8, s1, s2, nn, TT, KK, st)) break;
                cudaEventRecord(e1, st);
                CK(cudaEventSynchronize(e1));
                cudaEventElapsedTime(&a, e0, e1);
                if (rep >= 2) tf8 += a / 4;
            }
            const double fl = 2.0 * TT * nn * KK;
            printf("%6d %6d %6d | %10.1f %10.1f %8.0f | %10.1f %8.0f | %6.2f\n", TT, nn, KK, tdq * 1e3, tbf * 1e3,
                   fl / (tbf * 1e-3) / 1e12, tf8 * 1e3, fl / (tf8 * 1e-3) / 1e12, (tdq + tbf) / tf8);
            cudaFree(w8); cudaFree(x8); cudaFree(s1); cudaFree(s2); cudaFree(y); cudaFree(wb); cudaFree(xb);
        }
    return 0;
}
