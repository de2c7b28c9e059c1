/* test_cuda_moe.c - the grouped FP4 routed-expert FFN (src/backend/cuda/moe.cu)
 * against a CPU reference written here.
 *
 * Host part (runs everywhere, before the device check):
 *   - the routing plan of bcu_moe_route_host (the kernel's chunked algorithm
 *     replayed on the host) equals a plain stable sort written here, over many
 *     sizes and routings (hot experts, duplicates within a token, ids out of
 *     range, T = 0..5000, E up to 512, topk up to 16);
 *   - the workspace layout rejects the sizes the kernels do not take.
 * Without a CUDA device it then prints "SKIPPED: no CUDA device" and exits 77.
 * GPU part (tools/gpu_check.sh):
 *   - random FP4 experts (random nibbles, ue8m0 scales 2^-9..2^-2) at small
 *     dims (D 160, inter 96: ragged against every tile) and at V4-Flash dims
 *     (D 4096, inter 2048, 16 experts, top-6); T = 1, 3, 64, 300; uniform
 *     routing, a hot expert (300+ rows: several tiles), duplicate experts in a
 *     token, ids out of range, official and transformers weight placement,
 *     the clamp on (limit = the median |gate|, so both clamps fire) and off;
 *   - each through rows/fp32, tiled/fp32, tiled/bf16x3, tiled/bf16 and auto:
 *     max |y - ref| / max |ref| <= 1e-5 (fp32), 5e-5 (bf16x3) or 2e-2 (bf16), where
 *     ref is computed in double from dtype.c's decoders; every output written
 *     (y is poisoned with NaN); two runs bitwise equal; the device's routing
 *     plan equal to the host's;
 *   - negative controls (small dims): the result is far (> 1e-3) from a
 *     reference without the clamp and from one with the nibbles of each byte
 *     swapped, so the bound above can fail;
 *   - act_fp8_h (official semantics' act_quant of h before W2) in the rows, tiled and mma rows paths: the
 *     device's h, read back from the workspace, is quantised and equals the reference's quantisation up to
 *     rounding-midpoint flips, and y is W2 of that h (test_gpu_act_fp8_h);
 *   - bad sizes and a short workspace are refused.
 * TEST_CUDA_SKIP / TEST_CUDA_FILTER are cmocka name patterns; the sanitizer
 * runs skip "test_gpu_v4dims" and set TEST_CUDA_MOE_QUICK (two small cases). */
#include <math.h>
#include <pthread.h>
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

#include "backend/cuda/moe.h"
#include "backend/cuda/moe_wg.h"
#include "model/dtype.h"
#include "act_quant_ref.h"

/* ------------------------------------------------------------------ random */

#include "test_rng.h" /* rnd, unif01, unif; each test seeds rng_state from its name */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) fail_msg("out of host memory (%zu bytes)", n);
    return p;
}

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                                      \
    } while (0)

/* ------------------------------------------------------------------ routings */

enum { R_UNIFORM, R_HOT, R_DUP, R_BAD, R_SKEW, R_KINDS };
static const char *kind_name[] = {"uniform", "hot", "dup", "bad-ids", "skew"};

/* ids [T, topk], w [T, topk].  UNIFORM: k distinct experts per token, as a
 * top-k gives.  HOT: the same, but every token's first slot is expert 1.
 * DUP: experts drawn with replacement (a token may hold one twice).  BAD:
 * UNIFORM with a few ids out of range.  SKEW: k distinct experts, expert e
 * drawn with weight e + 1, so the experts' row counts spread over a range
 * (the tiles' sizes with them). */
static void make_routing(int32_t *ids, float *w, int64_t T, int topk, int E, int kind)
{
    int32_t perm[BCU_MOE_MAX_EXPERTS];
    for (int64_t t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        int k0 = 0;
        if (kind == R_HOT && E > 1) {
            perm[1] = 0;
            perm[0] = 1;
            k0 = 1;
        }
        for (int k = 0; k < topk; k++) {
            int32_t e;
            if (kind == R_DUP) {
                e = (int32_t)(rnd() % (uint64_t)E);
            } else if (kind == R_SKEW && topk <= E) {
                int taken;
                do { /* weight e + 1 of E (E + 1) / 2, again while the token has e */
                    int64_t r = (int64_t)(rnd() % (uint64_t)((int64_t)E * (E + 1) / 2));
                    for (e = 0; r > e; e++) r -= e + 1;
                    taken = 0;
                    for (int j = 0; j < k; j++) taken |= ids[t * topk + j] == e;
                } while (taken);
            } else if (k < k0) {
                e = perm[k];
            } else { /* partial Fisher-Yates: k distinct */
                int j = k + (int)(rnd() % (uint64_t)(E - k));
                int32_t tmp = perm[k];
                perm[k] = perm[j];
                perm[j] = tmp;
                e = perm[k];
            }
            ids[t * topk + k] = e;
            w[t * topk + k] = (float)(0.05 + 1.45 * unif01());
        }
    }
    if (kind == R_BAD && T * topk > 0) {
        ids[T * topk / 2] = E;
        ids[T * topk - 1] = -1;
        if (T * topk > 2) ids[0] = 0x7fffffff;
    }
}

/* ------------------------------------------------------------------ plans */

typedef struct {
    void *buf;
    bcu_moe_plan p;
} hplan;

static void hplan_make(hplan *h, int64_t T, int topk, int E)
{
    bcu_moe_plan sz;
    assert_int_equal(bcu_moe_plan_layout(NULL, T, topk, E, 32, 32, &sz), 0);
    h->buf = xmalloc(sz.route_bytes);
    memset(h->buf, 0xAB, sz.route_bytes);
    assert_int_equal(bcu_moe_plan_layout(h->buf, T, topk, E, 32, 32, &h->p), 0);
}

/* the plan written plainly: a stable sort of the pairs by expert */
static void naive_plan(const int32_t *ids, const float *w, int64_t T, int topk, int E, const bcu_moe_plan *p)
{
    const int64_t P = T * topk;
    int run = 0, n_act = 0, n_tiles = 0, bad = 0;
    for (int64_t i = 0; i < P; i++) {
        bad += ids[i] < 0 || ids[i] >= E;
        p->pos[i] = -1;
    }
    for (int e = 0; e < E; e++) {
        p->off[e] = run;
        int c = 0;
        for (int64_t i = 0; i < P; i++)
            if (ids[i] == e) {
                p->sorted[run + c] = (int32_t)i;
                p->pos[i] = run + c;
                c++;
            }
        p->cnt[e] = c;
        if (c) {
            p->act[n_act++] = e;
            /* ceil(c / 128) tiles of ceil(c / tiles) rows, the last one takes the rest */
            const int n = (c + BCU_MOE_TILE_M - 1) / BCU_MOE_TILE_M, span = (c + n - 1) / n;
            for (int j = 0, r = 0; j < n; r += span, j++) {
                p->tile_e[n_tiles] = e;
                p->tile_r0[n_tiles++] = run + r;
            }
        }
        run += c;
    }
    p->off[E] = run;
    for (int64_t s = n_act; s < p->n_slots; s++) p->act[s] = -1;
    for (int64_t s = n_tiles; s < p->max_tiles; s++) {
        p->tile_e[s] = -1;
        p->tile_r0[s] = 0;
    }
    p->hdr[0] = n_act;
    p->hdr[1] = n_tiles;
    p->hdr[2] = bad;
    for (int64_t t = 0; t < T; t++) { /* selection of ascending rows */
        int used[BCU_MOE_MAX_TOPK] = {0};
        for (int j = 0; j < topk; j++) {
            int best = -1;
            for (int k = 0; k < topk; k++) {
                int32_t r = p->pos[t * topk + k];
                if (r >= 0 && !used[k] && (best < 0 || r < p->pos[t * topk + best])) best = k;
            }
            if (best >= 0) used[best] = 1;
            p->comb[t * topk + j] = best >= 0 ? p->pos[t * topk + best] : -1;
            p->combw[t * topk + j] = best >= 0 ? w[t * topk + best] : 0.0f;
        }
    }
}

static int cmp_arr(const char *what, const char *field, const int32_t *a, const int32_t *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            printf("  %s: plan.%s[%lld] = %d, expected %d\n", what, field, (long long)i, a[i], b[i]);
            return 1;
        }
    return 0;
}

