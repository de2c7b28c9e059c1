/* test_cuda_graph.c - the device graph ops (src/backend/cuda/graph.cu) against
 * host references that mirror src/model/v4.c's loops (and src/model/dtype.c's
 * codecs, called directly).
 *
 * First, on any machine: the comparisons themselves are checked (a perturbed
 * or bit-flipped output is rejected, a NaN must meet a NaN) and the fake-quant
 * boundary data is checked to really sit on e4m3 / e2m1 rounding ties.  Then,
 * without a CUDA device, it prints "SKIPPED: no CUDA device" and exits 77
 * (CTest: skipped).
 *
 * On a GPU, per op, random inputs at small sizes and V4-Flash sizes (D 4096,
 * hc_mult 4, moe_inter 2048, 256 experts top-6, head_dim 512, rope_dim 64,
 * index_head_dim 128) with R in {1, 7, 300} (mHC: {1, 3, 7, 64, 256, 300},
 * hc_mult 1 to 6 and 16):
 *   bit for bit   embed (bf16/f16 tables of random codes: NaN, inf,
 *                 subnormals), gather, scale, add, hc_post, hadamard, fq_fp8
 *                 and fq_fp4 (ties, +-1 ulp around ties, subnormals, NaN,
 *                 tails, untouched padding), route idx (and, where the scores
 *                 are exact: logits > 20 under sqrt-softplus, also wt), the
 *                 channels RoPE does not touch;
 *                 hc_pre (coll, post, comb) and hc_head where scales of 0
 *                 and bases of 0 / +-200 make every transcendental exact
 *                 (the parallel softmax, Sinkhorn and collapse bit for bit),
 *                 by the block path and with the dot products given
 *                 (mixes_in_ws);
 *   1e-5          per row, max |gpu - ref| / max |ref|: hc_pre (coll, post,
 *                 comb; also with v4.c's dot products given), hc_head, rope,
 *                 swiglu, route wt, comp_pool (per entry);
 *   route idx on inexact scores: equal, except that a disagreement is
 *                 allowed at a near-tie of the reference's values (counted);
 *   repeat        a second run is bit-identical; a row alone (R = 1) gives
 *                 the bits it gets inside a batch;
 *   fused         hc_pre / hc_head with the RMSNorm after it in one kernel
 *                 (bcu_hc_pre_norm): the bits of the two calls (coll, post,
 *                 comb) and of bcu_fq_fp8 on a copy of coll (xq); RMSNorm with the RoPE after it (bcu_norm_rope): the
 *                 bits of bcu_rmsnorm then bcu_rope; hc_post of f + f2
 *                 (bcu_hc_post_add): the bits of bcu_add then bcu_hc_post;
 *                 a decline for rows they do not fit.
 * A negative control in every GPU comparison perturbs the device's output and
 * checks that the comparison fails.  TEST_CUDA_GRAPH_FILTER (cmocka glob)
 * picks tests. */
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

#include "backend/backend.h"
#include "base/greedy.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/graph.h"
#include "model/dtype.h"

#define TOL 1e-5
#define TIE_TOL 1e-6 /* route: a near-tie, relative to the row's largest |value| */

#include "test_rng.h"

static const size_t Rs[] = {1, 7, 300};
#define NR (sizeof Rs / sizeof Rs[0])

/* ------------------------------------------------------------------ helpers */

#define CK(call)                                                                                                  \
    do {                                                                                                          \
        cudaError_t r_ = (call);                                                                                  \
        if (r_ != cudaSuccess) fail_msg("%s: %s (%s:%d)", #call, cudaGetErrorString(r_), __FILE__, __LINE__);     \
    } while (0)

/* launch, then wait, so that an asynchronous fault is reported at its call */
#define RUN(call)                                                                                                 \
    do {                                                                                                          \
        CK(call);                                                                                                 \
        CK(cudaDeviceSynchronize());                                                                              \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) fail_msg("out of host memory (%zu bytes)", n);
    return p;
}

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes ? bytes : 4));
    return p;
}

static void *up(const void *src, size_t bytes)
{
    void *d = dmalloc(bytes);
    if (bytes) CK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void down(void *dst, const void *src, size_t bytes)
{
    if (bytes) CK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static float *rand_floats(size_t n, float amp)
{
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = amp * unif();
    return x;
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* rounded products and sums: the reference must not be contracted into FMAs
 * (the device rounds each operation, as v4.c does on x86-64) */
static float rmul(float a, float b)
{
    volatile float p = a * b;
    return p;
}
static float radd(float a, float b)
{
    volatile float s = a + b;
    return s;
}

/* first index whose bits differ (any NaN equals any NaN), -1 if none */
static long bits_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i])) continue;
        if (bits(a[i]) != bits(b[i])) return (long)i;
    }
    return -1;
}

/* max over rows of max |got - ref| / max |ref| (absolute for a zero row);
 * a NaN or an infinity in ref must be met exactly, and got must not invent one */
static double row_err(const float *got, const float *ref, size_t rows, size_t width)
{
    double worst = 0;
    for (size_t r = 0; r < rows; r++) {
        double mag = 0, d = 0;
        for (size_t i = r * width; i < (r + 1) * width; i++) {
            if (isnan(ref[i]) || isinf(ref[i])) {
                if (!(isnan(ref[i]) ? isnan(got[i]) : got[i] == ref[i])) return INFINITY;
                continue;
            }
            if (!isfinite(got[i])) return INFINITY;
            mag = fmax(mag, fabs(ref[i]));
            d = fmax(d, fabs((double)got[i] - ref[i]));
        }
        const double e = mag > 0 ? d / mag : d;
        if (e > worst) worst = e;
    }
    return worst;
}

/* the negative controls: a copy of got, perturbed at one element by 1e-4 of
 * its row's magnitude (toler.) or by one ulp (bitwise), must be rejected */
static void control_tol(const char *what, const float *got, const float *ref, size_t rows, size_t width)
{
    const size_t n = rows * width;
    float *bad = xmalloc(n * sizeof *bad);
    memcpy(bad, got, n * sizeof *bad);
    const size_t r = (size_t)(rnd() % rows);
    double mag = 0;
    for (size_t i = r * width; i < (r + 1) * width; i++)
        if (isfinite(ref[i])) mag = fmax(mag, fabs(ref[i]));
    size_t at = r * width + (size_t)(rnd() % width);
    for (size_t k = 0; k < width && !isfinite(ref[at]); k++) at = r * width + (at + 1 - r * width) % width;
    bad[at] = (float)(bad[at] + 1e-4 * (mag > 0 ? mag : 1));
    if (!(row_err(bad, ref, rows, width) > TOL)) fail_msg("%s: the perturbed output was not rejected", what);
    free(bad);
}

static void control_bits(const char *what, const float *got, size_t n)
{
    float *bad = xmalloc(n * sizeof *bad);
    memcpy(bad, got, n * sizeof *bad);
    const size_t at = (size_t)(rnd() % n);
    uint32_t u = bits(bad[at]) ^ 1u;
    memcpy(&bad[at], &u, 4);
    if (isnan(bad[at]) && isnan(got[at])) { /* one NaN for another: use a number */
        bad[at] = 1.0f;
    }
    if (bits_diff(bad, got, n) != (long)at) fail_msg("%s: a one-bit change was not detected", what);
    free(bad);
}

static void expect_bits(const char *what, const float *got, const float *ref, size_t n)
{
    const long d = bits_diff(got, ref, n);
    if (d >= 0)
        fail_msg("%s: element %ld is %a (0x%08x), expected %a (0x%08x)", what, d, (double)got[d], bits(got[d]),
                 (double)ref[d], bits(ref[d]));
    control_bits(what, got, n);
}

static void expect_tol(const char *what, const float *got, const float *ref, size_t rows, size_t width,
                       double *worst)
{
    const double e = row_err(got, ref, rows, width);
    if (!(e <= TOL)) {
        /* say where */
        for (size_t r = 0; r < rows; r++)
            if (!(row_err(got + r * width, ref + r * width, 1, width) <= TOL))
                for (size_t i = r * width; i < (r + 1) * width; i++)
                    if (!(got[i] == ref[i] || (isnan(got[i]) && isnan(ref[i]))))
                        fail_msg("%s: relative error %.3g > %.0e (row %zu, element %zu: %.9g, expected %.9g)", what,
                                 e, TOL, r, i - r * width, (double)got[i], (double)ref[i]);
        fail_msg("%s: relative error %.3g > %.0e", what, e, TOL);
    }
    if (worst && e > *worst) *worst = e;
    control_tol(what, got, ref, rows, width);
}

/* ------------------------------------------------------------------ references (v4.c) */

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }


static float pow2_ceil(float v)
{
    int e;
    float f = frexpf(v, &e);
    return ldexpf(1.0f, f == 0.5f ? e - 1 : e);
}

static float fq_scale(float amax, int fp4)
{
    return fp4 ? pow2_ceil(amax * (1.0f / 6.0f)) : pow2_ceil(amax * (1.0f / 448.0f));
}
static float fq_floor(int fp4) { return fp4 ? 6.0f * ldexpf(1.0f, -126) : 1e-4f; }

static void ref_fq(float *x, size_t n, size_t block, int fp4)
{
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        float amax = fq_floor(fp4);
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float sc = fq_scale(amax, fp4);
        for (size_t i = b0; i < b1; i++)
            x[i] = fp4 ? md_fp4_lut[md_f32_to_fp4(x[i] / sc)] * sc : md_e4m3_to_f32(md_f32_to_e4m3(x[i] / sc)) * sc;
    }
}

