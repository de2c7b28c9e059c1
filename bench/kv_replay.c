/* kv_replay.c - what a prefix-cache hit costs, and what bounded replay does
 * to the logits.
 *
 * Per model: a prompt of P+1 tokens whose first P (a multiple of 128) are
 * cached.  The exact path prefills all P+1 tokens and decodes 63 greedy
 * tokens (64 logit rows).  Each replay path attaches the first P/128 blocks
 * of that state without the window state (md_seq_attach, replay R), feeds the
 * last R prefix tokens, the last prompt token and the same 63 tokens, and is
 * compared row by row: max |logit difference|, mean KL(exact || replay) of
 * the softmaxes, and how often the argmax agrees.  R at least the dependency
 * cone W + (L-1)(W-1) is exact by construction (printed as such).
 *
 * Cost: for each prefix length, the time of a hit (attach the blocks +
 * replay R + the last prompt token) beside a full prefill of the same
 * prompt measured in the same run, as a ratio.
 *
 *   bench_kv_replay [--prefix P] [--cost 1024,32768] [--cost-model DIR] DIR...
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/v4.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t *ids_for(size_t n, int vocab, uint64_t seed)
{
    int32_t *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
    return v;
}

static void die(const char *what, const rc_err *e)
{
    fprintf(stderr, "bench_kv_replay: %s: %s\n", what, e->msg);
    exit(1);
}

static void fwd(md_model *m, md_seq *s, const int32_t *ids, size_t n, float *last)
{
    rc_err err = {0};
    md_segment seg = {.seq = s, .ids = ids, .n = n, .logits = last};
    /* long prefills in chunks, as the engine runs them */
    for (size_t a = 0; a < n;) {
        size_t c = n - a < 2048 ? n - a : 2048;
        seg.ids = ids + a;
        seg.n = c;
        seg.logits = a + c == n ? last : NULL;
        if (md_forward(m, &seg, 1, &err)) die("forward", &err);
        a += c;
    }
}

static int argmax(const float *x, size_t n)
{
    size_t b = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int)b;
}

/* KL(p || q) of softmax(a), softmax(b) */
static double kl(const float *a, const float *b, size_t n)
{
    double ma = -INFINITY, mb = -INFINITY, za = 0, zb = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        ma = fmax(ma, a[i]);
        mb = fmax(mb, b[i]);
    }
    for (size_t i = 0; i < n; i++) {
        za += exp(a[i] - ma);
        zb += exp(b[i] - mb);
    }
    for (size_t i = 0; i < n; i++) {
        double la = a[i] - ma - log(za), lb = b[i] - mb - log(zb);
        k += exp(la) * (la - lb);
    }
    return k;
}

enum { CONT = 64 };

static md_model *load(const char *dir, be_backend **be)
{
    md_model *m = NULL;
    rc_err err = {0};
    *be = be_cpu_create((int)sysconf(_SC_NPROCESSORS_ONLN));
    if (md_model_load(dir, *be, MD_SEM_OFFICIAL, NULL, NULL, &m, &err)) die(dir, &err);
    return m;
}

static void divergence(const char *dir, size_t P)
{
    be_backend *be;
    md_model *m = load(dir, &be);
    rc_err err = {0};
    const md_config *c = md_model_config(m);
    const size_t V = (size_t)c->vocab_size;
    const int cone = c->window + (c->n_layers - 1) * (c->window - 1);
    int32_t *ids = ids_for(P + CONT, c->vocab_size, 99);
    float *ex = malloc(CONT * V * sizeof(float)), *rp = malloc(CONT * V * sizeof(float));

    /* exact: prefill P+1, then 63 greedy tokens (they become the shared continuation) */
    md_seq *a = md_seq_create(m);
    fwd(m, a, ids, P + 1, ex);
    for (size_t k = 1; k < CONT; k++) {
        ids[P + k] = argmax(ex + (k - 1) * V, V);
        fwd(m, a, ids + P + k, 1, ex + k * V);
    }
    const size_t nb = P / MD_BLOCK_TOKENS;
    md_block **blk = malloc(nb * sizeof *blk);
    for (size_t k = 0; k < nb; k++) blk[k] = md_seq_block(a, k);

    const int cand[] = {16, 32, 64, 128, 256, 512, cone};
    int reps[8], nr = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        const int R = cand[i];
        if (R < c->window || (size_t)R > P || R > cone || (nr && reps[nr - 1] >= R)) continue;
        reps[nr++] = R;
    }
    printf("| %s (L %d, W %d, cone %d) | P %zu |", dir, c->n_layers, c->window, cone, P);
    printf("\n\n| replay R | max abs diff | mean KL | max KL | top-1 agree |\n|---:|---:|---:|---:|---:|\n");
    for (int ri = 0; ri < nr; ri++) {
        const int R = reps[ri];
        md_seq *r = md_seq_create(m);
        if (md_seq_attach(r, blk, nb, NULL, 0, R, &err)) die("attach", &err);
        fwd(m, r, ids + P - (size_t)R, (size_t)R + 1, rp);
        for (size_t k = 1; k < CONT; k++) fwd(m, r, ids + P + k, 1, rp + k * V);
        double mx = 0, skl = 0, mkl = 0;
        int agree = 0;
        for (size_t k = 0; k < CONT; k++) {
            for (size_t v = 0; v < V; v++) mx = fmax(mx, fabs((double)ex[k * V + v] - rp[k * V + v]));
            double d = kl(ex + k * V, rp + k * V, V);
            skl += d;
            mkl = fmax(mkl, d);
            agree += argmax(ex + k * V, V) == argmax(rp + k * V, V);
        }
        printf("| %d%s | %.3g | %.3g | %.3g | %d/%d |\n", R, R >= cone ? " (>= cone)" : "", mx, skl / CONT, mkl, agree,
               CONT);
        md_seq_free(r);
    }
    printf("\n");
    fflush(stdout);
    free(blk);
    md_seq_free(a);
    free(ids);
    free(ex);
    free(rp);
    md_model_free(m);
    be_destroy(be);
}

