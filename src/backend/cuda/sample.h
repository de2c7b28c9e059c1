/* sample.h - sampled tokens drawn on the device (sample.cu; be_dev_ops.sample). */
#ifndef BACKEND_CUDA_SAMPLE_H
#define BACKEND_CUDA_SAMPLE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ids[i] = the token engine/sampler.c draws from row draws[i].row of x [.., V] with draws[i]'s parameters and
 * uniform (sample.cu's header says how closely).  ids, x and draws device; one block a draw, on st. */
cudaError_t bcu_sample(int32_t *ids, const float *x, size_t V, const be_draw *draws, size_t n, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