static void ref_hadamard(float *x, size_t n)
{
    for (size_t h = 1; h < n; h *= 2)
        for (size_t i = 0; i < n; i += 2 * h)
            for (size_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void ref_rope(float *x, int rd, const float *inv_freq, int64_t pos, int inverse)
{
    for (int i = 0; i < rd / 2; i++) {
        float ang = rmul((float)pos, inv_freq[i]);
        float c = cosf(ang), s = sinf(ang);
        if (inverse) s = -s;
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = rmul(x0, c) - rmul(x1, s);
        x[2 * i + 1] = rmul(x1, c) + rmul(x0, s);
    }
}

static void ref_swiglu(float *gt, const float *upv, size_t n, float limit, float rw, int has_rw)
{
    for (size_t i = 0; i < n; i++) {
        float g = gt[i], u = upv[i];
        if (limit > 0) {
            g = fminf(g, limit);
            u = fmaxf(-limit, fminf(u, limit));
        }
        gt[i] = g / (1.0f + expf(-g)) * u;
        if (has_rw) gt[i] *= rw;
    }
}

typedef struct {
    int n, D, iters;
    float hc_eps, rms_eps;
    float *fn, *base, *scale; /* host */
} hc_host;

/* hc_pre_task (head = 0) / hc_head_task (head = 1) for one row */
static void ref_hc(const hc_host *p, const float *x, float *coll, float *post, float *C, int head)
{
    const int n = p->n, D = p->D, mix = head ? n : (2 + n) * n;
    const float eps = p->hc_eps;
    double ss = 0;
    for (int i = 0; i < n * D; i++) ss += (double)x[i] * x[i];
    float rs = 1.0f / sqrtf((float)(ss / (double)(n * D)) + p->rms_eps);
    float mixes[(2 + 16) * 16];
    for (int k = 0; k < mix; k++) mixes[k] = be_dot_f32(p->fn + (size_t)k * n * D, x, (size_t)n * D) * rs; /* v4.c's own dot */
    float pre[16];
    for (int i = 0; i < n; i++) {
        pre[i] = sigmoidf_(radd(rmul(mixes[i], p->scale[0]), p->base[i])) + eps;
        if (!head) post[i] = 2.0f * sigmoidf_(radd(rmul(mixes[n + i], p->scale[1]), p->base[n + i]));
    }
    if (!head) {
        for (int i = 0; i < n; i++) {
            float mx = -INFINITY;
            for (int k = 0; k < n; k++) {
                C[i * n + k] = radd(rmul(mixes[2 * n + i * n + k], p->scale[2]), p->base[2 * n + i * n + k]);
                mx = fmaxf(mx, C[i * n + k]);
            }
            float s = 0;
            for (int k = 0; k < n; k++) s += (C[i * n + k] = expf(C[i * n + k] - mx));
            for (int k = 0; k < n; k++) C[i * n + k] = C[i * n + k] / s + eps;
        }
        for (int it = 0; it < p->iters; it++) {
            if (it > 0)
                for (int i = 0; i < n; i++) {
                    float s = 0;
                    for (int k = 0; k < n; k++) s += C[i * n + k];
                    for (int k = 0; k < n; k++) C[i * n + k] /= s + eps;
                }
            for (int k = 0; k < n; k++) {
                float s = 0;
                for (int i = 0; i < n; i++) s += C[i * n + k];
                for (int i = 0; i < n; i++) C[i * n + k] /= s + eps;
            }
        }
    }
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int i = 0; i < n; i++) acc = radd(acc, rmul(pre[i], x[(size_t)i * D + d]));
        coll[d] = acc;
    }
}

/* hc_post_task for one row */
static void ref_hc_post(float *x, const float *f, const float *post, const float *C, int n, int D)
{
    float *tmp = xmalloc((size_t)n * D * sizeof *tmp);
    for (int k = 0; k < n; k++)
        for (int d = 0; d < D; d++) {
            float acc = rmul(post[k], f[d]);
            for (int i = 0; i < n; i++) acc = radd(acc, rmul(C[i * n + k], x[(size_t)i * D + d]));
            tmp[(size_t)k * D + d] = acc;
        }
    memcpy(x, tmp, (size_t)n * D * sizeof *tmp);
    free(tmp);
}

/* moe()'s routing for one row; v[e] = score + bias (for the near-tie check) */
static void ref_route(const bcu_route_args *a, const float *logit, int32_t tok, int32_t *ix, float *wt, float *v)
{
    const int E = a->E, K = a->K;
    float *s = xmalloc((size_t)E * sizeof *s);
    for (int e = 0; e < E; e++) s[e] = a->score_func == 1 ? sigmoidf_(logit[e]) : sqrtf(softplusf_(logit[e]));
    if (a->tid2eid) {
        memcpy(ix, a->tid2eid + (size_t)tok * K, (size_t)K * sizeof(int32_t));
    } else {
        for (int e = 0; e < E; e++) v[e] = s[e] + a->bias[e];
        for (int k = 0; k < K; k++) {
            int best = -1;
            float bv = -INFINITY;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < k; q++) taken |= ix[q] == e;
                if (!taken && (best < 0 || v[e] > bv)) {
                    best = e;
                    bv = v[e];
                }
            }
            ix[k] = best;
        }
    }
    float sum = 0;
    for (int k = 0; k < K; k++) sum += (wt[k] = s[ix[k]]);
    if (!a->official) sum += 1e-20f;
    for (int k = 0; k < K; k++) wt[k] = wt[k] / sum * a->route_scale;
    free(s);
}

/* ------------------------------------------------------------------ fake-quant data */

/* positive codes: e4m3 0..0x7e, e2m1 0..7 */
static float code_val(int c, int fp4) { return fp4 ? md_fp4_lut[c] : md_e4m3_to_f32((uint8_t)c); }
static int code_max(int fp4) { return fp4 ? 7 : 0x7e; }

/* Fill one block of len values.  kind 0: random over many binades; 1: ties
 * (midpoints of adjacent codes times the block's scale, and their +-1 ulp
 * neighbours, both signs) with the amax element fixed first, so that the
 * scale is known; 2: zeros; 3: tiny and subnormal f32 values; 4: random
 * with a NaN.  Returns the number of exact ties placed. */
static int fill_block(float *x, size_t len, int fp4, int kind)
{
    int ties = 0;
    const float maxv = fp4 ? 6.0f : 448.0f;
    switch (kind) {
    case 0: {
        const float a = ldexpf(1.0f, (int)(rnd() % 41) - 20);
        for (size_t i = 0; i < len; i++) x[i] = a * unif();
        break;
    }
    case 1: {
        const float A = maxv * ldexpf(1.0f, (int)(rnd() % 21) - 10);
        const float sc = fq_scale(fmaxf(fq_floor(fp4), A), fp4);
        for (size_t i = 0; i < len; i++) {
            float v;
            int tries = 0;
            do {
                const int c = (int)(rnd() % (uint64_t)code_max(fp4));
                const float lo = code_val(c, fp4), hi = code_val(c + 1, fp4);
                v = (lo + hi) * 0.5f * sc; /* exact: one more mantissa bit, a power-of-two scale */
                const int t = (int)(rnd() % 4); /* half ties, a quarter each one ulp below and above */
                if (t == 1) v = nextafterf(v, 0.0f);
                if (t == 2) v = nextafterf(v, INFINITY);
                if ((t == 0 || t == 3) && v <= A) ties++;
                if (rnd() & 1) v = -v;
            } while (fabsf(v) > A && ++tries < 100);
            if (fabsf(v) > A) v = 0;
            x[i] = v;
        }
        x[rnd() % len] = (rnd() & 1) ? A : -A;
        break;
    }
    case 2:
        for (size_t i = 0; i < len; i++) x[i] = (rnd() & 1) ? 0.0f : -0.0f;
        break;
    case 3: {
        const float a = fp4 ? 8.0f * ldexpf(1.0f, -126) : 3e-4f;
        for (size_t i = 0; i < len; i++) x[i] = (rnd() % 3) ? a * unif() : unif() * 1e-39f;
        break;
    }
    default:
        for (size_t i = 0; i < len; i++) x[i] = unif();
        x[rnd() % len] = NAN;
        break;
    }
    return ties;
}

/* ------------------------------------------------------------------ CPU-only checks */

static void test_comparisons(void **st)
{
    (void)st;
    float ref[8] = {1, -2, 3, 0.5f, NAN, -INFINITY, 0, 4};
    float got[8];
    memcpy(got, ref, sizeof got);
    assert_true(bits_diff(got, ref, 8) < 0);
    assert_true(row_err(got, ref, 2, 4) == 0);
    got[2] = nextafterf(got[2], 10.0f); /* one ulp: within tolerance, not bit-equal */
    assert_int_equal(bits_diff(got, ref, 8), 2);
    assert_true(row_err(got, ref, 2, 4) <= TOL);
    got[2] = 3.0001f; /* 2.5e-5 of the row's magnitude 4 */
    assert_true(row_err(got, ref, 2, 4) > TOL);
    memcpy(got, ref, sizeof got);
    got[4] = 1.0f; /* a NaN must stay a NaN */
    assert_true(isinf(row_err(got, ref, 2, 4)));
    memcpy(got, ref, sizeof got);
    got[1] = NAN; /* and none may appear */
    assert_true(isinf(row_err(got, ref, 2, 4)));
    control_tol("control self-test", ref, ref, 2, 4);
    control_bits("control self-test", ref, 8);
}

/* the tie data really is on ties: x / scale is a midpoint of two codes, and
 * the encoder picks the even one (dtype.c, which the reference calls) */
static void test_fq_tie_data(void **st)
{
    (void)st;
    for (int fp4 = 0; fp4 < 2; fp4++) {
        int ties = 0, even = 0;
        for (int rep = 0; rep < 50; rep++) {
            float x[128];
            ties += fill_block(x, 128, fp4, 1);
            float amax = fq_floor(fp4);
            for (int i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(x[i]));
            const float sc = fq_scale(amax, fp4);
            for (int i = 0; i < 128; i++) {
                const float q = fabsf(x[i] / sc);
                for (int c = 0; c < code_max(fp4); c++)
                    if (q == (code_val(c, fp4) + code_val(c + 1, fp4)) * 0.5f) {
                        const int got = fp4 ? md_f32_to_fp4(q) : md_f32_to_e4m3(q);
                        if (got != (c % 2 ? c + 1 : c)) fail_msg("tie %g not rounded to even", (double)q);
                        even++;
                    }
            }
        }
        printf("  %s: %d ties placed, %d found on midpoints (rounded to even)\n", fp4 ? "e2m1" : "e4m3", ties, even);
        assert_true(ties > 1000 && even > ties * 9 / 10); /* the amax element may land on a tie */
    }
}

/* ------------------------------------------------------------------ GPU: argument checks */

