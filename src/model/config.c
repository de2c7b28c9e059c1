/* config.c - config.json -> md_config for model_type deepseek_v4.
 *
 * Two generations of keys describe the same model: the released checkpoint's
 * (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling,
 * compress_rate_csa/hca) and transformers 5.17's (layer_types,
 * mlp_layer_types, partial_rotary_factor, rope_parameters with main/compress,
 * compress_rates).  They are folded here exactly as DeepseekV4Config's
 * __post_init__ folds them (model-v4.md §2.4), so a checkpoint written by
 * either loads to the same md_config.  Defaults are transformers' (= the
 * V4-Flash values), except that the layer schedule has no default.
 *
 * The reader does not check the config against a checkpoint; that is the
 * model loader's job.  Every key is type-checked (an integer key given 1.5 or
 * "1" is an error, not a truncation) and every error names its key. */
#include "model/config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#define E(...) rc_errf(err, RC_EINVAL, "config: " __VA_ARGS__)

/* ---- typed getters: a missing key or JSON null takes the default */

static int get_int_v(const json_t *v, const char *key, int *out, rc_err *err) {
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < INT_MIN || x > INT_MAX) return E("%s: %lld is out of range", key, (long long)x);
        *out = (int)x;
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) <= INT_MAX) {
            *out = (int)d; /* 128.0 is an integer; 1.5 is not */
            return 0;
        }
    }
    return E("%s must be an integer", key);
}

static int get_int(const json_t *o, const char *key, int def, int *out, rc_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    return get_int_v(v, key, out, err);
}

static int get_num(const json_t *o, const char *key, double def, double *out, rc_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return E("%s must be a number", key);
    *out = json_number_value(v);
    if (!isfinite(*out)) return E("%s must be finite", key);
    return 0;
}

static int get_f32(const json_t *o, const char *key, double def, float *out, rc_err *err) {
    double d;
    int rc = get_num(o, key, def, &d, err);
    *out = (float)d;
    return rc;
}

static int get_bool(const json_t *o, const char *key, int def, int *out, rc_err *err) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = (int)json_integer_value(v);
        return 0;
    }
    return E("%s must be true or false", key);
}

/* NULL when absent or null; an error when present and not a string */
static int get_str(const json_t *o, const char *key, const char **out, rc_err *err) {
    const json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return E("%s must be a string", key);
    *out = json_string_value(v);
    return 0;
}

/* ---- schedules */

static const char *const attn_types[] = {"sliding_attention", "compressed_sparse_attention",
                                         "heavily_compressed_attention"};

static int compress_rates(const json_t *root, md_config *c, rc_err *err) {
    int rc;
    const json_t *cr = json_object_get(root, "compress_rates");
    c->csa_ratio = 4;
    c->hca_ratio = 128;
    if (cr && !json_is_null(cr)) {
        if (!json_is_object(cr)) return E("compress_rates must be an object");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)cr, k, v) {
            char name[96];
            snprintf(name, sizeof name, "compress_rates.%s", k);
            int *dst = strcmp(k, attn_types[1]) == 0   ? &c->csa_ratio
                       : strcmp(k, attn_types[2]) == 0 ? &c->hca_ratio
                                                       : NULL;
            if (!dst)
                return E("compress_rates: unknown key '%s' (expected %s or %s)", k, attn_types[1],
                         attn_types[2]);
            if ((rc = get_int_v(v, name, dst, err))) return rc;
        }
    }
    if ((rc = get_int(root, "compress_rate_csa", c->csa_ratio, &c->csa_ratio, err))) return rc;
    if ((rc = get_int(root, "compress_rate_hca", c->hca_ratio, &c->hca_ratio, err))) return rc;
    if (c->csa_ratio <= 0) return E("compressed_sparse_attention rate must be > 0 (got %d)", c->csa_ratio);
    if (c->hca_ratio <= 0)
        return E("heavily_compressed_attention rate must be > 0 (got %d)", c->hca_ratio);
    return 0;
}

/* A per-layer list may be longer than num_hidden_layers (transformers keeps
 * the first n: the released compress_ratios carries the MTP layer's entry),
 * never shorter. */
static int list_len(const json_t *a, const char *key, int n, rc_err *err) {
    if (!json_is_array(a)) return E("%s must be a list", key);
    if (json_array_size(a) < (size_t)n)
        return E("%s has %zu entries but num_hidden_layers is %d", key, json_array_size(a), n);
    return 0;
}

