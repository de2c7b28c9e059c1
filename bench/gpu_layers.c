/* gpu_layers.c - bench_gpu_layers: the V4 forward pass on the CUDA backend,
 * layer by layer, on a V4-Flash slice, beside its roofline floors and beside
 * transformers' eager forward of the same slice.
 *
 *   deepinfer make-tiny-model DIR --preset v4-flash [--layers N]
 *   bench_gpu_layers DIR [--hf HF.json] [--out FILE] [--batches 1,8,64,256]
 *                    [--contexts 4096,32768,131072] [--prefill 4096,16384]
 *                    [--reps 8] [--budget-s 420] [--semantics official]
 *
 * What is timed: md_forward, the graph the server runs, with the CUDA
 * backend (DEEPINFER_CUDA_MATH, default bf16x3).  The model's layer hook
 * (md_model_set_layer_hook) synchronises the device and reads the clock as
 * each layer starts, after its attention half (mHC pre + norm + attention +
 * mHC post) and after its FFN half, so each layer's time is wall time of
 * everything the step does for that layer, host work included.  A table row
 * is the mean over the slice's layers of one kind (SWA, CSA ratio 4, HCA
 * ratio 128), median over the repetitions.
 *
 * Decode at batch B and context P: P/128 blocks of random compressed entries
 * and indexer keys are attached to a state (md_seq_attach, bounded replay),
 * the last 128 tokens are fed to fill the window, and B clones of that state
 * (sharing its blocks, as the prefix cache shares them; --distinct 1: B
 * states made the same way, each with blocks of its own) each decode one
 * random token per step: warm-up steps (on the GPU three, so that the CUDA
 * graphs are recorded before the clock starts), then --reps timed steps, in
 * each of two modes: with the layer hook (the per-layer table: medians) and
 * without it (the whole-step line: median and mean).  A CSA layer completes
 * a compressed entry every 4th token, and that step does more (the entries
 * made, normed, roped and patched into the attention's blocks): the medians
 * are the steps between, the mean (default --reps 8, two periods) includes
 * them at their share.  An HCA layer's entry (every 128th token) is in the
 * mean only when a timed step completes one.
 * Prefill: T random tokens through one md_forward from an empty state.
 * Before the first case a 512-token forward uploads the weights (the backend
 * uploads at first use) and its time is printed.
 *
 * Floors, per layer, from ceilings measured in this run (a 1 GiB device copy,
 * a cuBLAS bf16 8192^3 GEMM):
 *   bytes  every weight the layer reads at least once (attention, compressor,
 *          indexer, mHC, router, shared expert: checkpoint formats, scales
 *          included) + the routed experts a batch touches, E(1-(1-k/E)^B) of
 *          them under uniform routing (prefill: all E) + per sequence the KV
 *          it reads: the window (128 entries), CSA: P/4 indexer keys and the
 *          top-k entries, HCA: P/128 entries -- as this engine stores them
 *          (fp32; the packed V4 format of model-v4.md §7 is ~5x smaller)
 *   flops  2 x parameters per token (shared + k routed experts) + attention
 *          4 x heads x head_dim x keys + indexer 2 x heads x dim x P/4
 *   floor  max(bytes / copy bandwidth, flops / bf16 peak); "% floor" is
 *          floor / measured.
 * --hf: the JSON of bench/gpu_layers_hf.py (transformers eager, bf16, same
 * config); its per-layer ms per kind sit beside ours with the ratio
 * HF / ours (> 1: we are faster).
 *
 * A second table splits each step by where it goes: the wall time of the
 * backend's ops by class (src/backend/cuda/profile.h; each op is synchronous,
 * so that is its whole cost) and the rest, the graph's own host work.
 *
 * The tables go to stdout and to --out; progress goes to stderr. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/profile.h"
#include "model/v4.h"
#include "model/v4_internal.h"

#define BENCH_NAME "bench_gpu_layers"
#define BENCH_WITH_CUBLAS
#include "backend/cuda/bench_util.h"
#include <cuda_profiler_api.h>

#define MAXL 64
#define MAXREP 16
/* untimed decode steps on the GPU before each timed loop: a region runs eagerly twice, then is recorded */
#define DECODE_WARM 3
#define NKIND 3
static const char *const kind_name[NKIND] = {"SWA", "CSA", "HCA"};



/* ------------------------------------------------------------ the layer clock */

typedef struct {
    double start[MAXL], attn[MAXL], ffn[MAXL], head;
} stamps;

static md_model *M;
static int on_gpu = 1;
 /* 0: --backend cpu, a dry run of the harness without a GPU */

static void sync_dev(void)
{
    if (on_gpu) CK(cudaDeviceSynchronize());
}

static void hook(void *arg, int layer, int part)
{
    stamps *s = arg;
    sync_dev();
    double t = bench_now();
    if (layer >= M->cfg.n_layers) {
        s->head = t;
        return;
    }
    if (part == 0) s->start[layer] = t;
    else if (part == 1) s->attn[layer] = t;
    else s->ffn[layer] = t;
}

/* ------------------------------------------------------------ floors */

static double wbytes(const be_weight *w)
{
    if (!w || !w->data) return 0;
    double n = (double)w->rows * (double)w->cols;
    if (w->fmt == BE_W_DENSE) return n * (double)md_dtype_size(w->dtype);
    double bs = w->block, ss = (double)md_dtype_size(w->scale_dtype);
    if (w->fmt == BE_W_FP8) return n + ceil((double)w->rows / bs) * ceil((double)w->cols / bs) * ss;
    return n / 2 + (double)w->rows * ceil((double)w->cols / bs) * ss;
}

