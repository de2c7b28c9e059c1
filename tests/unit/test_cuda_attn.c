/* test_cuda_attn.c - the CUDA attention and indexer kernels (attn.cu) against
 * a CPU reference in double that mirrors v4.c's indexer_task and attn_task.
 *
 * First, on any machine: a CPU emulation of the kernels' top-k selection (the
 * radix select with its lane-owned digit search, the ordered compaction, the
 * stage A groups and the stage B merge) against a plain sort with v4.c's
 * rule (higher score first, then lower index), on arrays full of ties.
 * Then, without a CUDA device, it prints "SKIPPED: no CUDA device" and exits
 * 77 (CTest: skipped); a failed emulation still fails (exit 1).
 *
 * On a GPU, per case (one batch of sequences, each with p0, T, win_lo; KV
 * blocks shuffled in a pool whose unused rows, padding and window guards are
 * NaN, so any read outside the visible data poisons the output):
 *   indexer   nsel = min(topk, visible); the selection ascending, in range,
 *             -1 after nsel; the GPU's scores (read back from the workspace)
 *             equal the reference bit for bit on dyadic data and within
 *             1e-5 of the row's magnitude on random data; the GPU's selection
 *             equals the emulated selection on the GPU's own scores exactly,
 *             and the reference selection on the reference scores exactly on
 *             dyadic data (ties included), or up to near-ties on random data;
 *   attention per (row, head) max |gpu - ref| / max |ref| <= 1e-5 (CSA rows
 *             attend the GPU's selection); every output written (NaN
 *             poisoned first); a second run is bit-identical; no error flag.
 * x3 (keys on the FP8 grid, rope_dim 64): the three-plane tensor-core kernel to the same bound, deterministic.
 * Negative controls check that the comparisons reject a perturbed output and
 * a swapped index.  TEST_CUDA_ATTN_FILTER (cmocka glob) picks tests, e.g.
 * "test_small_*" under compute-sanitizer. */
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

#include "backend/cuda/attn.h"

#define BLOCK_TOKENS 128
#define ATTN_TOL 1e-5
/* bcu_attention_args.bf16 (head_dim 512): q, keys and p rounded to bf16 (2^-9 each), fp32 sums; against the same
 * double reference on the fp32 inputs */
#define ATTN_TOL_BF16 2e-2
static double attn_tol = ATTN_TOL;
#define SCORE_TOL 1e-5
/* bcu_indexer_args.bf16: q and keys rounded to bf16 (exact on dyadic data, which must then stay bit-identical) */
#define SCORE_TOL_BF16 1e-2
static double score_tol = SCORE_TOL;
#define MAX_SEQ 10
#define MAX_REPORT 6

/* ------------------------------------------------------------------ random */

#include "test_rng.h"
static float dyadic(void) { return (float)((int)(rnd() % 5) - 2) * 0.25f; } /* -0.5 .. 0.5 step 1/4 */

/* ------------------------------------------------------------------ keys and the emulated selection */

/* attn.cu's f2key: order-preserving, -0 == +0 */
static uint32_t f2key(float s)
{
    uint32_t u = 0;
    if (s != 0.0f) memcpy(&u, &s, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static float key2f(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* attn.cu's block_select, step for step (the lane-owned digit search
 * included), without the threads: the top k of items 0..n-1 by higher key
 * then earlier item, written in item order. */
static int emu_block_select(const uint32_t *keys, const int32_t *idx, int base, int n, int k, uint32_t *ou,
                            int32_t *oi)
{
    const int all = n <= k;
    uint32_t thr = 0;
    int remain = 0;
    if (!all) {
        uint32_t prefix = 0, mask = 0;
        remain = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            uint32_t hist[256] = {0};
            for (int i = 0; i < n; i++)
                if ((keys[i] & mask) == prefix) hist[(keys[i] >> shift) & 255u]++;
            uint32_t own[32], suf[33];
            suf[32] = 0;
            for (int L = 0; L < 32; L++) {
                own[L] = 0;
                for (int e = 0; e < 8; e++) own[L] += hist[8 * L + e];
            }
            for (int L = 31; L >= 0; L--) suf[L] = suf[L + 1] + own[L];
            int Lx = -1;
            for (int L = 0; L < 32; L++)
                if (suf[L] >= (uint32_t)remain) Lx = L; /* the highest lane of the ballot */
            if (Lx < 0) return -1;                      /* the invariant broke */
            uint32_t cum = suf[Lx] - own[Lx];
            int dd = 8 * Lx + 7;
            for (; dd > 8 * Lx; dd--) {
                if (cum + hist[dd] >= (uint32_t)remain) break;
                cum += hist[dd];
            }
            if (cum + hist[dd] < (uint32_t)remain) return -1;
            prefix |= (uint32_t)dd << shift;
            mask |= 255u << shift;
            remain -= (int)cum;
        }
        thr = prefix;
    }
    int taken = 0, eqs = 0;
    for (int i = 0; i < n; i++) {
        const uint32_t u = keys[i];
        const int gt = all || u > thr, eq = !all && u == thr;
        const int rank = eqs;
        if (eq) eqs++;
        if (gt || (eq && rank < remain)) {
            oi[taken] = idx ? idx[i] : base + i;
            if (ou) ou[taken] = u;
            taken++;
        }
    }
    return taken;
}

/* attn.cu's two stages: groups of 4k, then the union; returns nsel, sel[nsel..k) = -1 */
static int emu_topk(const uint32_t *keys, int nv, int k, int32_t *sel)
{
    const int range = 4 * k, ng = (nv + range - 1) / range;
    for (int j = 0; j < k; j++) sel[j] = -2;
    uint32_t *cu = malloc(((size_t)ng * k + 1) * sizeof *cu);
    int32_t *ci = malloc(((size_t)ng * k + 1) * sizeof *ci);
    for (int g = 0; g < ng; g++) {
        const int start = g * range, len = nv - start < range ? nv - start : range;
        const int got = emu_block_select(keys + start, NULL, start, len, k, cu + (size_t)g * k, ci + (size_t)g * k);
        if (got != (len < k ? len : k)) { free(cu); free(ci); return -1; }
    }
    int nu = 0;
    if (ng > 0) {
        const int last = nv - (ng - 1) * range;
        nu = (ng - 1) * k + (last < k ? last : k);
    }
    const int cnt = emu_block_select(cu, ci, 0, nu, k, NULL, sel);
    for (int j = cnt < 0 ? 0 : cnt; j < k; j++) sel[j] = -1;
    free(cu);
    free(ci);
    return cnt;
}

/* the specification: sort by (higher score, lower index), keep k, ascending */
typedef struct {
    double s;
    int32_t i;
} scored;
static int cmp_scored(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}
static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
/* also returns the k-th score (the boundary) */
static int sort_topk(const double *score, int nv, int k, int32_t *sel, double *kth)
{
    scored *sc = malloc(((size_t)nv + 1) * sizeof *sc);
    for (int b = 0; b < nv; b++) sc[b] = (scored){score[b], b};
    qsort(sc, (size_t)nv, sizeof *sc, cmp_scored);
    const int m = nv < k ? nv : k;
    for (int j = 0; j < m; j++) sel[j] = sc[j].i;
    if (kth) *kth = m ? sc[m - 1].s : 0;
    qsort(sel, (size_t)m, sizeof *sel, cmp_i32);
    for (int j = m; j < k; j++) sel[j] = -1;
    free(sc);
    return m;
}

/* first position where two selections differ, -1 if none */
static int first_diff(const int32_t *a, const int32_t *b, int k)
{
    for (int j = 0; j < k; j++)
        if (a[j] != b[j]) return j;
    return -1;
}

/* ------------------------------------------------------------------ CPU-only: the selection algorithm */

static void fill_keys(uint32_t *u, int n, int kind)
{
    const uint32_t pick[5] = {f2key(0.0f), f2key(1.5f), f2key(-2.0f), f2key(1.5f + 1e-6f), f2key(7.0f)};
    for (int i = 0; i < n; i++) {
        switch (kind) {
        case 0: u[i] = (uint32_t)rnd(); break;                  /* distinct (almost surely) */
        case 1: u[i] = pick[rnd() % 5]; break;                  /* five values: ties everywhere */
        case 2: u[i] = f2key(1.0f); break;                      /* all equal */
        case 3: u[i] = 0x80000000u | (uint32_t)(rnd() % 3); break; /* equal top 3 bytes */
        case 4: u[i] = f2key((float)((int)(rnd() % 9) - 4) * 0.5f); break;
        default: u[i] = f2key(unif() * 100.0f); break;
        }
    }
}

static void test_select_emulation(void **st)
{
    (void)st;
    /* the key order is the float order, with -0 == +0 */
    const float f[] = {-INFINITY, -3e38f, -1.0f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1e-7f, 1.0f, 2.0f, 3e38f, INFINITY};
    const int nf = (int)(sizeof f / sizeof f[0]);
    for (int i = 0; i < nf; i++)
        for (int j = 0; j < nf; j++) {
            if ((f[i] < f[j]) != (f2key(f[i]) < f2key(f[j])) || (f[i] == f[j]) != (f2key(f[i]) == f2key(f[j])))
                fail_msg("f2key order: %g vs %g", (double)f[i], (double)f[j]);
            if (f[i] != 0 && key2f(f2key(f[i])) != f[i]) fail_msg("key2f(f2key(%g))", (double)f[i]);
        }
    const int ks[] = {1, 3, 8, 512};
    int cases = 0;
    for (int ki = 0; ki < 4; ki++) {
        const int k = ks[ki];
        const int ns[] = {0, 1, 2, k - 1, k, k + 1, 2 * k, 4 * k - 1, 4 * k, 4 * k + 1, 9 * k + 3, 17 * k + 5,
                          (int)(rnd() % 40000) + 1};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int n = ns[ni];
            if (n < 0) continue;
            for (int kind = 0; kind < 6; kind++) {
                uint32_t *u = malloc(((size_t)n + 1) * sizeof *u);
                double *sd = malloc(((size_t)n + 1) * sizeof *sd);
                int32_t *got = malloc((size_t)k * sizeof *got), *want = malloc((size_t)k * sizeof *want);
                fill_keys(u, n, kind);
                for (int i = 0; i < n; i++) sd[i] = (double)u[i]; /* sorting keys = sorting scores */
                const int m = sort_topk(sd, n, k, want, NULL);
                const int c = emu_topk(u, n, k, got);
                if (c != m) fail_msg("emulated top-%d of %d (kind %d): %d selected, expected %d", k, n, kind, c, m);
                const int d = first_diff(got, want, k);
                if (d >= 0)
                    fail_msg("emulated top-%d of %d (kind %d): position %d is %d, expected %d", k, n, kind, d, got[d],
                             want[d]);
                /* one block over everything gives the same set */
                int32_t *one = malloc(((size_t)k + 1) * sizeof *one);
                const int c1 = emu_block_select(u, NULL, 0, n, k, NULL, one);
                if (c1 != m || (m && memcmp(one, want, (size_t)m * sizeof *one)))
                    fail_msg("single-block emulation of top-%d of %d (kind %d) differs", k, n, kind);
                free(one);
                free(u); free(sd); free(got); free(want);
                cases++;
            }
        }
    }
    printf("  selection emulation: %d arrays, identical to the sort\n", cases);
}

