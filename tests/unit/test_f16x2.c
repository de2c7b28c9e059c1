/* test_f16x2.c - src/backend/f16x2.h's rule, on the host: for which ue8m0 scale bytes one shift G makes every FP8
 * (e4m3) or FP4 (e2m1) weight element an f16 value exactly, and that G is the largest.  The reference here is
 * independent of the header: every code value (decoded from its bits below, not from dtype.c) times 2^(s - 127 +
 * G) for every scale byte s of the set, tested for f16 representability by its binary expansion. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/f16x2.h"
#include "test_rng.h"

/* e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 subnormal; 0x7f / 0xff NaN (skipped) */
static double e4m3(int b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    return b & 0x80 ? -v : v;
}

/* e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 subnormal (0, 0.5) */
static double e2m1(int b)
{
    const int e = (b >> 1) & 3, m = b & 1;
    const double v = e ? ldexp(2 + m, e - 2) : ldexp(m, -1);
    return b & 8 ? -v : v;
}

/* is v an IEEE binary16 value: |v| <= 65504, and a multiple of 2^-24 with at most 11 significant bits */
static int f16_exact(double v)
{
    double a = fabs(v);
    if (a == 0) return 1;
    if (!(a <= 65504.0)) return 0;
    int e;
    (void)frexp(a, &e); /* a = f 2^e, f in [0.5, 1): the leading bit is 2^(e - 1) */
    const int lowest = e - 1 >= -14 ? e - 11 : -24; /* the weight of the last bit f16 keeps there */
    const double q = ldexp(a, -lowest);
    return q == floor(q);
}

/* does shift G make every value of the format times every scale in sc[0..n) an f16 */
static int all_exact(int fp4, const uint8_t *sc, size_t n, int G)
{
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < (fp4 ? 16 : 256); b++) {
            if (!fp4 && (b & 0x7f) == 0x7f) continue;
            const double v = (fp4 ? e2m1(b) : e4m3(b)) * ldexp(1.0, sc[i] - 127 + G);
            if (!f16_exact(v)) return 0;
        }
    return 1;
}

/* the reference's own largest G for a set, or F16X2_NONE (a byte 255 is a NaN scale: none) */
static int ref_shift(int fp4, const uint8_t *sc, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (sc[i] == 255) return F16X2_NONE;
    for (int G = 400; G >= -400; G--)
        if (all_exact(fp4, sc, n, G)) return G;
    return F16X2_NONE;
}

/* the reference's own checks first: known f16 values and known non-values */
static void test_reference(void **st)
{
    (void)st;
    assert_true(f16_exact(65504.0) && f16_exact(0x1p-24) && f16_exact(0x1.ff8p-15) && f16_exact(2049.0 - 1.0));
    assert_false(f16_exact(65505.0) || f16_exact(0x1p-25) || f16_exact(2049.0) || f16_exact(0x1.ffcp-15) || f16_exact(0x1.002p-14 + 0x1p-26));
    assert_true(e4m3(0x7e) == 448.0 && e4m3(0x01) == 0x1p-9 && e4m3(0x08) == 0x1p-6 && e4m3(0xb8) == -1.0);
    assert_true(e2m1(7) == 6.0 && e2m1(1) == 0.5 && e2m1(0xa) == -1.0);
}

/* sets of scale bytes around the rule's edges (spread 0 .. 40, bytes near 0 and 254, a 255) and at random: the
 * header's shift equals the reference's everywhere */
static void test_rule(void **st)
{
    (void)st;
    size_t sets = 0, none = 0;
    for (int fp4 = 0; fp4 <= 1; fp4++) {
        for (int spread = 0; spread <= 40; spread++)
            for (int base = 0; base + spread <= 255; base += 37) {
                const uint8_t sc[3] = {(uint8_t)base, (uint8_t)(base + spread / 2), (uint8_t)(base + spread)};
                const int g = f16x2_shift(fp4, sc, 3), r = ref_shift(fp4, sc, 3);
                if (g != r) fail_msg("fp4=%d scales %d..%d: shift %d, reference %d", fp4, base, base + spread, g, r);
                none += g == F16X2_NONE;
                sets++;
            }
        for (int k = 0; k < 200; k++) {
            uint8_t sc[16];
            const int base = (int)(rnd() % 230), spread = (int)(rnd() % 26);
            for (int i = 0; i < 16; i++) sc[i] = (uint8_t)(base + (int)(rnd() % (uint64_t)(spread + 1)));
            if (k % 50 == 0) sc[k % 16] = 255;
            const int g = f16x2_shift(fp4, sc, 16), r = ref_shift(fp4, sc, 16);
            if (g != r) fail_msg("fp4=%d random set %d: shift %d, reference %d", fp4, k, g, r);
            none += g == F16X2_NONE;
            sets++;
        }
    }
    printf("  %zu scale sets, %zu without a shift: the header agrees with the reference on all\n", sets, none);
    /* the edges, stated: FP8 spreads up to 22 binades, FP4 up to 36 */
    const uint8_t a[2] = {100, 122}, b[2] = {100, 123}, c[2] = {100, 136}, d[2] = {100, 137};
    assert_int_equal(f16x2_shift(0, a, 2), 134 - 122);
    assert_int_equal(f16x2_shift(0, b, 2), F16X2_NONE);
    assert_int_equal(f16x2_shift(1, c, 2), 140 - 136);
    assert_int_equal(f16x2_shift(1, d, 2), F16X2_NONE);
    assert_int_equal(f16x2_shift(0, NULL, 0), F16X2_NONE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
