/* cmd_make_model.c - `deepinfer make-tiny-model DIR`: a DeepSeek V4
 * architecture checkpoint with deterministic random weights.
 *
 * It exists so that `make run` serves something with no download, and so the
 * benchmarks have models of known size.  The answers of such a model are
 * noise.  Weights are bf16 under the official tensor names, small vectors f32;
 * the same --preset and --seed always give the same bytes.  The bundled V4
 * tokenizer is copied next to the weights. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "model/dtype.h"

typedef struct {
    const char *name;
    int vocab, hidden, layers, heads, head_dim, rope_dim, q_lora, o_groups, o_lora;
    int experts, top_k, inter, hash_layers, window, index_heads, index_head_dim, index_topk;
    const int *ratios;
    int max_layers; /* entries of ratios */
    int quant;      /* 1: the V4-Flash release formats (FP8 attention / shared expert, FP4 routed experts) */
} preset;

static const int ratios_tiny[] = {0, 4, 128, 4};
static const int ratios_100m[] = {0, 0, 4, 128, 4, 128, 4, 128};
/* DeepSeek-V4-Flash's 43 layers: 2 SWA, then CSA (4) and HCA (128) alternating (model-v4.md §2.1) */
static const int ratios_flash[] = {0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                                   4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4};

static const preset presets[] = {
    {"tiny", 129280, 128, 4, 4, 128, 64, 64, 2, 32, 8, 2, 64, 1, 128, 8, 64, 16, ratios_tiny, 4, 0},
    {"100m", 129280, 256, 8, 8, 256, 64, 256, 4, 128, 16, 4, 512, 2, 128, 8, 64, 64, ratios_100m, 8, 0},
    {"v4-flash", 129280, 4096, 4, 64, 512, 64, 1024, 8, 1024, 256, 6, 2048, 3, 128, 64, 128, 512, ratios_flash, 43, 1},
};

/* G_FP8: random e4m3 codes with exponent field 0..7 (|v| <= 1.875, never NaN); G_FP4: random packed e2m1
 * bytes; G_BYTE: every byte = a (a ue8m0 scale).  The three are written as raw bytes. */
typedef enum { G_UNIFORM, G_ONES_JITTER, G_CONST, G_TID2EID, G_FP8, G_FP4, G_BYTE } gen_kind;

typedef struct {
    char name[128];
    md_dtype dtype;
    int ndim;
    int64_t shape[2];
    gen_kind kind;
    float a; /* uniform half-width, or jitter, or constant */
    uint64_t off, nbytes;
} tspec;

typedef struct {
    tspec *v;
    size_t n, cap;
} tlist;