static int layer_schedule(const json_t *root, md_config *c, rc_err *err) {
    int rc, n = c->n_layers;
    const json_t *lt = json_object_get(root, "layer_types"), *cr = json_object_get(root, "compress_ratios");
    if (lt && !json_is_null(lt)) {
        if ((rc = list_len(lt, "layer_types", n, err))) return rc;
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            int ty = -1;
            for (int k = 0; s && k < 3; k++)
                if (strcmp(s, attn_types[k]) == 0) ty = k;
            if (ty < 0)
                return E("layer_types[%zu] must be one of sliding_attention, "
                         "compressed_sparse_attention, heavily_compressed_attention",
                         i);
            if (i < (size_t)n) c->ratio[i] = ty == 0 ? 0 : ty == 1 ? c->csa_ratio : c->hca_ratio;
        }
        return 0;
    }
    if (cr && !json_is_null(cr)) {
        if ((rc = list_len(cr, "compress_ratios", n, err))) return rc;
        for (size_t i = 0; i < json_array_size(cr); i++) {
            char key[48];
            int r;
            snprintf(key, sizeof key, "compress_ratios[%zu]", i);
            if ((rc = get_int_v(json_array_get(cr, i), key, &r, err))) return rc;
            /* the values name layer types (transformers maps exactly these three) */
            if (r != 0 && r != 4 && r != 128) return E("%s is %d; expected 0, 4 or 128", key, r);
            if (i < (size_t)n) c->ratio[i] = r == 0 ? 0 : r == 4 ? c->csa_ratio : c->hca_ratio;
        }
        return 0;
    }
    return E("no layer schedule: layer_types or compress_ratios is required "
             "(transformers would silently assume the V4-Pro schedule)");
}

static int moe_schedule(const json_t *root, md_config *c, rc_err *err) {
    int rc, n = c->n_layers;
    const json_t *mt = json_object_get(root, "mlp_layer_types");
    c->n_hash_layers = 0;
    if (mt && !json_is_null(mt)) {
        if ((rc = list_len(mt, "mlp_layer_types", n, err))) return rc;
        for (size_t i = 0; i < json_array_size(mt); i++) {
            const char *s = json_string_value(json_array_get(mt, i));
            if (!s || (strcmp(s, "hash_moe") != 0 && strcmp(s, "moe") != 0))
                return E("mlp_layer_types[%zu] must be hash_moe or moe", i);
            if (i < (size_t)n) {
                c->hash[i] = s[0] == 'h';
                c->n_hash_layers += c->hash[i];
            }
        }
        return 0;
    }
    int nh;
    if ((rc = get_int(root, "num_hash_layers", 3, &nh, err))) return rc;
    if (nh < 0) return E("num_hash_layers must be >= 0 (got %d)", nh);
    for (int i = 0; i < n; i++) c->hash[i] = i < nh;
    c->n_hash_layers = nh < n ? nh : n;
    return 0;
}

/* ---- RoPE */

