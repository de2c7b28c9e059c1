/* test_engine.c - the sampler, and the engine loop over a fake backend and
 * over the tiny real model.
 *
 *   sampler   greedy ties, top_k=1 == greedy, seeds, empirical frequencies,
 *             what top_k / top_p / min_p exclude (and in which order)
 *   fake      a backend whose logits are a function of the position, so the
 *             schedule (chunks, logits requests), EOS, errors, the queue
 *             bound, cancellation and shutdown can be asserted exactly
 *   model     tiny-mixed: a request alone == the same request among 63
 *             others (greedy and seeded sampling), cancellation, max_tokens,
 *             stop_ids, state bytes
 *
 * DEEPINFER_TEST_SMALL=1 (or an ASan build) shrinks the 64-way test's prompts
 * and outputs; the claims stay the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/v4.h"

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif
#ifndef ASAN_BUILD
#define ASAN_BUILD 0
#endif

static int small_mode(void)
{
    const char *s = getenv("DEEPINFER_TEST_SMALL");
    return ASAN_BUILD || (s && *s && strcmp(s, "0"));
}

/* ================================================================ sampler */

static eng_sampling samp(double t) { return (eng_sampling){.temperature = t, .top_p = 1, .max_tokens = 1}; }

static void test_greedy_ties(void **st)
{
    (void)st;
    const float l[] = {1, 5, 5, 3};
    eng_sampling s = samp(0);
    uint64_t rng = 9, rng0 = rng;
    assert_int_equal(eng_sample(l, 4, &s, &rng), 1);
    assert_true(rng == rng0); /* greedy draws nothing */
    const float n[] = {NAN, 2, 2, -INFINITY};
    assert_int_equal(eng_sample(n, 4, &s, &rng), 1);
    const float infs[] = {0, INFINITY, 7, INFINITY, NAN}, nans[] = {NAN, NAN, NAN};
    assert_int_equal(eng_sample(infs, 5, &s, &rng), 1);
    assert_int_equal(eng_sample(nans, 3, &s, &rng), 0);
    const float mixed[] = {-INFINITY, -INFINITY, NAN, -INFINITY, NAN}, zeros[] = {-0.0f, 0.0f, -1, -2, -3};
    assert_int_equal(eng_sample(mixed, 5, &s, &rng), 0);
    assert_int_equal(eng_sample(zeros, 5, &s, &rng), 0); /* +0 does not beat -0 */
    const float all_neg[] = {-INFINITY, -INFINITY};
    s.temperature = 1;
    assert_int_equal(eng_sample(all_neg, 2, &s, &rng), 0);
    assert_int_equal(eng_sample(l, 0, &s, &rng), RC_EINVAL);
}

static void fill_logits(float *l, int V, uint64_t seed)
{
    for (int i = 0; i < V; i++) l[i] = (float)((double)(eng_rng_next(&seed) >> 11) * 0x1.0p-53 * 8.0 - 4.0);
}

static void test_top_k1_is_greedy(void **st)
{
    (void)st;
    enum { V = 1000 };
    float l[V];
    eng_sample_scratch ws = {0};
    const double temps[] = {0.3, 1, 2, 50};
    for (int row = 0; row < 50; row++) {
        fill_logits(l, V, (uint64_t)row + 1);
        if (row % 5 == 0) l[row * 7] = l[row * 7 + 3] = 9; /* a tie at the top */
        eng_sampling g = samp(0);
        uint64_t r0 = 1;
        int want = eng_sample(l, V, &g, &r0);
        for (size_t t = 0; t < 4; t++) {
            eng_sampling s = samp(temps[t]);
            s.top_k = 1;
            uint64_t rng = (uint64_t)row * 31 + t;
            assert_int_equal(eng_sample_ws(l, V, &s, &rng, &ws), want);
        }
    }
    eng_sample_scratch_free(&ws);
}

static void test_seed_determinism(void **st)
{
    (void)st;
    enum { V = 300 };
    float l[V];
    fill_logits(l, V, 77);
    eng_sampling s = samp(1.3);
    s.top_p = 0.95;
    uint64_t a = eng_rng_init(42), b = eng_rng_init(42), c = eng_rng_init(43);
    int differ = 0;
    for (int i = 0; i < 500; i++) {
        int x = eng_sample(l, V, &s, &a), y = eng_sample(l, V, &s, &b), z = eng_sample(l, V, &s, &c);
        assert_int_equal(x, y);
        differ += x != z;
    }
    assert_true(differ > 100);
}

/* frequencies of 20000 draws against want (within 0.015, > 4 sigma) */
static void expect_freq(const double *logp_src, int V, const eng_sampling *s, const double *want, uint64_t seed)
{
    float l[16];
    for (int i = 0; i < V; i++) l[i] = (float)log(logp_src[i]);
    int cnt[16] = {0};
    uint64_t rng = eng_rng_init(seed);
    const int N = 20000;
    for (int k = 0; k < N; k++) cnt[eng_sample(l, V, s, &rng)]++;
    for (int i = 0; i < V; i++) {
        double f = (double)cnt[i] / N;
        if (want[i] == 0) {
            if (cnt[i]) fail_msg("token %d should be filtered out, drawn %d times", i, cnt[i]);
        } else if (fabs(f - want[i]) > 0.015) {
            fail_msg("token %d: frequency %.4f, expected %.4f", i, f, want[i]);
        }
    }
}

static void test_empirical(void **st)
{
    (void)st;
    const double p[4] = {0.1, 0.2, 0.3, 0.4};
    eng_sampling s = samp(1);
    expect_freq(p, 4, &s, p, 1);
    /* temperature 2: p^(1/2), renormalised */
    double w[4], z = 0;
    for (int i = 0; i < 4; i++) z += (w[i] = sqrt(p[i]));
    for (int i = 0; i < 4; i++) w[i] /= z;
    s.temperature = 2;
    expect_freq(p, 4, &s, w, 3);
    /* top_k 3: the top three, renormalised */
    s = samp(1);
    s.top_k = 3;
    const double k3[4] = {0, 0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9};
    expect_freq(p, 4, &s, k3, 4);
}

