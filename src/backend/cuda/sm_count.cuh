/* sm_count.cuh - the current device's SM count, cached per device (each file that includes it keeps its own cache),
 * 132 (an H200) where the runtime cannot say.  The grid shapes of attn.cu, kernels.cu and moe_wg.cu depend on it. */
#ifndef BACKEND_CUDA_SM_COUNT_CUH
#define BACKEND_CUDA_SM_COUNT_CUH

#include <cuda_runtime.h>

#include <atomic>

static inline int bcu_sm_count(void)
{
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) v = 132;
    cache[dev].store(v, std::memory_order_relaxed);
    return v;
}

#endif