static int rope_type_of(const json_t *o, const char *where, int *yarn, rc_err *err) {
    const json_t *t = json_object_get(o, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(o, "type");
    const char *s = t && !json_is_null(t) ? json_string_value(t) : "default";
    if (!s) return E("%s.rope_type must be a string", where);
    if (strcmp(s, "yarn") == 0)
        *yarn = 1;
    else if (strcmp(s, "default") == 0)
        *yarn = 0;
    else
        return rc_errf(err, RC_EUNSUP, "config: %s: rope type '%s' is not supported (yarn or default)",
                       where, s);
    return 0;
}

static int yarn_params(const json_t *o, const char *where, double max_pos, md_config *c, rc_err *err) {
    int rc;
    char key[96];
    snprintf(key, sizeof key, "%s.factor", where);
    if (!json_is_number(json_object_get(o, "factor")))
        return E("%s is required for yarn and must be a number", key);
    c->yarn_factor = json_number_value(json_object_get(o, "factor"));
    snprintf(key, sizeof key, "%s.original_max_position_embeddings", where);
    if ((rc = get_num(o, "original_max_position_embeddings", 0, &c->yarn_orig_max, err))) return rc;
    /* transformers: `.get(k) or default`, so 0 also takes the default */
    if (c->yarn_orig_max == 0) c->yarn_orig_max = max_pos;
    if ((rc = get_num(o, "beta_fast", 0, &c->yarn_beta_fast, err))) return rc;
    if (c->yarn_beta_fast == 0) c->yarn_beta_fast = 32;
    if ((rc = get_num(o, "beta_slow", 0, &c->yarn_beta_slow, err))) return rc;
    if (c->yarn_beta_slow == 0) c->yarn_beta_slow = 1;
    if (!(c->yarn_factor > 0)) return E("%s.factor must be > 0", where);
    if (!(c->yarn_orig_max > 0)) return E("%s must be > 0", key);
    return 0;
}

static int rope(const json_t *root, md_config *c, rc_err *err) {
    int rc;
    double max_pos;
    if ((rc = get_num(root, "rope_theta", 10000.0, &c->rope_theta, err))) return rc;
    if ((rc = get_num(root, "compress_rope_theta", 160000.0, &c->compress_rope_theta, err))) return rc;
    if ((rc = get_num(root, "max_position_embeddings", 1048576, &max_pos, err))) return rc;
    c->yarn = 0;
    const json_t *rp = json_object_get(root, "rope_parameters"), *rs = json_object_get(root, "rope_scaling");
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return E("rope_parameters must be an object");
        const json_t *main = json_object_get(rp, "main"), *comp = json_object_get(rp, "compress");
        if (main || comp) { /* nested: {"main": {...}, "compress": {...}} */
            if (!json_is_object(main) || !json_is_object(comp))
                return E("rope_parameters: main and compress must both be objects");
            if ((rc = get_num(main, "rope_theta", c->rope_theta, &c->rope_theta, err))) return rc;
            if ((rc = get_num(comp, "rope_theta", c->compress_rope_theta, &c->compress_rope_theta, err)))
                return rc;
            int main_yarn;
            if ((rc = rope_type_of(main, "rope_parameters.main", &main_yarn, err))) return rc;
            if (main_yarn) /* V4 applies YaRN to compressed layers only */
                return rc_errf(err, RC_EUNSUP,
                               "config: rope_parameters.main: yarn on the main RoPE is not supported");
            if ((rc = rope_type_of(comp, "rope_parameters.compress", &c->yarn, err))) return rc;
            if (c->yarn) return yarn_params(comp, "rope_parameters.compress", max_pos, c, err);
            return 0;
        }
        /* flat keys go to the compressed RoPE; its theta stays compress_rope_theta */
        if ((rc = rope_type_of(rp, "rope_parameters", &c->yarn, err))) return rc;
        if (c->yarn) return yarn_params(rp, "rope_parameters", max_pos, c, err);
        return 0;
    }
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return E("rope_scaling must be an object");
        if ((rc = rope_type_of(rs, "rope_scaling", &c->yarn, err))) return rc;
        if (c->yarn) return yarn_params(rs, "rope_scaling", max_pos, c, err);
    }
    return 0;
}

static int rope_dim(const json_t *root, md_config *c, rc_err *err) {
    int rc;
    const json_t *qr = json_object_get(root, "qk_rope_head_dim"), *pf = json_object_get(root, "partial_rotary_factor");
    int have_q = qr && !json_is_null(qr), have_p = pf && !json_is_null(pf);
    int from_p = 0;
    if (have_p) {
        double f;
        if ((rc = get_num(root, "partial_rotary_factor", 0, &f, err))) return rc;
        if (!(f > 0 && f <= 1)) return E("partial_rotary_factor must be in (0, 1]");
        from_p = (int)(c->head_dim * f); /* python int(): truncation */
    }
    if (have_q) {
        if ((rc = get_int(root, "qk_rope_head_dim", 0, &c->rope_dim, err))) return rc;
        if (have_p && from_p != c->rope_dim)
            return E("qk_rope_head_dim %d disagrees with partial_rotary_factor * head_dim = %d",
                     c->rope_dim, from_p);
    } else {
        c->rope_dim = have_p ? from_p : c->head_dim / 8;
    }
    return 0;
}

/* ---- the whole config */