static void test_filters_exclude(void **st)
{
    (void)st;
    const double p[4] = {0.5, 0.3, 0.15, 0.05};
    eng_sampling s = samp(1);
    /* top_p: 0.5 + 0.3 reaches 0.75, so {0, 1} */
    s.top_p = 0.75;
    const double tp[4] = {0.5 / 0.8, 0.3 / 0.8, 0, 0};
    expect_freq(p, 4, &s, tp, 5);
    /* top_p below the top probability keeps exactly one */
    s.top_p = 0.01;
    const double one[4] = {1, 0, 0, 0};
    expect_freq(p, 4, &s, one, 6);
    /* min_p 0.25 of the max: p/pmax = 1, .6, .3, .1 -> {0, 1, 2} */
    s = samp(1);
    s.min_p = 0.25;
    const double mp[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
    expect_freq(p, 4, &s, mp, 7);
    /* the order: min_p (renormalise) before top_p, as vLLM v1.  {.4 .3 .2 .1}
     * with min_p .3 keeps {0,1,2} -> {.444 .333 .222}; top_p .75 then keeps
     * {0,1}.  top_p first (vLLM v0) would have kept token 2. */
    const double q[4] = {0.4, 0.3, 0.2, 0.1};
    s = samp(1);
    s.min_p = 0.3;
    s.top_p = 0.75;
    const double order[4] = {4.0 / 7, 3.0 / 7, 0, 0};
    expect_freq(q, 4, &s, order, 8);
}

/* top_k by partial selection keeps exactly the k best (ties to the lowest id) */
static void test_top_k_set(void **st)
{
    (void)st;
    enum { V = 5000, K = 50 };
    static float l[V];
    fill_logits(l, V, 5);
    for (int i = 100; i < 110; i++) l[i] = 3.99f; /* a tie band straddling the cut */
    /* rank by (logit desc, id asc), naive */
    static int rank_ok[V];
    for (int i = 0; i < V; i++) {
        int better = 0;
        for (int j = 0; j < V; j++) better += l[j] > l[i] || (l[j] == l[i] && j < i);
        rank_ok[i] = better < K;
    }
    eng_sampling s = samp(1000); /* nearly uniform over the survivors */
    s.top_k = K;
    uint64_t rng = 3;
    eng_sample_scratch ws = {0};
    static int seen[V];
    int distinct = 0;
    for (int k = 0; k < 4000; k++) {
        int id = eng_sample_ws(l, V, &s, &rng, &ws);
        if (!rank_ok[id]) fail_msg("drew %d, outside the top %d", id, K);
        if (!seen[id]++) distinct++;
    }
    assert_int_equal(distinct, K);
    /* with top_p as well: still inside the top k */
    s.top_p = 0.5;
    for (int k = 0; k < 1000; k++) assert_true(rank_ok[eng_sample_ws(l, V, &s, &rng, &ws)]);
    eng_sample_scratch_free(&ws);
}

/* top_p without top_k sorts only a bound on the nucleus; a naive full sort
 * must give the same token for the same random number, row after row. */
typedef struct { double w; float l; int id; } ref_cand;
static int ref_cmp(const void *pa, const void *pb)
{
    const ref_cand *a = pa, *b = pb;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int ref_top_p(const float *l, int V, double T, double top_p, double min_p, uint64_t *rng, ref_cand *c)
{
    int amax = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[amax]) amax = i;
    double u01 = (double)(eng_rng_next(rng) >> 11) * 0x1.0p-53;
    size_t n = 0;
    for (int i = 0; i < V; i++) {
        double w = exp(((double)l[i] - (double)l[amax]) * (1.0 / T));
        if (w > 0 && w >= min_p) c[n++] = (ref_cand){w, l[i], i};
    }
    double total = 0;
    for (size_t i = 0; i < n; i++) total += c[i].w;
    qsort(c, n, sizeof *c, ref_cmp);
    size_t keep = 0;
    double cum = 0;
    while (keep < n) {
        cum += c[keep++].w;
        if (cum >= top_p * total) break;
    }
    double kt = 0;
    for (size_t i = 0; i < keep; i++) kt += c[i].w;
    double u = u01 * kt;
    cum = 0;
    for (size_t i = 0; i < keep; i++) {
        cum += c[i].w;
        if (u < cum) return c[i].id;
    }
    return c[keep - 1].id;
}

static void test_top_p_matches_full_sort(void **st)
{
    (void)st;
    enum { V = 4000 };
    static float l[V];
    static ref_cand rc[V];
    eng_sample_scratch ws = {0};
    const double tps[] = {0.3, 0.9, 0.95, 0.999}, temps[] = {0.4, 1, 1.7}, mps[] = {0, 0.02};
    for (int row = 0; row < 24; row++) {
        fill_logits(l, V, 100 + (uint64_t)row);
        /* peaked rows like a real model's, flat ones, and ties */
        if (row % 3 == 1)
            for (int i = 0; i < V; i++) l[i] = l[i] * 4 + (i % 97 == 0 ? 12.0f : 0.0f);
        if (row % 4 == 2)
            for (int i = 0; i < V; i += 5) l[i] = 1.5f;
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 3; b++)
                for (size_t m = 0; m < 2; m++) {
                    eng_sampling s = samp(temps[b]);
                    s.top_p = tps[a];
                    s.min_p = mps[m];
                    uint64_t r1 = (uint64_t)row * 1000 + a * 100 + b * 10 + m, r2 = r1;
                    for (int k = 0; k < 3; k++) {
                        int x = eng_sample_ws(l, V, &s, &r1, &ws), y = ref_top_p(l, V, temps[b], tps[a], mps[m], &r2, rc);
                        if (x != y) fail_msg("row %d top_p %g T %g min_p %g: %d vs reference %d", row, tps[a], temps[b], mps[m], x, y);
                    }
                }
    }
    eng_sample_scratch_free(&ws);
}

/* A nucleus of most of a large vocabulary (flat rows, high temperature): the sampler sorts it with a radix sort past
 * a few thousand candidates; the same tokens as the reference's qsort, with ties, -0 against +0 and -inf among the
 * logits, on both the fast path and the full computation. */
static void test_top_p_large_nucleus(void **st)
{
    (void)st;
    enum { V = 30000 };
    static float l[V];
    static ref_cand rc[V];
    eng_sample_scratch ws = {0};
    const double tps[] = {0.95, 0.999}, temps[] = {1, 1.7};
    for (int row = 0; row < 6; row++) {
        fill_logits(l, V, 500 + (uint64_t)row);
        if (row % 2) /* ties: a quarter of the row on a few values, zeros of both signs, some -inf */
            for (int i = 0; i < V; i += 4) l[i] = (i % 3 == 0) ? 0.0f : (i % 3 == 1) ? -0.0f : 1.25f;
        if (row == 5)
            for (int i = 1; i < V; i += 50) l[i] = -INFINITY;
        for (size_t a = 0; a < 2; a++)
            for (size_t b = 0; b < 2; b++)
                for (int bits = 0; bits <= 24; bits += 24) {
                    eng_sampling s = samp(temps[b]);
                    s.top_p = tps[a];
                    uint64_t r1 = (uint64_t)row * 100 + a * 10 + b, r2 = r1;
                    assert_int_equal(eng_sample_set_prune(bits), 0);
                    for (int k = 0; k < 3; k++) {
                        const int x = eng_sample_ws(l, V, &s, &r1, &ws), y = ref_top_p(l, V, temps[b], tps[a], 0, &r2, rc);
                        if (x != y) fail_msg("row %d top_p %g T %g bits %d: %d vs reference %d", row, tps[a], temps[b], bits, x, y);
                    }
                }
    }
    assert_int_equal(eng_sample_set_prune(ENG_SAMPLE_PRUNE_BITS), 0);
    eng_sample_scratch_free(&ws);
}

