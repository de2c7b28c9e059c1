/* test_cuda_dequant.c - bcu_dequant_bf16 (src/backend/cuda/dequant.cu), the
 * FP8 / FP4 -> dense bf16 expansion behind the cuBLAS prefill GEMMs, against
 * a host reference, bit for bit.
 *
 * The reference is dtype.c's scalar decoders (md_e4m3_to_f32, md_fp4_lut,
 * md_ue8m0_to_f32), their fp32 product, and a round-to-nearest-even f32 ->
 * bf16 written here (checked against md_f32_to_bf16 first).
 *
 * Host part (runs everywhere, before the device check):
 *   - the reference rounding against md_f32_to_bf16 on edge and random bits;
 *   - argument checks: F32 / BF16 scales, cols not a multiple of 16 / 32,
 *     blocks that are not powers of two >= 16 (FP4: not dividing cols), a
 *     row range outside the weight, misaligned pointers, a format the kernel
 *     does not take are all cudaErrorInvalidValue; n = 0 succeeds.  The
 *     function decides these before any CUDA call.
 * Without a CUDA device it then prints "SKIPPED: no CUDA device" and exits 77.
 * GPU part:
 *   - FP8 e4m3 with 128x128 ue8m0 blocks at V4-Flash shapes (1024x4096,
 *     32768x1024), ragged shapes (rows and cols not multiples of the block),
 *     row slices (r0, n), blocks 16, 64 and 256; FP4 e2m1 with 1x32 blocks at
 *     2048x4096, ragged and sliced, blocks 16 (V4.1) and 64.  Codes are
 *     random (FP8: every code but the NaNs 0x7f / 0xff, with zero, -0,
 *     subnormals and +-448 planted in every row), scales 2^-20 .. 2^4; three
 *     cases take every scale byte 0 .. 254 (products far outside bf16's
 *     normal range: the fp32 product rounded, still bit for bit);
 *   - every element of dst equal to the reference bit for bit (dst is
 *     poisoned first, so an element not written fails), and 64 guard
 *     elements after dst untouched;
 *   - NaN codes and scale 255 give NaNs (their bits are not promised), the
 *     other elements of the same matrix still exact;
 *   - negative controls: one flipped low bit, and a -0 turned into +0, are
 *     each seen by the comparison. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime_api.h>
#include "cuda_skip.h"

#include "backend/cuda/cuda_internal.h"
#include "backend/f16x2.h"
#include "model/dtype.h"

#define GUARD 64      /* bf16 elements after dst that must stay untouched */
#define MAX_REPORT 5  /* mismatches printed per comparison */
#define POISON 0xffff /* a NaN no reference element can be */

#include "test_rng.h"

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) fail_msg("out of host memory (%zu bytes)", n);
    return p;
}

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t r_ = (call);                                                                                       \
        if (r_ != cudaSuccess) fail_msg("%s: %s (%s:%d)", #call, cudaGetErrorString(r_), __FILE__, __LINE__);          \
    } while (0)

/* ------------------------------------------------------------------ the reference */

/* f32 -> bf16, nearest, ties to even, NaN quieted: the textbook rule on the
 * 16 bits that go, written apart from dtype.c's md_f32_to_bf16 */
static uint16_t rne_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    uint32_t t = u >> 16;
    const uint32_t rest = u & 0xffffu;
    if (rest > 0x8000u || (rest == 0x8000u && (t & 1u))) t++; /* a carry into the exponent is right, to inf too */
    return (uint16_t)t;
}

static int bf16_isnan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* One test matrix: the whole weight [rows, cols] and the slice [r0, r0 + n). */
typedef struct {
    const char *name;
    int fmt; /* BCU_RW_FP8 / BCU_RW_FP4 */
    int64_t rows, cols;
    int block;
    int64_t r0, n;
    int smin, smax; /* scale bytes drawn from [smin, smax] */
    int nan;        /* plant NaN codes and scales 255 */
} dcase;