static int parse_root(const json_t *root, md_config *c, rc_err *err) {
    int rc;
    const char *s;
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return E("not a JSON object");
    if ((rc = get_str(root, "model_type", &s, err))) return rc;
    if (!s) return E("model_type is missing (expected deepseek_v4)");
    if (strcmp(s, "deepseek_v4") != 0)
        return rc_errf(err, RC_EUNSUP, "config: model_type '%s' is not supported yet (only deepseek_v4)", s);

    static const struct {
        const char *key;
        int def;
        size_t off;
    } ints[] = {
#define I(k, d, f) {k, d, offsetof(md_config, f)}
        I("vocab_size", 129280, vocab_size),
        I("hidden_size", 4096, hidden_size),
        I("moe_intermediate_size", 2048, moe_inter),
        I("num_hidden_layers", 43, n_layers),
        I("num_attention_heads", 64, n_heads),
        I("num_key_value_heads", 1, n_kv_heads),
        I("head_dim", 512, head_dim),
        I("q_lora_rank", 1024, q_lora_rank),
        I("o_groups", 8, o_groups),
        I("o_lora_rank", 1024, o_lora_rank),
        I("n_routed_experts", 256, n_experts),
        I("n_shared_experts", 1, n_shared),
        I("num_experts_per_tok", 6, top_k),
        I("sliding_window", 128, window),
        I("index_n_heads", 64, index_heads),
        I("index_head_dim", 128, index_head_dim),
        I("index_topk", 512, index_topk),
        I("hc_mult", 4, hc_mult),
        I("hc_sinkhorn_iters", 20, hc_iters),
        I("num_nextn_predict_layers", 1, n_mtp),
        I("bos_token_id", 0, bos_id),
#undef I
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if ((rc = get_int(root, ints[i].key, ints[i].def, (int *)((char *)c + ints[i].off), err)))
            return rc;
    if (json_is_null(json_object_get(root, "bos_token_id"))) c->bos_id = -1;
    const json_t *eos = json_object_get(root, "eos_token_id");
    if (!eos)
        c->eos_id = 1;
    else if (json_is_null(eos))
        c->eos_id = -1;
    else if (json_is_array(eos)) {
        if (!json_array_size(eos)) return E("eos_token_id is an empty list");
        if ((rc = get_int_v(json_array_get(eos, 0), "eos_token_id[0]", &c->eos_id, err))) return rc;
    } else if ((rc = get_int_v(eos, "eos_token_id", &c->eos_id, err)))
        return rc;

    if ((rc = get_bool(root, "norm_topk_prob", 1, &c->norm_topk, err))) return rc;
    if ((rc = get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, err))) return rc;
    if ((rc = get_f32(root, "routed_scaling_factor", 1.5, &c->route_scale, err))) return rc;
    if ((rc = get_f32(root, "swiglu_limit", 10.0, &c->swiglu_limit, err))) return rc;
    if ((rc = get_f32(root, "hc_eps", 1e-6, &c->hc_eps, err))) return rc;
    if ((rc = get_f32(root, "rms_norm_eps", 1e-6, &c->rms_eps, err))) return rc;

    if ((rc = get_str(root, "hidden_act", &s, err))) return rc;
    if (s && strcmp(s, "silu") != 0)
        return rc_errf(err, RC_EUNSUP, "config: hidden_act '%s' is not supported (silu)", s);
    if ((rc = get_str(root, "scoring_func", &s, err))) return rc;
    if (!s || strcmp(s, "sqrtsoftplus") == 0)
        c->score_func = MD_SCORE_SQRTSOFTPLUS;
    else if (strcmp(s, "sigmoid") == 0)
        c->score_func = MD_SCORE_SIGMOID;
    else if (strcmp(s, "softmax") == 0)
        c->score_func = MD_SCORE_SOFTMAX;
    else
        return E("scoring_func '%s' is not one of sqrtsoftplus, sigmoid, softmax", s);

    /* sizes first: the schedules and the rope dim depend on them */
    static const struct {
        const char *key;
        size_t off;
    } pos[] = {
#define P(k, f) {k, offsetof(md_config, f)}
        P("vocab_size", vocab_size),          P("hidden_size", hidden_size),
        P("moe_intermediate_size", moe_inter), P("num_hidden_layers", n_layers),
        P("num_attention_heads", n_heads),    P("num_key_value_heads", n_kv_heads),
        P("head_dim", head_dim),              P("q_lora_rank", q_lora_rank),
        P("o_groups", o_groups),              P("o_lora_rank", o_lora_rank),
        P("n_routed_experts", n_experts),     P("num_experts_per_tok", top_k),
        P("sliding_window", window),          P("index_n_heads", index_heads),
        P("index_head_dim", index_head_dim),  P("index_topk", index_topk),
        P("hc_mult", hc_mult),                P("hc_sinkhorn_iters", hc_iters),
#undef P
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        int v = *(const int *)((const char *)c + pos[i].off);
        if (v <= 0) return E("%s must be > 0 (got %d)", pos[i].key, v);
    }
    if (c->n_shared < 0) return E("n_shared_experts must be >= 0 (got %d)", c->n_shared);
    if (c->n_mtp < 0) return E("num_nextn_predict_layers must be >= 0 (got %d)", c->n_mtp);
    if (c->n_layers > MD_MAX_LAYERS)
        return E("num_hidden_layers %d exceeds the limit of %d", c->n_layers, MD_MAX_LAYERS);

    if ((rc = rope_dim(root, c, err))) return rc;
    if ((rc = compress_rates(root, c, err))) return rc;
    if ((rc = layer_schedule(root, c, err))) return rc;
    if ((rc = moe_schedule(root, c, err))) return rc;
    if ((rc = rope(root, c, err))) return rc;

    const json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q)) {
        if (!json_is_object(q)) return E("quantization_config must be an object");
        if ((rc = get_str(q, "quant_method", &s, err))) return rc;
        if (s && strcmp(s, "fp8") != 0)
            return rc_errf(err, RC_EUNSUP, "config: quantization_config.quant_method '%s' is not supported (fp8)", s);
        const json_t *bs = json_object_get(q, "weight_block_size");
        if (bs && !json_is_null(bs)) {
            int b0, b1;
            if (!json_is_array(bs) || json_array_size(bs) != 2)
                return E("quantization_config.weight_block_size must be a [rows, cols] pair");
            if ((rc = get_int_v(json_array_get(bs, 0), "quantization_config.weight_block_size[0]", &b0, err)) ||
                (rc = get_int_v(json_array_get(bs, 1), "quantization_config.weight_block_size[1]", &b1, err)))
                return rc;
            if (b0 <= 0 || b0 != b1)
                return rc_errf(err, RC_EUNSUP,
                               "config: quantization_config.weight_block_size [%d, %d]: only square blocks are supported",
                               b0, b1);
            c->fp8_block = b0;
        }
    }

    /* cross-checks */
    if (c->head_dim % 2) return E("head_dim must be even (got %d)", c->head_dim);
    if (c->rope_dim <= 0 || c->rope_dim % 2)
        return E("qk_rope_head_dim must be even and > 0 (got %d)", c->rope_dim);
    if (c->rope_dim > c->head_dim)
        return E("qk_rope_head_dim %d exceeds head_dim %d", c->rope_dim, c->head_dim);
    if (c->index_head_dim < c->rope_dim)
        return E("index_head_dim %d is smaller than qk_rope_head_dim %d", c->index_head_dim, c->rope_dim);
    if (c->n_heads % c->o_groups)
        return E("num_attention_heads %d is not a multiple of o_groups %d", c->n_heads, c->o_groups);
    if (c->n_heads % c->n_kv_heads)
        return E("num_attention_heads %d is not a multiple of num_key_value_heads %d", c->n_heads,
                 c->n_kv_heads);
    if (c->top_k > c->n_experts)
        return E("num_experts_per_tok %d exceeds n_routed_experts %d", c->top_k, c->n_experts);
    if (c->bos_id >= c->vocab_size) return E("bos_token_id %d is outside the vocabulary", c->bos_id);
    if (c->eos_id >= c->vocab_size) return E("eos_token_id %d is outside the vocabulary", c->eos_id);
    if (c->bos_id < -1 || c->eos_id < -1) return E("bos_token_id / eos_token_id must be >= 0");
    if (!(c->rms_eps > 0)) return E("rms_norm_eps must be > 0");
    if (!(c->hc_eps > 0)) return E("hc_eps must be > 0");
    if (!(c->route_scale > 0)) return E("routed_scaling_factor must be > 0");
    if (c->swiglu_limit < 0) return E("swiglu_limit must be >= 0 (0 = no clamp)");
    if (!(c->rope_theta > 0)) return E("rope_theta must be > 0");
    if (!(c->compress_rope_theta > 0)) return E("compress_rope_theta must be > 0");
    return 0;
}

int md_config_parse(const char *json_text, size_t len, md_config *out, rc_err *err) {
    json_error_t je;
    json_t *root = json_loadb(json_text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return rc_errf(err, RC_EINVAL, "config: not valid JSON: %s (line %d, column %d)", je.text,
                       je.line, je.column);
    int rc = parse_root(root, out, err);
    json_decref(root);
    return rc;
}

int md_config_load(const char *path, md_config *out, rc_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root && json_error_code(&je) == json_error_cannot_open_file)
        return rc_errf(err, RC_EIO, "%s: %s", path, je.text);
    if (!root)
        return rc_errf(err, RC_EINVAL, "%s: not valid JSON: %s (line %d, column %d)", path, je.text,
                       je.line, je.column);
    rc_err e = {0};
    int rc = parse_root(root, out, &e);
    json_decref(root);
    if (rc) {
        /* "config: msg" -> "PATH: msg" */
        const char *m = strncmp(e.msg, "config: ", 8) == 0 ? e.msg + 8 : e.msg;
        rc_errf(err, rc, "%s: %s", path, m);
    }
    return rc;
}
