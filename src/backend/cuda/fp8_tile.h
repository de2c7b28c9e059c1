/* fp8_tile.h - the FP8 linears of act_quant'd decode batches on Hopper's wgmma (fp8_tile.cu, built for sm_90a).
 *
 * y [T][n] = act_quant(x) . W^T for an FP8 e4m3 weight W [n][K] with ue8m0 scales in 128 x 128 blocks: the weight
 * read once a call (its codes straight into f16 wgmma operands, no bf16 copy), each 128-column chunk's exact
 * products summed from zero and scaled by both scales into fp32, chunk after chunk.  Where the dequantised GEMM
 * moves ~5 bytes a weight element (the FP8 read, a bf16 copy written and read again), this moves 1.  The backend
 * takes it for linear_aq on such weights from DEEPINFER_CUDA_DEQUANT_T (17; below, the row-dot) to
 * DEEPINFER_CUDA_FT_MAX (128) tokens, DEEPINFER_CUDA_FT=0 never (cuda.cu); docs/CUDA.md tells the numbers. */
#ifndef BACKEND_CUDA_FP8_TILE_H
#define BACKEND_CUDA_FP8_TILE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* x's stage images (bcu_wg_code mode 3 writes them, the tile kernel copies them whole): a tile of BCU_FT_TOK tokens
 * and one 128-column chunk is a BCU_FT_IMAGE-byte image [k atom 2][token BCU_FT_TOK][128 bytes, 128B-swizzled] and
 * BCU_FT_TOK floats of scales */
#define BCU_FT_TOK 64
#define BCU_FT_IMAGE (2 * BCU_FT_TOK * 128)

#ifdef __cplusplus
extern "C" {
#endif

/* One launch's operands, on the device: W [n][K] e4m3, its scales [ceil(n / 128)][nsb] ue8m0; x's codes and scales
 * as bcu_wg_code mode 3 writes them (a 16 KB image and 64 floats a (64-token tile, 128-column chunk)); y rows ldy
 * apart. */
typedef struct {
    const uint8_t *w, *ws;
    int64_t n, K, nsb;
    const uint16_t *xc;
    const float *xs;
    int64_t T;
    float *y;
    int64_t ldy;
} bcu_ft_args;

/* bytes of scratch bcu_ft_linear needs for x's codes and scales */
size_t bcu_ft_scratch(int64_t T, int64_t K);

/* the K slices a call of this shape runs in (a cluster of 1 .. 8 blocks, where the row and token tiles alone would
 * leave SMs idle; the rule in fp8_tile.cu) */
int bcu_ft_splits(int64_t T, int64_t n, int64_t K);

/* every later call in this process in ks = 1, 2, 4 or 8 slices (fewer where K has fewer chunks), or by the rule again
 * (ks = 0), as DEEPINFER_CUDA_FT_KS does; for tests and benchmarks.  Returns 0, or -1 for another ks */
int bcu_ft_force_splits(int ks);

/* the tile kernel alone, on codes already made; cudaErrorNotSupported where the sm_90a kernels do not run */
cudaError_t bcu_ft_launch(const bcu_ft_args *a, cudaStream_t st);

/* act_quant x [T][K] (rows K apart, 16-byte aligned) into scratch, then the tiles; K a multiple of 128 */
cudaError_t bcu_ft_linear(float *y, int64_t ldy, const float *x, int64_t T, int64_t K, const uint8_t *w,
                          const uint8_t *ws, int64_t n, void *scratch, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
