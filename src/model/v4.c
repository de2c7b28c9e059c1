/* v4.c - the DeepSeek V4 forward pass and per-sequence decoding state.
 *
 * The graph reads top to bottom like the paper and like DeepSeek's
 * inference/model.py:
 *
 *   embed -> n copies -> for each layer:
 *       hc_pre(attn) -> attn_norm -> attention -> hc_post
 *       hc_pre(ffn)  -> ffn_norm  -> MoE       -> hc_post
 *   -> hc_head -> norm -> head
 *
 * One forward call takes a batch of segments (sequence, new tokens).  Matrix
 * products run over all rows of all segments at once; attention, the
 * compressors and the indexer read and extend each segment's sequence state
 * (the compressors pool the entries a segment completes in parallel, each from
 * the rows and the state before the segment).  Every value computed for a
 * token depends only on the token, its position and the state before it, so
 * one-shot prefill, chunked prefill, decode and batching agree bit for bit.
 *
 * Semantics switch (docs/MODEL-SEMANTICS.md): MD_SEM_OFFICIAL adds the
 * round trips the model was trained with (window and compressed KV through FP8,
 * indexer queries and keys through Hadamard + FP4, the input of every FP8 / FP4
 * GEMM through FP8 as the official linear() quantises it) and the official
 * router arithmetic; MD_SEM_TRANSFORMERS leaves them out, like transformers
 * 5.17.
 *
 * The state can be snapshotted to bytes, restored and cloned (end of file;
 * the format is in docs/KV.md). */
#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/greedy.h"
#include "base/le.h"
#include "base/scratch.h"
#include "backend/part_slots.h"
#include "model/v4_internal.h"

/* ------------------------------------------------------------------ setup */

int md_semantics_parse(const char *s, md_semantics *out)
{
    if (!strcmp(s, "official")) *out = MD_SEM_OFFICIAL;
    else if (!strcmp(s, "transformers")) *out = MD_SEM_TRANSFORMERS;
    else return RC_EINVAL;
    return 0;
}

const char *md_semantics_name(md_semantics s) { return s == MD_SEM_OFFICIAL ? "official" : "transformers"; }

/* RoPE inverse frequencies, computed in float32 the way transformers does
 * (base ** (2i/dim) in float, YaRN ramp over pair index). */
static float *rope_inv_freq(int dim, double base, int yarn, double factor, double orig, double bfast, double bslow)
{
    int half = dim / 2;
    float *f = malloc((size_t)half * sizeof *f);
    if (!f) return NULL;
    double low = 0, high = 0;
    if (yarn) {
        low = floor(dim * log(orig / (bfast * 2 * M_PI)) / (2 * log(base)));
        high = ceil(dim * log(orig / (bslow * 2 * M_PI)) / (2 * log(base)));
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (low == high) high += 0.001;
    }
    for (int i = 0; i < half; i++) {
        float pf = powf((float)base, (float)(2 * i) / (float)dim);
        float extra = 1.0f / pf;
        if (!yarn) {
            f[i] = extra;
            continue;
        }
        float inter = 1.0f / ((float)factor * pf);
        float ramp = (float)(((float)i - (float)low) / (float)(high - low));
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float ef = 1.0f - ramp;
        f[i] = inter * (1.0f - ef) + extra * ef;
    }
    return f;
}

static int is_pow2(size_t n) { return n && !(n & (n - 1)); }

typedef struct {
    md_progress_fn fn;
    void *arg;
} touch_arg;

static int blk_geometry(md_model *m, rc_err *err);

static void touch_cb(void *arg, uint64_t done, uint64_t total)
{
    touch_arg *t = arg;
    t->fn(t->arg, "read MiB", done >> 20, total >> 20);
}

int md_model_load(const char *dir, be_backend *be, md_semantics sem, md_progress_fn progress,
                  void *progress_arg, md_model **out, rc_err *err)
{
    char path[4096];
    *out = NULL;
    md_model *m = calloc(1, sizeof *m);
    if (!m) return rc_errf(err, RC_ENOMEM, "out of memory");
    m->be = be;
    m->sem = sem;
    int rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = md_config_load(path, &m->cfg, err))) goto fail;
    if ((rc = md_ckpt_open(dir, &m->ck, err))) goto fail;
    if (progress && md_ckpt_total_bytes(m->ck) > (256u << 20)) {
        /* fault the mapping in up front, with a progress line, so the first
         * request does not pay for it */
        touch_arg ta = {progress, progress_arg};
        md_ckpt_touch(m->ck, touch_cb, &ta);
    }
    if ((rc = md_load_weights(m, progress, progress_arg, err))) goto fail;
    if ((rc = blk_geometry(m, err))) goto fail;
    const md_config *c = &m->cfg;
    if (sem == MD_SEM_OFFICIAL && !is_pow2((size_t)c->index_head_dim)) {
        for (int l = 0; l < c->n_layers; l++)
            if (m->layers[l].overlap) {
                rc = rc_errf(err, RC_EUNSUP,
                             "--semantics official rotates indexer vectors with a Hadamard transform, which needs a "
                             "power-of-two index_head_dim (this config has %d); use --semantics transformers",
                             c->index_head_dim);
                goto fail;
            }
    }
    m->inv_freq_main = rope_inv_freq(c->rope_dim, c->rope_theta, 0, 0, 0, 0, 0);
    m->inv_freq_comp = rope_inv_freq(c->rope_dim, c->compress_rope_theta, c->yarn, c->yarn_factor, c->yarn_orig_max,
                                     c->yarn_beta_fast, c->yarn_beta_slow);
    if (!m->inv_freq_main || !m->inv_freq_comp) { rc = rc_errf(err, RC_ENOMEM, "out of memory"); goto fail; }
    *out = m;
    return 0;
fail:
    md_model_free(m);
    return rc;
}

void md_model_free(md_model *m)
{
    if (!m) return;
    md_model_set_host_dev_graph(m, 0);
    md_free_weights(m);
    free(m->blk_off);
    free(m->blk_epb);
    free(m->inv_freq_main);
    free(m->inv_freq_comp);
    if (m->ck) md_ckpt_close(m->ck);
    free(m);
}

const md_config *md_model_config(const md_model *m) { return &m->cfg; }
md_semantics md_model_semantics(const md_model *m) { return m->sem; }
void md_model_set_semantics(md_model *m, md_semantics sem) { m->sem = sem; }
uint64_t md_model_param_count(const md_model *m) { return m->n_params; }
void md_model_set_layer_hook(md_model *m, md_layer_hook fn, void *arg)
{
    m->hook = fn;
    m->hook_arg = arg;
}

/* ------------------------------------------------------------------ state */

/* Per layer (docs/MODEL-STATE.md has the byte layout):
 *   win          [W, d]       window ring; slot = pos % W holds position pos
 *   c_kv, c_gate [r, c*d]     compressor partial block; slot = pos % r
 *   c_ovkv/ovg   [r, d]       half A of the last complete block (CSA only)
 *   i_*                       the same for the indexer's compressor (CSA only)
 * A partial block's slots are valid for positions r*floor(len/r) .. len-1.
 * The entries (c_n compressed entries of d floats, i_n indexer keys of ID
 * floats) live in the sequence's KV blocks (v4.h), reached through ent_row. */
typedef struct {
    float *win;
    float *c_kv, *c_gate, *c_ovkv, *c_ovg;
    size_t c_n;
    float *i_kv, *i_gate, *i_ovkv, *i_ovg;
    size_t i_n;
} seq_layer;

struct md_seq {
    const md_model *m;
    uint64_t gen;       /* new at create / restore / attach: a backend's cache of this state's rows is keyed by it */
    int64_t len;
    int64_t win_lo;     /* the window never reaches below this position (bounded replay) */
    seq_layer *L;
    md_block **blk;     /* block table; full blocks are shared, the last may be partial */
    /* beside it, each block's data pointer and id (seq_blk_set): the attention op's tables without a read of a
     * block header each, which at batch 256 x 128K of distinct contexts was 262,144 cache misses a layer */
    const float **bdata;
    uint64_t *bid;
    size_t nblk, blk_cap;
};

/* room for n blocks in the table and its two companions */
static int seq_blk_reserve(md_seq *s, size_t n)
{
    if (n <= s->blk_cap) return 0;
    md_block **t = realloc(s->blk, n * sizeof *t);
    if (!t) return RC_ENOMEM;
    s->blk = t;
    const float **d = realloc(s->bdata, n * sizeof *d);
    if (!d) return RC_ENOMEM;
    s->bdata = d;
    uint64_t *id = realloc(s->bid, n * sizeof *id);
    if (!id) return RC_ENOMEM;
    s->bid = id;
    s->blk_cap = n;
    return 0;
}

static inline void seq_blk_set(md_seq *s, size_t k, md_block *b)
{
    s->blk[k] = b;
    s->bdata[k] = b->data;
    s->bid[k] = b->id;
}

/* row b of layer l's entries (which = 0) or indexer keys (which = 1) */
static inline float *ent_row(const md_seq *s, int l, int which, size_t b)
{
    const md_model *m = s->m;
    const size_t epb = (size_t)m->blk_epb[l];
    const size_t dim = (size_t)(which ? m->cfg.index_head_dim : m->cfg.head_dim);
    return s->blk[b / epb]->data + m->blk_off[2 * l + which] + (b % epb) * dim;
}

/* ------------------------------------------------------------- KV blocks */

size_t md_block_floats(const md_model *m) { return m->blk_floats; }

md_block *md_block_malloc(const md_model *m)
{
    md_block *b = malloc(sizeof *b);
    float *d = malloc((m->blk_floats ? m->blk_floats : 1) * sizeof(float));
    if (!b || !d) { free(b); free(d); return NULL; }
    *b = (md_block){.refs = 1, .data = d};
    return b;
}

void md_block_free(md_block *b)
{
    if (!b) return;
    free(b->data);
    free(b);
}

static md_block *def_alloc(void *ctx) { return md_block_malloc(ctx); }
static void def_release(void *ctx, md_block *b) { (void)ctx; md_block_free(b); }

void md_model_set_block_alloc(md_model *m, const md_block_alloc *a)
{
    if (a) m->balloc = *a;
    else m->balloc = (md_block_alloc){.ctx = m, .alloc = def_alloc, .release = def_release};
}

md_block *md_block_new(const md_model *m)
{
    static uint64_t next_id;
    md_block *b = m->balloc.alloc(m->balloc.ctx);
    if (b) b->id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
    return b;
}
void md_block_ref(md_block *b) { b->refs++; }
void md_block_unref(const md_model *m, md_block *b)
{
    if (b && --b->refs == 0) m->balloc.release(m->balloc.ctx, b);
}

/* block geometry; every compress ratio must divide MD_BLOCK_TOKENS */
static int blk_geometry(md_model *m, rc_err *err)
{
    const md_config *c = &m->cfg;
    m->blk_off = calloc(2 * (size_t)c->n_layers, sizeof *m->blk_off);
    m->blk_epb = calloc((size_t)c->n_layers, sizeof *m->blk_epb);
    if (!m->blk_off || !m->blk_epb) return rc_errf(err, RC_ENOMEM, "out of memory");
    size_t off = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const int r = c->ratio[l];
        if (!r) continue;
        if (MD_BLOCK_TOKENS % r)
            return rc_errf(err, RC_EUNSUP, "layer %d compresses by %d, which does not divide the %d-token KV block", l,
                           r, MD_BLOCK_TOKENS);
        m->blk_epb[l] = MD_BLOCK_TOKENS / r;
        m->blk_off[2 * l] = off;
        off += (size_t)m->blk_epb[l] * (size_t)c->head_dim;
        if (r == c->csa_ratio) {
            m->blk_off[2 * l + 1] = off;
            off += (size_t)m->blk_epb[l] * (size_t)c->index_head_dim;
        }
    }
    m->blk_floats = off;
    md_model_set_block_alloc(m, NULL);
    return 0;
}

/* the block holding row b of layer l, allocated when the sequence reaches it */
static int ent_slot(md_seq *s, int l, size_t b)
{
    const size_t k = b / (size_t)s->m->blk_epb[l];
    while (s->nblk <= k) {
        if (s->nblk == s->blk_cap && seq_blk_reserve(s, s->blk_cap ? 2 * s->blk_cap : 16)) return RC_ENOMEM;
        md_block *nbk = md_block_new(s->m);
        if (!nbk) return RC_ENOMEM;
        seq_blk_set(s, s->nblk++, nbk);
    }
    return 0;
}

size_t md_seq_full_blocks(const md_seq *s)
{
    size_t n = (size_t)(s->len / MD_BLOCK_TOKENS);
    return n < s->nblk ? n : s->nblk;
}

md_block *md_seq_block(const md_seq *s, size_t k) { return k < s->nblk ? s->blk[k] : NULL; }

const char *md_seq_check(const md_seq *s)
{
    if (s->nblk > s->blk_cap) return "more blocks than the table holds";
    for (size_t k = 0; k < s->nblk; k++) {
        if (!s->blk[k]) return "a NULL block in the table";
        if (s->bdata[k] != s->blk[k]->data) return "a block's data pointer beside the table is stale";
        if (s->bid[k] != s->blk[k]->id) return "a block's id beside the table is stale";
        if (s->blk[k]->refs < 1) return "a block in the table holds no reference";
    }
    return NULL;
}

static void seq_drop_blocks(md_seq *s)
{
    for (size_t k = 0; k < s->nblk; k++) md_block_unref(s->m, s->blk[k]);
    s->nblk = 0;
}

static size_t layer_fixed_floats(const md_config *c, int l)
{
    size_t d = (size_t)c->head_dim, r = (size_t)c->ratio[l], n = (size_t)c->window * d;
    if (r) {
        int ov = c->ratio[l] == c->csa_ratio;
        size_t cd = (ov ? 2 : 1) * d;
        n += 2 * r * cd + (ov ? 2 * r * d : 0);
        if (ov) {
            size_t id = (size_t)c->index_head_dim;
            n += 2 * r * 2 * id + 2 * r * id;
        }
    }
    return n;
}

size_t md_seq_fixed_bytes(const md_model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) n += layer_fixed_floats(&m->cfg, l);
    return n * sizeof(float);
}

double md_seq_bytes_per_token(const md_model *m)
{
    const md_config *c = &m->cfg;
    double b = 0;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->ratio[l]) continue;
        b += (double)c->head_dim * 4 / c->ratio[l];
        if (c->ratio[l] == c->csa_ratio) b += (double)c->index_head_dim * 4 / c->ratio[l];
    }
    return b;
}

static uint64_t seq_gen(void)
{
    static uint64_t next;
    return __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
}

md_seq *md_seq_create(const md_model *m)
{
    const md_config *c = &m->cfg;
    md_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->m = m;
    s->gen = seq_gen();
    s->L = calloc((size_t)c->n_layers, sizeof *s->L);
    if (!s->L) { free(s); return NULL; }
    size_t d = (size_t)c->head_dim, W = (size_t)c->window, id = (size_t)c->index_head_dim;
    for (int l = 0; l < c->n_layers; l++) {
        seq_layer *L = &s->L[l];
        size_t r = (size_t)c->ratio[l];
        int ov = r && c->ratio[l] == c->csa_ratio;
        size_t cd = (ov ? 2 : 1) * d;
        L->win = calloc(W * d, sizeof(float));
        if (!L->win) goto fail;
        if (r) {
            L->c_kv = calloc(r * cd, sizeof(float));
            L->c_gate = calloc(r * cd, sizeof(float));
            if (!L->c_kv || !L->c_gate) goto fail;
        }
        if (ov) {
            L->c_ovkv = calloc(r * d, sizeof(float));
            L->c_ovg = calloc(r * d, sizeof(float));
            L->i_kv = calloc(r * 2 * id, sizeof(float));
            L->i_gate = calloc(r * 2 * id, sizeof(float));
            L->i_ovkv = calloc(r * id, sizeof(float));
            L->i_ovg = calloc(r * id, sizeof(float));
            if (!L->c_ovkv || !L->c_ovg || !L->i_kv || !L->i_gate || !L->i_ovkv || !L->i_ovg) goto fail;
        }
    }
    return s;
fail:
    md_seq_free(s);
    return NULL;
}

void md_seq_free(md_seq *s)
{
    if (!s) return;
    if (s->L)
        for (int l = 0; l < s->m->cfg.n_layers; l++) {
            seq_layer *L = &s->L[l];
            free(L->win);
            free(L->c_kv); free(L->c_gate); free(L->c_ovkv); free(L->c_ovg);
            free(L->i_kv); free(L->i_gate); free(L->i_ovkv); free(L->i_ovg);
        }
    seq_drop_blocks(s);
    free(s->blk);
    free(s->bdata);
    free(s->bid);
    free(s->L);
    free(s);
}

int64_t md_seq_len(const md_seq *s) { return s->len; }

size_t md_seq_bytes(const md_seq *s)
{
    const md_config *c = &s->m->cfg;
    size_t b = md_seq_fixed_bytes(s->m);
    for (int l = 0; l < c->n_layers; l++)
        b += (s->L[l].c_n * (size_t)c->head_dim + s->L[l].i_n * (size_t)c->index_head_dim) * sizeof(float);
    return b;
}

/* ------------------------------------------------------------ small math */

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Interleaved RoPE on x[0:rd) (pairs 2i, 2i+1) at position pos; inverse
 * rotates by -pos. */
static void rope(float *x, int rd, const float *inv_freq, int64_t pos, int inverse)
{
    for (int i = 0; i < rd / 2; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        if (inverse) s = -s;
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * c - x1 * s;
        x[2 * i + 1] = x1 * c + x0 * s;
    }
}

/* Power-of-two scale >= v (ue8m0): 2^ceil(log2 v). */
static float pow2_ceil(float v)
{
    int e;
    float f = frexpf(v, &e); /* v = f * 2^e, f in [0.5, 1) */
    return ldexpf(1.0f, f == 0.5f ? e - 1 : e);
}

/* Official QAT round trips (kernel.py act_quant / fp4_act_quant, inplace):
 * per block, scale = pow2_ceil(amax / max), value = round(x / scale) * scale. */
static void fq_fp8(float *x, size_t n, size_t block)
{
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 1e-4f;
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float sc = pow2_ceil(amax * (1.0f / 448.0f)); /* the kernels multiply */
        for (size_t i = b0; i < b1; i++) x[i] = md_e4m3_to_f32(md_f32_to_e4m3(x[i] / sc)) * sc;
    }
}

static void fq_fp4(float *x, size_t n, size_t block)
{
    for (size_t b0 = 0; b0 < n; b0 += block) {
        size_t b1 = b0 + block < n ? b0 + block : n;
        float amax = 6.0f * ldexpf(1.0f, -126);
        for (size_t i = b0; i < b1; i++) amax = fmaxf(amax, fabsf(x[i]));
        float sc = pow2_ceil(amax * (1.0f / 6.0f));
        for (size_t i = b0; i < b1; i++) x[i] = md_fp4_lut[md_f32_to_fp4(x[i] / sc)] * sc;
    }
}

/* Official semantics: DeepSeek's linear() quantises its activation to FP8
 * (kernel.py act_quant, blocks of MD_ACT_BLOCK columns per row, ue8m0 scale)
 * before every FP8 / FP4 GEMM, and the GEMM applies activation scale x weight
 * scale per block: the product of the round-tripped x with the dequantised
 * weight.  Which GEMMs: the official code dispatches on the weight's dtype,
 * and declares wo_a (an einsum on the dequantised weight), the compressors,
 * the indexer's weights_proj, the router and the head in bf16 / fp32; so
 * here: wq_a, wq_b, wkv, wo_b, the indexer's wq_b, and the experts' w1, w3,
 * w2 (routed and shared), each when its weight is FP8 or FP4 in the
 * checkpoint.  The callers ask act_fp8() at exactly those sites. */
#define MD_ACT_BLOCK 128

static int act_fp8(const md_model *m, const be_weight *w) { return m->sem == MD_SEM_OFFICIAL && md_w_quantised(w); }

typedef struct {
    float *x;
    size_t K;
} aq_job;

static void aq_task(void *arg, size_t r)
{
    const aq_job *j = arg;
    fq_fp8(j->x + r * j->K, j->K, MD_ACT_BLOCK);
}

/* rows [0, R) of x [R, K], each quantised as act_quant does, on the backend's threads */
static void act_quant_rows(be_backend *be, float *x, size_t R, size_t K)
{
    aq_job j = {x, K};
    be_cpu_parallel(be, R, aq_task, &j);
}

/* a quantised copy of x [R, K] when some GEMM of the site needs one (need), else NULL; *fail on no memory */
static float *act_quant_copy(be_backend *be, const float *x, size_t R, size_t K, int need, int *fail)
{
    if (!need) return NULL;
    float *q = malloc(R * K * sizeof(float));
    if (!q) {
        *fail = 1;
        return NULL;
    }
    memcpy(q, x, R * K * sizeof(float));
    act_quant_rows(be, q, R, K);
    return q;
}

/* the input of w's GEMM: the quantised copy where act_fp8, else x itself */
static const float *act_in(const md_model *m, const be_weight *w, const float *x, const float *xq)
{
    return act_fp8(m, w) ? xq : x;
}

/* Walsh-Hadamard transform in Sylvester order, scaled by n^-1/2 (n = 2^k). */
static void hadamard(float *x, size_t n)
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


/* Embedding rows ids[0..R) into X [R, n, D], copied into every stream. */
static void embed_rows(const be_weight *e, const int32_t *ids, size_t R, int n, float *X)
{
    const size_t D = (size_t)e->cols;
    for (size_t t = 0; t < R; t++) {
        float *x0 = X + t * (size_t)n * D;
        if (e->dtype == MD_F32)
            memcpy(x0, (const float *)e->data + (size_t)ids[t] * D, D * sizeof(float));
        else if (e->dtype == MD_BF16)
            md_bf16_row_to_f32((const uint16_t *)e->data + (size_t)ids[t] * D, x0, D);
        else
            md_f16_row_to_f32((const uint16_t *)e->data + (size_t)ids[t] * D, x0, D);
        for (int i = 1; i < n; i++) memcpy(x0 + (size_t)i * D, x0, D * sizeof(float));
    }
}

/* ------------------------------------------------------------------- mHC */

typedef struct {
    be_hc h;                  /* sizes, epsilons and the site's parameters */
    float *X;                 /* [R, n, D] streams */
    float *coll, *post, *comb; /* [R, D], [R, n], [R, n, n] */
    const float *f;           /* sublayer output [R, D] (post step) */
} hc_job;

static be_hc hc_params(const md_config *c, const float *fn, const float *base, const float *scale)
{
    return (be_hc){.n = c->hc_mult, .D = c->hidden_size, .iters = c->hc_iters, .hc_eps = c->hc_eps,
                   .rms_eps = c->rms_eps, .fn = fn, .base = base, .scale = scale};
}

