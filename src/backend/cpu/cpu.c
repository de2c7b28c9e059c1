/* cpu.c - the reference backend: fp32 arithmetic on the host, multi-threaded.
 *
 * be_linear is where nearly all the time goes.  Work is split over output
 * features in tiles; each tile dequantizes one weight row at a time into a
 * per-thread fp32 buffer (bf16/f16/FP8/FP4 -> f32) and dots it with every
 * input row.  A dot product always runs over the same elements in the same
 * order, whatever T is and whichever thread runs it, so results do not depend
 * on batch size or thread count.
 *
 * Not here: blocked GEMM kernels for large prefill (a later speed issue) and
 * activation quantization (the official FP8 act_quant of GEMM inputs; see
 * docs/MODEL-SEMANTICS.md for why the reference path keeps fp32 inputs). */
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "backend/backend.h"
#include "base/pool.h"
#include "base/scratch.h"

typedef struct {
    rc_pool *pool;
} cpu_impl;

/* 8 independent accumulators: vectorizes at -O3, fixed summation order. */
__attribute__((target_clones("avx2", "default")))
static float dot(const float *a, const float *b, size_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* Dot with a bf16 row, widened in registers (bf16 -> f32 is exact, so this is
 * the same arithmetic as dot() over a dequantized row, without the buffer).
 * Used for every T, so prefill and decode round identically. */
__attribute__((target_clones("avx2", "default")))
static float dot_bf16(const float *a, const uint16_t *b, size_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            union { uint32_t u; float f; } w = {.u = (uint32_t)b[i + j] << 16};
            s[j] += a[i + j] * w.f;
        }
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) {
        union { uint32_t u; float f; } w = {.u = (uint32_t)b[i] << 16};
        r += a[i] * w.f;
    }
    return r;
}

static float *scratch(size_t n) { return rc_scratch(RC_SCRATCH_BACKEND, n * sizeof(float)); }

/* Row r of W, columns [c0, c0+n), as fp32.  Returns a pointer into the weight
 * itself when it is already f32. */
static const float *weight_row(const be_weight *w, int64_t r, int64_t c0, int64_t n, float *buf)
{
    switch (w->fmt) {
    case BE_W_DENSE:
        if (w->dtype == MD_F32) return (const float *)w->data + r * w->cols + c0;
        if (w->dtype == MD_BF16)
            md_bf16_row_to_f32((const uint16_t *)w->data + r * w->cols + c0, buf, (size_t)n);
        else
            md_f16_row_to_f32((const uint16_t *)w->data + r * w->cols + c0, buf, (size_t)n);
        return buf;
    case BE_W_FP8: {
        /* dequantize the whole row (block scales are per bs columns), then slice */
        if (c0 == 0 && n == w->cols) {
            md_fp8_row_to_f32((const uint8_t *)w->data + r * w->cols, w->scale, w->scale_dtype,
                              (size_t)r, (size_t)w->cols, (size_t)w->block, buf);
            return buf;
        }
        float *full = buf + n;
        md_fp8_row_to_f32((const uint8_t *)w->data + r * w->cols, w->scale, w->scale_dtype,
                          (size_t)r, (size_t)w->cols, (size_t)w->block, full);
        memcpy(buf, full + c0, (size_t)n * sizeof(float));
        return buf;
    }
    case BE_W_FP4: {
        size_t nsc = (size_t)(w->cols / w->block);
        const uint8_t *sc = (const uint8_t *)w->scale + (size_t)r * nsc;
        if (c0 == 0 && n == w->cols) {
            md_fp4_row_to_f32((const uint8_t *)w->data + r * (w->cols / 2), sc, (size_t)w->cols,
                              (size_t)w->block, buf);
            return buf;
        }
        float *full = buf + n;
        md_fp4_row_to_f32((const uint8_t *)w->data + r * (w->cols / 2), sc, (size_t)w->cols,
                          (size_t)w->block, full);
        memcpy(buf, full + c0, (size_t)n * sizeof(float));
        return buf;
    }
    }
    return NULL;
}

typedef struct {
    float *y;
    size_t ldy;
    const float *x;
    size_t ldx;
    size_t T;
    const be_weight *w;
    int64_t r0, n, c0, ncols;
    int64_t tile;
} lin_job;