/* got vs expected, field by field; prints the first difference */
static int plan_differs(const char *what, const bcu_moe_plan *g, const bcu_moe_plan *x, int64_t T, int topk, int E)
{
    const int64_t P = T * topk;
    int d = cmp_arr(what, "hdr", g->hdr, x->hdr, 3);
    d = d || cmp_arr(what, "cnt", g->cnt, x->cnt, E);
    d = d || cmp_arr(what, "off", g->off, x->off, E + 1);
    d = d || cmp_arr(what, "act", g->act, x->act, x->n_slots);
    d = d || cmp_arr(what, "tile_e", g->tile_e, x->tile_e, x->max_tiles);
    d = d || cmp_arr(what, "tile_r0", g->tile_r0, x->tile_r0, x->max_tiles);
    d = d || cmp_arr(what, "sorted", g->sorted, x->sorted, x->off[E]);
    d = d || cmp_arr(what, "pos", g->pos, x->pos, P);
    d = d || cmp_arr(what, "comb", g->comb, x->comb, P);
    if (!d)
        for (int64_t i = 0; i < P; i++)
            if (memcmp(&g->combw[i], &x->combw[i], sizeof(float))) {
                printf("  %s: plan.combw[%lld] = %g, expected %g\n", what, (long long)i, g->combw[i], x->combw[i]);
                d = 1;
                break;
            }
    return d;
}

/* ------------------------------------------------------------------ host tests */

static void test_route_host_matches_stable_sort(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    const int64_t Ts[] = {0, 1, 2, 3, 17, 64, 300, 1000, 5000};
    const int Es[] = {1, 8, 256, 512};
    const int ks[] = {1, 3, 6, 16};
    int n = 0;
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t b = 0; b < sizeof Es / sizeof Es[0]; b++)
            for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++)
                for (int kind = 0; kind < R_KINDS; kind++) {
                    const int64_t T = Ts[a];
                    const int E = Es[b], topk = ks[c];
                    if (topk > E && kind != R_DUP) continue;
                    int32_t *ids = xmalloc((size_t)(T * topk) * sizeof *ids);
                    float *w = xmalloc((size_t)(T * topk) * sizeof *w);
                    make_routing(ids, w, T, topk, E, kind);
                    hplan h, x;
                    hplan_make(&h, T, topk, E);
                    hplan_make(&x, T, topk, E);
                    bcu_moe_route_host(ids, w, T, topk, E, &h.p);
                    naive_plan(ids, w, T, topk, E, &x.p);
                    char what[128];
                    snprintf(what, sizeof what, "host emulation T=%lld E=%d topk=%d %s", (long long)T, E, topk,
                             kind_name[kind]);
                    if (plan_differs(what, &h.p, &x.p, T, topk, E)) fail_msg("%s differs from a stable sort", what);
                    /* the tile bound the grid is sized by */
                    assert_true(x.p.hdr[1] <= x.p.max_tiles);
                    free(h.buf);
                    free(x.buf);
                    free(ids);
                    free(w);
                    n++;
                }
    printf("  [moe] host routing emulation == stable sort on %d routings\n", n);
}

static void test_layout_limits(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    assert_true(bcu_moe_workspace_bytes(64, 6, 256, 4096, 2048) > (size_t)64 * 6 * (4096 + 2048) * 4);
    assert_int_equal(bcu_moe_workspace_bytes(64, 6, 256, 4080, 2048), 0); /* dim % 32 */
    assert_int_equal(bcu_moe_workspace_bytes(64, 6, 256, 4096, 2040), 0);
    assert_int_equal(bcu_moe_workspace_bytes(64, 0, 256, 4096, 2048), 0);
    assert_int_equal(bcu_moe_workspace_bytes(64, 17, 256, 4096, 2048), 0);
    assert_int_equal(bcu_moe_workspace_bytes(64, 6, 513, 4096, 2048), 0);
    assert_int_equal(bcu_moe_workspace_bytes(-1, 6, 256, 4096, 2048), 0);
    assert_int_equal(bcu_moe_workspace_bytes((int64_t)1 << 40, 6, 256, 4096, 2048), 0);
    assert_true(bcu_moe_workspace_bytes(0, 6, 256, 4096, 2048) > 0);
    assert_int_equal(bcu_moe_auto_path(1, 6, 256, BCU_MOE_FP32, 0), BCU_MOE_ROWS);
    assert_int_equal(bcu_moe_auto_path(16384, 6, 256, BCU_MOE_BF16X3, 0), BCU_MOE_TILED);
    assert_int_equal(bcu_moe_auto_path(1, 6, 256, BCU_MOE_BF16X3, 0), BCU_MOE_MMAROWS);
    assert_int_equal(bcu_moe_auto_path(256, 6, 256, BCU_MOE_BF16, 0), BCU_MOE_MMAROWS);
    assert_int_equal(bcu_moe_auto_path(256, 6, 256, BCU_MOE_BF16, 4), BCU_MOE_TILED);
    assert_int_equal(bcu_moe_set_tiling(2, 4), -1);
    assert_int_equal(bcu_moe_set_tiling(3, 1), -1);
}

/* ------------------------------------------------------------------ experts */

typedef struct {
    int E;
    int64_t D, I;
    size_t b13, sc13, b2, sc2; /* bytes per expert: W1/W3 codes, their scales, W2 codes, scales */
    uint8_t *w1, *s1, *w3, *s3, *w2, *s2;         /* host, expert-major */
    uint8_t *dw1, *ds1, *dw3, *ds3, *dw2, *ds2;   /* device, expert-major */
    const uint8_t **dtab;                          /* device: 6 tables of E pointers */
    bcu_moe_experts ex;
} experts;

static uint8_t *rand_codes(size_t n)
{
    uint8_t *p = xmalloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    return p;
}
/* 0: ue8m0 bytes 118..125 (weights' usual range); 1: each block tiny (1..3), usual or large (129..135), which
 * takes the wgmma tiles' decode through both of its scale paths (2^(b - 1) in one bf16 multiply up to b = 128,
 * two above) and bf16 subnormals; 2: the usual range with one block in 48 at byte 0 (dtype.c's 2^-127), which
 * sends the chunks holding one down wg_kernel's general scale path (the warp's other lanes with it) */
static int scale_range;
static uint8_t *rand_scales(size_t n)
{
    uint8_t *p = xmalloc(n);
    static const uint8_t base[3] = {1, 118, 129};
    for (size_t i = 0; i < n; i++) {
        if (scale_range == 1) {
            p[i] = (uint8_t)(base[rnd() % 3] + rnd() % 3);
        } else if (scale_range == 2) {
            const uint64_t r = rnd();
            p[i] = r % 48 == 0 ? 0 : (uint8_t)(118 + (r >> 8) % 8);
        } else {
            p[i] = (uint8_t)(118 + rnd() % 8);
        }
    }
    return p;
}

static uint8_t *upload(const uint8_t *h, size_t n)
{
    void *d = NULL;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static void experts_make(experts *X, int E, int64_t D, int64_t I)
{
    memset(X, 0, sizeof *X);
    X->E = E;
    X->D = D;
    X->I = I;
    X->b13 = (size_t)(I * D / 2);
    X->sc13 = (size_t)(I * (D / 32));
    X->b2 = (size_t)(D * I / 2);
    X->sc2 = (size_t)(D * (I / 32));
    X->w1 = rand_codes(X->b13 * E);
    X->w3 = rand_codes(X->b13 * E);
    X->w2 = rand_codes(X->b2 * E);
    X->s1 = rand_scales(X->sc13 * E);
    X->s3 = rand_scales(X->sc13 * E);
    X->s2 = rand_scales(X->sc2 * E);
    X->dw1 = upload(X->w1, X->b13 * E);
    X->dw3 = upload(X->w3, X->b13 * E);
    X->dw2 = upload(X->w2, X->b2 * E);
    X->ds1 = upload(X->s1, X->sc13 * E);
    X->ds3 = upload(X->s3, X->sc13 * E);
    X->ds2 = upload(X->s2, X->sc2 * E);
    const uint8_t **tab = xmalloc(6 * (size_t)E * sizeof *tab);
    for (int e = 0; e < E; e++) {
        tab[0 * E + e] = X->dw1 + (size_t)e * X->b13;
        tab[1 * E + e] = X->ds1 + (size_t)e * X->sc13;
        tab[2 * E + e] = X->dw3 + (size_t)e * X->b13;
        tab[3 * E + e] = X->ds3 + (size_t)e * X->sc13;
        tab[4 * E + e] = X->dw2 + (size_t)e * X->b2;
        tab[5 * E + e] = X->ds2 + (size_t)e * X->sc2;
    }
    X->dtab = (const uint8_t **)upload((const uint8_t *)tab, 6 * (size_t)E * sizeof *tab);
    free(tab);
    X->ex = (bcu_moe_experts){.n_experts = E, .dim = D, .inter = I, .swiglu_limit = 0.0f, .weight_before_w2 = 0,
                              .w1 = X->dtab + 0 * E, .s1 = X->dtab + 1 * E, .w3 = X->dtab + 2 * E,
                              .s3 = X->dtab + 3 * E, .w2 = X->dtab + 4 * E, .s2 = X->dtab + 5 * E};
}

static void experts_free(experts *X)
{
    free(X->w1); free(X->s1); free(X->w3); free(X->s3); free(X->w2); free(X->s2);
    cudaFree(X->dw1); cudaFree(X->ds1); cudaFree(X->dw3); cudaFree(X->ds3); cudaFree(X->dw2); cudaFree(X->ds2);
    cudaFree((void *)X->dtab);
}

/* ------------------------------------------------------------------ the CPU reference */

/* row r of a packed FP4 matrix [rows, cols] decoded by dtype.c; swap = 1
 * decodes it with the two nibbles of every byte exchanged (a wrong kernel) */
static void fp4_row(const uint8_t *w, const uint8_t *s, int64_t r, int64_t cols, int swap, float *dst, uint8_t *tmp)
{
    const uint8_t *row = w + r * (cols / 2);
    if (swap) {
        for (int64_t i = 0; i < cols / 2; i++) tmp[i] = (uint8_t)((row[i] >> 4) | (row[i] << 4));
        row = tmp;
    }
    md_fp4_row_to_f32(row, s + r * (cols / 32), (size_t)cols, 32, dst);
}

static double dotd(const float *a, const float *b, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)a[i] * b[i];
        s1 += (double)a[i + 1] * b[i + 1];
        s2 += (double)a[i + 2] * b[i + 2];
        s3 += (double)a[i + 3] * b[i + 3];
    }
    for (; i < n; i++) s0 += (double)a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

