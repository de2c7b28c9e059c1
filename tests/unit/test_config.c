/* test_config.c - config.json for deepseek_v4.
 *
 * The released V4-Flash config (spec model-v4.md §2.1, written out in
 * tests/fixtures/config/v4-flash.json) must give the schedule the spec states
 * in words; the same model in transformers' keys (v4-flash-hf.json) must give
 * the identical md_config; each invalid value must fail naming its key.
 * Variants are made by editing the fixture with jansson. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

static json_t *fixture(const char *name) {
    char path[1024];
    json_error_t je;
    snprintf(path, sizeof path, "%s/%s", CONFIG_FIXTURE_DIR, name);
    json_t *j = json_load_file(path, 0, &je);
    if (!j) fail_msg("%s: %s", path, je.text);
    return j;
}

static int parse_json(const json_t *j, md_config *c, rc_err *err) {
    char *s = json_dumps(j, JSON_COMPACT);
    int rc = md_config_parse(s, strlen(s), c, err);
    free(s);
    return rc;
}

static void must_parse(const json_t *j, md_config *c) {
    rc_err err = {0};
    if (parse_json(j, c, &err)) fail_msg("parse failed: %s", err.msg);
}

static void check_v4_flash(const md_config *c) {
    assert_int_equal(c->vocab_size, 129280);
    assert_int_equal(c->hidden_size, 4096);
    assert_int_equal(c->moe_inter, 2048);
    assert_int_equal(c->n_layers, 43);
    assert_int_equal(c->n_heads, 64);
    assert_int_equal(c->n_kv_heads, 1);
    assert_int_equal(c->head_dim, 512);
    assert_int_equal(c->rope_dim, 64);
    assert_int_equal(c->q_lora_rank, 1024);
    assert_int_equal(c->o_groups, 8);
    assert_int_equal(c->o_lora_rank, 1024);
    assert_int_equal(c->n_experts, 256);
    assert_int_equal(c->n_shared, 1);
    assert_int_equal(c->top_k, 6);
    assert_int_equal(c->n_hash_layers, 3);
    assert_int_equal(c->norm_topk, 1);
    assert_true(c->route_scale == 1.5f && c->swiglu_limit == 10.0f);
    assert_int_equal(c->score_func, MD_SCORE_SQRTSOFTPLUS);
    assert_int_equal(c->window, 128);
    assert_int_equal(c->index_heads, 64);
    assert_int_equal(c->index_head_dim, 128);
    assert_int_equal(c->index_topk, 512);
    assert_int_equal(c->hc_mult, 4);
    assert_int_equal(c->hc_iters, 20);
    assert_true(c->hc_eps == 1e-6f && c->rms_eps == 1e-6f);
    assert_true(c->rope_theta == 10000.0 && c->compress_rope_theta == 160000.0);
    assert_int_equal(c->yarn, 1);
    assert_true(c->yarn_factor == 16.0 && c->yarn_orig_max == 65536.0);
    assert_true(c->yarn_beta_fast == 32.0 && c->yarn_beta_slow == 1.0);
    assert_int_equal(c->csa_ratio, 4);
    assert_int_equal(c->hca_ratio, 128);
    /* spec §2.1: layers 0-1 SWA, even 2..42 CSA (21), odd 3..41 HCA (20) */
    int swa = 0, csa = 0, hca = 0;
    for (int l = 0; l < 43; l++) {
        int want = l < 2 ? 0 : l % 2 == 0 ? 4 : 128;
        if (c->ratio[l] != want) fail_msg("layer %d: ratio %d, want %d", l, c->ratio[l], want);
        swa += want == 0, csa += want == 4, hca += want == 128;
        assert_int_equal(c->hash[l], l < 3);
    }
    assert_int_equal(swa, 2);
    assert_int_equal(csa, 21);
    assert_int_equal(hca, 20);
    assert_int_equal(c->ratio[43], 0); /* the MTP entry is dropped */
    assert_int_equal(c->bos_id, 0);
    assert_int_equal(c->eos_id, 1);
    assert_int_equal(c->tie_embeddings, 0);
    assert_int_equal(c->fp8_block, 128);
    assert_int_equal(c->n_mtp, 1);
}

static void test_v4_flash(void **state) {
    md_config c;
    rc_err err = {0};
    char path[1024];
    snprintf(path, sizeof path, "%s/v4-flash.json", CONFIG_FIXTURE_DIR);
    if (md_config_load(path, &c, &err)) fail_msg("%s", err.msg);
    check_v4_flash(&c);
}