static void add(tlist *l, md_dtype dt, gen_kind k, float a, int64_t r, int64_t c, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static void add(tlist *l, md_dtype dt, gen_kind k, float a, int64_t r, int64_t c, const char *fmt, ...)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
    }
    tspec *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dt;
    t->kind = k;
    t->a = a;
    t->ndim = c ? 2 : 1;
    t->shape[0] = r;
    t->shape[1] = c;
    t->nbytes = (uint64_t)r * (uint64_t)(c ? c : 1) * md_dtype_size(dt);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float unif(uint64_t *s) { return (float)((double)(splitmix(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* The ue8m0 byte of the power of two nearest to 1 / (rms * sqrt(fan_in)): quantized weights whose codes have
 * root-mean-square rms get about the std of the bf16 weights, 1 / sqrt(fan_in). */
static float scale_byte(double rms, int64_t fan_in) { return (float)(127 + lround(-log2(rms * sqrt((double)fan_in)))); }

/* FP8 e4m3 [r, c] with 128 x 128 ue8m0 block scales, the way V4-Flash stores attention and shared experts.
 * The codes of G_FP8 have rms ~0.52. */
static void add_fp8(tlist *l, int64_t r, int64_t c, const char *name)
{
    add(l, MD_F8_E4M3, G_FP8, 0, r, c, "%s.weight", name);
    add(l, MD_F8_E8M0, G_BYTE, scale_byte(0.52, c), (r + 127) / 128, (c + 127) / 128, "%s.scale", name);
}

/* FP4 e2m1 [r, c] packed two per byte in I8 [r, c/2], ue8m0 scales [r, c/32] (routed experts).  Uniform
 * random codes have rms sqrt(68.5/8) ~ 2.93. */
static void add_fp4(tlist *l, int64_t r, int64_t c, const char *name)
{
    add(l, MD_I8, G_FP4, 0, r, c / 2, "%s.weight", name);
    add(l, MD_F8_E8M0, G_BYTE, scale_byte(2.93, c), r, c / 32, "%s.scale", name);
}

static void build(tlist *l, const preset *p)
{
    const int D = p->hidden, n = 4, mix = (2 + n) * n, H = p->heads, d = p->head_dim;
    const float lin = 1.7320508f; /* uniform(-a, a) has std a/sqrt(3): a = sqrt(3/fan_in) */
    char nm[128];
#define W(r, c, ...) add(l, MD_BF16, G_UNIFORM, lin / sqrtf((float)(c)), r, c, __VA_ARGS__)
    /* FP8 in a quantized preset, else bf16 */
#define WQ(r, c, ...)                                                                                                  \
    do {                                                                                                               \
        snprintf(nm, sizeof nm, __VA_ARGS__);                                                                          \
        if (p->quant)                                                                                                  \
            add_fp8(l, r, c, nm);                                                                                      \
        else                                                                                                           \
            W(r, c, "%s.weight", nm);                                                                                  \
    } while (0)
    add(l, MD_BF16, G_UNIFORM, 1.0f, p->vocab, D, "embed.weight");
    W(p->vocab, D, "head.weight");
    add(l, MD_BF16, G_ONES_JITTER, 0.1f, D, 0, "norm.weight");
    add(l, MD_F32, G_UNIFORM, 0.05f, n, (int64_t)n * D, "hc_head_fn");
    add(l, MD_F32, G_UNIFORM, 0.5f, n, 0, "hc_head_base");
    add(l, MD_F32, G_ONES_JITTER, 0.1f, 1, 0, "hc_head_scale");
    for (int L = 0; L < p->layers; L++) {
        int r = p->ratios[L], ov = r == 4, cd = (ov ? 2 : 1) * d;
        add(l, MD_F32, G_UNIFORM, 0.05f, mix, (int64_t)n * D, "layers.%d.hc_attn_fn", L);
        add(l, MD_F32, G_UNIFORM, 0.5f, mix, 0, "layers.%d.hc_attn_base", L);
        add(l, MD_F32, G_ONES_JITTER, 0.1f, 3, 0, "layers.%d.hc_attn_scale", L);
        add(l, MD_F32, G_UNIFORM, 0.05f, mix, (int64_t)n * D, "layers.%d.hc_ffn_fn", L);
        add(l, MD_F32, G_UNIFORM, 0.5f, mix, 0, "layers.%d.hc_ffn_base", L);
        add(l, MD_F32, G_ONES_JITTER, 0.1f, 3, 0, "layers.%d.hc_ffn_scale", L);
        add(l, MD_BF16, G_ONES_JITTER, 0.1f, D, 0, "layers.%d.attn_norm.weight", L);
        add(l, MD_BF16, G_ONES_JITTER, 0.1f, D, 0, "layers.%d.ffn_norm.weight", L);
        WQ(p->q_lora, D, "layers.%d.attn.wq_a", L);
        add(l, MD_BF16, G_ONES_JITTER, 0.1f, p->q_lora, 0, "layers.%d.attn.q_norm.weight", L);
        WQ((int64_t)H * d, p->q_lora, "layers.%d.attn.wq_b", L);
        WQ(d, D, "layers.%d.attn.wkv", L);
        add(l, MD_BF16, G_ONES_JITTER, 0.1f, d, 0, "layers.%d.attn.kv_norm.weight", L);
        WQ((int64_t)p->o_groups * p->o_lora, (int64_t)H * d / p->o_groups, "layers.%d.attn.wo_a", L);
        WQ(D, (int64_t)p->o_groups * p->o_lora, "layers.%d.attn.wo_b", L);
        add(l, MD_F32, G_UNIFORM, 1.0f, H, 0, "layers.%d.attn.attn_sink", L);
        if (r) {
            W(cd, D, "layers.%d.attn.compressor.wkv.weight", L);
            W(cd, D, "layers.%d.attn.compressor.wgate.weight", L);
            add(l, MD_F32, G_UNIFORM, 0.5f, r, cd, "layers.%d.attn.compressor.ape", L);
            add(l, MD_BF16, G_ONES_JITTER, 0.1f, d, 0, "layers.%d.attn.compressor.norm.weight", L);
        }
        if (ov) {
            const int IH = p->index_heads, ID = p->index_head_dim;
            WQ((int64_t)IH * ID, p->q_lora, "layers.%d.attn.indexer.wq_b", L);
            W(IH, D, "layers.%d.attn.indexer.weights_proj.weight", L);
            W(2 * ID, D, "layers.%d.attn.indexer.compressor.wkv.weight", L);
            W(2 * ID, D, "layers.%d.attn.indexer.compressor.wgate.weight", L);
            add(l, MD_F32, G_UNIFORM, 0.5f, r, 2 * ID, "layers.%d.attn.indexer.compressor.ape", L);
            add(l, MD_BF16, G_ONES_JITTER, 0.1f, ID, 0, "layers.%d.attn.indexer.compressor.norm.weight", L);
        }
        W(p->experts, D, "layers.%d.ffn.gate.weight", L);
        if (L < p->hash_layers)
            add(l, MD_I32, G_TID2EID, (float)p->experts, p->vocab, p->top_k, "layers.%d.ffn.gate.tid2eid", L);
        else
            add(l, MD_F32, G_UNIFORM, 0.1f, p->experts, 0, "layers.%d.ffn.gate.bias", L);
        for (int e = 0; e < p->experts; e++) {
            if (p->quant) {
                for (int k = 1; k <= 3; k++) {
                    snprintf(nm, sizeof nm, "layers.%d.ffn.experts.%d.w%d", L, e, k);
                    add_fp4(l, k == 2 ? D : p->inter, k == 2 ? p->inter : D, nm);
                }
                continue;
            }
            W(p->inter, D, "layers.%d.ffn.experts.%d.w1.weight", L, e);
            W(D, p->inter, "layers.%d.ffn.experts.%d.w2.weight", L, e);
            W(p->inter, D, "layers.%d.ffn.experts.%d.w3.weight", L, e);
        }
        WQ(p->inter, D, "layers.%d.ffn.shared_experts.w1", L);
        WQ(D, p->inter, "layers.%d.ffn.shared_experts.w2", L);
        WQ(p->inter, D, "layers.%d.ffn.shared_experts.w3", L);
    }
#undef W
#undef WQ
}

static int write_config(const char *dir, const preset *p)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f,
            "{\n  \"architectures\": [\"DeepseekV4ForCausalLM\"],\n  \"model_type\": \"deepseek_v4\",\n"
            "  \"_comment\": \"random weights made by deepinfer make-tiny-model --preset %s; its answers are noise\",\n"
            "  \"vocab_size\": %d, \"hidden_size\": %d, \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d, \"num_key_value_heads\": 1, \"head_dim\": %d, \"qk_rope_head_dim\": %d,\n"
            "  \"q_lora_rank\": %d, \"o_groups\": %d, \"o_lora_rank\": %d,\n"
            "  \"n_routed_experts\": %d, \"n_shared_experts\": 1, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,\n"
            "  \"num_hash_layers\": %d, \"scoring_func\": \"sqrtsoftplus\", \"norm_topk_prob\": true,\n"
            "  \"routed_scaling_factor\": 1.5, \"swiglu_limit\": 10.0, \"sliding_window\": %d,\n"
            "  \"index_n_heads\": %d, \"index_head_dim\": %d, \"index_topk\": %d,\n"
            "  \"hc_mult\": 4, \"hc_sinkhorn_iters\": 20, \"hc_eps\": 1e-06, \"rms_norm_eps\": 1e-06,\n"
            "  \"rope_theta\": 10000, \"compress_rope_theta\": 160000,\n"
            "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 16, \"original_max_position_embeddings\": 65536, \"beta_fast\": 32, \"beta_slow\": 1},\n"
            "  \"max_position_embeddings\": 1048576, \"bos_token_id\": 0, \"eos_token_id\": 1,\n"
            "  \"tie_word_embeddings\": false, \"num_nextn_predict_layers\": 0, \"torch_dtype\": \"bfloat16\",\n"
            "%s"
            "  \"compress_ratios\": [",
            p->name, p->vocab, p->hidden, p->layers, p->heads, p->head_dim, p->rope_dim, p->q_lora, p->o_groups,
            p->o_lora, p->experts, p->top_k, p->inter, p->hash_layers, p->window, p->index_heads, p->index_head_dim,
            p->index_topk,
            p->quant ? "  \"expert_dtype\": \"fp4\",\n  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": "
                       "\"e4m3\", \"scale_fmt\": \"ue8m0\", \"activation_scheme\": \"dynamic\", "
                       "\"weight_block_size\": [128, 128]},\n"
                     : "");
    for (int i = 0; i < p->layers; i++) fprintf(f, "%s%d", i ? ", " : "", p->ratios[i]);
    fprintf(f, "]\n}\n");
    return fclose(f);
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    if (!a || !b) {
        if (a) fclose(a);
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) break;
    fclose(a);
    return fclose(b);
}

static const char help[] =
    "usage: deepinfer make-tiny-model DIR [--preset tiny|100m|v4-flash] [--layers N] [--seed N]\n\n"
    "Write a DeepSeek V4 architecture checkpoint with deterministic random weights into DIR\n"
    "(config.json, model.safetensors, tokenizer.json).  Its answers are noise: it exists so the\n"
    "server runs with no download and so benchmarks have a model of known size.  For real answers\n"
    "point --model at an official checkpoint (deepseek-ai/DeepSeek-V4-Flash).\n\n"
    "  --preset tiny   4 layers (SWA, CSA, HCA, CSA), hidden 128, real V4 vocabulary (~36M params, 70 MB)\n"
    "  --preset 100m   8 layers, hidden 256, 16 experts (~110M params, 220 MB)\n"
    "  --preset v4-flash\n"
    "                  a V4-Flash slice: the real dimensions (hidden 4096, 64 heads x 512, 256 experts x 2048,\n"
    "                  index 64 x 128, top-512) and formats (FP8 e4m3 attention and shared expert with 128x128\n"
    "                  ue8m0 scales, FP4 e2m1 routed experts with 1x32 ue8m0 scales), the first N layers of the\n"
    "                  real 43 (SWA, SWA, CSA, HCA, CSA, ...; 3 hash-routed); 4 layers by default, about\n"
    "                  3.5 GB a layer plus 2.1 GB of embedding and head.  For bench/gpu_layers.\n"
    "  --layers N      how many layers (1 .. the preset's; default: the preset's own count)\n"
    "  --seed N        weight seed (default 0)\n";

int cmd_make_model(int argc, char **argv)
{
    const char *dir = NULL;
    const preset *p = &presets[0];
    uint64_t seed = 0;
    int layers = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(help, stdout); return 0; }
        if (!strcmp(argv[i], "--preset") && i + 1 < argc) {
            const char *v = argv[++i];
            p = NULL;
            for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++)
                if (!strcmp(presets[k].name, v)) p = &presets[k];
            if (!p) { fprintf(stderr, "make-tiny-model: unknown preset '%s' (tiny, 100m, v4-flash)\n", v); return 2; }
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000) { fprintf(stderr, "make-tiny-model: --layers wants a count, not '%s'\n", argv[i]); return 2; }
            layers = (int)v;
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "make-tiny-model: unknown or incomplete option '%s'\n\n%s", argv[i], help);
            return 2;
        }
    }
    if (!dir) { fprintf(stderr, "%s", help); return 2; }
    preset P = *p;
    if (layers) {
        if (layers > p->max_layers) {
            fprintf(stderr, "make-tiny-model: preset %s has at most %d layers\n", p->name, p->max_layers);
            return 2;
        }
        P.layers = layers;
        if (P.hash_layers > layers) P.hash_layers = layers;
    }
    p = &P;
    if (mkdir(dir, 0755) && errno != EEXIST) { perror(dir); return 1; }

    tlist l = {0};
    build(&l, p);
    /* header */
    uint64_t off = 0;
    size_t hcap = 256 + l.n * 160, hn = 0;
    char *hdr = malloc(hcap);
    hn += (size_t)snprintf(hdr + hn, hcap - hn, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < l.n; i++) {
        tspec *t = &l.v[i];
        t->off = off;
        off += t->nbytes;
        hn += (size_t)snprintf(hdr + hn, hcap - hn, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name,
                               md_dtype_name(t->dtype), (long long)t->shape[0]);
        if (t->ndim == 2) hn += (size_t)snprintf(hdr + hn, hcap - hn, ",%lld", (long long)t->shape[1]);
        hn += (size_t)snprintf(hdr + hn, hcap - hn, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->off,
                               (unsigned long long)off);
    }
    hn += (size_t)snprintf(hdr + hn, hcap - hn, "}");
    while (hn % 8) hdr[hn++] = ' ';

    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) { perror(tmp); return 1; }
    uint64_t hlen = hn;
    fwrite(&hlen, 8, 1, f);
    fwrite(hdr, 1, hn, f);
    free(hdr);
    uint64_t rng = seed * 0xD1B54A32D192ED03ull + 1;
    size_t bufcap = 1 << 20;
    uint8_t *buf = malloc(bufcap);
    /* progress on stderr for the multi-gigabyte presets */
    const int progress = off > ((uint64_t)1 << 31);
    uint64_t wrote = 0, next_report = (uint64_t)2 << 30;
    for (size_t i = 0; i < l.n; i++) {
        tspec *t = &l.v[i];
        size_t es = md_dtype_size(t->dtype), cnt = (size_t)(t->nbytes / es), k = 0;
        int64_t cols = t->ndim == 2 ? t->shape[1] : 1;
        if (t->kind == G_FP8 || t->kind == G_FP4 || t->kind == G_BYTE) {
            /* raw codes, 8 random bytes per draw: gigabytes of experts in seconds */
            for (uint64_t done = 0; done < t->nbytes;) {
                size_t m = t->nbytes - done < bufcap ? (size_t)(t->nbytes - done) : bufcap;
                if (t->kind == G_BYTE) {
                    memset(buf, (int)t->a, m);
                } else {
                    for (size_t j = 0; j < m; j += 8) {
                        uint64_t r = splitmix(&rng);
                        if (t->kind == G_FP8) r &= 0xBFBFBFBFBFBFBFBFull; /* exponent field < 8: no NaN, |v| <= 1.875 */
                        memcpy(buf + j, &r, m - j < 8 ? m - j : 8);
                    }
                }
                if (fwrite(buf, 1, m, f) != m) { perror(tmp); return 1; }
                done += m;
                if (progress && (wrote += m) >= next_report) {
                    fprintf(stderr, "make-tiny-model: %.1f / %.1f GB\n", (double)wrote / 1e9, (double)off / 1e9);
                    next_report += (uint64_t)2 << 30;
                }
            }
            continue;
        }
        while (k < cnt) {
            size_t m = cnt - k < bufcap / es ? cnt - k : bufcap / es;
            for (size_t j = 0; j < m; j++, k++) {
                float v;
                switch (t->kind) {
                case G_UNIFORM: v = unif(&rng) * t->a; break;
                case G_ONES_JITTER: v = 1.0f + unif(&rng) * t->a; break;
                case G_CONST: v = t->a; break;
                default: v = 0; break;
                }
                if (t->kind == G_TID2EID) {
                    /* distinct experts per row: a rotation of a random start */
                    int64_t row = (int64_t)(k / (size_t)cols), col = (int64_t)(k % (size_t)cols);
                    uint64_t h = (uint64_t)row * 0x9E3779B97F4A7C15ull ^ seed;
                    int32_t e = (int32_t)(((splitmix(&h) % (uint64_t)t->a) + (uint64_t)col) % (uint64_t)t->a);
                    memcpy(buf + j * 4, &e, 4);
                } else if (t->dtype == MD_F32) {
                    memcpy(buf + j * 4, &v, 4);
                } else {
                    uint16_t b = md_f32_to_bf16(v);
                    memcpy(buf + j * 2, &b, 2);
                }
            }
            if (fwrite(buf, es, m, f) != m) { perror(tmp); return 1; }
        }
    }
    free(buf);
    if (fclose(f) || rename(tmp, path)) { perror(path); return 1; }
    if (write_config(dir, p)) { perror("config.json"); return 1; }
    char tk[4096];
    snprintf(tk, sizeof tk, "%s/tokenizer.json", dir);
    if (copy_file(cli_default_tokenizer(), tk)) fprintf(stderr, "make-tiny-model: could not copy the tokenizer\n");
    fprintf(stderr, "make-tiny-model: wrote %s (%zu tensors, %.1f MB, preset %s, seed %llu)\n", dir, l.n,
            (double)off / 1e6, p->name, (unsigned long long)seed);
    free(l.v);
    return 0;
}
