/* v4_load.c - binds a checkpoint's tensors to the V4 graph.
 *
 * Names are the official ones (safetensors.c has already folded the names
 * transformers writes: `model.` prefix, embed_tokens, hc_head.hc_*).  Large
 * matrices stay where mmap put them, in their stored format; be_linear reads
 * them directly.  Small vectors (norms, mHC parameters, sinks, biases, ape) are
 * copied to f32 once.  Every tensor of the file must be used (mtp.* excepted),
 * and every tensor the config implies must be present with the right shape:
 * both failures name the tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/v4_internal.h"

static int own(md_model *m, void *p)
{
    if (m->n_owned == m->cap_owned) {
        size_t nc = m->cap_owned ? m->cap_owned * 2 : 64;
        void **o = realloc(m->owned, nc * sizeof *o);
        if (!o) return -1;
        m->owned = o;
        m->cap_owned = nc;
    }
    m->owned[m->n_owned++] = p;
    return 0;
}

/* names actually bound, to find the unused ones afterwards */
typedef struct {
    char **v;
    size_t n, cap;
} name_set;

static void ns_add(name_set *s, const char *name)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = strdup(name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct {
    md_model *m;
    name_set used;
    rc_err *err;
} loader;

#define DENSE_MASK ((1u << MD_BF16) | (1u << MD_F16) | (1u << MD_F32))

/* A 1-D or 2-D tensor of n floats as an owned f32 copy. */
static int load_f32(loader *L, const char *name, int ndim, const int64_t *shape, float **out)
{
    const md_tensor *t;
    int rc = md_ckpt_get(L->m->ck, name, DENSE_MASK, ndim, shape, &t, L->err);
    if (rc) return rc;
    ns_add(&L->used, name);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    float *f = malloc(n * sizeof *f);
    if (!f || own(L->m, f)) return rc_errf(L->err, RC_ENOMEM, "out of memory loading %s", name);
    if (t->dtype == MD_F32)
        memcpy(f, t->data, n * sizeof *f);
    else if (t->dtype == MD_BF16)
        md_bf16_row_to_f32(t->data, f, n);
    else
        md_f16_row_to_f32(t->data, f, n);
    *out = f;
    return 0;
}

static int load_vec(loader *L, const char *name, int64_t n, float **out)
{
    int64_t shape[1] = {n};
    return load_f32(L, name, 1, shape, out);
}

static int fp8_block_for(const md_config *c, int64_t rows, int64_t cols, int64_t sr, int64_t sc)
{
    int cand[6] = {c->fp8_block, 128, 64, 32, 16, 256};
    for (int i = 0; i < 6; i++) {
        int64_t bs = cand[i];
        if (bs <= 0) continue;
        if ((rows + bs - 1) / bs == sr && (cols + bs - 1) / bs == sc) return (int)bs;
    }
    return 0;
}

/* `prefix.weight` [rows, cols]: dense, FP8 (+ prefix.scale), or packed FP4 (+ prefix.scale). */
static int load_weight(loader *L, const char *prefix, int64_t rows, int64_t cols, be_weight *w)
{
    char wn[256], sn[256];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(sn, sizeof sn, "%s.scale", prefix);
    const md_tensor *t = md_ckpt_find(L->m->ck, wn);
    if (!t) return rc_errf(L->err, RC_EINVAL, "checkpoint has no tensor %s (expected [%lld, %lld])", wn,
                           (long long)rows, (long long)cols);
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    w->data = t->data;
    w->dtype = t->dtype;
    ns_add(&L->used, wn);
    if (t->dtype == MD_BF16 || t->dtype == MD_F16 || t->dtype == MD_F32) {
        int64_t shape[2] = {rows, cols};
        const md_tensor *tt;
        int rc = md_ckpt_get(L->m->ck, wn, DENSE_MASK, 2, shape, &tt, L->err);
        if (rc) return rc;
        w->fmt = BE_W_DENSE;
        return 0;
    }
    const md_tensor *s = md_ckpt_find(L->m->ck, sn);
    if (!s) return rc_errf(L->err, RC_EINVAL, "%s is %s but %s is missing", wn, md_dtype_name(t->dtype), sn);
    if (s->dtype != MD_F8_E8M0 && s->dtype != MD_F32)
        return rc_errf(L->err, RC_EINVAL, "%s: scale dtype %s, expected F8_E8M0 or F32", sn, md_dtype_name(s->dtype));
    if (s->ndim != 2) return rc_errf(L->err, RC_EINVAL, "%s: scale must be 2-D", sn);
    ns_add(&L->used, sn);
    w->scale = s->data;
    w->scale_dtype = s->dtype;
    if (t->dtype == MD_F8_E4M3) {
        if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
            return rc_errf(L->err, RC_EINVAL, "%s: shape mismatch, expected [%lld, %lld]", wn, (long long)rows,
                           (long long)cols);
        w->fmt = BE_W_FP8;
        w->block = fp8_block_for(&L->m->cfg, rows, cols, s->shape[0], s->shape[1]);
        if (!w->block)
            return rc_errf(L->err, RC_EINVAL, "%s: scale shape [%lld, %lld] fits no square block size for [%lld, %lld]",
                           sn, (long long)s->shape[0], (long long)s->shape[1], (long long)rows, (long long)cols);
        return 0;
    }
    if (t->dtype == MD_I8 || t->dtype == MD_U8) {
        if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] * 2 != cols)
            return rc_errf(L->err, RC_EINVAL, "%s: packed FP4 shape mismatch, expected [%lld, %lld]", wn,
                           (long long)rows, (long long)(cols / 2));
        if (s->dtype != MD_F8_E8M0 || s->shape[0] != rows || s->shape[1] <= 0 || cols % s->shape[1])
            return rc_errf(L->err, RC_EINVAL, "%s: FP4 scale must be F8_E8M0 [%lld, cols/block]", sn, (long long)rows);
        w->fmt = BE_W_FP4;
        w->block = (int)(cols / s->shape[1]);
        if (w->block % 2) return rc_errf(L->err, RC_EINVAL, "%s: odd FP4 block %d", sn, w->block);
        return 0;
    }
    return rc_errf(L->err, RC_EINVAL, "%s: unsupported weight dtype %s", wn, md_dtype_name(t->dtype));
}