/* The fast paths (the skipped low-weight tokens with certified margins, top_k from a heap) against the full
 * computation (eng_sample_set_prune(0)): the same token for the same random number, over rows that make the
 * margins bite.  Bounds 2 and 6 bits skip far more than the default 24 (tau = 2^-bits / V), so many draws sit
 * inside a margin and must fall back; the counters show both paths ran. */
static void fast_row(float *l, int V, int kind, uint64_t seed)
{
    fill_logits(l, V, seed);
    for (int i = 0; i < V; i++) {
        const double g = (double)(eng_rng_next(&seed) >> 11) * 0x1.0p-53;
        switch (kind) {
        case 0: break;                                             /* flat, 8 nats wide */
        case 1: l[i] = l[i] * 6.0f + (i % 211 == 0 ? 25.0f : 0.0f); break; /* a peaked head over a wide tail */
        case 2: l[i] = (float)(-60.0 * g); if (i == 17) l[i] = 0.0f; break; /* one token, a tail down to -60 */
        case 3: l[i] = (i % 3 == 0) ? 2.0f : (float)(-30.0 * g); break; /* ties on top */
        case 4: l[i] = (float)(-40.0 * g * g); if (i % 97 == 5) l[i] = NAN; if (i % 89 == 7) l[i] = -INFINITY; break;
        }
    }
}

static void test_fast_path_matches_full(void **st)
{
    (void)st;
    enum { V = 3000 };
    static float l[V];
    eng_sample_scratch ws = {0};
    const double temps[] = {0.25, 0.7, 1, 1.9}, tps[] = {1, 0.5, 0.9, 0.999}, mps[] = {0, 1e-12, 0.02};
    const int tks[] = {0, 1, 20, V - 1, V, 2 * V};
    const int bits[] = {24, 6, 2};
    uint64_t f0, u0;
    eng_sample_counts(&f0, &u0);
    long draws = 0;
    for (int row = 0; row < 20; row++) {
        fast_row(l, V, row % 5, 900 + (uint64_t)row);
        for (size_t a = 0; a < 4; a++)
            for (size_t b = 0; b < 4; b++)
                for (size_t m = 0; m < 3; m++)
                    for (size_t k = 0; k < 6; k++)
                        for (size_t bi = 0; bi < 3; bi++) {
                            if ((a + b + m + k + bi + (size_t)row) % 3) continue; /* a third of the grid a row */
                            eng_sampling s = samp(temps[a]);
                            s.top_p = tps[b];
                            s.min_p = mps[m];
                            s.top_k = tks[k];
                            uint64_t r1 = (uint64_t)row * 7919 + a * 1000 + b * 100 + m * 10 + k, r2 = r1;
                            for (int d = 0; d < 4; d++) {
                                assert_int_equal(eng_sample_set_prune(bits[bi]), 0);
                                const int x = eng_sample_ws(l, V, &s, &r1, &ws);
                                assert_int_equal(eng_sample_set_prune(0), 0);
                                const int y = eng_sample_ws(l, V, &s, &r2, &ws);
                                if (x != y)
                                    fail_msg("row %d (kind %d) T %g top_p %g min_p %g top_k %d bits %d: fast %d, full %d", row,
                                             row % 5, temps[a], tps[b], mps[m], tks[k], bits[bi], x, y);
                                draws++;
                            }
                        }
    }
    assert_int_equal(eng_sample_set_prune(ENG_SAMPLE_PRUNE_BITS), 0);
    uint64_t f1, u1;
    eng_sample_counts(&f1, &u1);
    /* every draw ran once on each setting: the full ones are the prune(0) half plus the fallbacks */
    const uint64_t fast = f1 - f0, fallback = u1 - u0 - (uint64_t)draws;
    printf("  sampler fast path: %ld draws, %llu certified, %llu fell back\n", draws, (unsigned long long)fast,
           (unsigned long long)fallback);
    assert_int_equal(fast + fallback, (uint64_t)draws);
    assert_true(fast > (uint64_t)draws / 2);
    assert_true(fallback > 50);
    eng_sample_scratch_free(&ws);
}

/* ================================================================ jobs */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

#define MAXTOK 512

typedef struct job {
    eng_request req;
    int32_t *prompt;
    int32_t toks[MAXTOK];
    size_t n_toks;
    int done;
    eng_reason why;
    size_t completion;
    char err[256];
    /* optional: a job to submit from on_done (chaining) */
    engine *chain_e;
    struct job *chain;
} job;

static void on_token(void *ctx, int32_t id)
{
    job *j = ctx;
    pthread_mutex_lock(&g_mu);
    if (j->n_toks < MAXTOK) j->toks[j->n_toks] = id;
    j->n_toks++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void on_done(void *ctx, eng_reason why, size_t completion, const char *error)
{
    job *j = ctx;
    if (j->chain) {
        rc_err err = {0};
        assert_int_equal(eng_submit(j->chain_e, &j->chain->req, &err), 0);
    }
    pthread_mutex_lock(&g_mu);
    assert_int_equal(j->done, 0); /* exactly one on_done */
    j->done = 1;
    j->why = why;
    j->completion = completion;
    snprintf(j->err, sizeof j->err, "%s", error ? error : "");
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void job_init(job *j, const int32_t *prompt, size_t n, eng_sampling s)
{
    memset(j, 0, sizeof *j);
    j->prompt = malloc(n ? n * sizeof *j->prompt : 1);
    if (n) memcpy(j->prompt, prompt, n * sizeof *prompt);
    j->req = (eng_request){.prompt = j->prompt, .n_prompt = n, .sampling = s, .ctx = j, .on_token = on_token,
                           .on_done = on_done};
}

static void job_fini(job *j) { free(j->prompt); j->prompt = NULL; }

static struct timespec deadline_in(int sec)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += sec;
    return ts;
}

/* wait until the predicate holds, up to 60 s */
#define WAIT_UNTIL(cond)                                                            \
    do {                                                                            \
        struct timespec dl_ = deadline_in(600); /* generous: ASan on a loaded 2-core CI box */                                      \
        pthread_mutex_lock(&g_mu);                                                  \
        while (!(cond))                                                             \
            if (pthread_cond_timedwait(&g_cv, &g_mu, &dl_)) {                       \
                pthread_mutex_unlock(&g_mu);                                        \
                fail_msg("timed out waiting for: %s", #cond);                       \
            }                                                                       \
        pthread_mutex_unlock(&g_mu);                                                \
    } while (0)

static int all_done(job *js, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!js[i].done) return 0;
    return 1;
}


/* ================================================================ fake backend */

/* Logits: one winner per position.  After a sequence holds len tokens the
 * winner is eos when len >= eos_at (eos_at > 0), else 2 + len % 20.  Each
 * forward is logged; `hold` parks the forward until released. */
typedef struct {
    int len;
} fseq;

#define FLOG 64
typedef struct {
    int vocab, eos_id, eos_at;
    int fail_at;             /* forward number k + 1 fails; 0 = none */
    atomic_int live_seqs;
    int n_forward;
    size_t log_items[FLOG], log_tokens[FLOG], log_logits[FLOG];
    size_t log_n0[FLOG];  /* n of the first item */
    int hold, in_forward;
    int park_at;             /* forward number park_at (1-based) sets hold itself: parks until released */
    int sleep_us;
} fake;

static void *f_seq_new(void *impl)
{
    fake *f = impl;
    atomic_fetch_add(&f->live_seqs, 1);
    return calloc(1, sizeof(fseq));
}

static void f_seq_free(void *impl, void *seq)
{
    fake *f = impl;
    atomic_fetch_sub(&f->live_seqs, 1);
    free(seq);
}

static size_t f_bytes(void *impl, void *seq) { return (size_t)((fseq *)seq)->len * 4 + 100; }

static int f_forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                     rc_err *err)
{
    fake *f = impl;
    pthread_mutex_lock(&g_mu);
    f->in_forward++;
    if (f->park_at && f->in_forward == f->park_at) f->hold = 1;
    pthread_cond_broadcast(&g_cv);
    while (f->hold) pthread_cond_wait(&g_cv, &g_mu);
    int k = f->n_forward++;
    pthread_mutex_unlock(&g_mu);
    if (f->sleep_us) usleep((useconds_t)f->sleep_us);
    if (f->fail_at == k + 1) return rc_errf(err, RC_EIO, "fake device lost");
    size_t tokens = 0, nl = 0;
    for (size_t i = 0; i < count; i++) {
        fseq *s = seqs[i];
        for (size_t t = 0; t < n[i]; t++) assert_true(ids[i][t] >= 0 && ids[i][t] < f->vocab);
        s->len += (int)n[i];
        tokens += n[i];
        if (logits[i]) {
            nl++;
            int win = f->eos_at > 0 && s->len >= f->eos_at ? f->eos_id : 2 + s->len % 20;
            for (int v = 0; v < f->vocab; v++) logits[i][v] = v == win ? 10.0f : 0.0f;
        }
    }
    if (k < FLOG) {
        f->log_items[k] = count;
        f->log_tokens[k] = tokens;
        f->log_logits[k] = nl;
        f->log_n0[k] = count ? n[0] : 0;
    }
    return 0;
}