/* pre/post/comb from one site's parameters, collapse to one row (hc_pre). */
static void hc_pre_task(void *arg, size_t t)
{
    const hc_job *j = arg;
    const int n = j->h.n, D = j->h.D, mix = (2 + n) * n;
    const float eps = j->h.hc_eps;
    const float *x = j->X + t * (size_t)n * D;
    double ss = 0;
    for (int i = 0; i < n * D; i++) ss += (double)x[i] * x[i];
    float rs = 1.0f / sqrtf((float)(ss / (double)(n * D)) + j->h.rms_eps);
    float mixes[(2 + 16) * 16];
    for (int k = 0; k < mix; k++) mixes[k] = be_dot_f32(j->h.fn + (size_t)k * n * D, x, (size_t)n * D) * rs;
    float pre[16];
    float *post = j->post + t * n, *C = j->comb + t * n * n;
    for (int i = 0; i < n; i++) {
        pre[i] = sigmoidf(mixes[i] * j->h.scale[0] + j->h.base[i]) + eps;
        post[i] = 2.0f * sigmoidf(mixes[n + i] * j->h.scale[1] + j->h.base[n + i]);
    }
    /* C[i][k]: from stream i (row) to stream k (column); softmax along rows,
     * then Sinkhorn: column, (row, column) x (iters - 1) */
    for (int i = 0; i < n; i++) {
        float mx = -INFINITY;
        for (int k = 0; k < n; k++) {
            C[i * n + k] = mixes[2 * n + i * n + k] * j->h.scale[2] + j->h.base[2 * n + i * n + k];
            mx = fmaxf(mx, C[i * n + k]);
        }
        float s = 0;
        for (int k = 0; k < n; k++) s += (C[i * n + k] = expf(C[i * n + k] - mx));
        for (int k = 0; k < n; k++) C[i * n + k] = C[i * n + k] / s + eps;
    }
    for (int it = 0; it < j->h.iters; it++) {
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
    float *y = j->coll + t * (size_t)D;
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int i = 0; i < n; i++) acc += pre[i] * x[(size_t)i * D + d];
        y[d] = acc;
    }
}

/* X'[k] = post[k] * f + sum_j C[j][k] X[j] (hc_post) */
static void hc_post_task(void *arg, size_t t)
{
    const hc_job *j = arg;
    const int n = j->h.n, D = j->h.D;
    float *x = j->X + t * (size_t)n * D;
    const float *post = j->post + t * n, *C = j->comb + t * n * n, *f = j->f + t * (size_t)D;
    float *tmp = rc_scratch(RC_SCRATCH_HC, (size_t)n * D * sizeof *tmp);
    for (int k = 0; k < n; k++)
        for (int d = 0; d < D; d++) {
            float acc = post[k] * f[d];
            for (int i = 0; i < n; i++) acc += C[i * n + k] * x[(size_t)i * D + d];
            tmp[(size_t)k * D + d] = acc;
        }
    memcpy(x, tmp, (size_t)n * D * sizeof *tmp);
}

static void hc_head_task(void *arg, size_t t)
{
    const hc_job *j = arg;
    const int n = j->h.n, D = j->h.D;
    const float *x = j->X + t * (size_t)n * D;
    double ss = 0;
    for (int i = 0; i < n * D; i++) ss += (double)x[i] * x[i];
    float rs = 1.0f / sqrtf((float)(ss / (double)(n * D)) + j->h.rms_eps);
    float pre[16];
    for (int i = 0; i < n; i++)
        pre[i] = sigmoidf(be_dot_f32(j->h.fn + (size_t)i * n * D, x, (size_t)n * D) * rs * j->h.scale[0] + j->h.base[i]) +
                 j->h.hc_eps;
    float *y = j->coll + t * (size_t)D;
    for (int d = 0; d < D; d++) {
        float acc = 0;
        for (int i = 0; i < n; i++) acc += pre[i] * x[(size_t)i * D + d];
        y[d] = acc;
    }
}

/* Row layout of one forward call. */
typedef struct {
    size_t R;
    int32_t *ids;
    int64_t *pos;
    size_t *seg_start;   /* [nseg + 1] */
} rows_t;

/* ------------------------------------------------------------- compressor */

/* A compressor turns each block of ratio consecutive tokens into one entry:
 * per channel a softmax over the block's slots of the gate (the gate row plus
 * ape of the slot) weighs the kv rows; when overlapping (CSA) over 2*ratio
 * slots, the previous block's half A (channels 0..hd) then this block's
 * half B (channels hd..2hd).  Then norm, RoPE at the block's first position,
 * and the official round trip.
 *
 * Given the rows, the entries a segment completes are independent of each
 * other, so a prefill pools them in parallel (comp_step): a serial pass
 * allocates their KV blocks (the block allocator is not thread-safe), one task
 * per entry gathers its slots and pools them (comp_pool, the only copy of that
 * arithmetic), and a serial pass leaves the partial block and the half A
 * exactly as pushing the tokens one by one would, stale slots included: the
 * snapshot writes the partial block whole and is compared bit for bit. */
typedef struct {
    int ratio, overlap, hd;     /* hd = entry width (head_dim or index_head_dim) */
    int is_indexer;             /* entries are indexer keys (which = 1 in ent_row) */
    float *kv, *gate, *ovkv, *ovg;  /* the state: partial block [r, cd], half A [r, hd] */
    md_seq *s;                  /* entries go to s's blocks, layer l */
    int l;
    size_t *n;                  /* entries held */
    const float *ape, *norm;
    const float *rkv, *rgate;   /* the segment's rows [rn, cd] for positions p0 .. p0+rn-1, gate without ape */
    int64_t p0;
    size_t rn;
} comp_seg;

/* The pooling of one entry, channel ch of out [hd]: a softmax over its ns slots, in order, of the gate (slot s:
 * g[s] + ape[s], or g[s] where ape[s] is NULL) weighs the kv rows; slots with kv[s] NULL are absent.  The only
 * copy of this arithmetic: the host compressors (comp_pool) and the device graph's comp_pool op on the host
 * (hd_comp_pool) call it, and the CUDA kernel follows it (graph.cu, bcu_comp_pool).  w: ns floats of scratch. */
static void comp_pool_slots(int ns, int hd, const float *const *kv, const float *const *g, const float *const *ape,
                            float *w, float *out)
{
    for (int ch = 0; ch < hd; ch++) {
        float mx = -INFINITY;
        for (int s = 0; s < ns; s++)
            if (kv[s]) mx = fmaxf(mx, ape[s] ? g[s][ch] + ape[s][ch] : g[s][ch]);
        float den = 0, num = 0;
        for (int s = 0; s < ns; s++)
            if (kv[s]) den += (w[s] = expf((ape[s] ? g[s][ch] + ape[s][ch] : g[s][ch]) - mx));
        for (int s = 0; s < ns; s++)
            if (kv[s]) num += kv[s][ch] * (w[s] / den);
        out[ch] = num;
    }
}

/* After the pooling, entry b of a compressor (indexer keys or not) of width hd: norm, RoPE at the block's first
 * position, the official round trip.  forward_dev runs the same as device ops over all entries at once. */
static void comp_post(const md_model *m, int is_indexer, int hd, const float *norm, int64_t pos, float *out)
{
    const md_config *c = &m->cfg;
    be_rmsnorm_rows(out, out, 1, (size_t)hd, norm, c->rms_eps);
    rope(out + hd - c->rope_dim, c->rope_dim, m->inv_freq_comp, pos, 0);
    if (m->sem == MD_SEM_OFFICIAL) {
        if (is_indexer) {
            if (is_pow2((size_t)hd)) hadamard(out, (size_t)hd);
            fq_fp4(out, (size_t)hd, 32);
        } else {
            fq_fp8(out, (size_t)(hd - c->rope_dim), 64);
        }
    }
}

/* Entry b from its block's slots kv, g [r, hd] (the pooled channels, ape
 * added) and, when overlapping and b > 0, the previous block's half A
 * pkv, pg [r, hd] (else NULL); w holds 2r floats of scratch and p 6r
 * pointers; into out [hd]. */
static void comp_pool(const md_model *m, const comp_seg *cs, int64_t b, const float *kv, const float *g,
                      const float *pkv, const float *pg, float *w, const float **p, float *out)
{
    const int r = cs->ratio, hd = cs->hd, ns = 2 * r;
    const float **pk = p, **pgt = p + ns, **pa = p + 2 * ns;
    for (int s = 0; s < r; s++) {
        pk[s] = pg ? pkv + (size_t)s * hd : NULL;
        pgt[s] = pg ? pg + (size_t)s * hd : NULL;
        pk[r + s] = kv + (size_t)s * hd;
        pgt[r + s] = g + (size_t)s * hd;
        pa[s] = pa[r + s] = NULL;
    }
    comp_pool_slots(ns, hd, pk, pgt, pa, w, out);
    comp_post(m, cs->is_indexer, hd, cs->norm, b * r, out);
}

/* Channels c0 .. c0+hd of block b's slots into kv, g [r, hd], as the partial
 * block holds them when b completes: positions before p0 from the state's
 * partial block (valid for r*floor(p0/r) .. p0-1), later ones from the rows,
 * with ape added as a push adds it. */
static void comp_gather(const comp_seg *cs, int64_t b, int c0, float *kv, float *g)
{
    const int r = cs->ratio, hd = cs->hd, cd = (cs->overlap ? 2 : 1) * hd;
    for (int s = 0; s < r; s++) {
        const int64_t pos = b * r + s;
        const size_t so = (size_t)s * cd + (size_t)c0;
        float *ko = kv + (size_t)s * hd, *go = g + (size_t)s * hd;
        if (pos < cs->p0) {
            memcpy(ko, cs->kv + so, (size_t)hd * sizeof(float));
            memcpy(go, cs->gate + so, (size_t)hd * sizeof(float));
        } else {
            const size_t ro = (size_t)(pos - cs->p0) * cd + (size_t)c0;
            memcpy(ko, cs->rkv + ro, (size_t)hd * sizeof(float));
            for (int i = 0; i < hd; i++) go[i] = cs->rgate[ro + i] + cs->ape[so + i];
        }
    }
}

/* One entry to pool: block b of compressor cs. */
typedef struct {
    const comp_seg *cs;
    int64_t b;
} comp_item;

typedef struct {
    const md_model *m;
    const comp_item *it;
    int fail;           /* a task found no memory */
} comp_job;

static void comp_task(void *arg, size_t i)
{
    comp_job *j = arg;
    const comp_seg *cs = j->it[i].cs;
    const int64_t b = j->it[i].b;
    const size_t rh = (size_t)cs->ratio * (size_t)cs->hd;
    /* the previous block's half A: the state's when that block completed before the segment, else its slots */
    const int prev = cs->overlap && b > 0, own = prev && b * cs->ratio > cs->p0;
    /* the attention slot: the compressors run before attention, never inside one of its tasks */
    const size_t pf = 6 * (size_t)cs->ratio * sizeof(float *) / sizeof(float) + 1; /* floats for comp_pool's p */
    float *kv = rc_scratch(RC_SCRATCH_ATTN, ((own ? 4 : 2) * rh + 2 * (size_t)cs->ratio + pf) * sizeof(float));
    if (!kv) {
        __atomic_store_n(&j->fail, 1, __ATOMIC_RELAXED);
        return;
    }
    float *g = kv + rh, *w = g + rh, *pkv = NULL, *pg = NULL;
    const float **pp = (const float **)(((uintptr_t)(w + 2 * cs->ratio) + sizeof(void *) - 1) & ~(uintptr_t)(sizeof(void *) - 1));
    comp_gather(cs, b, cs->overlap ? cs->hd : 0, kv, g);
    if (own) {
        pkv = (float *)(pp + 6 * cs->ratio);
        pg = pkv + rh;
        comp_gather(cs, b - 1, 0, pkv, pg);
    } else if (prev) {
        pkv = cs->ovkv;
        pg = cs->ovg;
    }
    comp_pool(j->m, cs, b, kv, g, pkv, pg, w, pp, ent_row(cs->s, cs->l, cs->is_indexer, (size_t)b));
}

/* The entries the segment completes that the state does not hold yet: their
 * blocks, in ascending order, and one item each.  Entries below *n are a
 * bounded replay over blocks that already hold them: kept, not recomputed. */
static int64_t comp_range(const comp_seg *cs, int64_t *b0);
static int comp_plan(const comp_seg *cs, comp_item *it, size_t *ni)
{
    int64_t b;
    const int64_t end = comp_range(cs, &b);
    assert(b >= end || b == (int64_t)*cs->n); /* entries are made in order, none skipped */
    for (; b < end; b++) {
        int rc = ent_slot(cs->s, cs->l, (size_t)b);
        if (rc) return rc;
        it[(*ni)++] = (comp_item){.cs = cs, .b = b};
    }
    return 0;
}

/* After the entries: the partial block and the half A as pushing the tokens
 * one by one leaves them.  Only the last block the segment completes and the
 * positions after it survive those pushes, so only they are pushed, in order
 * (the slots before p0 of a block that straddles p0 stay as they are). */
static void comp_finish(const comp_seg *cs)
{
    const int r = cs->ratio, hd = cs->hd, cd = (cs->overlap ? 2 : 1) * hd;
    const int64_t q = cs->p0 + (int64_t)cs->rn, end = q / r;
    int64_t from = cs->p0;
    if (end > cs->p0 / r && (end - 1) * r > from) from = (end - 1) * r;
    for (int64_t pos = from; pos < q; pos++) {
        const int slot = (int)(pos % r);
        const float *kv = cs->rkv + (size_t)(pos - cs->p0) * cd, *gate = cs->rgate + (size_t)(pos - cs->p0) * cd;
        memcpy(cs->kv + (size_t)slot * cd, kv, (size_t)cd * sizeof(float));
        for (int i = 0; i < cd; i++) cs->gate[(size_t)slot * cd + i] = gate[i] + cs->ape[(size_t)slot * cd + i];
        if (cs->overlap && slot == r - 1)
            for (int s = 0; s < r; s++) {
                memcpy(cs->ovkv + (size_t)s * hd, cs->kv + (size_t)s * cd, (size_t)hd * sizeof(float));
                memcpy(cs->ovg + (size_t)s * hd, cs->gate + (size_t)s * cd, (size_t)hd * sizeof(float));
            }
    }
    if ((size_t)end > *cs->n) *cs->n = (size_t)end;
}

/* Compressor x (0: the attention's, 1: the CSA indexer's) of layer l for a segment of sq adding rn tokens whose
 * rows (kv, gate without ape; [rn, width]) are rkv, rgate */
static comp_seg comp_seg_of(md_model *m, int l, md_seq *sq, int x, const float *rkv, const float *rgate, size_t rn)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    seq_layer *sl = &sq->L[l];
    if (!x)
        return (comp_seg){.ratio = ly->ratio, .overlap = ly->overlap, .hd = c->head_dim, .is_indexer = 0,
                          .kv = sl->c_kv, .gate = sl->c_gate, .ovkv = sl->c_ovkv, .ovg = sl->c_ovg, .s = sq, .l = l,
                          .n = &sl->c_n, .ape = ly->c_ape, .norm = ly->c_norm, .rkv = rkv, .rgate = rgate,
                          .p0 = sq->len, .rn = rn};
    return (comp_seg){.ratio = ly->ratio, .overlap = 1, .hd = c->index_head_dim, .is_indexer = 1, .kv = sl->i_kv,
                      .gate = sl->i_gate, .ovkv = sl->i_ovkv, .ovg = sl->i_ovg, .s = sq, .l = l, .n = &sl->i_n,
                      .ape = ly->i_ape, .norm = ly->i_norm, .rkv = rkv, .rgate = rgate, .p0 = sq->len, .rn = rn};
}

/* The entries cs completes that it does not hold yet: [*b0, end) (comp_plan's range) */
static int64_t comp_range(const comp_seg *cs, int64_t *b0)
{
    const int64_t r = cs->ratio, end = (cs->p0 + (int64_t)cs->rn) / r;
    int64_t b = cs->p0 / r;
    if (b < (int64_t)*cs->n) b = (int64_t)*cs->n;
    *b0 = b;
    return end > b ? end : b;
}

/* Layer l's compressors (and the CSA indexer's) over every segment: ckv / cg [R, cd] and ikv / ig [R, 2 ID] are
 * host rows.  The entries of all segments are pooled in one parallel call. */
static int comp_step(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *ckv,
                     const float *cg, const float *ikv, const float *ig)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const int d = c->head_dim, ID = c->index_head_dim, r = ly->ratio;
    const size_t cd = (size_t)(ly->overlap ? 2 : 1) * d, icd = 2 * (size_t)ID, nc = ly->overlap ? 2 : 1;
    size_t cap = 0;
    for (size_t sgi = 0; sgi < nseg; sgi++) cap += nc * ((rw->seg_start[sgi + 1] - rw->seg_start[sgi]) / r + 1);
    comp_seg *cs = malloc((nseg ? nseg * nc : 1) * sizeof *cs);
    comp_item *it = malloc((cap ? cap : 1) * sizeof *it);
    size_t ni = 0;
    int rc = cs && it ? 0 : RC_ENOMEM;
    for (size_t sgi = 0; sgi < nseg && !rc; sgi++) {
        const size_t r0 = rw->seg_start[sgi], n = rw->seg_start[sgi + 1] - r0;
        comp_seg *sc = cs + sgi * nc;
        for (size_t x = 0; x < nc; x++)
            sc[x] = comp_seg_of(m, l, segs[sgi].seq, (int)x, x ? ikv + r0 * icd : ckv + r0 * cd,
                                x ? ig + r0 * icd : cg + r0 * cd, n);
        for (size_t x = 0; x < nc && !rc; x++) rc = comp_plan(&sc[x], it, &ni);
    }
    if (!rc) {
        comp_job job = {.m = m, .it = it};
        be_cpu_parallel(m->be, ni, comp_task, &job);
        if (job.fail) rc = RC_ENOMEM;
    }
    /* the tasks read the partial blocks and half A as they were: update them only now */
    for (size_t k = 0; k < nseg * nc && !rc; k++) comp_finish(&cs[k]);
    free(cs);
    free(it);
    return rc;
}

/* -------------------------------------------------------------- attention */

/* Per segment: scratch for its queries. */
typedef struct {
    const md_model *m;
    const md_layer *ly;
    const md_seq *sq;
    int l;
    int64_t p0;          /* position of the segment's first token */
    size_t n;            /* tokens in the segment */
    const float *q;      /* [n, H*d] roped queries */
    const float *kbuf;   /* window keys for positions kstart .. p0+n-1 */
    int64_t kstart;
    const float *iq;     /* [n, IH*ID] indexer queries */
    const float *iw;     /* [n, IH] indexer head weights (scaled) */
    int32_t *sel;        /* [n, topk] chosen compressed entries, ascending */
    int *nsel;           /* [n] */
    int topk;
    float *o;            /* [n, H*d] output */
} attn_job;

static float *tl_scores(size_t n) { return rc_scratch(RC_SCRATCH_ATTN, n * sizeof(float)); }