static void test_modern_keys_equivalent(void **state) {
    json_t *legacy = fixture("v4-flash.json"), *hf = fixture("v4-flash-hf.json");
    md_config a, b;
    must_parse(legacy, &a);
    must_parse(hf, &b);
    check_v4_flash(&b);
    assert_memory_equal(&a, &b, sizeof a);

    /* flat rope_parameters (yarn keys for the compressed RoPE) == rope_scaling */
    json_t *flat = json_deep_copy(legacy);
    json_t *rs = json_object_get(flat, "rope_scaling");
    json_object_set(flat, "rope_parameters", rs);
    json_object_del(flat, "rope_scaling");
    json_object_set_new(json_object_get(flat, "rope_parameters"), "rope_theta", json_real(999.0));
    must_parse(flat, &b);
    assert_memory_equal(&a, &b, sizeof a); /* a flat rope_theta does not touch either theta */

    /* legacy scalar rates, and rope dim from partial_rotary_factor */
    json_t *v = json_deep_copy(legacy);
    json_object_set_new(v, "compress_rate_csa", json_integer(4));
    json_object_set_new(v, "compress_rate_hca", json_integer(128));
    json_object_del(v, "qk_rope_head_dim");
    json_object_set_new(v, "partial_rotary_factor", json_real(0.125));
    must_parse(v, &b);
    assert_memory_equal(&a, &b, sizeof a);
    json_object_del(v, "partial_rotary_factor"); /* default head_dim / 8 */
    must_parse(v, &b);
    assert_memory_equal(&a, &b, sizeof a);
    /* the legacy list names layer types; their rates come from the rate keys */
    json_object_set_new(v, "compress_rate_csa", json_integer(8));
    must_parse(v, &b);
    assert_int_equal(b.ratio[1], 0);
    assert_int_equal(b.ratio[2], 8);
    assert_int_equal(b.ratio[3], 128);
    json_decref(v);

    /* precedence: layer_types over compress_ratios; compress_rates override 4/128 */
    v = json_deep_copy(hf);
    json_object_set_new(v, "compress_ratios", json_pack("[i,i,i]", 4, 4, 4));
    json_object_set_new(v, "compress_rates", json_pack("{s:i,s:i}", "compressed_sparse_attention", 8,
                                                       "heavily_compressed_attention", 64));
    json_object_set_new(v, "compress_rate_hca", json_integer(256)); /* legacy scalar wins */
    must_parse(v, &b);
    assert_int_equal(b.csa_ratio, 8);
    assert_int_equal(b.hca_ratio, 256);
    assert_int_equal(b.ratio[0], 0);
    assert_int_equal(b.ratio[2], 8);
    assert_int_equal(b.ratio[3], 256);
    /* nested thetas override the top-level ones */
    json_t *rp = json_object_get(v, "rope_parameters");
    json_object_set_new(json_object_get(rp, "main"), "rope_theta", json_real(12345.0));
    json_object_set_new(json_object_get(rp, "compress"), "rope_theta", json_integer(54321));
    json_object_set_new(v, "rope_theta", json_real(1.0));
    json_object_set_new(v, "compress_rope_theta", json_real(2.0));
    json_object_del(json_object_get(rp, "compress"), "beta_fast");
    must_parse(v, &b);
    assert_true(b.rope_theta == 12345.0 && b.compress_rope_theta == 54321.0);
    assert_true(b.yarn_beta_fast == 32.0); /* default */
    /* mlp_layer_types over num_hash_layers */
    json_object_set_new(v, "num_hash_layers", json_integer(7));
    json_t *mt = json_object_get(v, "mlp_layer_types");
    json_array_set_new(mt, 1, json_string("moe"));
    json_array_set_new(mt, 5, json_string("hash_moe"));
    must_parse(v, &b);
    assert_int_equal(b.n_hash_layers, 3);
    assert_int_equal(b.hash[0] + 2 * b.hash[1] + 4 * b.hash[2] + 8 * b.hash[5], 1 + 4 + 8);
    /* compress rope without yarn */
    json_object_set_new(json_object_get(rp, "compress"), "rope_type", json_string("default"));
    must_parse(v, &b);
    assert_int_equal(b.yarn, 0);
    json_decref(v);
    json_decref(flat);
    json_decref(legacy);
    json_decref(hf);
}

