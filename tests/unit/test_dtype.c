/* test_dtype.c - number formats against ml_dtypes.
 *
 * Every code of e4m3, ue8m0, fp4, bf16 and f16 is decoded and compared bit
 * for bit with the tables tools/gen_dtype_fixture.py wrote from ml_dtypes
 * (NaN codes: "is NaN" only).  The encoders are checked on ~6000 fixed
 * inputs (edges, ties, subnormals, overflow, NaN, pseudo-random) against
 * ml_dtypes' casts with the contract's saturation rules.  The row
 * dequantizers are checked against the same reference tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "model/dtype.h"

static void *load(const char *name, size_t expect_bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DTYPE_FIXTURE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s", path);
    void *buf = malloc(expect_bytes + 1);
    size_t got = fread(buf, 1, expect_bytes + 1, f);
    fclose(f);
    if (got != expect_bytes) fail_msg("fixture %s: %zu bytes, expected %zu", path, got, expect_bytes);
    return buf;
}

static size_t file_size(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DTYPE_FIXTURE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return (size_t)n;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* got must equal want bit for bit, or both be NaN */
static void same(const char *what, unsigned code, float got, float want) {
    if (isnan(want)) {
        if (!isnan(got)) fail_msg("%s code 0x%x: got %a, want NaN", what, code, got);
        return;
    }
    if (bits(got) != bits(want))
        fail_msg("%s code 0x%x: got %a (0x%08x), want %a (0x%08x)", what, code, got, bits(got), want,
                 bits(want));
}

static void test_decode_e4m3(void **state) {
    float *ref = load("e4m3.bin", 256 * 4);
    for (unsigned c = 0; c < 256; c++) same("e4m3", c, md_e4m3_to_f32((uint8_t)c), ref[c]);
    assert_true(isnan(ref[0x7f]) && isnan(ref[0xff])); /* the fixture agrees with the spec */
    assert_true(ref[0x7e] == 448.0f);
    free(ref);
}

static void test_decode_ue8m0(void **state) {
    float *ref = load("ue8m0.bin", 256 * 4);
    for (unsigned c = 0; c < 256; c++) same("ue8m0", c, md_ue8m0_to_f32((uint8_t)c), ref[c]);
    assert_true(ref[127] == 1.0f && isnan(ref[255]));
    free(ref);
}

static void test_decode_fp4(void **state) {
    float *ref = load("fp4.bin", 16 * 4);
    for (unsigned c = 0; c < 16; c++) same("fp4 lut", c, md_fp4_lut[c], ref[c]);
    /* the packed row decoder is the only other fp4 decoder: one byte per code pair */
    uint8_t packed[8], scale = 127;
    for (unsigned c = 0; c < 16; c += 2) packed[c / 2] = (uint8_t)(c | (c + 1) << 4);
    float out[16];
    md_fp4_row_to_f32(packed, &scale, 16, 16, out);
    for (unsigned c = 0; c < 16; c++) same("fp4 row", c, out[c], ref[c]);
    free(ref);
}

static void test_decode_bf16_f16(void **state) {
    float *rb = load("bf16.bin", 65536 * 4), *rh = load("f16.bin", 65536 * 4);
    uint16_t *all = malloc(65536 * 2);
    float *row = malloc(65536 * 4);
    for (unsigned c = 0; c < 65536; c++) {
        all[c] = (uint16_t)c;
        same("bf16", c, md_bf16_to_f32((uint16_t)c), rb[c]);
        same("f16", c, md_f16_to_f32((uint16_t)c), rh[c]);
    }
    /* odd length and offset start, so vector tails are exercised */
    md_bf16_row_to_f32(all + 1, row + 1, 65535);
    for (unsigned c = 1; c < 65536; c++) same("bf16 row", c, row[c], rb[c]);
    md_f16_row_to_f32(all + 3, row + 3, 65533);
    for (unsigned c = 3; c < 65536; c++) same("f16 row", c, row[c], rh[c]);
    free(rb);
    free(rh);
    free(all);
    free(row);
}