typedef struct {
    float s;
    int32_t i;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1; /* higher score first */
    return (x->i > y->i) - (x->i < y->i);          /* ties: lower entry first */
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Lightning indexer for query i: score every visible entry, keep the best
 * min(topk, visible), hand them to attention in ascending order. */
static void indexer_task(void *arg, size_t i)
{
    const attn_job *j = arg;
    const md_config *c = &j->m->cfg;
    const int64_t pos = j->p0 + (int64_t)i;
    const size_t nv = (size_t)((pos + 1) / j->ly->ratio);
    const int IH = c->index_heads, ID = c->index_head_dim;
    int32_t *sel = j->sel + i * (size_t)j->topk;
    if ((int64_t)nv <= j->topk) {
        for (size_t b = 0; b < nv; b++) sel[b] = (int32_t)b;
        j->nsel[i] = (int)nv;
        return;
    }
    scored *sc = malloc(nv * sizeof *sc);
    const float *q = j->iq + i * (size_t)IH * ID, *w = j->iw + i * (size_t)IH;
    for (size_t b = 0; b < nv; b++) {
        const float *k = ent_row(j->sq, j->l, 1, b);
        float s = 0;
        for (int h = 0; h < IH; h++) {
            float dp = be_dot_f32(q + (size_t)h * ID, k, (size_t)ID);
            if (dp > 0) s += dp * w[h];
        }
        sc[b].s = s;
        sc[b].i = (int32_t)b;
    }
    qsort(sc, nv, sizeof *sc, cmp_scored);
    for (int k = 0; k < j->topk; k++) sel[k] = sc[k].i;
    qsort(sel, (size_t)j->topk, sizeof *sel, cmp_i32);
    j->nsel[i] = j->topk;
    free(sc);
}

/* Attention of query i, head h over: the window (positions pos-W+1 .. pos),
 * then the compressed entries it may see, plus the per-head sink. */
static void attn_task(void *arg, size_t t)
{
    const attn_job *j = arg;
    const md_config *c = &j->m->cfg;
    const int H = c->n_heads, d = c->head_dim;
    const size_t i = t / (size_t)H, h = t % (size_t)H;
    const int64_t pos = j->p0 + (int64_t)i;
    const float *q = j->q + i * (size_t)H * d + h * (size_t)d;
    const float scale = 1.0f / sqrtf((float)d);

    int64_t w0 = pos - c->window + 1;
    if (w0 < j->kstart) w0 = j->kstart; /* kstart = max(first position in the ring window, win_lo) */
    const size_t nw = (size_t)(pos - w0 + 1);
    size_t nc = 0;
    const int32_t *sel = NULL;
    if (j->ly->ratio) {
        if (j->ly->overlap) {
            nc = (size_t)j->nsel[i];
            sel = j->sel + i * (size_t)j->topk;
        } else {
            nc = (size_t)((pos + 1) / j->ly->ratio);
        }
    }
    float *s = tl_scores(nw + nc);
    float mx = j->ly->attn_sink[h];
    for (size_t k = 0; k < nw; k++) {
        s[k] = be_dot_f32(q, j->kbuf + (size_t)(w0 - j->kstart + (int64_t)k) * d, (size_t)d) * scale;
        mx = fmaxf(mx, s[k]);
    }
    for (size_t k = 0; k < nc; k++) {
        size_t b = sel ? (size_t)sel[k] : k;
        s[nw + k] = be_dot_f32(q, ent_row(j->sq, j->l, 0, b), (size_t)d) * scale;
        mx = fmaxf(mx, s[nw + k]);
    }
    float den = expf(j->ly->attn_sink[h] - mx);
    for (size_t k = 0; k < nw + nc; k++) den += (s[k] = expf(s[k] - mx));
    float *o = j->o + i * (size_t)H * d + h * (size_t)d;
    for (int x = 0; x < d; x++) o[x] = 0;
    for (size_t k = 0; k < nw + nc; k++) {
        const float *v = k < nw ? j->kbuf + (size_t)(w0 - j->kstart + (int64_t)k) * d
                                : ent_row(j->sq, j->l, 0, sel ? (size_t)sel[k - nw] : k - nw);
        const float p = s[k] / den;
        for (int x = 0; x < d; x++) o[x] += p * v[x];
    }
    rope(o + d - c->rope_dim, c->rope_dim, j->ly->ratio ? j->m->inv_freq_comp : j->m->inv_freq_main, pos, 1);
}

static void *xalloc(size_t n, int *fail)
{
    void *p = malloc(n ? n : 1);
    if (!p) *fail = 1;
    return p;
}

/* Attention (and the CSA indexer) of layer l for every segment, the window keys of segment s in kbufs[s] from
 * position kst[s]: in one backend call when the backend has the op, else on the host threads. */
typedef int (*attn_op)(be_backend *be, const be_attn_seq *seqs, int nseq, int ntok, const be_attn_args *a);

/* Entries a forward's layer computed on the device (comp_dev): per kind (0 entries, 1 indexer keys) the rows
 * [n, width] in (segment, entry) order, and per segment its first entry b0 and count (0: none) and where its
 * rows start in e. */
typedef struct {
    float *e[2];
    size_t n[2];
    int64_t *b0[2], *cnt[2];
    size_t *at[2];
} dev_ents;

/* The backend's attention op (be_ops.attention, or the device graph's, on backend be) for every segment, with
 * the entries de the device made (or NULL): <= 0 when it did the work (< 0: o is NaN and the backend keeps the
 * error), > 0 when it declined or there is none. */
static int attend_backend(md_model *m, be_backend *be, int l, md_segment *segs, size_t nseg, const rows_t *rw,
                          attn_op op, const float *q, const float *iq, const float *iw, float *const *kbufs,
                          const int64_t *kst, const float *krows, const dev_ents *de, float *o)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const int H = c->n_heads, d = c->head_dim, IH = c->index_heads, ID = c->index_head_dim;
    int r = 1;
    if (op && nseg <= INT32_MAX && rw->R <= INT32_MAX) {
        be_attn_seq *as = malloc(nseg * sizeof *as);
        if (as) {
            for (size_t s = 0; s < nseg; s++) {
                const md_seq *sq = segs[s].seq;
                const size_t n = segs[s].n;
                /* the blocks the last row may read, and those complete before this call: a block this call
                 * completes is not final yet for the layers after l (they write their rows later) */
                size_t need = (size_t)((sq->len + (int64_t)n + MD_BLOCK_TOKENS - 1) / MD_BLOCK_TOKENS);
                size_t full = (size_t)(sq->len / MD_BLOCK_TOKENS);
                if (need > sq->nblk) need = sq->nblk;
                if (full > need) full = need;
                as[s] = (be_attn_seq){.p0 = sq->len, .kstart = kst[s], .T = (int32_t)n, .kwin = kbufs[s],
                                      .blocks = sq->bdata, .block_ids = sq->bid, .nblk = need, .nfull = full,
                                      .win_key = krows ? sq->gen : 0, .ring = sq->L[l].win,
                                      .krows = krows ? krows + rw->seg_start[s] * (size_t)d : NULL};
                if (de) {
                    as[s].ent_dev = de->e[0] + de->at[0][s] * (size_t)d;
                    as[s].ent0 = de->b0[0][s];
                    as[s].nent = de->cnt[0][s];
                    if (de->e[1]) {
                        as[s].key_dev = de->e[1] + de->at[1][s] * (size_t)ID;
                        as[s].key0 = de->b0[1][s];
                        as[s].nkey = de->cnt[1][s];
                    }
                }
            }
            be_attn_args a = {.n_heads = H, .head_dim = d, .rope_dim = c->rope_dim, .window = c->window,
                              .ratio = ly->ratio, .csa = ly->overlap, .blk_floats = m->blk_floats,
                              .ent_off = m->blk_off[2 * l], .key_off = m->blk_off[2 * l + 1], .index_heads = IH,
                              .index_dim = ID, .topk = c->index_topk, .q = q, .iq = iq, .iw = iw,
                              .sink = ly->attn_sink, .inv_freq = ly->ratio ? m->inv_freq_comp : m->inv_freq_main,
                              .out = o, .layer = l, .ix_fp4 = m->sem == MD_SEM_OFFICIAL,
                              .kv_fp8 = m->sem == MD_SEM_OFFICIAL};
            r = op(be, as, (int)nseg, (int)rw->R, &a);
        }
        free(as);
    }
    return r;
}

/* The same on the host threads. */
static int attend_host(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *q,
                       const float *iq, const float *iw, float *const *kbufs, const int64_t *kst, float *o)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    be_backend *be = m->be;
    const int H = c->n_heads, d = c->head_dim, IH = c->index_heads, ID = c->index_head_dim;
    int rc = 0;
    for (size_t sgi = 0; sgi < nseg && !rc; sgi++) {
        md_seq *sq = segs[sgi].seq;
        const size_t r0 = rw->seg_start[sgi], n = rw->seg_start[sgi + 1] - r0;
        attn_job aj = {.m = m, .ly = ly, .sq = sq, .l = l, .p0 = sq->len, .n = n, .q = q + r0 * (size_t)H * d,
                       .kbuf = kbufs[sgi], .kstart = kst[sgi], .o = o + r0 * (size_t)H * d, .topk = c->index_topk};
        if (ly->overlap) {
            aj.iq = iq + r0 * (size_t)IH * ID;
            aj.iw = iw + r0 * (size_t)IH;
            aj.sel = malloc(n * (size_t)c->index_topk * sizeof(int32_t));
            aj.nsel = malloc(n * sizeof(int));
            if (!aj.sel || !aj.nsel) rc = RC_ENOMEM;
            else be_cpu_parallel(be, n, indexer_task, &aj);
        }
        if (!rc) be_cpu_parallel(be, n * (size_t)H, attn_task, &aj);
        free(aj.sel);
        free(aj.nsel);
    }
    return rc;
}

/* Per segment, in order: its window keys (kbufs[s] from position kst[s]: the ring's positions before the
 * segment, then its own), the compressors (a block completed by token t is visible to t), the ring.  kv [R, d],
 * ckv / cg [R, cd] (ratio > 0) and ikv / ig [R, 2 ID] (CSA) are host rows. */
/* Segment s's window keys for positions kst[s] .. p0+n-1 into kbufs[s]: the ring's positions before the segment
 * (the ring as it is before ring_step), then its own rows of kv. */
static int build_kbufs(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *kv,
                       float **kbufs, const int64_t *kst)
{
    const md_config *c = &m->cfg;
    const int d = c->head_dim, W = c->window;
    for (size_t sgi = 0; sgi < nseg; sgi++) {
        const seq_layer *sl = &segs[sgi].seq->L[l];
        const size_t r0 = rw->seg_start[sgi], n = rw->seg_start[sgi + 1] - r0;
        const int64_t p0 = segs[sgi].seq->len, kstart = kst[sgi];
        const size_t nold = (size_t)(p0 - kstart);
        float *kbuf = malloc((nold + n) * (size_t)d * sizeof(float));
        if (!kbuf) return RC_ENOMEM;
        free(kbufs[sgi]);
        kbufs[sgi] = kbuf;
        for (size_t k = 0; k < nold; k++)
            memcpy(kbuf + k * d, sl->win + (size_t)((kstart + (int64_t)k) % W) * d, (size_t)d * sizeof(float));
        memcpy(kbuf + nold * d, kv + r0 * d, n * (size_t)d * sizeof(float));
    }
    return 0;
}

/* After attention: the ring keeps the last W positions of every segment. */
static void ring_step_seg(md_model *m, int l, const md_segment *sg, size_t r0, size_t n, const float *kv)
{
    const md_config *c = &m->cfg;
    const int d = c->head_dim, W = c->window;
    seq_layer *sl = &sg->seq->L[l];
    const int64_t p0 = sg->seq->len;
    size_t keep = n < (size_t)W ? n : (size_t)W;
    for (size_t k = n - keep; k < n; k++)
        memcpy(sl->win + (size_t)((p0 + (int64_t)k) % W) * d, kv + (r0 + k) * d, (size_t)d * sizeof(float));
}

static void ring_step(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *kv)
{
    for (size_t sgi = 0; sgi < nseg; sgi++)
        ring_step_seg(m, l, &segs[sgi], rw->seg_start[sgi], rw->seg_start[sgi + 1] - rw->seg_start[sgi], kv);
}

/* Where each segment's window starts (kst[s]: the first position its attention reads, for every layer). */
static void win_starts(const md_model *m, const md_segment *segs, size_t nseg, int64_t *kst)
{
    for (size_t sgi = 0; sgi < nseg; sgi++) {
        const md_seq *sq = segs[sgi].seq;
        const int64_t kstart = sq->len - m->cfg.window + 1;
        kst[sgi] = kstart < sq->win_lo ? sq->win_lo : kstart;
    }
}

/* Before attention, per segment in order: where its window starts (kst), its window keys (kbufs, when
 * with_kbufs), and the compressors (a block completed by token t is visible to t). */
static int state_step(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *kv,
                      const float *ckv, const float *cg, const float *ikv, const float *ig, float **kbufs,
                      int64_t *kst, int with_kbufs)
{
    const md_layer *ly = &m->layers[l];
    int rc = 0;
    win_starts(m, segs, nseg, kst);
    if (with_kbufs && (rc = build_kbufs(m, l, segs, nseg, rw, kv, kbufs, kst))) return rc;
    return ly->ratio ? comp_step(m, l, segs, nseg, rw, ckv, cg, ikv, ig) : 0;
}

static int attention(md_model *m, int l, md_segment *segs, size_t nseg, const rows_t *rw, const float *x,
                     float *out)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    be_backend *be = m->be;
    const size_t R = rw->R;
    const int H = c->n_heads, d = c->head_dim, ql = c->q_lora_rank, rd = c->rope_dim, D = c->hidden_size;
    const int g = c->o_groups, ol = c->o_lora_rank, IH = c->index_heads, ID = c->index_head_dim;
    const float *inv = ly->ratio ? m->inv_freq_comp : m->inv_freq_main;
    const int official = m->sem == MD_SEM_OFFICIAL;
    int fail = 0, rc = 0;
    const int cd = ly->ratio ? (ly->overlap ? 2 : 1) * d : 0;

    float *qr = xalloc(R * ql * sizeof(float), &fail);
    float *q = xalloc(R * (size_t)H * d * sizeof(float), &fail);
    float *kv = xalloc(R * (size_t)d * sizeof(float), &fail);
    float *o = xalloc(R * (size_t)H * d * sizeof(float), &fail);
    float *u = xalloc(R * (size_t)g * ol * sizeof(float), &fail);
    float *ckv = NULL, *cg = NULL, *ikv = NULL, *ig = NULL, *iq = NULL, *iw = NULL;
    float **kbufs = NULL;
    int64_t *kst = NULL;
    if (ly->ratio) {
        ckv = xalloc(R * (size_t)cd * sizeof(float), &fail);
        cg = xalloc(R * (size_t)cd * sizeof(float), &fail);
    }
    if (ly->overlap) {
        ikv = xalloc(R * 2 * (size_t)ID * sizeof(float), &fail);
        ig = xalloc(R * 2 * (size_t)ID * sizeof(float), &fail);
        iq = xalloc(R * (size_t)IH * ID * sizeof(float), &fail);
        iw = xalloc(R * (size_t)IH * sizeof(float), &fail);
    }
    float *xq = NULL, *qrq = NULL; /* official: the FP8 activations of the FP8 / FP4 GEMMs (act_fp8) */
    if (!fail) xq = act_quant_copy(be, x, R, (size_t)D, act_fp8(m, &ly->wq_a) || act_fp8(m, &ly->wkv), &fail);
    if (fail) { rc = RC_ENOMEM; goto out; }

    /* queries: low rank, q_norm, per-head unweighted RMSNorm, RoPE on the tail */
    be->ops->linear(be, qr, act_in(m, &ly->wq_a, x, xq), R, &ly->wq_a);
    be->ops->rmsnorm(be, qr, qr, R, (size_t)ql, ly->q_norm, c->rms_eps);
    qrq = act_quant_copy(be, qr, R, (size_t)ql, act_fp8(m, &ly->wq_b) || (ly->overlap && act_fp8(m, &ly->i_wq_b)),
                         &fail);
    if (fail) { rc = RC_ENOMEM; goto out; }
    be->ops->linear(be, q, act_in(m, &ly->wq_b, qr, qrq), R, &ly->wq_b);
    be->ops->rmsnorm(be, q, q, R * H, (size_t)d, NULL, c->rms_eps);
    for (size_t t = 0; t < R; t++)
        for (int h = 0; h < H; h++) rope(q + (t * H + h) * d + d - rd, rd, inv, rw->pos[t], 0);
    /* the single K=V head */
    be->ops->linear(be, kv, act_in(m, &ly->wkv, x, xq), R, &ly->wkv);
    be->ops->rmsnorm(be, kv, kv, R, (size_t)d, ly->kv_norm, c->rms_eps);
    for (size_t t = 0; t < R; t++) {
        rope(kv + t * d + d - rd, rd, inv, rw->pos[t], 0);
        if (official) fq_fp8(kv + t * d, (size_t)(d - rd), 64);
    }
    if (ly->ratio) {
        be->ops->linear(be, ckv, x, R, &ly->c_wkv);
        be->ops->linear(be, cg, x, R, &ly->c_wgate);
    }
    if (ly->overlap) {
        be->ops->linear(be, ikv, x, R, &ly->i_wkv);
        be->ops->linear(be, ig, x, R, &ly->i_wgate);
        be->ops->linear(be, iq, act_in(m, &ly->i_wq_b, qr, qrq), R, &ly->i_wq_b);
        be->ops->linear(be, iw, x, R, &ly->i_wproj);
        const float wscale = 1.0f / sqrtf((float)ID) * (1.0f / sqrtf((float)IH));
        for (size_t t = 0; t < R * IH; t++) iw[t] *= wscale;
        for (size_t t = 0; t < R; t++)
            for (int h = 0; h < IH; h++) {
                float *qh = iq + (t * IH + h) * ID;
                rope(qh + ID - rd, rd, m->inv_freq_comp, rw->pos[t], 0);
                if (official) {
                    if (is_pow2((size_t)ID)) hadamard(qh, (size_t)ID);
                    fq_fp4(qh, (size_t)ID, 32);
                }
            }
    }

    kbufs = calloc(nseg ? nseg : 1, sizeof *kbufs);
    kst = calloc(nseg ? nseg : 1, sizeof *kst);
    if (!kbufs || !kst) { rc = RC_ENOMEM; goto out; }
    rc = state_step(m, l, segs, nseg, rw, kv, ckv, cg, ikv, ig, kbufs, kst, 1);
    if (!rc && attend_backend(m, be, l, segs, nseg, rw, be->ops->attention, q, iq, iw, kbufs, kst, NULL, NULL, o) > 0)
        rc = attend_host(m, l, segs, nseg, rw, q, iq, iw, kbufs, kst, o);
    if (rc) goto out;
    ring_step(m, l, segs, nseg, rw, kv);

    /* grouped output projection: group gi of heads -> o_lora_rank, then wo_b */
    {
        const int64_t per = (int64_t)H * d / g;
        if (be->ops->linear_grouped && ly->wo_a.rows == (int64_t)g * ol && ly->wo_a.cols == per)
            be->ops->linear_grouped(be, u, o, R, &ly->wo_a, g);
        else
            for (int gi = 0; gi < g; gi++)
                be->ops->linear_rows(be, u + (size_t)gi * ol, (size_t)g * ol, o + (size_t)gi * per, (size_t)H * d, R,
                                     &ly->wo_a, (int64_t)gi * ol, ol, 0);
        if (act_fp8(m, &ly->wo_b)) act_quant_rows(be, u, R, (size_t)g * ol);
        be->ops->linear(be, out, u, R, &ly->wo_b);
    }
out:
    if (kbufs)
        for (size_t i = 0; i < nseg; i++) free(kbufs[i]);
    free(kbufs); free(kst);
    free(xq); free(qrq);
    free(qr); free(q); free(kv); free(o); free(u);
    free(ckv); free(cg); free(ikv); free(ig); free(iq); free(iw);
    return rc;
}

/* -------------------------------------------------------------------- MoE */

static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void swiglu(float *gt, const float *up, size_t n, float limit)
{
    for (size_t i = 0; i < n; i++) {
        float g = gt[i], u = up[i];
        if (limit > 0) {
            g = fminf(g, limit);
            u = fmaxf(-limit, fminf(u, limit));
        }
        gt[i] = g / (1.0f + expf(-g)) * u;
    }
}

static be_route route_params(const md_model *m, int l)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    return (be_route){.E = c->n_experts, .K = c->top_k, .score_func = c->score_func,
                      .official = m->sem == MD_SEM_OFFICIAL, .vocab = c->vocab_size, .route_scale = c->route_scale,
                      .bias = ly->hash ? NULL : ly->gate_bias, .tid2eid = ly->hash ? ly->tid2eid : NULL};
}

/* routing: sqrt(softplus(x . gate)) (or sigmoid), top-k of score + bias (or the hash table), weights
 * renormalised over the chosen k and scaled.  logit [R, E] becomes the scores. */
static void route_rows(const be_route *ra, float *logit, const int32_t *ids, size_t R, int32_t *idx, float *wt)
{
    const int E = ra->E, K = ra->K;
    for (size_t t = 0; t < R; t++) {
        float *s = logit + t * E;
        for (int e = 0; e < E; e++) {
            float v = s[e];
            s[e] = ra->score_func == 1 ? sigmoidf(v) : sqrtf(softplusf(v));
        }
        int32_t *ix = idx + t * K;
        if (ra->tid2eid) {
            memcpy(ix, ra->tid2eid + (size_t)ids[t] * K, (size_t)K * sizeof(int32_t));
        } else {
            for (int k = 0; k < K; k++) {
                int best = -1;
                float bv = -INFINITY;
                for (int e = 0; e < E; e++) {
                    int taken = 0;
                    for (int q = 0; q < k; q++) taken |= ix[q] == e;
                    float v = s[e] + ra->bias[e];
                    if (!taken && (best < 0 || v > bv)) { best = e; bv = v; }
                }
                ix[k] = best;
            }
        }
        float sum = 0;
        for (int k = 0; k < K; k++) sum += (wt[t * K + k] = s[ix[k]]);
        if (!ra->official) sum += 1e-20f;
        for (int k = 0; k < K; k++) wt[t * K + k] = wt[t * K + k] / sum * ra->route_scale;
    }
}

/* act_fp8 over a layer's routed experts: any_in, whether some w1 / w3 takes the quantised x; uniform, whether
 * every w1 and w3 agree (in) and every w2 agrees (out), as a grouped expert op needs (be_ops.moe's flags).  From
 * the formats found at load (md_layer.moe_q_*): nothing per step but the semantics test. */
typedef struct {
    int any_in, uniform, in, out;
} moe_aq;

static moe_aq moe_act(const md_model *m, const md_layer *ly)
{
    if (m->sem != MD_SEM_OFFICIAL) return (moe_aq){0, 1, 0, 0};
    return (moe_aq){ly->moe_q_any, ly->moe_q_uniform, ly->moe_q_in, ly->moe_q_out};
}

static int moe_flags(int official, moe_aq a)
{
    return (official ? BE_MOE_WEIGHT_BEFORE_W2 : 0) | (a.out ? BE_MOE_ACT_FP8_H : 0) | (a.in ? BE_MOE_ACT_FP8_X : 0);
}

static int moe(md_model *m, int l, const rows_t *rw, const float *x, float *y)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    be_backend *be = m->be;
    const size_t R = rw->R;
    const int E = c->n_experts, K = c->top_k, I = c->moe_inter, D = c->hidden_size;
    const int official = m->sem == MD_SEM_OFFICIAL;
    int fail = 0, rc = 0;
    float *logit = xalloc(R * (size_t)E * sizeof(float), &fail);
    int32_t *idx = xalloc(R * (size_t)K * sizeof(int32_t), &fail);
    float *wt = xalloc(R * (size_t)K * sizeof(float), &fail);
    size_t *rows = xalloc(R * sizeof(size_t), &fail);
    float *xs = xalloc(R * (size_t)D * sizeof(float), &fail);
    float *g = xalloc(R * (size_t)I * sizeof(float), &fail);
    float *up = xalloc(R * (size_t)I * sizeof(float), &fail);
    float *dn = xalloc(R * (size_t)D * sizeof(float), &fail);
    float *rw_e = xalloc(R * sizeof(float), &fail);
    float *xq = NULL; /* official: x as the FP8 / FP4 expert GEMMs take it (act_fp8) */
    const moe_aq aq = moe_act(m, ly);
    if (!fail) xq = act_quant_copy(be, x, R, (size_t)D, aq.any_in, &fail);
    if (fail) { rc = RC_ENOMEM; goto out; }

    be->ops->linear(be, logit, x, R, &ly->gate);
    be_route ra = route_params(m, l);
    route_rows(&ra, logit, rw->ids, R, idx, wt);

    /* experts in ascending id, so every token sums its experts in the same
     * order however the batch is made */
    memset(y, 0, R * (size_t)D * sizeof(float));
    /* a backend with a grouped expert kernel does them all at once (same order) */
    const int grouped = aq.uniform && be->ops->moe &&
                        be->ops->moe(be, y, aq.in ? xq : x, R, idx, wt, K, ly->w1, ly->w3, ly->w2, E, c->swiglu_limit,
                                     moe_flags(official, aq)) <= 0;
    for (int e = 0; !grouped && e < E; e++) {
        size_t ne = 0;
        for (size_t t = 0; t < R; t++)
            for (int k = 0; k < K; k++)
                if (idx[t * K + k] == e) {
                    rows[ne] = t;
                    rw_e[ne] = wt[t * K + k];
                    ne++;
                }
        if (!ne) continue;
        /* w1 and w3 each take x as its own GEMM quantises it (act_fp8) */
        const float *s1 = act_in(m, &ly->w1[e], x, xq), *s3 = act_in(m, &ly->w3[e], x, xq);
        for (size_t r = 0; r < ne; r++) memcpy(xs + r * D, s1 + rows[r] * D, (size_t)D * sizeof(float));
        be->ops->linear(be, g, xs, ne, &ly->w1[e]);
        if (s3 != s1)
            for (size_t r = 0; r < ne; r++) memcpy(xs + r * D, s3 + rows[r] * D, (size_t)D * sizeof(float));
        be->ops->linear(be, up, xs, ne, &ly->w3[e]);
        for (size_t r = 0; r < ne; r++) {
            swiglu(g + r * I, up + r * I, (size_t)I, c->swiglu_limit);
            if (official) /* the routing weight goes in before w2 */
                for (int i = 0; i < I; i++) g[r * I + i] *= rw_e[r];
        }
        if (act_fp8(m, &ly->w2[e])) act_quant_rows(be, g, ne, (size_t)I);
        be->ops->linear(be, dn, g, ne, &ly->w2[e]);
        for (size_t r = 0; r < ne; r++) {
            float *yr = y + rows[r] * D;
            const float f = official ? 1.0f : rw_e[r];
            for (int i = 0; i < D; i++) yr[i] += official ? dn[r * D + i] : dn[r * D + i] * f;
        }
    }
    /* shared expert */
    if (!xq && (act_fp8(m, &ly->sw1) || act_fp8(m, &ly->sw3)) &&
        !(xq = act_quant_copy(be, x, R, (size_t)D, 1, &fail))) { rc = RC_ENOMEM; goto out; }
    be->ops->linear(be, g, act_in(m, &ly->sw1, x, xq), R, &ly->sw1);
    be->ops->linear(be, up, act_in(m, &ly->sw3, x, xq), R, &ly->sw3);
    for (size_t t = 0; t < R; t++) swiglu(g + t * I, up + t * I, (size_t)I, c->swiglu_limit);
    if (act_fp8(m, &ly->sw2)) act_quant_rows(be, g, R, (size_t)I);
    be->ops->linear(be, dn, g, R, &ly->sw2);
    for (size_t i = 0; i < R * (size_t)D; i++) y[i] += dn[i];