/* spec §9.3's tiny test model, as a test would write it */
static void test_tiny(void **state) {
    const char *s =
        "{\"model_type\": \"deepseek_v4\", \"vocab_size\": 512, \"hidden_size\": 128, \"num_hidden_layers\": 5,"
        " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 128, \"qk_rope_head_dim\": 64,"
        " \"q_lora_rank\": 64, \"o_groups\": 2, \"o_lora_rank\": 32, \"moe_intermediate_size\": 64,"
        " \"n_routed_experts\": 8, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"num_hash_layers\": 1,"
        " \"compress_ratios\": [0, 4, 128, 4, 128], \"sliding_window\": 16, \"index_n_heads\": 4,"
        " \"index_head_dim\": 128, \"index_topk\": 8, \"num_nextn_predict_layers\": 0, \"eos_token_id\": [1, 2],"
        " \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536,"
        " \"beta_fast\": 32, \"beta_slow\": 1}}";
    md_config c;
    rc_err err = {0};
    if (md_config_parse(s, strlen(s), &c, &err)) fail_msg("%s", err.msg);
    static const int ratio[5] = {0, 4, 128, 4, 128};
    for (int l = 0; l < 5; l++) {
        assert_int_equal(c.ratio[l], ratio[l]);
        assert_int_equal(c.hash[l], l == 0);
    }
    assert_int_equal(c.n_layers, 5);
    assert_int_equal(c.rope_dim, 64);
    assert_int_equal(c.window, 16);
    assert_int_equal(c.n_mtp, 0);
    assert_int_equal(c.fp8_block, 0);
    assert_int_equal(c.eos_id, 1);
    assert_int_equal(c.yarn, 1);
    assert_true(c.yarn_factor == 16.0 && c.yarn_orig_max == 65536.0);
    assert_true(c.rope_theta == 10000.0 && c.compress_rope_theta == 160000.0); /* defaults */
}

/* Edit the legacy fixture with one change; parsing must fail with code and
 * a message containing frag. */
static void expect_fail(const char *what, json_t *j, int code, const char *frag) {
    md_config c;
    rc_err err = {0};
    int rc = parse_json(j, &c, &err);
    if (rc == 0) fail_msg("%s: parsed, expected an error about %s", what, frag);
    if (rc != code) fail_msg("%s: code %d, want %d (%s)", what, rc, code, err.msg);
    if (!strstr(err.msg, frag)) fail_msg("%s: error \"%s\" does not mention \"%s\"", what, err.msg, frag);
    json_decref(j);
}

#define EDIT(key, value, code, frag)                                                               \
    do {                                                                                           \
        json_t *j_ = json_deep_copy(base), *v_ = (value);                                          \
        if (v_)                                                                                    \
            json_object_set_new(j_, key, v_);                                                      \
        else                                                                                       \
            json_object_del(j_, key);                                                              \
        expect_fail(key, j_, code, frag);                                                          \
    } while (0)

