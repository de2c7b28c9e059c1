/* test_cuda_sample.c - sampled tokens drawn on the device (src/backend/cuda/sample.cu) against the host sampler
 * (engine/sampler.c's eng_sample_u01) on the same rows and uniforms.
 *
 * Rows of the real vocabulary (129,280) and of odd small ones: peaked (a trained model's shape), flat, many exact
 * ties, NaN / -inf / +-0 mixed in, all -inf, +inf present; parameters over temperature, top_k (1 to past the
 * kernel's sorted list of 8,192, which takes its long lists' path), top_p (small nuclei sorted, the flat rows' ones
 * past 8,192 on the long lists' path) and min_p, alone and together; uniforms including 0 and the largest below 1.
 * The device must draw every one (it hands none back) and each must be the host's token, except where u01 is within
 * 2^-40 of 1 and the device's token lies in the last 1e-8 of the mass (in_last_mass); such draws are counted and
 * printed.
 *
 * Without a GPU it prints "SKIPPED: no CUDA device" and exits 77 (CTest: skipped). */
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
#include "test_rng.h"

#include "backend/backend.h"
#include "engine/sampler.h"

/* sample.h declares it with a cudaStream_t; the C test calls it on the default stream */
cudaError_t bcu_sample(int32_t *ids, const float *x, size_t V, const be_draw *draws, size_t n, cudaStream_t st);

enum { K_PEAKED, K_SPIKE, K_FLAT, K_TIES, K_SPECIAL, K_ALLNEG, K_POSINF, K_ZEROS, K_N };
static const char *const kind_name[K_N] = {"peaked", "one spike", "flat", "ties", "NaN/-inf", "all -inf", "+inf",
                                           "+-0 max"};

static double gauss(void)
{
    double u = unif01(), v = unif01();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static void make_row(float *r, int V, int kind)
{
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case K_PEAKED: r[i] = (float)(2.0 * gauss()); break;
        case K_SPIKE: r[i] = (float)gauss(); break;
        case K_FLAT: r[i] = (float)(0.3 * gauss()); break;
        case K_TIES: r[i] = (float)((int)(rnd() % 11) - 5); break;
        case K_SPECIAL: {
            const uint64_t z = rnd() % 16;
            r[i] = z == 0 ? NAN : z == 1 ? -INFINITY : (float)(1.5 * gauss());
            break;
        }
        case K_ALLNEG: r[i] = (i % 3) ? -INFINITY : NAN; break;
        case K_POSINF: r[i] = (float)gauss(); break;
        case K_ZEROS: r[i] = (float)(-fabs(gauss()) - 0.5); break;
        }
    }
    if (kind == K_PEAKED)
        for (int j = 0; j < 8; j++) r[rnd() % (uint64_t)V] = 12.0f + (float)j;
    if (kind == K_SPIKE) r[rnd() % (uint64_t)V] = 40.0f;
    if (kind == K_POSINF) r[rnd() % (uint64_t)V] = INFINITY;
    if (kind == K_ZEROS)
        for (int j = 0; j < 6; j++) r[rnd() % (uint64_t)V] = (j & 1) ? -0.0f : 0.0f;
}

typedef struct {
    double t, top_p, min_p;
    int top_k;
} params;

static const params P[] = {
    {1.0, 0, 0, 0},     {0.7, 0, 0, 0},      {1.5, 0, 0, 0},      {1e-3, 0, 0, 0},    {1.0, 0.9, 0, 0},
    {0.7, 0.5, 0, 0},   {1.0, 0.999, 0, 0},  {1.0, 0, 0, 1},      {1.0, 0, 0, 5},     {0.8, 0, 0, 50},
    {1.0, 0, 0, 9000},  {1.0, 0.9, 0, 40},   {0.6, 0.8, 0.05, 0}, {1.0, 0, 0.05, 0},  {1.0, 0, 0.2, 20},
    {1.0, 1.0, 0, 0},   {1.0, 0.95, 0, 3000}, {2.0, 0.3, 0, 0},   {1.0, 0, 0, 100000},
};
#define NP ((int)(sizeof P / sizeof P[0]))
#define NU 6

/* Whether token g lies in the last 1e-8 of the candidates' mass in the draw's order (logit descending, id ascending
 * where top_k or top_p sort; id order for the plain draw).  A uniform within 2^-40 of 1 lands there, where the
 * device's sums (chunk sums, and the long lists' 2^-44 fixed point, which rounds a tail of weights below 2^-45 to
 * nothing) and the host's running sums (which absorb such a tail into a spike's weight) may each pick a different
 * token: that is the one case where test_draws_match_host lets them differ. */
static int in_last_mass(const float *r, int V, const params *pp, int g)
{
    float lmax = -INFINITY;
    for (int i = 0; i < V; i++)
        if (!isnan(r[i]) && r[i] > lmax) lmax = r[i];
    long double total = 0, after = 0;
    int n = 0;
    for (int i = 0; i < V; i++) {
        const double w = isnan(r[i]) ? 0 : exp(((double)r[i] - (double)lmax) / pp->t);
        if (!(w > 0 && w >= pp->min_p)) continue;
        n++;
        total += w;
    }
    const int sorted = (pp->top_k > 0 && pp->top_k < n) || (pp->top_p > 0 && pp->top_p < 1);
    for (int i = 0; i < V; i++) {
        const double w = isnan(r[i]) ? 0 : exp(((double)r[i] - (double)lmax) / pp->t);
        if (!(w > 0 && w >= pp->min_p)) continue;
        if (sorted ? r[i] < r[g] || (r[i] == r[g] && i > g) : i > g) after += w;
    }
    return after <= 1e-8L * total;
}