static size_t code_bytes(const dcase *c)
{
    return c->fmt == BCU_RW_FP8 ? (size_t)(c->rows * c->cols) : (size_t)(c->rows * c->cols) / 2;
}
static int64_t scale_cols(const dcase *c)
{
    return c->fmt == BCU_RW_FP8 ? (c->cols + c->block - 1) / c->block : c->cols / c->block;
}
static size_t scale_bytes(const dcase *c)
{
    const int64_t srows = c->fmt == BCU_RW_FP8 ? (c->rows + c->block - 1) / c->block : c->rows;
    return (size_t)(srows * scale_cols(c));
}

/* weight element (r, c): its code and its scale byte */
static uint8_t code_at(const dcase *c, const uint8_t *w, int64_t r, int64_t j)
{
    if (c->fmt == BCU_RW_FP8) return w[r * c->cols + j];
    const uint8_t b = w[(r * c->cols + j) / 2];
    return j % 2 ? b >> 4 : b & 15u;
}
static uint8_t scale_at(const dcase *c, const uint8_t *sc, int64_t r, int64_t j)
{
    if (c->fmt == BCU_RW_FP8) return sc[(r / c->block) * scale_cols(c) + j / c->block];
    return sc[r * scale_cols(c) + j / c->block];
}

/* the reference element: bf16(decode(code) * scale), the product in fp32 as dtype.c computes it */
static uint16_t ref_at(const dcase *c, const uint8_t *w, const uint8_t *sc, int64_t r, int64_t j)
{
    const float s = md_ue8m0_to_f32(scale_at(c, sc, r, j));
    const uint8_t code = code_at(c, w, r, j);
    const float v = c->fmt == BCU_RW_FP8 ? md_e4m3_to_f32(code) : md_fp4_lut[code];
    return rne_bf16(v * s);
}

/* random codes and scales.  FP8: every code but the NaNs, and in each row
 * zero, -0, subnormals and +-448 at random columns; nan: some NaN codes and
 * some scales 255 on top. */
static void make_weight(const dcase *c, uint8_t *w, uint8_t *sc)
{
    const size_t nb = code_bytes(c), ns = scale_bytes(c);
    for (size_t i = 0; i < nb; i += 8) {
        const uint64_t v = rnd();
        for (size_t k = 0; k < 8 && i + k < nb; k++) w[i + k] = (uint8_t)(v >> (8 * k));
    }
    if (c->fmt == BCU_RW_FP8) {
        static const uint8_t special[] = {0x00, 0x80, 0x01, 0x81, 0x04, 0x07, 0x87, 0x08, 0x88, 0x7e, 0xfe, 0x38};
        const size_t nsp = sizeof special / sizeof special[0];
        for (size_t i = 0; i < nb; i++)
            if ((w[i] & 0x7fu) == 0x7fu) w[i] ^= 0x01u; /* 0x7f -> 0x7e, 0xff -> 0xfe */
        for (int64_t r = 0; r < c->rows; r++)
            for (int k = 0; k < 6; k++) w[r * c->cols + (int64_t)(rnd() % (uint64_t)c->cols)] = special[rnd() % nsp];
    }
    for (size_t i = 0; i < ns; i++) sc[i] = (uint8_t)(c->smin + (int)(rnd() % (uint64_t)(c->smax - c->smin + 1)));
    if (c->nan) {
        if (c->fmt == BCU_RW_FP8)
            for (size_t k = 0; k < nb / 64 + 1; k++) w[rnd() % nb] = rnd() & 1 ? 0x7f : 0xff;
        for (size_t k = 0; k < ns / 16 + 1; k++) sc[rnd() % ns] = 255;
    }
}

/* elements of got [n, cols] that differ from the reference bit for bit
 * (nan cases: a NaN where the code or the scale is NaN, any NaN bits);
 * the first MAX_REPORT are printed when report */