static void test_errors(void **state) {
    json_t *base = fixture("v4-flash.json"), *nul = NULL;
    EDIT("model_type", json_string("deepseek_v41"), RC_EUNSUP, "'deepseek_v41' is not supported yet");
    EDIT("model_type", json_string("deepseek_v3"), RC_EUNSUP, "'deepseek_v3' is not supported yet");
    EDIT("model_type", nul, RC_EINVAL, "model_type is missing");
    EDIT("model_type", json_integer(4), RC_EINVAL, "model_type must be a string");
    EDIT("compress_ratios", nul, RC_EINVAL, "layer_types or compress_ratios is required");
    EDIT("compress_ratios", json_pack("[i,i,i]", 0, 4, 128), RC_EINVAL, "compress_ratios has 3 entries");
    json_t *cr = json_deep_copy(json_object_get(base, "compress_ratios"));
    json_array_set_new(cr, 3, json_integer(5));
    EDIT("compress_ratios", cr, RC_EINVAL, "compress_ratios[3] is 5");
    cr = json_deep_copy(json_object_get(base, "compress_ratios"));
    json_array_set_new(cr, 43, json_integer(64)); /* the MTP entry is validated too */
    EDIT("compress_ratios", cr, RC_EINVAL, "compress_ratios[43] is 64");
    EDIT("layer_types", json_pack("[s]", "full_attention"), RC_EINVAL, "layer_types has 1 entries");
    json_t *lt = json_array();
    for (int i = 0; i < 43; i++) json_array_append_new(lt, json_string(i == 7 ? "full_attention" : "sliding_attention"));
    EDIT("layer_types", lt, RC_EINVAL, "layer_types[7] must be one of");
    EDIT("compress_rates", json_pack("{s:i}", "csa", 4), RC_EINVAL, "compress_rates: unknown key 'csa'");
    EDIT("compress_rate_csa", json_integer(0), RC_EINVAL, "compressed_sparse_attention rate must be > 0");
    EDIT("mlp_layer_types", json_pack("[s,s]", "moe", "moe"), RC_EINVAL, "mlp_layer_types has 2 entries");
    EDIT("num_hash_layers", json_integer(-1), RC_EINVAL, "num_hash_layers must be >= 0");
    EDIT("hidden_size", json_integer(0), RC_EINVAL, "hidden_size must be > 0");
    EDIT("vocab_size", json_string("big"), RC_EINVAL, "vocab_size must be an integer");
    EDIT("moe_intermediate_size", json_real(2048.5), RC_EINVAL, "moe_intermediate_size must be an integer");
    EDIT("num_attention_heads", json_integer(60), RC_EINVAL, "num_attention_heads 60 is not a multiple of o_groups 8");
    EDIT("head_dim", json_integer(511), RC_EINVAL, "head_dim must be even");
    EDIT("head_dim", json_integer(32), RC_EINVAL, "qk_rope_head_dim 64 exceeds head_dim 32");
    EDIT("qk_rope_head_dim", json_integer(63), RC_EINVAL, "qk_rope_head_dim must be even");
    EDIT("qk_rope_head_dim", json_integer(0), RC_EINVAL, "qk_rope_head_dim must be even and > 0");
    EDIT("partial_rotary_factor", json_real(0.25), RC_EINVAL, "qk_rope_head_dim 64 disagrees");
    EDIT("index_head_dim", json_integer(32), RC_EINVAL, "index_head_dim 32 is smaller than qk_rope_head_dim 64");
    EDIT("num_experts_per_tok", json_integer(300), RC_EINVAL, "num_experts_per_tok 300 exceeds n_routed_experts 256");
    EDIT("num_hidden_layers", json_integer(300), RC_EINVAL, "num_hidden_layers 300 exceeds the limit of 256");
    EDIT("num_hidden_layers", json_integer(-3), RC_EINVAL, "num_hidden_layers must be > 0");
    EDIT("num_hidden_layers", json_integer(1LL << 40), RC_EINVAL, "num_hidden_layers: 1099511627776 is out of range");
    EDIT("hidden_act", json_string("gelu"), RC_EUNSUP, "hidden_act 'gelu' is not supported");
    EDIT("scoring_func", json_string("relu"), RC_EINVAL, "scoring_func 'relu'");
    EDIT("norm_topk_prob", json_string("yes"), RC_EINVAL, "norm_topk_prob must be true or false");
    EDIT("rms_norm_eps", json_integer(0), RC_EINVAL, "rms_norm_eps must be > 0");
    EDIT("rope_theta", json_string("1e4"), RC_EINVAL, "rope_theta must be a number");
    EDIT("eos_token_id", json_integer(200000), RC_EINVAL, "eos_token_id 200000 is outside the vocabulary");
    EDIT("rope_scaling", json_pack("{s:s,s:f}", "type", "linear", "factor", 2.0), RC_EUNSUP,
         "rope_scaling: rope type 'linear' is not supported");
    EDIT("rope_scaling", json_pack("{s:s}", "type", "yarn"), RC_EINVAL, "rope_scaling.factor is required");
    EDIT("rope_scaling", json_integer(1), RC_EINVAL, "rope_scaling must be an object");
    EDIT("rope_parameters", json_pack("{s:{}}", "main"), RC_EINVAL, "main and compress must both be objects");
    EDIT("quantization_config", json_pack("{s:s,s:[i,i]}", "quant_method", "fp8", "weight_block_size", 128, 64),
         RC_EUNSUP, "weight_block_size [128, 64]");
    EDIT("quantization_config", json_pack("{s:s}", "quant_method", "awq"), RC_EUNSUP, "quant_method 'awq'");
    json_decref(base);

    md_config c;
    rc_err err = {0};
    assert_int_equal(md_config_parse("{\"model_type\": ", 15, &c, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "not valid JSON"));
    assert_int_equal(md_config_parse("[1]", 3, &c, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "not a JSON object"));
    assert_int_equal(md_config_load("/nonexistent/config.json", &c, &err), RC_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/config.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v4_flash),
        cmocka_unit_test(test_modern_keys_equivalent),
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