/* one vocabulary: every kind of row, every parameter set, NU uniforms; returns the draws the device took */
static void run_vocab(int V)
{
    float *rows = malloc((size_t)K_N * (size_t)V * sizeof(float));
    assert_non_null(rows);
    for (int k = 0; k < K_N; k++) make_row(rows + (size_t)k * V, V, k);
    const size_t n = (size_t)K_N * NP * NU;
    be_draw *d = calloc(n, sizeof *d);
    int32_t *got = malloc(n * sizeof *got);
    assert_true(d && got);
    size_t j = 0;
    for (int k = 0; k < K_N; k++)
        for (int p = 0; p < NP; p++)
            for (int u = 0; u < NU; u++, j++) {
                const double u01 = u == 0 ? 0.0 : u == 1 ? 1.0 - 0x1.0p-53 : unif01();
                d[j] = (be_draw){.row = (uint32_t)k, .top_k = P[p].top_k, .inv_t = 1.0 / P[p].t, .top_p = P[p].top_p,
                                 .min_p = P[p].min_p, .u01 = u01};
            }
    float *dx = NULL;
    be_draw *dd = NULL;
    int32_t *did = NULL;
    assert_int_equal(cudaMalloc((void **)&dx, (size_t)K_N * V * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dd, n * sizeof *dd), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&did, n * sizeof *did), cudaSuccess);
    assert_int_equal(cudaMemcpy(dx, rows, (size_t)K_N * V * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dd, d, n * sizeof *dd, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(bcu_sample(did, dx, (size_t)V, dd, n, 0), cudaSuccess);
    assert_int_equal(cudaMemcpy(got, did, n * sizeof *got, cudaMemcpyDeviceToHost), cudaSuccess);

    eng_sample_scratch ws = {0};
    size_t drawn[K_N] = {0}, bad = 0, tail = 0;
    for (j = 0; j < n; j++) {
        const int k = (int)d[j].row, p = (int)(j / NU) % NP;
        const eng_sampling sp = {.temperature = P[p].t, .top_p = P[p].top_p, .top_k = P[p].top_k,
                                 .min_p = P[p].min_p};
        const int want = eng_sample_u01(rows + (size_t)k * V, V, &sp, d[j].u01, &ws);
        assert_true(want >= 0);
        drawn[k] += got[j] >= 0;
        if (got[j] != want && got[j] >= 0 && d[j].u01 >= 1 - 0x1.0p-40 && in_last_mass(rows + (size_t)k * V, V,
                                                                                         &P[p], got[j])) {
            tail++;
            continue;
        }
        if (got[j] != want) {
            print_error("V %d %s, T %g top_p %g top_k %d min_p %g u %.17g: device %d, host %d\n", V, kind_name[k],
                        P[p].t, P[p].top_p, P[p].top_k, P[p].min_p, d[j].u01, got[j], want);
            bad++;
        }
    }
    for (int k = 0; k < K_N; k++)
        printf("  V %6d %-9s: %3zu of %d draws on the device, each the host's token\n", V, kind_name[k], drawn[k],
               NP * NU);
    printf("  V %6d: %zu draws at u01 = 1 - 2^-53 took another token than the host's, in the last 1e-8 of the mass\n",
           V, tail);
    assert_int_equal(bad, 0);
    eng_sample_scratch_free(&ws);
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(did);
    free(rows);
    free(d);
    free(got);
}

static void test_draws_match_host(void **st)
{
    (void)st;
    rng_seed_test(__func__);
    run_vocab(129280);
    run_vocab(1001);
    run_vocab(37);
}

/* a draw's token does not depend on the other draws of its launch: each alone gives the same as all together */
static void test_draws_alone(void **st)
{
    (void)st;
    rng_seed_test(__func__);
    const int V = 50000, R = 24;
    float *rows = malloc((size_t)R * V * sizeof(float));
    be_draw d[R];
    int32_t all[R], one;
    for (int r = 0; r < R; r++) {
        make_row(rows + (size_t)r * V, V, r % 2 ? K_PEAKED : K_FLAT);
        d[r] = (be_draw){.row = (uint32_t)r, .top_k = r % 3 ? 0 : 30, .inv_t = 1.0, .top_p = r % 4 ? 0.9 : 0,
                         .min_p = 0, .u01 = unif01()};
    }
    float *dx;
    be_draw *dd;
    int32_t *did;
    assert_int_equal(cudaMalloc((void **)&dx, (size_t)R * V * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dd, sizeof d), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&did, sizeof all), cudaSuccess);
    assert_int_equal(cudaMemcpy(dx, rows, (size_t)R * V * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dd, d, sizeof d, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(bcu_sample(did, dx, (size_t)V, dd, R, 0), cudaSuccess);
    assert_int_equal(cudaMemcpy(all, did, sizeof all, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int r = 0; r < R; r++) {
        assert_int_equal(bcu_sample(did, dx, (size_t)V, dd + r, 1, 0), cudaSuccess);
        assert_int_equal(cudaMemcpy(&one, did, sizeof one, cudaMemcpyDeviceToHost), cudaSuccess);
        assert_int_equal(one, all[r]);
    }
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(did);
    free(rows);
}

int main(void)
{
    if (!cuda_device_present()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draws_match_host),
        cmocka_unit_test(test_draws_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