out:
    free(xq);
    free(logit); free(idx); free(wt); free(rows); free(xs); free(g); free(up); free(dn); free(rw_e);
    return rc;
}

/* ------------------------------------------------- the device-resident forward
 *
 * The same graph as md_forward's host path, for a backend with be_ops.dev:
 * every activation stays in the backend's memory and every op is the
 * backend's.  What stays on the host is the sequences' state (window rings,
 * compressor partial blocks, KV blocks): per layer, the rows that extend it
 * (window key, compressor and indexer-compressor inputs) come down in one
 * download, state_step runs as on the host path, and the attention op reads
 * the window keys and blocks from host memory as be_ops.attention does.  A
 * layer waits for the device for that only where a segment completes a
 * compressed entry in it (the entry is visible to the token that completes
 * it); every other layer's update runs after the forward (late_state), which
 * at decode is most layers of most steps.  Moving the state onto the device
 * removes the remaining waits (docs/CUDA.md). */

typedef struct {
    md_model *m;
    be_backend *be;
    const be_dev_ops *dv;
    const rows_t *rw;
    const int32_t *ids;  /* device [R] */
    const int64_t *pos;  /* device [R] */
    int oom;
    int state_late, dev_comp; /* DEEPINFER_STATE_LATE, DEEPINFER_DEV_COMP (not "0"), read once per forward */
    int late_early;           /* DEEPINFER_LATE_START (not "0"): late_start starts the late rows down */
    int merge;                /* DEEPINFER_REGION_MERGE (not "0"): a layer's attention output and FFN one region */
    /* layers whose state update waits for the end of the forward: their rows (device [R, xw]) */
    int *late_l;
    const float **late_xs;
    dev_ents *late_de;   /* the entries the layer made on the device (comp_dev), or all zero */
    int *late_dn;        /* what late_start started down (be_dev_ops.down_start): 1 the rows, 2 << k entries k */
    size_t nlate;
    float **xs;          /* [n_layers]: each layer's rows that extend the state (device [R, xw], keep arena), all
                          * allocated at the start of the forward, so that their addresses depend on R alone */
} dev_ctx;

static void dev_ents_free(dev_ents *de)
{
    for (int k = 0; k < 2; k++) {
        free(de->b0[k]);
        free(de->cnt[k]);
        free(de->at[k]);
    }
    memset(de, 0, sizeof *de);
}

static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

static void *dalloc(dev_ctx *x, size_t bytes)
{
    void *p = x->dv->alloc(x->be, bytes ? bytes : 4);
    if (!p) x->oom = 1;
    return p;
}

/* device memory that outlives its layer (the late state's rows and entries): the layer's release leaves it */
static void *dalloc_keep(dev_ctx *x, size_t bytes)
{
    void *p = x->dv->alloc_keep ? x->dv->alloc_keep(x->be, bytes ? bytes : 4) : x->dv->alloc(x->be, bytes ? bytes : 4);
    if (!p) x->oom = 1;
    return p;
}

/* dv->linear of w on its input in: where act_fp8, the quantised copy xq (told to the backend through linear_x8),
 * or, when there is none (xq NULL: the backend has linear_aq), in itself through linear_aq, which quantises as it
 * goes; else in itself */
static void dlinear(dev_ctx *x, float *y, const float *in, const float *xq, size_t R, const be_weight *w)
{
    if (!act_fp8(x->m, w)) x->dv->linear(x->be, y, in, R, w);
    else if (xq) x->dv->linear_x8(x->be, y, xq, R, w);
    else x->dv->linear_aq(x->be, y, in, R, w);
}

/* act_quant_copy on the device: a quantised copy of src [R, K] when need, else NULL (x->oom on no memory).  fuse:
 * every reader of the copy is a dlinear, so a backend with linear_aq needs none (NULL) */
static float *dact_quant_copy(dev_ctx *x, const float *src, size_t R, size_t K, int need, int fuse)
{
    if (!need || (fuse && x->dv->linear_aq)) return NULL;
    float *q = dalloc(x, R * K * sizeof(float));
    if (!q) return NULL;
    x->dv->copy(x->be, q, src, R * K * sizeof(float));
    x->dv->fq(x->be, q, R, K, K, MD_ACT_BLOCK, 0);
    return q;
}

/* Regions and lanes are for batches of up to this many rows (decode): there a step's kernels are short and
 * latency-bound, and launching them from a recording, side by side where independent, saves time (the V4-Flash
 * slice on an H200: 1.51 -> 1.32 ms a batch-1 step, 11.2 -> 10.8 ms at batch 256); a prefill's GEMMs fill the GPU
 * one at a time, and a recording of its regions would be used a few times at most. */
#define DEV_REGION_ROWS 512

static int dev_regions(const dev_ctx *x) { return x->rw->R <= DEV_REGION_ROWS; }

/* A region of launches (be_dev_ops.graph_begin): 1 when the backend replayed it (skip its ops).  The tag names
 * what decides the region's ops: the model, its semantics, the layer, the region, the batch's rows. */
static int dregion_begin(dev_ctx *x, int l, int part)
{
    if (!x->dv->graph_begin || !x->dv->graph_end || !dev_regions(x)) return 0;
    const uint64_t v[5] = {(uint64_t)(uintptr_t)x->m, (uint64_t)x->m->sem, (uint64_t)l, (uint64_t)part,
                           (uint64_t)x->rw->R};
    uint64_t tag = 1469598103934665603ull;
    for (int i = 0; i < 5; i++) tag = (tag ^ v[i]) * 1099511628211ull;
    return x->dv->graph_begin(x->be, tag);
}

static void dregion_end(dev_ctx *x)
{
    if (x->dv->graph_begin && x->dv->graph_end && dev_regions(x)) x->dv->graph_end(x->be);
}

/* independent chains of ops on the backend's lanes (be_dev_ops.lane; without it all on one) */
static void dlane(dev_ctx *x, int k)
{
    if (x->dv->lane && x->dv->join && dev_regions(x)) x->dv->lane(x->be, k);
}

static void djoin(dev_ctx *x)
{
    if (x->dv->lane && x->dv->join && dev_regions(x)) x->dv->join(x->be);
}

/* hc_pre (head 0) or hc_head (head 1) of X, then the RMSNorm of coll with the model's weight w, and (xq != NULL)
 * act_quant's copy of coll into xq: in one op where the backend fuses them (be_dev_ops.hc_pre_norm), else one by one */
static void dhc_pre_norm(dev_ctx *x, const be_hc *h, int head, const float *X, size_t R, float *coll, float *post,
                         float *comb, const float *w, float *xq)
{
    const be_dev_ops *dv = x->dv;
    const float eps = x->m->cfg.rms_eps;
    if (dv->hc_pre_norm && dv->hc_pre_norm(x->be, h, head, X, R, coll, post, comb, w, eps, xq) == 0) return;
    if (head) dv->hc_head(x->be, h, X, R, coll);
    else dv->hc_pre(x->be, h, X, R, coll, post, comb);
    dv->rmsnorm(x->be, coll, coll, R, (size_t)h->D, w, eps);
    if (xq) {
        dv->copy(x->be, xq, coll, R * (size_t)h->D * sizeof(float));
        dv->fq(x->be, xq, R, (size_t)h->D, (size_t)h->D, MD_ACT_BLOCK, 0);
    }
}

/* rmsnorm of each row of x [rows, dim] in place, then RoPE on its last rd channels at pos[r / per]: in one op where
 * the backend fuses them (be_dev_ops.norm_rope), else one by one */
static void dnorm_rope(dev_ctx *x, float *v, size_t rows, size_t dim, const float *w, int rd, const float *inv, int per)
{
    const be_dev_ops *dv = x->dv;
    const float eps = x->m->cfg.rms_eps;
    if (dv->norm_rope && dv->norm_rope(x->be, v, rows, dim, w, eps, rd, inv, x->pos, per) == 0) return;
    dv->rmsnorm(x->be, v, v, rows, dim, w, eps);
    dv->rope(x->be, v, rows, dim, dim - (size_t)rd, rd, inv, x->pos, per);
}

/* f += f2, then hc_post of X with f: in one op where the backend fuses them (be_dev_ops.hc_post_add), else one by one */
static void dhc_post_add(dev_ctx *x, float *X, float *f, const float *f2, const float *post, const float *comb, size_t R)
{
    const be_dev_ops *dv = x->dv;
    const int n = x->m->cfg.hc_mult, D = x->m->cfg.hidden_size;
    if (dv->hc_post_add && dv->hc_post_add(x->be, X, f, f2, post, comb, n, D, R) == 0) return;
    dv->add(x->be, f, f2, R * (size_t)D);
    dv->hc_post(x->be, X, f, post, comb, n, D, R);
}

/* the host path of attention for device activations: q, iq, iw down, o up (the backend declined) */
static int attend_dev_host(dev_ctx *x, int l, md_segment *segs, size_t nseg, const float *q, const float *iq,
                           const float *iw, float *const *kbufs, const int64_t *kst, float *o)
{
    const md_config *c = &x->m->cfg;
    const size_t R = x->rw->R, qn = R * (size_t)c->n_heads * c->head_dim;
    const size_t iqn = iq ? R * (size_t)c->index_heads * c->index_head_dim : 0, iwn = iw ? R * (size_t)c->index_heads : 0;
    float *hq = malloc(qn * sizeof(float)), *ho = malloc(qn * sizeof(float));
    float *hiq = iqn ? malloc(iqn * sizeof(float)) : NULL, *hiw = iwn ? malloc(iwn * sizeof(float)) : NULL;
    int rc = (!hq || !ho || (iqn && !hiq) || (iwn && !hiw)) ? RC_ENOMEM : 0;
    if (!rc && (x->dv->download(x->be, hq, q, qn * sizeof(float)) ||
                (iqn && x->dv->download(x->be, hiq, iq, iqn * sizeof(float))) ||
                (iwn && x->dv->download(x->be, hiw, iw, iwn * sizeof(float)))))
        rc = RC_EIO;
    if (!rc) rc = attend_host(x->m, l, segs, nseg, x->rw, hq, hiq, hiw, kbufs, kst, ho);
    if (!rc) x->dv->upload(x->be, o, ho, qn * sizeof(float));
    free(hq); free(ho); free(hiq); free(hiw);
    return rc;
}

/* Whether layer l's compressors complete an entry in this forward (one that its attention may read): only then
 * must the state's update run before the attention.  The update is otherwise the partial blocks' and the ring's,
 * which nothing in this forward reads. */
static int comp_completes(const md_model *m, int l, const md_segment *segs, size_t nseg)
{
    const md_layer *ly = &m->layers[l];
    if (!ly->ratio) return 0;
    for (size_t s = 0; s < nseg; s++) {
        const md_seq *sq = segs[s].seq;
        const seq_layer *sl = &sq->L[l];
        const int64_t end = (sq->len + (int64_t)segs[s].n) / ly->ratio, b = sq->len / ly->ratio;
        if ((b > (int64_t)sl->c_n ? b : (int64_t)sl->c_n) < end) return 1;
        if (ly->overlap && (b > (int64_t)sl->i_n ? b : (int64_t)sl->i_n) < end) return 1;
    }
    return 0;
}

/* Width of layer l's state rows (kv [R, d], ckv, cg [R, cd], ikv, ig [R, 2 ID], one buffer) */
static size_t state_width(const md_model *m, int l, size_t *cd, size_t *icd)
{
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const size_t d = (size_t)c->head_dim;
    *cd = ly->ratio ? (ly->overlap ? 2 : 1) * d : 0;
    *icd = ly->overlap ? 2 * (size_t)c->index_head_dim : 0;
    return d + 2 * *cd + 2 * *icd;
}

/* After a forward whose entries are written (or that completes none): each compressor's partial block and half A
 * as pushing the rows leaves them (comp_finish).  rows: ckv, cg, ikv, ig, host [R, width]. */
static void comp_push_seg(md_model *m, int l, const md_segment *sg, size_t r0, size_t n, const float *const rows[4])
{
    const md_layer *ly = &m->layers[l];
    const size_t d = (size_t)m->cfg.head_dim, ID = (size_t)m->cfg.index_head_dim;
    const size_t cd = (ly->overlap ? 2 : 1) * d, icd = 2 * ID;
    for (int k = 0; k < (ly->overlap ? 2 : 1); k++) {
        comp_seg cs = comp_seg_of(m, l, sg->seq, k, rows[2 * k] + r0 * (k ? icd : cd),
                                  rows[2 * k + 1] + r0 * (k ? icd : cd), n);
        comp_finish(&cs);
    }
}

/* late_start's buffers (be_dev_ops.down_start): late layer i's rows, and its entries k */
static int dn_rows(size_t i) { return (int)(3 * i); }
static int dn_ents(size_t i, int k) { return (int)(3 * i + 1 + (size_t)k); }

/* The entries of de (made on the device) on the host: he[k] (own[k]: ours to free); dn: late_start started them
 * down as late layer i's (late_dn[i]), else 0 */
static int ents_fetch(dev_ctx *x, const dev_ents *de, size_t i, int dn, const float *he[2], float *own[2])
{
    const md_config *c = &x->m->cfg;
    he[0] = he[1] = NULL;
    own[0] = own[1] = NULL;
    for (int k = 0; k < 2; k++) {
        if (!de->n[k]) continue;
        const size_t hd = (size_t)(k ? c->index_head_dim : c->head_dim);
        if (dn & (2 << k)) {
            he[k] = x->dv->down_take(x->be, dn_ents(i, k));
            if (!he[k]) return RC_EIO;
        } else {
            he[k] = own[k] = malloc(de->n[k] * hd * sizeof(float));
            if (!own[k]) return RC_ENOMEM;
            if (x->dv->download(x->be, own[k], de->e[k], de->n[k] * hd * sizeof(float))) return RC_EIO;
        }
    }
    return 0;
}

/* segment s's entries (he: ents_fetch's) into its blocks */
static void ents_put_seg(const md_model *m, int l, const md_segment *sg, size_t s, const dev_ents *de,
                         const float *const he[2])
{
    for (int k = 0; k < 2; k++) {
        if (!he[k]) continue;
        const size_t hd = (size_t)(k ? m->cfg.index_head_dim : m->cfg.head_dim);
        for (int64_t j = 0; j < de->cnt[k][s]; j++)
            memcpy(ent_row(sg->seq, l, k, (size_t)(de->b0[k][s] + j)), he[k] + (de->at[k][s] + (size_t)j) * hd,
                   hd * sizeof(float));
    }
}

/* The entries of de into the sequences' blocks (ents_fetch, then each segment's) */
static int ents_write(dev_ctx *x, int l, md_segment *segs, size_t nseg, const dev_ents *de, size_t i, int dn)
{
    const float *he[2];
    float *own[2];
    int rc = ents_fetch(x, de, i, dn, he, own);
    for (size_t s = 0; s < nseg && !rc; s++) ents_put_seg(x->m, l, &segs[s], s, de, he);
    free(own[0]);
    free(own[1]);
    return rc;
}

/* fn(arg, s) for every segment: on the host threads from SEG_PAR_MIN segments, below that on this thread (a few
 * segments' copies take less than waking the pool; late_state runs between steps, on the step's critical path) */
#define SEG_PAR_MIN 16
static void seg_tasks(be_backend *be, size_t nseg, be_task_fn fn, void *arg)
{
    if (nseg < SEG_PAR_MIN)
        for (size_t s = 0; s < nseg; s++) fn(arg, s);
    else be_cpu_parallel(be, nseg, fn, arg);
}

/* comp_dev's host side for one segment: its state arrays into the staging (hp, at its offset; device twin dp) and
 * its entries' slots into hs and hpos */
typedef struct {
    md_segment *segs;
    const size_t *st; /* rows' segment starts */
    const float *rkv0, *rg0; /* this forward's rows of the region (device) */
    const int64_t *b0, *cnt;
    const size_t *at, *po;
    float *hp;
    const float *dp;
    be_comp_slot *hs;
    int64_t *hpos;
    int l, k, r, ov, ns, hd, c0;
    size_t cd;
} comp_stage_job;

static void comp_stage_task(void *arg, size_t s)
{
    const comp_stage_job *j = arg;
    if (!j->cnt[s]) return;
    const int r = j->r, ov = j->ov, hd = j->hd, k = j->k;
    const size_t cd = j->cd, rcd = (size_t)r * cd, rh = (size_t)r * (size_t)hd;
    md_seq *sq = j->segs[s].seq;
    const seq_layer *sl = &sq->L[j->l];
    const int64_t p0 = sq->len;
    const float *rkv = j->rkv0 + j->st[s] * cd, *rg = j->rg0 + j->st[s] * cd;
    /* the state's arrays: host copies into hp, their device addresses in dp */
    size_t po = j->po[s];
    memcpy(j->hp + po, k ? sl->i_kv : sl->c_kv, rcd * sizeof(float));
    memcpy(j->hp + po + rcd, k ? sl->i_gate : sl->c_gate, rcd * sizeof(float));
    const float *pkv = j->dp + po, *pg = j->dp + po + rcd, *okv = NULL, *og = NULL;
    po += 2 * rcd;
    if (ov) {
        memcpy(j->hp + po, k ? sl->i_ovkv : sl->c_ovkv, rh * sizeof(float));
        memcpy(j->hp + po + rh, k ? sl->i_ovg : sl->c_ovg, rh * sizeof(float));
        okv = j->dp + po;
        og = j->dp + po + rh;
    }
    for (int64_t e = 0; e < j->cnt[s]; e++) {
        const int64_t b = j->b0[s] + e;
        be_comp_slot *o = j->hs + (j->at[s] + (size_t)e) * (size_t)j->ns;
        j->hpos[j->at[s] + (size_t)e] = b * r;
        /* comp_task's slots: the previous block's half A (own: gathered at c0 0; else the state's), then block b at
         * c0; a position before p0 from the partial block, later ones from the rows + ape */
        for (int q = 0; q < 2; q++) {
            if (q == 0 && !ov) continue;
            const int64_t blk = q ? b : b - 1;
            const size_t off = q ? (size_t)j->c0 : 0;
            be_comp_slot *os = o + (q && ov ? r : 0);
            for (int i = 0; i < r; i++) {
                const int64_t pos = blk * r + i;
                if (!q && b == 0) os[i] = (be_comp_slot){NULL, NULL, -1};
                else if (!q && b * r <= p0) os[i] = (be_comp_slot){okv + (size_t)i * hd, og + (size_t)i * hd, -1};
                else if (pos < p0) os[i] = (be_comp_slot){pkv + (size_t)i * cd + off, pg + (size_t)i * cd + off, -1};
                else os[i] = (be_comp_slot){rkv + (size_t)(pos - p0) * cd + off, rg + (size_t)(pos - p0) * cd + off,
                                            (int64_t)((size_t)i * cd + off)};
            }
        }
    }
}

/* Layer l's compressors on the device (be_dev_ops.comp_pool), for the entries this forward's segments complete:
 * into de, which the layer's attention reads (be_attn_seq.ent_dev) and late_state writes into the blocks.  Each
 * entry's slots are comp_gather's: rows of this forward (rows: ckv, cg, ikv, ig, device [R, width]) or the
 * state's partial block / half A (uploaded here); comp_pool pools them, then device ops do comp_post's norm,
 * RoPE and round trip over all entries at once.  The state is not changed but for its block table (ent_slot). */
