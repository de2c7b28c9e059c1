/* sampler.c - temperature, min_p, top_k, top_p and one draw, for one row.
 *
 * Everything is computed from weights w_i = exp((l_i - l_max) / T) in double:
 * w_max = 1, so min_p is the plain test w_i >= min_p (p_i / p_max is
 * invariant to normalisation), and the softmax never needs its denominator
 * except as the sum of the kept weights at draw time.
 *
 * The filters run in vLLM v1's order (vllm/v1/sample/sampler.py: temperature,
 * the argmax-invariant processors - min_p - then top_k, then top_p).  top_k and
 * min_p commute (both keep the max and are rank/ratio tests); top_p does not:
 * it is taken over the distribution the earlier filters left, renormalised,
 * exactly as apply_top_k_top_p computes its cumulative sum.  top_p keeps the
 * shortest prefix (by descending probability) whose mass reaches top_p, and
 * never less than one token.
 *
 * Candidates are ordered by (logit descending, id ascending) - the logit, not
 * the weight, so rounding in exp() cannot reorder two tokens, and equal logits
 * resolve to the lowest id as greedy does.  top_k with small k is a size-k heap
 * over the vocabulary (O(V log k)) and sorts only the k survivors; top_p alone
 * sorts only the tokens in the binades of w that reach its mass (see
 * nucleus_bound).  Without top_p the draw walks the candidates in id order and
 * nothing is sorted.
 *
 * The fast path (pruning).  A row's exp() calls cost ~1 ms at a 129k
 * vocabulary, so tokens whose weight is provably below tau = 2^-b (b =
 * ENG_SAMPLE_PRUNE_BITS unless eng_sample_set_prune says otherwise) are
 * skipped by one comparison of their float logit against a threshold, and
 * their total weight is bounded from a histogram of their logits in half-nat
 * bins (no exp() each).  The result is then certified to be the one the full
 * computation gives, bit for bit, or the full computation runs:
 *   - nothing of weight skipped, or min_p >= tau (the skipped tokens fail
 *     min_p anyway): the candidate list is the full one;
 *   - top_k (below the vocabulary) skips no token: the k + 1 best logits come
 *     from a heap and only they are weighed (draw_top_k), exactly;
 *   - top_p, or the plain draw: the sums differ by at most the skipped mass
 *     plus rounding (M below); the nucleus's cut and the drawn token's
 *     cumulative interval must clear that margin on both sides.
 * A row falls back with a probability of a few times its skipped mass; the
 * tests check the fast path against the full computation with b as low as 2,
 * where many rows fall back, and bench_sampler measures both.
 *
 * Not here: penalties, logit bias, logprobs - none exist in eng_sampling yet. */
#include "engine/sampler.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/greedy.h"

typedef struct {
    double w;  /* exp((l - l_max) / T) */
    float l;   /* the logit, NaN folded to -inf */
    int32_t id;
} cand;

uint64_t eng_rng_init(uint64_t seed) { return seed; }

