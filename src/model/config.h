/* config.h - config.json of a DeepSeek V4 checkpoint (model_type deepseek_v4).
 *
 * Accepts the released (legacy) keys and the transformers 5.17 keys, folded
 * the way DeepseekV4Config folds them (model-v4.md §2.4), with one deliberate
 * difference: a config without a layer schedule (neither layer_types nor
 * compress_ratios) is an error instead of silently getting the V4-Pro
 * schedule.  Every value is validated; a failure names the key. */
#ifndef MODEL_CONFIG_H
#define MODEL_CONFIG_H

#include <stddef.h>

#include "base/err.h"

#define MD_MAX_LAYERS 256

enum { MD_SCORE_SQRTSOFTPLUS = 0, MD_SCORE_SIGMOID = 1, MD_SCORE_SOFTMAX = 2 };

typedef struct {
    int vocab_size, hidden_size, moe_inter, n_layers, n_heads, n_kv_heads, head_dim;
    int rope_dim; /* qk_rope_head_dim */
    int q_lora_rank, o_groups, o_lora_rank;
    int n_experts, n_shared, top_k, n_hash_layers;
    int norm_topk;
    float route_scale, swiglu_limit;
    int score_func; /* MD_SCORE_*: 0 sqrtsoftplus, 1 sigmoid, 2 softmax */
    int window;     /* sliding_window */
    int index_heads, index_head_dim, index_topk;
    int hc_mult, hc_iters;
    float hc_eps, rms_eps;
    double rope_theta, compress_rope_theta;
    /* YaRN, applied to the compressed layers' RoPE only; yarn = 0 => plain RoPE */
    int yarn;
    double yarn_factor, yarn_orig_max, yarn_beta_fast, yarn_beta_slow;
    int csa_ratio, hca_ratio;   /* default 4 / 128 */
    int ratio[MD_MAX_LAYERS];   /* per layer: 0 (SWA), csa_ratio or hca_ratio */
    int hash[MD_MAX_LAYERS];    /* per layer: 1 = hash_moe */
    int bos_id, eos_id;         /* -1 when null; eos: the first of a list */
    int tie_embeddings;
    int fp8_block; /* quantization_config.weight_block_size[0], or 0 (dense checkpoint) */
    int n_mtp;     /* num_nextn_predict_layers */
} md_config;

int md_config_load(const char *path_to_config_json, md_config *out, rc_err *err);
int md_config_parse(const char *json_text, size_t len, md_config *out, rc_err *err);

#endif