static uint64_t wparams(const be_weight *w) { return (uint64_t)w->rows * (uint64_t)w->cols; }

static int load_layer(loader *L, int l)
{
    md_model *m = L->m;
    const md_config *c = &m->cfg;
    md_layer *ly = &m->layers[l];
    const int64_t D = c->hidden_size, nD = (int64_t)c->hc_mult * D, mix = (int64_t)(2 + c->hc_mult) * c->hc_mult;
    const int64_t H = c->n_heads, d = c->head_dim, ql = c->q_lora_rank, g = c->o_groups, ol = c->o_lora_rank;
    const int64_t E = c->n_experts, I = c->moe_inter;
    char p[256], q[256];
    int rc;
#define P(...) (snprintf(p, sizeof p, __VA_ARGS__), p)
    ly->ratio = c->ratio[l];
    ly->overlap = ly->ratio && ly->ratio == c->csa_ratio;
    ly->hash = c->hash[l];

    int64_t fn_shape[2] = {mix, nD};
    if ((rc = load_f32(L, P("layers.%d.hc_attn_fn", l), 2, fn_shape, &ly->hc_attn_fn))) return rc;
    if ((rc = load_vec(L, P("layers.%d.hc_attn_base", l), mix, &ly->hc_attn_base))) return rc;
    if ((rc = load_vec(L, P("layers.%d.hc_attn_scale", l), 3, &ly->hc_attn_scale))) return rc;
    if ((rc = load_f32(L, P("layers.%d.hc_ffn_fn", l), 2, fn_shape, &ly->hc_ffn_fn))) return rc;
    if ((rc = load_vec(L, P("layers.%d.hc_ffn_base", l), mix, &ly->hc_ffn_base))) return rc;
    if ((rc = load_vec(L, P("layers.%d.hc_ffn_scale", l), 3, &ly->hc_ffn_scale))) return rc;
    if ((rc = load_vec(L, P("layers.%d.attn_norm.weight", l), D, &ly->attn_norm))) return rc;
    if ((rc = load_vec(L, P("layers.%d.ffn_norm.weight", l), D, &ly->ffn_norm))) return rc;

    if ((rc = load_weight(L, P("layers.%d.attn.wq_a", l), ql, D, &ly->wq_a))) return rc;
    if ((rc = load_vec(L, P("layers.%d.attn.q_norm.weight", l), ql, &ly->q_norm))) return rc;
    if ((rc = load_weight(L, P("layers.%d.attn.wq_b", l), H * d, ql, &ly->wq_b))) return rc;
    if ((rc = load_weight(L, P("layers.%d.attn.wkv", l), d, D, &ly->wkv))) return rc;
    /* transformers 5.17 saves the attention's kv_norm as `attn.norm` (its
     * rename table maps compressor.norm <-> kv_norm and inverts it for the
     * attention too); the official name is `attn.kv_norm` */
    snprintf(q, sizeof q, "layers.%d.attn.kv_norm.weight", l);
    if (!md_ckpt_find(m->ck, q)) snprintf(q, sizeof q, "layers.%d.attn.norm.weight", l);
    if ((rc = load_vec(L, q, d, &ly->kv_norm))) return rc;
    if ((rc = load_weight(L, P("layers.%d.attn.wo_a", l), g * ol, H * d / g, &ly->wo_a))) return rc;
    if ((rc = load_weight(L, P("layers.%d.attn.wo_b", l), D, g * ol, &ly->wo_b))) return rc;
    if ((rc = load_vec(L, P("layers.%d.attn.attn_sink", l), H, &ly->attn_sink))) return rc;
    m->n_params += wparams(&ly->wq_a) + wparams(&ly->wq_b) + wparams(&ly->wkv) + wparams(&ly->wo_a) +
                   wparams(&ly->wo_b) + (uint64_t)(2 * mix * nD);

    if (ly->ratio) {
        int64_t cd = (ly->overlap ? 2 : 1) * d;
        if ((rc = load_weight(L, P("layers.%d.attn.compressor.wkv", l), cd, D, &ly->c_wkv))) return rc;
        if ((rc = load_weight(L, P("layers.%d.attn.compressor.wgate", l), cd, D, &ly->c_wgate))) return rc;
        int64_t ape_shape[2] = {ly->ratio, cd};
        if ((rc = load_f32(L, P("layers.%d.attn.compressor.ape", l), 2, ape_shape, &ly->c_ape))) return rc;
        if ((rc = load_vec(L, P("layers.%d.attn.compressor.norm.weight", l), d, &ly->c_norm))) return rc;
        m->n_params += 2 * wparams(&ly->c_wkv);
    }
    if (ly->overlap) {
        const int64_t IH = c->index_heads, ID = c->index_head_dim;
        if ((rc = load_weight(L, P("layers.%d.attn.indexer.wq_b", l), IH * ID, ql, &ly->i_wq_b))) return rc;
        if ((rc = load_weight(L, P("layers.%d.attn.indexer.weights_proj", l), IH, D, &ly->i_wproj))) return rc;
        if ((rc = load_weight(L, P("layers.%d.attn.indexer.compressor.wkv", l), 2 * ID, D, &ly->i_wkv))) return rc;
        if ((rc = load_weight(L, P("layers.%d.attn.indexer.compressor.wgate", l), 2 * ID, D, &ly->i_wgate))) return rc;
        int64_t ape_shape[2] = {ly->ratio, 2 * ID};
        if ((rc = load_f32(L, P("layers.%d.attn.indexer.compressor.ape", l), 2, ape_shape, &ly->i_ape))) return rc;
        if ((rc = load_vec(L, P("layers.%d.attn.indexer.compressor.norm.weight", l), ID, &ly->i_norm))) return rc;
        m->n_params += wparams(&ly->i_wq_b) + wparams(&ly->i_wproj) + 2 * wparams(&ly->i_wkv);
    }

    if ((rc = load_weight(L, P("layers.%d.ffn.gate", l), E, D, &ly->gate))) return rc;
    if (ly->hash) {
        snprintf(q, sizeof q, "layers.%d.ffn.gate.tid2eid", l);
        const md_tensor *t;
        int64_t shape[2] = {c->vocab_size, c->top_k};
        if ((rc = md_ckpt_get(m->ck, q, (1u << MD_I32) | (1u << MD_I64), 2, shape, &t, L->err))) return rc;
        ns_add(&L->used, q);
        size_t n = (size_t)c->vocab_size * (size_t)c->top_k;
        ly->tid2eid = malloc(n * sizeof(int32_t));
        if (!ly->tid2eid || own(m, ly->tid2eid)) return rc_errf(L->err, RC_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            int64_t e = t->dtype == MD_I32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
            if (e < 0 || e >= E)
                return rc_errf(L->err, RC_ERANGE, "%s: entry %zu = %lld is not an expert id (0..%lld)", q, i,
                               (long long)e, (long long)E - 1);
            ly->tid2eid[i] = (int32_t)e;
        }
    } else {
        if ((rc = load_vec(L, P("layers.%d.ffn.gate.bias", l), E, &ly->gate_bias))) return rc;
    }
    ly->w1 = calloc((size_t)E, sizeof *ly->w1);
    ly->w2 = calloc((size_t)E, sizeof *ly->w2);
    ly->w3 = calloc((size_t)E, sizeof *ly->w3);
    if (!ly->w1 || !ly->w2 || !ly->w3) return rc_errf(L->err, RC_ENOMEM, "out of memory");
    for (int64_t e = 0; e < E; e++) {
        if ((rc = load_weight(L, P("layers.%d.ffn.experts.%lld.w1", l, (long long)e), I, D, &ly->w1[e]))) return rc;
        if ((rc = load_weight(L, P("layers.%d.ffn.experts.%lld.w2", l, (long long)e), D, I, &ly->w2[e]))) return rc;
        if ((rc = load_weight(L, P("layers.%d.ffn.experts.%lld.w3", l, (long long)e), I, D, &ly->w3[e]))) return rc;
    }
    ly->moe_q_uniform = 1;
    ly->moe_q_in = E > 0 && md_w_quantised(&ly->w1[0]);
    ly->moe_q_out = E > 0 && md_w_quantised(&ly->w2[0]);
    for (int64_t e = 0; e < E; e++) {
        const int i1 = md_w_quantised(&ly->w1[e]), i3 = md_w_quantised(&ly->w3[e]);
        ly->moe_q_any |= i1 | i3;
        if (i1 != ly->moe_q_in || i3 != ly->moe_q_in || md_w_quantised(&ly->w2[e]) != ly->moe_q_out)
            ly->moe_q_uniform = 0;
    }
    if ((rc = load_weight(L, P("layers.%d.ffn.shared_experts.w1", l), I, D, &ly->sw1))) return rc;
    if ((rc = load_weight(L, P("layers.%d.ffn.shared_experts.w2", l), D, I, &ly->sw2))) return rc;
    if ((rc = load_weight(L, P("layers.%d.ffn.shared_experts.w3", l), I, D, &ly->sw3))) return rc;
    m->n_params += wparams(&ly->gate) + (uint64_t)(E + 1) * 3 * (uint64_t)I * (uint64_t)D;
#undef P
    return 0;
}