static eng_backend fake_backend(fake *f)
{
    f->vocab = 32;
    f->eos_id = 1;
    return (eng_backend){.vocab = 32, .eos_id = 1, .max_context = 256, .impl = f, .seq_new = f_seq_new,
                         .seq_free = f_seq_free, .forward = f_forward};
}

static engine *fake_engine(fake *f, int mbt, int mr, int mw)
{
    eng_backend be = fake_backend(f);
    eng_cfg cfg = {.max_batch_tokens = mbt, .max_running = mr, .max_waiting = mw};
    rc_err err = {0};
    engine *e = eng_create(&be, &cfg, &err);
    if (!e) fail_msg("eng_create: %s", err.msg);
    return e;
}

static eng_sampling greedy_n(int n)
{
    eng_sampling s = samp(0);
    s.max_tokens = n;
    return s;
}

static void release(fake *f)
{
    pthread_mutex_lock(&g_mu);
    f->hold = 0;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Park the loop inside forward 0 on a 1-token, 1-output request, so that the
 * next requests are all waiting together when step 1 is planned. */
static void park(engine *e, fake *f, job *blocker)
{
    static const int32_t one = 3;
    job_init(blocker, &one, 1, greedy_n(1));
    rc_err err = {0};
    f->hold = 1;
    assert_int_equal(eng_submit(e, &blocker->req, &err), 0);
    WAIT_UNTIL(f->in_forward == 1);
}

static void test_fake_chunking(void **st)
{
    (void)st;
    fake f = {0};
    engine *e = fake_engine(&f, 8, 0, 0);
    eng_set_state_bytes_fn(e, f_bytes);
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = 3 + i;
    job j;
    job_init(&j, p, 20, greedy_n(3));
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &j.req, &err), 0);
    WAIT_UNTIL(j.done);
    assert_int_equal(j.why, ENG_STOP_LENGTH);
    assert_int_equal(j.completion, 3);
    assert_int_equal(j.n_toks, 3);
    /* 20 prompt tokens in chunks 8, 8, 4; only the last asks for logits; then 2 decodes */
    assert_int_equal(f.n_forward, 5);
    const size_t n0[5] = {8, 8, 4, 1, 1}, nl[5] = {0, 0, 1, 1, 1};
    for (int k = 0; k < 5; k++) {
        assert_int_equal(f.log_items[k], 1);
        assert_int_equal(f.log_n0[k], n0[k]);
        assert_int_equal(f.log_logits[k], nl[k]);
    }
    /* winners after 20, 21, 22 tokens */
    assert_int_equal(j.toks[0], 2 + 20 % 20);
    assert_int_equal(j.toks[1], 2 + 21 % 20);
    assert_int_equal(j.toks[2], 2 + 22 % 20);
    assert_true(j.req.t_submit > 0 && j.req.t_first_token >= j.req.t_submit && j.req.t_done >= j.req.t_first_token);
    eng_stats s;
    eng_get_stats(e, &s);
    assert_int_equal(s.steps, 5);
    assert_int_equal(s.prompt_tokens, 20);
    assert_int_equal(s.completion_tokens, 3);
    assert_int_equal(s.running, 0);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.state_bytes, 0);
    eng_destroy(e);
    assert_int_equal(atomic_load(&f.live_seqs), 0);
    job_fini(&j);
}

/* Two requests share the budget: decodes first, prefill takes the rest. */
static void test_fake_budget_shared(void **st)
{
    (void)st;
    fake f = {0};
    engine *e = fake_engine(&f, 8, 4, 0);
    int32_t p[20];
    for (int i = 0; i < 20; i++) p[i] = 3 + i;
    job blk, a, b;
    park(e, &f, &blk);
    job_init(&a, p, 3, greedy_n(6));
    job_init(&b, p, 20, greedy_n(2));
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &a.req, &err), 0);
    assert_int_equal(eng_submit(e, &b.req, &err), 0);
    release(&f);
    WAIT_UNTIL(blk.done && a.done && b.done);
    /* 0: the blocker's token.  1: a's 3 (complete) + b's first 5.  2, 3: a's
     * decode + 7 of b.  4: a + b's last 1 (complete).  5: a + b.  6: a. */
    const size_t tokens[7] = {1, 8, 8, 8, 2, 2, 1}, items[7] = {1, 2, 2, 2, 2, 2, 1}, nl[7] = {1, 1, 1, 1, 2, 2, 1};
    assert_int_equal(f.n_forward, 7);
    for (int k = 0; k < 7; k++) {
        assert_int_equal(f.log_tokens[k], tokens[k]);
        assert_int_equal(f.log_items[k], items[k]);
        assert_int_equal(f.log_logits[k], nl[k]);
    }
    assert_int_equal(a.n_toks, 6);
    assert_int_equal(b.n_toks, 2);
    eng_destroy(e);
    job_fini(&blk);
    job_fini(&a);
    job_fini(&b);
}