static int comp_dev(dev_ctx *x, int l, md_segment *segs, size_t nseg, const float *const rows[4], dev_ents *de)
{
    md_model *m = x->m;
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const be_dev_ops *dv = x->dv;
    be_backend *be = x->be;
    const size_t *st = x->rw->seg_start;
    const int r = ly->ratio, ov = ly->overlap, ns = ov ? 2 * r : r, rd = c->rope_dim;
    int rc = 0;
    memset(de, 0, sizeof *de);
    size_t *po = malloc((nseg ? nseg : 1) * sizeof *po);
    if (!po) return RC_ENOMEM;
    for (int k = 0; k < (ov ? 2 : 1) && !rc; k++) {
        const int hd = k ? c->index_head_dim : c->head_dim, c0 = ov ? hd : 0;
        const size_t cd = (size_t)(ov ? 2 : 1) * (size_t)hd;
        int64_t *b0 = de->b0[k] = malloc((nseg ? nseg : 1) * sizeof(int64_t));
        int64_t *cnt = de->cnt[k] = malloc((nseg ? nseg : 1) * sizeof(int64_t));
        size_t *at = de->at[k] = malloc((nseg ? nseg : 1) * sizeof(size_t));
        if (!b0 || !cnt || !at) {
            rc = RC_ENOMEM;
            break;
        }
        /* per segment its entries; the state arrays it reads travel: partial block kv, gate [r, cd], half A [r, hd] */
        size_t n = 0, pri = 0;
        for (size_t s = 0; s < nseg && !rc; s++) {
            comp_seg cs = comp_seg_of(m, l, segs[s].seq, k, NULL, NULL, segs[s].n);
            int64_t b;
            const int64_t end = comp_range(&cs, &b);
            b0[s] = b;
            cnt[s] = end - b;
            at[s] = n;
            po[s] = pri;
            n += (size_t)cnt[s];
            for (int64_t e = b; e < end && !rc; e++) rc = ent_slot(segs[s].seq, l, (size_t)e);
            if (cnt[s]) pri += 2 * (size_t)r * (cd + (ov ? (size_t)hd : 0));
        }
        de->n[k] = n;
        if (rc || !n) continue;
        /* the host side in a scratch of this thread (kept between calls: at batch 256 a fresh 12 MB malloc a
         * call faulted its pages in at ~2 GB/s) and, from SEG_PAR_MIN segments, over the host threads */
        const size_t hpb = (pri ? pri : 1) * sizeof(float), hsb = n * (size_t)ns * sizeof(be_comp_slot);
        const size_t hsa = (hpb + 63) & ~(size_t)63, hoa = (hsa + hsb + 63) & ~(size_t)63;
        char *hb = rc_scratch(RC_SCRATCH_COMP, hoa + n * sizeof(int64_t));
        float *hp = (float *)hb;
        be_comp_slot *hs = hb ? (be_comp_slot *)(hb + hsa) : NULL;
        int64_t *hpos = hb ? (int64_t *)(hb + hoa) : NULL;
        float *dp = dalloc(x, (pri ? pri : 1) * sizeof(float));
        be_comp_slot *ds = dalloc(x, n * (size_t)ns * sizeof *ds);
        int64_t *dpos = dalloc(x, n * sizeof *dpos);
        float *E = de->e[k] = dalloc_keep(x, n * (size_t)hd * sizeof(float)); /* late_state reads it */
        if (!hb || x->oom) rc = RC_ENOMEM;
        if (!rc) {
            comp_stage_job job = {.segs = segs, .st = st, .rkv0 = rows[2 * k], .rg0 = rows[2 * k + 1], .b0 = b0,
                                  .cnt = cnt, .at = at, .po = po, .hp = hp, .dp = dp, .hs = hs, .hpos = hpos, .l = l,
                                  .k = k, .r = r, .ov = ov, .ns = ns, .hd = hd, .c0 = c0, .cd = cd};
            seg_tasks(be, nseg, comp_stage_task, &job);
            if (pri) dv->upload(be, dp, hp, pri * sizeof(float));
            dv->upload(be, ds, hs, n * (size_t)ns * sizeof *ds);
            dv->upload(be, dpos, hpos, n * sizeof *dpos);
            dv->comp_pool(be, E, n, ns, hd, ds, k ? ly->i_ape : ly->c_ape, (size_t)r * cd);
            dv->rmsnorm(be, E, E, n, (size_t)hd, k ? ly->i_norm : ly->c_norm, c->rms_eps);
            dv->rope(be, E, n, (size_t)hd, (size_t)(hd - rd), rd, m->inv_freq_comp, dpos, 1);
            if (m->sem == MD_SEM_OFFICIAL) {
                if (k) {
                    if (is_pow2((size_t)hd)) dv->hadamard(be, E, n, (size_t)hd);
                    dv->fq(be, E, n, (size_t)hd, (size_t)hd, 32, 1);
                } else {
                    dv->fq(be, E, n, (size_t)hd, (size_t)(hd - rd), 64, 0);
                }
            }
        }
    }
    free(po);
    return rc;
}

/* the rows of a segment late_rows needs: its last max(window, 2 ratio) (comp_finish pushes fewer than 2 ratio, the
 * ring keeps the window) */
static size_t late_tail(const md_model *m, int l)
{
    const size_t r = (size_t)m->layers[l].ratio, w = (size_t)m->cfg.window;
    return 2 * r > w ? 2 * r : w;
}

/* late_rows takes all of layer l's rows (one download), not each segment's tail */
static int late_whole(const dev_ctx *x, int l, size_t nseg)
{
    const size_t R = x->rw->R, *st = x->rw->seg_start, tail = late_tail(x->m, l);
    size_t need = 0;
    for (size_t s = 0; s < nseg; s++) need += st[s + 1] - st[s] < tail ? st[s + 1] - st[s] : tail;
    return nseg > 16 || 2 * need > R;
}

/* Layer l's state rows (xs, device [R, xw] as state_width lays them out) on the host, at the same places (*out):
 * where late_start started them down as late layer i's rows (dn & 1), the backend's copy itself; else in hx, all
 * of them, or, where that is much less (a prefill), only what comp_push_seg and ring_step_seg read of each
 * segment (its late_tail) */
static int late_rows(dev_ctx *x, int l, const float *xs, float *hx, size_t nseg, size_t i, int dn, const float **out)
{
    const md_model *m = x->m;
    const size_t R = x->rw->R, *st = x->rw->seg_start;
    size_t cd, icd;
    const size_t xw = state_width(m, l, &cd, &icd), tail = late_tail(m, l);
    *out = hx;
    if (dn & 1) { /* read where it landed: a copy into hx was a pass over R xw floats a layer (3 MB at batch 256) */
        *out = x->dv->down_take(x->be, dn_rows(i));
        return *out ? 0 : RC_EIO;
    }
    if (!hx) return RC_ENOMEM;
    if (late_whole(x, l, nseg)) return x->dv->download(x->be, hx, xs, R * xw * sizeof(float)) ? RC_EIO : 0;
    const size_t w[5] = {(size_t)m->cfg.head_dim, cd, cd, icd, icd};
    size_t base = 0;
    for (int j = 0; j < 5; base += R * w[j], j++)
        for (size_t s = 0; s < nseg && w[j]; s++) {
            const size_t n = st[s + 1] - st[s], t = n < tail ? n : tail, r0 = st[s] + n - t;
            if (x->dv->download(x->be, hx + base + r0 * w[j], xs + base + r0 * w[j], t * w[j] * sizeof(float)))
                return RC_EIO;
        }
    return 0;
}

/* The late layers' rows (where late_rows takes them whole) and the entries they made on the device start down
 * now, where the backend can (be_dev_ops.down_start): called after the last layer, before the head, so that the
 * copies run beside the head and late_state finds them there */
static void late_start(dev_ctx *x, size_t nseg)
{
    const be_dev_ops *dv = x->dv;
    if (!dv->down_start || !dv->down_take || !x->late_early) return;
    const md_config *c = &x->m->cfg;
    const size_t R = x->rw->R;
    for (size_t i = 0; i < x->nlate && dn_ents(i, 1) < BE_DOWN_SLOTS; i++) {
        const int l = x->late_l[i];
        size_t cd, icd;
        const size_t xw = state_width(x->m, l, &cd, &icd);
        if (late_whole(x, l, nseg) && dv->down_start(x->be, dn_rows(i), x->late_xs[i], R * xw * sizeof(float)) == 0)
            x->late_dn[i] |= 1;
        for (int k = 0; k < 2; k++) {
            const dev_ents *de = &x->late_de[i];
            const size_t hd = (size_t)(k ? c->index_head_dim : c->head_dim);
            if (de->n[k] && dv->down_start(x->be, dn_ents(i, k), de->e[k], de->n[k] * hd * sizeof(float)) == 0)
                x->late_dn[i] |= 2 << k;
        }
    }
}

/* The late state updates (attn_core_dev), in layer order: each such layer's rows down (the first download waits
 * for the device), the entries its compressors made on the device into the blocks, the pushes into the partial
 * blocks and half A, and the ring. */
/* late_state's host work on one layer for segment s: the entries the device made into its blocks, its
 * compressors' partial state, its window ring -- in that order, as the serial loops did them */
typedef struct {
    md_model *m;
    md_segment *segs;
    const rows_t *rw;
    int l, comp;
    const dev_ents *de;
    const float *he[2]; /* the entries on the host (ents_fetch), or NULL */
    const float *rows[4], *hr;
} late_job;

static void late_task(void *arg, size_t s)
{
    const late_job *j = arg;
    const size_t r0 = j->rw->seg_start[s], n = j->rw->seg_start[s + 1] - r0;
    ents_put_seg(j->m, j->l, &j->segs[s], s, j->de, j->he);
    if (j->comp) comp_push_seg(j->m, j->l, &j->segs[s], r0, n, j->rows);
    ring_step_seg(j->m, j->l, &j->segs[s], r0, n, j->hr);
}

static int late_state(dev_ctx *x, md_segment *segs, size_t nseg)
{
    const size_t R = x->rw->R, d = (size_t)x->m->cfg.head_dim;
    size_t wmax = 0, cd, icd;
    for (size_t i = 0; i < x->nlate; i++) {
        const size_t w = state_width(x->m, x->late_l[i], &cd, &icd);
        if (w > wmax) wmax = w;
    }
    /* a host copy only for the layers late_start did not start down */
    int need = 0;
    for (size_t i = 0; i < x->nlate; i++) need |= !(x->late_dn[i] & 1);
    float *hx = need ? malloc(R * wmax * sizeof(float)) : NULL;
    int rc = need && !hx ? RC_ENOMEM : 0;
    for (size_t i = 0; i < x->nlate && !rc; i++) {
        const int l = x->late_l[i];
        const float *hr;
        state_width(x->m, l, &cd, &icd);
        if ((rc = late_rows(x, l, x->late_xs[i], hx, nseg, i, x->late_dn[i], &hr))) break;
        late_job j = {.m = x->m, .segs = segs, .rw = x->rw, .l = l, .de = &x->late_de[i], .comp = cd != 0,
                      .hr = hr};
        float *own[2] = {NULL, NULL};
        if (x->late_de[i].n[0] + x->late_de[i].n[1]) rc = ents_fetch(x, &x->late_de[i], i, x->late_dn[i], j.he, own);
        if (!rc) {
            const float *rows[4] = {hr + R * d, hr + R * (d + cd), hr + R * (d + 2 * cd), hr + R * (d + 2 * cd + icd)};
            memcpy(j.rows, rows, sizeof rows);
            /* each segment's own state; at batch 256 one thread took ~2 ms a step where a CSA entry completes */
            seg_tasks(x->be, nseg, late_task, &j);
        }
        free(own[0]);
        free(own[1]);
    }
    for (size_t i = 0; i < x->nlate; i++) dev_ents_free(&x->late_de[i]);
    free(hx);
    x->nlate = 0;
    return rc;
}

/* One layer's attention on the device, in four parts: its buffers (allocated before the parts that may be
 * replayed from a recording: be_dev_ops.graph_begin), the projections (launches only), the state and the
 * attention op (host work), the output projection (launches only). */
typedef struct {
    float *qr, *q, *o, *u, *iq, *iw;
    float *xs; /* [R, xw]: what extends the state (window key, compressor and indexer-compressor inputs) */
    size_t xw, cd, icd;
} attn_bufs;

static int attn_bufs_dev(dev_ctx *x, int l, attn_bufs *b)
{
    const md_config *c = &x->m->cfg;
    const md_layer *ly = &x->m->layers[l];
    const size_t R = x->rw->R;
    const int H = c->n_heads, d = c->head_dim, g = c->o_groups, ol = c->o_lora_rank;
    const int IH = c->index_heads, ID = c->index_head_dim;
    if (ly->wo_a.rows != (int64_t)g * ol || ly->wo_a.cols != (int64_t)H * d / g) return RC_EUNSUP;
    b->xw = state_width(x->m, l, &b->cd, &b->icd);
    b->qr = dalloc(x, R * (size_t)c->q_lora_rank * sizeof(float));
    b->q = dalloc(x, R * (size_t)H * d * sizeof(float));
    b->o = dalloc(x, R * (size_t)H * d * sizeof(float));
    b->u = dalloc(x, R * (size_t)g * ol * sizeof(float));
    b->xs = x->xs[l];
    b->iq = ly->overlap ? dalloc(x, R * (size_t)IH * ID * sizeof(float)) : NULL;
    b->iw = ly->overlap ? dalloc(x, R * (size_t)IH * sizeof(float)) : NULL;
    return x->oom ? RC_ENOMEM : 0;
}

/* q (normed, roped), the window key, the compressors' inputs and the indexer's q and weights from xin */
static int attn_proj_dev(dev_ctx *x, int l, const float *xin, const attn_bufs *b)
{
    md_model *m = x->m;
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    be_backend *be = x->be;
    const be_dev_ops *dv = x->dv;
    const size_t R = x->rw->R, cd = b->cd, icd = b->icd;
    const int H = c->n_heads, d = c->head_dim, ql = c->q_lora_rank, rd = c->rope_dim;
    const int IH = c->index_heads, ID = c->index_head_dim;
    const float *inv = ly->ratio ? m->inv_freq_comp : m->inv_freq_main;
    const int official = m->sem == MD_SEM_OFFICIAL;
    float *qr = b->qr, *q = b->q, *iq = b->iq, *iw = b->iw;
    float *kv = b->xs, *ckv = kv + R * d, *cg = ckv + R * cd, *ikv = cg + R * cd, *ig = ikv + R * icd;
    /* official: the FP8 activations of the FP8 / FP4 GEMMs (act_fp8) */
    const float *xq =
        dact_quant_copy(x, xin, R, (size_t)c->hidden_size, act_fp8(m, &ly->wq_a) || act_fp8(m, &ly->wkv), 1);
    if (x->oom) return RC_ENOMEM;

    /* three independent chains of xin, each on its own lane (a decode step's GEMVs are latency-bound: side by side
     * they overlap): the window key; the compressors' and the indexer's inputs and weights; q and the indexer's q */
    dlane(x, 1);
    dlinear(x, kv, xin, xq, R, &ly->wkv);
    dnorm_rope(x, kv, R, (size_t)d, ly->kv_norm, rd, inv, 1);
    if (official) dv->fq(be, kv, R, (size_t)d, (size_t)(d - rd), 64, 0);
    if (ly->ratio || ly->overlap) dlane(x, 2);
    if (ly->ratio) {
        dv->linear(be, ckv, xin, R, &ly->c_wkv);
        dv->linear(be, cg, xin, R, &ly->c_wgate);
    }
    if (ly->overlap) {
        dv->linear(be, ikv, xin, R, &ly->i_wkv);
        dv->linear(be, ig, xin, R, &ly->i_wgate);
        dv->linear(be, iw, xin, R, &ly->i_wproj);
        dv->scale(be, iw, R * (size_t)IH, 1.0f / sqrtf((float)ID) * (1.0f / sqrtf((float)IH)));
    }
    dlane(x, 0);
    dlinear(x, qr, xin, xq, R, &ly->wq_a);
    dv->rmsnorm(be, qr, qr, R, (size_t)ql, ly->q_norm, c->rms_eps);
    const float *qrq = dact_quant_copy(x, qr, R, (size_t)ql,
                                       act_fp8(m, &ly->wq_b) || (ly->overlap && act_fp8(m, &ly->i_wq_b)), 1);
    /* the indexer's q on lane 2 (which first waits for the q latent), beside q's own chain on lane 0 */
    if (!x->oom && ly->overlap) {
        dlane(x, 2);
        dlinear(x, iq, qr, qrq, R, &ly->i_wq_b);
        dv->rope(be, iq, R * IH, (size_t)ID, (size_t)(ID - rd), rd, m->inv_freq_comp, x->pos, IH);
        if (official) {
            if (is_pow2((size_t)ID)) dv->hadamard(be, iq, R * IH, (size_t)ID);
            dv->fq(be, iq, R * IH, (size_t)ID, (size_t)ID, 32, 1);
        }
        dlane(x, 0);
    }
    if (!x->oom) {
        dlinear(x, q, qr, qrq, R, &ly->wq_b);
        dnorm_rope(x, q, R * H, (size_t)d, NULL, rd, inv, H);
    }
    djoin(x);
    return x->oom ? RC_ENOMEM : 0;
}

/* the state and the attention op: o from q, the window and the blocks */
static int attn_core_dev(dev_ctx *x, int l, md_segment *segs, size_t nseg, const attn_bufs *b)
{
    md_model *m = x->m;
    const md_config *c = &m->cfg;
    be_backend *be = x->be;
    const be_dev_ops *dv = x->dv;
    const size_t R = x->rw->R, xw = b->xw, cd = b->cd, icd = b->icd;
    const int d = c->head_dim;
    float *q = b->q, *o = b->o, *iq = b->iq, *iw = b->iw, *xs = b->xs;
    float *kv = xs, *ckv = kv + R * d, *cg = ckv + R * cd, *ikv = cg + R * cd, *ig = ikv + R * icd;
    /* The state, on the host.  The entries a segment completes here are visible to the token that completes them
     * (a block completed by token t is visible to t), so they must exist before this attention: the backend's
     * comp_pool makes them on the device (comp_dev).  Everything else of the update (the partial blocks, the
     * ring) nothing in this forward reads: it runs after the forward (late_state), and the layer does not wait.
     * Without comp_pool (or DEEPINFER_DEV_COMP=0) a layer where an entry completes downloads its rows now and
     * runs the host compressors first (now): it waits; with DEEPINFER_STATE_LATE=0 every layer does.  The rows
     * come down now also when the backend's attention declines (the window keys are built on the host). */
    int rc = 0;
    const int devc = dv->comp_pool && x->dev_comp, comp = comp_completes(m, l, segs, nseg);
    const int now = !x->state_late || (comp && !devc);
    float *hx = NULL; /* the rows on the host, when this layer needs them now */
    float **kbufs = calloc(nseg ? nseg : 1, sizeof *kbufs);
    int64_t *kst = calloc(nseg ? nseg : 1, sizeof *kst);
    dev_ents de = {0};
    if (!kbufs || !kst || (now && !(hx = malloc(R * xw * sizeof(float))))) rc = RC_ENOMEM;
    else if (now && dv->download(be, hx, xs, R * xw * sizeof(float))) rc = RC_EIO;
    if (!rc && now) {
        rc = state_step(m, l, segs, nseg, x->rw, hx, hx + R * d, hx + R * (d + cd), hx + R * (d + 2 * cd),
                        hx + R * (d + 2 * cd + icd), kbufs, kst, 0);
        m->st_state_now++;
    } else if (!rc) {
        win_starts(m, segs, nseg, kst);
        if (comp) {
            const float *rows[4] = {ckv, cg, ikv, ig};
            rc = comp_dev(x, l, segs, nseg, rows, &de);
        }
        if (!rc) {
            x->late_l[x->nlate] = l;
            x->late_xs[x->nlate] = xs;
            x->late_dn[x->nlate] = 0;
            x->late_de[x->nlate++] = de; /* late_state frees it */
            m->st_state_late++;
        } else {
            dev_ents_free(&de);
        }
    }
    if (!rc && attend_backend(m, be, l, segs, nseg, x->rw, dv->attention, q, iq, iw, kbufs, kst, kv,
                              de.n[0] + de.n[1] ? &de : NULL, o) > 0) {
        /* the host attention: the rows down now, and the entries made on the device into the blocks */
        if (!now && !(hx = malloc(R * xw * sizeof(float)))) rc = RC_ENOMEM;
        else if (!now && dv->download(be, hx, xs, R * xw * sizeof(float))) rc = RC_EIO;
        if (!rc && de.n[0] + de.n[1]) rc = ents_write(x, l, segs, nseg, &de, 0, 0);
        if (!rc) rc = build_kbufs(m, l, segs, nseg, x->rw, hx, kbufs, kst);
        if (!rc) rc = attend_dev_host(x, l, segs, nseg, q, iq, iw, kbufs, kst, o);
    }
    if (!rc && now) ring_step(m, l, segs, nseg, x->rw, hx);
    for (size_t i = 0; kbufs && i < nseg; i++) free(kbufs[i]);
    free(kbufs); free(kst); free(hx);
    return rc;
}

/* out = wo_b(wo_a(o)) */
static void attn_out_dev(dev_ctx *x, int l, const attn_bufs *b, float *out)
{
    md_model *m = x->m;
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const be_dev_ops *dv = x->dv;
    const size_t R = x->rw->R;
    const int g = c->o_groups, ol = c->o_lora_rank;
    dv->linear_grouped(x->be, b->u, b->o, R, &ly->wo_a, g);
    if (act_fp8(m, &ly->wo_b) && !dv->linear_aq)
        dv->fq(x->be, b->u, R, (size_t)g * ol, (size_t)g * ol, MD_ACT_BLOCK, 0);
    dlinear(x, out, b->u, dv->linear_aq ? NULL : b->u, R, &ly->wo_b);
}

/* moe_dev's xq: the layer's experts (routed or shared) take x act_quant'd */
static int moe_needs_xq(const md_model *m, const md_layer *ly)
{
    return moe_act(m, ly).any_in || act_fp8(m, &ly->sw1) || act_fp8(m, &ly->sw3);
}

/* y = the layer's MoE of xin but the shared expert's output, which *shared gets (hc_post_add adds it); xq: act_quant
 * of xin (moe_needs_xq), else NULL */