/* sum |a_i b_i| in double: the scale of a dot product's rounding error */
static double dotd_abs(const float *a, const float *b, int64_t n)
{
    double t = 0;
    for (int64_t i = 0; i < n; i++) t += fabs((double)a[i] * b[i]);
    return t;
}

typedef struct {
    const experts *X;
    const float *x;
    const int32_t *ids;
    const uint8_t *mask; /* tokens to compute, NULL = all */
    int64_t T;
    int topk, swap, tid, nth;
    double limit;
    double *dn; /* [P, D]: W2 swiglu(...) per pair */
    int64_t clamped_g, clamped_u;
} refjob;

static void *ref_worker(void *arg)
{
    refjob *j = arg;
    const experts *X = j->X;
    const int64_t D = X->D, I = X->I, P = j->T * j->topk;
    int64_t *pairs = xmalloc((size_t)P * sizeof *pairs);
    float *row = xmalloc((size_t)(D > I ? D : I) * sizeof *row);
    uint8_t *tmp = xmalloc((size_t)(D > I ? D : I));
    for (int e = j->tid; e < X->E; e += j->nth) {
        int64_t n = 0;
        for (int64_t p = 0; p < P; p++)
            if (j->ids[p] == e && (!j->mask || j->mask[p / j->topk])) pairs[n++] = p;
        if (!n) continue;
        double *g = xmalloc((size_t)(n * I) * sizeof *g), *u = xmalloc((size_t)(n * I) * sizeof *u);
        float *h = xmalloc((size_t)(n * I) * sizeof *h);
        for (int64_t r = 0; r < I; r++) {
            fp4_row(X->w1 + (size_t)e * X->b13, X->s1 + (size_t)e * X->sc13, r, D, j->swap, row, tmp);
            for (int64_t q = 0; q < n; q++) g[q * I + r] = dotd(row, j->x + (pairs[q] / j->topk) * D, D);
            fp4_row(X->w3 + (size_t)e * X->b13, X->s3 + (size_t)e * X->sc13, r, D, j->swap, row, tmp);
            for (int64_t q = 0; q < n; q++) u[q * I + r] = dotd(row, j->x + (pairs[q] / j->topk) * D, D);
        }
        for (int64_t i = 0; i < n * I; i++) {
            double gv = g[i], uv = u[i];
            if (j->limit > 0) {
                j->clamped_g += gv > j->limit;
                j->clamped_u += fabs(uv) > j->limit;
                gv = fmin(gv, j->limit);
                uv = fmax(-j->limit, fmin(uv, j->limit));
            }
            h[i] = (float)(gv / (1.0 + exp(-gv)) * uv); /* float: the dot below reads floats */
        }
        for (int64_t d = 0; d < D; d++) {
            fp4_row(X->w2 + (size_t)e * X->b2, X->s2 + (size_t)e * X->sc2, d, I, j->swap, row, tmp);
            for (int64_t q = 0; q < n; q++) j->dn[pairs[q] * D + d] = dotd(row, h + q * I, I);
        }
        free(g);
        free(u);
        free(h);
    }
    free(pairs);
    free(row);
    free(tmp);
    return NULL;
}