int md_load_weights(md_model *m, md_progress_fn progress, void *progress_arg, rc_err *err)
{
    const md_config *c = &m->cfg;
    loader L = {.m = m, .err = err};
    int rc;
    const int64_t D = c->hidden_size, n = c->hc_mult;
    if (c->n_shared != 1)
        return rc_errf(err, RC_EUNSUP, "n_shared_experts = %d; V4 checkpoints have exactly 1", c->n_shared);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return rc_errf(err, RC_ENOMEM, "out of memory");

    if ((rc = load_weight(&L, "embed", c->vocab_size, D, &m->embed))) goto out;
    if (m->embed.fmt != BE_W_DENSE) { rc = rc_errf(err, RC_EUNSUP, "embed.weight must be dense"); goto out; }
    if (md_ckpt_find(m->ck, "head.weight") || !c->tie_embeddings) {
        if ((rc = load_weight(&L, "head", c->vocab_size, D, &m->head))) goto out;
    } else {
        m->head = m->embed;
    }
    if ((rc = load_vec(&L, "norm.weight", D, &m->norm))) goto out;
    int64_t hshape[2] = {n, n * D};
    if ((rc = load_f32(&L, "hc_head_fn", 2, hshape, &m->hc_head_fn))) goto out;
    if ((rc = load_vec(&L, "hc_head_base", n, &m->hc_head_base))) goto out;
    if ((rc = load_vec(&L, "hc_head_scale", 1, &m->hc_head_scale))) goto out;
    m->n_params += wparams(&m->embed) + (m->head.data != m->embed.data ? wparams(&m->head) : 0);
    for (int l = 0; l < c->n_layers; l++) {
        if ((rc = load_layer(&L, l))) goto out;
        if (progress) progress(progress_arg, "bind", (uint64_t)l + 1, (uint64_t)c->n_layers);
    }

    /* every tensor must have a use (MTP layers are not run yet) */
    qsort(L.used.v, L.used.n, sizeof *L.used.v, cmp_str);
    {
        char list[400] = "";
        size_t unused = 0;
        for (size_t i = 0; i < md_ckpt_count(m->ck); i++) {
            const char *nm = md_ckpt_at(m->ck, i)->name;
            if (!strncmp(nm, "mtp.", 4)) continue;
            if (bsearch(&nm, L.used.v, L.used.n, sizeof *L.used.v, cmp_str)) continue;
            if (unused++ < 4) {
                size_t k = strlen(list);
                snprintf(list + k, sizeof list - k, "%s%s", k ? ", " : "", nm);
            }
        }
        if (unused) {
            rc = rc_errf(err, RC_EINVAL, "checkpoint has %zu tensor(s) this config does not use: %s%s", unused, list,
                         unused > 4 ? ", ..." : "");
            goto out;
        }
    }
    rc = 0;
out:
    for (size_t i = 0; i < L.used.n; i++) free(L.used.v[i]);
    free(L.used.v);
    return rc;
}

void md_free_weights(md_model *m)
{
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layers; l++) {
            free(m->layers[l].w1);
            free(m->layers[l].w2);
            free(m->layers[l].w3);
        }
    free(m->layers);
    for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
}