static void test_bad_arguments(void **st)
{
    (void)st;
    float *d = dmalloc(1 << 16);
    const cudaError_t INV = cudaErrorInvalidValue;
    bcu_hc_site s = {.n = 4, .D = 64, .iters = 3, .hc_eps = 1e-6f, .rms_eps = 1e-6f, .fn = d, .base = d, .scale = d};
    s.n = 17;
    assert_int_equal(bcu_hc_pre(&s, d, 1, d, d, d, d, 1 << 16, 0), INV);
    assert_int_equal(bcu_hc_head(&s, d, 1, d, d, 1 << 16, 0), INV);
    s.n = 0;
    assert_int_equal(bcu_hc_pre(&s, d, 1, d, d, d, d, 1 << 16, 0), INV);
    s.n = 4;
    s.D = 0;
    assert_int_equal(bcu_hc_pre(&s, d, 1, d, d, d, d, 1 << 16, 0), INV);
    s.D = 64;
    assert_int_equal(bcu_hc_pre(NULL, d, 1, d, d, d, d, 1 << 16, 0), INV);
    /* a missing or short workspace */
    assert_int_equal(bcu_hc_pre(&s, d, 1, d, d, d, NULL, 1 << 16, 0), INV);
    assert_int_equal(bcu_hc_pre(&s, d, 3, d, d, d, d, bcu_hc_ws_bytes(3, 4) - 1, 0), INV);
    assert_int_equal(bcu_hc_post(d, d, d, d, 17, 64, 1, 0), INV);
    assert_int_equal(bcu_hc_post(d, d, d, d, 4, 0, 1, 0), INV);
    assert_int_equal(bcu_embed(d, d, 3, (const int32_t *)d, 1, 64, 4, 0), INV);
    assert_int_equal(bcu_embed(d, d, BCU_EMB_BF16, (const int32_t *)d, 1, 0, 4, 0), INV);
    assert_int_equal(bcu_embed(d, d, BCU_EMB_BF16, (const int32_t *)d, 1, 64, 0, 0), INV);
    const int64_t *pos = (const int64_t *)d;
    assert_int_equal(bcu_rope(d, 1, 64, 0, 63, d, pos, 1, 0, 0), INV);
    assert_int_equal(bcu_rope(d, 1, 64, 0, 64, d, pos, 0, 0, 0), INV);
    assert_int_equal(bcu_rope(d, 2, 64, 8, 64, d, pos, 1, 0, 0), INV); /* rows would overlap */
    assert_int_equal(bcu_fq_fp8(d, 1, 128, 128, 0, 0), INV);
    assert_int_equal(bcu_fq_fp4(d, 1, 128, 128, -32, 0), INV);
    assert_int_equal(bcu_fq_fp8(d, 2, 64, 128, 64, 0), INV); /* stride < n */
    assert_int_equal(bcu_hadamard(d, 1, 96, 0), INV);
    assert_int_equal(bcu_hadamard(d, 1, 2048, 0), INV);
    assert_int_equal(bcu_hadamard(d, 1, 0, 0), INV);
    assert_int_equal(bcu_swiglu(d, d, 1, 0, 10.0f, NULL, 0), INV);
    bcu_route_args ra = {.E = 513, .K = 6, .score_func = 0, .route_scale = 1.5f, .bias = d};
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    ra.E = 256;
    ra.K = 17;
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    ra.K = 0;
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    ra.E = 4;
    ra.K = 5;
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    ra.K = 2;
    ra.bias = NULL; /* neither a bias nor a hash table */
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    ra.tid2eid = (const int32_t *)d; /* a hash table without token ids */
    assert_int_equal(bcu_route(&ra, d, 1, (int32_t *)d, d, 0), INV);
    assert_int_equal(bcu_route(NULL, d, 1, (int32_t *)d, d, 0), INV);
    printf("  every bad size refused with cudaErrorInvalidValue\n");
    /* empty batches: nothing to do, whatever the pointers */
    s.n = 4;
    assert_int_equal(bcu_hc_pre(&s, NULL, 0, NULL, NULL, NULL, NULL, 0, 0), cudaSuccess);
    assert_int_equal(bcu_hc_head(&s, NULL, 0, NULL, NULL, 0, 0), cudaSuccess);
    assert_int_equal(bcu_hc_post(NULL, NULL, NULL, NULL, 4, 64, 0, 0), cudaSuccess);
    assert_int_equal(bcu_embed(NULL, NULL, BCU_EMB_F32, NULL, 0, 64, 4, 0), cudaSuccess);
    assert_int_equal(bcu_rope(NULL, 0, 64, 0, 64, NULL, NULL, 1, 0, 0), cudaSuccess);
    assert_int_equal(bcu_fq_fp8(NULL, 0, 128, 128, 128, 0), cudaSuccess);
    assert_int_equal(bcu_fq_fp4(NULL, 0, 128, 128, 32, 0), cudaSuccess);
    assert_int_equal(bcu_hadamard(NULL, 0, 128, 0), cudaSuccess);
    assert_int_equal(bcu_swiglu(NULL, NULL, 0, 2048, 10.0f, NULL, 0), cudaSuccess);
    assert_int_equal(bcu_scale(NULL, 0, 2.0f, 0), cudaSuccess);
    assert_int_equal(bcu_add(NULL, NULL, 0, 0), cudaSuccess);
    bcu_route_args ok = {.E = 256, .K = 6, .route_scale = 1.5f, .bias = d};
    assert_int_equal(bcu_route(&ok, NULL, 0, NULL, NULL, 0), cudaSuccess);
    assert_int_equal(bcu_gather_rows(NULL, NULL, NULL, 0, 4096, 0), cudaSuccess);
    CK(cudaDeviceSynchronize());
    CK(cudaGetLastError());
    CK(cudaFree(d));
}

/* ------------------------------------------------------------------ GPU: embedding, gather, scale, add */

static void test_embed(void **st)
{
    (void)st;
    const int V = 1000;
    const int Ds[] = {4096, 100};
    for (int di = 0; di < 2; di++)
        for (int emb = BCU_EMB_F32; emb <= BCU_EMB_F16; emb++) {
            const int D = Ds[di];
            const size_t esz = emb == BCU_EMB_F32 ? 4 : 2;
            uint8_t *tab = xmalloc((size_t)V * D * esz);
            for (size_t i = 0; i < (size_t)V * D; i++) {
                if (emb == BCU_EMB_F32) {
                    float f = rnd() % 50 ? unif() * 3.0f : (rnd() & 1 ? NAN : -INFINITY);
                    memcpy(tab + 4 * i, &f, 4);
                } else {
                    uint16_t h = (uint16_t)rnd(); /* every code: NaN, inf, subnormals */
                    memcpy(tab + 2 * i, &h, 2);
                }
            }
            void *dtab = up(tab, (size_t)V * D * esz);
            for (size_t ri = 0; ri < NR; ri++) {
                const size_t R = Rs[ri];
                const int ns = ri == 1 ? 1 : 4;
                int32_t *ids = xmalloc(R * sizeof *ids);
                for (size_t t = 0; t < R; t++) ids[t] = (int32_t)(rnd() % (uint64_t)V);
                if (R > 2) ids[2] = ids[0]; /* a repeated token */
                ids[R - 1] = V - 1;
                int32_t *dids = up(ids, R * sizeof *ids);
                const size_t nx = R * ns * D;
                float *dX = dmalloc(nx * sizeof(float)), *X = xmalloc(nx * sizeof(float)),
                      *ref = xmalloc(nx * sizeof(float));
                RUN(bcu_embed(dX, dtab, emb, dids, R, D, ns, 0));
                down(X, dX, nx * sizeof(float));
                for (size_t t = 0; t < R; t++)
                    for (int s = 0; s < ns; s++)
                        for (int d = 0; d < D; d++) {
                            const size_t src = (size_t)ids[t] * D + d;
                            float v;
                            uint16_t h;
                            if (emb == BCU_EMB_F32) memcpy(&v, tab + 4 * src, 4);
                            else {
                                memcpy(&h, tab + 2 * src, 2);
                                v = emb == BCU_EMB_BF16 ? md_bf16_to_f32(h) : md_f16_to_f32(h);
                            }
                            ref[(t * ns + s) * D + d] = v;
                        }
                /* bit for bit, NaN payloads included (dtype.c's bit manipulation) */
                if (memcmp(X, ref, nx * sizeof(float))) {
                    const long i = bits_diff(X, ref, nx);
                    fail_msg("embed %d D %d R %zu: differs (first NaN-blind difference at %ld)", emb, D, R, i);
                }
                control_bits("embed", X, nx);
                CK(cudaFree(dX));
                CK(cudaFree(dids));
                free(X); free(ref); free(ids);
            }
            printf("  embed %s D %d: bit-exact for R 1, 7, 300\n", emb == 0 ? "f32" : emb == 1 ? "bf16" : "f16", D);
            CK(cudaFree(dtab));
            free(tab);
        }
}

static void test_gather_scale_add(void **st)
{
    (void)st;
    const size_t widths[] = {4 * 4096, 1, 7};
    const size_t nsrc = 400;
    for (int wi = 0; wi < 3; wi++)
        for (size_t ri = 0; ri < NR; ri++) {
            const size_t w = widths[wi], n = Rs[ri];
            float *src = rand_floats(nsrc * w, 2.0f);
            int32_t *rows = xmalloc(n * sizeof *rows);
            for (size_t i = 0; i < n; i++) rows[i] = (int32_t)(rnd() % nsrc);
            rows[n - 1] = (int32_t)nsrc - 1;
            float *dsrc = up(src, nsrc * w * sizeof(float));
            int32_t *drows = up(rows, n * sizeof *rows);
            float *ddst = dmalloc(n * w * sizeof(float)), *got = xmalloc(n * w * sizeof(float)),
                  *ref = xmalloc(n * w * sizeof(float));
            RUN(bcu_gather_rows(ddst, dsrc, drows, n, w, 0));
            down(got, ddst, n * w * sizeof(float));
            for (size_t i = 0; i < n; i++) memcpy(ref + i * w, src + (size_t)rows[i] * w, w * sizeof(float));
            expect_bits("gather", got, ref, n * w);
            CK(cudaFree(dsrc)); CK(cudaFree(drows)); CK(cudaFree(ddst));
            free(src); free(rows); free(got); free(ref);
        }
    printf("  gather: bit-exact (widths 16384, 1, 7; n 1, 7, 300)\n");
    const size_t ns[] = {1, 1000, (1u << 20) + 3};
    for (int k = 0; k < 3; k++) {
        const size_t n = ns[k];
        float *x = rand_floats(n, 100.0f), *y = rand_floats(n, 1.0f), *got = xmalloc(n * sizeof(float));
        x[0] = 3e38f; /* overflows to inf when scaled */
        float *dx = up(x, n * sizeof(float)), *dy = up(y, n * sizeof(float));
        const float s = 1.7f;
        RUN(bcu_scale(dx, n, s, 0));
        down(got, dx, n * sizeof(float));
        float *ref = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) ref[i] = x[i] * s;
        expect_bits("scale", got, ref, n);
        RUN(bcu_add(dy, dx, n, 0));
        down(got, dy, n * sizeof(float));
        for (size_t i = 0; i < n; i++) ref[i] = y[i] + ref[i];
        expect_bits("add", got, ref, n);
        CK(cudaFree(dx)); CK(cudaFree(dy));
        free(x); free(y); free(got); free(ref);
    }
    printf("  scale, add: bit-exact (n 1, 1000, 2^20 + 3)\n");
}

/* ------------------------------------------------------------------ GPU: Hadamard, fake quant */

static void test_hadamard(void **st)
{
    (void)st;
    const size_t ns[] = {1, 2, 16, 32, 64, 128, 256, 512, 1024}; /* from 32 a warp a row (gr_hadamard_rows_kernel) */
    for (int k = 0; k < 9; k++)
        for (size_t ri = 0; ri < NR; ri++) {
            const size_t n = ns[k], R = Rs[ri];
            float *x = rand_floats(R * n, 4.0f), *got = xmalloc(R * n * sizeof(float));
            float *dx = up(x, R * n * sizeof(float));
            RUN(bcu_hadamard(dx, R, n, 0));
            down(got, dx, R * n * sizeof(float));
            for (size_t r = 0; r < R; r++) ref_hadamard(x + r * n, n);
            char what[64];
            snprintf(what, sizeof what, "hadamard n %zu R %zu", n, R);
            expect_bits(what, got, x, R * n);
            CK(cudaFree(dx));
            free(x); free(got);
        }
    printf("  hadamard: bit-exact (n 1 .. 1024, R 1, 7, 300)\n");
}

typedef struct {
    size_t n, block;
} fqcase;