static void test_fake_eos(void **st)
{
    (void)st;
    fake f = {.eos_at = 7};
    engine *e = fake_engine(&f, 64, 0, 0);
    int32_t p[4] = {5, 6, 7, 8};
    job j, k, m;
    job_init(&j, p, 4, greedy_n(50));
    eng_sampling ig = greedy_n(5);
    ig.ignore_eos = 1;
    job_init(&k, p, 4, ig);
    eng_sampling sid = greedy_n(50);
    sid.ignore_eos = 1;
    int32_t stop_eos = 1;
    sid.stop_ids = &stop_eos;
    sid.n_stop_ids = 1;
    job_init(&m, p, 4, sid);
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &j.req, &err), 0);
    assert_int_equal(eng_submit(e, &k.req, &err), 0);
    assert_int_equal(eng_submit(e, &m.req, &err), 0);
    WAIT_UNTIL(j.done && k.done && m.done);
    /* sampled after 4, 5, 6 tokens; EOS after 7: not reported, counted */
    assert_int_equal(j.why, ENG_STOP_EOS);
    assert_int_equal(j.n_toks, 3);
    assert_int_equal(j.completion, 4);
    for (size_t i = 0; i < j.n_toks; i++) assert_int_not_equal(j.toks[i], 1);
    /* ignore_eos: EOS is an ordinary token */
    assert_int_equal(k.why, ENG_STOP_LENGTH);
    assert_int_equal(k.n_toks, 5);
    assert_int_equal(k.toks[3], 1);
    /* ... and a stop id when listed (reported, then ENG_STOP_ID) */
    assert_int_equal(m.why, ENG_STOP_ID);
    assert_int_equal(m.n_toks, 4);
    assert_int_equal(m.toks[3], 1);
    eng_destroy(e);
    job_fini(&j);
    job_fini(&k);
    job_fini(&m);
}

static void test_fake_forward_error(void **st)
{
    (void)st;
    fake f = {.fail_at = 2};
    engine *e = fake_engine(&f, 64, 0, 0);
    int32_t p[5] = {3, 4, 5, 6, 7};
    job blk, a, b, c;
    park(e, &f, &blk);
    job_init(&a, p, 5, greedy_n(4));
    job_init(&b, p, 3, greedy_n(4));
    job_init(&c, p, 2, greedy_n(4));
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &a.req, &err), 0);
    assert_int_equal(eng_submit(e, &b.req, &err), 0);
    release(&f);
    WAIT_UNTIL(blk.done && a.done && b.done);
    assert_int_equal(blk.why, ENG_STOP_LENGTH);
    assert_int_equal(a.why, ENG_ERROR);
    assert_int_equal(b.why, ENG_ERROR);
    assert_non_null(strstr(a.err, "fake device lost"));
    assert_non_null(strstr(b.err, "fake device lost"));
    assert_int_equal(atomic_load(&f.live_seqs), 0);
    /* the engine keeps running */
    assert_int_equal(eng_submit(e, &c.req, &err), 0);
    WAIT_UNTIL(c.done);
    assert_int_equal(c.why, ENG_STOP_LENGTH);
    assert_int_equal(c.n_toks, 4);
    eng_destroy(e);
    job_fini(&blk);
    job_fini(&a);
    job_fini(&b);
    job_fini(&c);
}

static void test_fake_validation(void **st)
{
    (void)st;
    fake f = {0};
    engine *e = fake_engine(&f, 64, 0, 0);
    int32_t p[300];
    for (int i = 0; i < 300; i++) p[i] = 2;
    job j;
    rc_err err = {0};
    job_init(&j, p, 0, greedy_n(4));
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "empty prompt"));
    job_fini(&j);
    job_init(&j, p, 200, greedy_n(57));
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "200"));
    assert_non_null(strstr(err.msg, "57"));
    assert_non_null(strstr(err.msg, "256"));
    job_fini(&j);
    job_init(&j, p, 300, greedy_n(1));
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    job_fini(&j);
    job_init(&j, p, 10, greedy_n(4));
    j.prompt[7] = 32;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "vocabulary"));
    j.prompt[7] = -1;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    j.prompt[7] = 3;
    j.req.sampling.max_tokens = 0;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    j.req.sampling.max_tokens = 2;
    j.req.sampling.temperature = -1;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    j.req.sampling.temperature = 0;
    j.req.sampling.top_p = 1.5;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    j.req.sampling.top_p = 1;
    j.req.sampling.n_stop_ids = 2;
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    j.req.sampling.n_stop_ids = 0;
    /* fits exactly: 10 + 246 = 256 */
    j.req.sampling.max_tokens = 246;
    f.hold = 1; /* keep it live (parked in its first forward) */
    assert_int_equal(eng_submit(e, &j.req, &err), 0);
    /* the same request twice while live */
    assert_int_equal(eng_submit(e, &j.req, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "already"));
    release(&f);
    WAIT_UNTIL(j.done);
    assert_int_equal(j.why, ENG_STOP_LENGTH);
    assert_int_equal(j.completion, 246);
    eng_destroy(e);
    job_fini(&j);
    /* a backend without forward is refused */
    eng_backend bad = fake_backend(&f);
    bad.forward = NULL;
    assert_null(eng_create(&bad, NULL, &err));
}

/* max_running 1, max_waiting 2: A runs (parked in forward), B and C wait, D
 * is refused; cancelling B frees its queue slot at once. */
static void test_fake_queue_full_and_cancel_waiting(void **st)
{
    (void)st;
    fake f = {.hold = 1};
    engine *e = fake_engine(&f, 64, 1, 2);
    int32_t p[3] = {3, 4, 5};
    job js[5];
    for (int i = 0; i < 5; i++) job_init(&js[i], p, 3, greedy_n(5));
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &js[0].req, &err), 0);
    WAIT_UNTIL(f.in_forward == 1);
    assert_int_equal(eng_submit(e, &js[1].req, &err), 0);
    assert_int_equal(eng_submit(e, &js[2].req, &err), 0);
    assert_int_equal(eng_submit(e, &js[3].req, &err), ENG_EBUSY);
    assert_non_null(strstr(err.msg, "full"));
    eng_stats s;
    eng_get_stats(e, &s);
    assert_int_equal(s.running, 1);
    assert_int_equal(s.waiting, 2);
    eng_cancel(e, &js[1].req);
    eng_cancel(e, &js[1].req); /* twice: harmless */
    eng_get_stats(e, &s);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(eng_submit(e, &js[3].req, &err), 0);
    release(&f);
    WAIT_UNTIL(js[0].done && js[1].done && js[2].done && js[3].done);
    assert_int_equal(js[1].why, ENG_CANCELLED);
    assert_int_equal(js[1].n_toks, 0);
    assert_int_equal(js[0].why, ENG_STOP_LENGTH);
    assert_int_equal(js[2].why, ENG_STOP_LENGTH);
    assert_int_equal(js[3].why, ENG_STOP_LENGTH);
    /* cancel after on_done, and of a request never submitted: no-ops */
    eng_cancel(e, &js[0].req);
    eng_cancel(e, &js[4].req);
    eng_get_stats(e, &s);
    assert_int_equal(s.running + s.waiting, 0);
    eng_destroy(e);
    for (int i = 0; i < 5; i++) job_fini(&js[i]);
}

