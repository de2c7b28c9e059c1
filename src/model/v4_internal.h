/* v4_internal.h - the model's private layout, shared by v4_load.c (weights)
 * and v4.c (state and forward pass). */
#ifndef MODEL_V4_INTERNAL_H
#define MODEL_V4_INTERNAL_H

#include "model/safetensors.h"
#include "model/v4.h"

typedef struct md_host_dev md_host_dev;

typedef struct md_layer {
    int ratio;   /* 0 SWA, csa_ratio (overlapping compressor + indexer), hca_ratio */
    int overlap; /* ratio == csa_ratio: two half-channels, 2*ratio slots per entry */
    int hash;

    /* mHC, both sites: fn [(2+n)n, nD], base [(2+n)n], scale [3]; all f32 */
    float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
    float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
    float *attn_norm, *ffn_norm;

    /* attention */
    be_weight wq_a, wq_b, wkv, wo_a, wo_b;
    float *q_norm, *kv_norm, *attn_sink;

    /* compressor (ratio > 0): wkv/wgate [c*d, D], ape [ratio, c*d], norm [d] */
    be_weight c_wkv, c_wgate;
    float *c_ape, *c_norm;

    /* indexer (CSA): wq_b [IH*ID, q_l], weights_proj [IH, D], own compressor */
    be_weight i_wq_b, i_wproj, i_wkv, i_wgate;
    float *i_ape, *i_norm;

    /* MoE */
    be_weight gate;
    float *gate_bias;   /* NULL on hash layers */
    int32_t *tid2eid;   /* [vocab, top_k] on hash layers */
    be_weight *w1, *w2, *w3; /* [n_experts] */
    be_weight sw1, sw2, sw3;
    /* the routed experts' weight formats, for act_quant under official semantics (v4.c moe_act), found once at
     * load: some w1 / w3 is FP8 / FP4; every w1 and w3 agree (q_in) and every w2 (q_out) */
    int moe_q_any, moe_q_uniform, moe_q_in, moe_q_out;
} md_layer;

/* FP8 / FP4: a weight whose GEMM the official linear() feeds act_quant'd input */
static inline int md_w_quantised(const be_weight *w) { return w->fmt == BE_W_FP8 || w->fmt == BE_W_FP4; }

struct md_model {
    md_config cfg;
    md_semantics sem;
    be_backend *be;
    md_ckpt *ck;
    be_weight embed, head;
    float *norm;
    float *hc_head_fn, *hc_head_base, *hc_head_scale;
    md_layer *layers;
    /* RoPE inverse frequencies: [rope_dim/2] for SWA layers and for compressed layers */
    float *inv_freq_main, *inv_freq_comp;
    /* every f32 copy made at load, freed at the end */
    void **owned;
    size_t n_owned, cap_owned;
    uint64_t n_params;
    /* KV block geometry (MD_BLOCK_TOKENS tokens of every layer's entries):
     * blk_off[2l] / blk_off[2l+1] = float offset of layer l's compressed
     * entries / indexer keys inside a block, blk_epb[l] = entries per block */
    size_t blk_floats;
    size_t *blk_off;
    int *blk_epb;
    md_block_alloc balloc;
    md_layer_hook hook;
    void *hook_arg;
    md_host_dev *hostdev; /* md_model_set_host_dev_graph */
    uint64_t st_state_now, st_state_late; /* md_model_state_stats */
};

int md_load_weights(md_model *m, md_progress_fn progress, void *progress_arg, rc_err *err);
void md_free_weights(md_model *m);

#endif