static void test_fq(void **st)
{
    (void)st;
    /* V4-Flash: activations (D 4096, 128), KV entries (512 and 448, 64), the
     * indexer (128, FP4 32); odd tails; a whole row as one block */
    const fqcase cs[] = {{4096, 128}, {512, 64}, {448, 64}, {128, 32}, {100, 32}, {7168, 128}, {300, 300}, {33, 7}};
    for (int fp4 = 0; fp4 < 2; fp4++) {
        long ties = 0;
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
            for (size_t ri = 0; ri < 2 * NR; ri++) {
                /* strides n + 5, and n + 4 (whole float4s: rows of 128-column chunks take the vector kernel) */
                const size_t n = cs[ci].n, block = cs[ci].block, R = Rs[ri % NR], stride = n + (ri < NR ? 5 : 4);
                float *x = xmalloc(R * stride * sizeof(float)), *got = xmalloc(R * stride * sizeof(float));
                for (size_t r = 0; r < R; r++) {
                    for (size_t b0 = 0; b0 < n; b0 += block) {
                        const size_t len = n - b0 < block ? n - b0 : block;
                        static const int kinds[8] = {1, 1, 1, 1, 0, 2, 3, 4}; /* half of the blocks on ties */
                        ties += fill_block(x + r * stride + b0, len, fp4, kinds[rnd() % 8]);
                    }
                    for (size_t i = n; i < stride; i++) x[r * stride + i] = NAN; /* padding: never read or written */
                }
                float *dx = up(x, R * stride * sizeof(float));
                if (fp4) RUN(bcu_fq_fp4(dx, R, stride, n, (int)block, 0));
                else RUN(bcu_fq_fp8(dx, R, stride, n, (int)block, 0));
                down(got, dx, R * stride * sizeof(float));
                for (size_t r = 0; r < R; r++) ref_fq(x + r * stride, n, block, fp4);
                char what[96];
                snprintf(what, sizeof what, "fq_%s n %zu block %zu R %zu", fp4 ? "fp4" : "fp8", n, block, R);
                expect_bits(what, got, x, R * stride);
                for (size_t r = 0; r < R; r++)
                    for (size_t i = n; i < stride; i++)
                        if (bits(got[r * stride + i]) != bits(x[r * stride + i]))
                            fail_msg("%s: padding element %zu of row %zu was written", what, i, r);
                CK(cudaFree(dx));
                free(x); free(got);
            }
        printf("  fq_%s: bit-exact over 8 shapes x R 1, 7, 300 x 2 strides (%ld exact ties)\n", fp4 ? "fp4" : "fp8", ties);
    }
}

/* ------------------------------------------------------------------ GPU: RoPE, SwiGLU */

typedef struct {
    const char *name;
    int width, off, rd, per; /* row = width floats (stride), rope on [off, off + rd); per rows share a position */
} ropecase;

static void test_rope(void **st)
{
    (void)st;
    const ropecase cs[] = {
        {"q heads 512 (rope 64 last), 8 heads", 512, 448, 64, 8},
        {"index heads 128 (rope 64 last), 4 heads", 128, 64, 64, 4},
        {"kv 512, one per position", 512, 448, 64, 1},
        {"dense rope-only rows", 64, 0, 64, 1},
        {"rd 6 at 3 in 16", 16, 3, 6, 3},
    };
    double worst = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (size_t ri = 0; ri < NR; ri++)
            for (int inverse = 0; inverse < 2; inverse++) {
                const ropecase *c = &cs[ci];
                const size_t R = Rs[ri], rows = R * c->per, w = c->width;
                float *x = rand_floats(rows * w, 3.0f), *got = xmalloc(rows * w * sizeof(float));
                int64_t *pos = xmalloc(R * sizeof *pos);
                for (size_t t = 0; t < R; t++) pos[t] = (int64_t)(rnd() % 200000);
                pos[0] = R > 1 ? 0 : 1048575; /* 0, and a position past 2^20 */
                if (R > 2) pos[R - 1] = 131071;
                float *inv = xmalloc((size_t)(c->rd / 2) * sizeof *inv);
                for (int i = 0; i < c->rd / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / c->rd);
                float *dx = up(x, rows * w * sizeof(float)), *dinv = up(inv, (size_t)(c->rd / 2) * sizeof *inv);
                int64_t *dpos = up(pos, R * sizeof *pos);
                RUN(bcu_rope(dx, rows, w, (size_t)c->off, c->rd, dinv, dpos, c->per, inverse, 0));
                down(got, dx, rows * w * sizeof(float));
                float *ref = xmalloc(rows * w * sizeof(float));
                memcpy(ref, x, rows * w * sizeof(float));
                for (size_t r = 0; r < rows; r++) ref_rope(ref + r * w + c->off, c->rd, inv, pos[r / c->per], inverse);
                /* the rotated channels to 1e-5 of their row, the rest untouched */
                const size_t nrd = rows * (size_t)c->rd;
                float *gr = xmalloc(nrd * sizeof(float)), *rr = xmalloc(nrd * sizeof(float));
                for (size_t r = 0; r < rows; r++) {
                    memcpy(gr + r * c->rd, got + r * w + c->off, (size_t)c->rd * sizeof(float));
                    memcpy(rr + r * c->rd, ref + r * w + c->off, (size_t)c->rd * sizeof(float));
                    for (size_t i = 0; i < w; i++)
                        if ((i < (size_t)c->off || i >= (size_t)(c->off + c->rd)) &&
                            bits(got[r * w + i]) != bits(x[r * w + i]))
                            fail_msg("rope %s: channel %zu of row %zu changed", c->name, i, r);
                }
                char what[128];
                snprintf(what, sizeof what, "rope %s R %zu%s", c->name, R, inverse ? " inverse" : "");
                expect_tol(what, gr, rr, rows, (size_t)c->rd, &worst);
                CK(cudaFree(dx)); CK(cudaFree(dinv)); CK(cudaFree(dpos));
                free(x); free(got); free(pos); free(inv); free(ref); free(gr); free(rr);
            }
    printf("  rope: 5 layouts x R 1, 7, 300 x forward/inverse, worst relative error %.2e\n", worst);
}

/* RMSNorm then RoPE in one kernel (bcu_norm_rope): the bits of bcu_rmsnorm then bcu_rope, for the V4 rows (q heads
 * and the window key of 512 with rope 64 last, the compressed rows), rope-only rows, no rope, a weight or none, and
 * rows it does not fit declined.  300 positions of 8, 4 or 2 rows (600 and more) take the warp-a-row kernel, dims
 * 128 .. 1000 (its four register shapes); fewer rows the block kernel. */
static void test_norm_rope(void **st)
{
    (void)st;
    const struct {
        size_t dim;
        int rd, per;
    } cs[] = {{512, 64, 8}, {512, 64, 1}, {128, 64, 4}, {64, 64, 1}, {4096, 64, 1}, {6, 0, 1}, {1000, 10, 2}, {640, 64, 2}};
    int n = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (size_t ri = 0; ri < NR; ri++)
            for (int weighted = 0; weighted < 2; weighted++) {
                const size_t R = Rs[ri], rows = R * cs[ci].per, dim = cs[ci].dim;
                const int rd = cs[ci].rd;
                if (!bcu_norm_rope_fits(dim, rd)) fail_msg("norm_rope: dim %zu rd %d should fit", dim, rd);
                float *x = rand_floats(rows * dim, 3.0f), *w = rand_floats(dim, 1.5f);
                int64_t *pos = xmalloc(R * sizeof *pos);
                for (size_t t = 0; t < R; t++) pos[t] = (int64_t)(rnd() % 200000);
                pos[0] = 1048575;
                float *inv = xmalloc((size_t)(rd / 2 + 1) * sizeof *inv);
                for (int i = 0; i < rd / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * i / rd);
                float *da = up(x, rows * dim * sizeof(float)), *db = up(x, rows * dim * sizeof(float));
                float *dw = weighted ? up(w, dim * sizeof(float)) : NULL;
                float *dinv = up(inv, (size_t)(rd / 2 + 1) * sizeof *inv);
                int64_t *dpos = up(pos, R * sizeof *pos);
                RUN(bcu_rmsnorm(da, da, rows, dim, dw, 1e-6f, 0));
                RUN(bcu_rope(da, rows, dim, dim - (size_t)rd, rd, dinv, dpos, cs[ci].per, 0, 0));
                RUN(bcu_norm_rope(db, rows, dim, dw, 1e-6f, rd, dinv, dpos, cs[ci].per, 0));
                float *a = xmalloc(rows * dim * sizeof(float)), *b = xmalloc(rows * dim * sizeof(float));
                down(a, da, rows * dim * sizeof(float));
                down(b, db, rows * dim * sizeof(float));
                char what[96];
                snprintf(what, sizeof what, "norm_rope dim %zu rd %d per %d R %zu weighted %d", dim, rd, cs[ci].per, R,
                         weighted);
                expect_bits(what, b, a, rows * dim);
                n++;
                CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dinv)); CK(cudaFree(dpos));
                if (dw) CK(cudaFree(dw));
                free(x); free(w); free(pos); free(inv); free(a); free(b);
            }
    /* what it does not take: declined before any launch */
    if (bcu_norm_rope_fits(5000, 64) || bcu_norm_rope_fits(512, 63) || bcu_norm_rope_fits(513, 64) ||
        bcu_norm_rope_fits(64, 66))
        fail_msg("norm_rope: fits a row it cannot take");
    float *d = dmalloc(16 * sizeof(float));
    if (bcu_norm_rope(d, 1, 5000, NULL, 1e-6f, 64, (const float *)d, (const int64_t *)d, 1, 0) != cudaErrorNotSupported)
        fail_msg("norm_rope: a 5000-wide row was not declined");
    CK(cudaFree(d));
    printf("  norm_rope: %d cases bit-identical to rmsnorm then rope\n", n);
}

static void test_swiglu(void **st)
{
    (void)st;
    const int Is[] = {2048, 100};
    const float limits[] = {10.0f, 0.0f};
    double worst = 0;
    for (int ii = 0; ii < 2; ii++)
        for (int li = 0; li < 2; li++)
            for (int withw = 0; withw < 2; withw++)
                for (size_t ri = 0; ri < NR; ri++) {
                    const size_t R = Rs[ri], I = (size_t)Is[ii], n = R * I;
                    float *g = rand_floats(n, 16.0f), *u = rand_floats(n, 16.0f), *rw = rand_floats(R, 1.0f);
                    g[0] = -200.0f; /* exp overflows: -0 */
                    float *dg = up(g, n * sizeof(float)), *du = up(u, n * sizeof(float));
                    float *drw = up(rw, R * sizeof(float));
                    RUN(bcu_swiglu(dg, du, R, (int)I, limits[li], withw ? drw : NULL, 0));
                    float *got = xmalloc(n * sizeof(float));
                    down(got, dg, n * sizeof(float));
                    for (size_t r = 0; r < R; r++) ref_swiglu(g + r * I, u + r * I, I, limits[li], rw[r], withw);
                    char what[96];
                    snprintf(what, sizeof what, "swiglu I %zu limit %g%s R %zu", I, (double)limits[li],
                             withw ? " weighted" : "", R);
                    expect_tol(what, got, g, R, I, &worst);
                    CK(cudaFree(dg)); CK(cudaFree(du)); CK(cudaFree(drw));
                    free(g); free(u); free(rw); free(got);
                }
    printf("  swiglu: I 2048/100 x limit 10/0 x weights x R 1, 7, 300, worst relative error %.2e\n", worst);
}