static void test_encode(void **state) {
    size_t n = file_size("enc_in.bin") / 4;
    assert_true(n > 4000);
    float *x = load("enc_in.bin", n * 4);
    uint8_t *e4 = load("enc_e4m3.bin", n), *f4 = load("enc_fp4.bin", n);
    uint16_t *b16 = load("enc_bf16.bin", n * 2);
    int nan_seen = 0, sat_seen = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t g = md_f32_to_e4m3(x[i]);
        if (g != e4[i])
            fail_msg("e4m3 encode [%zu] %a (0x%08x): got 0x%02x, want 0x%02x", i, x[i], bits(x[i]), g,
                     e4[i]);
        g = md_f32_to_fp4(x[i]);
        if (g != f4[i])
            fail_msg("fp4 encode [%zu] %a (0x%08x): got 0x%x, want 0x%x", i, x[i], bits(x[i]), g, f4[i]);
        uint16_t h = md_f32_to_bf16(x[i]);
        if (isnan(x[i])) {
            nan_seen++;
            if (!isnan(md_bf16_to_f32(h))) fail_msg("bf16 encode [%zu] NaN: got 0x%04x", i, h);
        } else if (h != b16[i]) {
            fail_msg("bf16 encode [%zu] %a (0x%08x): got 0x%04x, want 0x%04x", i, x[i], bits(x[i]), h,
                     b16[i]);
        }
        if (fabsf(x[i]) > 464.0f && !isnan(x[i])) sat_seen++;
    }
    assert_true(nan_seen >= 2 && sat_seen >= 10); /* the fixture covers what it claims */
    free(x);
    free(e4);
    free(f4);
    free(b16);
}