static int moe_dev(dev_ctx *x, int l, const float *xin, const float *xq, float *y, const float **shared)
{
    md_model *m = x->m;
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    be_backend *be = x->be;
    const be_dev_ops *dv = x->dv;
    const size_t R = x->rw->R;
    const int E = c->n_experts, K = c->top_k, I = c->moe_inter, D = c->hidden_size;
    const int official = m->sem == MD_SEM_OFFICIAL;
    float *logit = dalloc(x, R * (size_t)E * sizeof(float));
    int32_t *idx = dalloc(x, R * (size_t)K * sizeof(int32_t));
    float *wt = dalloc(x, R * (size_t)K * sizeof(float));
    float *g = dalloc(x, R * (size_t)K * I * sizeof(float));
    float *up = dalloc(x, R * (size_t)K * I * sizeof(float));
    float *dn = dalloc(x, R * (size_t)K * D * sizeof(float));
    float *sg = dalloc(x, R * (size_t)I * sizeof(float)), *su = dalloc(x, R * (size_t)I * sizeof(float));
    float *sd = dalloc(x, R * (size_t)D * sizeof(float));
    const moe_aq aq = moe_act(m, ly);
    if (x->oom) return RC_ENOMEM;

    /* the shared expert on lane 1, beside the routed experts */
    dlane(x, 1);
    dlinear(x, sg, xin, xq, R, &ly->sw1);
    dlinear(x, su, xin, xq, R, &ly->sw3);
    dv->swiglu(be, sg, su, R, I, c->swiglu_limit, NULL);
    if (act_fp8(m, &ly->sw2) && !dv->linear_aq) dv->fq(be, sg, R, (size_t)I, (size_t)I, MD_ACT_BLOCK, 0);
    dlinear(x, sd, sg, dv->linear_aq ? NULL : sg, R, &ly->sw2);
    dlane(x, 0);

    dv->linear(be, logit, xin, R, &ly->gate);
    be_route ra = route_params(m, l);
    dv->route(be, &ra, logit, x->ids, R, idx, wt);
    if (!aq.uniform || dv->moe(be, y, aq.in ? xq : xin, R, idx, wt, K, ly->w1, ly->w3, ly->w2, E, c->swiglu_limit,
                               moe_flags(official, aq)) > 0) {
        /* experts the grouped op does not take (or a prefill-sized batch it leaves to per-expert GEMMs): one
         * expert at a time, ascending, as the host path; the rows of every expert in one counting sort */
        const size_t P = R * (size_t)K;
        int32_t *hidx = malloc(P * sizeof(int32_t)), *rows = malloc(P * sizeof(int32_t));
        int32_t *slot = malloc(P * sizeof(int32_t));
        size_t *start = calloc((size_t)E + 1, sizeof(size_t));
        int32_t *drows = dalloc(x, P * sizeof(int32_t)), *dslot = dalloc(x, P * sizeof(int32_t));
        float *xs = dalloc(x, R * (size_t)D * sizeof(float)), *rwe = dalloc(x, P * sizeof(float));
        int rc = (!hidx || !rows || !slot || !start || x->oom) ? RC_ENOMEM : 0;
        if (!rc && dv->download(be, hidx, idx, P * sizeof(int32_t))) rc = RC_EIO;
        for (size_t q = 0; !rc && q < P; q++) {
            if (hidx[q] < 0 || hidx[q] >= E) { rc = RC_EIO; break; }
            start[hidx[q] + 1]++;
        }
        if (!rc) {
            for (int e = 0; e < E; e++) start[e + 1] += start[e];
            size_t *fill = malloc((size_t)E * sizeof(size_t));
            if (!fill) rc = RC_ENOMEM;
            else {
                memcpy(fill, start, (size_t)E * sizeof(size_t));
                for (size_t q = 0; q < P; q++) { /* q = t * K + k: rows of an expert in token order */
                    const size_t at = fill[hidx[q]]++;
                    rows[at] = (int32_t)(q / (size_t)K);
                    slot[at] = (int32_t)q;
                }
                free(fill);
                dv->upload(be, drows, rows, P * sizeof(int32_t));
                dv->upload(be, dslot, slot, P * sizeof(int32_t));
                dv->zero(be, y, R * (size_t)D * sizeof(float)); /* then the sum in ascending expert order */
            }
        }
        for (int e = 0; !rc && e < E; e++) {
            const size_t a = start[e], ne = start[e + 1] - a;
            if (!ne) continue;
            /* w1 and w3 each take x as its own GEMM quantises it (act_fp8) */
            const float *s1 = act_in(m, &ly->w1[e], xin, xq), *s3 = act_in(m, &ly->w3[e], xin, xq);
            dv->gather(be, xs, s1, drows + a, ne, (size_t)D);
            dv->gather(be, rwe, wt, dslot + a, ne, 1);
            dlinear(x, g, xs, xs, ne, &ly->w1[e]);
            if (s3 != s1) dv->gather(be, xs, s3, drows + a, ne, (size_t)D);
            dlinear(x, up, xs, xs, ne, &ly->w3[e]);
            dv->swiglu(be, g, up, ne, I, c->swiglu_limit, official ? rwe : NULL);
            if (act_fp8(m, &ly->w2[e])) dv->fq(be, g, ne, (size_t)I, (size_t)I, MD_ACT_BLOCK, 0);
            dlinear(x, dn, g, g, ne, &ly->w2[e]);
            dv->scatter_add(be, y, dn, drows + a, official ? NULL : rwe, ne, (size_t)D);
        }
        free(hidx); free(rows); free(slot); free(start);
        if (rc) {
            djoin(x);
            return rc;
        }
    }
    djoin(x);
    *shared = sd;
    return 0;
}

/* The logits rows of a device forward, from the backend's host view into the
 * segments' buffers, in pieces of at most 1 MB on the backend's host threads:
 * at batch 256 the rows are 132 MB, which one thread copies in ~15 ms. */
typedef struct {
    float *dst;
    const float *src;
    size_t n; /* floats */
} lg_piece;

static void lg_copy_task(void *arg, size_t i)
{
    const lg_piece *p = (const lg_piece *)arg + i;
    memcpy(p->dst, p->src, p->n * sizeof(float));
}

/* a segment whose row the device graph draws from (md_segment.draw), so its logits stay on the device */
static int seg_draws(const md_segment *sg, const be_dev_ops *dv)
{
    /* a sampled draw (the greedy threshold of engine/sampler.h, NaN included, stays with the caller) */
    return sg->logits && sg->draw && sg->draw->temperature >= 1e-5 && !sg->all_logits && dv->sample;
}

/* a segment whose logits come down with the logits rows (not drawn on the device) */
static int seg_rows_down(const md_segment *sg, const be_dev_ops *dv) { return sg->logits && !seg_draws(sg, dv); }

/* the logits of the segments that want them (those drawn on the device left out: dv) from lg, in segment order */
static int logits_copy(be_backend *be, const md_segment *segs, size_t nseg, const float *lg, size_t V,
                       const be_dev_ops *dv)
{
    const size_t piece = ((size_t)1 << 20) / sizeof(float);
    size_t np = 0, total = 0;
    for (size_t s = 0; s < nseg; s++)
        if (seg_rows_down(&segs[s], dv)) {
            const size_t n = (segs[s].all_logits ? segs[s].n : 1) * V;
            np += (n + piece - 1) / piece;
            total += n;
        }
    if (total <= 4 * piece) { /* small: not worth waking the threads */
        for (size_t s = 0; s < nseg; s++)
            if (seg_rows_down(&segs[s], dv)) {
                const size_t n = (segs[s].all_logits ? segs[s].n : 1) * V;
                memcpy(segs[s].logits, lg, n * sizeof(float));
                lg += n;
            }
        return 0;
    }
    lg_piece *ps = malloc(np * sizeof *ps);
    if (!ps) return -1;
    size_t k = 0;
    for (size_t s = 0; s < nseg; s++) {
        if (!seg_rows_down(&segs[s], dv)) continue;
        const size_t n = (segs[s].all_logits ? segs[s].n : 1) * V;
        for (size_t o = 0; o < n; o += piece) ps[k++] = (lg_piece){segs[s].logits + o, lg + o, n - o < piece ? n - o : piece};
        lg += n;
    }
    be_cpu_parallel(be, np, lg_copy_task, ps);
    free(ps);
    return 0;
}

/* the host-dev graph's attention op needs the forward in progress (no-op on another backend) */
static void hd_bind(md_model *m, be_backend *be, md_segment *segs, size_t nseg, const rows_t *rw);

/* Layer l's FFN half on the device: mHC pre with the norm (and, official, x as the FP8 / FP4 expert GEMMs take it,
 * made with the norm), the experts, mHC post with the shared expert's add */
static int ffn_dev(dev_ctx *x, int l, float *X, float *coll, float *post, float *comb, float *f)
{
    const md_model *m = x->m;
    const md_config *c = &m->cfg;
    const md_layer *ly = &m->layers[l];
    const size_t R = x->rw->R, D = (size_t)c->hidden_size;
    be_hc h = hc_params(c, ly->hc_ffn_fn, ly->hc_ffn_base, ly->hc_ffn_scale);
    float *xq = moe_needs_xq(m, ly) ? dalloc(x, R * D * sizeof(float)) : NULL;
    dhc_pre_norm(x, &h, 0, X, R, coll, post, comb, ly->ffn_norm, xq);
    const float *sd = NULL;
    const int rc = x->oom ? RC_ENOMEM : moe_dev(x, l, coll, xq, f, &sd);
    if (!rc) dhc_post_add(x, X, f, sd, post, comb, R);
    return rc;
}

/* md_forward on the device: rw is built, segs are checked; the caller advances the lengths */
static int forward_dev(md_model *m, be_backend *be, md_segment *segs, size_t nseg, const rows_t *rw, rc_err *err)
{
    const md_config *c = &m->cfg;
    const be_dev_ops *dv = be->ops->dev;
    const int n = c->hc_mult, D = c->hidden_size, V = c->vocab_size;
    const size_t R = rw->R;
    dev_ctx x = {.m = m, .be = be, .dv = dv, .rw = rw, .state_late = !env_off("DEEPINFER_STATE_LATE"),
                 .dev_comp = !env_off("DEEPINFER_DEV_COMP"), .late_early = !env_off("DEEPINFER_LATE_START"),
                 .merge = !env_off("DEEPINFER_REGION_MERGE")};
    int rc = 0;
    x.late_l = malloc((size_t)c->n_layers * sizeof *x.late_l);
    x.late_xs = malloc((size_t)c->n_layers * sizeof *x.late_xs);
    x.late_de = calloc((size_t)c->n_layers, sizeof *x.late_de);
    x.late_dn = calloc((size_t)c->n_layers, sizeof *x.late_dn);
    x.xs = malloc((size_t)c->n_layers * sizeof *x.xs);
    if (!x.late_l || !x.late_xs || !x.late_de || !x.late_dn || !x.xs) {
        free(x.late_l);
        free(x.late_xs);
        free(x.late_de);
        free(x.late_dn);
        free(x.xs);
        return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    hd_bind(m, be, segs, nseg, rw);
    dv->reset(be);
    int32_t *ids = dalloc(&x, R * sizeof(int32_t));
    int64_t *pos = dalloc(&x, R * sizeof(int64_t));
    float *X = dalloc(&x, R * (size_t)n * D * sizeof(float));
    float *coll = dalloc(&x, R * (size_t)D * sizeof(float));
    float *post = dalloc(&x, R * (size_t)n * sizeof(float));
    float *comb = dalloc(&x, R * (size_t)n * n * sizeof(float));
    float *f = dalloc(&x, R * (size_t)D * sizeof(float));
    for (int l = 0; l < c->n_layers; l++) { /* late_state reads them */
        size_t cd, icd;
        x.xs[l] = dalloc_keep(&x, R * state_width(m, l, &cd, &icd) * sizeof(float));
    }
    if (x.oom) {
        rc = RC_ENOMEM;
        goto out;
    }
    dv->upload(be, ids, rw->ids, R * sizeof(int32_t));
    dv->upload(be, pos, rw->pos, R * sizeof(int64_t));
    x.ids = ids;
    x.pos = pos;
    dv->embed(be, X, ids, R, &m->embed, n);

    /* each layer's activations are void at its end (what late_state needs is alloc_keep's): a 16384-token prefill
     * of the V4-Flash slice needed ~5 GB a layer, all layers' worth at once (DEEPINFER_LAYER_RELEASE=0: as before) */
    const int release = dv->mark && dv->release && dv->alloc_keep && !env_off("DEEPINFER_LAYER_RELEASE");
    for (int l = 0; l < c->n_layers && !rc; l++) {
        const md_layer *ly = &m->layers[l];
        const size_t mark = release ? dv->mark(be) : 0;
        if (m->hook) m->hook(m->hook_arg, l, 0);
        /* the parts between the state and the attention op are launches alone: the backend may replay them
         * (dregion_begin) */
        attn_bufs ab;
        if ((rc = attn_bufs_dev(&x, l, &ab))) break;
        if (!dregion_begin(&x, l, 0)) {
            be_hc h = hc_params(c, ly->hc_attn_fn, ly->hc_attn_base, ly->hc_attn_scale);
            dhc_pre_norm(&x, &h, 0, X, R, coll, post, comb, ly->attn_norm, NULL);
            rc = attn_proj_dev(&x, l, coll, &ab);
            dregion_end(&x);
            if (rc) break;
        }
        /* what the state and the attention op allocate is theirs alone (the entries they make are alloc_keep's):
         * released after them, so that the regions after start where they do whatever this step completes */
        const size_t amark = release ? dv->mark(be) : 0;
        if ((rc = attn_core_dev(&x, l, segs, nseg, &ab))) break;
        if (release) dv->release(be, amark);
        /* without a hook between them the attention's output and the FFN are one region (region 3): one graph
         * launch fewer, and the FFN's first kernel overlaps hc_post's tail (PDL) */
        const int merged = !m->hook && x.merge;
        if (!dregion_begin(&x, l, merged ? 3 : 1)) {
            attn_out_dev(&x, l, &ab, f);
            dv->hc_post(be, X, f, post, comb, n, D, R);
            if (merged) rc = ffn_dev(&x, l, X, coll, post, comb, f);
            dregion_end(&x);
            if (rc) break;
        }
        if (m->hook) m->hook(m->hook_arg, l, 1);
        if (!merged && !dregion_begin(&x, l, 2)) {
            rc = ffn_dev(&x, l, X, coll, post, comb, f);
            dregion_end(&x);
            if (rc) break;
        }
        if (release) dv->release(be, mark);
        if (m->hook) m->hook(m->hook_arg, l, 2);
    }
    if (!rc && m->hook) m->hook(m->hook_arg, c->n_layers, 0);
    if (!rc) late_start(&x, nseg);

    /* logits for the rows asked for: the logits segments' rows, then one row per segment drawn on the device, then
     * one per top1 segment, whose greedy token is taken on the device (only the ids come back, and the drawn rows'
     * logits where the device leaves the draw to the host) */
    size_t nlog = 0, ndraw = 0, ntop = 0;
    for (size_t s = 0; s < nseg; s++)
        if (seg_draws(&segs[s], dv)) ndraw++;
        else if (segs[s].logits) nlog += segs[s].all_logits ? segs[s].n : 1;
        else if (segs[s].top1) ntop++;
    const size_t nl = nlog + ndraw + ntop, nid = ndraw + ntop;
    if (!rc && nl) {
        int32_t *src = malloc(nl * sizeof(int32_t));
        int32_t *dsrc = dalloc(&x, nl * sizeof(int32_t));
        float *hx = dalloc(&x, nl * (size_t)n * D * sizeof(float));
        float *y = dalloc(&x, nl * (size_t)D * sizeof(float));
        float *dl = dalloc(&x, nl * (size_t)V * sizeof(float));
        int32_t *did = nid ? dalloc(&x, nid * sizeof(int32_t)) : NULL; /* the drawn ids, then the top1 ones */
        be_draw *hdr = ndraw ? malloc(ndraw * sizeof *hdr) : NULL;
        be_draw *ddr = ndraw ? dalloc(&x, ndraw * sizeof *ddr) : NULL;
        int32_t *hid = nid ? malloc(nid * sizeof(int32_t)) : NULL;
        if (!src || x.oom || (nid && !hid) || (ndraw && !hdr)) {
            rc = RC_ENOMEM;
        } else {
            size_t k = 0;
            for (int g = 0; g < 3; g++) /* g: 0 the logits rows, 1 the drawn rows, 2 the top1 rows */
                for (size_t s = 0; s < nseg; s++) {
                    const int dr = seg_draws(&segs[s], dv);
                    if (g == 0 ? !segs[s].logits || dr : g == 1 ? !dr : segs[s].logits || !segs[s].top1) continue;
                    if (g == 1)
                        hdr[k - nlog] = (be_draw){.row = (uint32_t)k, .top_k = segs[s].draw->top_k,
                                                  .inv_t = 1.0 / segs[s].draw->temperature, .top_p = segs[s].draw->top_p,
                                                  .min_p = segs[s].draw->min_p, .u01 = segs[s].draw->u01};
                    size_t a = segs[s].all_logits && g == 0 ? rw->seg_start[s] : rw->seg_start[s + 1] - 1;
                    for (size_t r = a; r < rw->seg_start[s + 1]; r++) src[k++] = (int32_t)r;
                }
            dv->upload(be, dsrc, src, nl * sizeof(int32_t));
            if (ndraw) dv->upload(be, ddr, hdr, ndraw * sizeof *hdr);
            dv->gather(be, hx, X, dsrc, nl, (size_t)n * D);
            be_hc h = hc_params(c, m->hc_head_fn, m->hc_head_base, m->hc_head_scale);
            dhc_pre_norm(&x, &h, 1, hx, nl, y, NULL, NULL, m->norm, NULL);
            dv->linear(be, dl, y, nl, &m->head);
            if (ndraw) dv->sample(be, did, dl, (size_t)V, ddr, ndraw);
            if (ntop) dv->argmax(be, did + ndraw, dl + (nlog + ndraw) * (size_t)V, ntop, (size_t)V);
            /* the state updates no layer had to wait for, while the device computes the logits (late_start) */
            rc = late_state(&x, segs, nseg);
            if (!rc && nlog) {
                const float *lg = dv->view(be, dl, nlog * (size_t)V * sizeof(float));
                if (!lg) rc = RC_EIO;
                else if (logits_copy(be, segs, nseg, lg, (size_t)V, dv)) rc = RC_ENOMEM;
            }
            if (!rc && nid && dv->download(be, hid, did, nid * sizeof(int32_t))) rc = RC_EIO;
            /* the rows left to the host come down in one copy of the drawn rows' range */
            size_t nback = 0;
            for (size_t j = 0; !rc && j < ndraw; j++) nback += hid[j] < 0;
            const float *back = nback ? dv->view(be, dl + nlog * (size_t)V, ndraw * (size_t)V * sizeof(float)) : NULL;
            if (nback && !back) rc = RC_EIO;
            for (size_t s = 0, j = 0, t = ndraw; !rc && s < nseg; s++)
                if (seg_draws(&segs[s], dv)) {
                    if (hid[j] >= 0) segs[s].draw->token = hid[j];
                    else memcpy(segs[s].logits, back + j * (size_t)V, (size_t)V * sizeof(float));
                    j++;
                } else if (!segs[s].logits && segs[s].top1) {
                    *segs[s].top1 = hid[t++];
                }
        }
        free(src);
        free(hid);
        free(hdr);
    } else if (!rc) {
        /* no logits: still wait for the device, so that a failure is seen here */
        float probe;
        if (dv->download(be, &probe, f, sizeof probe)) rc = RC_EIO;
    }
    /* without logits: the state updates no layer had to wait for (nothing left where the logits' branch ran) */
    if (!rc) rc = late_state(&x, segs, nseg);
    if (!rc && dv->failed(be)) rc = RC_EIO;
out:
    for (size_t i = 0; i < x.nlate; i++) dev_ents_free(&x.late_de[i]);
    hd_bind(m, be, NULL, 0, NULL);
    free(x.late_l);
    free(x.late_xs);
    free(x.late_de);
    free(x.late_dn);
    free(x.xs);
    if (rc == RC_ENOMEM && x.oom) return rc_errf(err, RC_ENOMEM, "out of device memory for a batch of %zu tokens", R);
    if (rc == RC_EIO) return rc_errf(err, RC_EIO, "forward failed on the device backend");
    if (rc == RC_EUNSUP) return rc_errf(err, RC_EUNSUP, "forward: the device graph does not take this model's shapes");
    if (rc) return rc_errf(err, rc, "forward failed: out of memory");
    return 0;
}

/* The device graph on the host (md_model_set_host_dev_graph): forward_dev's
 * ops implemented with host memory and the host path's own functions, on the
 * model's backend.  It exists to check forward_dev's plumbing where there is
 * no GPU: it must give the host path's logits bit for bit.  The grouped
 * expert op and the attention op decline, so forward_dev's fallbacks run. */
struct md_host_dev {
    be_backend base;  /* ops: &ops below; threads and impl: the model backend's, so be_cpu_parallel works */
    be_backend *inner;
    void **blk, **kblk; /* alloc's blocks (release frees those after a mark), alloc_keep's */
    size_t nblk, cap, nkblk, kcap;
    int decline_attn; /* md_model_set_host_dev_graph(m, 2): the attention op declines (forward_dev's fallback), and
                       * there is no linear_aq (forward_dev quantises copies with fq) */
    int failed;       /* an op ran out of memory, or hd_attention found a stale block table */
    be_ops ops;       /* hd_ops, hd_dev with this graph's options (base.ops points here) */
    be_dev_ops dev;
    /* copies of partial blocks' layer rows kept as a device would (part_slots.h): ps_n slots of ps_sz floats
     * (64; md_model_set_host_dev_graph(m, 3): one, so slots are taken from other blocks and calls go without) */
    bps_slot *ps;
    float *ps_mem;
    size_t ps_n, ps_sz;
    /* down_start's buffers, as a device's: a copy made at the call (every op before it has run) */
    void *dn[BE_DOWN_SLOTS];
    size_t dn_cap[BE_DOWN_SLOTS];
    unsigned char dn_set[BE_DOWN_SLOTS];
    uint64_t ps_call, ps_hits, ps_rows;
    /* the forward in progress (hd_bind), for the attention op, which runs the host path's attention */
    md_model *m;
    md_segment *segs;
    size_t nseg;
    const rows_t *rw;
};

static md_host_dev *hd_of(be_backend *be) { return (md_host_dev *)be; }
static be_backend *hd_in(be_backend *be) { return hd_of(be)->inner; }

static void hd_bind(md_model *m, be_backend *be, md_segment *segs, size_t nseg, const rows_t *rw)
{
    md_host_dev *h = m->hostdev;
    if (!h || be != &h->base) return;
    h->m = segs ? m : NULL;
    h->segs = segs;
    h->nseg = nseg;
    h->rw = rw;
}

/* blocks [from, *n) of a list, freed */
static void hd_free_from(void **blk, size_t *n, size_t from)
{
    for (size_t i = from; i < *n; i++) free(blk[i]);
    if (from < *n) *n = from;
}

static void hd_reset(be_backend *be)
{
    md_host_dev *h = hd_of(be);
    hd_free_from(h->blk, &h->nblk, 0);
    hd_free_from(h->kblk, &h->nkblk, 0);
    memset(h->dn_set, 0, sizeof h->dn_set);
}

/* a block on list (blk, n, cap) */
static void *hd_alloc_on(void ***blk, size_t *n, size_t *cap, size_t bytes)
{
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        void **nb = realloc(*blk, nc * sizeof *nb);
        if (!nb) return NULL;
        *blk = nb;
        *cap = nc;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) (*blk)[(*n)++] = p;
    return p;
}

static void *hd_alloc(be_backend *be, size_t bytes)
{
    md_host_dev *h = hd_of(be);
    return hd_alloc_on(&h->blk, &h->nblk, &h->cap, bytes);
}

static void *hd_alloc_keep(be_backend *be, size_t bytes)
{
    md_host_dev *h = hd_of(be);
    return hd_alloc_on(&h->kblk, &h->nkblk, &h->kcap, bytes);
}

/* the blocks after the mark are freed (the ops ran already: this graph is synchronous) */
static size_t hd_mark(be_backend *be) { return hd_of(be)->nblk; }
static void hd_release(be_backend *be, size_t mark)
{
    md_host_dev *h = hd_of(be);
    hd_free_from(h->blk, &h->nblk, mark);
}

