/* dtype.h - the number formats of DeepSeek V4 checkpoints (model-v4.md §5).
 *
 * Scalar codecs for every format a checkpoint or a fake-quant point uses
 * (bf16, f16, FP8 e4m3fn, UE8M0 scales, FP4 e2m1) and the row dequantizers
 * the GEMMs call on the hot path.  Decoding is exact (every code of these
 * formats is an f32 value); encoding rounds to nearest, ties to even, and
 * saturates where the format has no infinity. */
#ifndef MODEL_DTYPE_H
#define MODEL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    MD_BF16,
    MD_F16,
    MD_F32,
    MD_F64,
    MD_I8,
    MD_U8,
    MD_I16,
    MD_I32,
    MD_I64,
    MD_BOOL,
    MD_F8_E4M3,
    MD_F8_E8M0,
    MD_DTYPE_COUNT
} md_dtype;

#define MD_DT(d) (1u << (d)) /* bit for md_ckpt_get's `allowed` mask */

const char *md_dtype_name(md_dtype d);             /* safetensors spelling: "BF16", "F8_E4M3", ... */
int md_dtype_parse(const char *s, md_dtype *out);  /* 0, or RC_EUNSUP for any other spelling */
size_t md_dtype_size(md_dtype d);                  /* bytes per element; 0 for an invalid value */

float md_bf16_to_f32(uint16_t h);
uint16_t md_f32_to_bf16(float f); /* round-nearest-even; NaN stays NaN (quiet, sign kept) */
float md_f16_to_f32(uint16_t h);
float md_e4m3_to_f32(uint8_t b);  /* e4m3fn: bias 7, no inf, 0x7F/0xFF NaN, max 448 */
uint8_t md_f32_to_e4m3(float f);  /* round-nearest-even, saturate to +-448 (inf too); NaN -> 0x7F */
float md_ue8m0_to_f32(uint8_t b); /* 2^(b-127); 255 -> NaN; b = 0 is the f32 subnormal 2^-127 */

/* e2m1 codes: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated (8 = -0). */
extern const float md_fp4_lut[16];
/* Nearest e2m1 code, ties to even mantissa, saturate to +-6 (inf too).
 * NaN has no e2m1 code: it maps to 0 (+0). */
uint8_t md_f32_to_fp4(float f);

/* Row dequantizers (hot path). */
void md_bf16_row_to_f32(const uint16_t *src, float *dst, size_t n);
void md_f16_row_to_f32(const uint16_t *src, float *dst, size_t n);
/* Row r of an FP8 e4m3 [rows, cols] matrix with bs x bs block scales: the
 * scale tensor is [ceil(rows/bs), ceil(cols/bs)] of scale_dtype MD_F8_E8M0
 * (V4), MD_F32 (V3 scale_inv) or MD_BF16.  A ragged last block is allowed. */
void md_fp8_row_to_f32(const uint8_t *w_row, const void *scales, md_dtype scale_dtype, size_t r,
                       size_t cols, size_t bs, float *dst);
/* One row of a packed FP4 matrix: byte k holds element 2k in its low nibble
 * and element 2k+1 in its high nibble; scale_row holds ceil(cols/bs) UE8M0
 * scales of 1 x bs blocks (bs = 32 for V4, 16 for V4.1). */
void md_fp4_row_to_f32(const uint8_t *w_row_packed, const uint8_t *scale_row, size_t cols,
                       size_t bs, float *dst);

#endif