/* y [T, D] in double; returns the number of clamped gate / up values */
static void reference(const experts *X, const float *x, const int32_t *ids, const float *w, int64_t T, int topk,
                      double limit, int swap, const uint8_t *mask, double *y, int64_t *clamped_g, int64_t *clamped_u)
{
    const int64_t D = X->D, P = T * topk;
    double *dn = xmalloc((size_t)(P * D) * sizeof *dn);
    enum { NTH = 16 };
    refjob jobs[NTH];
    pthread_t th[NTH];
    for (int i = 0; i < NTH; i++) {
        jobs[i] = (refjob){.X = X, .x = x, .ids = ids, .mask = mask, .T = T, .topk = topk, .swap = swap, .tid = i,
                           .nth = NTH, .limit = limit, .dn = dn};
        if (pthread_create(&th[i], NULL, ref_worker, &jobs[i])) fail_msg("pthread_create");
    }
    int64_t cg = 0, cu = 0;
    for (int i = 0; i < NTH; i++) {
        pthread_join(th[i], NULL);
        cg += jobs[i].clamped_g;
        cu += jobs[i].clamped_u;
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t d = 0; d < D; d++) {
            double s = 0;
            if (!mask || mask[t])
                for (int k = 0; k < topk; k++) {
                    const int64_t p = t * topk + k;
                    if (ids[p] >= 0 && ids[p] < X->E) s += (double)w[p] * dn[p * D + d];
                }
            y[t * D + d] = s;
        }
    if (clamped_g) *clamped_g = cg;
    if (clamped_u) *clamped_u = cu;
    free(dn);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* the median |gate pre-activation| of the first valid pair: a clamp limit
 * both sides of which see plenty of values */
static double choose_limit(const experts *X, const float *x, const int32_t *ids, int64_t P, int topk)
{
    int64_t p = 0;
    while (p < P && (ids[p] < 0 || ids[p] >= X->E)) p++;
    if (p == P) return 1.0;
    const int e = ids[p];
    float *row = xmalloc((size_t)X->D * sizeof *row);
    double *g = xmalloc((size_t)X->I * sizeof *g);
    for (int64_t r = 0; r < X->I; r++) {
        fp4_row(X->w1 + (size_t)e * X->b13, X->s1 + (size_t)e * X->sc13, r, X->D, 0, row, NULL);
        g[r] = fabs(dotd(row, x + (p / topk) * X->D, X->D));
    }
    qsort(g, (size_t)X->I, sizeof *g, cmp_double);
    double l = g[X->I / 2];
    free(row);
    free(g);
    return l;
}

/* max |got - ref| / max |ref| over the masked tokens; every output of every
 * token must be finite.  Prints the first element past the bound and the worst. */
static double compare(const float *got, const double *ref, const uint8_t *mask, int64_t T, int64_t D, double bound,
                      const char *what, int quiet)
{
    double mref = 0, mdiff = 0;
    int64_t worst = -1, first = -1;
    for (int64_t i = 0; i < T * D; i++)
        if (!isfinite(got[i])) {
            if (!quiet)
                printf("  %s: output (t=%lld, d=%lld) is %g: not written or not finite\n", what, (long long)(i / D),
                       (long long)(i % D), got[i]);
            return INFINITY;
        }
    for (int64_t t = 0; t < T; t++)
        if (!mask || mask[t])
            for (int64_t d = 0; d < D; d++) mref = fmax(mref, fabs(ref[t * D + d]));
    for (int64_t t = 0; t < T; t++)
        if (!mask || mask[t])
            for (int64_t d = 0; d < D; d++) {
                const double df = fabs(got[t * D + d] - ref[t * D + d]);
                if (df > mdiff) {
                    mdiff = df;
                    worst = t * D + d;
                }
                if (first < 0 && df > bound * mref) first = t * D + d;
            }
    const double rel = mref > 0 ? mdiff / mref : mdiff;
    if (!quiet && first >= 0) {
        printf("  %s: first element past the bound: (t=%lld, d=%lld) expected %.9g got %.9g (max |ref| %.4g)\n", what,
               (long long)(first / D), (long long)(first % D), ref[first], got[first], mref);
        printf("  %s: worst: (t=%lld, d=%lld) expected %.9g got %.9g\n", what, (long long)(worst / D),
               (long long)(worst % D), ref[worst], got[worst]);
    }
    return rel;
}

/* ------------------------------------------------------------------ GPU cases */

/* the device buffers of bcu_moe_forward calls on T tokens, with x, the weights and the ids uploaded */
typedef struct {
    float *dx, *dy, *dw;
    int32_t *dids;
    void *ws;
    size_t wsb;
} dcall;

static void dcall_make(dcall *d, const experts *X, const float *x, const int32_t *ids, const float *w, int64_t T,
                       int topk)
{
    const int64_t D = X->D, P = T * topk;
    d->wsb = bcu_moe_workspace_bytes(T, topk, X->E, X->D, X->I);
    assert_true(d->wsb > 0);
    CK(cudaMalloc((void **)&d->dx, (size_t)(T * D) * 4));
    CK(cudaMalloc((void **)&d->dy, (size_t)(T * D) * 4));
    CK(cudaMalloc((void **)&d->dw, (size_t)P * 4));
    CK(cudaMalloc((void **)&d->dids, (size_t)P * 4));
    CK(cudaMalloc(&d->ws, d->wsb));
    CK(cudaMemcpy(d->dx, x, (size_t)(T * D) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d->dw, w, (size_t)P * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d->dids, ids, (size_t)P * 4, cudaMemcpyHostToDevice));
}

static void dcall_free(dcall *d)
{
    cudaFree(d->dx); cudaFree(d->dy); cudaFree(d->dw); cudaFree(d->dids); cudaFree(d->ws);
}

typedef struct {
    const char *name;
    int64_t T;
    int kind;
    int official;  /* weight before W2 */
    int plain;     /* no clamp */
    int sample;    /* > 0: the reference covers only this many tokens */
} mcase;

typedef struct {
    bcu_moe_path path;
    bcu_moe_math math;
    double bound;
    int mt, ks; /* mma rows: the tiling bcu_moe_set_tiling forces; 0, 0: chosen by the batch */
} variant;

static const variant variants[] = {
    /* bf16x3: three bf16 planes per activation, one tensor-core product per plane summed in fp32; at
     * V4 sizes (K 2048-4096) the H200 measured 1.1e-5 (2026-11-29), so its bound is 5e-5 */
    {BCU_MOE_ROWS, BCU_MOE_FP32, 1e-5, 0, 0},  {BCU_MOE_TILED, BCU_MOE_FP32, 1e-5, 0, 0},
    {BCU_MOE_TILED, BCU_MOE_BF16X3, 5e-5, 0, 0}, {BCU_MOE_TILED, BCU_MOE_BF16, 2e-2, 0, 0},
    {BCU_MOE_AUTO, BCU_MOE_FP32, 1e-5, 0, 0},
    /* mma rows: three planes for bf16x3, the hi plane alone for bf16 (activations rounded to bf16, like the
     * tiles); every tiling (m16 tiles per pass, K split over the block's warps or not) */
    {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 0, 0}, {BCU_MOE_MMAROWS, BCU_MOE_BF16, 2e-2, 0, 0},
    {BCU_MOE_MMAROWS, BCU_MOE_BF16, 2e-2, 4, 4},
    {BCU_MOE_AUTO, BCU_MOE_BF16X3, 5e-5, 0, 0},    {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 1, 1},
    {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 2, 1}, {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 4, 1},
    {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 1, 4}, {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 4, 4},
};

static void run_case(experts *X, int topk, const mcase *c, int controls)
{
    const int64_t T = c->T, D = X->D, P = T * topk;
    int32_t *ids = xmalloc((size_t)P * sizeof *ids);
    float *w = xmalloc((size_t)P * sizeof *w), *x = xmalloc((size_t)(T * D) * sizeof *x);
    make_routing(ids, w, T, topk, X->E, c->kind);
    for (int64_t i = 0; i < T * D; i++) x[i] = unif();
    uint8_t *mask = NULL;
    if (c->sample > 0 && c->sample < T) {
        mask = calloc((size_t)T, 1);
        for (int i = 0; i < c->sample; i++) mask[(int64_t)i * T / c->sample] = 1;
        mask[T - 1] = 1;
    }
    const double limit = c->plain ? 0.0 : choose_limit(X, x, ids, P, topk);
    X->ex.swiglu_limit = (float)limit;
    X->ex.weight_before_w2 = c->official;
    double *ref = xmalloc((size_t)(T * D) * sizeof *ref);
    int64_t cg = 0, cu = 0;
    reference(X, x, ids, w, T, topk, (float)limit, 0, mask, ref, &cg, &cu);
    if (!c->plain && (cg == 0 || cu == 0)) fail_msg("%s: the clamp never fired (gate %lld, up %lld)", c->name,
                                                     (long long)cg, (long long)cu);

    dcall dc;
    dcall_make(&dc, X, x, ids, w, T, topk);
    float *dx = dc.dx, *dw = dc.dw, *dy = dc.dy;
    int32_t *dids = dc.dids;
    void *ws = dc.ws;
    const size_t wsb = dc.wsb;
    float *y = xmalloc((size_t)(T * D) * sizeof *y), *y2 = xmalloc((size_t)(T * D) * sizeof *y2);

    hplan hp, gp;
    hplan_make(&hp, T, topk, X->E);
    hplan_make(&gp, T, topk, X->E);
    bcu_moe_route_host(ids, w, T, topk, X->E, &hp.p);

    char what[160];
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const variant *vr = &variants[v];
        char tiling[16] = "";
        if (vr->mt) snprintf(tiling, sizeof tiling, " %d,%d", vr->mt, vr->ks);
        snprintf(what, sizeof what, "%s T=%lld %s/%s%s", c->name, (long long)T, bcu_moe_path_name(vr->path),
                 bcu_moe_math_name(vr->math), tiling);
        assert_int_equal(bcu_moe_set_tiling(vr->mt, vr->ks), 0);
        for (int run = 0; run < 2; run++) {
            CK(cudaMemset(dy, 0xFF, (size_t)(T * D) * 4)); /* NaN */
            CK(cudaMemset(ws, 0xFF, wsb));
            cudaError_t r = bcu_moe_forward(&X->ex, dy, dx, dids, dw, T, topk, vr->math, vr->path, ws, wsb, 0);
            if (r != cudaSuccess) fail_msg("%s: bcu_moe_forward: %s", what, cudaGetErrorString(r));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(run ? y2 : y, dy, (size_t)(T * D) * 4, cudaMemcpyDeviceToHost));
        }
        CK(cudaMemcpy(gp.buf, ws, gp.p.route_bytes, cudaMemcpyDeviceToHost));
        if (plan_differs(what, &gp.p, &hp.p, T, topk, X->E)) fail_msg("%s: the device routing plan differs", what);
        if (memcmp(y, y2, (size_t)(T * D) * 4)) {
            for (int64_t i = 0; i < T * D; i++)
                if (memcmp(&y[i], &y2[i], 4)) {
                    printf("  %s: run 2 differs at (t=%lld, d=%lld): %.9g vs %.9g\n", what, (long long)(i / D),
                           (long long)(i % D), y[i], y2[i]);
                    break;
                }
            fail_msg("%s: not deterministic", what);
        }
        const double e = compare(y, ref, mask, T, D, vr->bound, what, 0);
        printf("  [moe] %-38s max rel %.2e (bound %.0e)\n", what, e, vr->bound);
        if (!(e <= vr->bound)) fail_msg("%s: max rel error %.3g > %.0e", what, e, vr->bound);
        if (controls && v == 0) {
            /* the same output against wrong references must fail the bound by far */
            double *bad = xmalloc((size_t)(T * D) * sizeof *bad);
            if (!c->plain) {
                reference(X, x, ids, w, T, topk, 0.0, 0, mask, bad, NULL, NULL);
                const double en = compare(y, bad, mask, T, D, vr->bound, "vs no-clamp", 1);
                printf("  [moe] %-38s vs a reference without the clamp: %.2e (must be > 1e-3)\n", what, en);
                if (!(en > 1e-3)) fail_msg("%s: cannot tell the clamp from no clamp (%.3g)", what, en);
            }
            reference(X, x, ids, w, T, topk, (float)limit, 1, mask, bad, NULL, NULL);
            const double es = compare(y, bad, mask, T, D, vr->bound, "vs swapped", 1);
            printf("  [moe] %-38s vs a reference with swapped nibbles: %.2e (must be > 1e-3)\n", what, es);
            if (!(es > 1e-3)) fail_msg("%s: cannot tell the nibble order (%.3g)", what, es);
            free(bad);
        }
    }
    if (c->kind == R_BAD) assert_true(hp.p.hdr[2] > 0);
    printf("  [moe] %s T=%lld: %d active experts, %d tiles, %d bad ids, limit %.4g, clamped gate %lld up %lld\n",
           c->name, (long long)T, hp.p.hdr[0], hp.p.hdr[1], hp.p.hdr[2], limit, (long long)cg, (long long)cu);
    free(hp.buf);
    free(gp.buf);
    dcall_free(&dc);
    free(ids); free(w); free(x); free(ref); free(y); free(y2); free(mask);
}