static void lin_task(void *arg, size_t i)
{
    const lin_job *j = arg;
    int64_t a = (int64_t)i * j->tile, b = a + j->tile;
    if (b > j->n) b = j->n;
    /* few rows: widen bf16 in registers; many rows: widen each weight row
     * once into a buffer and reuse it for every input row.  dot_bf16 and dot
     * do the same operations in the same order on the same values, so the
     * two paths give identical bits (tests/unit/test_model.c checks chunked
     * prefill against one-shot prefill bit for bit, which crosses them). */
    if (j->w->fmt == BE_W_DENSE && j->w->dtype == MD_BF16 && j->T < 4) {
        for (int64_t o = a; o < b; o++) {
            const uint16_t *wr = (const uint16_t *)j->w->data + (j->r0 + o) * j->w->cols + j->c0;
            for (size_t t = 0; t < j->T; t++)
                j->y[t * j->ldy + (size_t)o] = dot_bf16(j->x + t * j->ldx, wr, (size_t)j->ncols);
        }
        return;
    }
    float *buf = scratch((size_t)(j->ncols + j->w->cols));
    for (int64_t o = a; o < b; o++) {
        const float *wr = weight_row(j->w, j->r0 + o, j->c0, j->ncols, buf);
        for (size_t t = 0; t < j->T; t++)
            j->y[t * j->ldy + (size_t)o] = dot(j->x + t * j->ldx, wr, (size_t)j->ncols);
    }
}

static void run_linear(be_backend *be, lin_job *j)
{
    cpu_impl *c = be->impl;
    int64_t tiles_wanted = (int64_t)be->threads * 8;
    j->tile = (j->n + tiles_wanted - 1) / tiles_wanted;
    if (j->tile < 4) j->tile = 4;
    size_t ntiles = (size_t)((j->n + j->tile - 1) / j->tile);
    /* small products are not worth waking the pool */
    if (ntiles == 1 || (double)j->n * (double)j->ncols * (double)j->T < 32768.0) {
        for (size_t i = 0; i < ntiles; i++) lin_task(j, i);
        return;
    }
    rc_pool_run(c->pool, ntiles, lin_task, j);
}

static void cpu_linear(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    lin_job j = {.y = y, .ldy = (size_t)w->rows, .x = x, .ldx = (size_t)w->cols, .T = T, .w = w,
                 .r0 = 0, .n = w->rows, .c0 = 0, .ncols = w->cols};
    run_linear(be, &j);
}

static void cpu_linear_rows(be_backend *be, float *y, size_t ldy, const float *x, size_t ldx,
                            size_t T, const be_weight *w, int64_t r0, int64_t n, int64_t c0)
{
    /* output features [r0, r0+n) read input columns [c0, c0 + ldx-slice): the
     * grouped projection uses all of W's columns, so ncols = w->cols */
    lin_job j = {.y = y, .ldy = ldy, .x = x, .ldx = ldx, .T = T, .w = w,
                 .r0 = r0, .n = n, .c0 = c0, .ncols = w->cols - c0};
    run_linear(be, &j);
}

float be_dot_f32(const float *a, const float *b, size_t n) { return dot(a, b, n); }

void be_rmsnorm_rows(float *y, const float *x, size_t rows, size_t dim, const float *w, float eps)
{
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *yr = y + r * dim;
        double ss = 0;
        for (size_t i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / (double)dim) + eps);
        for (size_t i = 0; i < dim; i++) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * inv);
    }
}

static void cpu_rmsnorm(be_backend *be, float *y, const float *x, size_t rows, size_t dim,
                        const float *w, float eps)
{
    (void)be;
    be_rmsnorm_rows(y, x, rows, dim, w, eps);
}

static void cpu_destroy(be_backend *be);

static const be_ops cpu_ops = {
    .name = "cpu",
    .linear = cpu_linear,
    .linear_rows = cpu_linear_rows,
    .rmsnorm = cpu_rmsnorm,
    .destroy = cpu_destroy,
};

be_backend *be_cpu_create(int threads)
{
    if (threads < 1) threads = 1;
    be_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) goto fail;
    c->pool = rc_pool_create(threads);
    if (!c->pool) goto fail;
    be->ops = &cpu_ops;
    be->threads = threads;
    be->impl = c;
    return be;
fail:
    free(be);
    free(c);
    return NULL;
}

static void cpu_destroy(be_backend *be)
{
    cpu_impl *c = be->impl;
    if (c) rc_pool_destroy(c->pool);
    free(c);
    free(be);
}

void be_destroy(be_backend *be)
{
    if (be) be->ops->destroy(be);
}

void be_cpu_parallel(be_backend *be, size_t n, be_task_fn fn, void *arg)
{
    cpu_impl *c = be->impl;
    if (n <= 1) {
        for (size_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    rc_pool_run(c->pool, n, fn, arg);
}
