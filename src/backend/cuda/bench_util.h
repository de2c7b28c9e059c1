/* bench_util.h - what the GPU benchmarks share: fail-fast CUDA checks, the
 * median of repeated timings, and the device-to-device copy bandwidth that
 * serves as every bandwidth floor's reference, and (with BENCH_WITH_CUBLAS) the
 * GEMM peaks behind the FLOP floors; a clock and reproducible random bits.  Define BENCH_NAME (the
 * program's name, for messages) before including. */
#ifndef BACKEND_CUDA_BENCH_UTIL_H
#define BACKEND_CUDA_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_util.h"
#endif

static void die_cuda(cudaError_t r, const char *what)
{
    if (r != cudaSuccess) {
        fprintf(stderr, BENCH_NAME ": %s: %s\n", what, cudaGetErrorString(r));
        exit(1);
    }
}
#define CK(call) die_cuda((call), #call)

/* monotonic wall clock, seconds (needs _GNU_SOURCE or _POSIX_C_SOURCE for clock_gettime under -std=c11) */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64: the benchmarks' reproducible random bits */
static uint64_t bench_rs = 88172645463325252ull;
static inline uint32_t rnd(void)
{
    bench_rs ^= bench_rs << 13;
    bench_rs ^= bench_rs >> 7;
    bench_rs ^= bench_rs << 17;
    return (uint32_t)(bench_rs >> 32);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* read + write bytes per second of a 1 GiB device-to-device copy, median of 15 after 2 warm-ups */
static double copy_bandwidth(void)
{
    enum { N = 15 };
    const size_t n = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[N];
    for (int r = -2; r < N; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 2.0 * (double)n / median(t, N);
}

#ifdef BENCH_WITH_CUBLAS
#include <cublas_v2.h>

/* FLOP/s of a square n^3 GEMM on the default stream, median of 7 after 2 warm-ups: bf16 x bf16 -> fp32 with
 * fp32 compute (the dense bf16 tensor-core peak as cuBLAS reaches it), or, bf16 = 0, cublasSgemm with
 * pedantic math (no TF32: the fp32 SIMT peak). */
static double gemm_peak(int bf16, int n)
{
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, BENCH_NAME ": cublasCreate failed\n");
        exit(1);
    }
    const size_t es = bf16 ? 2 : 4;
    void *A, *B, *C;
    CK(cudaMalloc(&A, (size_t)n * n * es));
    CK(cudaMalloc(&B, (size_t)n * n * es));
    CK(cudaMalloc(&C, (size_t)n * n * 4));
    CK(cudaMemset(A, 0x3c, (size_t)n * n * es)); /* small finite values */
    CK(cudaMemset(B, 0x3c, (size_t)n * n * es));
    if (!bf16) cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const float one = 1.0f, zero = 0.0f;
    double t[7];
    for (int r = -2; r < 7; r++) {
        CK(cudaEventRecord(e0, 0));
        cublasStatus_t st =
            bf16 ? cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero,
                                C, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                 : cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, (const float *)A, n, (const float *)B, n,
                               &zero, (float *)C, n);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, BENCH_NAME ": the peak GEMM failed (%d)\n", (int)st);
            exit(1);
        }
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3;
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    cublasDestroy(h);
    return 2.0 * (double)n * n * n / median(t, 7);
}
#endif

#endif
