/* cuda_skip.h - the CUDA tests' rule for a machine without a GPU: print
 * "SKIPPED: no CUDA device (why)" and exit 77, which CTest reports as skipped
 * (SKIP_RETURN_CODE), never as passed.  Include after <stdio.h> and
 * <cuda_runtime_api.h>. */
#ifndef TESTS_UNIT_CUDA_SKIP_H
#define TESTS_UNIT_CUDA_SKIP_H

/* 1 when a CUDA device is present; otherwise prints the SKIPPED line and returns 0 */
static inline int cuda_device_present(void)
{
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r == cudaSuccess && n > 0) return 1;
    printf("SKIPPED: no CUDA device (%s)\n", r != cudaSuccess ? cudaGetErrorString(r) : "none found");
    return 0;
}

#endif