uint64_t eng_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void eng_sample_scratch_free(eng_sample_scratch *ws)
{
    if (!ws) return;
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

static inline float logit_at(const float *logits, int i)
{
    float v = logits[i];
    return isnan(v) ? -INFINITY : v;
}

/* a ranks before b */
static inline int before(const cand *a, const cand *b) { return a->l > b->l || (a->l == b->l && a->id < b->id); }

static int cmp_cand(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* c[0..n) into (logit desc, id asc) order, the order cmp_cand gives (the keys are unique, so any correct sort gives
 * the same array).  Past a few thousand candidates (a flat row's nucleus can be most of the vocabulary) an LSD radix
 * sort on the 64-bit key (the logit's bits made order-preserving and inverted, then the id) through tmp[0..2n),
 * the bytes that no two keys differ in skipped.  Where c is in id order (idorder) only 8-byte keys move, over the
 * logit's bytes alone (the passes are stable), and the candidates are gathered once.  qsort below that. */
static inline uint64_t cand_key(const cand *x)
{
    union { float f; uint32_t u; } b = {.f = x->l == 0 ? 0.0f : x->l}; /* -0 ties +0, as in before() */
    const uint32_t asc = b.u & 0x80000000u ? ~b.u : b.u | 0x80000000u;
    return (uint64_t)~asc << 32 | (uint32_t)x->id;
}

static void sort_cands(cand *c, size_t n, cand *tmp, int idorder)
{
    if (n < 4096 || !tmp) {
        qsort(c, n, sizeof *c, cmp_cand);
        return;
    }
    static _Thread_local uint32_t hist[8][256];
    memset(hist, 0, sizeof hist);
    if (idorder) {
        /* c in id order: sort 8-byte keys (the logit's key, then the position in c) on the logit's bytes alone (the
         * passes are stable), then gather; tmp holds the two key buffers, tmp + n the gathered candidates */
        uint64_t *k = (uint64_t *)tmp, *k2 = k + n;
        for (size_t i = 0; i < n; i++) {
            k[i] = (cand_key(&c[i]) & ~(uint64_t)0xffffffffu) | (uint64_t)i;
            for (int d = 4; d < 8; d++) hist[d][(k[i] >> (8 * d)) & 255]++;
        }
        for (int d = 4; d < 8; d++) {
            uint32_t *h = hist[d];
            if (h[(k[0] >> (8 * d)) & 255] == n) continue;
            uint32_t pos = 0;
            for (int b = 0; b < 256; b++) { const uint32_t t = h[b]; h[b] = pos; pos += t; }
            for (size_t i = 0; i < n; i++) k2[h[(k[i] >> (8 * d)) & 255]++] = k[i];
            uint64_t *t = k; k = k2; k2 = t;
        }
        cand *out = tmp + n;
        for (size_t i = 0; i < n; i++) out[i] = c[(uint32_t)k[i]];
        memcpy(c, out, n * sizeof *c);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint64_t k = cand_key(&c[i]);
        for (int d = 0; d < 8; d++) hist[d][(k >> (8 * d)) & 255]++;
    }
    cand *src = c, *dst = tmp;
    for (int d = 0; d < 8; d++) {
        uint32_t *h = hist[d];
        if (h[(cand_key(&src[0]) >> (8 * d)) & 255] == n) continue; /* one value of this byte: nothing moves */
        uint32_t pos = 0;
        for (int b = 0; b < 256; b++) { const uint32_t t = h[b]; h[b] = pos; pos += t; }
        for (size_t i = 0; i < n; i++) dst[h[(cand_key(&src[i]) >> (8 * d)) & 255]++] = src[i];
        cand *t = src; src = dst; dst = t;
    }
    if (src != c) memcpy(c, src, n * sizeof *c);
}

/* Min-heap on rank: h[0] is the worst of the k kept so far. */
static void heap_down(cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static void heap_up(cand *h, size_t i)
{
    while (i) {
        size_t p = (i - 1) / 2;
        if (!before(&h[p], &h[i])) return;
        cand t = h[i]; h[i] = h[p]; h[p] = t;
        i = p;
    }
}

/* Length of the shortest prefix of sorted c[0..n) with mass >= need, or n + 1
 * if the whole of it falls short. */
static size_t top_p_prefix(const cand *c, size_t n, double need)
{
    double cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (cum >= need) return i + 1;
    }
    return n + 1;
}

/* The nucleus is a prefix of the (logit desc, id asc) order, so any upper set
 * {w >= 2^-B} with mass >= need contains it, and only that set needs sorting.
 * One pass histograms the mass by binade of w (w in (0, 1]); the smallest B
 * that reaches need picks the set, moved to the front of c.  Returns its size.
 * Its sorted prefix sums are the full sort's, bit for bit; the caller falls
 * back to the full sort in the (rounding) case where they still fall short. */
/* the binade of w in (0, 1]: 1 - the exponent frexp gives, read from the bits (0 for w = 1; w subnormal: 1023) */
static inline int binade(double w)
{
    union { double d; uint64_t u; } b = {.d = w};
    return 1023 - (int)((b.u >> 52) & 0x7ff);
}

static size_t nucleus_bound(cand *c, size_t n, double need)
{
    enum { NB = 64 };
    double mass[NB] = {0};
    for (size_t i = 0; i < n; i++) {
        const int b = binade(c[i].w);
        mass[b < NB ? b : NB - 1] += c[i].w;
    }
    int B = 0;
    double cum = mass[0];
    while (cum < need && B < NB - 1) cum += mass[++B];
    if (B == NB - 1) return n;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (binade(c[i].w) <= B) { cand t = c[m]; c[m++] = c[i]; c[i] = t; }
    return m;
}

static int greedy(const float *logits, int vocab) { return (int)rc_greedy(logits, (size_t)vocab); }

/* The filters and the draw on the candidates c[0..n): every token with w > 0 and w >= min_p in id order
 * (sorted = 0), or (sorted = 1) the k best of them, sorted, where top_k took k of more. */
static int draw_full(cand *c, size_t n, const eng_sampling *s, double u01, int sorted, cand *tmp)
{
    if (!sorted && s->top_k > 0 && (size_t)s->top_k < n) {
        size_t k = (size_t)s->top_k;
        /* c[0..k) becomes the heap; later candidates replace its worst */
        for (size_t i = 1; i < k; i++) heap_up(c, i);
        for (size_t i = k; i < n; i++)
            if (before(&c[i], &c[0])) { c[0] = c[i]; heap_down(c, k, 0); }
        n = k;
        sort_cands(c, n, tmp, 0);
        sorted = 1;
    }
    if (s->top_p > 0 && s->top_p < 1 && n > 1) {
        double total = 0;
        for (size_t i = 0; i < n; i++) total += c[i].w;
        const double need = s->top_p * total;
        size_t m = n;
        if (!sorted) {
            m = nucleus_bound(c, n, need); /* its set stays in id order */
            sort_cands(c, m, tmp, 1);
        }
        size_t keep = top_p_prefix(c, m, need);
        if (keep > m) { /* rounding left the bound short: sort everything */
            sort_cands(c, n, tmp, 0);
            keep = top_p_prefix(c, n, need);
            if (keep > n) keep = n;
        }
        n = keep;
    }

    double total = 0;
    for (size_t i = 0; i < n; i++) total += c[i].w;
    const double u = u01 * total;
    double cum = 0;
    for (size_t i = 0; i < n; i++) {
        cum += c[i].w;
        if (u < cum) return c[i].id;
    }
    return c[n - 1].id;  /* u rounded up to the total */
}

static _Atomic int prune_bits = ENG_SAMPLE_PRUNE_BITS; /* eng_sample_set_prune */
static _Atomic uint64_t n_fast, n_full; /* eng_sample_counts */

void eng_sample_counts(uint64_t *fast, uint64_t *full)
{
    if (fast) *fast = n_fast;
    if (full) *full = n_full;
}

int eng_sample_set_prune(int bits)
{
    if (bits < 0 || bits > 60) return RC_EINVAL;
    prune_bits = bits;
    return 0;
}

/* A bound on the skipped tokens' weights without exp() each: a token's -2 d = 2 (lmax - l) / T in float, floored
 * to k, puts its weight under exp(-(k - 1) / 2) (the one half-nat of slack covers the float rounding, ~1e-7 of d).
 * btab[k] holds those bounds; k from NBIN - 1 on (d below -799) weighs exactly 0 in double. */
#define NBIN 1600
static double btab[NBIN];
static pthread_once_t btab_once = PTHREAD_ONCE_INIT;
static void btab_init(void)
{
    for (int k = 0; k < NBIN; k++) btab[k] = exp(-0.5 * (k - 1));
}

/* The candidates of tokens at or above the float threshold lf, in id order, into c; *skipped_mass: a bound on the
 * weight of the tokens below it (each under tau, see the caller) */
static size_t survivors(const float *logits, int vocab, float lf, float lmax, double invT, double min_p, cand *c,
                        double *skipped_mass)
{
    uint32_t hist[NBIN] = {0};
    const float s2 = (float)(2.0 * invT);
    size_t n = 0;
    for (int i = 0; i < vocab; i++) {
        const float l = logits[i];
        if (!(l >= lf)) { /* NaN and -inf weigh 0 on both paths */
            if (l > -INFINITY) {
                const float e = (lmax - l) * s2;
                hist[e < (float)(NBIN - 1) ? (int)e : NBIN - 1]++;
            }
            continue;
        }
        const double w = exp(((double)l - (double)lmax) * invT);
        if (w > 0 && w >= min_p) c[n++] = (cand){w, l, i};
    }
    double m = 0;
    for (int k = 0; k < NBIN; k++)
        if (hist[k]) m += (double)hist[k] * btab[k];
    *skipped_mass = m * (1 + 0x1.0p-40);
    return n;
}

/* top_k < vocab without a weight for every token: the k + 1 best by (logit desc, id asc) from a heap, then their
 * weights.  w is monotone in the logit, so the tokens that pass w > 0 and min_p are an upper set of that order: if
 * the (k + 1)-th passes, the full list has more than k candidates and top_k keeps these k best; if not, every
 * candidate is among these k, and the full list (in id order) is the passing ones.  Exact, no margin. */
static int draw_top_k(const float *logits, int vocab, const eng_sampling *s, double u01, float lmax, cand *c,
                      cand *tmp)
{
    const double invT = 1.0 / s->temperature;
    const double min_p = s->min_p > 0 ? s->min_p : 0;
    const size_t h = (size_t)s->top_k + 1; /* <= vocab */
    for (size_t i = 0; i < h; i++) {
        c[i] = (cand){0, logit_at(logits, (int)i), (int32_t)i};
        heap_up(c, i);
    }
    for (int i = (int)h; i < vocab; i++) {
        const cand x = {0, logit_at(logits, i), i};
        if (before(&x, &c[0])) { c[0] = x; heap_down(c, h, 0); }
    }
    sort_cands(c, h, tmp, 0);
    size_t n = 0;
    for (size_t i = 0; i < h; i++) {
        const double w = exp(((double)c[i].l - (double)lmax) * invT);
        if (!(w > 0 && w >= min_p)) break;
        c[i].w = w;
        n++;
    }
    if (n == h) return draw_full(c, h - 1, s, u01, 1, tmp);
    /* at most k candidates in all: top_k keeps them all, in id order */
    for (size_t i = 1; i < n; i++) { /* insertion sort by id (n <= k) */
        cand x = c[i];
        size_t j = i;
        for (; j > 0 && c[j - 1].id > x.id; j--) c[j] = c[j - 1];
        c[j] = x;
    }
    return draw_full(c, n, s, u01, 0, tmp);
}

/* The fast path (header): the token, or -1 where it cannot be certified and the full computation must run. */
static int draw_pruned(const float *logits, int vocab, const eng_sampling *s, double u01, float lmax, cand *c,
                       cand *tmp, int bits)
{
    if (s->top_k > 0 && s->top_k < vocab) return draw_top_k(logits, vocab, s, u01, lmax, c, tmp);
    /* from here top_k takes nothing: it is off, or at least the vocabulary */
    const double invT = 1.0 / s->temperature;
    const double min_p = s->min_p > 0 ? s->min_p : 0;
    const double tau = ldexp(1.0, -bits);
    pthread_once(&btab_once, btab_init);
    /* skip l < lf, lf a float with lf - lmax <= L = (ln tau - 1e-3) / invT: then (l - lmax) rounds to at most L,
     * times invT to at most ln tau - 1e-3 (give or take an ulp), and exp of that is below tau */
    const double L = (log(tau) - 1e-3) / invT;
    double t = (double)lmax + L;
    if (!(t > -3.0e38)) return -1; /* a threshold below every float: nothing to skip */
    float lf = (float)t;
    while ((double)lf > t || (double)lf - (double)lmax > L) lf = nextafterf(lf, -INFINITY);
    double skipped;
    size_t n = survivors(logits, vocab, lf, lmax, invT, min_p, c, &skipped);
    if (!(skipped > 0) || min_p >= tau) return draw_full(c, n, s, u01, 0, tmp); /* the full candidate list */
    /* the full list's sums differ from these by at most the skipped mass and the rounding of two running sums of at
     * most vocab terms each: M, as a bound on every prefix sum, the total and so u */
    double total = 0;
    for (size_t i = 0; i < n; i++) total += c[i].w;
    const double M = skipped + 4.0 * ((double)vocab + 2) * 0x1.0p-53 * total;
    /* a draw fails its margins with a probability of about sum min(w, 4 M) / total (u or the cut within a margin of
     * an interval's end): past 1/4, go straight to the full computation */
    double risk = 0;
    for (size_t i = 0; i < n; i++) risk += c[i].w < 4 * M ? c[i].w : 4 * M;
    if (risk > 0.25 * total) return -1;
    if (s->top_p > 0 && s->top_p < 1) {
        const double need = s->top_p * total, m = s->top_p * M + 0x1.0p-50 * need;
        size_t b = n > 1 ? nucleus_bound(c, n, need) : n;
        sort_cands(c, b, tmp, 1);
        /* the shortest prefix reaching need + m; the one before it must stay under need - m */
        double cum = 0, prev = 0;
        size_t keep = 0;
        while (keep < b && cum < need + m) { prev = cum; cum += c[keep++].w; }
        if (!(cum >= need + m) || !(keep == 1 || prev < need - m)) return -1;
        /* the same keep tokens in the same order as the full computation's: its draw, exactly */
        n = keep;
        double kt = 0;
        for (size_t i = 0; i < n; i++) kt += c[i].w;
        const double u = u01 * kt;
        cum = 0;
        for (size_t i = 0; i < n; i++) {
            cum += c[i].w;
            if (u < cum) return c[i].id;
        }
        return c[n - 1].id;
    }
    /* the plain draw in id order: token j where u < cum_j, with margins for the full list's cum and u */
    const double u = u01 * total, m2 = 2.0 * M + 0x1.0p-50 * total;
    double cum = 0;
    for (size_t i = 0; i < n; i++) {
        const double before_j = cum;
        cum += c[i].w;
        if (u < cum) return u >= before_j + m2 && u < cum - m2 ? c[i].id : -1;
    }
    return -1;
}

double eng_sample_uniform(uint64_t *rng_state) { return (double)(eng_rng_next(rng_state) >> 11) * 0x1.0p-53; }

int eng_sample_ws(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng_state,
                  eng_sample_scratch *ws)
{
    if (!logits || vocab <= 0 || !s || !rng_state || !ws) return RC_EINVAL;
    if (eng_sampling_greedy(s)) return greedy(logits, vocab);
    return eng_sample_u01(logits, vocab, s, eng_sample_uniform(rng_state), ws);
}

int eng_sample_u01(const float *logits, int vocab, const eng_sampling *s, double u01, eng_sample_scratch *ws)
{
    if (!logits || vocab <= 0 || !s || !ws) return RC_EINVAL;
    const int amax = greedy(logits, vocab);
    if (eng_sampling_greedy(s)) return amax;
    const float lmax = logit_at(logits, amax);
    if (!isfinite(lmax)) return amax;  /* all -inf, or +inf present: nothing to weigh */

    if (ws->cap < 3 * (size_t)vocab) { /* the candidates, then the radix sort's two (sort_cands) */
        void *p = realloc(ws->buf, 3 * (size_t)vocab * sizeof(cand));
        if (!p) return RC_ENOMEM;
        ws->buf = p;
        ws->cap = 3 * (size_t)vocab;
    }
    cand *c = ws->buf, *tmp = c + vocab;
    const int bits = prune_bits;
    if (bits > 0) {
        const int id = draw_pruned(logits, vocab, s, u01, lmax, c, tmp, bits);
        if (id >= 0) { n_fast++; return id; }
    }
    n_full++;
    const double invT = 1.0 / s->temperature;
    const double min_p = s->min_p > 0 ? s->min_p : 0;

    /* temperature + min_p; zero-weight tokens cannot be drawn and are dropped */
    size_t n = 0;
    for (int i = 0; i < vocab; i++) {
        float l = logit_at(logits, i);
        double w = exp(((double)l - (double)lmax) * invT);
        if (w > 0 && w >= min_p) c[n++] = (cand){w, l, i};
    }
    /* n >= 1: the argmax has w = 1 */
    return draw_full(c, n, s, u01, 0, tmp);
}

int eng_sample(const float *logits, int vocab, const eng_sampling *s, uint64_t *rng_state)
{
    eng_sample_scratch ws = {0};
    int id = eng_sample_ws(logits, vocab, s, rng_state, &ws);
    eng_sample_scratch_free(&ws);
    return id;
}