static size_t compare(const dcase *c, const uint16_t *got, const uint8_t *w, const uint8_t *sc, int report)
{
    size_t bad = 0;
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t j = 0; j < c->cols; j++) {
            const int64_t r = c->r0 + i;
            const uint16_t g = got[i * c->cols + j], want = ref_at(c, w, sc, r, j);
            const uint8_t code = code_at(c, w, r, j), sb = scale_at(c, sc, r, j);
            const int nan_in = sb == 255 || (c->fmt == BCU_RW_FP8 && (code & 0x7fu) == 0x7fu);
            if (nan_in ? bf16_isnan(g) : g == want) continue;
            if (report && bad < MAX_REPORT)
                printf("    row %lld col %lld: code 0x%02x scale byte %u: got 0x%04x, want 0x%04x%s\n", (long long)r,
                       (long long)j, code, sb, g, want, nan_in ? " (a NaN)" : "");
            bad++;
        }
    return bad;
}

/* dst on the device, poisoned, with GUARD elements after it; returns the n x cols result: bcu_dequant_bf16's, or
 * with g other than F16X2_NONE bcu_dequant_f16's at shift g */
static uint16_t *run_device(const dcase *c, const uint8_t *w, const uint8_t *sc, cudaStream_t st, int g)
{
    const size_t nb = code_bytes(c), ns = scale_bytes(c), ne = (size_t)(c->n * c->cols);
    void *dw, *ds, *dd;
    CK(cudaMalloc(&dw, nb));
    CK(cudaMalloc(&ds, ns));
    CK(cudaMalloc(&dd, (ne + GUARD) * 2));
    CK(cudaMemcpy(dw, w, nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, sc, ns, cudaMemcpyHostToDevice));
    CK(cudaMemset(dd, 0xff, (ne + GUARD) * 2));
    CK(cudaDeviceSynchronize()); /* st does not wait for the legacy stream's copies and memset */
    if (g == F16X2_NONE)
        CK(bcu_dequant_bf16((uint16_t *)dd, c->fmt, dw, ds, BCU_SC_E8M0, c->rows, c->cols, c->block, c->r0, c->n, st));
    else CK(bcu_dequant_f16((uint16_t *)dd, c->fmt, dw, ds, BCU_SC_E8M0, c->rows, c->cols, c->block, c->r0, c->n, g, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    uint16_t *got = xmalloc((ne + GUARD) * 2);
    CK(cudaMemcpy(got, dd, (ne + GUARD) * 2, cudaMemcpyDeviceToHost));
    for (size_t k = 0; k < GUARD; k++)
        if (got[ne + k] != POISON)
            fail_msg("%s: guard element %zu after dst written (0x%04x)", c->name, k, got[ne + k]);
    CK(cudaFree(dw));
    CK(cudaFree(ds));
    CK(cudaFree(dd));
    return got;
}

/* one case: returns the device result (caller frees) after checking it */
static uint16_t *run_case(const dcase *c, cudaStream_t st, uint8_t **wout, uint8_t **scout)
{
    uint8_t *w = xmalloc(code_bytes(c)), *sc = xmalloc(scale_bytes(c));
    make_weight(c, w, sc);
    uint16_t *got = run_device(c, w, sc, st, F16X2_NONE);
    const size_t bad = compare(c, got, w, sc, 1);
    printf("  %-28s %s %6lld x %-5lld block %3d rows [%lld, +%lld) scales 2^%d..2^%d: %zu of %lld differ\n", c->name,
           c->fmt == BCU_RW_FP8 ? "fp8" : "fp4", (long long)c->rows, (long long)c->cols, c->block, (long long)c->r0,
           (long long)c->n, c->smin - 127, c->smax - 127, bad, (long long)(c->n * c->cols));
    if (bad) fail_msg("%s: %zu elements differ from the reference", c->name, bad);
    if (wout) *wout = w;
    else free(w);
    if (scout) *scout = sc;
    else free(sc);
    return got;
}

static void run_cases(const dcase *cs, size_t nc)
{
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t i = 0; i < nc; i++) free(run_case(&cs[i], st, NULL, NULL));
    CK(cudaStreamDestroy(st));
}

#define S_LO (127 - 20) /* realistic scales: 2^-20 .. 2^4 */
#define S_HI (127 + 4)

/* ------------------------------------------------------------------ host tests */

static void test_reference_rounding(void **state)
{
    (void)state;
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x00007fffu, 0x00008000u, 0x00018000u,
                                    0x00400000u, 0x007fffffu, 0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                    0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0xff7f8000u};
    size_t n = sizeof edge / sizeof edge[0];
    for (size_t i = 0; i < n + 1000000; i++) {
        const uint32_t u = i < n ? edge[i] : (uint32_t)rnd();
        float f;
        memcpy(&f, &u, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) continue; /* NaN payloads: both quiet, not compared */
        if (rne_bf16(f) != md_f32_to_bf16(f))
            fail_msg("rne_bf16(0x%08x) = 0x%04x, md_f32_to_bf16 0x%04x", u, rne_bf16(f), md_f32_to_bf16(f));
    }
}