static void test_gpu_small(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    experts X;
    experts_make(&X, 8, 160, 96);
    const mcase cases[] = {
        {"small uniform", 1, R_UNIFORM, 0, 0, 0},   {"small uniform", 3, R_UNIFORM, 0, 0, 0},
        {"small uniform", 64, R_UNIFORM, 0, 0, 0},  {"small uniform", 300, R_UNIFORM, 0, 0, 0},
        {"small hot", 300, R_HOT, 0, 0, 0},         {"small dup", 64, R_DUP, 0, 0, 0},
        {"small bad-ids", 3, R_BAD, 0, 0, 0},        {"small official", 64, R_UNIFORM, 1, 0, 0},
        {"small official hot", 300, R_HOT, 1, 0, 0}, {"small no-clamp", 64, R_UNIFORM, 0, 1, 0},
    };
    /* TEST_CUDA_MOE_QUICK (the compute-sanitizer runs): T = 3 and the hot T = 300 only */
    const int quick = getenv("TEST_CUDA_MOE_QUICK") != NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!quick || i == 1 || i == 4) run_case(&X, 3, &cases[i], !quick);
    experts_free(&X);
}

static void test_gpu_v4dims(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    experts X;
    experts_make(&X, 16, 4096, 2048);
    const mcase cases[] = {
        {"v4dims uniform", 1, R_UNIFORM, 0, 0, 0},
        {"v4dims uniform", 3, R_UNIFORM, 0, 0, 0},
        {"v4dims uniform", 64, R_UNIFORM, 0, 0, 0},
        {"v4dims official", 64, R_UNIFORM, 1, 0, 0},
        {"v4dims hot (32 tokens checked)", 300, R_HOT, 0, 0, 32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&X, 6, &cases[i], 0);
    experts_free(&X);
}

/* ------------------------------------------------------------------ act_fp8_h */

/* BE_MOE_ACT_FP8_H (official semantics, FP4 experts): h = w * swiglu(W1 x, W3 x) goes through act_quant (aq_ref_row) before W2, in
 * every path.  The workspace keeps the device's h (after the quantisation, rows in the routing plan's order), so
 * each stage is checked on its own:
 *   - every row of h is quantised: h / scale is an e4m3 value in every block of 128, and h equals this file's
 *     quantisation of the reference h (double sums), except where the reference lies within 1e-4 of a rounding
 *     midpoint (more where the gate or up sum cancels: the fp32 sums' error bound), where the device may round the
 *     other way (then exactly one step apart; at most 1 in 2000);
 *   - y = sum over the token's pairs of W2 h_device, within the path's usual bound;
 *   - control: the same y is far (> 1e-3) from W2 applied to the unquantised reference h. */
/* The routing plan on the device, bcu_moe_route alone: one warp's plan up to 32 pairs, one block below 4096 pairs,
 * the four chunked launches from there (prefill-sized batches), each against the plain stable sort (naive_plan,
 * which shares no code with the kernels) and against the host emulation */
static void test_gpu_route(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    /* top-6: 30 and 36 pairs around the one-warp plan's end (32), 4092 and 4098 around the chunked plan's start */
    const int64_t Ts[] = {1, 2, 5, 6, 300, 682, 683, 5000, 20000};
    const int Es[] = {8, 256, 512};
    const int ks[] = {1, 6};
    int n = 0;
    for (size_t a = 0; a < sizeof Ts / sizeof Ts[0]; a++)
        for (size_t b = 0; b < sizeof Es / sizeof Es[0]; b++)
            for (size_t c = 0; c < sizeof ks / sizeof ks[0]; c++)
                for (int kind = 0; kind < R_KINDS; kind++) {
                    const int64_t T = Ts[a], P = T * ks[c];
                    const int E = Es[b], topk = ks[c];
                    int32_t *ids = xmalloc((size_t)P * sizeof *ids);
                    float *w = xmalloc((size_t)P * sizeof *w);
                    make_routing(ids, w, T, topk, E, kind);
                    hplan h, x, g;
                    hplan_make(&h, T, topk, E);
                    hplan_make(&x, T, topk, E);
                    hplan_make(&g, T, topk, E);
                    bcu_moe_route_host(ids, w, T, topk, E, &h.p);
                    naive_plan(ids, w, T, topk, E, &x.p);
                    bcu_moe_plan dp;
                    assert_int_equal(bcu_moe_plan_layout(NULL, T, topk, E, 32, 32, &dp), 0);
                    void *ws;
                    int32_t *dids;
                    float *dw;
                    CK(cudaMalloc(&ws, dp.bytes));
                    CK(cudaMalloc((void **)&dids, (size_t)P * sizeof *dids));
                    CK(cudaMalloc((void **)&dw, (size_t)P * sizeof *dw));
                    CK(cudaMemcpy(dids, ids, (size_t)P * sizeof *dids, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(dw, w, (size_t)P * sizeof *dw, cudaMemcpyHostToDevice));
                    CK(cudaMemset(ws, 0xFF, dp.bytes));
                    CK(bcu_moe_route(dids, dw, T, topk, E, 32, 32, ws, dp.bytes, 0));
                    CK(cudaDeviceSynchronize());
                    CK(cudaMemcpy(g.buf, ws, g.p.route_bytes, cudaMemcpyDeviceToHost));
                    char what[128];
                    snprintf(what, sizeof what, "device routing T=%lld E=%d topk=%d %s (%s)", (long long)T, E, topk,
                             kind_name[kind], P <= 32 ? "one warp" : P < 4096 ? "one block" : "chunked");
                    if (plan_differs(what, &g.p, &x.p, T, topk, E)) fail_msg("%s differs from a stable sort", what);
                    if (plan_differs(what, &g.p, &h.p, T, topk, E)) fail_msg("%s differs from the host plan", what);
                    CK(cudaFree(ws));
                    CK(cudaFree(dids));
                    CK(cudaFree(dw));
                    free(h.buf);
                    free(x.buf);
                    free(g.buf);
                    free(ids);
                    free(w);
                    n++;
                }
    printf("  [moe] device routing == stable sort == host emulation on %d routings (one warp, one block, chunked)\n",
           n);
}

/* The wgmma tiles leave the quantised h only as stage 2's operand: bf16 values in the tiles' k order (moe_wg.h).
 * Within each 128 columns, step s (16 values) holds at k position 8 h + 2 q + j the column 32 q + 8 (s / 2) +
 * 2 (s % 2) + h + 4 j; this reads them back into h [P][I]. */
static void hd_of_tiles(float *hd, const uint16_t *dhq, int64_t P, int64_t I)
{
    uint16_t *b = xmalloc((size_t)(P * I) * sizeof *b);
    CK(cudaMemcpy(b, dhq, (size_t)(P * I) * sizeof *b, cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < P; r++)
        for (int64_t c = 0; c < I; c += 128)
            for (int m = 0; m < 128; m++) {
                const int q = m / 32, s = 2 * (m % 32 / 8) + m % 4 / 2, h = m % 2, j = m % 8 / 4;
                const uint32_t u = (uint32_t)b[r * I + c + 16 * s + 8 * h + 2 * q + j] << 16;
                memcpy(&hd[r * I + c + m], &u, sizeof u);
            }
    free(b);
}

static int fp8_h_routing = R_UNIFORM;
static unsigned fp8_h_widths; /* bit n / 16 - 1: some tile had n - 15 .. n rows */
static void act_fp8_h_run(int E, int64_t Dm, int64_t Im, int topk, const int64_t *Ts, size_t nT, const variant *vs,
                         size_t nv)
{
    experts X;
    experts_make(&X, E, Dm, Im);
    const int64_t D = X.D, I = X.I;
    for (size_t ti = 0; ti < nT; ti++) {
        const int64_t T = Ts[ti], P = T * topk;
        int32_t *ids = xmalloc((size_t)P * sizeof *ids);
        float *w = xmalloc((size_t)P * sizeof *w), *x = xmalloc((size_t)(T * D) * sizeof *x);
        make_routing(ids, w, T, topk, X.E, fp8_h_routing);
        for (int64_t i = 0; i < T * D; i++) x[i] = unif();
        for (int64_t t = 0; t < T; t++) aq_ref_row(x + t * D, D, NULL); /* the caller hands x over quantised */
        X.ex.swiglu_limit = 0.0f;
        X.ex.weight_before_w2 = 1;
        X.ex.act_fp8_h = 1;
        hplan hp;
        hplan_make(&hp, T, topk, X.E);
        bcu_moe_route_host(ids, w, T, topk, X.E, &hp.p);
        for (int e = 0; e < X.E; e++) { /* the wgmma widths these tiles take (16 a step: the tile's rows rounded up) */
            const int64_t span = hp.p.cnt[e] < 1 ? 0 : (hp.p.cnt[e] + (hp.p.cnt[e] + 127) / 128 - 1) / ((hp.p.cnt[e] + 127) / 128);
            if (span) fp8_h_widths |= 1u << ((span + 15) / 16 - 1);
        }
        /* the reference h of every row, unquantised (hr) and quantised (hq), with the midpoint gaps, and how near a
         * midpoint the device's h may come to round the other way (allow: 1e-4 of h, or more where the gate or up
         * sum cancels: the device's fp32 sums of D exact products are within D 2^-24 sum |terms| of the exact ones,
         * and h moves by at most 1.3x a relative change in the gate (silu) and 1x one in up) */
        float *hr = xmalloc((size_t)(P * I) * sizeof *hr), *hq = xmalloc((size_t)(P * I) * sizeof *hq);
        double *gap = xmalloc((size_t)(P * I) * sizeof *gap), *allow = xmalloc((size_t)(P * I) * sizeof *allow);
        float *row = xmalloc((size_t)D * sizeof *row);
        for (int64_t r = 0; r < P; r++) {
            const int32_t pair = hp.p.sorted[r], e = ids[pair];
            const float *xt = x + (int64_t)(pair / topk) * D;
            for (int64_t f = 0; f < I; f++) {
                fp4_row(X.w1 + (size_t)e * X.b13, X.s1 + (size_t)e * X.sc13, f, D, 0, row, NULL);
                const double g = dotd(row, xt, D), ga = dotd_abs(row, xt, D);
                fp4_row(X.w3 + (size_t)e * X.b13, X.s3 + (size_t)e * X.sc13, f, D, 0, row, NULL);
                const double u = dotd(row, xt, D), ua = dotd_abs(row, xt, D);
                hr[r * I + f] = (float)((float)(g / (1.0 + exp(-g)) * u) * (double)w[pair]);
                const double cond = 1.3 * ga / fmax(fabs(g), 1e-300) + ua / fmax(fabs(u), 1e-300);
                allow[r * I + f] = 1e-4 + fmin(2.0 * (double)D * 0x1.0p-24 * cond, 1.0);
            }
            memcpy(hq + r * I, hr + r * I, (size_t)I * sizeof *hq);
            aq_ref_row(hq + r * I, I, gap + r * I);
        }
        dcall dc;
        dcall_make(&dc, &X, x, ids, w, T, topk);
        float *dx = dc.dx, *dw = dc.dw, *dy = dc.dy;
        int32_t *dids = dc.dids;
        void *ws = dc.ws;
        const size_t wsb = dc.wsb;
        bcu_moe_plan dp; /* the device workspace's layout: where h is */
        assert_int_equal(bcu_moe_plan_layout(ws, T, topk, X.E, D, I, &dp), 0);
        float *y = xmalloc((size_t)(T * D) * sizeof *y), *hd = xmalloc((size_t)(P * I) * sizeof *hd);
        float *ys = xmalloc(nv * (size_t)(T * D) * sizeof *ys); /* every variant's y, for the bit-exact pairs */
        double *yr = xmalloc((size_t)(T * D) * sizeof *yr), *yc = xmalloc((size_t)(T * D) * sizeof *yc);
        for (size_t v = 0; v < nv; v++) {
            char what[96];
            snprintf(what, sizeof what, "act_fp8_h D=%lld T=%lld %s/%s %d,%d", (long long)D, (long long)T, bcu_moe_path_name(vs[v].path),
                     bcu_moe_math_name(vs[v].math), vs[v].mt, vs[v].ks);
            assert_int_equal(bcu_moe_set_tiling(vs[v].mt, vs[v].ks), 0);
            CK(cudaMemset(dy, 0xFF, (size_t)(T * D) * 4));
            CK(cudaMemset(ws, 0xFF, wsb));
            cudaError_t r = bcu_moe_forward(&X.ex, dy, dx, dids, dw, T, topk, vs[v].math, vs[v].path, ws, wsb, 0);
            if (r != cudaSuccess) fail_msg("%s: bcu_moe_forward: %s", what, cudaGetErrorString(r));
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y, dy, (size_t)(T * D) * 4, cudaMemcpyDeviceToHost));
            if (vs[v].path == BCU_MOE_WGTILES) hd_of_tiles(hd, dp.hq, P, I);
            else CK(cudaMemcpy(hd, dp.h, (size_t)(P * I) * 4, cudaMemcpyDeviceToHost));
            memcpy(ys + v * (size_t)(T * D), y, (size_t)(T * D) * sizeof *y);
            if (vs[v].path == BCU_MOE_MMAROWS && vs[v].math == BCU_MOE_BF16) {
                /* one plane of exact bf16 values: the three-plane variant of the same tiling, bit for bit */
                const float *y3 = ys + (v - 2) * (size_t)(T * D);
                assert_true(vs[v - 2].math == BCU_MOE_BF16X3 && vs[v - 2].mt == vs[v].mt && vs[v - 2].ks == vs[v].ks);
                int64_t ndiff = 0;
                for (int64_t i = 0; i < T * D; i++) ndiff += memcmp(&y[i], &y3[i], sizeof *y) != 0;
                printf("  [moe] %-44s vs three planes: %lld of %lld outputs differ\n", what, (long long)ndiff,
                       (long long)(T * D));
                if (ndiff) fail_msg("%s: %lld outputs differ from the three-plane mma rows", what, (long long)ndiff);
            }
            if (vs[v].path == BCU_MOE_WGGEMV) {
                /* the GEMV sums as the f16 wgmma kernel does (block sums in fp32, scaled in block order): the
                 * same bits wherever a block's sum is exact, which these inputs' are */
                size_t u = 0;
                while (u < v && !(vs[u].path == BCU_MOE_WGMMA && vs[u].math == BCU_MOE_BF16X3)) u++;
                if (u == v) fail_msg("%s: the test lists no f16 wgmma variant before the GEMV", what);
                const float *yw = ys + u * (size_t)(T * D);
                int64_t ndiff = 0;
                for (int64_t i = 0; i < T * D; i++) ndiff += memcmp(&y[i], &yw[i], sizeof *y) != 0;
                printf("  [moe] %-44s vs the f16 wgmma kernel: %lld of %lld outputs differ\n", what, (long long)ndiff,
                       (long long)(T * D));
                if (ndiff) fail_msg("%s: %lld outputs differ from the f16 wgmma kernel", what, (long long)ndiff);
            }
            /* stage 1: quantised, and the reference's quantisation up to midpoint flips (one step, where the
             * reference lies within allow of a midpoint: 1e-4, more where its sums cancel).  wgmma on e4m3 codes (the fast maths) sums in the FP8
             * tensor core's ~13 bits relative to the largest term: a small gate or up value (one that cancels)
             * moves by far more than 1e-4 of itself, so there h may round a step or two off anywhere (a small
             * element of its block even to 0): there only the count is bounded (1 in 50), and y below.  Its block's
             * amax moves as well, so where the reference's lies near a power of two times 448 the device's scale may
             * be half or twice the reference's: a value is then a code of that scale (twenty-first session: one
             * block of T = 400, an e4m3 subnormal of half the scale, under TEST_CUDA_MOE_QUICK's inputs) */
            const int fast8 = vs[v].path == BCU_MOE_WGMMA && vs[v].math == BCU_MOE_BF16;
            const int64_t flipdiv = fast8 ? 50 : 2000;
            int64_t flips = 0;
            for (int64_t i = 0; i < P * I; i++) {
                if (hd[i] == hq[i]) continue;
                const float sc = aq_ref_scale(hr + i / 128 * 128, 128);
                const float vq = hd[i] / sc;
                const uint8_t c = md_f32_to_e4m3(vq), cr = md_f32_to_e4m3(hq[i] / sc);
                int on_grid = md_e4m3_to_f32(c) == vq;
                for (int f = 0; fast8 && !on_grid && f < 2; f++) { /* the device's scale half or twice the reference's */
                    const float v2 = hd[i] / (f ? 2.0f * sc : 0.5f * sc);
                    on_grid = md_e4m3_to_f32(md_f32_to_e4m3(v2)) == v2;
                }
                if (!(on_grid && (fast8 || (gap[i] < allow[i] && abs((c & 0x7f) - (cr & 0x7f)) == 1))))
                    fail_msg("%s: h[row %lld, %lld] = %.9g, reference %.9g (unquantised %.9g, midpoint gap %.2g)",
                             what, (long long)(i / I), (long long)(i % I), hd[i], hq[i], hr[i], gap[i]);
                flips++;
            }
            if (flips * flipdiv > P * I) fail_msg("%s: %lld midpoint flips in %lld values", what, (long long)flips,
                                               (long long)(P * I));
            /* stage 2 from the device's h, and the control from the unquantised h */
            memset(yr, 0, (size_t)(T * D) * sizeof *yr);
            memset(yc, 0, (size_t)(T * D) * sizeof *yc);
            for (int64_t rr = 0; rr < P; rr++) {
                const int32_t pair = hp.p.sorted[rr], e = ids[pair];
                const int64_t t = pair / topk;
                for (int64_t d = 0; d < D; d++) {
                    fp4_row(X.w2 + (size_t)e * X.b2, X.s2 + (size_t)e * X.sc2, d, I, 0, row, NULL);
                    yr[t * D + d] += dotd(row, hd + rr * I, I);
                    yc[t * D + d] += dotd(row, hr + rr * I, I);
                }
            }
            const double err = compare(y, yr, NULL, T, D, vs[v].bound, what, 0);
            const double ctl = compare(y, yc, NULL, T, D, vs[v].bound, "vs unquantised h", 1);
            printf("  [moe] %-44s h flips %lld / %lld, y max rel %.2e (bound %.0e), vs unquantised h %.2e\n", what,
                   (long long)flips, (long long)(P * I), err, vs[v].bound, ctl);
            if (!(err <= vs[v].bound)) fail_msg("%s: max rel error %.3g > %.0e", what, err, vs[v].bound);
            if (!(ctl > 1e-3)) fail_msg("%s: cannot tell quantised h from unquantised (%.3g)", what, ctl);
        }
        assert_int_equal(bcu_moe_set_tiling(0, 0), 0);
        X.ex.act_fp8_h = 0;
        dcall_free(&dc);
        free(hp.buf); free(ids); free(w); free(x); free(hr); free(hq); free(gap); free(allow); free(row); free(y); free(hd);
        free(yr); free(yc); free(ys);
    }
    experts_free(&X);
}

static void test_gpu_act_fp8_h(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    const int64_t Ts[] = {5, 64, 400}; /* 400: 150 rows per expert, two tiles of 128 each */
    /* tiled bf16 (one plane): exact here, since x and h are e4m3 codes times powers of two (what the backend
     * runs for bf16x3 when both went through act_quant) */
    const variant vs[] = {{BCU_MOE_ROWS, BCU_MOE_FP32, 1e-5, 0, 0},
                          {BCU_MOE_TILED, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_TILED, BCU_MOE_BF16, 5e-5, 0, 0},
                          {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 4, 4},
                          /* the hi plane alone: x and h are bf16 values here, so the very bits of three planes
                           * (checked against the two variants above: vs[v - 2]) */
                          {BCU_MOE_MMAROWS, BCU_MOE_BF16, 5e-5, 0, 0},
                          {BCU_MOE_MMAROWS, BCU_MOE_BF16, 5e-5, 4, 4},
                          /* wgmma (sm_90a only: last, left out where the device cannot): on f16 values
                           * (bf16x3: fp32-exact products), on e4m3 codes (bf16: the FP8 tensor core's sums) */
                          {BCU_MOE_WGMMA, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGMMA, BCU_MOE_BF16, 2e-3, 0, 0},
                          /* the wgmma tiles: bf16 values with their scales, exact products, fp32 sums */
                          {BCU_MOE_WGTILES, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          /* the GEMV (passes of two tokens: 150 rows an expert at T = 400 are 75 passes) */
                          {BCU_MOE_WGGEMV, BCU_MOE_BF16X3, 5e-5, 0, 0}};
    const size_t nv = sizeof vs / sizeof vs[0] - (bcu_wg_available() ? 0 : 4);
    if (!bcu_wg_available())
        printf("  [moe] act_fp8_h: the four sm_90a variants NOT RUN (this device has no sm_90a)\n");
    act_fp8_h_run(8, 512, 384, 3, Ts, 3, vs, nv); /* inter: three blocks of 128 */
}

/* The wgmma tiles with weight scales far from the usual range (tiny, usual and large blocks mixed), beside the
 * one-plane tiles (exact bf16 products too) */
static void test_gpu_wgtiles_scales(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    if (!bcu_wg_available()) skip();
    const int64_t Ts[] = {64, 400};
    const variant vs[] = {{BCU_MOE_TILED, BCU_MOE_BF16, 5e-5, 0, 0}, {BCU_MOE_WGTILES, BCU_MOE_BF16X3, 5e-5, 0, 0}};
    scale_range = 1;
    act_fp8_h_run(8, 512, 384, 3, Ts, 2, vs, 2);
    scale_range = 0;
}

/* The wgmma decode kernel and the GEMV with scale bytes of 0 among the usual ones (scale_range 2), beside the mma
 * rows: the chunks that hold one take the general ue8m0 path for the whole warp */
static void test_gpu_wgmma_scales(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    if (!bcu_wg_available()) skip();
    const int64_t Ts[] = {1, 16};
    const variant vs[] = {{BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGMMA, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGMMA, BCU_MOE_BF16, 2e-3, 0, 0},
                          {BCU_MOE_WGGEMV, BCU_MOE_BF16X3, 5e-5, 0, 0}};
    scale_range = 2;
    act_fp8_h_run(8, 512, 384, 3, Ts, 2, vs, 4);
    scale_range = 0;
}

/* The wgmma tiles over experts of 5 to 270 rows (skewed routing): tiles of every wgmma width (16, 32, .., 128 tokens)
 * and experts cut into two and three tiles, beside the one-plane tiles */
static void test_gpu_wgtiles_sizes(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    if (!bcu_wg_available()) skip();
    const int64_t Ts[] = {64, 120, 250, 400, 700};
    const variant vs[] = {{BCU_MOE_TILED, BCU_MOE_BF16, 5e-5, 0, 0}, {BCU_MOE_WGTILES, BCU_MOE_BF16X3, 5e-5, 0, 0}};
    fp8_h_routing = R_SKEW;
    fp8_h_widths = 0;
    act_fp8_h_run(8, 512, 384, 3, Ts, 5, vs, 2);
    fp8_h_routing = R_UNIFORM;
    printf("  [moe] wgtiles sizes: tile widths covered 0x%02x (all eight: 0xff)\n", fp8_h_widths);
    assert_int_equal(fp8_h_widths, 0xffu);
}

/* The wgmma paths and the GEMV at V4-Flash sizes (dim 4096, inter 2048, top-6), beside the mma rows on the same
 * inputs */
static void test_gpu_wgmma_v4dims(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    if (!bcu_wg_available()) skip();
    const int64_t Ts[] = {1, 16}; /* 6 and 96 rows over 16 experts: one partial pass of 8, and full ones */
    const variant vs[] = {{BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGMMA, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGMMA, BCU_MOE_BF16, 2e-3, 0, 0},
                          {BCU_MOE_WGTILES, BCU_MOE_BF16X3, 5e-5, 0, 0},
                          {BCU_MOE_WGGEMV, BCU_MOE_BF16X3, 5e-5, 0, 0}};
    act_fp8_h_run(16, 4096, 2048, 6, Ts, 2, vs, 5);
}

/* ------------------------------------------------------------------ wgmma */

/* f16 bits of a normal value (the probe's values are e4m3 values of exponent -3 .. 3: exact in f16) */
static uint16_t f16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u >> 16 & 0x8000u) | (((u >> 23 & 0xffu) - 112u) << 10) | (u >> 13 & 0x3ffu));
}