static double wparams(const be_weight *w) { return w && w->data ? (double)w->rows * (double)w->cols : 0; }

typedef struct {
    double fixed_bytes, fixed_params; /* read once per step whatever the batch */
    double expert_bytes, expert_params;
} layer_cost;

static layer_cost cost_of(const md_model *m, int l)
{
    const md_layer *ly = &m->layers[l];
    const md_config *c = &m->cfg;
    const be_weight *fixed[] = {&ly->wq_a, &ly->wq_b, &ly->wkv, &ly->wo_a, &ly->wo_b, &ly->c_wkv, &ly->c_wgate,
                                &ly->i_wq_b, &ly->i_wproj, &ly->i_wkv, &ly->i_wgate, &ly->gate, &ly->sw1, &ly->sw2,
                                &ly->sw3};
    layer_cost k = {0};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        k.fixed_bytes += wbytes(fixed[i]);
        k.fixed_params += wparams(fixed[i]);
    }
    const double n = c->hc_mult, mix = (2 + n) * n;
    k.fixed_bytes += 2 * mix * n * c->hidden_size * 4.0; /* hc_attn_fn, hc_ffn_fn (f32) */
    k.expert_bytes = wbytes(&ly->w1[0]) + wbytes(&ly->w2[0]) + wbytes(&ly->w3[0]);
    k.expert_params = wparams(&ly->w1[0]) + wparams(&ly->w2[0]) + wparams(&ly->w3[0]);
    return k;
}

static int kind_of(const md_model *m, int l)
{
    int r = m->layers[l].ratio;
    return r == 0 ? 0 : m->layers[l].overlap ? 1 : 2;
}

/* keys one query at position p attends to, and indexer entries it scores */
static void keys_at(const md_model *m, int l, double p, double *keys, double *idx)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    double win = fmin(p + 1, (double)c->window), ent = ly->ratio ? floor((p + 1) / ly->ratio) : 0;
    *idx = ly->overlap ? ent : 0;
    *keys = win + (ly->overlap ? fmin(ent, (double)c->index_topk) : ent);
}

static double layer_flops_token(const md_model *m, int l, double p)
{
    const md_config *c = &m->cfg;
    layer_cost k = cost_of(m, l);
    double keys, idx;
    keys_at(m, l, p, &keys, &idx);
    return 2 * (k.fixed_params + c->top_k * k.expert_params) + 4.0 * c->n_heads * c->head_dim * keys +
           2.0 * c->index_heads * c->index_head_dim * idx;
}

static double kv_bytes_seq(const md_model *m, int l, double P)
{
    const md_config *c = &m->cfg;
    double keys, idx;
    keys_at(m, l, P, &keys, &idx);
    return 4.0 * (keys * c->head_dim + idx * c->index_head_dim);
}

static double unique_experts(const md_config *c, double B)
{
    return c->n_experts * (1 - pow(1 - (double)c->top_k / c->n_experts, B));
}

/* ------------------------------------------------------------ results */

typedef struct {
    int prefill; /* 0 decode */
    int B;
    long P; /* decode: context; prefill: tokens */
    int done;
    char skipped[160];
    double ms[NKIND], attn_ms[NKIND], ffn_ms[NKIND], floor_ms[NKIND], bw_ms[NKIND];
    int nkind[NKIND];
    double step_ms, head_ms, reps;
    double arena_mb; /* prefill: the device activation arena after it (MB; NAN on the CPU) */
    double free_ms;   /* decode: median step with no layer hook (no per-layer synchronise) */
    double free_mean_ms; /* and the mean of those steps (a whole number of CSA compression periods: see run_decode) */
    double waits;     /* decode: layers per free step whose state update waited for the device (md_model_state_stats) */
    double prof_reps; /* steps the profile covers */
    double hf_ms[NKIND];
    char hf_skip[160];
    bcu_profile prof; /* the timed repetitions' backend ops (GPU runs) */
} result;

static double med_of(double *v, int n) { return n ? median(v, n) : NAN; }

/* per-layer medians of reps stamps -> per-kind means in r */
static void reduce(const md_model *m, const stamps *st, int nrep, const double *t0, const double *t1, result *r)
{
    const int L = m->cfg.n_layers;
    double a[MAXREP], f[MAXREP];
    memset(r->ms, 0, sizeof r->ms);
    memset(r->attn_ms, 0, sizeof r->attn_ms);
    memset(r->ffn_ms, 0, sizeof r->ffn_ms);
    memset(r->nkind, 0, sizeof r->nkind);
    const char *dump = getenv("BENCH_LAYERS_DUMP"); /* 1: every repetition's per-layer times on stderr */
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < nrep; i++) {
            a[i] = 1e3 * (st[i].attn[l] - st[i].start[l]);
            f[i] = 1e3 * (st[i].ffn[l] - st[i].attn[l]);
        }
        if (dump && *dump == '1') {
            fprintf(stderr, BENCH_NAME ": B=%d P=%ld layer %d attn ms:", r->B, r->P, l);
            for (int i = 0; i < nrep; i++) fprintf(stderr, " %.3f", a[i]);
            fprintf(stderr, " | ffn ms:");
            for (int i = 0; i < nrep; i++) fprintf(stderr, " %.3f", f[i]);
            fprintf(stderr, "\n");
        }
        int k = kind_of(m, l);
        double am = med_of(a, nrep), fm = med_of(f, nrep);
        r->attn_ms[k] += am;
        r->ffn_ms[k] += fm;
        r->ms[k] += am + fm;
        r->nkind[k]++;
    }
    for (int k = 0; k < NKIND; k++)
        if (r->nkind[k]) {
            r->ms[k] /= r->nkind[k];
            r->attn_ms[k] /= r->nkind[k];
            r->ffn_ms[k] /= r->nkind[k];
        }
    double s[MAXREP], h[MAXREP];
    for (int i = 0; i < nrep; i++) {
        s[i] = 1e3 * (t1[i] - t0[i]);
        h[i] = 1e3 * (t1[i] - st[i].head);
    }
    r->step_ms = med_of(s, nrep);
    r->head_ms = med_of(h, nrep);
    r->reps = nrep;
    r->done = 1;
}