static void test_bad_arguments(void **state)
{
    (void)state;
    /* never dereferenced: every call below is refused (or n = 0) before any CUDA call */
    static _Alignas(16) uint8_t buf[256];
    uint16_t *dst = (uint16_t *)buf;
    const void *w = buf, *sc = buf;
    const cudaError_t inv = cudaErrorInvalidValue;
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_F32, 256, 256, 128, 0, 0, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_F32, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_BF16, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP4, w, sc, BCU_SC_F32, 256, 256, 32, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 24, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 1000, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP4, w, sc, BCU_SC_E8M0, 256, 48, 16, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP4, w, sc, BCU_SC_E8M0, 256, 96, 64, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 8, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 48, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 0, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP4, w, sc, BCU_SC_E8M0, 256, 256, 24, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, 200, 57, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, -1, 10, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, 0, -1, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst + 1, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, buf + 8, sc, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(NULL, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, NULL, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_BF16, w, sc, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_F16, w, sc, BCU_SC_E8M0, 256, 256, 128, 0, 256, 0), inv);
    /* n = 0 inside the weight is nothing to do */
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP8, w, sc, BCU_SC_E8M0, 256, 256, 128, 256, 0, 0), cudaSuccess);
    assert_int_equal(bcu_dequant_bf16(dst, BCU_RW_FP4, w, sc, BCU_SC_E8M0, 256, 256, 32, 7, 0, 0), cudaSuccess);
}

/* ------------------------------------------------------------------ GPU tests */

/* bcu_dequant_f16 with f16x2.h's shift for the weight's scale bytes: every element decodes (dtype.c's f16 reader)
 * to decode(code) * 2^(s - 127 + G) exactly, the product formed in double here; guard elements untouched.  Scale
 * spreads at f16x2.h's limits (22 binades FP8, 36 FP4) with the planted codes (+-448, subnormals, -0). */