/* The register fragments moe_wg.cu relies on, checked on the device: random A (in registers, as each thread of
 * the warpgroup holds it) and B, one wgmma (m64n8k32 e4m3, and m64n8k16 f16), the output against double sums of
 * the same values under two readings of the fragment: (0) register r, element j of lane 4g + q in warp w is
 * A[16w + g + 8 (r & 1)][E q + j + (K / 2) (r >> 1)] with E elements a register (4 e4m3, 2 f16) and K the step's
 * k (what the kernel uses), (1) with the roles of r's two bits swapped.  Exactly one may fit; the other's error
 * shows the check can fail.  The fitting one's error is the tensor core's own summation: printed, and for f16
 * bounded by fp32 rounding (the path the default maths takes must be exact products summed in fp32). */
static void test_gpu_wg_probe(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    if (!bcu_wg_available()) skip();
    for (int f16 = 0; f16 < 2; f16++) {
        const int per = f16 ? 2 : 4, Kst = f16 ? 16 : 32; /* elements a register, k of the step */
        uint32_t a[128 * 4];
        uint8_t b[8 * 32];
        float av[128 * 4][4], bv[8][32], d[64 * 8];
        /* e4m3 codes with exponent field 4..10 (2^-3 .. 2^3), any mantissa and sign: no NaN, no overflow */
#define WG_CODE() ((uint8_t)((rnd() & 1) << 7 | (4 + rnd() % 7) << 3 | (rnd() & 7)))
        for (int i = 0; i < 128 * 4; i++) {
            a[i] = 0;
            for (int j = 0; j < per; j++) {
                const uint8_t c = WG_CODE();
                av[i][j] = md_e4m3_to_f32(c);
                a[i] |= f16 ? (uint32_t)f16_bits(av[i][j]) << (16 * j) : (uint32_t)c << (8 * j);
            }
        }
        for (int n = 0; n < 8; n++)
            for (int k = 0; k < Kst; k++) {
                const uint8_t c = WG_CODE();
                bv[n][k] = md_e4m3_to_f32(c);
                if (f16) {
                    const uint16_t h = f16_bits(bv[n][k]);
                    b[n * 32 + 2 * k] = (uint8_t)h;
                    b[n * 32 + 2 * k + 1] = (uint8_t)(h >> 8);
                } else {
                    b[n * 32 + k] = c;
                }
            }
#undef WG_CODE
        uint32_t *da;
        uint8_t *db;
        float *dd;
        CK(cudaMalloc((void **)&da, sizeof a));
        CK(cudaMalloc((void **)&db, sizeof b));
        CK(cudaMalloc((void **)&dd, sizeof d));
        CK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
        CK(cudaMemset(dd, 0xFF, sizeof d));
        CK(bcu_wg_probe(f16, da, db, dd));
        CK(cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost));
        cudaFree(da); cudaFree(db); cudaFree(dd);
        double err[2];
        for (int h = 0; h < 2; h++) {
            double ref[64][8], mag[64][8];
            memset(ref, 0, sizeof ref);
            memset(mag, 0, sizeof mag);
            for (int t = 0; t < 128; t++) {
                const int w = t >> 5, g = (t & 31) >> 2, q = t & 3;
                for (int r = 0; r < 4; r++)
                    for (int j = 0; j < per; j++) {
                        const int rowbit = h ? r >> 1 : r & 1, kbit = h ? r & 1 : r >> 1;
                        const int row = 16 * w + g + 8 * rowbit, k = per * q + j + (Kst / 2) * kbit;
                        for (int n = 0; n < 8; n++) {
                            const double p = (double)av[4 * t + r][j] * bv[n][k];
                            ref[row][n] += p;
                            mag[row][n] += fabs(p);
                        }
                    }
            }
            err[h] = 0.0;
            for (int i = 0; i < 64; i++)
                for (int n = 0; n < 8; n++) {
                    const double e = fabs((double)d[i * 8 + n] - ref[i][n]) / mag[i][n];
                    if (!(e <= err[h])) err[h] = isnan(e) ? INFINITY : e;
                }
            printf("  [wgmma] %s, A from registers, reading %d: max |d - ref| / sum |terms| = %.3g"
                   " (d[0][0] %.6g, ref %.6g)\n", f16 ? "m64n8k16 f16 " : "m64n8k32 e4m3", h, err[h], d[0], ref[0][0]);
        }
        if (!(err[0] <= (f16 ? 1e-6 : 1e-3)))
            fail_msg("%s: the A fragment is not the one moe_wg.cu assumes, or the sums are not exact (error %.3g)",
                     f16 ? "f16" : "e4m3", err[0]);
        if (!(err[1] > 1e-2)) fail_msg("the check cannot tell the two readings apart (%.3g)", err[1]);
    }
}