static void hd_upload(be_backend *be, void *dst, const void *src, size_t bytes) { (void)be; memcpy(dst, src, bytes); }
static int hd_download(be_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
    return 0;
}
static const void *hd_view(be_backend *be, const void *src, size_t bytes)
{
    (void)be;
    (void)bytes;
    return src;
}
static int hd_down_start(be_backend *be, int k, const void *src, size_t bytes)
{
    md_host_dev *h = hd_of(be);
    if (k < 0 || k >= BE_DOWN_SLOTS || !bytes) return -1;
    if (h->dn_cap[k] < bytes) {
        void *p = realloc(h->dn[k], bytes);
        if (!p) return -1;
        h->dn[k] = p;
        h->dn_cap[k] = bytes;
    }
    memcpy(h->dn[k], src, bytes);
    h->dn_set[k] = 1;
    return 0;
}
static const void *hd_down_take(be_backend *be, int k)
{
    md_host_dev *h = hd_of(be);
    if (k < 0 || k >= BE_DOWN_SLOTS || !h->dn_set[k]) return NULL;
    h->dn_set[k] = 0; /* taken once, as a device's copy is waited for once */
    return h->dn[k];
}
static int hd_failed(be_backend *be) { return hd_of(be)->failed; }
static void hd_zero(be_backend *be, void *p, size_t bytes) { (void)be; memset(p, 0, bytes); }
static void hd_copy(be_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}
static void hd_argmax(be_backend *be, int32_t *ids, const float *x, size_t rows, size_t V)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) ids[r] = (int32_t)rc_greedy(x + r * V, V);
}
/* draws nothing: every offered row's logits go to the caller, who draws (the CUDA backend's path under
 * DEEPINFER_CUDA_SAMPLE=0), so the host-dev graph runs the handed-back rows' path in CI */
static void hd_sample(be_backend *be, int32_t *ids, const float *x, size_t V, const be_draw *d, size_t n)
{
    (void)be; (void)x; (void)V; (void)d;
    for (size_t i = 0; i < n; i++) ids[i] = -1;
}
static void hd_linear(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    hd_in(be)->ops->linear(hd_in(be), y, x, T, w);
}
/* linear_aq: act_quant into a copy, then linear (what the CUDA backend fuses into its decode row-dot) */
static void hd_linear_aq(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    md_host_dev *h = hd_of(be);
    const size_t K = (size_t)w->cols;
    float *q = malloc(T * K * sizeof *q);
    if (!q) {
        h->failed = 1;
        return;
    }
    memcpy(q, x, T * K * sizeof *q);
    for (size_t r = 0; r < T; r++) fq_fp8(q + r * K, K, MD_ACT_BLOCK);
    hd_in(be)->ops->linear(hd_in(be), y, q, T, w);
    free(q);
}
static void hd_linear_grouped(be_backend *be, float *y, const float *x, size_t T, const be_weight *w, int groups)
{
    be_backend *in = hd_in(be);
    const int64_t n = w->rows / groups, K = w->cols;
    if (in->ops->linear_grouped) in->ops->linear_grouped(in, y, x, T, w, groups);
    else
        for (int g = 0; g < groups; g++)
            in->ops->linear_rows(in, y + (size_t)g * n, (size_t)(groups * n), x + (size_t)g * K, (size_t)(groups * K),
                                 T, w, g * n, n, 0);
}
static void hd_rmsnorm(be_backend *be, float *y, const float *x, size_t rows, size_t dim, const float *w, float eps)
{
    hd_in(be)->ops->rmsnorm(hd_in(be), y, x, rows, dim, w, eps);
}
static void hd_embed(be_backend *be, float *X, const int32_t *ids, size_t R, const be_weight *e, int ns)
{
    (void)be;
    embed_rows(e, ids, R, ns, X);
}
static void hd_hc_pre(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll, float *post, float *comb)
{
    hc_job j = {.h = *h, .X = (float *)X, .coll = coll, .post = post, .comb = comb};
    be_cpu_parallel(hd_in(be), R, hc_pre_task, &j);
}
static void hd_hc_head(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll)
{
    hc_job j = {.h = *h, .X = (float *)X, .coll = coll};
    be_cpu_parallel(hd_in(be), R, hc_head_task, &j);
}
static void hd_hc_post(be_backend *be, float *X, const float *f, const float *post, const float *comb, int n, int D,
                       size_t R)
{
    hc_job j = {.h = {.n = n, .D = D}, .X = X, .post = (float *)post, .comb = (float *)comb, .f = f};
    be_cpu_parallel(hd_in(be), R, hc_post_task, &j);
}
static void hd_rope(be_backend *be, float *x, size_t rows, size_t stride, size_t off, int rd, const float *inv,
                    const int64_t *pos, int per)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) rope(x + r * stride + off, rd, inv, pos[r / (size_t)per], 0);
}
static void hd_fq(be_backend *be, float *x, size_t rows, size_t stride, size_t n, int block, int fp4)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        if (fp4) fq_fp4(x + r * stride, n, (size_t)block);
        else fq_fp8(x + r * stride, n, (size_t)block);
    }
}
static void hd_hadamard(be_backend *be, float *x, size_t rows, size_t n)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) hadamard(x + r * n, n);
}
static void hd_swiglu(be_backend *be, float *g, const float *up, size_t rows, int I, float limit, const float *rw)
{
    (void)be;
    for (size_t r = 0; r < rows; r++) {
        swiglu(g + r * I, up + r * I, (size_t)I, limit);
        if (rw)
            for (int i = 0; i < I; i++) g[r * I + i] *= rw[r];
    }
}
static void hd_scale(be_backend *be, float *x, size_t n, float sc)
{
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] *= sc;
}
static void hd_add(be_backend *be, float *y, const float *x, size_t n)
{
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}
static void hd_route(be_backend *be, const be_route *r, const float *logits, const int32_t *ids, size_t R,
                     int32_t *idx, float *wt)
{
    (void)be;
    route_rows(r, (float *)logits, ids, R, idx, wt); /* the logits are forward_dev's scratch */
}
static void hd_gather(be_backend *be, float *dst, const float *src, const int32_t *rows, size_t n, size_t width)
{
    (void)be;
    for (size_t i = 0; i < n; i++) memcpy(dst + i * width, src + (size_t)rows[i] * width, width * sizeof(float));
}
static void hd_scatter_add(be_backend *be, float *y, const float *src, const int32_t *rows, const float *rw, size_t n,
                           size_t width)
{
    (void)be;
    for (size_t r = 0; r < n; r++) {
        float *yr = y + (size_t)rows[r] * width;
        for (size_t i = 0; i < width; i++) yr[i] += rw ? src[r * width + i] * rw[r] : src[r * width + i];
    }
}
static int hd_moe(be_backend *be, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
                  const be_weight *w1, const be_weight *w3, const be_weight *w2, int n_experts, float swiglu_limit,
                  int flags)
{
    (void)be; (void)y; (void)x; (void)T; (void)ids; (void)w; (void)topk; (void)w1; (void)w3; (void)w2;
    (void)n_experts; (void)swiglu_limit; (void)flags;
    return 1; /* decline: forward_dev's per-expert fallback runs */
}

static void hd_comp_pool(be_backend *be, float *out, size_t n, int ns, int hd, const be_comp_slot *slots,
                         const float *ape, size_t ape_n)
{
    (void)be;
    (void)ape_n;
    const float **p = malloc(3 * (size_t)ns * sizeof *p);
    float *w = malloc((size_t)ns * sizeof *w);
    if (!p || !w) { /* out stays as it was: a wrong result the bit-for-bit test sees */
        free(p);
        free(w);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        for (int s = 0; s < ns; s++) {
            const be_comp_slot *sl = slots + i * (size_t)ns + s;
            p[s] = sl->kv;
            p[ns + s] = sl->g;
            p[2 * ns + s] = sl->ape >= 0 ? ape + sl->ape : NULL;
        }
        comp_pool_slots(ns, hd, p, p + ns, p + 2 * ns, w, out + i * (size_t)hd);
    }
    free(p);
    free(w);
}

/* The device attention op, the way a backend that keeps window copies does it, on the host: the window from the
 * pre-forward ring and the segment's keys (krows), the entries the forward made on the device (ent_dev, key_dev)
 * in place of the blocks' rows for the call (they are written for good by late_state: the old rows come back
 * after), then the host path's attention. */
/* The rows [0, n) of region k (0: entries, 1: indexer keys) of layer l's part of block i of segment s, which
 * ent_row reaches (w floats a row) */
static float *hd_block_rows(const md_host_dev *h, int s, int l, int k, size_t i, int epb)
{
    return ent_row(h->segs[s].seq, l, k, i * (size_t)epb);
}

/* Before the attention: for every partial block of the call, its slot brought up to the rows the host holds
 * (counted in ps_rows), the device-made rows (already over the block's rows) put in, and then the slot's rows
 * written over the block's.  *view keeps, per partial block in call order, its slot (-1: none; such a block is
 * read as it is, as the device would stage it whole) and then the block rows it covered, for hd_slots_out. */
static int hd_slots_in(md_host_dev *h, const be_attn_seq *sq, int nseq, const be_attn_args *a, long **view)
{
    const int l = a->layer, epb = MD_BLOCK_TOKENS / a->ratio;
    const size_t w[2] = {(size_t)a->head_dim, (size_t)a->index_dim}, ent_rows = (size_t)epb * w[0],
                 sz = ent_rows + (a->csa ? (size_t)epb * w[1] : 0);
    if (sz > h->ps_sz) { /* larger rows than the pool's: start it again (as the CUDA pool does) */
        float *nm = malloc(h->ps_n * sz * sizeof(float));
        if (!nm) return RC_ENOMEM;
        free(h->ps_mem);
        h->ps_mem = nm;
        h->ps_sz = sz;
        memset(h->ps, 0, h->ps_n * sizeof *h->ps);
    }
    size_t np = 0;
    for (int s = 0; s < nseq; s++) np += sq[s].nblk - sq[s].nfull;
    long *held = *view = malloc(np * (sizeof(long) + sz * sizeof(float)) + 1);
    if (!held) return RC_ENOMEM;
    float *v = (float *)(held + np);
    h->ps_call++;
    for (int s = 0; s < nseq; s++)
        for (size_t i = sq[s].nfull; i < sq[s].nblk; i++, v += sz) {
            const long si = *held++ = bps_get(h->ps, h->ps_n, sq[s].block_ids[i], l, h->ps_call);
            if (si < 0) continue;
            bps_slot *p = &h->ps[si];
            float *slot = h->ps_mem + (size_t)si * h->ps_sz;
            int32_t host[2], after[2];
            bps_host_rows(&sq[s], i, epb, a->ratio, a->csa, host);
            bps_begin(p, host);
            bps_after(&sq[s], i, epb, host, after);
            if (p->have[0] == host[0] && p->have[1] == host[1]) h->ps_hits++;
            for (int k = 0; k < 2; k++) {
                float *rows = hd_block_rows(h, s, l, k, i, epb), *srows = slot + (k ? ent_rows : 0);
                /* from the host: rows [have, host); from this call's device rows (now over the block): [host, after) */
                memcpy(srows + (size_t)p->have[k] * w[k], rows + (size_t)p->have[k] * w[k],
                       (size_t)(after[k] - p->have[k]) * w[k] * sizeof(float));
                h->ps_rows += (size_t)(host[k] - p->have[k]);
                /* the device reads the slot: keep the block's rows, put the slot's in */
                memcpy(v + (k ? ent_rows : 0), rows, (size_t)after[k] * w[k] * sizeof(float));
                memcpy(rows, srows, (size_t)after[k] * w[k] * sizeof(float));
                p->have[k] = after[k];
            }
        }
    return 0;
}

/* after the attention: the blocks' own rows back */
static void hd_slots_out(md_host_dev *h, const be_attn_seq *sq, int nseq, const be_attn_args *a, long *view)
{
    const int l = a->layer, epb = MD_BLOCK_TOKENS / a->ratio;
    const size_t w[2] = {(size_t)a->head_dim, (size_t)a->index_dim}, ent_rows = (size_t)epb * w[0],
                 sz = ent_rows + (a->csa ? (size_t)epb * w[1] : 0);
    size_t np = 0;
    for (int s = 0; s < nseq; s++) np += sq[s].nblk - sq[s].nfull;
    const long *held = view;
    float *v = (float *)(view + np);
    for (int s = 0; s < nseq; s++)
        for (size_t i = sq[s].nfull; i < sq[s].nblk; i++, v += sz) {
            const long si = *held++;
            if (si < 0) continue;
            for (int k = 0; k < 2; k++)
                memcpy(hd_block_rows(h, s, l, k, i, epb), v + (k ? ent_rows : 0),
                       (size_t)h->ps[si].have[k] * w[k] * sizeof(float));
        }
    free(view);
}

static int hd_attention(be_backend *be, const be_attn_seq *sq, int nseq, int ntok, const be_attn_args *a)
{
    (void)ntok;
    md_host_dev *h = hd_of(be);
    md_model *m = h->m;
    if (!m || (size_t)nseq != h->nseg || h->decline_attn) return 1;
    for (int s = 0; s < nseq; s++)
        if (sq[s].kwin || !sq[s].ring || !sq[s].krows) return 1; /* it builds windows from rings only */
    const int l = a->layer, d = a->head_dim, W = a->window, ID = a->index_dim;
    float **kb = calloc((size_t)nseq, sizeof *kb);
    int64_t *kst = malloc((size_t)nseq * sizeof *kst);
    size_t nsave = 0;
    for (int s = 0; s < nseq; s++) nsave += (size_t)sq[s].nent * d + (size_t)sq[s].nkey * ID;
    float *save = malloc((nsave ? nsave : 1) * sizeof(float));
    int rc = kb && kst && save ? 0 : RC_ENOMEM;
    /* the tables a device reads instead of the blocks (attend_backend's): the blocks' own data pointers and ids,
     * which this emulation's host attention does not read, so it checks them (a stale one fails the forward) */
    for (int s = 0; s < nseq && !rc; s++) {
        const md_seq *q = h->segs[s].seq;
        if (sq[s].nblk > q->nblk || sq[s].nfull > sq[s].nblk) rc = RC_EINVAL;
        for (size_t i = 0; !rc && i < sq[s].nblk; i++)
            if (sq[s].blocks[i] != q->blk[i]->data || sq[s].block_ids[i] != q->blk[i]->id) rc = RC_EINVAL;
        if (rc) h->failed = 1;
    }
    for (int s = 0; s < nseq && !rc; s++) {
        const size_t nold = (size_t)(sq[s].p0 - sq[s].kstart);
        kst[s] = sq[s].kstart;
        if (!(kb[s] = malloc((nold + (size_t)sq[s].T) * d * sizeof(float)))) { rc = RC_ENOMEM; break; }
        for (size_t k = 0; k < nold; k++)
            memcpy(kb[s] + k * d, sq[s].ring + (size_t)((sq[s].kstart + (int64_t)k) % W) * d, (size_t)d * sizeof(float));
        memcpy(kb[s] + nold * d, sq[s].krows, (size_t)sq[s].T * d * sizeof(float));
    }
    size_t o = 0;
    for (int s = 0; s < nseq && !rc; s++)
        for (int k = 0; k < 2; k++) {
            const int64_t e0 = k ? sq[s].key0 : sq[s].ent0, ne = k ? sq[s].nkey : sq[s].nent;
            const size_t w = (size_t)(k ? ID : d);
            for (int64_t j = 0; j < ne; j++, o += w) {
                float *row = ent_row(h->segs[s].seq, l, k, (size_t)(e0 + j));
                memcpy(save + o, row, w * sizeof(float));
                memcpy(row, (k ? sq[s].key_dev : sq[s].ent_dev) + (size_t)j * w, w * sizeof(float));
            }
        }
    /* the partial blocks as a device keeping copies would read them: each slot's rows over the block's */
    long *view = NULL;
    if (!rc && a->ratio) rc = hd_slots_in(h, sq, nseq, a, &view);
    if (!rc) rc = attend_host(m, l, h->segs, h->nseg, h->rw, a->q, a->iq, a->iw, kb, kst, a->out);
    if (view) hd_slots_out(h, sq, nseq, a, view);
    o = 0;
    for (int s = 0; s < nseq && save; s++)
        for (int k = 0; k < 2; k++) {
            const int64_t e0 = k ? sq[s].key0 : sq[s].ent0, ne = k ? sq[s].nkey : sq[s].nent;
            const size_t w = (size_t)(k ? ID : d);
            for (int64_t j = 0; j < ne && o < nsave; j++, o += w)
                memcpy(ent_row(h->segs[s].seq, l, k, (size_t)(e0 + j)), save + o, w * sizeof(float));
        }
    for (int s = 0; kb && s < nseq; s++) free(kb[s]);
    free(kb);
    free(kst);
    free(save);
    return rc ? -1 : 0;
}

static const be_dev_ops hd_dev = {
    .reset = hd_reset, .alloc = hd_alloc, .upload = hd_upload, .download = hd_download, .view = hd_view,
    .failed = hd_failed,
    .zero = hd_zero, .copy = hd_copy, .linear = hd_linear, .linear_x8 = hd_linear, .linear_grouped = hd_linear_grouped, .rmsnorm = hd_rmsnorm,
    .embed = hd_embed, .hc_pre = hd_hc_pre, .hc_head = hd_hc_head, .hc_post = hd_hc_post, .rope = hd_rope,
    .fq = hd_fq, .hadamard = hd_hadamard, .swiglu = hd_swiglu, .scale = hd_scale, .add = hd_add,
    .argmax = hd_argmax,
    .route = hd_route, .gather = hd_gather, .scatter_add = hd_scatter_add, .moe = hd_moe,
    .attention = hd_attention, .comp_pool = hd_comp_pool, .linear_aq = hd_linear_aq,
    .mark = hd_mark, .release = hd_release, .alloc_keep = hd_alloc_keep,
    .down_start = hd_down_start, .down_take = hd_down_take, .sample = hd_sample,
};

static void hd_destroy(be_backend *be)
{
    md_host_dev *h = hd_of(be);
    hd_reset(be);
    free(h->blk);
    free(h->kblk);
    free(h->ps);
    free(h->ps_mem);
    for (int k = 0; k < BE_DOWN_SLOTS; k++) free(h->dn[k]);
    free(h);
}

static const be_ops hd_ops = {.name = "host-dev-graph", .destroy = hd_destroy, .dev = &hd_dev};

void md_model_state_stats(const md_model *m, uint64_t *now, uint64_t *late)
{
    if (now) *now = m->st_state_now;
    if (late) *late = m->st_state_late;
}

void md_model_host_dev_slot_stats(const md_model *m, uint64_t *hits, uint64_t *rows)
{
    const md_host_dev *h = m->hostdev;
    if (hits) *hits = h ? h->ps_hits : 0;
    if (rows) *rows = h ? h->ps_rows : 0;
}

int md_model_set_host_dev_graph(md_model *m, int on)
{
    if (m->hostdev) hd_destroy(&m->hostdev->base);
    m->hostdev = NULL;
    if (!on) return 0;
    md_host_dev *h = calloc(1, sizeof *h);
    if (!h) return RC_ENOMEM;
    h->inner = m->be;
    /* its own copy of the tables: on = 2 has no linear_aq */
    h->dev = hd_dev;
    if (on == 2) h->dev.linear_aq = NULL;
    h->ops = hd_ops;
    h->ops.dev = &h->dev;
    h->base.ops = &h->ops;
    h->base.threads = m->be->threads;
    h->base.impl = m->be->impl;
    h->decline_attn = on == 2;
    h->ps_n = on == 3 ? 1 : 64;
    if (!(h->ps = calloc(h->ps_n, sizeof *h->ps))) {
        free(h);
        return RC_ENOMEM;
    }
    m->hostdev = h;
    return 0;
}

/* ---------------------------------------------------------------- forward */