/* ------------------------------------------------------------------ GPU: mHC */

typedef struct {
    int n, D, iters;
} hccase;

static void hc_make(hc_host *h, const hccase *c)
{
    const int n = c->n, D = c->D, mix = (2 + n) * n;
    h->n = n;
    h->D = D;
    h->iters = c->iters;
    h->hc_eps = 1e-6f;
    h->rms_eps = 1e-6f;
    const float a = 1.0f / sqrtf((float)(n * D)); /* mixes of order 1 */
    h->fn = rand_floats((size_t)mix * n * D, a * 1.7f);
    h->base = rand_floats((size_t)mix, 1.0f);
    h->scale = xmalloc(3 * sizeof(float));
    h->scale[0] = 1.5f;
    h->scale[1] = 0.8f;
    h->scale[2] = 2.0f;
}

/* the mHC batch sizes: a decode row, a few, a batch below the GEMM switch (cuda.cu's hc_gemm_R, 128) and above it
 * (the test calls the kernels directly, so every R takes the block path unless the GEMM's mixes are given) */
static const size_t hc_Rs[] = {1, 3, 7, 64, 256, 300};
#define HC_NR (sizeof hc_Rs / sizeof hc_Rs[0])

/* the cases' n, D, iters: V4-Flash (4 x 4096, 20 Sinkhorn rounds), V4-Pro's 7168, and the edges: n 5 is the
 * largest whose n*n small math is one warp, n 6 the smallest that takes the block, 16 the largest */
static const hccase hc_cases[] = {{4, 4096, 20}, {4, 7168, 20}, {1, 100, 3}, {16, 300, 5},
                                  {3, 257, 0},   {2, 64, 1},    {5, 130, 4}, {6, 200, 3}};
#define HC_NC (sizeof hc_cases / sizeof hc_cases[0])

/* v4.c's dot products of R rows, [R, mix], where bcu_hc_ws_mixes puts a GEMM's (mixes_in_ws) */
static void hc_host_mixes(const hc_host *h, const float *X, size_t R, int mix, float *out)
{
    const size_t N = (size_t)h->n * h->D;
    for (size_t t = 0; t < R; t++)
        for (int j = 0; j < mix; j++) out[t * mix + j] = be_dot_f32(h->fn + (size_t)j * N, X + t * N, N);
}

static void test_hc(void **st)
{
    (void)st;
    for (size_t ci = 0; ci < HC_NC; ci++) {
        hc_host h;
        hc_make(&h, &hc_cases[ci]);
        const int n = h.n, D = h.D, mix = (2 + n) * n;
        const size_t N = (size_t)n * D;
        bcu_hc_site s = {.n = n, .D = D, .iters = h.iters, .hc_eps = h.hc_eps, .rms_eps = h.rms_eps};
        s.fn = up(h.fn, (size_t)mix * N * sizeof(float));
        s.base = up(h.base, (size_t)mix * sizeof(float));
        s.scale = up(h.scale, 3 * sizeof(float));
        double wc = 0, wp = 0, wm = 0, wh = 0, wg = 0;
        for (size_t ri = 0; ri < HC_NR; ri++) {
            const size_t R = hc_Rs[ri];
            float *X = xmalloc(R * N * sizeof(float));
            for (size_t t = 0; t < R; t++) { /* rows of very different scales */
                const float amp = (float)pow(10.0, (double)(rnd() % 5) - 2.0);
                for (size_t i = 0; i < N; i++) X[t * N + i] = amp * unif();
            }
            float *dX = up(X, R * N * sizeof(float));
            float *dcoll = dmalloc(R * D * sizeof(float)), *dpost = dmalloc(R * n * sizeof(float)),
                  *dcomb = dmalloc(R * n * n * sizeof(float)), *dhead = dmalloc(R * D * sizeof(float));
            const size_t wsb = bcu_hc_ws_bytes(R, n);
            void *dws = dmalloc(wsb);
            RUN(bcu_hc_pre(&s, dX, R, dcoll, dpost, dcomb, dws, wsb, 0));
            RUN(bcu_hc_head(&s, dX, R, dhead, dws, wsb, 0));
            float *coll = xmalloc(R * D * sizeof(float)), *post = xmalloc(R * n * sizeof(float)),
                  *comb = xmalloc(R * n * n * sizeof(float)), *head = xmalloc(R * D * sizeof(float));
            down(coll, dcoll, R * D * sizeof(float));
            down(post, dpost, R * n * sizeof(float));
            down(comb, dcomb, R * n * n * sizeof(float));
            down(head, dhead, R * D * sizeof(float));
            float *rc = xmalloc(R * D * sizeof(float)), *rp = xmalloc(R * n * sizeof(float)),
                  *rm = xmalloc(R * n * n * sizeof(float)), *rh = xmalloc(R * D * sizeof(float));
            for (size_t t = 0; t < R; t++) {
                ref_hc(&h, X + t * N, rc + t * D, rp + t * n, rm + t * n * n, 0);
                ref_hc(&h, X + t * N, rh + t * D, NULL, NULL, 1);
            }
            char what[96];
            snprintf(what, sizeof what, "hc_pre n %d D %d R %zu coll", n, D, R);
            expect_tol(what, coll, rc, R, (size_t)D, &wc);
            snprintf(what, sizeof what, "hc_pre n %d D %d R %zu post", n, D, R);
            expect_tol(what, post, rp, R, (size_t)n, &wp);
            snprintf(what, sizeof what, "hc_pre n %d D %d R %zu comb", n, D, R);
            expect_tol(what, comb, rm, R, (size_t)n * n, &wm);
            snprintf(what, sizeof what, "hc_head n %d D %d R %zu", n, D, R);
            expect_tol(what, head, rh, R, (size_t)D, &wh);
            /* deterministic, and a row alone gets the bits it gets in the batch */
            const size_t t = R / 2;
            float *c2 = xmalloc(R * D * sizeof(float));
            RUN(bcu_hc_pre(&s, dX, R, dcoll, dpost, dcomb, dws, wsb, 0));
            down(c2, dcoll, R * D * sizeof(float));
            if (bits_diff(c2, coll, R * D) >= 0) fail_msg("hc_pre n %d D %d R %zu: a second run differs", n, D, R);
            RUN(bcu_hc_head(&s, dX + t * N, 1, dcoll, dws, wsb, 0));
            down(c2, dcoll, D * sizeof(float));
            if (bits_diff(c2, head + t * D, D) >= 0) fail_msg("hc_head n %d D %d: row %zu alone differs", n, D, t);
            RUN(bcu_hc_pre(&s, dX + t * N, 1, dcoll, dpost, dcomb, dws, wsb, 0));
            down(c2, dcoll, D * sizeof(float));
            if (bits_diff(c2, coll + t * D, D) >= 0) fail_msg("hc_pre n %d D %d: row %zu alone differs", n, D, t);
            float p2[16 * 16];
            down(p2, dcomb, (size_t)n * n * sizeof(float));
            if (bits_diff(p2, comb + t * n * n, (size_t)n * n) >= 0)
                fail_msg("hc_pre n %d D %d: comb of row %zu alone differs", n, D, t);
            down(p2, dpost, (size_t)n * sizeof(float));
            if (bits_diff(p2, post + t * n, (size_t)n) >= 0)
                fail_msg("hc_pre n %d D %d: post of row %zu alone differs", n, D, t);
            free(c2);

            /* the GEMM path (mixes_in_ws, as cuda.cu does for many rows) with v4.c's own dot products: only the
             * sum of squares' order and expf stand between it and the reference */
            {
                float *mx = xmalloc(R * mix * sizeof(float));
                hc_host_mixes(&h, X, R, mix, mx);
                bcu_hc_site sg = s;
                sg.mixes_in_ws = 1;
                CK(cudaMemcpy(bcu_hc_ws_mixes(dws, R), mx, R * mix * sizeof(float), cudaMemcpyHostToDevice));
                RUN(bcu_hc_pre(&sg, dX, R, dcoll, dpost, dcomb, dws, wsb, 0));
                float *g = xmalloc(R * D * sizeof(float));
                down(g, dcoll, R * D * sizeof(float));
                snprintf(what, sizeof what, "hc_pre (mixes in ws) n %d D %d R %zu coll", n, D, R);
                expect_tol(what, g, rc, R, (size_t)D, &wg);
                down(g, dcomb, R * n * n * sizeof(float));
                snprintf(what, sizeof what, "hc_pre (mixes in ws) n %d D %d R %zu comb", n, D, R);
                expect_tol(what, g, rm, R, (size_t)n * n, &wg);
                down(g, dpost, R * n * sizeof(float));
                snprintf(what, sizeof what, "hc_pre (mixes in ws) n %d D %d R %zu post", n, D, R);
                expect_tol(what, g, rp, R, (size_t)n, &wg);
                free(mx);
                free(g);
            }

            /* hc_pre / hc_head then the norm in one kernel (bcu_hc_pre_norm): the bits of the two calls one after
             * the other, with a weight and without, where the row fits it (else it declines and launches nothing) */
            for (int head = 0; head < 2; head++)
                for (int weighted = 0; weighted < 2; weighted++) {
                    const int fits = bcu_hc_pre_norm_fits(n, D, R);
                    float *nw = rand_floats((size_t)D, 1.0f);
                    float *dnw = weighted ? up(nw, (size_t)D * sizeof(float)) : NULL;
                    float *dpost2 = dmalloc(R * n * sizeof(float)), *dcomb2 = dmalloc(R * n * n * sizeof(float));
                    float *dcoll2 = dmalloc(R * D * sizeof(float));
                    /* act_quant's copy too, except in one of the four (xq NULL) */
                    float *dxq = head && !weighted ? NULL : dmalloc(R * D * sizeof(float));
                    const float eps = 1e-6f;
                    if (head) RUN(bcu_hc_head(&s, dX, R, dcoll, dws, wsb, 0));
                    else RUN(bcu_hc_pre(&s, dX, R, dcoll, dpost, dcomb, dws, wsb, 0));
                    RUN(bcu_rmsnorm(dcoll, dcoll, R, (size_t)D, dnw, eps, 0));
                    CK(cudaMemset(dcoll2, 0xff, R * D * sizeof(float)));
                    const cudaError_t e =
                        bcu_hc_pre_norm(&s, head, dX, R, dcoll2, dpost2, dcomb2, dnw, eps, dxq, dws, wsb, 0);
                    if (!fits) {
                        if (e != cudaErrorNotSupported) fail_msg("hc_pre_norm n %d D %d R %zu: took a row too long", n, D, R);
                    } else {
                        RUN(e);
                        float *a = xmalloc(R * D * sizeof(float)), *b = xmalloc(R * D * sizeof(float));
                        down(a, dcoll, R * D * sizeof(float));
                        down(b, dcoll2, R * D * sizeof(float));
                        snprintf(what, sizeof what, "hc_pre_norm head %d weighted %d n %d D %d R %zu coll", head,
                                 weighted, n, D, R);
                        expect_bits(what, b, a, R * D);
                        if (dxq) { /* against a copy of the two calls' coll through bcu_fq_fp8 */
                            RUN(bcu_fq_fp8(dcoll, R, (size_t)D, (size_t)D, 128, 0));
                            down(a, dcoll, R * D * sizeof(float));
                            down(b, dxq, R * D * sizeof(float));
                            snprintf(what, sizeof what, "hc_pre_norm head %d weighted %d n %d D %d R %zu xq", head,
                                     weighted, n, D, R);
                            expect_bits(what, b, a, R * D);
                        }
                        if (!head) {
                            down(a, dpost, R * n * sizeof(float));
                            down(b, dpost2, R * n * sizeof(float));
                            snprintf(what, sizeof what, "hc_pre_norm n %d D %d R %zu post", n, D, R);
                            expect_bits(what, b, a, R * n);
                            down(a, dcomb, R * n * n * sizeof(float));
                            down(b, dcomb2, R * n * n * sizeof(float));
                            snprintf(what, sizeof what, "hc_pre_norm n %d D %d R %zu comb", n, D, R);
                            expect_bits(what, b, a, R * n * n);
                        }
                        free(a);
                        free(b);
                    }
                    if (dnw) CK(cudaFree(dnw));
                    CK(cudaFree(dpost2)); CK(cudaFree(dcomb2)); CK(cudaFree(dcoll2));
                    if (dxq) CK(cudaFree(dxq));
                    free(nw);
                }

            /* hc_post on the batch's post/comb (uploaded again: the later calls overwrote the device's) and a
             * sublayer output: bit for bit */
            float *f = rand_floats(R * D, 2.0f);
            float *df = up(f, R * D * sizeof(float));
            CK(cudaMemcpy(dpost, post, R * n * sizeof(float), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dcomb, comb, R * n * n * sizeof(float), cudaMemcpyHostToDevice));
            RUN(bcu_hc_post(dX, df, dpost, dcomb, n, D, R, 0));
            float *Xg = xmalloc(R * N * sizeof(float));
            down(Xg, dX, R * N * sizeof(float));
            for (size_t r = 0; r < R; r++) ref_hc_post(X + r * N, f + r * D, post + r * n, comb + r * n * n, n, D);
            snprintf(what, sizeof what, "hc_post n %d D %d R %zu", n, D, R);
            expect_bits(what, Xg, X, R * N);
            /* hc_post of f + f2 in one kernel (bcu_hc_post_add): the bits of bcu_add then bcu_hc_post, f unchanged */
            {
                float *f2 = rand_floats(R * D, 2.0f);
                float *df2 = up(f2, R * D * sizeof(float)), *dfa = up(f, R * D * sizeof(float));
                float *dA = up(Xg, R * N * sizeof(float)), *dB = up(Xg, R * N * sizeof(float));
                RUN(bcu_add(dfa, df2, R * D, 0));
                RUN(bcu_hc_post(dA, dfa, dpost, dcomb, n, D, R, 0));
                RUN(bcu_hc_post_add(dB, df, df2, dpost, dcomb, n, D, R, 0));
                float *ga = xmalloc(R * N * sizeof(float)), *gb = xmalloc(R * N * sizeof(float));
                down(ga, dA, R * N * sizeof(float));
                down(gb, dB, R * N * sizeof(float));
                snprintf(what, sizeof what, "hc_post_add n %d D %d R %zu", n, D, R);
                expect_bits(what, gb, ga, R * N);
                down(ga, df, R * D * sizeof(float));
                if (bits_diff(ga, f, R * D) >= 0) fail_msg("hc_post_add n %d D %d R %zu: changed f", n, D, R);
                CK(cudaFree(df2)); CK(cudaFree(dfa)); CK(cudaFree(dA)); CK(cudaFree(dB));
                free(f2); free(ga); free(gb);
            }

            CK(cudaFree(dX)); CK(cudaFree(dcoll)); CK(cudaFree(dpost)); CK(cudaFree(dcomb)); CK(cudaFree(dhead)); CK(cudaFree(dws));
            CK(cudaFree(df));
            free(X); free(coll); free(post); free(comb); free(head); free(rc); free(rp); free(rm); free(rh);
            free(f); free(Xg);
        }
        printf("  hc n %2d D %4d iters %2d: coll %.2e post %.2e comb %.2e head %.2e, mixes in ws %.2e; hc_post "
               "bit-exact\n", n, D, h.iters, wc, wp, wm, wh, wg);
        CK(cudaFree((void *)s.fn)); CK(cudaFree((void *)s.base)); CK(cudaFree((void *)s.scale));
        free(h.fn); free(h.base); free(h.scale);
    }
}