static void test_gpu_refuses_bad_calls(void **st)
{
    (void)st;
    rng_seed_test(__func__); /* this test's data, whichever ran before it */
    experts X;
    experts_make(&X, 4, 64, 64);
    const int64_t T = 5;
    const int topk = 2;
    float *dx, *dy, *dw;
    int32_t *dids;
    void *ws;
    const size_t wsb = bcu_moe_workspace_bytes(T, topk, 4, 64, 64);
    CK(cudaMalloc((void **)&dx, T * 64 * 4));
    CK(cudaMalloc((void **)&dy, T * 64 * 4));
    CK(cudaMalloc((void **)&dw, T * topk * 4));
    CK(cudaMalloc((void **)&dids, T * topk * 4));
    CK(cudaMalloc(&ws, wsb));
    assert_int_equal(bcu_moe_forward(&X.ex, dy, dx, dids, dw, T, topk, BCU_MOE_FP32, BCU_MOE_AUTO, ws, wsb - 1, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(bcu_moe_forward(&X.ex, dy, dx, dids, dw, T, 0, BCU_MOE_FP32, BCU_MOE_AUTO, ws, wsb, 0),
                     cudaErrorInvalidValue);
    assert_int_equal(bcu_moe_forward(&X.ex, dy, dx, dids, dw, T, topk, (bcu_moe_math)7, BCU_MOE_AUTO, ws, wsb, 0),
                     cudaErrorInvalidValue);
    /* the mma rows compute in bf16 planes only */
    assert_int_equal(bcu_moe_forward(&X.ex, dy, dx, dids, dw, T, topk, BCU_MOE_FP32, BCU_MOE_MMAROWS, ws, wsb, 0),
                     cudaErrorInvalidValue);
    bcu_moe_experts odd = X.ex;
    odd.dim = 48;
    assert_int_equal(bcu_moe_forward(&odd, dy, dx, dids, dw, T, topk, BCU_MOE_FP32, BCU_MOE_AUTO, ws, wsb, 0),
                     cudaErrorInvalidValue);
    /* T = 0 is a no-op that touches nothing */
    CK(cudaMemset(dy, 0x7F, T * 64 * 4));
    assert_int_equal(bcu_moe_forward(&X.ex, dy, dx, dids, dw, 0, topk, BCU_MOE_FP32, BCU_MOE_AUTO, ws, wsb, 0),
                     cudaSuccess);
    CK(cudaDeviceSynchronize());
    uint32_t probe;
    CK(cudaMemcpy(&probe, dy, 4, cudaMemcpyDeviceToHost));
    assert_int_equal(probe, 0x7F7F7F7Fu);
    cudaFree(dx); cudaFree(dy); cudaFree(dw); cudaFree(dids); cudaFree(ws);
    experts_free(&X);
}

int main(void)
{
    const char *filter = getenv("TEST_CUDA_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    const char *skip = getenv("TEST_CUDA_SKIP");
    if (skip && *skip) cmocka_set_skip_filter(skip);
    const struct CMUnitTest host[] = {
        cmocka_unit_test(test_route_host_matches_stable_sort),
        cmocka_unit_test(test_layout_limits),
    };
    int rc = cmocka_run_group_tests_name("moe_host", host, NULL, NULL);
    if (rc) return rc;
    if (!cuda_device_present()) return 77;
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_gpu_refuses_bad_calls),
        cmocka_unit_test(test_gpu_route),
        cmocka_unit_test(test_gpu_small),
        cmocka_unit_test(test_gpu_v4dims),
        cmocka_unit_test(test_gpu_act_fp8_h),
        cmocka_unit_test(test_gpu_wg_probe),
        cmocka_unit_test(test_gpu_wgmma_v4dims),
        cmocka_unit_test(test_gpu_wgtiles_scales),
        cmocka_unit_test(test_gpu_wgmma_scales),
        cmocka_unit_test(test_gpu_wgtiles_sizes),
    };
    return cmocka_run_group_tests_name("moe_gpu", gpu, NULL, NULL);
}