int md_forward(md_model *m, md_segment *segs, size_t nseg, rc_err *err)
{
    const md_config *c = &m->cfg;
    be_backend *be = m->be;
    const int n = c->hc_mult, D = c->hidden_size, V = c->vocab_size;
    rows_t rw = {0};
    int fail = 0, rc = 0;
    if (n > 16) return rc_errf(err, RC_EUNSUP, "hc_mult %d > 16", n);
    for (size_t s = 0; s < nseg; s++) {
        if (!segs[s].n) return rc_errf(err, RC_EINVAL, "segment %zu has no tokens", s);
        for (size_t t = 0; t < nseg; t++)
            if (t != s && segs[t].seq == segs[s].seq)
                return rc_errf(err, RC_EINVAL, "a sequence appears twice in one batch");
        for (size_t i = 0; i < segs[s].n; i++)
            if (segs[s].ids[i] < 0 || segs[s].ids[i] >= V)
                return rc_errf(err, RC_ERANGE, "token id %d is outside the vocabulary (0..%d)", segs[s].ids[i], V - 1);
        rw.R += segs[s].n;
    }
    const size_t R = rw.R;
    rw.ids = xalloc(R * sizeof(int32_t), &fail);
    rw.pos = xalloc(R * sizeof(int64_t), &fail);
    rw.seg_start = xalloc((nseg + 1) * sizeof(size_t), &fail);
    float *X = NULL, *coll = NULL, *post = NULL, *comb = NULL, *f = NULL;
    float *lg_rows = NULL;
    size_t *lg_src = NULL;
    if (fail) { rc = rc_errf(err, RC_ENOMEM, "out of memory for a batch of %zu tokens", R); goto out; }
    {
        size_t r = 0;
        for (size_t s = 0; s < nseg; s++) {
            rw.seg_start[s] = r;
            for (size_t i = 0; i < segs[s].n; i++, r++) {
                rw.ids[r] = segs[s].ids[i];
                rw.pos[r] = segs[s].seq->len + (int64_t)i;
            }
        }
        rw.seg_start[nseg] = r;
    }
    if (m->hostdev || be->ops->dev) {
        if ((rc = forward_dev(m, m->hostdev ? &m->hostdev->base : be, segs, nseg, &rw, err))) goto out;
        goto advance;
    }
    X = xalloc(R * (size_t)n * D * sizeof(float), &fail);
    coll = xalloc(R * (size_t)D * sizeof(float), &fail);
    post = xalloc(R * (size_t)n * sizeof(float), &fail);
    comb = xalloc(R * (size_t)n * n * sizeof(float), &fail);
    f = xalloc(R * (size_t)D * sizeof(float), &fail);
    if (fail) { rc = rc_errf(err, RC_ENOMEM, "out of memory for a batch of %zu tokens", R); goto out; }

    embed_rows(&m->embed, rw.ids, R, n, X);

    for (int l = 0; l < c->n_layers && !rc; l++) {
        const md_layer *ly = &m->layers[l];
        if (m->hook) m->hook(m->hook_arg, l, 0);
        hc_job hj = {.h = hc_params(c, ly->hc_attn_fn, ly->hc_attn_base, ly->hc_attn_scale), .X = X, .coll = coll,
                     .post = post, .comb = comb, .f = f};
        be_cpu_parallel(be, R, hc_pre_task, &hj);
        be->ops->rmsnorm(be, coll, coll, R, (size_t)D, ly->attn_norm, c->rms_eps);
        if ((rc = attention(m, l, segs, nseg, &rw, coll, f))) break;
        be_cpu_parallel(be, R, hc_post_task, &hj);
        if (m->hook) m->hook(m->hook_arg, l, 1);

        hj.h = hc_params(c, ly->hc_ffn_fn, ly->hc_ffn_base, ly->hc_ffn_scale);
        be_cpu_parallel(be, R, hc_pre_task, &hj);
        be->ops->rmsnorm(be, coll, coll, R, (size_t)D, ly->ffn_norm, c->rms_eps);
        if ((rc = moe(m, l, &rw, coll, f))) break;
        be_cpu_parallel(be, R, hc_post_task, &hj);
        if (m->hook) m->hook(m->hook_arg, l, 2);
    }
    if (!rc && m->hook) m->hook(m->hook_arg, c->n_layers, 0);
    if (rc) { rc = rc_errf(err, rc, "forward failed: out of memory"); goto out; }

    /* logits for the rows asked for: the logits segments' rows, then one row per top1 segment */
    {
        size_t nl = 0;
        for (size_t s = 0; s < nseg; s++)
            if (segs[s].logits) nl += segs[s].all_logits ? segs[s].n : 1;
            else if (segs[s].top1) nl++;
        if (nl) {
            lg_src = xalloc(nl * sizeof(size_t), &fail);
            float *hx = xalloc(nl * (size_t)n * D * sizeof(float), &fail);
            float *y = xalloc(nl * (size_t)D * sizeof(float), &fail);
            lg_rows = xalloc(nl * (size_t)V * sizeof(float), &fail);
            if (fail) {
                free(hx); free(y);
                rc = rc_errf(err, RC_ENOMEM, "out of memory for logits");
                goto out;
            }
            size_t k = 0;
            for (int top = 0; top < 2; top++)
                for (size_t s = 0; s < nseg; s++) {
                    if (top ? segs[s].logits || !segs[s].top1 : !segs[s].logits) continue;
                    size_t a = segs[s].all_logits && !top ? rw.seg_start[s] : rw.seg_start[s + 1] - 1;
                    for (size_t r = a; r < rw.seg_start[s + 1]; r++, k++) {
                        lg_src[k] = r;
                        memcpy(hx + k * (size_t)n * D, X + r * (size_t)n * D, (size_t)n * D * sizeof(float));
                    }
                }
            hc_job hj = {.h = hc_params(c, m->hc_head_fn, m->hc_head_base, m->hc_head_scale), .X = hx, .coll = y};
            be_cpu_parallel(be, nl, hc_head_task, &hj);
            be->ops->rmsnorm(be, y, y, nl, (size_t)D, m->norm, c->rms_eps);
            be->ops->linear(be, lg_rows, y, nl, &m->head);
            k = 0;
            for (size_t s = 0; s < nseg; s++) {
                if (!segs[s].logits) continue;
                size_t cnt = segs[s].all_logits ? segs[s].n : 1;
                memcpy(segs[s].logits, lg_rows + k * (size_t)V, cnt * (size_t)V * sizeof(float));
                k += cnt;
            }
            for (size_t s = 0; s < nseg; s++)
                if (!segs[s].logits && segs[s].top1)
                    *segs[s].top1 = (int32_t)rc_greedy(lg_rows + (k++) * (size_t)V, (size_t)V);
            free(hx);
            free(y);
        }
    }
advance:
    for (size_t s = 0; s < nseg; s++) segs[s].seq->len += (int64_t)segs[s].n;
out:
    free(rw.ids); free(rw.pos); free(rw.seg_start);
    free(X); free(coll); free(post); free(comb); free(f); free(lg_rows); free(lg_src);
    return rc;
}

/* --------------------------------------------------------------- snapshot */

/* The whole decoding state as bytes (docs/KV.md "Snapshot format"): a header
 * that names the shapes it was taken with, every layer's fields in the order
 * of docs/MODEL-STATE.md as little-endian f32, and a CRC32C over all of it.
 * Rings and partial blocks are written whole (valid slots and stale ones), so
 * restore rebuilds the state byte for byte and a restored or cloned state
 * continues exactly like the original at any length, block boundary or not.
 * Restore trusts nothing: it checks every size against the model and the
 * checksum before it touches the state. */

#define SNAP_MAGIC "DISEQSNP"
#define SNAP_VERSION 1u
#define SNAP_HEAD 64u       /* fixed header bytes */
#define SNAP_LAYER_HEAD 24u /* per-layer header bytes */
#define SNAP_MAX_LEN ((int64_t)1 << 40)


/* n floats to/from little-endian bytes */
static void wr_f32s(uint8_t *p, const float *x, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        rc_put_le32(p + 4 * i, u);
    }
#else
    if (n) memcpy(p, x, n * sizeof(float));
#endif
}
static void rd_f32s(float *x, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (size_t i = 0; i < n; i++) {
        uint32_t u = rc_get_le32(p + 4 * i);
        memcpy(x + i, &u, 4);
    }
#else
    if (n) memcpy(x, p, n * sizeof(float));
#endif
}

/* A layer's fields in snapshot order (docs/MODEL-STATE.md); the entry fields
 * (F_C_ENT, F_I_ENT) are the ones that grow with length and live in blocks. */
enum { F_WIN, F_C_KV, F_C_GATE, F_C_OVKV, F_C_OVG, F_C_ENT, F_I_KV, F_I_GATE, F_I_OVKV, F_I_OVG, F_I_ENT, F_COUNT };

#define SNAP_FLAG_NO_ENTRIES 1u /* a boundary state: the entries are in blocks */

static float *field_ptr(seq_layer *L, int f)
{
    switch (f) {
    case F_WIN: return L->win;
    case F_C_KV: return L->c_kv;
    case F_C_GATE: return L->c_gate;
    case F_C_OVKV: return L->c_ovkv;
    case F_C_OVG: return L->c_ovg;
    case F_I_KV: return L->i_kv;
    case F_I_GATE: return L->i_gate;
    case F_I_OVKV: return L->i_ovkv;
    case F_I_OVG: return L->i_ovg;
    default: return NULL; /* entries: through ent_row */
    }
}

/* floats of each field of layer l at length len (0 = absent); len <= SNAP_MAX_LEN keeps every product in range */
static void field_sizes(const md_config *c, int l, int64_t len, int no_entries, uint64_t out[F_COUNT])
{
    const uint64_t d = (uint64_t)c->head_dim, r = (uint64_t)c->ratio[l], id = (uint64_t)c->index_head_dim;
    const int ov = r && c->ratio[l] == c->csa_ratio;
    const uint64_t cd = (ov ? 2 : 1) * d, nent = r && !no_entries ? (uint64_t)len / r : 0;
    memset(out, 0, F_COUNT * sizeof *out);
    out[F_WIN] = (uint64_t)c->window * d;
    if (r) {
        out[F_C_KV] = out[F_C_GATE] = r * cd;
        out[F_C_ENT] = nent * d;
    }
    if (ov) {
        out[F_C_OVKV] = out[F_C_OVG] = r * d;
        out[F_I_KV] = out[F_I_GATE] = r * 2 * id;
        out[F_I_OVKV] = out[F_I_OVG] = r * id;
        out[F_I_ENT] = nent * id;
    }
}

static uint64_t snap_size(const md_config *c, int64_t len, int no_entries)
{
    uint64_t b = SNAP_HEAD + (uint64_t)SNAP_LAYER_HEAD * (uint64_t)c->n_layers + 4;
    for (int l = 0; l < c->n_layers; l++) {
        uint64_t f[F_COUNT];
        field_sizes(c, l, len, no_entries, f);
        for (int k = 0; k < F_COUNT; k++) b += f[k] * 4;
    }
    return b;
}

size_t md_seq_snapshot_size(const md_seq *s) { return (size_t)snap_size(&s->m->cfg, s->len, 0); }
size_t md_seq_boundary_size(const md_model *m) { return (size_t)snap_size(&m->cfg, 0, 1); }

/* the window reaching below win_lo would need what a replay never computed */
static int mid_replay(const md_seq *s) { return s->win_lo > 0 && s->win_lo > s->len - s->m->cfg.window + 1; }

static int snap_write(const md_seq *s, uint8_t *buf, size_t cap, int no_entries, rc_err *err)
{
    const md_config *c = &s->m->cfg;
    const size_t total = (size_t)snap_size(c, s->len, no_entries);
    if (!buf || cap < total)
        return rc_errf(err, RC_EINVAL, "snapshot needs %zu bytes, the buffer has %zu", total, buf ? cap : 0);
    if (mid_replay(s))
        return rc_errf(err, RC_EINVAL, "the state is inside a bounded replay (its window starts at %lld); feed %lld "
                       "more tokens first", (long long)s->win_lo, (long long)(s->win_lo + c->window - 1 - s->len));
    memcpy(buf, SNAP_MAGIC, 8);
    rc_put_le32(buf + 8, SNAP_VERSION);
    rc_put_le32(buf + 12, SNAP_HEAD + SNAP_LAYER_HEAD * (uint32_t)c->n_layers);
    rc_put_le64(buf + 16, total);
    rc_put_le64(buf + 24, (uint64_t)s->len);
    rc_put_le32(buf + 32, (uint32_t)s->m->sem);
    rc_put_le32(buf + 36, (uint32_t)c->n_layers);
    rc_put_le32(buf + 40, (uint32_t)c->head_dim);
    rc_put_le32(buf + 44, (uint32_t)c->window);
    rc_put_le32(buf + 48, (uint32_t)c->index_head_dim);
    rc_put_le32(buf + 52, (uint32_t)c->csa_ratio);
    rc_put_le32(buf + 56, (uint32_t)c->hca_ratio);
    rc_put_le32(buf + 60, no_entries ? SNAP_FLAG_NO_ENTRIES : 0);
    uint8_t *p = buf + SNAP_HEAD;
    for (int l = 0; l < c->n_layers; l++, p += SNAP_LAYER_HEAD) {
        rc_put_le32(p, (uint32_t)c->ratio[l]);
        rc_put_le32(p + 4, c->ratio[l] && c->ratio[l] == c->csa_ratio);
        rc_put_le64(p + 8, s->L[l].c_n);
        rc_put_le64(p + 16, s->L[l].i_n);
    }
    for (int l = 0; l < c->n_layers; l++) {
        uint64_t f[F_COUNT];
        field_sizes(c, l, s->len, no_entries, f);
        for (int k = 0; k < F_COUNT; k++) {
            if (k == F_C_ENT || k == F_I_ENT) {
                const size_t ne = k == F_C_ENT ? s->L[l].c_n : s->L[l].i_n;
                const size_t dim = (size_t)(k == F_C_ENT ? c->head_dim : c->index_head_dim);
                assert(no_entries || f[k] == ne * dim);
                for (size_t b = 0; f[k] && b < ne; b++, p += dim * 4) wr_f32s(p, ent_row(s, l, k == F_I_ENT, b), dim);
                continue;
            }
            wr_f32s(p, field_ptr(&s->L[l], k), (size_t)f[k]);
            p += f[k] * 4;
        }
    }
    rc_put_le32(p, rc_crc32c(buf, (size_t)(p - buf)));
    assert((size_t)(p + 4 - buf) == total);
    return 0;
}

int md_seq_snapshot(const md_seq *s, uint8_t *buf, size_t cap, rc_err *err) { return snap_write(s, buf, cap, 0, err); }

int md_seq_boundary_save(const md_seq *s, uint8_t *buf, size_t cap, rc_err *err)
{
    if (s->len <= 0 || s->len % MD_BLOCK_TOKENS)
        return rc_errf(err, RC_EINVAL, "a boundary state needs a length that is a positive multiple of %d, not %lld",
                       MD_BLOCK_TOKENS, (long long)s->len);
    return snap_write(s, buf, cap, 1, err);
}

/* Check a snapshot (or boundary state) against the model; on success *n_out
 * is its length and *no_entries its kind.  Touches nothing. */
static int snap_check(const md_seq *s, const uint8_t *buf, size_t len, int64_t *n_out, int *no_entries, rc_err *err)
{
    const md_config *c = &s->m->cfg;
    if (!buf || len < 16)
        return rc_errf(err, RC_EINVAL, "state snapshot truncated: %zu bytes, the header alone is %u", buf ? len : 0,
                       SNAP_HEAD);
    if (memcmp(buf, SNAP_MAGIC, 8)) return rc_errf(err, RC_EINVAL, "not a state snapshot (bad magic)");
    const uint32_t ver = rc_get_le32(buf + 8);
    if (ver != SNAP_VERSION)
        return rc_errf(err, RC_EINVAL, "state snapshot format version %u; this build reads version %u", ver, SNAP_VERSION);
    if (len < SNAP_HEAD + 4)
        return rc_errf(err, RC_EINVAL, "state snapshot truncated: %zu bytes, the header alone is %u", len, SNAP_HEAD);
    const uint64_t total = rc_get_le64(buf + 16);
    if (total != len)
        return rc_errf(err, RC_EINVAL, "state snapshot is %zu bytes but its header says %llu (truncated or padded)", len,
                       (unsigned long long)total);
    const uint32_t want = rc_get_le32(buf + len - 4), got = rc_crc32c(buf, len - 4);
    if (want != got)
        return rc_errf(err, RC_EINVAL, "state snapshot corrupted: CRC32C %08x, stored %08x", got, want);

    /* the model it was taken with */
    const uint32_t sem = rc_get_le32(buf + 32);
    if (sem != (uint32_t)s->m->sem)
        return rc_errf(err, RC_EINVAL, "state snapshot was taken with semantics %s; this model runs %s",
                       sem == MD_SEM_OFFICIAL ? "official" : sem == MD_SEM_TRANSFORMERS ? "transformers" : "unknown",
                       md_semantics_name(s->m->sem));
    static const char *const names[] = {"n_layers", "head_dim", "sliding_window", "index_head_dim", "csa_ratio",
                                        "hca_ratio"};
    const int mine[] = {c->n_layers, c->head_dim, c->window, c->index_head_dim, c->csa_ratio, c->hca_ratio};
    for (int i = 0; i < 6; i++) {
        uint32_t v = rc_get_le32(buf + 36 + 4 * i);
        if (v != (uint32_t)mine[i])
            return rc_errf(err, RC_EINVAL, "state snapshot is of another model: %s %u, this model has %d", names[i], v,
                           mine[i]);
    }
    const uint32_t flags = rc_get_le32(buf + 60);
    if (rc_get_le32(buf + 12) != SNAP_HEAD + SNAP_LAYER_HEAD * (uint32_t)c->n_layers || (flags & ~SNAP_FLAG_NO_ENTRIES))
        return rc_errf(err, RC_EINVAL, "state snapshot header is malformed");
    const int noe = (flags & SNAP_FLAG_NO_ENTRIES) != 0;
    const uint64_t slen = rc_get_le64(buf + 24);
    if (slen > (uint64_t)SNAP_MAX_LEN)
        return rc_errf(err, RC_EINVAL, "state snapshot length %llu is out of range", (unsigned long long)slen);
    const int64_t n = (int64_t)slen;
    const uint8_t *lh = buf + SNAP_HEAD;
    for (int l = 0; l < c->n_layers; l++, lh += SNAP_LAYER_HEAD) {
        const int r = c->ratio[l];
        const uint64_t ne = r ? (uint64_t)n / (uint64_t)r : 0, ni = r && r == c->csa_ratio ? ne : 0;
        if (rc_get_le32(lh) != (uint32_t)r)
            return rc_errf(err, RC_EINVAL, "state snapshot is of another model: layer %d has ratio %u, this model %d", l,
                           rc_get_le32(lh), r);
        if (rc_get_le32(lh + 4) != (uint32_t)(r && r == c->csa_ratio) || rc_get_le64(lh + 8) != ne || rc_get_le64(lh + 16) != ni)
            return rc_errf(err, RC_EINVAL, "state snapshot layer %d header does not match %lld tokens", l, (long long)n);
    }
    if (snap_size(c, n, noe) != total)
        return rc_errf(err, RC_EINVAL, "state snapshot of %lld tokens should be %llu bytes, not %llu", (long long)n,
                       (unsigned long long)snap_size(c, n, noe), (unsigned long long)total);
    *n_out = n;
    *no_entries = noe;
    return 0;
}

/* fill s (fresh, blocks in place for the entries) from a checked buffer */
static void snap_fill(md_seq *s, const uint8_t *buf, int64_t n, int noe)
{
    const md_config *c = &s->m->cfg;
    const uint8_t *p = buf + SNAP_HEAD + SNAP_LAYER_HEAD * (size_t)c->n_layers;
    for (int l = 0; l < c->n_layers; l++) {
        seq_layer *L = &s->L[l];
        const int r = c->ratio[l];
        L->c_n = r ? (size_t)(n / r) : 0;
        L->i_n = r && r == c->csa_ratio ? L->c_n : 0;
        uint64_t f[F_COUNT];
        field_sizes(c, l, n, noe, f);
        for (int k = 0; k < F_COUNT; k++) {
            if (k == F_C_ENT || k == F_I_ENT) {
                const size_t dim = (size_t)(k == F_C_ENT ? c->head_dim : c->index_head_dim);
                for (size_t b = 0; b < f[k] / dim; b++, p += dim * 4) rd_f32s(ent_row(s, l, k == F_I_ENT, b), p, dim);
                continue;
            }
            rd_f32s(field_ptr(L, k), p, (size_t)f[k]);
            p += f[k] * 4;
        }
    }
    s->len = n;
    s->win_lo = 0;
}

/* a fresh table of nb blocks (new ones; shared ones come through attach) */
static int seq_alloc_blocks(md_seq *s, size_t nb)
{
    if (seq_blk_reserve(s, nb ? nb : 1)) return RC_ENOMEM;
    for (size_t k = 0; k < nb; k++) {
        md_block *b = md_block_new(s->m);
        if (!b) {
            while (k) md_block_unref(s->m, s->blk[--k]);
            return RC_ENOMEM;
        }
        seq_blk_set(s, k, b);
    }
    s->nblk = nb;
    return 0;
}

static size_t blocks_for(int64_t len) { return (size_t)((len + MD_BLOCK_TOKENS - 1) / MD_BLOCK_TOKENS); }

int md_seq_restore(md_seq *s, const uint8_t *buf, size_t len, rc_err *err)
{
    if (s->len != 0 || s->nblk)
        return rc_errf(err, RC_EINVAL, "restore needs a fresh state; this one holds %lld tokens", (long long)s->len);
    int64_t n;
    int noe;
    int rc = snap_check(s, buf, len, &n, &noe, err);
    if (rc) return rc;
    if (noe) return rc_errf(err, RC_EINVAL, "this is a boundary state (no entries); attach it with its blocks");
    /* everything checked: allocate the blocks, then fill (nothing fails after this) */
    if (s->m->blk_floats && seq_alloc_blocks(s, blocks_for(n)))
        return rc_errf(err, RC_ENOMEM, "out of memory for a state of %lld tokens", (long long)n);
    snap_fill(s, buf, n, 0);
    s->gen = seq_gen();
    return 0;
}

int md_seq_attach(md_seq *s, md_block *const *blocks, size_t n, const uint8_t *bnd, size_t bnd_len, int64_t replay,
                  rc_err *err)
{
    const md_config *c = &s->m->cfg;
    if (s->len != 0 || s->nblk)
        return rc_errf(err, RC_EINVAL, "attach needs a fresh state; this one holds %lld tokens", (long long)s->len);
    if (!n) return rc_errf(err, RC_EINVAL, "attach needs at least one block");
    const int64_t end = (int64_t)n * MD_BLOCK_TOKENS;
    int64_t start = end;
    if (bnd) {
        int64_t bl;
        int noe, rc = snap_check(s, bnd, bnd_len, &bl, &noe, err);
        if (rc) return rc;
        if (!noe) return rc_errf(err, RC_EINVAL, "not a boundary state (it carries its own entries)");
        if (bl != end)
            return rc_errf(err, RC_EINVAL, "the boundary state is at %lld tokens, the blocks end at %lld", (long long)bl,
                           (long long)end);
    } else {
        if (replay < c->window || replay > end)
            return rc_errf(err, RC_EINVAL, "a replay of %lld tokens over %lld: it must cover the window (%d) and fit",
                           (long long)replay, (long long)end, c->window);
        start = end - replay;
    }
    if (seq_blk_reserve(s, n)) return rc_errf(err, RC_ENOMEM, "out of memory");
    for (size_t k = 0; k < n; k++) {
        md_block_ref(blocks[k]);
        seq_blk_set(s, k, blocks[k]);
    }
    s->nblk = n;
    s->gen = seq_gen();
    if (bnd) {
        snap_fill(s, bnd, end, 1);
        return 0;
    }
    /* bounded replay: the entries up to `end` are present; rings, partial
     * blocks and half-A slices start empty at `start` */
    for (int l = 0; l < c->n_layers; l++) {
        const int r = c->ratio[l];
        s->L[l].c_n = r ? (size_t)(end / r) : 0;
        s->L[l].i_n = r && r == c->csa_ratio ? s->L[l].c_n : 0;
    }
    s->len = start;
    s->win_lo = start;
    return 0;
}

md_seq *md_seq_clone(const md_seq *src)
{
    const md_config *c = &src->m->cfg;
    md_seq *s = md_seq_create(src->m);
    if (!s) return NULL;
    /* full blocks are immutable: share them; copy the partial one */
    const size_t full = md_seq_full_blocks(src);
    if (seq_blk_reserve(s, src->nblk ? src->nblk : 1)) goto fail;
    for (size_t k = 0; k < src->nblk; k++) {
        if (k < full) {
            md_block_ref(src->blk[k]);
            seq_blk_set(s, k, src->blk[k]);
        } else {
            md_block *b = md_block_new(s->m);
            if (!b) goto fail;
            memcpy(b->data, src->blk[k]->data, src->m->blk_floats * sizeof(float));
            seq_blk_set(s, k, b);
        }
        s->nblk = k + 1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        seq_layer *L = &s->L[l], *F = &src->L[l];
        uint64_t f[F_COUNT];
        field_sizes(c, l, src->len, 1, f);
        L->c_n = F->c_n;
        L->i_n = F->i_n;
        for (int k = 0; k < F_COUNT; k++)
            if (f[k]) memcpy(field_ptr(L, k), field_ptr(F, k), (size_t)f[k] * sizeof(float));
    }
    s->len = src->len;
    s->win_lo = src->win_lo;
    return s;
fail:
    md_seq_free(s);
    return NULL;
}
