/* bench_util.h - what the GPU benchmarks share: fail-fast CUDA checks, the
 * median of repeated timings, and the device-to-device copy bandwidth that
 * serves as every bandwidth floor's reference.  Define BENCH_NAME (the
 * program's name, for messages) before including. */
#ifndef BACKEND_CUDA_BENCH_UTIL_H
#define BACKEND_CUDA_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
