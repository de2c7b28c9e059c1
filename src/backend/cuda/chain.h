/* chain.h - a chain of dependent batch-1 FP8 GEMVs, one launch a step or one persistent launch (chain.cu says
 * why it exists).  bench/gpu_chain.c measures it; test_cuda checks that both modes give the same bits. */
#ifndef BACKEND_CUDA_CHAIN_H
#define BACKEND_CUDA_CHAIN_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BCU_CHAIN_KMAX 8192 /* a step's K at most (x in shared memory) */

/* y [n] = W [n, K] . x [K]: W e4m3 codes, row-major; s ue8m0 bytes over 128 x 128 blocks, [ceil(n / 128)][K /
 * 128]; x and y fp32 on the device, 16-byte aligned; K a multiple of 512, at most BCU_CHAIN_KMAX.  A step's x is
 * usually an earlier step's y. */
typedef struct {
    const void *w, *s;
    const float *x;
    float *y;
    int n, K;
} bcu_chain_step;

typedef struct bcu_chain bcu_chain;

/* the step table on the device and the counters; cudaErrorInvalidValue for a step it cannot take */
cudaError_t bcu_chain_create(const bcu_chain_step *steps, int nsteps, bcu_chain **out);
void bcu_chain_destroy(bcu_chain *c);
/* every step in order, asynchronous on st: persistent = 0 a launch a step (PDL), 1 one cooperative launch whose
 * blocks count the blocks done with a step in one counter (a release add each), 2 the same launch with a flag a
 * block and step (a release store each; a warp polls all of a step's flags).  All give the same bits. */
cudaError_t bcu_chain_launch(bcu_chain *c, int persistent, cudaStream_t st);
/* synchronises; us[i]: step i's time in the last launch (from the last block done with step i - 1, or from the
 * first block's start, to the last block done with step i; each block's globaltimer) */
cudaError_t bcu_chain_times(bcu_chain *c, double *us);
/* synchronises; after a persistent launch, for steps i >= 1, block 0's path through step i: us[i][0] from the
 * last block's count of step i - 1 to block 0 seeing it, [1] staging x, [2] summing its rows, [3] adding its count
 * (us[0] zeros) */
cudaError_t bcu_chain_hops(bcu_chain *c, double (*us)[4]);

#ifdef __cplusplus
}
#endif

#endif