/* The small math bit for bit.  With scale = 0 the dot products drop out (mix * rs * 0 = +-0), and bases of 0 or
 * +-200 make every transcendental exact on both sides (expf(+-0) = 1, expf(-200) = 0, expf(200) = inf: sigmoid 1/2,
 * 0 or 1; softmax rows of ones and zeros); hc_eps 0.1 keeps the Sinkhorn matrices far from a fixed point.  What is
 * left is IEEE arithmetic in v4.c's order, so pre (coll, head), post and comb must be the reference's bits, through
 * the block path and the GEMM path alike: a changed order, index or missing barrier in the parallel softmax,
 * Sinkhorn or collapse shows as a bit difference here even where it hides under 1e-5. */
static void test_hc_exact(void **st)
{
    (void)st;
    int rows = 0;
    for (size_t ci = 0; ci < HC_NC; ci++) {
        hc_host h;
        hc_make(&h, &hc_cases[ci]);
        const int n = h.n, D = h.D, mix = (2 + n) * n;
        const size_t N = (size_t)n * D;
        h.hc_eps = 0.1f;
        h.scale[0] = h.scale[1] = h.scale[2] = 0.0f;
        static const float pick[3] = {0.0f, 200.0f, -200.0f};
        for (int i = 0; i < 2 * n; i++) h.base[i] = pick[rnd() % 3];
        for (int i = 0; i < n; i++) { /* each row of C: one 0 at least (its max), the others 0 or -200 */
            const int top = (int)(rnd() % (uint64_t)n);
            for (int k = 0; k < n; k++) h.base[2 * n + i * n + k] = k == top || rnd() % 3 == 0 ? 0.0f : -200.0f;
        }
        bcu_hc_site s = {.n = n, .D = D, .iters = h.iters, .hc_eps = h.hc_eps, .rms_eps = h.rms_eps};
        s.fn = up(h.fn, (size_t)mix * N * sizeof(float));
        s.base = up(h.base, (size_t)mix * sizeof(float));
        s.scale = up(h.scale, 3 * sizeof(float));
        for (size_t ri = 0; ri < HC_NR; ri++) {
            const size_t R = hc_Rs[ri];
            float *X = rand_floats(R * N, 3.0f);
            float *dX = up(X, R * N * sizeof(float));
            float *dcoll = dmalloc(R * D * sizeof(float)), *dpost = dmalloc(R * n * sizeof(float)),
                  *dcomb = dmalloc(R * n * n * sizeof(float)), *dhead = dmalloc(R * D * sizeof(float));
            const size_t wsb = bcu_hc_ws_bytes(R, n);
            void *dws = dmalloc(wsb);
            float *rc = xmalloc(R * D * sizeof(float)), *rp = xmalloc(R * n * sizeof(float)),
                  *rm = xmalloc(R * n * n * sizeof(float)), *rh = xmalloc(R * D * sizeof(float));
            for (size_t t = 0; t < R; t++) {
                ref_hc(&h, X + t * N, rc + t * D, rp + t * n, rm + t * n * n, 0);
                ref_hc(&h, X + t * N, rh + t * D, NULL, NULL, 1);
            }
            float *got = xmalloc(R * N * sizeof(float)), *mx = xmalloc(R * mix * sizeof(float));
            hc_host_mixes(&h, X, R, mix, mx);
            for (int gemm = 0; gemm < 2; gemm++) {
                bcu_hc_site sg = s;
                sg.mixes_in_ws = gemm;
                const char *path = gemm ? " (mixes in ws)" : "";
                char what[96];
                if (gemm) CK(cudaMemcpy(bcu_hc_ws_mixes(dws, R), mx, R * mix * sizeof(float), cudaMemcpyHostToDevice));
                RUN(bcu_hc_pre(&sg, dX, R, dcoll, dpost, dcomb, dws, wsb, 0));
                down(got, dcoll, R * D * sizeof(float));
                snprintf(what, sizeof what, "exact hc_pre%s n %d D %d R %zu coll", path, n, D, R);
                expect_bits(what, got, rc, R * D);
                down(got, dpost, R * n * sizeof(float));
                snprintf(what, sizeof what, "exact hc_pre%s n %d D %d R %zu post", path, n, D, R);
                expect_bits(what, got, rp, R * n);
                down(got, dcomb, R * n * n * sizeof(float));
                snprintf(what, sizeof what, "exact hc_pre%s n %d D %d R %zu comb", path, n, D, R);
                expect_bits(what, got, rm, R * n * n);
                if (gemm) /* hc_head's given mixes are its n dot products, [R, n] */
                    for (size_t t = 0; t < R; t++)
                        CK(cudaMemcpy(bcu_hc_ws_mixes(dws, R) + t * n, mx + t * mix, n * sizeof(float),
                                      cudaMemcpyHostToDevice));
                RUN(bcu_hc_head(&sg, dX, R, dhead, dws, wsb, 0));
                down(got, dhead, R * D * sizeof(float));
                snprintf(what, sizeof what, "exact hc_head%s n %d D %d R %zu", path, n, D, R);
                expect_bits(what, got, rh, R * D);
            }
            rows += (int)R;
            CK(cudaFree(dX)); CK(cudaFree(dcoll)); CK(cudaFree(dpost)); CK(cudaFree(dcomb)); CK(cudaFree(dhead)); CK(cudaFree(dws));
            free(X); free(rc); free(rp); free(rm); free(rh); free(got); free(mx);
        }
        CK(cudaFree((void *)s.fn)); CK(cudaFree((void *)s.base)); CK(cudaFree((void *)s.scale));
        free(h.fn); free(h.base); free(h.scale);
    }
    printf("  hc exact small math: %zu cases x R 1..300 (%d rows), block and GEMM paths: coll, post, comb, head "
           "bit-exact\n", HC_NC, rows);
}

/* ------------------------------------------------------------------ GPU: routing */

enum { L_RANDOM = 0, L_TIES = 1, L_TINY = 2, L_EXACT = 3, L_EXACT_TIES = 4, L_NAN = 5 }; /* >= L_EXACT: exact scores */

typedef struct {
    const char *name;
    int E, K, score_func, official, hash, logits;
} rtcase;