static void test_f16(void **state)
{
    (void)state;
    const dcase cs[] = {
        {"v4 q_a-like, f16", BCU_RW_FP8, 1024, 4096, 128, 0, 1024, 110, 130, 0},
        {"v4 wq_b rows slice, f16", BCU_RW_FP8, 32768, 1024, 128, 12345, 4100, 100, 122, 0},
        {"block 16, 22 binades, f16", BCU_RW_FP8, 512, 2048, 16, 0, 512, 20, 42, 0},
        {"v4 expert, f16", BCU_RW_FP4, 2048, 4096, 32, 0, 2048, S_LO, S_HI, 0},
        {"block 16, 36 binades, f16", BCU_RW_FP4, 256, 4096, 16, 3, 250, 200, 236, 0},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const dcase *c = &cs[k];
        const size_t nb = code_bytes(c), ns = scale_bytes(c), ne = (size_t)(c->n * c->cols);
        uint8_t *w = xmalloc(nb), *sc = xmalloc(ns);
        make_weight(c, w, sc);
        const int G = f16x2_shift(c->fmt == BCU_RW_FP4, sc, ns);
        if (G == F16X2_NONE) fail_msg("%s: no f16 shift for scales %d..%d", c->name, c->smin, c->smax);
        uint16_t *got = run_device(c, w, sc, st, G); /* the guard elements checked there */
        size_t bad = 0, neg0 = 0;
        for (int64_t i = 0; i < c->n; i++)
            for (int64_t j = 0; j < c->cols; j++) {
                const int64_t r = c->r0 + i;
                const uint8_t code = code_at(c, w, r, j);
                const double v = c->fmt == BCU_RW_FP8 ? (double)md_e4m3_to_f32(code) : (double)md_fp4_lut[code];
                const double want = ldexp(v, scale_at(c, sc, r, j) - 127 + G);
                const uint16_t h = got[i * c->cols + j];
                const double g = (double)md_f16_to_f32(h);
                const int sign_ok = (h >> 15) == (signbit(v) ? 1u : 0u);
                neg0 += h == 0x8000u;
                if (g == want && sign_ok) continue;
                if (bad < MAX_REPORT)
                    printf("    row %lld col %lld: code 0x%02x scale byte %u: got %a (0x%04x), want %a\n", (long long)r,
                           (long long)j, code, scale_at(c, sc, r, j), g, h, want);
                bad++;
            }
        printf("  %-28s %s %6lld x %-5lld block %3d scales 2^%d..2^%d, shift %d: %zu of %zu differ (%zu -0)\n", c->name,
               c->fmt == BCU_RW_FP8 ? "fp8" : "fp4", (long long)c->rows, (long long)c->cols, c->block, c->smin - 127,
               c->smax - 127, G, bad, ne, neg0);
        if (bad) fail_msg("%s: %zu elements are not the exact f16 product", c->name, bad);
        if (c->fmt == BCU_RW_FP8 && !neg0) fail_msg("%s: no -0 came out: the planted codes are missing", c->name);
        free(got); free(w); free(sc);
    }
    CK(cudaStreamDestroy(st));
}

static void test_fp8_v4(void **state)
{
    (void)state;
    const dcase cs[] = {
        {"v4 q_a-like", BCU_RW_FP8, 1024, 4096, 128, 0, 1024, S_LO, S_HI, 0},
        {"v4 wq_b", BCU_RW_FP8, 32768, 1024, 128, 0, 32768, S_LO, S_HI, 0},
        {"v4 wq_b rows slice", BCU_RW_FP8, 32768, 1024, 128, 12345, 4100, S_LO, S_HI, 0},
    };
    run_cases(cs, sizeof cs / sizeof cs[0]);
}

static void test_fp8_ragged(void **state)
{
    (void)state;
    const dcase cs[] = {
        {"ragged", BCU_RW_FP8, 300, 1040, 128, 0, 300, S_LO, S_HI, 0},
        {"ragged last rows", BCU_RW_FP8, 300, 1040, 128, 257, 43, S_LO, S_HI, 0},
        {"slice", BCU_RW_FP8, 1000, 4096, 128, 130, 517, S_LO, S_HI, 0},
        {"one row", BCU_RW_FP8, 1, 16, 128, 0, 1, S_LO, S_HI, 0},
        {"one row of many", BCU_RW_FP8, 77, 48, 128, 76, 1, S_LO, S_HI, 0},
        {"block 16", BCU_RW_FP8, 37, 48, 16, 0, 37, S_LO, S_HI, 0},
        {"block 16 slice", BCU_RW_FP8, 37, 48, 16, 3, 30, S_LO, S_HI, 0},
        {"block 64", BCU_RW_FP8, 129, 208, 64, 0, 129, S_LO, S_HI, 0},
        {"block 256", BCU_RW_FP8, 600, 272, 256, 1, 598, S_LO, S_HI, 0},
        {"every scale byte", BCU_RW_FP8, 512, 4096, 16, 0, 512, 0, 254, 0},
    };
    run_cases(cs, sizeof cs / sizeof cs[0]);
}