/* Hand-checked values from the spec (model-v4.md §5), independent of the fixture. */
static void test_spec_examples(void **state) {
    assert_int_equal(md_f32_to_e4m3(448.0f), 0x7e);
    assert_int_equal(md_f32_to_e4m3(1e6f), 0x7e);
    assert_int_equal(md_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(md_f32_to_e4m3(NAN), 0x7f);
    assert_int_equal(md_f32_to_e4m3(1.0f), 0x38);
    assert_int_equal(md_f32_to_e4m3(0x1p-9f), 0x01);   /* smallest subnormal */
    assert_int_equal(md_f32_to_e4m3(0x1p-10f), 0x00);  /* tie -> even (0) */
    assert_int_equal(md_f32_to_e4m3(0x3p-10f), 0x02);  /* 1.5 steps -> 2 (even) */
    assert_true(md_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_int_equal(md_f32_to_fp4(0.25f), 0);  /* tie between 0 and 0.5 -> 0 */
    assert_int_equal(md_f32_to_fp4(0.75f), 2);  /* tie between 0.5 and 1 -> 1 */
    assert_int_equal(md_f32_to_fp4(5.0f), 6);   /* tie between 4 and 6 -> 4 */
    assert_int_equal(md_f32_to_fp4(-100.0f), 15);
    assert_int_equal(md_f32_to_fp4(-0.1f), 8);
    assert_int_equal(md_f32_to_bf16(1.0f), 0x3f80);
    assert_true(md_ue8m0_to_f32(128) == 2.0f && md_ue8m0_to_f32(0) == 0x1p-127f);
    assert_true(md_f16_to_f32(0x3c00) == 1.0f && md_f16_to_f32(0x0001) == 0x1p-24f);
    /* packing: byte 0xA0 -> element 0 = 0.0, element 1 = -1.0 (spec §5.4) */
    uint8_t b = 0xA0, s = 127;
    float out[2];
    md_fp4_row_to_f32(&b, &s, 2, 32, out);
    assert_true(out[0] == 0.0f && out[1] == -1.0f);
}

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_fp8_row(void **state) {
    float *e4 = load("e4m3.bin", 1024), *e8 = load("ue8m0.bin", 1024);
    enum { ROWS = 300, COLS = 333, BS = 128 }; /* ragged in both directions */
    size_t sr = (ROWS + BS - 1) / BS, sc = (COLS + BS - 1) / BS;
    uint8_t *w = malloc(ROWS * COLS), *s8 = malloc(sr * sc);
    float *s32 = malloc(sr * sc * 4), out[COLS];
    for (size_t i = 0; i < ROWS * COLS; i++) {
        w[i] = (uint8_t)rnd();
        if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1; /* keep NaN out of the products */
    }
    for (size_t i = 0; i < sr * sc; i++) {
        s8[i] = (uint8_t)(110 + rnd() % 30);
        s32[i] = (float)(rnd() % 1000) / 64.0f;
    }
    for (size_t r = 0; r < ROWS; r++) {
        md_fp8_row_to_f32(w + r * COLS, s8, MD_F8_E8M0, r, COLS, BS, out);
        for (size_t j = 0; j < COLS; j++) {
            float want = e4[w[r * COLS + j]] * e8[s8[(r / BS) * sc + j / BS]];
            if (bits(out[j]) != bits(want)) fail_msg("fp8 row %zu col %zu: %a vs %a", r, j, out[j], want);
        }
        md_fp8_row_to_f32(w + r * COLS, s32, MD_F32, r, COLS, BS, out);
        for (size_t j = 0; j < COLS; j++) {
            float want = e4[w[r * COLS + j]] * s32[(r / BS) * sc + j / BS];
            if (bits(out[j]) != bits(want)) fail_msg("fp8/f32 row %zu col %zu: %a vs %a", r, j, out[j], want);
        }
    }
    free(e4);
    free(e8);
    free(w);
    free(s8);
    free(s32);
}

static void check_fp4(size_t cols, size_t bs, const float *lut, const float *e8) {
    uint8_t packed[256], scales[64];
    float out[512];
    for (size_t i = 0; i < (cols + 1) / 2; i++) packed[i] = (uint8_t)rnd();
    for (size_t i = 0; i < (cols + bs - 1) / bs; i++) scales[i] = (uint8_t)(100 + rnd() % 60);
    md_fp4_row_to_f32(packed, scales, cols, bs, out);
    for (size_t j = 0; j < cols; j++) {
        uint8_t code = j % 2 ? packed[j / 2] >> 4 : packed[j / 2] & 15;
        float want = lut[code] * e8[scales[j / bs]];
        if (bits(out[j]) != bits(want))
            fail_msg("fp4 cols %zu bs %zu elem %zu: %a vs %a", cols, bs, j, out[j], want);
    }
}

static void test_fp4_row(void **state) {
    float *lut = load("fp4.bin", 64), *e8 = load("ue8m0.bin", 1024);
    check_fp4(512, 32, lut, e8);
    check_fp4(512, 16, lut, e8);
    check_fp4(200, 32, lut, e8); /* ragged last block */
    check_fp4(99, 32, lut, e8);  /* odd tail */
    check_fp4(45, 3, lut, e8);   /* odd block size */
    free(lut);
    free(e8);
}

static void test_names(void **state) {
    static const char *names[] = {"BF16", "F16", "F32",  "F64",     "I8",     "U8",
                                  "I16",  "I32", "I64",  "BOOL",    "F8_E4M3", "F8_E8M0"};
    static const size_t sizes[] = {2, 2, 4, 8, 1, 1, 2, 4, 8, 1, 1, 1};
    for (int d = 0; d < MD_DTYPE_COUNT; d++) {
        md_dtype got;
        assert_string_equal(md_dtype_name((md_dtype)d), names[d]);
        assert_int_equal(md_dtype_parse(names[d], &got), 0);
        assert_int_equal(got, d);
        assert_int_equal(md_dtype_size((md_dtype)d), sizes[d]);
    }
    md_dtype got;
    assert_int_equal(md_dtype_parse("F8_E5M2", &got), RC_EUNSUP);
    assert_int_equal(md_dtype_parse("bf16", &got), RC_EUNSUP);
    assert_int_equal(md_dtype_parse("", &got), RC_EUNSUP);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_e4m3),   cmocka_unit_test(test_decode_ue8m0),
        cmocka_unit_test(test_decode_fp4),    cmocka_unit_test(test_decode_bf16_f16),
        cmocka_unit_test(test_encode),        cmocka_unit_test(test_spec_examples),
        cmocka_unit_test(test_fp8_row),       cmocka_unit_test(test_fp4_row),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