static void route_case(const rtcase *c, size_t R, int *flips)
{
    const int E = c->E, K = c->K, V = 1000;
    float *lg = xmalloc(R * E * sizeof(float)), *bias = xmalloc((size_t)E * sizeof(float));
    for (int e = 0; e < E; e++)
        bias[e] = c->logits >= L_EXACT ? (float)(rnd() % 3) * 0.5f : (c->logits == L_TIES ? 0.0f : 0.1f * unif());
    for (size_t t = 0; t < R; t++)
        for (int e = 0; e < E; e++) {
            float v;
            switch (c->logits) {
            case L_TIES: v = (float)(rnd() % 5) * 0.5f - 1.0f; break;          /* few values: ties everywhere */
            case L_EXACT: v = 20.5f + 80.0f * (float)unif01(); break;          /* > 20: sqrt(v), exact on both */
            case L_EXACT_TIES: v = 21.0f + (float)(rnd() % 4); break;
            case L_TINY: v = -60.0f + 10.0f * unif(); break;                   /* sigmoid ~1e-26: 1e-20 counts */
            case L_NAN: v = 20.5f + (float)(rnd() % 6); break;
            default: v = 4.0f * unif(); break;
            }
            lg[t * E + e] = v;
        }
    if (c->logits == L_NAN) /* a NaN first (v4.c's scan keeps it), in the middle (never picked), all NaN */
        for (size_t t = 0; t < R; t++) {
            const int kind = (int)(t % 4);
            if (kind == 0) lg[t * E] = NAN;
            if (kind == 1) lg[t * E + E / 2] = NAN;
            if (kind == 2)
                for (int e = 0; e < E; e++) lg[t * E + e] = NAN;
            if (kind == 3) lg[t * E + 1 + (int)(rnd() % (uint64_t)(E - 1))] = NAN;
        }
    int32_t *ids = xmalloc(R * sizeof *ids), *tab = xmalloc((size_t)V * K * sizeof *tab);
    for (size_t t = 0; t < R; t++) ids[t] = (int32_t)(rnd() % (uint64_t)V);
    for (int v = 0; v < V; v++) /* K distinct experts per token */
        for (int k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rnd() % (uint64_t)E);
                dup = 0;
                for (int q = 0; q < k; q++) dup |= tab[(size_t)v * K + q] == e;
            } while (dup);
            tab[(size_t)v * K + k] = e;
        }
    float *dlg = up(lg, R * E * sizeof(float)), *dbias = up(bias, (size_t)E * sizeof(float));
    int32_t *dids = up(ids, R * sizeof *ids), *dtab = up(tab, (size_t)V * K * sizeof *tab);
    int32_t *didx = dmalloc(R * K * sizeof(int32_t));
    float *dwt = dmalloc(R * K * sizeof(float));
    bcu_route_args a = {.E = E, .K = K, .score_func = c->score_func, .official = c->official, .route_scale = 1.5f,
                        .bias = c->hash ? NULL : dbias, .tid2eid = c->hash ? dtab : NULL, .ids = dids};
    RUN(bcu_route(&a, dlg, R, didx, dwt, 0));
    int32_t *idx = xmalloc(R * K * sizeof *idx);
    float *wt = xmalloc(R * K * sizeof *wt);
    down(idx, didx, R * K * sizeof *idx);
    down(wt, dwt, R * K * sizeof *wt);

    bcu_route_args h = a;
    h.bias = bias;
    h.tid2eid = c->hash ? tab : NULL;
    int32_t *ridx = xmalloc(R * K * sizeof *ridx);
    float *rwt = xmalloc(R * K * sizeof *rwt), *v = xmalloc((size_t)E * sizeof *v);
    const int exact = c->logits >= L_EXACT && c->score_func != 1;
    int rows_flipped = 0;
    size_t nsame = 0;
    float *gs = xmalloc(R * K * sizeof *gs), *rs = xmalloc(R * K * sizeof *rs);
    for (size_t t = 0; t < R; t++) {
        ref_route(&h, lg + t * E, ids[t], ridx + t * K, rwt + t * K, v);
        const int32_t *g = idx + t * K, *r = ridx + t * K;
        for (int k = 0; k < K; k++) {
            if (g[k] < 0 || g[k] >= E) fail_msg("route %s R %zu: row %zu slot %d: expert %d", c->name, R, t, k, g[k]);
            for (int q = 0; q < k; q++)
                if (g[q] == g[k]) fail_msg("route %s R %zu: row %zu picks expert %d twice", c->name, R, t, g[k]);
        }
        int k = 0;
        while (k < K && g[k] == r[k]) k++;
        if (k < K) {
            /* only a near-tie of the reference's values may differ, and only on inexact scores; equal
             * logits and biases are equal values on both sides, a tie that must go to the lower index */
            double mag = 0;
            for (int e = 0; e < E; e++)
                if (isfinite(v[e])) mag = fmax(mag, fabs(v[e]));
            const int same = lg[t * E + g[k]] == lg[t * E + r[k]] && bias[g[k]] == bias[r[k]];
            if (exact || c->hash || same || !(fabs((double)v[g[k]] - v[r[k]]) <= TIE_TOL * (mag + 1)))
                fail_msg("route %s R %zu: row %zu slot %d picks expert %d (value %.9g), expected %d (%.9g)", c->name,
                         R, t, k, g[k], (double)v[g[k]], r[k], (double)v[r[k]]);
            rows_flipped++;
            continue;
        }
        memcpy(gs + nsame * K, wt + t * K, K * sizeof(float));
        memcpy(rs + nsame * K, rwt + t * K, K * sizeof(float));
        nsame++;
    }
    char what[128];
    snprintf(what, sizeof what, "route %s R %zu weights", c->name, R);
    if (exact) {
        if (memcmp(idx, ridx, R * K * sizeof *idx)) fail_msg("%s: idx differs", what);
        expect_bits(what, wt, rwt, R * K);
    } else if (nsame) {
        expect_tol(what, gs, rs, nsame, (size_t)K, NULL);
    }
    /* deterministic, and batch-invariant */
    int32_t *i2 = xmalloc(R * K * sizeof *i2);
    float *w2 = xmalloc(R * K * sizeof *w2);
    RUN(bcu_route(&a, dlg, R, didx, dwt, 0));
    down(i2, didx, R * K * sizeof *i2);
    down(w2, dwt, R * K * sizeof *w2);
    if (memcmp(i2, idx, R * K * sizeof *i2) || bits_diff(w2, wt, R * K) >= 0)
        fail_msg("route %s R %zu: a second run differs", c->name, R);
    const size_t t = R - 1;
    bcu_route_args a1 = a;
    a1.ids = dids + t;
    RUN(bcu_route(&a1, dlg + t * E, 1, didx, dwt, 0));
    down(i2, didx, K * sizeof *i2);
    down(w2, dwt, K * sizeof *w2);
    if (memcmp(i2, idx + t * K, K * sizeof *i2) || bits_diff(w2, wt + t * K, K) >= 0)
        fail_msg("route %s R %zu: row %zu alone differs", c->name, R, t);
    *flips += rows_flipped;
    CK(cudaFree(dlg)); CK(cudaFree(dbias)); CK(cudaFree(dids)); CK(cudaFree(dtab)); CK(cudaFree(didx));
    CK(cudaFree(dwt));
    free(lg); free(bias); free(ids); free(tab); free(idx); free(wt); free(ridx); free(rwt); free(v); free(gs);
    free(rs); free(i2); free(w2);
}

/* bcu_argmax: the engine's greedy token per row (first maximum, NaN as -inf, 0 when nothing beats -inf), on
 * vocabulary-sized rows with ties, NaN, +-inf, all -inf, all NaN, the maximum in the last column; again with
 * rows of V - 1 over the same memory (the kernel's 4-byte path) */
static void test_argmax(void **st)
{
    (void)st;
    const size_t R = 9, V = 129280;
    float *x = rand_floats(R * V, 4.0f);
    x[0 * V + 77] = 9.0f; x[0 * V + 5] = 9.0f;               /* a tie: the lower index */
    x[1 * V + 3] = NAN; x[1 * V + 1000] = 50.0f;              /* NaN is -inf */
    x[2 * V + 12345] = INFINITY; x[2 * V + 12346] = INFINITY; /* +inf, twice */
    for (size_t i = 0; i < V; i++) x[3 * V + i] = -INFINITY;  /* nothing beats -inf: 0 */
    for (size_t i = 0; i < V; i++) x[4 * V + i] = NAN;
    x[5 * V + V - 1] = 100.0f;                                /* the last column */
    for (size_t i = 0; i < V; i++) x[6 * V + i] = 1.0f;       /* all equal: 0 */
    for (size_t i = 0; i < V; i++) x[7 * V + i] = i % 2 ? NAN : -INFINITY;
    x[7 * V + V / 2 + 1] = -3.0f;
    int32_t want[9], got[9];
    for (size_t r = 0; r < R; r++) {
        want[r] = (int32_t)rc_greedy(x + r * V, V);
    }
    float *dx = up(x, R * V * sizeof(float));
    int32_t *di = dmalloc(R * sizeof(int32_t));
    RUN(bcu_argmax(di, dx, R, V, 0));
    down(got, di, R * sizeof(int32_t));
    for (size_t r = 0; r < R; r++)
        if (got[r] != want[r]) fail_msg("argmax row %zu: %d, want %d", r, got[r], want[r]);
    /* rows of V - 1 (not a multiple of 4: the kernel's scalar loads) over the same memory */
    for (size_t r = 0; r < R; r++) want[r] = (int32_t)rc_greedy(x + r * (V - 1), V - 1);
    RUN(bcu_argmax(di, dx, R, V - 1, 0));
    down(got, di, R * sizeof(int32_t));
    for (size_t r = 0; r < R; r++)
        if (got[r] != want[r]) fail_msg("argmax (V - 1) row %zu: %d, want %d", r, got[r], want[r]);
    for (size_t r = 0; r < R; r++) want[r] = (int32_t)rc_greedy(x + r * V, V);
    assert_int_equal(want[0], 5);
    assert_int_equal(want[3], 0);
    assert_int_equal(want[4], 0);
    assert_int_equal(want[7], (int32_t)(V / 2 + 1));
    printf("  argmax: 9 rows of %zu, first maximum, NaN as -inf\n", V);
    cudaFree(dx);
    cudaFree(di);
    free(x);
}

/* bcu_comp_pool against v4.c comp_pool_slots' loops (written out here): CSA-like entries (8 slots, the first
 * block's previous half absent) and HCA-like ones (128 slots), slots from two buffers (rows with an ape offset,
 * state rows without), 66000 entries in one call (two launches), within TOL per entry (row_err: max |gpu - ref|
 * / max |ref|).  Neither bit for bit nor per element: CUDA's expf is within 2 ulp, not glibc's, and one ulp of a
 * weight moves an output near 0 by far more than 1e-6 of itself (a CPU model of CUDA's expf put such elements
 * 2e-5 .. 9e-5 off, relative to |ref| + 1e-3). */