static void cost(const char *dir, const size_t *plist, size_t np)
{
    be_backend *be;
    md_model *m = load(dir, &be);
    rc_err err = {0};
    const md_config *c = md_model_config(m);
    const size_t V = (size_t)c->vocab_size;
    float *lg = malloc(V * sizeof(float));
    const int R = 128 > c->window ? 128 : c->window;
    printf("hit cost, %s (replay %d tokens + the last prompt token):\n\n", dir, R);
    printf("| prefix tokens | full prefill (ms) | hit, window state (ms) | hit, replay (ms) | replay / prefill |\n"
           "|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < np; i++) {
        const size_t P = plist[i] / MD_BLOCK_TOKENS * MD_BLOCK_TOKENS, nb = P / MD_BLOCK_TOKENS;
        int32_t *ids = ids_for(P + 1, c->vocab_size, 7 + i);
        md_seq *a = md_seq_create(m);
        size_t bl = md_seq_boundary_size(m);
        uint8_t *bnd = malloc(bl);
        double t0 = now();
        fwd(m, a, ids, P, NULL);
        double t_mid = now();
        if (md_seq_boundary_save(a, bnd, bl, &err)) die("boundary", &err);  /* what the cache would hold */
        double t_save = now() - t_mid;
        fwd(m, a, ids + P, 1, lg);
        double t_full = now() - t0 - t_save;
        md_block **blk = malloc(nb * sizeof *blk);
        for (size_t k = 0; k < nb; k++) blk[k] = md_seq_block(a, k);
        double te = 1e9, tr = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            md_seq *x = md_seq_create(m);
            t0 = now();
            if (md_seq_attach(x, blk, nb, bnd, bl, 0, &err)) die("attach", &err);
            fwd(m, x, ids + P, 1, lg);
            te = fmin(te, now() - t0);
            md_seq_free(x);
            x = md_seq_create(m);
            t0 = now();
            if (md_seq_attach(x, blk, nb, NULL, 0, R, &err)) die("attach", &err);
            fwd(m, x, ids + P - (size_t)R, (size_t)R + 1, lg);
            tr = fmin(tr, now() - t0);
            md_seq_free(x);
        }
        printf("| %zu | %.1f | %.2f | %.2f | %.4f |\n", P, t_full * 1e3, te * 1e3, tr * 1e3, tr / t_full);
        fflush(stdout);
        free(bnd);
        free(blk);
        md_seq_free(a);
        free(ids);
    }
    printf("\n");
    free(lg);
    md_model_free(m);
    be_destroy(be);
}

int main(int argc, char **argv)
{
    size_t P = 512, plist[8] = {1024, 32768}, np = 2;
    const char *cost_model = NULL;
    int nd = 0;
    const char *dirs[32];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prefix") && i + 1 < argc) P = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--cost-model") && i + 1 < argc) cost_model = argv[++i];
        else if (!strcmp(argv[i], "--cost") && i + 1 < argc) {
            np = 0;
            for (char *s = argv[++i]; *s && np < 8; s++) {
                plist[np++] = strtoul(s, &s, 10);
                if (!*s) break;
            }
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_kv_replay [--prefix P] [--cost N,N] [--cost-model DIR] DIR...\n");
            return 2;
        } else if (nd < 32) dirs[nd++] = argv[i];
    }
    if (P < MD_BLOCK_TOKENS || P % MD_BLOCK_TOKENS) {
        fprintf(stderr, "bench_kv_replay: --prefix must be a positive multiple of %d\n", MD_BLOCK_TOKENS);
        return 2;
    }
    printf("bounded replay vs exact continuation (%d rows: the last prompt token + 63 greedy tokens)\n\n", CONT);
    for (int i = 0; i < nd; i++) divergence(dirs[i], P);
    if (cost_model) cost(cost_model, plist, np);
    return 0;
}