/* Releases a parked engine once eng_shutdown has begun and its deadline has
 * passed.  The probe is a request that is live (parked), so eng_submit answers
 * "already submitted" until the engine is stopping and "shutting down" from
 * then on; the deadline eng_shutdown computes is no later than deadline_ms
 * after that answer. */
typedef struct {
    engine *e;
    fake *f;
    eng_request *probe;
    int deadline_ms;
    int saw_stopping;
} releaser;

static void *release_after_deadline(void *arg)
{
    releaser *r = arg;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        rc_err err = {0};
        int rc = eng_submit(r->e, r->probe, &err);
        if (rc == ENG_EBUSY && strstr(err.msg, "shutting down")) { r->saw_stopping = 1; break; }
        if (rc != RC_EINVAL) break; /* the probe was not refused as live: the test fails on saw_stopping */
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 60) break;
        usleep(1000);
    }
    usleep((useconds_t)(r->deadline_ms + 30) * 1000); /* sleeping longer only helps */
    release(r->f);
    return NULL;
}

/* on_done may submit; shutdown drains what was accepted; a deadline cancels */
static void test_fake_chain_and_shutdown(void **st)
{
    (void)st;
    int32_t p[4] = {3, 4, 5, 6};
    {
        fake f = {0};
        engine *e = fake_engine(&f, 16, 0, 0);
        job a, b;
        job_init(&a, p, 4, greedy_n(3));
        job_init(&b, p, 2, greedy_n(3));
        a.chain = &b;
        a.chain_e = e;
        rc_err err = {0};
        assert_int_equal(eng_submit(e, &a.req, &err), 0);
        WAIT_UNTIL(a.done && b.done);
        assert_int_equal(b.why, ENG_STOP_LENGTH);
        eng_destroy(e);
        job_fini(&a);
        job_fini(&b);
    }
    {
        /* generous deadline: everything accepted finishes normally */
        fake f = {.sleep_us = 200};
        engine *e = fake_engine(&f, 16, 2, 0);
        job js[4];
        rc_err err = {0};
        for (int i = 0; i < 4; i++) {
            job_init(&js[i], p, 4, greedy_n(10));
            assert_int_equal(eng_submit(e, &js[i].req, &err), 0);
        }
        eng_shutdown(e, -1);
        for (int i = 0; i < 4; i++) assert_int_equal(js[i].why, ENG_STOP_LENGTH);
        job late;
        job_init(&late, p, 4, greedy_n(1));
        assert_int_equal(eng_submit(e, &late.req, &err), ENG_EBUSY);
        assert_non_null(strstr(err.msg, "shutting down"));
        eng_destroy(e);
        for (int i = 0; i < 4; i++) job_fini(&js[i]);
        job_fini(&late);
    }
    {
        /* short deadline: running and waiting ones are cancelled, seqs freed.
         * The third forward parks (js[0] and js[1] have 2 tokens each, js[2]
         * and js[3] wait) and is released only after the deadline: however
         * late this thread gets to eng_shutdown, nothing runs to its end
         * first. */
        fake f = {.sleep_us = 2000, .park_at = 3};
        engine *e = fake_engine(&f, 16, 2, 0);
        job js[4];
        rc_err err = {0};
        for (int i = 0; i < 4; i++) {
            job_init(&js[i], p, 4, greedy_n(200));
            assert_int_equal(eng_submit(e, &js[i].req, &err), 0);
        }
        WAIT_UNTIL(f.in_forward == 3);
        assert_int_equal(js[0].n_toks, 2);
        assert_int_equal(js[1].n_toks, 2);
        releaser rel = {.e = e, .f = &f, .probe = &js[0].req, .deadline_ms = 20};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, release_after_deadline, &rel), 0);
        eng_shutdown(e, 20);
        pthread_join(th, NULL);
        assert_true(rel.saw_stopping);
        for (int i = 0; i < 4; i++) {
            assert_int_equal(js[i].done, 1);
            assert_int_equal(js[i].why, ENG_CANCELLED);
        }
        assert_int_equal(atomic_load(&f.live_seqs), 0);
        eng_shutdown(e, 0); /* again: harmless */
        eng_destroy(e);
        for (int i = 0; i < 4; i++) job_fini(&js[i]);
    }
}

/* ================================================================ real model */

typedef struct {
    be_backend *be;
    md_model *m;
    eng_model_impl mi;
} model_fix;

static int model_setup(void **st)
{
    model_fix *fx = calloc(1, sizeof *fx);
    fx->be = be_cpu_create(2);
    rc_err err = {0};
    if (md_model_load(MODEL_FIXTURE_DIR "/tiny-mixed", fx->be, MD_SEM_OFFICIAL, NULL, NULL, &fx->m, &err)) {
        fprintf(stderr, "tiny-mixed: %s\n", err.msg);
        return -1;
    }
    *st = fx;
    return 0;
}

static int model_teardown(void **st)
{
    model_fix *fx = *st;
    md_model_free(fx->m);
    be_destroy(fx->be);
    free(fx);
    return 0;
}

static engine *model_engine(model_fix *fx, int mbt, int mr, int mw)
{
    fx->mi = (eng_model_impl){.m = fx->m};
    eng_backend be = eng_model_backend(&fx->mi);
    /* three sampling threads whatever the machine: a step's sampled rows are split over them (a request alone
     * samples on the engine thread), and test_model_batch_invariance compares the two */
    eng_cfg cfg = {.max_batch_tokens = mbt, .max_running = mr, .max_waiting = mw, .sample_threads = 3};
    rc_err err = {0};
    engine *e = eng_create(&be, &cfg, &err);
    if (!e) fail_msg("eng_create: %s", err.msg);
    eng_set_state_bytes_fn(e, eng_model_seq_bytes);
    return e;
}

/* run one request alone (fresh engine) */
static void run_alone(model_fix *fx, job *j)
{
    engine *e = model_engine(fx, 64, 0, 0);
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &j->req, &err), 0);
    WAIT_UNTIL(j->done);
    eng_destroy(e);
}