static void floors(const md_model *m, double bw, double pk, result *r)
{
    const md_config *c = &m->cfg;
    double fl[NKIND] = {0}, bwm[NKIND] = {0};
    for (int l = 0; l < c->n_layers; l++) {
        layer_cost k = cost_of(m, l);
        double bytes, flops = 0;
        if (r->prefill) {
            bytes = k.fixed_bytes + c->n_experts * k.expert_bytes;
            /* sum over positions 0..T-1 of the per-token FLOPs: exact for the linear terms, the key counts in steps */
            for (long p = 0; p < r->P; p += 64) flops += 64 * layer_flops_token(m, l, (double)p + 32);
        } else {
            bytes = k.fixed_bytes + unique_experts(c, r->B) * k.expert_bytes + r->B * kv_bytes_seq(m, l, (double)r->P);
            flops = r->B * layer_flops_token(m, l, (double)r->P);
        }
        double tb = bytes / bw, tf = flops / pk;
        int kd = kind_of(m, l);
        fl[kd] += 1e3 * fmax(tb, tf);
        bwm[kd] += 1e3 * tb;
    }
    for (int k = 0; k < NKIND; k++) {
        int n = 0;
        for (int l = 0; l < c->n_layers; l++) n += kind_of(m, l) == k;
        r->floor_ms[k] = n ? fl[k] / n : NAN;
        r->bw_ms[k] = n ? bwm[k] / n : NAN;
    }
}

/* ------------------------------------------------------------ cases */

static stamps ST[MAXREP];
static void prof_start(void)
{
    if (on_gpu) bcu_profile_enable(M->be, 1);
}

static void prof_stop(result *r)
{
    if (!on_gpu) return;
    bcu_profile_get(M->be, &r->prof);
    bcu_profile_enable(M->be, 0);
}


static int forward_timed(md_segment *segs, size_t n, stamps *st, double *t0, double *t1)
{
    rc_err err = {0};
    md_model_set_layer_hook(M, hook, st);
    sync_dev();
    *t0 = bench_now();
    int rc = md_forward(M, segs, n, &err);
    sync_dev();
    *t1 = bench_now();
    md_model_set_layer_hook(M, NULL, NULL);
    if (rc) fprintf(stderr, BENCH_NAME ": forward failed: %s\n", err.msg);
    const char *ce = on_gpu ? be_cuda_error(M->be) : NULL;
    if (ce) {
        fprintf(stderr, BENCH_NAME ": %s\n", ce);
        exit(1);
    }
    return rc;
}

static void random_ids(int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % (uint32_t)M->cfg.vocab_size);
}