/* ------------------------------------------------------------------ GPU cases */

#define CK(call)                                                                                                  \
    do {                                                                                                          \
        cudaError_t r_ = (call);                                                                                  \
        if (r_ != cudaSuccess) fail_msg("%s: %s (%s:%d)", #call, cudaGetErrorString(r_), __FILE__, __LINE__);     \
    } while (0)

typedef struct {
    int64_t p0;
    int T;
    int64_t win_lo;
} sspec;

enum { D_RANDOM = 0, D_DYADIC = 1, D_TIES = 2, D_EQUAL = 3 };

typedef struct {
    const char *name;
    int H, d, rd, W;
    int ratio, csa;     /* ratio 0: window only; csa: the indexer's selection */
    int IH, ID, topk;
    int data;           /* indexer data, D_* */
    float sink_scale;
    int nseq;
    sspec s[MAX_SEQ];
    int fp8kv;          /* every key's first d - rd channels on official semantics' FP8 grid (fq_fp8: blocks of 64,
                           a power-of-two scale, e4m3), so bcu_attention_args.x3 applies (rd 64) */
} tcase;

/* one case on host and device */
typedef struct {
    const tcase *c;
    int ntok, epb;
    size_t blk_floats, ent_off, key_off;
    int64_t max_len;
    int row0[MAX_SEQ];
    int64_t kstart[MAX_SEQ], nkw[MAX_SEQ], nent[MAX_SEQ];
    int nblk[MAX_SEQ], *phys[MAX_SEQ];
    float *kwin[MAX_SEQ];  /* host: the first real row (guards around) */
    float *pool;           /* host mirror of the block pool */
    size_t npool;
    float *q, *sink, *inv, *iq, *iw;
    /* device */
    float *d_pool, *d_kwin[MAX_SEQ], *d_q, *d_sink, *d_inv, *d_iq, *d_iw, *d_out;
    const float **d_tab[MAX_SEQ];
    bcu_attn_seq *d_seqs;
    int32_t *d_sel, *d_nsel;
    bcu_attn_ws ws;
    cudaStream_t st;
} hcase;

#define GUARD 2

/* v4.c's fq_fp8 on x[0, n): per block of 64, scale = the power of two >= amax / 448, the values rounded to e4m3
 * (3 mantissa bits, nearest even; subnormals below 2^-6 in steps of 2^-9) times it; exact in bf16 */
static void fq_fp8_host(float *x, int n)
{
    for (int b0 = 0; b0 < n; b0 += 64) {
        const int b1 = b0 + 64 < n ? b0 + 64 : n;
        float amax = 1e-4f;
        for (int i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        int e2;
        const float f = frexpf(amax / 448.0f, &e2);
        const float sc = ldexpf(1.0f, f == 0.5f ? e2 - 1 : e2);
        for (int i = b0; i < b1; i++) {
            const float y = x[i] / sc;
            if (y == 0.0f) continue;
            int ey;
            frexpf(y, &ey); /* |y| in [2^(ey-1), 2^ey) */
            int e = ey - 1;
            if (e < -6) e = -6;
            float r = nearbyintf(ldexpf(y, 3 - e));
            r = ldexpf(r, e - 3);
            x[i] = fminf(fmaxf(r, -448.0f), 448.0f) * sc;
        }
    }
}

static const float *ent(const hcase *h, int s, int64_t b)
{
    return h->pool + (size_t)h->phys[s][b / h->epb] * h->blk_floats + h->ent_off + (size_t)(b % h->epb) * h->c->d;
}
static const float *ikey(const hcase *h, int s, int64_t b)
{
    return h->pool + (size_t)h->phys[s][b / h->epb] * h->blk_floats + h->key_off + (size_t)(b % h->epb) * h->c->ID;
}

static void *upload(const void *src, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 4));
    if (bytes) CK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void setup(hcase *h, const tcase *c)
{
    memset(h, 0, sizeof *h);
    h->c = c;
    const int d = c->d;
    h->epb = c->ratio ? BLOCK_TOKENS / c->ratio : 1;
    /* block: 28 NaN floats (another layer), the entries, the indexer keys, 4 NaN */
    h->ent_off = 28;
    h->key_off = h->ent_off + (size_t)h->epb * d;
    h->blk_floats = h->key_off + (c->csa ? (size_t)h->epb * c->ID : 0) + 4;
    int nb = 0;
    for (int s = 0; s < c->nseq; s++) {
        const sspec *sp = &c->s[s];
        h->row0[s] = h->ntok;
        h->ntok += sp->T;
        const int64_t end = sp->p0 + sp->T;
        if (end > h->max_len) h->max_len = end;
        int64_t ks = sp->p0 - c->W + 1;
        if (ks < sp->win_lo) ks = sp->win_lo;
        if (ks < 0) ks = 0;
        h->kstart[s] = ks;
        h->nkw[s] = end - ks;
        h->nent[s] = c->ratio ? end / c->ratio : 0;
        h->nblk[s] = c->ratio ? (int)((h->nent[s] + h->epb - 1) / h->epb) : 0;
        nb += h->nblk[s];
    }
    /* the pool, shuffled */
    h->npool = (size_t)(nb ? nb : 1) * h->blk_floats;
    h->pool = malloc(h->npool * sizeof(float));
    for (size_t i = 0; i < h->npool; i++) h->pool[i] = NAN;
    int *perm = malloc((size_t)(nb ? nb : 1) * sizeof *perm);
    for (int i = 0; i < nb; i++) perm[i] = i;
    for (int i = nb - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int at = 0;
    for (int s = 0; s < c->nseq; s++) {
        h->phys[s] = malloc((size_t)(h->nblk[s] ? h->nblk[s] : 1) * sizeof(int));
        for (int i = 0; i < h->nblk[s]; i++) h->phys[s][i] = perm[at++];
    }
    free(perm);
    /* entries; indexer keys by data kind */
    float *same = malloc((size_t)(c->ID > 0 ? c->ID : 1) * sizeof(float));
    for (int i = 0; i < c->ID; i++) same[i] = dyadic();
    for (int s = 0; s < c->nseq; s++)
        for (int64_t b = 0; b < h->nent[s]; b++) {
            float *e = (float *)ent(h, s, b);
            for (int i = 0; i < d; i++) e[i] = unif();
            if (c->fp8kv) fq_fp8_host(e, d - c->rd);
            if (!c->csa) continue;
            float *k = (float *)ikey(h, s, b);
            for (int i = 0; i < c->ID; i++) k[i] = c->data == D_RANDOM ? unif() : dyadic();
            if (c->data == D_EQUAL) memcpy(k, same, (size_t)c->ID * sizeof(float));
            if (c->data == D_TIES && b > 0) {
                const uint64_t r = rnd() % 20;
                if (r < 5) memcpy(k, ikey(h, s, (int64_t)(rnd() % (uint64_t)b)), (size_t)c->ID * sizeof(float));
                else if (r == 5) memset(k, 0, (size_t)c->ID * sizeof(float));
            }
        }
    free(same);
    /* window keys with NaN guards */
    for (int s = 0; s < c->nseq; s++) {
        const size_t rows = (size_t)h->nkw[s] + 2 * GUARD;
        float *w = malloc(rows * d * sizeof(float));
        for (size_t i = 0; i < rows * d; i++) w[i] = NAN;
        for (size_t i = GUARD * (size_t)d; i < (GUARD + (size_t)h->nkw[s]) * d; i++) w[i] = unif();
        if (c->fp8kv)
            for (int64_t k = 0; k < h->nkw[s]; k++) fq_fp8_host(w + (GUARD + (size_t)k) * d, d - c->rd);
        h->kwin[s] = w + GUARD * d;
        h->d_kwin[s] = (float *)upload(w, rows * d * sizeof(float)) + GUARD * d;
    }
    const size_t nq = (size_t)h->ntok * c->H * d;
    h->q = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) h->q[i] = 4.0f * unif();
    h->sink = malloc((size_t)c->H * sizeof(float));
    for (int i = 0; i < c->H; i++) h->sink[i] = c->sink_scale * unif();
    h->inv = malloc((size_t)(c->rd / 2 + 1) * sizeof(float));
    const double base = c->ratio ? 160000.0 : 10000.0;
    for (int i = 0; i < c->rd / 2; i++) h->inv[i] = (float)pow(base, -2.0 * i / c->rd);
    if (c->csa) {
        const size_t niq = (size_t)h->ntok * c->IH * c->ID, niw = (size_t)h->ntok * c->IH;
        h->iq = malloc(niq * sizeof(float));
        h->iw = malloc(niw * sizeof(float));
        for (size_t i = 0; i < niq; i++) h->iq[i] = c->data == D_RANDOM ? unif() : dyadic();
        for (size_t i = 0; i < niw; i++)
            h->iw[i] = c->data == D_RANDOM ? 0.2f * unif() : (float)((int)(rnd() % 17) - 8) / 8.0f;
        h->d_iq = upload(h->iq, niq * sizeof(float));
        h->d_iw = upload(h->iw, niw * sizeof(float));
        CK(cudaMalloc((void **)&h->d_sel, (size_t)h->ntok * c->topk * sizeof(int32_t)));
        CK(cudaMalloc((void **)&h->d_nsel, (size_t)h->ntok * sizeof(int32_t)));
        CK(cudaMemset(h->d_sel, 0x7f, (size_t)h->ntok * c->topk * sizeof(int32_t)));
        CK(cudaMemset(h->d_nsel, 0x7f, (size_t)h->ntok * sizeof(int32_t)));
    }
    /* device pool, block tables, descriptors */
    h->d_pool = upload(h->pool, h->npool * sizeof(float));
    bcu_attn_seq seqs[MAX_SEQ];
    for (int s = 0; s < c->nseq; s++) {
        const float **tab = malloc((size_t)(h->nblk[s] ? h->nblk[s] : 1) * sizeof *tab);
        for (int i = 0; i < h->nblk[s]; i++) tab[i] = h->d_pool + (size_t)h->phys[s][i] * h->blk_floats;
        h->d_tab[s] = upload(tab, (size_t)h->nblk[s] * sizeof *tab);
        free(tab);
        seqs[s] = (bcu_attn_seq){.p0 = c->s[s].p0, .kstart = h->kstart[s], .kwin = h->d_kwin[s],
                                 .blocks = (const float *const *)h->d_tab[s], .row0 = h->row0[s], .T = c->s[s].T};
    }
    h->d_seqs = upload(seqs, (size_t)c->nseq * sizeof *seqs);
    h->d_q = upload(h->q, nq * sizeof(float));
    h->d_sink = upload(h->sink, (size_t)c->H * sizeof(float));
    h->d_inv = upload(h->inv, (size_t)(c->rd / 2 + 1) * sizeof(float));
    CK(cudaMalloc((void **)&h->d_out, nq * sizeof(float)));
    /* a workspace sized exactly for this batch */
    h->ws.lim = (bcu_attn_limits){.max_rows = h->ntok, .max_len = h->max_len, .n_heads = c->H, .head_dim = d,
                                  .index_topk = c->csa ? c->topk : 0, .index_ratio = c->csa ? c->ratio : 0};
    CK(cudaMalloc(&h->ws.mem, bcu_attn_workspace_bytes(&h->ws.lim)));
    CK(cudaStreamCreate(&h->st));
    CK(bcu_attn_workspace_init(&h->ws, h->st));
}

static void teardown(hcase *h)
{
    const tcase *c = h->c;
    for (int s = 0; s < c->nseq; s++) {
        free(h->phys[s]);
        free(h->kwin[s] - GUARD * c->d);
        cudaFree(h->d_kwin[s] - GUARD * c->d);
        cudaFree(h->d_tab[s]);
    }
    free(h->pool); free(h->q); free(h->sink); free(h->inv); free(h->iq); free(h->iw);
    cudaFree(h->d_pool); cudaFree(h->d_q); cudaFree(h->d_sink); cudaFree(h->d_inv); cudaFree(h->d_iq);
    cudaFree(h->d_iw); cudaFree(h->d_out); cudaFree(h->d_seqs); cudaFree(h->d_sel); cudaFree(h->d_nsel);
    cudaFree(h->ws.mem);
    cudaStreamDestroy(h->st);
}

static int seq_of(const hcase *h, int row)
{
    int s = 0;
    while (s + 1 < h->c->nseq && h->row0[s + 1] <= row) s++;
    return s;
}

/* ---- the indexer */

/* reference scores of row r in double: sum_h w[h] relu(q_h . k_b); mag = the
 * row's scale for tolerances, sum_h |w_h| max_b sum_c |q_hc k_bc| */
static void ref_scores(const hcase *h, int row, int64_t nv, double *sc, double *mag)
{
    const tcase *c = h->c;
    const int s = seq_of(h, row), IH = c->IH, ID = c->ID;
    const float *q = h->iq + (size_t)row * IH * ID, *w = h->iw + (size_t)row * IH;
    double m = 0;
    for (int64_t b = 0; b < nv; b++) {
        const float *k = ikey(h, s, b);
        double tot = 0, mb = 0;
        for (int hh = 0; hh < IH; hh++) {
            double dp = 0, ab = 0;
            for (int i = 0; i < ID; i++) {
                dp += (double)q[(size_t)hh * ID + i] * k[i];
                ab += fabs((double)q[(size_t)hh * ID + i] * k[i]);
            }
            if (dp > 0) tot += dp * w[hh];
            mb += fabs((double)w[hh]) * ab;
        }
        sc[b] = tot;
        if (mb > m) m = mb;
    }
    *mag = m;
}

typedef struct {
    int bad;          /* failures */
    int near_flips;   /* random data: reference vs GPU differences at near-ties */
    double worst_score;
} ix_result;

/* Checks the GPU's selection (sel, nsel: host copies) and scores (keys, row
 * stride ks) against the reference.  verbose = 0 only counts. */
static ix_result check_indexer(const hcase *h, const int32_t *sel, const int32_t *nsel, const uint32_t *keys,
                               size_t ks, int verbose)
{
    const tcase *c = h->c;
    const int k = c->topk;
    ix_result res = {0, 0, 0};
    int32_t *want = malloc((size_t)k * sizeof *want), *emu = malloc((size_t)k * sizeof *emu);
    for (int row = 0; row < h->ntok; row++) {
        const int s = seq_of(h, row);
        const int64_t pos = c->s[s].p0 + (row - h->row0[s]);
        const int nv = (int)((pos + 1) / c->ratio);
        const int m = nv < k ? nv : k;
        const int32_t *g = sel + (size_t)row * k;
#define IXFAIL(...)                                                                                               \
    do {                                                                                                          \
        if (verbose && res.bad < MAX_REPORT) printf("  FAIL %s row %d (seq %d, pos %lld, %d visible): ", c->name, \
                                                    row, s, (long long)pos, nv), printf(__VA_ARGS__), printf("\n"); \
        res.bad++;                                                                                                \
    } while (0)
        if (nsel[row] != m) {
            IXFAIL("nsel %d, expected %d", nsel[row], m);
            continue;
        }
        int shape_ok = 1;
        for (int j = 0; j < k && shape_ok; j++) {
            if (j < m && (g[j] < 0 || g[j] >= nv || (j > 0 && g[j] <= g[j - 1]))) {
                IXFAIL("sel[%d] = %d is out of range or not ascending (previous %d)", j, g[j], j ? g[j - 1] : -1);
                shape_ok = 0;
            }
            if (j >= m && g[j] != -1) {
                IXFAIL("sel[%d] = %d after nsel, expected -1", j, g[j]);
                shape_ok = 0;
            }
        }
        if (!shape_ok) continue;
        double *rs = malloc(((size_t)nv + 1) * sizeof *rs), mag = 0, kth = 0;
        ref_scores(h, row, nv, rs, &mag);
        /* the GPU's scores */
        const uint32_t *gk = keys + (size_t)row * ks;
        const double tol = score_tol * (mag > 0 ? mag : 1);
        for (int b = 0; b < nv; b++) {
            const double gs = key2f(gk[b]);
            const double e = fabs(gs - rs[b]);
            if (e / (mag > 0 ? mag : 1) > res.worst_score) res.worst_score = e / (mag > 0 ? mag : 1);
            const int ok = c->data == D_RANDOM ? e <= tol : gk[b] == f2key((float)rs[b]);
            if (!ok) {
                IXFAIL("score of entry %d: expected %.9g, got %.9g (row magnitude %.3g)", b, rs[b], gs, mag);
                break;
            }
        }
        /* the GPU's selection is exactly the rule applied to the GPU's scores */
        if (emu_topk(gk, nv, k, emu) != m) IXFAIL("emulated selection count");
        int dpos = first_diff(g, emu, k);
        if (dpos >= 0)
            IXFAIL("selection vs the rule on the GPU's own scores: sel[%d] = %d (score %.9g), expected %d (score %.9g)",
                   dpos, g[dpos], g[dpos] >= 0 ? (double)key2f(gk[g[dpos]]) : 0.0, emu[dpos],
                   emu[dpos] >= 0 ? (double)key2f(gk[emu[dpos]]) : 0.0);
        /* and the rule applied to the reference scores */
        sort_topk(rs, nv, k, want, &kth);
        dpos = first_diff(g, want, k);
        if (dpos >= 0) {
            if (c->data != D_RANDOM) {
                IXFAIL("selection vs the reference: sel[%d] = %d (ref score %.9g), expected %d (ref score %.9g); "
                       "k-th score %.9g",
                       dpos, g[dpos], rs[g[dpos]], want[dpos], rs[want[dpos]], kth);
            } else {
                /* random data: every difference must be a near-tie at the boundary */
                char *in_g = calloc((size_t)nv + 1, 1), *in_w = calloc((size_t)nv + 1, 1);
                for (int j = 0; j < m; j++) {
                    in_g[g[j]] = 1;
                    in_w[want[j]] = 1;
                }
                for (int b = 0; b < nv; b++)
                    if (in_g[b] != in_w[b]) {
                        if (fabs(rs[b] - kth) <= 2 * tol) res.near_flips++;
                        else {
                            IXFAIL("entry %d %s by the GPU, ref score %.9g, k-th %.9g: not a near-tie", b,
                                   in_g[b] ? "chosen" : "left out", rs[b], kth);
                            break;
                        }
                    }
                free(in_g);
                free(in_w);
            }
        }
        free(rs);
#undef IXFAIL
    }
    free(want);
    free(emu);
    return res;
}

/* ---- attention */

/* reference output of (row, head) in double, v4.c's attn_task; csel/cn = the
 * row's compressed candidates on CSA layers */
static void ref_attn(const hcase *h, int row, int hh, const int32_t *csel, int cn, double *o)
{
    const tcase *c = h->c;
    const int s = seq_of(h, row), d = c->d;
    const int64_t pos = c->s[s].p0 + (row - h->row0[s]);
    int64_t w0 = pos - c->W + 1;
    if (w0 < h->kstart[s]) w0 = h->kstart[s];
    const int nw = (int)(pos - w0 + 1);
    int nc = 0;
    if (c->ratio) nc = c->csa ? cn : (int)((pos + 1) / c->ratio);
    const float *q = h->q + ((size_t)row * c->H + hh) * d;
    double *sc = malloc((size_t)(nw + nc) * sizeof *sc);
    const float **kv = malloc((size_t)(nw + nc) * sizeof *kv);
    for (int i = 0; i < nw; i++) kv[i] = h->kwin[s] + (size_t)(w0 - h->kstart[s] + i) * d;
    for (int i = 0; i < nc; i++) kv[nw + i] = ent(h, s, c->csa ? csel[i] : i);
    const double scale = 1.0 / sqrt((double)d);
    double mx = h->sink[hh];
    for (int i = 0; i < nw + nc; i++) {
        double dp = 0;
        for (int x = 0; x < d; x++) dp += (double)q[x] * kv[i][x];
        sc[i] = dp * scale;
        if (sc[i] > mx) mx = sc[i];
    }
    double den = exp(h->sink[hh] - mx);
    for (int i = 0; i < nw + nc; i++) den += (sc[i] = exp(sc[i] - mx));
    for (int x = 0; x < d; x++) o[x] = 0;
    for (int i = 0; i < nw + nc; i++) {
        const double p = sc[i] / den;
        for (int x = 0; x < d; x++) o[x] += p * kv[i][x];
    }
    /* inverse RoPE; the angle rounded to float as v4.c computes it */
    double *t = o + d - c->rd;
    for (int i = 0; i < c->rd / 2; i++) {
        const float ang = (float)pos * h->inv[i];
        const double cs = cos((double)ang), sn = -sin((double)ang);
        const double x0 = t[2 * i], x1 = t[2 * i + 1];
        t[2 * i] = x0 * cs - x1 * sn;
        t[2 * i + 1] = x1 * cs + x0 * sn;
    }
    free(sc);
    free(kv);
}

/* number of (row, head) whose max |gpu - ref| / max |ref| exceeds the bound */
static int check_attn(const hcase *h, const float *out, const int32_t *sel, const int32_t *nsel, int verbose,
                      double *worst)
{
    const tcase *c = h->c;
    const int d = c->d;
    double *o = malloc((size_t)d * sizeof *o);
    int bad = 0;
    *worst = 0;
    for (int row = 0; row < h->ntok; row++)
        for (int hh = 0; hh < c->H; hh++) {
            ref_attn(h, row, hh, sel ? sel + (size_t)row * c->topk : NULL, nsel ? nsel[row] : 0, o);
            const float *g = out + ((size_t)row * c->H + hh) * d;
            double md = 0, mr = 0;
            int at = 0;
            for (int x = 0; x < d; x++) {
                const double e = isnan(g[x]) ? INFINITY : fabs(g[x] - o[x]);
                if (e > md) {
                    md = e;
                    at = x;
                }
                if (fabs(o[x]) > mr) mr = fabs(o[x]);
            }
            const double rel = mr > 0 ? md / mr : md;
            if (rel > *worst || isnan(rel)) *worst = isnan(rel) ? INFINITY : rel;
            if (!(rel <= attn_tol)) {
                if (verbose && bad < MAX_REPORT) {
                    const int s = seq_of(h, row);
                    printf("  FAIL %s row %d (seq %d, pos %lld) head %d: channel %d expected %.9g got %.9g "
                           "(max |ref| %.3g, rel %.3g)\n",
                           c->name, row, s, (long long)(c->s[s].p0 + row - h->row0[s]), hh, at, o[at], (double)g[at],
                           mr, rel);
                }
                bad++;
            }
        }
    free(o);
    return bad;
}

/* ---- one case, end to end */

/* one bcu_attention call into dst (host, the batch's outputs) with the device outputs NaN-poisoned first, so an
 * output it does not write shows; `what` names the variant in a failure */
static void attn_run(hcase *h, const bcu_attn_batch *b, const bcu_attention_args *a, float *dst, const char *what)
{
    const size_t nout = (size_t)h->ntok * h->c->H * h->c->d;
    char err[256] = "";
    CK(cudaMemsetAsync(h->d_out, 0xff, nout * sizeof(float), h->st));
    cudaError_t r = bcu_attention(&h->ws, b, a, h->st, err, sizeof err);
    if (r != cudaSuccess) fail_msg("%s: bcu_attention%s: %s %s", h->c->name, what, cudaGetErrorString(r), err);
    CK(cudaStreamSynchronize(h->st));
    CK(cudaMemcpy(dst, h->d_out, nout * sizeof(float), cudaMemcpyDeviceToHost));
}

static void run_case(const tcase *c, int controls)
{
    hcase h;
    setup(&h, c);
    char err[256] = "";
    const bcu_attn_batch b = {.seqs = h.d_seqs, .nseq = c->nseq, .ntok = h.ntok, .max_len = h.max_len};
    int32_t *sel = NULL, *nsel = NULL;
    int bad = 0;
    ix_result ir = {0, 0, 0};
    if (c->csa) {
        const bcu_indexer_args ia = {.index_heads = c->IH, .index_dim = c->ID, .ratio = c->ratio, .topk = c->topk,
                                     .key_off = h.key_off, .iq = h.d_iq, .iw = h.d_iw, .sel = h.d_sel,
                                     .nsel = h.d_nsel};
        cudaError_t r = bcu_indexer_topk(&h.ws, &b, &ia, h.st, err, sizeof err);
        if (r != cudaSuccess) fail_msg("%s: bcu_indexer_topk: %s %s", c->name, cudaGetErrorString(r), err);
        CK(cudaStreamSynchronize(h.st));
        sel = malloc((size_t)h.ntok * c->topk * sizeof *sel);
        nsel = malloc((size_t)h.ntok * sizeof *nsel);
        CK(cudaMemcpy(sel, h.d_sel, (size_t)h.ntok * c->topk * sizeof *sel, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(nsel, h.d_nsel, (size_t)h.ntok * sizeof *nsel, cudaMemcpyDeviceToHost));
        size_t ks = 0;
        const uint32_t *dkeys = bcu_attn_ws_index_keys(&h.ws, &ks);
        assert_non_null(dkeys);
        uint32_t *keys = malloc((size_t)h.ntok * ks * sizeof *keys + 4);
        CK(cudaMemcpy(keys, dkeys, (size_t)h.ntok * ks * sizeof *keys, cudaMemcpyDeviceToHost));
        ir = check_indexer(&h, sel, nsel, keys, ks, 1);
        bad += ir.bad;
        /* the 16-key and the 64-key tiles of the fp32 scores: the same bits, whichever the call picked */
        for (int tile = 16; tile <= 64; tile *= 4) {
            bcu_indexer_args it = ia;
            it.tile = tile;
            cudaError_t rt = bcu_indexer_topk(&h.ws, &b, &it, h.st, err, sizeof err);
            if (rt != cudaSuccess) fail_msg("%s: bcu_indexer_topk (tile %d): %s %s", c->name, tile, cudaGetErrorString(rt), err);
            CK(cudaStreamSynchronize(h.st));
            uint32_t *kt = malloc((size_t)h.ntok * ks * sizeof *kt + 4);
            CK(cudaMemcpy(kt, dkeys, (size_t)h.ntok * ks * sizeof *kt, cudaMemcpyDeviceToHost));
            int differ = 0;
            for (int row = 0; row < h.ntok; row++) {
                const int s = seq_of(&h, row);
                int64_t nv = (c->s[s].p0 + (row - h.row0[s]) + 1) / c->ratio;
                if (nv > (int64_t)ks) nv = (int64_t)ks;
                for (int64_t e = 0; e < nv; e++) differ += kt[(size_t)row * ks + e] != keys[(size_t)row * ks + e];
            }
            free(kt);
            if (differ) fail_msg("%s: indexer scores with %d-key tiles: %d differ from the automatic call's", c->name, tile, differ);
        }
        if (controls && !ir.bad) {
            /* a swapped index must be caught: replace the first chosen entry
             * of the first row with more than topk visible by one left out */
            for (int row = 0; row < h.ntok; row++) {
                if (nsel[row] < c->topk) continue;
                int32_t *g = sel + (size_t)row * c->topk;
                int32_t out_idx = -1;
                for (int32_t e = 0, j = 0; e <= g[c->topk - 1] + 1 && out_idx < 0; e++) {
                    while (j < c->topk && g[j] < e) j++;
                    if (j == c->topk || g[j] != e) out_idx = e;
                }
                const int32_t keep = g[0];
                g[0] = out_idx;
                qsort(g, (size_t)c->topk, sizeof *g, cmp_i32);
                ix_result neg = check_indexer(&h, sel, nsel, keys, ks, 0);
                if (!neg.bad) fail_msg("%s: the indexer check accepted a swapped index", c->name);
                /* undo */
                for (int j = 0; j < c->topk; j++)
                    if (g[j] == out_idx) g[j] = keep;
                qsort(g, (size_t)c->topk, sizeof *g, cmp_i32);
                printf("  negative control: a swapped index is rejected (%d failures)\n", neg.bad);
                break;
            }
        }
        free(keys);
        /* attention reads the selection; it must be in range to go on */
        if (ir.bad) {
            for (int row = 0; row < h.ntok; row++) {
                const int s = seq_of(&h, row);
                const int64_t nv = (c->s[s].p0 + (row - h.row0[s]) + 1) / c->ratio;
                if (nsel[row] < 0 || nsel[row] > c->topk || nsel[row] > nv)
                    fail_msg("%s: nsel[%d] = %d is unusable; attention not checked", c->name, row, nsel[row]);
                for (int j = 0; j < nsel[row]; j++)
                    if (sel[(size_t)row * c->topk + j] < 0 || sel[(size_t)row * c->topk + j] >= nv)
                        fail_msg("%s: sel[%d][%d] = %d is unusable; attention not checked", c->name, row, j,
                                 sel[(size_t)row * c->topk + j]);
            }
        }
    }
    const size_t nout = (size_t)h.ntok * c->H * c->d;
    const bcu_attention_args aa = {.n_heads = c->H, .head_dim = c->d, .rope_dim = c->rd, .window = c->W,
                                   .ratio = c->ratio, .csa = c->csa, .ent_off = h.ent_off, .q = h.d_q,
                                   .sink = h.d_sink, .inv_freq = h.d_inv, .sel = h.d_sel, .nsel = h.d_nsel,
                                   .topk = c->topk, .out = h.d_out};
    float *out = malloc(nout * sizeof *out), *out2 = malloc(nout * sizeof *out2);
    for (int rep = 0; rep < 2; rep++) attn_run(&h, &b, &aa, rep ? out2 : out, "");
    double worst = 0;
    const int abad = check_attn(&h, out, sel, nsel, 1, &worst);
    bad += abad;
    if (memcmp(out, out2, nout * sizeof(float))) {
        printf("  FAIL %s: a second run differs\n", c->name);
        bad++;
    }
    /* the fp32 kernel's two block shapes (2 or 8 warps, a quad of heads each) do every head's operations in the
     * same order: each must give the automatic choice's bits; any other count is refused */
    for (int nw = 2; nw <= 8; nw += 6) {
        bcu_attention_args an = aa;
        an.warps = nw;
        CK(cudaMemsetAsync(h.d_out, 0xff, nout * sizeof(float), h.st));
        cudaError_t r = bcu_attention(&h.ws, &b, &an, h.st, err, sizeof err);
        if (r != cudaSuccess) fail_msg("%s: bcu_attention (%d warps): %s %s", c->name, nw, cudaGetErrorString(r), err);
        CK(cudaStreamSynchronize(h.st));
        CK(cudaMemcpy(out2, h.d_out, nout * sizeof(float), cudaMemcpyDeviceToHost));
        if (memcmp(out, out2, nout * sizeof(float))) {
            size_t nd = 0;
            for (size_t i = 0; i < nout; i++) nd += memcmp(&out[i], &out2[i], sizeof(float)) != 0;
            printf("  FAIL %s: %d warps a block: %zu of %zu outputs differ from the automatic shape\n", c->name, nw,
                   nd, nout);
            bad++;
        }
    }
    {
        bcu_attention_args an = aa;
        an.warps = 4;
        if (bcu_attention(&h.ws, &b, &an, h.st, err, sizeof err) == cudaSuccess)
            fail_msg("%s: 4 warps a block was accepted", c->name);
    }
    /* a decode batch (every sequence one row, its window W - 1 keys back): the same rows with the window keys in
     * rings (bcu_attn_seq.kring, as the backend's device rings hold them: position p at row p % W, the rows the
     * window does not reach NaN) and the new key apart (knew).  The same bits, and each ring then holds its new
     * key at row p0 % W. */
    int ringable = 1;
    for (int s = 0; s < c->nseq; s++)
        ringable &= c->s[s].T == 1 && h.kstart[s] >= c->s[s].p0 - c->W + 1 && c->d % 4 == 0;
    /* mode 2: x3 (fp8kv, rd 64), 1: bf16 (d 512), 0: fp32, last: out keeps its rows for the controls */
    for (int mode = 2; ringable && mode >= 0; mode--) {
        if ((mode == 2 && !(c->fp8kv && c->rd == 64)) || (mode == 1 && c->d != 512)) continue;
        bcu_attn_seq rs[MAX_SEQ];
        float *dring[MAX_SEQ];
        float *ring = malloc((size_t)c->W * c->d * sizeof(float));
        for (int s = 0; s < c->nseq; s++) {
            const int64_t p0 = c->s[s].p0;
            for (size_t i = 0; i < (size_t)c->W * c->d; i++) ring[i] = NAN;
            for (int64_t p = h.kstart[s]; p < p0; p++)
                memcpy(ring + (size_t)(p % c->W) * c->d, h.kwin[s] + (size_t)(p - h.kstart[s]) * c->d,
                       (size_t)c->d * sizeof(float));
            dring[s] = upload(ring, (size_t)c->W * c->d * sizeof(float));
            CK(cudaMemcpy(&rs[s], h.d_seqs + s, sizeof rs[s], cudaMemcpyDeviceToHost));
            rs[s].kwin = NULL;
            rs[s].kring = dring[s];
            rs[s].knew = h.d_kwin[s] + (size_t)(p0 - h.kstart[s]) * c->d;
        }
        bcu_attn_seq *drs = upload(rs, (size_t)c->nseq * sizeof *rs);
        bcu_attn_batch br = b;
        br.seqs = drs;
        bcu_attention_args ar = aa;
        ar.bf16 = mode == 1;
        ar.x3 = mode == 2 ? 2 : 0;
        CK(cudaMemsetAsync(h.d_out, 0xff, nout * sizeof(float), h.st));
        cudaError_t r = bcu_attention(&h.ws, &b, &ar, h.st, err, sizeof err); /* the window from kwin */
        if (r != cudaSuccess) fail_msg("%s: bcu_attention: %s %s", c->name, cudaGetErrorString(r), err);
        CK(cudaStreamSynchronize(h.st));
        CK(cudaMemcpy(out, h.d_out, nout * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaMemsetAsync(h.d_out, 0xff, nout * sizeof(float), h.st));
        r = bcu_attention(&h.ws, &br, &ar, h.st, err, sizeof err);
        if (r != cudaSuccess) fail_msg("%s: bcu_attention (rings): %s %s", c->name, cudaGetErrorString(r), err);
        CK(cudaStreamSynchronize(h.st));
        CK(cudaMemcpy(out2, h.d_out, nout * sizeof(float), cudaMemcpyDeviceToHost));
        size_t nd = 0;
        for (size_t i = 0; i < nout; i++) nd += memcmp(&out[i], &out2[i], sizeof(float)) != 0;
        int rbad = 0;
        for (int s = 0; s < c->nseq; s++) {
            CK(cudaMemcpy(ring, dring[s], (size_t)c->W * c->d * sizeof(float), cudaMemcpyDeviceToHost));
            const int64_t p0 = c->s[s].p0;
            rbad += memcmp(ring + (size_t)(p0 % c->W) * c->d, h.kwin[s] + (size_t)(p0 - h.kstart[s]) * c->d,
                           (size_t)c->d * sizeof(float)) != 0;
            CK(cudaFree(dring[s]));
        }
        CK(cudaFree(drs));
        free(ring);
        printf("  %-26s rings%s: %zu of %zu outputs differ from the window's, %d of %d rings lack the new key\n",
               c->name, mode == 2 ? " (x3)" : mode ? " (bf16 tensor cores)" : "", nd, nout, rbad, c->nseq);
        if (nd || rbad) {
            printf("  FAIL %s: the rings' attention\n", c->name);
            bad++;
        }
    }
    if (controls && !abad) {
        /* a 1e-4 relative error in one channel must be caught */
        size_t at = nout / 2;
        const float keep = out[at];
        out[at] += (float)(1e-4 * (fabs(keep) + 0.1));
        double w2 = 0;
        const int neg = check_attn(&h, out, sel, nsel, 0, &w2);
        out[at] = keep;
        if (!neg) fail_msg("%s: the attention check accepted a perturbed output", c->name);
        printf("  negative control: a perturbed output is rejected (rel %.2g)\n", w2);
    }
    /* head_dim 512: the bf16 tensor-core kernel on the same rows, twice (deterministic too) */
    double worst16 = -1;
    if (c->d == 512) {
        bcu_attention_args a16 = aa;
        a16.bf16 = 1;
        for (int rep = 0; rep < 2; rep++) attn_run(&h, &b, &a16, rep ? out2 : out, " (bf16)");
        attn_tol = ATTN_TOL_BF16;
        bad += check_attn(&h, out, sel, nsel, 1, &worst16);
        attn_tol = ATTN_TOL;
        if (memcmp(out, out2, nout * sizeof(float))) {
            printf("  FAIL %s (bf16): a second run differs\n", c->name);
            bad++;
        }
    }
    /* keys on the FP8 grid, rope_dim 64: the three-plane tensor-core kernel (x3 = 2, forced) on the same rows, twice:
     * the fp32 kernel's bound against the double reference, the same bits again, and it is the kernel that ran.
     * Then x3 = 1 (automatic): it runs where the rows' 32-head blocks fill half the GPU, the fp32 kernel elsewhere. */
    double worstx3 = -1;
    if (c->fp8kv && c->rd == 64) {
        bcu_attention_args ax = aa;
        ax.x3 = 2;
        size_t x0, o0, x1, o1;
        bcu_attention_launches(&x0, &o0);
        for (int rep = 0; rep < 2; rep++) attn_run(&h, &b, &ax, rep ? out2 : out, " (x3)");
        bcu_attention_launches(&x1, &o1);
        if (x1 - x0 != 2 || o1 != o0) fail_msg("%s: x3 took %zu x3 launches and %zu others for 2 calls", c->name,
                                               x1 - x0, o1 - o0);
        bad += check_attn(&h, out, sel, nsel, 1, &worstx3);
        if (memcmp(out, out2, nout * sizeof(float))) {
            printf("  FAIL %s (x3): a second run differs\n", c->name);
            bad++;
        }
        int sms = 0;
        CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
        const int fills = 2 * h.ntok * ((c->H + 31) / 32) >= sms;
        ax.x3 = 1;
        bcu_attention_launches(&x0, &o0);
        attn_run(&h, &b, &ax, out2, " (x3 auto)");
        bcu_attention_launches(&x1, &o1);
        if (x1 - x0 != (size_t)fills || o1 - o0 != (size_t)!fills)
            fail_msg("%s: x3 = 1 with %d rows x %d heads on %d SMs ran %s", c->name, h.ntok, c->H, sms,
                     x1 - x0 ? "x3" : "the fp32 kernel");
    }
    const int flags = bcu_attn_workspace_flags(&h.ws, 1, h.st);
    if (flags) {
        printf("  FAIL %s: workspace error flags 0x%x\n", c->name, flags);
        bad++;
    }
    printf("  %-26s %2d seq %4d rows: attention max rel err %.2e", c->name, c->nseq, h.ntok, worst);
    if (worst16 >= 0) printf(" (bf16 tensor cores %.2e, bound %.0e)", worst16, ATTN_TOL_BF16);
    if (worstx3 >= 0) printf(" (x3 %.2e)", worstx3);
    if (c->csa)
        printf(", indexer scores max err %.1e of magnitude, top-k %s%s", ir.worst_score,
               ir.bad ? "FAILED" : "identical", ir.near_flips ? " up to near-ties" : "");
    if (ir.near_flips) printf(" (%d)", ir.near_flips);
    printf("\n");
    /* the indexer on bf16 tensor cores (index_dim a multiple of 16): the same checks, scores to the bf16 bound (exact
     * on dyadic data); after attention, which read the fp32 kernel's selection */
    if (c->csa && c->ID % 16 == 0) {
        bcu_indexer_args ia = {.index_heads = c->IH, .index_dim = c->ID, .ratio = c->ratio, .topk = c->topk,
                               .key_off = h.key_off, .iq = h.d_iq, .iw = h.d_iw, .sel = h.d_sel, .nsel = h.d_nsel,
                               .bf16 = 1};
        cudaError_t r = bcu_indexer_topk(&h.ws, &b, &ia, h.st, err, sizeof err);
        if (r != cudaSuccess) fail_msg("%s: bcu_indexer_topk (bf16): %s %s", c->name, cudaGetErrorString(r), err);
        CK(cudaStreamSynchronize(h.st));
        CK(cudaMemcpy(sel, h.d_sel, (size_t)h.ntok * c->topk * sizeof *sel, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(nsel, h.d_nsel, (size_t)h.ntok * sizeof *nsel, cudaMemcpyDeviceToHost));
        size_t ks = 0;
        const uint32_t *dkeys = bcu_attn_ws_index_keys(&h.ws, &ks);
        uint32_t *keys = malloc((size_t)h.ntok * ks * sizeof *keys + 4);
        CK(cudaMemcpy(keys, dkeys, (size_t)h.ntok * ks * sizeof *keys, cudaMemcpyDeviceToHost));
        score_tol = SCORE_TOL_BF16;
        const ix_result ib = check_indexer(&h, sel, nsel, keys, ks, 1);
        score_tol = SCORE_TOL;
        free(keys);
        printf("  %-26s indexer on bf16 tensor cores: scores max err %.1e of magnitude (bound %.0e), top-k %s%s",
               c->name, ib.worst_score, SCORE_TOL_BF16, ib.bad ? "FAILED" : "identical",
               ib.near_flips ? " up to near-ties" : "");
        if (ib.near_flips) printf(" (%d)", ib.near_flips);
        printf("\n");
        if (ib.bad) fail_msg("%s: the bf16 indexer: %d failures", c->name, ib.bad);
    }
    free(out);
    free(out2);
    free(sel);
    free(nsel);
    teardown(&h);
    if (bad) fail_msg("%s: %d failures", c->name, bad);
}

/* ------------------------------------------------------------------ the cases */

/* small: 40 heads (two groups, the second partial), d 128, W 16; indexer 6
 * heads x 20 (padding inside the 4-head quads), top-8 (groups of 32) */
#define SMALL 40, 128, 64, 16

static void test_small_window_only(void **st)
{
    (void)st;
    const tcase c = {"small window only", SMALL, 0, 0, 0, 0, 0, D_RANDOM, 2.0f, 5,
                     {{0, 1, 0}, {0, 7, 0}, {5, 64, 0}, {100, 1, 0}, {30, 7, 28}}, 1};
    run_case(&c, 1);
}

static void test_small_csa(void **st)
{
    (void)st;
    const tcase t1 = {"small csa T1 ties", SMALL, 4, 1, 6, 20, 8, D_TIES, 2.0f, 7,
                      {{0, 1, 0}, {3, 1, 0}, {20, 1, 0}, {31, 1, 0}, {35, 1, 0}, {500, 1, 0}, {1000, 1, 995}}, 1};
    run_case(&t1, 1);
    const tcase t7 = {"small csa T7 dyadic", SMALL, 4, 1, 6, 20, 8, D_DYADIC, 2.0f, 3,
                      {{25, 7, 0}, {300, 7, 0}, {127, 7, 0}}, 0};
    run_case(&t7, 0);
    const tcase t64 = {"small csa T64 ties", SMALL, 4, 1, 6, 20, 8, D_TIES, 2.0f, 3,
                       {{0, 64, 0}, {700, 64, 0}, {640, 64, 600}}, 0};
    run_case(&t64, 0);
    const tcase rnd64 = {"small csa T64 random", SMALL, 4, 1, 6, 20, 8, D_RANDOM, 2.0f, 2, {{900, 64, 0}, {60, 7, 0}}, 0};
    run_case(&rnd64, 0);
    const tcase eq = {"small csa equal keys", SMALL, 4, 1, 6, 20, 8, D_EQUAL, 2.0f, 2, {{400, 7, 0}, {90, 1, 0}}, 0};
    run_case(&eq, 0);
    const tcase sink = {"small csa big sinks", SMALL, 4, 1, 6, 20, 8, D_TIES, 8.0f, 1, {{200, 7, 0}}, 0};
    run_case(&sink, 0);
}

static void test_small_hca(void **st)
{
    (void)st;
    const tcase c = {"small hca ratio 16", SMALL, 16, 0, 0, 0, 0, D_RANDOM, 2.0f, 4,
                     {{0, 64, 0}, {400, 7, 0}, {2000, 1, 0}, {1200, 7, 1190}}, 1};
    run_case(&c, 0);
    const tcase c2 = {"small hca ratio 128", SMALL, 128, 0, 0, 0, 0, D_RANDOM, 2.0f, 2, {{1000, 64, 0}, {300, 1, 0}}, 0};
    run_case(&c2, 0);
}

static void test_small_other_dims(void **st)
{
    (void)st;
    const tcase c = {"d256 h3 csa", 3, 256, 64, 16, 4, 1, 64, 8, 8, D_TIES, 2.0f, 2, {{200, 7, 0}, {33, 1, 0}}, 1};
    run_case(&c, 0);
    const tcase c2 = {"d384 h33 hca", 33, 384, 32, 8, 8, 0, 0, 0, 0, D_RANDOM, 2.0f, 2, {{150, 7, 0}, {9, 1, 0}}, 0};
    run_case(&c2, 0);
}

/* V4-Flash: 64 heads x 512, rope 64, W 128; CSA ratio 4 with 64 x 128 index
 * heads and top-512 (groups of 2048); HCA ratio 128 */
#define V4 64, 512, 64, 128
#define V4CSA 4, 1, 64, 128, 512

static void test_v4_window_only(void **st)
{
    (void)st;
    const tcase c = {"v4 window only", V4, 0, 0, 0, 0, 0, D_RANDOM, 2.0f, 4,
                     {{0, 64, 0}, {1000, 7, 0}, {5000, 1, 0}, {3000, 7, 2995}}, 1};
    run_case(&c, 1);
    /* more rows than SMs: one split a row, which the bf16 kernel finishes itself (no merge) */
    const tcase p = {"v4 window only 256 rows", V4, 0, 0, 0, 0, 0, D_RANDOM, 2.0f, 2, {{90, 200, 0}, {7000, 56, 0}}, 1};
    run_case(&p, 0);
}

static void test_v4_csa(void **st)
{
    (void)st;
    const tcase dec = {"v4 csa decode batch 8", V4, V4CSA, D_TIES, 2.0f, 8,
                       {{100, 1, 0}, {2047, 1, 0}, {2048, 1, 0}, {2051, 1, 0}, {9000, 1, 0}, {20000, 1, 0},
                        {40000, 1, 0}, {3000, 1, 2950}}, 1};
    run_case(&dec, 1);
    const tcase t7 = {"v4 csa T7", V4, V4CSA, D_TIES, 2.0f, 3, {{1500, 7, 0}, {8190, 7, 0}, {0, 7, 0}}, 0};
    run_case(&t7, 0);
    const tcase t64 = {"v4 csa T64 random", V4, V4CSA, D_RANDOM, 2.0f, 1, {{2000, 64, 0}}, 0};
    run_case(&t64, 0);
    const tcase t160 = {"v4 csa T160 random", V4, V4CSA, D_RANDOM, 2.0f, 1, {{2100, 160, 0}}, 1};
    run_case(&t160, 0);
    const tcase rep = {"v4 csa replay", V4, V4CSA, D_DYADIC, 2.0f, 2, {{6000, 7, 5990}, {6200, 1, 6100}}, 0};
    run_case(&rep, 0);
    const tcase eq = {"v4 csa equal keys", V4, V4CSA, D_EQUAL, 2.0f, 1, {{12000, 1, 0}}, 0};
    run_case(&eq, 0);
}

static void test_v4_csa_128k(void **st)
{
    (void)st;
    const tcase c = {"v4 csa 128K", V4, V4CSA, D_TIES, 2.0f, 2, {{131071, 1, 0}, {65000, 1, 0}}, 0};
    run_case(&c, 0);
    const tcase r = {"v4 csa 128K random", V4, V4CSA, D_RANDOM, 2.0f, 1, {{131000, 1, 0}}, 1};
    run_case(&r, 0);
}

static void test_v4_hca(void **st)
{
    (void)st;
    const tcase c = {"v4 hca", V4, 128, 0, 0, 0, 0, D_RANDOM, 2.0f, 5,
                     {{1000, 64, 0}, {5000, 7, 0}, {130000, 1, 0}, {4000, 1, 3990}, {100, 1, 0}}, 1};
    run_case(&c, 0);
}

static void test_v4_mixed_batch(void **st)
{
    (void)st;
    const tcase c = {"v4 csa mixed batch", V4, V4CSA, D_TIES, 2.0f, 4,
                     {{3000, 7, 0}, {50, 1, 0}, {7000, 1, 0}, {0, 1, 0}}, 1};
    run_case(&c, 0);
}

/* argument checks give a reason */
static void test_bad_arguments(void **st)
{
    (void)st;
    bcu_attn_ws ws = {.mem = NULL, .lim = {.max_rows = 4, .max_len = 1000, .n_heads = 8, .head_dim = 128}};
    CK(cudaMalloc(&ws.mem, bcu_attn_workspace_bytes(&ws.lim)));
    const bcu_attn_batch b = {.seqs = (const bcu_attn_seq *)ws.mem, .nseq = 1, .ntok = 1, .max_len = 10};
    float *dummy = ws.mem;
    bcu_attention_args a = {.n_heads = 8, .head_dim = 96, .rope_dim = 64, .window = 16, .q = dummy, .sink = dummy,
                            .inv_freq = dummy, .out = dummy};
    char err[256] = "";
    assert_int_equal(bcu_attention(&ws, &b, &a, 0, err, sizeof err), cudaErrorInvalidValue);
    printf("  head_dim 96: %s\n", err);
    a.head_dim = 128;
    a.ratio = 3;
    assert_int_equal(bcu_attention(&ws, &b, &a, 0, err, sizeof err), cudaErrorInvalidValue);
    printf("  ratio 3: %s\n", err);
    a.ratio = 4;
    a.csa = 1;
    assert_int_equal(bcu_attention(&ws, &b, &a, 0, err, sizeof err), cudaErrorInvalidValue);
    printf("  csa without sel: %s\n", err);
    bcu_indexer_args ia = {.index_heads = 8, .index_dim = 128, .ratio = 4, .topk = 512, .iq = dummy, .iw = dummy,
                           .sel = (int32_t *)dummy, .nsel = (int32_t *)dummy};
    assert_int_equal(bcu_indexer_topk(&ws, &b, &ia, 0, err, sizeof err), cudaErrorInvalidValue);
    printf("  indexer on a workspace without one: %s\n", err);
    CK(cudaFree(ws.mem));
}

int main(void)
{
    const char *filter = getenv("TEST_CUDA_ATTN_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest cpu[] = {
        cmocka_unit_test(test_select_emulation),
    };
    const int cpu_fail = cmocka_run_group_tests_name("cpu", cpu, NULL, NULL);
    if (!cuda_device_present()) return cpu_fail ? 1 : 77;
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_small_window_only),
        cmocka_unit_test(test_small_csa),
        cmocka_unit_test(test_small_hca),
        cmocka_unit_test(test_small_other_dims),
        cmocka_unit_test(test_v4_window_only),
        cmocka_unit_test(test_v4_csa),
        cmocka_unit_test(test_v4_csa_128k),
        cmocka_unit_test(test_v4_hca),
        cmocka_unit_test(test_v4_mixed_batch),
    };
    const int gpu_fail = cmocka_run_group_tests_name("gpu", gpu, NULL, NULL);
    return cpu_fail || gpu_fail ? 1 : 0;
}