static void test_model_batch_invariance(void **st)
{
    model_fix *fx = *st;
    const int V = md_model_config(fx->m)->vocab_size;
    const int small = small_mode();
    const int N = 64, OUT = small ? 8 : 16;
    const size_t REF = 20, SAMP = 41; /* positions of the two checked requests */
    job *js = calloc((size_t)N, sizeof *js);
    for (int i = 0; i < N; i++) {
        /* lengths 1..40, and every 8th one long enough to be chunked (> 64) */
        size_t n = (size_t)(1 + (i * 13) % 40);
        if (i % 8 == 3) n = small ? 70 + (size_t)i : 90 + 2 * (size_t)i;
        int32_t *p = make_ids(n, V, 1000 + (uint64_t)i);
        eng_sampling s = greedy_n(OUT);
        s.ignore_eos = 1;
        if (i % 3 == 1 || (size_t)i == SAMP) {
            s.temperature = 0.8;
            s.top_k = 40;
            s.top_p = 0.9;
            s.seed = 1234 + (uint64_t)i;
            s.has_seed = 1;
        }
        job_init(&js[i], p, n, s);
        free(p);
    }
    /* the reference run: each checked request alone */
    job solo[2];
    const size_t which[2] = {REF, SAMP};
    for (int k = 0; k < 2; k++) {
        job_init(&solo[k], js[which[k]].prompt, js[which[k]].req.n_prompt, js[which[k]].req.sampling);
        run_alone(fx, &solo[k]);
        assert_int_equal(solo[k].why, ENG_STOP_LENGTH);
        assert_int_equal(solo[k].n_toks, (size_t)OUT);
    }
    engine *e = model_engine(fx, 64, 0, 0);
    rc_err err = {0};
    for (int i = 0; i < N; i++) assert_int_equal(eng_submit(e, &js[i].req, &err), 0);
    WAIT_UNTIL(all_done(js, (size_t)N));
    eng_stats s;
    eng_get_stats(e, &s);
    size_t prompt_total = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(js[i].why, ENG_STOP_LENGTH);
        assert_int_equal(js[i].n_toks, (size_t)OUT);
        assert_int_equal(js[i].completion, (size_t)OUT);
        prompt_total += js[i].req.n_prompt;
    }
    assert_int_equal(s.prompt_tokens, prompt_total);
    assert_int_equal(s.completion_tokens, (uint64_t)N * (uint64_t)OUT);
    /* batching is invisible: same tokens, greedy and seeded sampling */
    for (int k = 0; k < 2; k++)
        assert_memory_equal(solo[k].toks, js[which[k]].toks, (size_t)OUT * sizeof(int32_t));
    /* and it was a batch: far fewer steps than requests x tokens */
    assert_true(s.steps < (uint64_t)(N * OUT) / 4);
    eng_destroy(e);
    for (int i = 0; i < N; i++) job_fini(&js[i]);
    for (int k = 0; k < 2; k++) job_fini(&solo[k]);
    free(js);
}

/* the model backend's forward_top1, counting the greedy tokens it returned instead of logits */
static eng_model_impl *top1_inner;
static size_t top1_calls, top1_items;
static int counting_top1(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                         int32_t **top1, size_t count, rc_err *err)
{
    (void)impl;
    eng_backend inner = eng_model_backend(top1_inner);
    top1_calls++;
    for (size_t i = 0; i < count; i++) top1_items += top1 && top1[i] && !logits[i];
    return inner.forward_top1(inner.impl, seqs, ids, n, logits, top1, count, err);
}

/* the model backend's forward_draw, as a device would answer it: every other offered draw taken by the backend
 * (the host sampler on the row, with the draw's uniform; the row then scribbled over, as a device leaves it
 * unwritten), the others handed back with their logits */
static size_t draw_offered, draw_taken;
static int scribbling_draw(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                           int32_t **top1, rc_draw **draw, size_t count, rc_err *err)
{
    (void)impl;
    eng_backend inner = eng_model_backend(top1_inner);
    const int rc = inner.forward_draw(inner.impl, seqs, ids, n, logits, top1, draw, count, err);
    eng_sample_scratch ws = {0};
    for (size_t i = 0; !rc && i < count; i++) {
        if (!draw || !draw[i]) continue;
        assert_int_equal(draw[i]->token, -1); /* the CPU model writes the logits */
        if (draw_offered++ % 2) continue;
        const eng_sampling sp = {.temperature = draw[i]->temperature, .top_p = draw[i]->top_p,
                                 .top_k = draw[i]->top_k, .min_p = draw[i]->min_p};
        draw[i]->token = eng_sample_u01(logits[i], inner.vocab, &sp, draw[i]->u01, &ws);
        for (int v = 0; v < inner.vocab; v++) logits[i][v] = NAN;
        draw_taken++;
    }
    eng_sample_scratch_free(&ws);
    return rc;
}

/* Twelve requests of 8 tokens (request i's sampling: want(i)) through two engines on the model backend: pass 0 on
 * the plain logits path (forward_top1 and forward_draw removed), pass 1 with setup's hooks.  Each request's tokens
 * must be the same in both. */
enum { TP_N = 12, TP_OUT = 8 };
static void two_passes(model_fix *fx, void (*setup)(eng_backend *be), eng_sampling (*want)(int i), uint64_t seed)
{
    const int V = md_model_config(fx->m)->vocab_size;
    job js[2][TP_N];
    for (int pass = 0; pass < 2; pass++) {
        fx->mi = (eng_model_impl){.m = fx->m};
        top1_inner = &fx->mi;
        eng_backend be = eng_model_backend(&fx->mi);
        be.forward_top1 = NULL;
        be.forward_draw = NULL;
        if (pass) setup(&be);
        eng_cfg cfg = {.max_batch_tokens = 64};
        rc_err err = {0};
        engine *e = eng_create(&be, &cfg, &err);
        if (!e) fail_msg("eng_create: %s", err.msg);
        for (int i = 0; i < TP_N; i++) {
            int32_t *p = make_ids((size_t)(3 + 5 * i), V, seed + (uint64_t)i);
            job_init(&js[pass][i], p, (size_t)(3 + 5 * i), want(i));
            free(p);
            assert_int_equal(eng_submit(e, &js[pass][i].req, &err), 0);
        }
        WAIT_UNTIL(all_done(js[pass], (size_t)TP_N));
        eng_destroy(e);
    }
    for (int i = 0; i < TP_N; i++) {
        assert_int_equal(js[0][i].n_toks, (size_t)TP_OUT);
        assert_memory_equal(js[0][i].toks, js[1][i].toks, (size_t)TP_OUT * sizeof(int32_t));
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < TP_N; i++) job_fini(&js[pass][i]);
}

static void setup_top1(eng_backend *be) { be->forward_top1 = counting_top1; }
/* three of four greedy, the fourth seeded at temperature 0.7 */
static eng_sampling want_top1(int i)
{
    eng_sampling s = greedy_n(TP_OUT);
    s.ignore_eos = 1;
    if (i % 4 == 3) {
        s.temperature = 0.7;
        s.seed = 77 + (uint64_t)i;
        s.has_seed = 1;
    }
    return s;
}

/* Greedy requests take only their token from the backend (forward_top1: on a GPU the argmax is taken on the
 * device and the logits stay there); the tokens equal those of the logits path, for greedy and seeded requests in
 * one batch. */
static void test_model_top1(void **st)
{
    top1_calls = top1_items = 0;
    two_passes(*st, setup_top1, want_top1, 500);
    /* the greedy ones (9 of 12, 8 tokens each) came as tokens */
    assert_true(top1_calls > 0);
    assert_int_equal(top1_items, (size_t)(9 * TP_OUT));
}