/* a state at context P: P/128 random blocks attached, the last 128 tokens fed */
static md_seq *state_at(long P)
{
    const size_t nb = (size_t)P / MD_BLOCK_TOKENS, nf = md_block_floats(M);
    md_block **blk = malloc((nb ? nb : 1) * sizeof *blk);
    if (!blk) {
        fprintf(stderr, BENCH_NAME ": out of memory for %zu block pointers\n", nb);
        exit(1);
    }
    for (size_t i = 0; i < nb; i++) {
        blk[i] = md_block_new(M);
        if (!blk[i]) {
            fprintf(stderr, BENCH_NAME ": out of memory for %zu blocks\n", nb);
            exit(1);
        }
        for (size_t j = 0; j < nf; j++) blk[i]->data[j] = (float)((int32_t)rnd()) * (1.0f / 2147483648.0f);
    }
    md_seq *s = md_seq_create(M);
    rc_err err = {0};
    if (!s || md_seq_attach(s, blk, nb, NULL, 0, MD_BLOCK_TOKENS, &err)) {
        fprintf(stderr, BENCH_NAME ": attach: %s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < nb; i++) md_block_unref(M, blk[i]);
    free(blk);
    int32_t ids[MD_BLOCK_TOKENS];
    random_ids(ids, MD_BLOCK_TOKENS);
    md_segment sg = {s, ids, MD_BLOCK_TOKENS, NULL, 0, NULL, NULL};
    if (md_forward(M, &sg, 1, &err)) {
        fprintf(stderr, BENCH_NAME ": filling the window: %s\n", err.msg);
        exit(1);
    }
    return s;
}

/* decode steps ask for the greedy token only (md_segment.top1) instead of the logits: --top1 1 */
static int TOP1;
/* decode steps draw each row's token with temperature 1 and no filters (the API's defaults): on the device where the
 * backend can (md_segment.draw), else from the logits: --draw 1 */
static int DRAW;
static int DISTINCT; /* --distinct 1: each sequence its own context (state_at), not a clone sharing the base's blocks */

static void run_decode(md_seq *base, result *r, int reps)
{
    const int B = r->B, V = M->cfg.vocab_size;
    md_seq **cl = calloc((size_t)B, sizeof *cl);
    md_segment *sg = calloc((size_t)B, sizeof *sg);
    int32_t *ids = malloc((size_t)B * sizeof *ids);
    float *lg = malloc((size_t)B * (size_t)V * sizeof(float));
    rc_draw *dr = calloc((size_t)B, sizeof *dr);
    if (!cl || !sg || !ids || !lg || !dr) {
        snprintf(r->skipped, sizeof r->skipped, "out of host memory");
        goto out;
    }
    for (int b = 0; b < B; b++) {
        if (!(cl[b] = DISTINCT ? state_at(r->P) : md_seq_clone(base))) {
            snprintf(r->skipped, sizeof r->skipped, "out of host memory for %d states", B);
            goto out;
        }
        /* --top1: the greedy token only (what the engine asks for greedy requests), else the logits */
        dr[b] = (rc_draw){.temperature = 1.0, .u01 = (b + 0.5) / B, .token = -1};
        sg[b] = (md_segment){cl[b], &ids[b], 1, TOP1 ? NULL : lg + (size_t)b * V, 0, TOP1 ? &ids[b] : NULL,
                             DRAW && !TOP1 ? &dr[b] : NULL};
    }
    double t0[MAXREP], t1[MAXREP];
    int n = 0;
    /* Untimed steps first, in each of the two modes below (with and without the layer hook, whose regions
     * differ): a region's first runs are eager and the next is recorded as a CUDA graph (docs/CUDA.md), and
     * those steps are several times a replayed one.  With one warm-up the recording step was a timed one. */
    const int warm = on_gpu ? DECODE_WARM : 1;
    for (int i = -warm; i < reps && n < MAXREP; i++) {
        random_ids(ids, (size_t)B);
        stamps st;
        double a, z;
        if (forward_timed(sg, (size_t)B, &st, &a, &z)) {
            snprintf(r->skipped, sizeof r->skipped, "forward failed");
            goto out;
        }
        if (i < 0) {
            if (z - a > 3.0) { /* slow steps (the CPU backend): no more warm-up, one timed repetition */
                reps = 1;
                i = -1;
            }
            continue;
        }
        ST[n] = st;
        t0[n] = a;
        t1[n] = z;
        n++;
    }
    reduce(M, ST, n, t0, t1, r);
    /* the whole step without the per-layer synchronise of the hook, then one profiled step (its ops wait for
     * the device one by one, so it is not timed) */
    {
        double fr[MAXREP];
        int nf = 0;
        /* BENCH_NCU_B=B: the last of these steps at batch B (first context) is the profiler range, for
         * ncu --profile-from-start off (docs/CUDA.md, "Where a decode step goes") */
        const char *nb = getenv("BENCH_NCU_B");
        static int ncu_done;
        const int ncu = on_gpu && nb && atoi(nb) == B && !ncu_done;
        /* BENCH_NCU_REP=i: that repetition (0-based) instead of the last, e.g. a step that completes an entry */
        const char *nr = getenv("BENCH_NCU_REP");
        const int ncu_rep = nr && *nr && atoi(nr) >= 0 && atoi(nr) < reps ? atoi(nr) : reps - 1;
        uint64_t w0, w1;
        md_model_state_stats(M, &w0, NULL);
        for (int i = on_gpu ? -DECODE_WARM : 0; i < reps && nf < MAXREP; i++) {
            random_ids(ids, (size_t)B);
            rc_err err = {0};
            if (i < 0) {
                if (md_forward(M, sg, (size_t)B, &err)) break;
                continue;
            }
            sync_dev();
            if (ncu && i == ncu_rep) CK(cudaProfilerStart());
            double a = bench_now();
            if (md_forward(M, sg, (size_t)B, &err)) break;
            sync_dev();
            fr[nf++] = 1e3 * (bench_now() - a);
            if (ncu && i == ncu_rep) {
                CK(cudaProfilerStop());
                ncu_done = 1;
            }
        }
        const char *dump = getenv("BENCH_LAYERS_DUMP");
        if (dump && *dump == '1') {
            fprintf(stderr, BENCH_NAME ": B=%d P=%ld steps without the hook, ms:", B, r->P);
            for (int i = 0; i < nf; i++) fprintf(stderr, " %.3f", fr[i]);
            fprintf(stderr, "\n");
        }
        double sum = 0;
        for (int i = 0; i < nf; i++) sum += fr[i];
        r->free_mean_ms = nf ? sum / nf : NAN;
        r->free_ms = med_of(fr, nf);
        md_model_state_stats(M, &w1, NULL);
        r->waits = nf ? (double)(w1 - w0) / nf : 0;
        random_ids(ids, (size_t)B);
        stamps st;
        double a, z;
        prof_start();
        forward_timed(sg, (size_t)B, &st, &a, &z);
        prof_stop(r);
        r->prof_reps = 1;
    }
out:
    if (cl)
        for (int b = 0; b < B; b++)
            if (cl[b]) md_seq_free(cl[b]);
    free(cl);
    free(sg);
    free(ids);
    free(lg);
    free(dr);
}

static void run_prefill(result *r)
{
    md_seq *s = md_seq_create(M);
    int32_t *ids = malloc((size_t)r->P * sizeof *ids);
    float *lg = malloc((size_t)M->cfg.vocab_size * sizeof(float));
    if (!s || !ids || !lg) {
        snprintf(r->skipped, sizeof r->skipped, "out of host memory");
        if (s) md_seq_free(s);
        free(ids);
        free(lg);
        return;
    }
    random_ids(ids, (size_t)r->P);
    /* a warm-up prefill of the same size first: the first batch of a new size grows the device arena and the
     * scratch (cudaMalloc of GBs) and meets cuBLAS's first calls for its shapes */
    {
        md_seq *w = md_seq_create(M);
        rc_err err = {0};
        md_segment wg = {w, ids, (size_t)r->P, lg, 0, NULL, NULL};
        if (!w || md_forward(M, &wg, 1, &err)) fprintf(stderr, BENCH_NAME ": warm-up prefill failed: %s\n", err.msg);
        if (w) md_seq_free(w);
    }
    md_segment sg = {s, ids, (size_t)r->P, lg, 0, NULL, NULL};
    double t0, t1;
    int rc = forward_timed(&sg, 1, &ST[0], &t0, &t1);
    {
        /* the profiled prefill: its ops wait for the device one by one, so it is not the timed one */
        md_seq *w = md_seq_create(M);
        md_segment wg = {w, ids, (size_t)r->P, lg, 0, NULL, NULL};
        stamps ps;
        double a, z;
        prof_start();
        if (w) forward_timed(&wg, 1, &ps, &a, &z);
        prof_stop(r);
        if (w) md_seq_free(w);
    }
    r->prof_reps = 1;
    r->free_ms = r->free_mean_ms = NAN;
    r->arena_mb = on_gpu ? (double)bcu_arena_bytes(M->be) / (1 << 20) : NAN;
    if (rc) snprintf(r->skipped, sizeof r->skipped, "forward failed");
    else reduce(M, ST, 1, &t0, &t1, r);
    md_seq_free(s);
    free(ids);
    free(lg);
}

/* ------------------------------------------------------------ transformers' numbers */

/* the JSON's model shape against ours: a reference of another model (a checked-in one passed to the wrong slice)
 * would give ratios that mean nothing; NULL when they match */
static const char *hf_mismatch(json_t *root, const md_config *mc)
{
    static const char *const keys[] = {"hidden_size",   "num_attention_heads",   "head_dim",       "n_routed_experts",
                                       "moe_intermediate_size", "num_experts_per_tok", "sliding_window", "index_topk"};
    const int ours[] = {mc->hidden_size, mc->n_heads,  mc->head_dim, mc->n_experts,
                        mc->moe_inter,   mc->top_k,    mc->window,   mc->index_topk};
    json_t *cfg = json_object_get(root, "config");
    if (!json_is_object(cfg)) return "config";
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        json_t *v = json_object_get(cfg, keys[k]);
        if (!json_is_integer(v) || json_integer_value(v) != ours[k]) return keys[k];
    }
    return NULL;
}

static void load_hf(const char *path, const md_config *mc, result *res, int nres, char *hf_info, size_t cap)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        fprintf(stderr, BENCH_NAME ": %s: %s (line %d); no transformers column\n", path, je.text, je.line);
        snprintf(hf_info, cap, "transformers: %s could not be read", path);
        return;
    }
    const char *bad = hf_mismatch(root, mc);
    if (bad) {
        fprintf(stderr, BENCH_NAME ": %s: its model's %s is not this model's; no transformers column\n", path, bad);
        snprintf(hf_info, cap, "transformers: %s is for another model (%s differs)", path, bad);
        json_decref(root);
        return;
    }
    snprintf(hf_info, cap, "transformers %s, torch %s, eager, bf16, %s",
             json_string_value(json_object_get(root, "transformers")) ?: "?",
             json_string_value(json_object_get(root, "torch")) ?: "?",
             json_string_value(json_object_get(root, "device")) ?: "?");
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        const char *kind = json_string_value(json_object_get(c, "kind"));
        if (!kind) continue;
        int pre = !strcmp(kind, "prefill");
        long B = (long)json_integer_value(json_object_get(c, "batch"));
        long P = (long)json_integer_value(json_object_get(c, pre ? "tokens" : "context"));
        for (int k = 0; k < nres; k++) {
            result *r = &res[k];
            if (r->prefill != pre || r->P != P || (!pre && r->B != B)) continue;
            const char *sk = json_string_value(json_object_get(c, "skipped"));
            if (sk) snprintf(r->hf_skip, sizeof r->hf_skip, "%s", sk);
            json_t *pl = json_object_get(c, "per_layer_ms");
            for (int q = 0; q < NKIND; q++) {
                json_t *v = json_object_get(pl, kind_name[q]);
                if (json_is_number(v)) r->hf_ms[q] = json_number_value(v);
            }
        }
    }
    json_decref(root);
}