static void ref_pool(size_t n, int ns, int hd, const float *const *kv, const float *const *g, const int64_t *ao,
                     const float *ape, float *out)
{
    float *w = malloc((size_t)ns * sizeof *w);
    for (size_t i = 0; i < n; i++)
        for (int c = 0; c < hd; c++) {
            const size_t b = i * (size_t)ns;
            float mx = -INFINITY, den = 0, num = 0;
            for (int s = 0; s < ns; s++)
                if (kv[b + s]) mx = fmaxf(mx, ao[b + s] >= 0 ? g[b + s][c] + ape[ao[b + s] + c] : g[b + s][c]);
            for (int s = 0; s < ns; s++)
                if (kv[b + s]) den += (w[s] = expf((ao[b + s] >= 0 ? g[b + s][c] + ape[ao[b + s] + c] : g[b + s][c]) - mx));
            for (int s = 0; s < ns; s++)
                if (kv[b + s]) num += kv[b + s][c] * (w[s] / den);
            out[i * (size_t)hd + c] = num;
        }
    free(w);
}

static void test_comp_pool(void **st)
{
    (void)st;
    /* the last: more entries than one launch's grid.y (65535), so bcu_comp_pool's second launch is checked */
    const struct { int r, ov, hd; size_t n; } cs[] = {
        {4, 1, 512, 37}, {4, 1, 128, 9}, {128, 0, 512, 3}, {16, 0, 100, 5}, {2, 1, 40, 66000}};
    for (size_t t = 0; t < sizeof cs / sizeof cs[0]; t++) {
        const int r = cs[t].r, hd = cs[t].hd, ns = cs[t].ov ? 2 * r : r;
        const size_t n = cs[t].n, cd = (size_t)(cs[t].ov ? 2 : 1) * hd, R = (size_t)r * (n + 2);
        float *rows_kv = rand_floats(R * cd, 1.0f), *rows_g = rand_floats(R * cd, 3.0f);
        float *st_kv = rand_floats((size_t)r * cd, 1.0f), *st_g = rand_floats((size_t)r * cd, 3.0f);
        float *ape = rand_floats((size_t)r * cd, 0.5f);
        float *d_rkv = up(rows_kv, R * cd * 4), *d_rg = up(rows_g, R * cd * 4);
        float *d_skv = up(st_kv, (size_t)r * cd * 4), *d_sg = up(st_g, (size_t)r * cd * 4);
        float *d_ape = up(ape, (size_t)r * cd * 4);
        const float **hk = calloc(n * ns, sizeof *hk), **hg = calloc(n * ns, sizeof *hg);
        int64_t *ao = malloc(n * ns * sizeof *ao);
        bcu_comp_slot *sl = calloc(n * ns, sizeof *sl);
        for (size_t i = 0; i < n; i++)
            for (int s = 0; s < ns; s++) {
                const size_t k = i * ns + s;
                const int q = s % r, c0 = cs[t].ov && s >= r ? hd : 0;
                if (cs[t].ov && s < r && i == 0) { /* block 0: no previous half */
                    ao[k] = -1;
                    continue;
                }
                if ((i + (size_t)s) % 3 == 0) { /* a state row, ape included */
                    hk[k] = st_kv + (size_t)q * cd + c0;
                    hg[k] = st_g + (size_t)q * cd + c0;
                    sl[k] = (bcu_comp_slot){d_skv + (size_t)q * cd + c0, d_sg + (size_t)q * cd + c0, -1};
                    ao[k] = -1;
                } else {                        /* a row of the forward, plus its ape row */
                    const size_t row = (i * (size_t)r + (size_t)s * 7) % R;
                    hk[k] = rows_kv + row * cd + c0;
                    hg[k] = rows_g + row * cd + c0;
                    ao[k] = (int64_t)((size_t)q * cd + c0);
                    sl[k] = (bcu_comp_slot){d_rkv + row * cd + c0, d_rg + row * cd + c0, ao[k]};
                }
            }
        float *want = malloc(n * hd * sizeof *want), *got = malloc(n * hd * sizeof *got);
        ref_pool(n, ns, hd, hk, hg, ao, ape, want);
        bcu_comp_slot *d_sl = up(sl, n * ns * sizeof *sl);
        float *d_out = dmalloc(n * hd * sizeof(float));
        RUN(bcu_comp_pool(d_out, n, ns, hd, d_sl, d_ape, 0));
        down(got, d_out, n * hd * sizeof(float));
        double worst = 0;
        char what[64];
        snprintf(what, sizeof what, "comp_pool case %zu", t);
        expect_tol(what, got, want, n, (size_t)hd, &worst);
        printf("  comp_pool r %d%s hd %d, %zu entries: relative error %.2e\n", r, cs[t].ov ? " (overlap)" : "", hd, n,
               worst);
        cudaFree(d_rkv); cudaFree(d_rg); cudaFree(d_skv); cudaFree(d_sg); cudaFree(d_ape); cudaFree(d_sl); cudaFree(d_out);
        free(rows_kv); free(rows_g); free(st_kv); free(st_g); free(ape); free(hk); free(hg); free(ao); free(sl);
        free(want); free(got);
    }
    /* refused before any launch; one bad argument each (the pointers are never dereferenced) */
    float *const po = (float *)8;
    const bcu_comp_slot *const ps = (const bcu_comp_slot *)8;
    assert_int_equal(bcu_comp_pool(NULL, 1, 8, 4, ps, NULL, 0), cudaErrorInvalidValue);
    assert_int_equal(bcu_comp_pool(po, 1, 8, 4, NULL, NULL, 0), cudaErrorInvalidValue);
    assert_int_equal(bcu_comp_pool(po, 1, BCU_COMP_MAX_SLOTS + 1, 4, ps, NULL, 0), cudaErrorInvalidValue);
    assert_int_equal(bcu_comp_pool(po, 1, 0, 4, ps, NULL, 0), cudaErrorInvalidValue);
    assert_int_equal(bcu_comp_pool(po, 1, 8, 0, ps, NULL, 0), cudaErrorInvalidValue);
}

static void test_route(void **st)
{
    (void)st;
    const rtcase cs[] = {
        {"v4 256/6 sqrt-softplus", 256, 6, 0, 0, 0, L_RANDOM},
        {"v4 256/6 sqrt-softplus official", 256, 6, 0, 1, 0, L_RANDOM},
        {"v4 256/6 ties", 256, 6, 0, 0, 0, L_TIES},
        {"v4 256/6 exact scores", 256, 6, 0, 0, 0, L_EXACT},
        {"v4 256/6 exact ties", 256, 6, 0, 1, 0, L_EXACT_TIES},
        {"v4 256/6 NaN logits", 256, 6, 0, 0, 0, L_NAN},
        {"v4 256/6 hash", 256, 6, 0, 0, 1, L_RANDOM},
        {"512/16 sigmoid", 512, 16, 1, 0, 0, L_RANDOM},
        {"512/16 sigmoid ties", 512, 16, 1, 1, 0, L_TIES},
        {"64/8 hash sigmoid", 64, 8, 1, 1, 1, L_RANDOM},
        {"64/4 sigmoid tiny scores", 64, 4, 1, 0, 0, L_TINY},
        {"64/4 sigmoid tiny scores official", 64, 4, 1, 1, 0, L_TINY},
        {"300/1", 300, 1, 0, 0, 0, L_RANDOM},
        {"1/1", 1, 1, 0, 0, 0, L_RANDOM},
        {"16/16 exact ties", 16, 16, 0, 0, 0, L_EXACT_TIES},
    };
    int flips = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++)
        for (size_t ri = 0; ri < NR; ri++) route_case(&cs[ci], Rs[ri], &flips);
    printf("  route: 15 cases x R 1, 7, 300; idx exact (%d rows differ at a near-tie of random scores)\n", flips);
}

/* Programmatic dependent launch (pdl.cuh), as every kernel of the backend is launched: the second kernel reads
 * what the first wrote after a 200 us spin (its wait orders it), on a stream and replayed from a CUDA graph; with
 * PDL on it was on the GPU before the first finished (else the attribute did nothing), with DEEPINFER_CUDA_PDL=0
 * after. */
static void test_pdl(void **st)
{
    (void)st;
    const char *e = getenv("DEEPINFER_CUDA_PDL");
    const int on = !(e && *e && atoi(e) == 0);
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    int *ws = dmalloc(2 * sizeof(int));
    unsigned long long *dt = dmalloc(2 * sizeof(unsigned long long));
    RUN(bcu_pdl_probe(ws, dt, 1.0, s)); /* the kernels' first launches load them (lazy loading waits) */
    for (int mode = 0; mode < 2; mode++) { /* 0: the stream, 1: a graph of the same launches */
        for (int rep = 0; rep < 3; rep++) {
            if (mode == 0) {
                RUN(bcu_pdl_probe(ws, dt, 200.0, s));
            } else {
                cudaGraph_t g;
                cudaGraphExec_t ge;
                assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
                CK(bcu_pdl_probe(ws, dt, 200.0, s));
                assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
                assert_int_equal(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
                assert_int_equal(cudaGraphLaunch(ge, s), cudaSuccess);
                assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
                cudaGraphExecDestroy(ge);
                cudaGraphDestroy(g);
            }
            assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
            int seen[2];
            unsigned long long t[2];
            down(seen, ws, sizeof seen);
            down(t, dt, sizeof t);
            if (seen[1] != 1) fail_msg("pdl (%s): the second kernel read %d before the first's write", mode ? "graph" : "stream", seen[1]);
            const double lead_us = ((double)t[0] - (double)t[1]) / 1e3; /* > 0: the second started first */
            printf("  pdl %s: the second kernel started %.1f us %s the first finished\n", mode ? "graph" : "stream", fabs(lead_us), lead_us > 0 ? "before" : "after");
            if (on && !(lead_us > 50.0)) fail_msg("pdl on (%s): the second kernel started %.1f us before the first ended, want > 50", mode ? "graph" : "stream", lead_us);
            if (!on && !(lead_us < 0.0)) fail_msg("pdl off (%s): the second kernel started %.1f us before the first ended", mode ? "graph" : "stream", lead_us);
        }
    }
    CK(cudaFree(ws));
    CK(cudaFree(dt));
    cudaStreamDestroy(s);
}

int main(void)
{
    const char *filter = getenv("TEST_CUDA_GRAPH_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_comparisons),
        cmocka_unit_test(test_fq_tie_data),
    };
    const int cpu_fail = cmocka_run_group_tests_name("cpu", cpu, NULL, NULL);
    if (!cuda_device_present()) return cpu_fail ? 1 : 77;
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_gather_scale_add),
        cmocka_unit_test(test_hadamard),
        cmocka_unit_test(test_fq),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_norm_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_hc),
        cmocka_unit_test(test_hc_exact),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_comp_pool),
        cmocka_unit_test(test_pdl),
    };
    const int gpu_fail = cmocka_run_group_tests_name("gpu", gpu, NULL, NULL);
    return cpu_fail || gpu_fail ? 1 : 0;
}