static void setup_draw(eng_backend *be) { be->forward_draw = scribbling_draw; }
/* one of four greedy, the others seeded under several settings */
static eng_sampling want_draw(int i)
{
    eng_sampling s = greedy_n(TP_OUT);
    s.ignore_eos = 1;
    if (i % 4) {
        s.temperature = i % 3 ? 0.8 : 1.2;
        s.top_p = i % 5 == 1 ? 0.9 : 0;
        s.top_k = i % 5 == 2 ? 7 : 0;
        s.min_p = i % 5 == 3 ? 0.05 : 0;
        s.seed = 91 + (uint64_t)i;
        s.has_seed = 1;
    }
    return s;
}

/* Sampled requests offer their draws to the backend (forward_draw): the uniform is taken from the request's stream
 * before the forward, once, so a draw the backend takes and one it hands back give the tokens of the plain logits
 * path, for seeded requests under several settings beside greedy ones. */
static void test_model_draw(void **st)
{
    draw_offered = draw_taken = 0;
    two_passes(*st, setup_draw, want_draw, 700);
    /* the sampled ones (9 of 12, 8 tokens each) were offered; half of the offers taken */
    assert_int_equal(draw_offered, (size_t)(9 * TP_OUT));
    assert_int_equal(draw_taken, (size_t)(9 * TP_OUT / 2));
}

static void test_model_cancel_running(void **st)
{
    model_fix *fx = *st;
    const int V = md_model_config(fx->m)->vocab_size;
    engine *e = model_engine(fx, 64, 0, 0);
    int32_t *p = make_ids(30, V, 5);
    job a, b;
    eng_sampling s = greedy_n(4000);
    s.ignore_eos = 1;
    job_init(&a, p, 30, s);
    job_init(&b, p, 10, s);
    rc_err err = {0};
    assert_int_equal(eng_submit(e, &a.req, &err), 0);
    assert_int_equal(eng_submit(e, &b.req, &err), 0);
    WAIT_UNTIL(a.n_toks >= 3 && b.n_toks >= 3);
    eng_stats st0;
    eng_get_stats(e, &st0);
    assert_int_equal(st0.running, 2);
    assert_true(st0.state_bytes >= 2 * md_seq_fixed_bytes(fx->m));
    eng_cancel(e, &a.req);
    WAIT_UNTIL(a.done);
    assert_int_equal(a.why, ENG_CANCELLED);
    assert_true(a.completion >= 3);
    eng_stats st1;
    eng_get_stats(e, &st1);
    assert_int_equal(st1.running, 1);
    eng_cancel(e, &a.req); /* after on_done: a no-op */
    eng_cancel(e, &b.req);
    WAIT_UNTIL(b.done);
    assert_int_equal(b.why, ENG_CANCELLED);
    eng_get_stats(e, &st1);
    assert_int_equal(st1.running, 0);
    eng_destroy(e);
    job_fini(&a);
    job_fini(&b);
    free(p);
}

static void test_model_stops(void **st)
{
    model_fix *fx = *st;
    const int V = md_model_config(fx->m)->vocab_size;
    int32_t *p = make_ids(12, V, 99);
    eng_sampling s = greedy_n(12);
    s.ignore_eos = 1;
    job full;
    job_init(&full, p, 12, s);
    run_alone(fx, &full);
    assert_int_equal(full.why, ENG_STOP_LENGTH);
    assert_int_equal(full.n_toks, 12);
    /* the engine's greedy == argmax over md_forward driven by hand */
    {
        md_seq *q = md_seq_create(fx->m);
        float *lg = malloc((size_t)V * sizeof *lg);
        rc_err err = {0};
        md_segment seg = {.seq = q, .ids = p, .n = 12, .logits = lg};
        for (int t = 0; t < 12; t++) {
            assert_int_equal(md_forward(fx->m, &seg, 1, &err), 0);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            assert_int_equal(full.toks[t], best);
            seg.ids = &full.toks[t];
            seg.n = 1;
        }
        free(lg);
        md_seq_free(q);
    }
    /* max_tokens 5: the first five of the same greedy run */
    job five;
    s.max_tokens = 5;
    job_init(&five, p, 12, s);
    run_alone(fx, &five);
    assert_int_equal(five.why, ENG_STOP_LENGTH);
    assert_int_equal(five.n_toks, 5);
    assert_memory_equal(five.toks, full.toks, 5 * sizeof(int32_t));
    /* stop id: the first token (from index 2) not seen before it */
    size_t k = 2;
    for (; k < 12; k++) {
        int seen = 0;
        for (size_t i = 0; i < k; i++) seen |= full.toks[i] == full.toks[k];
        if (!seen) break;
    }
    assert_true(k < 12);
    int32_t stops[2] = {V - 1 == full.toks[k] ? V - 2 : V - 1, full.toks[k]};
    for (size_t i = 0; i < k; i++) assert_int_not_equal(stops[0], full.toks[i]);
    job st_job;
    s.max_tokens = 12;
    s.stop_ids = stops;
    s.n_stop_ids = 2;
    job_init(&st_job, p, 12, s);
    run_alone(fx, &st_job);
    assert_int_equal(st_job.why, ENG_STOP_ID);
    assert_int_equal(st_job.n_toks, k + 1);
    assert_memory_equal(st_job.toks, full.toks, (k + 1) * sizeof(int32_t));
    job_fini(&full);
    job_fini(&five);
    job_fini(&st_job);
    free(p);
}

int main(void)
{
    const struct CMUnitTest sampler[] = {
        cmocka_unit_test(test_greedy_ties),
        cmocka_unit_test(test_top_k1_is_greedy),
        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_empirical),
        cmocka_unit_test(test_filters_exclude),
        cmocka_unit_test(test_top_k_set),
        cmocka_unit_test(test_top_p_matches_full_sort),
        cmocka_unit_test(test_fast_path_matches_full),
        cmocka_unit_test(test_top_p_large_nucleus),
    };
    const struct CMUnitTest fake_tests[] = {
        cmocka_unit_test(test_fake_chunking),
        cmocka_unit_test(test_fake_budget_shared),
        cmocka_unit_test(test_fake_eos),
        cmocka_unit_test(test_fake_forward_error),
        cmocka_unit_test(test_fake_validation),
        cmocka_unit_test(test_fake_queue_full_and_cancel_waiting),
        cmocka_unit_test(test_fake_chain_and_shutdown),
    };
    const struct CMUnitTest model_tests[] = {
        cmocka_unit_test(test_model_batch_invariance),
        cmocka_unit_test(test_model_top1),
        cmocka_unit_test(test_model_draw),
        cmocka_unit_test(test_model_cancel_running),
        cmocka_unit_test(test_model_stops),
    };
    int fails = cmocka_run_group_tests_name("sampler", sampler, NULL, NULL);
    fails += cmocka_run_group_tests_name("engine_fake", fake_tests, NULL, NULL);
    fails += cmocka_run_group_tests_name("engine_model", model_tests, model_setup, model_teardown);
    return fails ? 1 : 0;
}