static void test_fp4(void **state)
{
    (void)state;
    const dcase cs[] = {
        {"v4 expert", BCU_RW_FP4, 2048, 4096, 32, 0, 2048, S_LO, S_HI, 0},
        {"v4 expert rows slice", BCU_RW_FP4, 2048, 4096, 32, 1000, 333, S_LO, S_HI, 0},
        {"ragged", BCU_RW_FP4, 333, 96, 32, 0, 333, S_LO, S_HI, 0},
        {"slice", BCU_RW_FP4, 200, 4096, 32, 5, 100, S_LO, S_HI, 0},
        {"one row", BCU_RW_FP4, 1, 32, 32, 0, 1, S_LO, S_HI, 0},
        {"block 16 (V4.1)", BCU_RW_FP4, 45, 160, 16, 0, 45, S_LO, S_HI, 0},
        {"block 64", BCU_RW_FP4, 70, 192, 64, 2, 67, S_LO, S_HI, 0},
        {"every scale byte", BCU_RW_FP4, 256, 4096, 32, 0, 256, 0, 254, 0},
        {"every scale byte block 16", BCU_RW_FP4, 256, 1024, 16, 0, 256, 0, 254, 0},
    };
    run_cases(cs, sizeof cs / sizeof cs[0]);
}

static void test_nan_inputs(void **state)
{
    (void)state;
    const dcase cs[] = {
        {"NaN codes and scales", BCU_RW_FP8, 96, 512, 32, 0, 96, S_LO, S_HI, 1},
        {"NaN scales", BCU_RW_FP4, 96, 512, 32, 0, 96, S_LO, S_HI, 1},
    };
    run_cases(cs, sizeof cs / sizeof cs[0]);
}

/* the comparison sees one changed bit, and -0 against +0 */
static void test_negative_control(void **state)
{
    (void)state;
    const dcase c = {"negative control", BCU_RW_FP8, 200, 256, 128, 0, 200, S_LO, S_HI, 0};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint8_t *w, *sc;
    uint16_t *got = run_case(&c, st, &w, &sc);
    const size_t ne = (size_t)(c.n * c.cols);
    const size_t k = (size_t)(rnd() % ne);
    got[k] ^= 1u;
    const size_t bad1 = compare(&c, got, w, sc, 0);
    got[k] ^= 1u;
    size_t z = ne;
    for (size_t i = 0; i < ne && z == ne; i++)
        if (got[i] == 0x8000u) z = i; /* a -0 (the planted 0x80 codes) */
    if (z == ne) fail_msg("no -0 in the result: the planted codes are missing");
    got[z] = 0;
    const size_t bad2 = compare(&c, got, w, sc, 0);
    printf("  one flipped bit at %zu: %zu differ; -0 -> +0 at %zu: %zu differ\n", k, bad1, z, bad2);
    assert_int_equal(bad1, 1);
    assert_int_equal(bad2, 1);
    free(got);
    free(w);
    free(sc);
    CK(cudaStreamDestroy(st));
}

int main(void)
{
    const char *filter = getenv("TEST_CUDA_DEQUANT_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_reference_rounding),
        cmocka_unit_test(test_bad_arguments),
    };
    const int cpu_fail = cmocka_run_group_tests_name("cpu", cpu, NULL, NULL);
    if (!cuda_device_present()) return cpu_fail ? 1 : 77;
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_negative_control), cmocka_unit_test(test_fp8_v4),     cmocka_unit_test(test_fp8_ragged),
        cmocka_unit_test(test_fp4),              cmocka_unit_test(test_nan_inputs),       cmocka_unit_test(test_f16),
    };
    const int gpu_fail = cmocka_run_group_tests_name("gpu", gpu, NULL, NULL);
    return cpu_fail || gpu_fail ? 1 : 0;
}
