/* sampler.c - bench_sampler: what one sampled token costs on the host, the sampler's fast paths (engine/sampler.c:
 * low-weight tokens skipped under a certified margin, top_k from a heap) against the full computation
 * (eng_sample_set_prune(0)) measured in the same run, and a step's rows over the engine's sampling threads.
 *
 * Rows of V = 129280 logits (DeepSeek V4's vocabulary), synthetic (no trained model here):
 *   flat      uniform in [-4, 4]: nothing is far below the top, the fast path's worst case
 *   body+head a Gaussian body (sd 2.5) under a head of eight tokens 15-22 above its mean (a model unsure between a
 *             few continuations)
 *   confident the same body under one token 35 above it
 * Per (row kind, sampling setting): us a token on each path (median of 5 rounds of 40 draws over 8 rows), the ratio,
 * and whether every draw gave the same token on both paths (the bench exits 1 if not).  Then 64 rows (a decode step
 * of 64 sampled requests) on 1 thread and on the threads the engine would use (eng_cfg.sample_threads = 0: one an
 * online CPU up to 16), fast path, as a ratio.
 *
 *   bench_sampler [--threads N] [--bits B]      (B: the fast path's bound, eng_sample_set_prune)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/pool.h"
#include "engine/sampler.h"
#include "sample_rows.h"

#define V 129280
#define NROW 8
#define NDRAW 40
#define NROUND 5


/* us a draw (median over rounds) on the current path; toks gets every draw's token */
static double time_path(float **rows, const eng_sampling *s, eng_sample_scratch *ws, int *toks)
{
    double t[NROUND];
    for (int r = 0; r < NROUND; r++) {
        uint64_t rng = eng_rng_init(1000 + (uint64_t)r);
        const double t0 = sr_now();
        for (int d = 0; d < NDRAW; d++) toks[r * NDRAW + d] = eng_sample_ws(rows[d % NROW], V, s, &rng, ws);
        t[r] = (sr_now() - t0) / NDRAW * 1e6;
    }
    qsort(t, NROUND, sizeof *t, sr_cmp_d);
    return t[NROUND / 2];
}

typedef struct {
    float **rows;
    const eng_sampling *s;
    eng_sample_scratch *ws;
    int *toks;
    size_t n, nt;
} par_arg;

static void par_task(void *arg, size_t t)
{
    par_arg *a = arg;
    for (size_t r = t; r < a->n; r += a->nt) {
        uint64_t rng = eng_rng_init(77 + r);
        a->toks[r] = eng_sample_ws(a->rows[r % NROW], V, a->s, &rng, &a->ws[t]);
    }
}

int main(int argc, char **argv)
{
    int threads = 0, bits = ENG_SAMPLE_PRUNE_BITS;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bits") && i + 1 < argc) bits = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_sampler [--threads N] [--bits B]\n");
            return 2;
        }
    }
    if (threads <= 0) {
        const long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : c > 16 ? 16 : (int)c;
    }
    static const char *const kinds[3] = {"flat", "body+head", "confident"};
    struct {
        const char *name;
        eng_sampling s;
    } set[] = {
        {"T 1", {.temperature = 1}},
        {"T 1, top_p 0.95", {.temperature = 1, .top_p = 0.95}},
        {"T 0.7, top_p 0.9", {.temperature = 0.7, .top_p = 0.9}},
        {"T 0.6, top_p 0.95", {.temperature = 0.6, .top_p = 0.95}},
        {"T 1, top_k 50", {.temperature = 1, .top_k = 50}},
        {"T 1, min_p 0.05", {.temperature = 1, .min_p = 0.05}},
    };
    const int nset = (int)(sizeof set / sizeof set[0]);
    float *rows[3][NROW];
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < NROW; r++) {
            rows[k][r] = malloc(V * sizeof(float));
            sr_make_row(rows[k][r], V, k, 31 * (uint64_t)k + (uint64_t)r);
        }
    eng_sample_scratch ws = {0};
    int *ta = malloc(NROUND * NDRAW * sizeof *ta), *tb = malloc(NROUND * NDRAW * sizeof *tb);
    int bad = 0;
    if (eng_sample_set_prune(bits)) {
        fprintf(stderr, "bench_sampler: --bits takes 1..60\n");
        return 2;
    }
    printf("bench_sampler: V = %d, %d rows a kind, %d draws a round, median of %d rounds; fast path bits %d\n\n", V,
           NROW, NDRAW, NROUND, bits);
    printf("| rows | sampling | full us | fast us | full / fast | same tokens |\n| --- | --- | ---: | ---: | ---: | --- |\n");
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < nset; c++) {
            eng_sample_set_prune(0);
            const double full = time_path(rows[k], &set[c].s, &ws, ta);
            eng_sample_set_prune(bits);
            const double fast = time_path(rows[k], &set[c].s, &ws, tb);
            const int same = !memcmp(ta, tb, NROUND * NDRAW * sizeof *ta);
            bad |= !same;
            printf("| %s | %s | %.0f | %.0f | %.1f | %s |\n", kinds[k], set[c].name, full, fast, full / fast,
                   same ? "yes" : "NO");
            fflush(stdout);
        }

    /* a decode step's 64 sampled rows on 1 thread and on `threads` (the engine's split: rows t, t + nt, ..) */
    enum { NSTEP = 64 };
    eng_sample_scratch *wss = calloc((size_t)threads, sizeof *wss);
    int *t1 = malloc(NSTEP * sizeof *t1), *tn = malloc(NSTEP * sizeof *tn);
    rc_pool *pool = threads > 1 ? rc_pool_create(threads) : NULL;
    printf("\n| a step of %d sampled rows (body+head) | 1 thread ms | %d threads ms | ratio | same tokens |\n"
           "| --- | ---: | ---: | ---: | --- |\n",
           NSTEP, threads);
    for (int c = 0; c < nset; c += 2) {
        double best1 = 1e9, bestn = 1e9;
        for (int r = 0; r < NROUND; r++) {
            par_arg a1 = {rows[1], &set[c].s, wss, t1, NSTEP, 1};
            double t0 = sr_now();
            par_task(&a1, 0);
            const double d1 = sr_now() - t0;
            par_arg an = {rows[1], &set[c].s, wss, tn, NSTEP, (size_t)threads};
            t0 = sr_now();
            if (pool) rc_pool_run(pool, (size_t)threads, par_task, &an);
            else par_task(&an, 0);
            const double dn = sr_now() - t0;
            best1 = d1 < best1 ? d1 : best1;
            bestn = dn < bestn ? dn : bestn;
        }
        const int same = !memcmp(t1, tn, NSTEP * sizeof *t1);
        bad |= !same;
        printf("| %s | %.2f | %.2f | %.1f | %s |\n", set[c].name, best1 * 1e3, bestn * 1e3, best1 / bestn,
               same ? "yes" : "NO");
    }
    rc_pool_destroy(pool);
    for (int t = 0; t < threads; t++) eng_sample_scratch_free(&wss[t]);
    eng_sample_scratch_free(&ws);
    if (bad) fprintf(stderr, "bench_sampler: the fast path drew another token somewhere\n");
    return bad;
}