/* ------------------------------------------------------------ main */

/* at most this many batch sizes, contexts and prefill lengths each */
#define LIST_MAX 16

/* a comma-separated list of positive numbers into out (cap at most); -1 on a bad or a longer list */
static int parse_list(const char *s, long *out, int cap)
{
    int n = 0;
    while (*s) {
        if (n == cap) return -1;
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0) return -1;
        out[n++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static const char usage[] =
    "usage: bench_gpu_layers MODEL_DIR [--hf HF.json] [--out FILE] [--batches 1,8,64,256]\n"
    "                        [--contexts 4096,32768,131072] [--prefill 4096,16384] [--reps 8]\n"
    "                        [--budget-s 420] [--semantics official|transformers] [--threads N]\n"
    "                        [--backend cuda|cpu] [--top1 0|1] [--draw 0|1] [--distinct 0|1]\n\n"
    "Per-layer decode and prefill times of the V4 forward on the CUDA backend (GPU 0), beside the\n"
    "bandwidth and FLOP floors measured in the same run and transformers' eager numbers (--hf, from\n"
    "bench/gpu_layers_hf.py).  MODEL_DIR: deepinfer make-tiny-model DIR --preset v4-flash.\n"
    "Cases past --budget-s of wall time are reported as skipped.  --backend cpu is a dry run of the\n"
    "harness on the CPU backend (no GPU, no floors).  --top1 1: decode steps ask for the greedy token\n"
    "only (md_segment.top1, as the engine does for greedy requests) instead of every row's logits.\n"
    "--draw 1: decode steps offer each row's draw (temperature 1, no filters) to the backend\n"
    "(md_segment.draw, as the engine does for sampled requests): the CUDA backend draws on the device\n"
    "and sends down the ids (DEEPINFER_CUDA_SAMPLE=0: the logits, as without --draw).\n"
    "--distinct 1: the B sequences of a decode case each get a context of their own (their own KV\n"
    "blocks, as distinct requests have), not clones of one context sharing its blocks (the default,\n"
    "as requests sharing a prefix would); B times the host and device memory for the blocks.\n"
    "The header of bench/gpu_layers.c says how everything is measured.\n";

int main(int argc, char **argv)
{
    const char *dir = NULL, *hf = NULL, *out = NULL;
    long batches[LIST_MAX] = {1, 8, 64, 256}, contexts[LIST_MAX] = {4096, 32768, 131072};
    long prefill[LIST_MAX] = {4096, 16384};
    int nb = 4, nc = 3, np = 2, reps = 8, threads = 0;
    double budget = 420;
    md_semantics sem = MD_SEM_OFFICIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(usage, stdout); return 0; }
        if (a[0] != '-') { dir = a; continue; }
        if (!v) { fprintf(stderr, BENCH_NAME ": %s needs a value\n\n%s", a, usage); return 2; }
        i++;
        if (!strcmp(a, "--hf")) hf = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--batches")) nb = parse_list(v, batches, LIST_MAX);
        else if (!strcmp(a, "--contexts")) nc = parse_list(v, contexts, LIST_MAX);
        else if (!strcmp(a, "--prefill")) np = parse_list(v, prefill, LIST_MAX);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--backend")) on_gpu = strcmp(v, "cpu") != 0;
        else if (!strcmp(a, "--budget-s")) budget = atof(v);
        else if (!strcmp(a, "--top1")) TOP1 = atoi(v) != 0;
        else if (!strcmp(a, "--draw")) DRAW = atoi(v) != 0;
        else if (!strcmp(a, "--distinct")) DISTINCT = atoi(v) != 0;
        else if (!strcmp(a, "--semantics")) {
            if (md_semantics_parse(v, &sem)) { fprintf(stderr, BENCH_NAME ": --semantics official|transformers\n"); return 2; }
        } else { fprintf(stderr, BENCH_NAME ": unknown option %s\n\n%s", a, usage); return 2; }
        if (nb < 0 || nc < 0 || np < 0) {
            fprintf(stderr, BENCH_NAME ": %s: a comma-separated list of at most %d positive numbers\n", a, LIST_MAX);
            return 2;
        }
    }
    if (!dir) { fputs(usage, stderr); return 2; }
    if (reps < 1 || reps > MAXREP - 1) reps = 8;
    for (int i = 0; i < nc; i++)
        if (contexts[i] % MD_BLOCK_TOKENS || contexts[i] < MD_BLOCK_TOKENS) {
            fprintf(stderr, BENCH_NAME ": contexts must be multiples of %d\n", MD_BLOCK_TOKENS);
            return 2;
        }

    int ndev = 0;
    if (on_gpu && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0)) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    const double T0 = bench_now();
    /* the CPU dry run has no ceilings: its floors print as "-" */
    const double bw = on_gpu ? copy_bandwidth() : NAN, pk = on_gpu ? gemm_peak(1, 8192) : NAN;
    char err[512];
    int math = bcu_math_from_env();
    if (math < 0) { fprintf(stderr, BENCH_NAME ": bad DEEPINFER_CUDA_MATH\n"); return 2; }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    be_backend *be = on_gpu ? bcu_create(0, threads, (bcu_math)math, err, sizeof err) : be_cpu_create(threads);
    if (!be) { fprintf(stderr, BENCH_NAME ": %s\n", err); return 1; }
    rc_err rerr = {0};
    fprintf(stderr, BENCH_NAME ": loading %s\n", dir);
    double tl = bench_now();
    if (md_model_load(dir, be, sem, NULL, NULL, &M, &rerr)) {
        fprintf(stderr, BENCH_NAME ": %s\n", rerr.msg);
        return 1;
    }
    const md_config *c = &M->cfg;
    if (c->n_layers > MAXL) { fprintf(stderr, BENCH_NAME ": at most %d layers\n", MAXL); return 2; }
    tl = bench_now() - tl;
    /* warm-up: uploads every weight the graph touches (a 512-token prefill routes to every expert) */
    double tw;
    {
        md_seq *s = md_seq_create(M);
        int32_t ids[512];
        random_ids(ids, 512);
        md_segment sg = {s, ids, 512, NULL, 0, NULL, NULL};
        double a, z;
        stamps st;
        tw = bench_now();
        forward_timed(&sg, 1, &st, &a, &z);
        tw = bench_now() - tw;
        md_seq_free(s);
    }
    const double dev_gb = on_gpu ? (double)bcu_weight_bytes(be) / 1e9 : 0;
    fprintf(stderr, BENCH_NAME ": loaded in %.1f s, warm-up forward (weight upload) %.1f s, %.2f GB on the device\n",
            tl, tw, dev_gb);

    result res[LIST_MAX * LIST_MAX + LIST_MAX]; /* contexts x batches + prefills, LIST_MAX each at most */
    int nres = 0;
    memset(res, 0, sizeof res);
    for (int ic = 0; ic < nc; ic++)
        for (int ib = 0; ib < nb; ib++) {
            res[nres].B = (int)batches[ib];
            res[nres++].P = contexts[ic];
        }
    for (int ip = 0; ip < np; ip++) {
        res[nres].prefill = 1;
        res[nres].B = 1;
        res[nres++].P = prefill[ip];
    }
    /* the first prefill, decode by context (one base state per context), the other prefills; a case starts
     * only while the budget lasts, and a prefill only if the first one's time, scaled by (T/T0)^1.5, fits */
    double pre0_s = 0;
    long pre0_T = 0;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) {
            for (int ic = 0; ic < nc; ic++) {
                md_seq *base = NULL;
                for (int k = 0; k < nres; k++) {
                    result *r = &res[k];
                    if (r->prefill || r->P != contexts[ic]) continue;
                    if (bench_now() - T0 > budget) {
                        snprintf(r->skipped, sizeof r->skipped, "budget (%.0f s) spent", budget);
                        continue;
                    }
                    if (!base && !DISTINCT) { /* --distinct: run_decode makes every sequence's own */
                        double tb = bench_now();
                        base = state_at(r->P);
                        fprintf(stderr, BENCH_NAME ": state at context %ld built in %.1f s\n", r->P, bench_now() - tb);
                    }
                    fprintf(stderr, BENCH_NAME ": decode B=%d P=%ld ...", r->B, r->P);
                    run_decode(base, r, reps);
                    floors(M, bw, pk, r);
                    fprintf(stderr, " %.3f ms/step (%.3f without the layer hook, mean %.3f", r->step_ms, r->free_ms,
                            r->free_mean_ms);
                    if (on_gpu) {
                        size_t gc, gr, ge;
                        bcu_graph_stats(M->be, &gc, &gr, &ge);
                        size_t ucap, ugrow, uwait, kh, ku, ph, pf;
                        bcu_upload_stats(M->be, &ucap, &ugrow, &uwait);
                        bcu_kv_stats(M->be, &kh, &ku, &ph, &pf);
                        fprintf(stderr, "; %.2f of %d layers a step waited for the state; regions so far: %zu recorded, "
                                "%zu replayed, %zu eager; upload ring %.0f MB, grown %zu times, %zu waits; KV mirror "
                                "%zu lookups hit, %zu blocks up; pointer cache %zu sequences served, %zu filled",
                                r->waits, c->n_layers, gc, gr, ge, ucap / 1048576.0, ugrow, uwait, kh, ku, ph, pf);
                    }
                    fprintf(stderr, ")\n");
                }
                if (base) md_seq_free(base);
            }
            continue;
        }
        for (int k = 0; k < nres; k++) {
            result *r = &res[k];
            if (!r->prefill || r->done || r->skipped[0] || (pass == 0 && k != nres - np)) continue;
            double left = budget - (bench_now() - T0);
            if (left <= 0 || (pre0_T && pre0_s * pow((double)r->P / pre0_T, 1.5) > left)) {
                snprintf(r->skipped, sizeof r->skipped, "budget (%.0f s): would not fit", budget);
                continue;
            }
            fprintf(stderr, BENCH_NAME ": prefill T=%ld ...", r->P);
            double ts = bench_now();
            run_prefill(r);
            floors(M, bw, pk, r);
            if (!pre0_T) {
                pre0_T = r->P;
                pre0_s = bench_now() - ts;
            }
            fprintf(stderr, " %.0f ms\n", r->step_ms);
        }
    }

    char hf_info[256] = "transformers: not run (--hf)";
    for (int k = 0; k < nres; k++)
        for (int q = 0; q < NKIND; q++) res[k].hf_ms[q] = NAN;
    if (hf) load_hf(hf, &M->cfg, res, nres, hf_info, sizeof hf_info);

    FILE *fo = out ? fopen(out, "w") : NULL;
    if (out && !fo) fprintf(stderr, BENCH_NAME ": %s: %s\n", out, strerror(errno));
    FILE *dst[2] = {stdout, fo};
    for (int d = 0; d < 2; d++) {
        FILE *f = dst[d];
        if (!f) continue;
        if (on_gpu)
            fprintf(f, "device: %s; math %s; semantics %s; %d host threads\n", bcu_device_name(be),
                    bcu_math_name(bcu_get_math(be)), md_semantics_name(sem), threads);
        else
            fprintf(f, "CPU backend (dry run of the harness, no floors); semantics %s; %d threads\n",
                    md_semantics_name(sem), threads);
        fprintf(f, "model: %s: %d layers (", dir, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) fprintf(f, "%s%s", l ? " " : "", kind_name[kind_of(M, l)]);
        fprintf(f, "), hidden %d, %d experts x %d, top-%d; %.2f GB of weights on the device\n", c->hidden_size,
                c->n_experts, c->moe_inter, c->top_k, dev_gb);
        fprintf(f, "ceilings: copy %.0f GB/s (1 GiB device-to-device), bf16 GEMM %.0f TFLOP/s (cuBLAS 8192^3)\n",
                bw / 1e9, pk / 1e12);
        fprintf(f, "decode states: %s\n", DISTINCT ? "a context of its own for each sequence (--distinct 1)"
                                                    : "clones of one context, sharing its blocks");
        fprintf(f, "%s\n\n", hf_info);
        fprintf(f, "| case | B | ctx / tokens | kind | ms / layer | attn ms | ffn ms | floor ms | bound | %% floor | "
                   "HF eager ms | HF / ours |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int k = 0; k < nres; k++) {
            result *r = &res[k];
            const char *cs = r->prefill ? "prefill" : "decode";
            if (!r->done) {
                fprintf(f, "| %s | %d | %ld | all | skipped: %s | | | | | | | |\n", cs, r->B, r->P,
                        r->skipped[0] ? r->skipped : "not run");
                continue;
            }
            for (int q = 0; q < NKIND; q++) {
                if (!r->nkind[q]) continue;
                char hfs[64] = "n/a", ratio[32] = "";
                if (isfinite(r->hf_ms[q])) {
                    snprintf(hfs, sizeof hfs, "%.2f", r->hf_ms[q]);
                    snprintf(ratio, sizeof ratio, "%.2f", r->hf_ms[q] / r->ms[q]);
                } else if (r->hf_skip[0]) {
                    snprintf(hfs, sizeof hfs, "skipped (%.40s)", r->hf_skip);
                }
                char fl[32] = "-", pct[32] = "-";
                const char *bound = "-";
                if (isfinite(r->floor_ms[q])) { /* the CPU dry run has none */
                    snprintf(fl, sizeof fl, "%.3f", r->floor_ms[q]);
                    snprintf(pct, sizeof pct, "%.1f%%", 100 * r->floor_ms[q] / r->ms[q]);
                    bound = r->bw_ms[q] >= r->floor_ms[q] * 0.999 ? "bytes" : "FLOPs";
                }
                fprintf(f, "| %s | %d | %ld | %s | %.3f | %.3f | %.3f | %s | %s | %s | %s | %s |\n", cs, r->B, r->P,
                        kind_name[q], r->ms[q], r->attn_ms[q], r->ffn_ms[q], fl, bound, pct, hfs, ratio);
            }
        }
        if (on_gpu) {
            fprintf(f, "\nwhere a step goes: ms per step in the backend's ops (with the device graph, each op of the "
                       "profiled step waits for the device, so it gets its own time), and the rest, the graph's own "
                       "host work (from one profiled step; step ms is the timed median)\n\n"
                       "| case | B | ctx / tokens | step ms |");
            for (int q = 0; q < BCU_PROF_COUNT; q++) fprintf(f, " %s |", bcu_profile_name(q));
            fprintf(f, " host graph work |\n|---|---|---|---|");
            for (int q = 0; q <= BCU_PROF_COUNT; q++) fprintf(f, "---|");
            fprintf(f, "\n");
            for (int k = 0; k < nres; k++) {
                result *r = &res[k];
                if (!r->done) continue;
                double sum = 0;
                fprintf(f, "| %s | %d | %ld | %.1f |", r->prefill ? "prefill" : "decode", r->B, r->P, r->step_ms);
                for (int q = 0; q < BCU_PROF_COUNT; q++) {
                    double ms = 1e3 * r->prof.seconds[q] / r->prof_reps;
                    sum += ms;
                    fprintf(f, " %.2f (%ld) |", ms, (long)(r->prof.calls[q] / r->prof_reps));
                }
                fprintf(f, " %.1f |\n", r->step_ms - sum);
            }
            fprintf(f, "\n(in parentheses: calls per step)\n");
            /* the "prefill GEMM time against the peak": the GEMM classes' time in the profiled prefill
             * against 2 x tokens x the layers' weight parameters (the dense ones and top-k experts a token) */
            for (int k = 0; k < nres; k++) {
                result *r = &res[k];
                if (!r->done || !r->prefill) continue;
                double fixed = 0, routed = 0;
                for (int l = 0; l < c->n_layers; l++) {
                    layer_cost lc = cost_of(M, l);
                    fixed += 2.0 * r->P * lc.fixed_params;
                    routed += 2.0 * r->P * c->top_k * lc.expert_params;
                }
                const double *sec = r->prof.seconds, n = r->prof_reps;
                const double g_s = (sec[BCU_PROF_LINEAR_BF16] + sec[BCU_PROF_LINEAR_FP8] + sec[BCU_PROF_LINEAR_FP4] +
                                    sec[BCU_PROF_ROWS] + sec[BCU_PROF_MOE]) / n,
                             m_s = sec[BCU_PROF_MOE] / n, d_s = g_s - m_s;
                if (!(m_s > 0 && d_s > 0)) continue; /* a model without one of the classes: no ratio to print */
                fprintf(f, "prefill %ld tokens, GEMM time: the GEMM classes (linear bf16 / FP8 / FP4, grouped wo_a, "
                           "moe) %.2f ms for %.2f TFLOP = %.0f TFLOP/s, %.1f%% of the bf16 peak; the routed experts "
                           "(moe, with routing and combine) %.2f ms, %.1f%%; the dense ones %.2f ms, %.1f%%\n",
                        r->P, 1e3 * g_s, (fixed + routed) / 1e12, (fixed + routed) / g_s / 1e12,
                        100 * (fixed + routed) / g_s / pk, 1e3 * m_s, 100 * routed / m_s / pk, 1e3 * d_s,
                        100 * fixed / d_s / pk);
            }
        }
        fprintf(f, "\nwhole steps (all layers + embedding + head):\n");
        for (int k = 0; k < nres; k++) {
            result *r = &res[k];
            if (!r->done) continue;
            if (r->prefill)
                fprintf(f, "  prefill %ld tokens: %.0f ms (%.0f tokens/s for this %d-layer slice; head %.1f ms; "
                           "activation arena %.0f MB)\n",
                        r->P, r->step_ms, r->P / (r->step_ms * 1e-3), c->n_layers, r->head_ms, r->arena_mb);
            else
                fprintf(f, "  decode B=%d ctx %ld: %.2f ms per step, %.2f ms without the per-layer synchronise "
                           "(%.0f tokens/s; head %.1f ms; median of %.0f; mean %.2f ms, %.0f tokens/s)\n",
                        r->B, r->P, r->step_ms, r->free_ms, r->B / (r->free_ms * 1e-3), r->head_ms, r->reps,
                        r->free_mean_ms, r->B / (r->free_mean_ms * 1e-3));
        }
    }
    if (fo) fclose(fo);
    md_model_free(M);
    if (on_gpu) be_cuda_destroy(be);
    else be_destroy(be);
    return 0;
}
