/* gpu_attn.c - bench_gpu_attn: one V4-Flash CSA layer (indexer + top-k +
 * attention) and one HCA layer (attention), decode, on the GPU, beside the
 * bandwidth floor.
 *
 * Shapes: 64 heads x 512, rope 64, window 128; CSA ratio 4 with 64 x 128
 * index heads and top-512; HCA ratio 128.  Decode at batch B = 1, 8, 64 and
 * context C = 4K, 32K, 128K: B independent sequences, each one query at
 * position C - 1 with its own KV blocks and window, go in ONE call of each
 * kernel (a batch of B bcu_attn_seq), not a loop.
 *
 * Per row: median over 15 repetitions of (CUDA events around INNER calls) /
 * INNER, after warm-up.  The calls rotate over R copies of all the data
 * (R x bytes >= 256 MB, R <= 256), so the keys come from HBM, not the 50 MB L2.
 *   keys MB      bytes of keys the part must read: indexer B * C/4 * 128 * 4;
 *                CSA attention B * (128 + 512) * 512 * 4; HCA attention
 *                B * (128 + C/128) * 512 * 4 (fp32 entries)
 *   floor us     keys bytes / the device-to-device copy bandwidth measured
 *                in the same run (read + write bytes per second)
 *   % floor      floor / time
 *   FLOP floor   the part's fp32 FMAs at the SM count x 128 lanes x clock:
 *                indexer 2 * B * C/4 * 64 * 128, attention 4 * B * 64 *
 *                candidates * 512 (QK and PV; no tensor cores, see docs/CUDA.md)
 * The "x3 tensor cores" rows time the same attention on at_x3_kernel (bcu_attention_args.x3 = 2: q and p in three
 * bf16 planes; the keys here are not on the FP8 grid, so only the time means anything) beside the fp32 kernel's
 * "split + merge" row of the same run.
 * Prints one markdown table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/attn.h"

#define BENCH_NAME "bench_gpu_attn"
#include "backend/cuda/bench_util.h"

#define REPS 15
#define BLOCK_TOKENS 128
#define H 64
#define D 512
#define RD 64
#define W 128
#define CSA 4
#define HCA 128
#define IH 64
#define ID 128
#define TOPK 512



static uint64_t rs = 88172645463325252ull;
static float unif(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}


/* random floats from a 64 MB host pattern, copied in chunks */
static float *pattern;
#define PATTERN_FLOATS ((size_t)16 << 20)
static float *dev_random(size_t n)
{
    float *d;
    CK(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)));
    for (size_t at = 0; at < n; at += PATTERN_FLOATS) {
        const size_t m = n - at < PATTERN_FLOATS ? n - at : PATTERN_FLOATS;
        CK(cudaMemcpy(d + at, pattern + (at / 7) % 1024, m * sizeof(float), cudaMemcpyHostToDevice));
    }
    return d;
}

/* one copy of everything a call reads and writes */
typedef struct {
    float *pool, *kwin, *q, *iq, *iw, *out;
    const float **tab;
    int32_t *sel, *nsel;
    bcu_attn_seq *seqs;
} inst;

typedef struct {
    int ratio, csa, B;
    int64_t ctx;
    int R;
    inst *in;
    float *sink, *inv;
    bcu_attn_ws ws;
    size_t ent_off, key_off;
} config;

static size_t inst_bytes(int ratio, int csa, int B, int64_t ctx)
{
    const int64_t epb = BLOCK_TOKENS / ratio, nblk = ctx / BLOCK_TOKENS;
    const size_t blk = (size_t)epb * (D + (csa ? ID : 0)) * 4;
    return (size_t)B * ((size_t)nblk * blk + (size_t)W * D * 4);
}

static void make(config *c, int ratio, int csa, int B, int64_t ctx)
{
    memset(c, 0, sizeof *c);
    c->ratio = ratio;
    c->csa = csa;
    c->B = B;
    c->ctx = ctx;
    const size_t ib = inst_bytes(ratio, csa, B, ctx);
    c->R = (int)(((size_t)256 << 20) / ib + 1);
    if (c->R > 256) c->R = 256;
    c->in = calloc((size_t)c->R, sizeof *c->in);
    const int64_t epb = BLOCK_TOKENS / ratio, nblk = ctx / BLOCK_TOKENS;
    const size_t blk = (size_t)epb * (D + (csa ? ID : 0));
    c->ent_off = 0;
    c->key_off = (size_t)epb * D;
    for (int r = 0; r < c->R; r++) {
        inst *in = &c->in[r];
        in->pool = dev_random((size_t)B * nblk * blk);
        in->kwin = dev_random((size_t)B * W * D);
        in->q = dev_random((size_t)B * H * D);
        in->iq = dev_random((size_t)B * IH * ID);
        in->iw = dev_random((size_t)B * IH);
        CK(cudaMalloc((void **)&in->out, (size_t)B * H * D * sizeof(float)));
        CK(cudaMalloc((void **)&in->sel, (size_t)B * TOPK * sizeof(int32_t)));
        CK(cudaMalloc((void **)&in->nsel, (size_t)B * sizeof(int32_t)));
        const float **tab = malloc((size_t)B * nblk * sizeof *tab);
        for (int64_t i = 0; i < (int64_t)B * nblk; i++) tab[i] = in->pool + (size_t)i * blk;
        CK(cudaMalloc((void **)&in->tab, (size_t)B * nblk * sizeof *tab));
        CK(cudaMemcpy(in->tab, tab, (size_t)B * nblk * sizeof *tab, cudaMemcpyHostToDevice));
        free(tab);
        bcu_attn_seq *sq = malloc((size_t)B * sizeof *sq);
        for (int s = 0; s < B; s++)
            sq[s] = (bcu_attn_seq){.p0 = ctx - 1, .kstart = ctx - W, .kwin = in->kwin + (size_t)s * W * D,
                                   .blocks = (const float *const *)(in->tab + (size_t)s * nblk), .row0 = s, .T = 1};
        CK(cudaMalloc((void **)&in->seqs, (size_t)B * sizeof *sq));
        CK(cudaMemcpy(in->seqs, sq, (size_t)B * sizeof *sq, cudaMemcpyHostToDevice));
        free(sq);
    }
    c->sink = dev_random(H);
    float inv[RD / 2];
    for (int i = 0; i < RD / 2; i++) inv[i] = (float)pow(160000.0, -2.0 * i / RD);
    CK(cudaMalloc((void **)&c->inv, sizeof inv));
    CK(cudaMemcpy(c->inv, inv, sizeof inv, cudaMemcpyHostToDevice));
    c->ws.lim = (bcu_attn_limits){.max_rows = B, .max_len = ctx, .n_heads = H, .head_dim = D,
                                  .index_topk = csa ? TOPK : 0, .index_ratio = csa ? ratio : 0};
    CK(cudaMalloc(&c->ws.mem, bcu_attn_workspace_bytes(&c->ws.lim)));
    CK(bcu_attn_workspace_init(&c->ws, 0));
}

static void destroy(config *c)
{
    for (int r = 0; r < c->R; r++) {
        inst *in = &c->in[r];
        cudaFree(in->pool); cudaFree(in->kwin); cudaFree(in->q); cudaFree(in->iq); cudaFree(in->iw);
        cudaFree(in->out); cudaFree(in->sel); cudaFree(in->nsel); cudaFree(in->tab); cudaFree(in->seqs);
    }
    free(c->in);
    cudaFree(c->sink);
    cudaFree(c->inv);
    cudaFree(c->ws.mem);
}

enum { PART_INDEXER = 1, PART_ATTN = 2, PART_X3 = 4 }; /* PART_X3: attention on at_x3_kernel (x3 = 2, forced) */

static void call(config *c, int r, int parts)
{
    inst *in = &c->in[r];
    const bcu_attn_batch b = {.seqs = in->seqs, .nseq = c->B, .ntok = c->B, .max_len = c->ctx};
    char err[256] = "";
    if (parts & PART_INDEXER) {
        const bcu_indexer_args ia = {.index_heads = IH, .index_dim = ID, .ratio = c->ratio, .topk = TOPK,
                                     .key_off = c->key_off, .iq = in->iq, .iw = in->iw, .sel = in->sel,
                                     .nsel = in->nsel};
        cudaError_t e = bcu_indexer_topk(&c->ws, &b, &ia, 0, err, sizeof err);
        if (e != cudaSuccess) {
            fprintf(stderr, "bench_gpu_attn: bcu_indexer_topk: %s %s\n", cudaGetErrorString(e), err);
            exit(1);
        }
    }
    if (parts & (PART_ATTN | PART_X3)) {
        const bcu_attention_args aa = {.n_heads = H, .head_dim = D, .rope_dim = RD, .window = W, .ratio = c->ratio,
                                       .csa = c->csa, .ent_off = c->ent_off, .q = in->q, .sink = c->sink,
                                       .inv_freq = c->inv, .sel = in->sel, .nsel = in->nsel, .topk = TOPK,
                                       .out = in->out, .x3 = parts & PART_X3 ? 2 : 0};
        cudaError_t e = bcu_attention(&c->ws, &b, &aa, 0, err, sizeof err);
        if (e != cudaSuccess) {
            fprintf(stderr, "bench_gpu_attn: bcu_attention: %s %s\n", cudaGetErrorString(e), err);
            exit(1);
        }
    }
}

/* seconds per call */
static double time_parts(config *c, int parts)
{
    const int inner = c->R * ((10 + c->R - 1) / c->R);
    for (int i = 0; i < 2 * c->R; i++) call(c, i % c->R, parts);
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[REPS];
    for (int rep = 0; rep < REPS; rep++) {
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < inner; i++) call(c, i % c->R, parts);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[rep] = ms * 1e-3 / inner;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    const int f = bcu_attn_workspace_flags(&c->ws, 1, 0);
    if (f) {
        fprintf(stderr, "bench_gpu_attn: workspace error flags 0x%x\n", f);
        exit(1);
    }
    return median(t, REPS);
}

static double bw, flops;

static void row(const char *layer, const config *c, const char *part, double sec, double bytes, double fl)
{
    const double floor_s = bytes / bw, fl_s = fl / flops;
    char ctx[32];
    snprintf(ctx, sizeof ctx, "%lldK", (long long)(c->ctx / 1024));
    printf("| %-4s | %3d | %5s | %-28s | %9.1f | %8.1f | %8.1f | %6.1f%% | %10.1f |\n", layer, c->B, ctx, part,
           sec * 1e6, bytes / 1e6, floor_s * 1e6, 100.0 * floor_s / sec, fl_s * 1e6);
    fflush(stdout);
}

int main(void)
{
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess || n <= 0) {
        printf("SKIPPED: no CUDA device (%s)\n", r != cudaSuccess ? cudaGetErrorString(r) : "none found");
        return 0;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int sms = 0, khz = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    const int assumed = khz <= 0;
    if (assumed) khz = 1980000; /* H200 boost clock */
    flops = (double)sms * 128 * 2 * khz * 1e3;
    pattern = malloc((PATTERN_FLOATS + 1024) * sizeof(float));
    for (size_t i = 0; i < PATTERN_FLOATS + 1024; i++) pattern[i] = unif();
    bw = copy_bandwidth();
    printf("device: %s, %d SMs, %.0f MHz%s; fp32 FMA peak %.1f TFLOP/s\n", prop.name, sms, khz / 1e3,
           assumed ? " (assumed)" : "", flops / 1e12);
    printf("device-to-device copy: %.0f GB/s (read + write, 1 GiB, median of %d)\n", bw / 1e9, REPS);
    printf("decode: B independent sequences, one query each at position C-1, batched in one call per kernel\n\n");
    printf("| layer | B | context | part | us | keys MB | floor us | %% floor | FLOP floor us |\n");
    printf("|------|-----|-------|------------------------------|-----------|----------|----------|---------|------------|\n");
    const int Bs[3] = {1, 8, 64};
    const int64_t Cs[3] = {4096, 32768, 131072};
    config *c = malloc(sizeof *c);
    for (int layer = 0; layer < 2; layer++)
        for (int bi = 0; bi < 3; bi++)
            for (int ci = 0; ci < 3; ci++) {
                const int B = Bs[bi];
                const int64_t C = Cs[ci];
                const double nv = (double)(layer == 0 ? C / CSA : C / HCA);
                if (layer == 0) {
                    make(c, CSA, 1, B, C);
                    const double ncand = W + (nv < TOPK ? nv : TOPK);
                    const double ib = (double)B * nv * ID * 4, ab = (double)B * ncand * D * 4;
                    const double ifl = 2.0 * B * nv * IH * ID, afl = 4.0 * B * H * ncand * D;
                    const double ti = time_parts(c, PART_INDEXER);
                    call(c, 0, PART_INDEXER); /* attention reads a real selection */
                    const double ta = time_parts(c, PART_ATTN);
                    const double tt = time_parts(c, PART_INDEXER | PART_ATTN);
                    row("CSA", c, "indexer: scores + top-512", ti, ib, ifl);
                    row("CSA", c, "attention: split + merge", ta, ab, afl);
                    row("CSA", c, "attention: x3 tensor cores", time_parts(c, PART_X3), ab, afl);
                    row("CSA", c, "layer: indexer + attention", tt, ib + ab, ifl + afl);
                } else {
                    make(c, HCA, 0, B, C);
                    const double ncand = W + nv;
                    row("HCA", c, "attention: split + merge", time_parts(c, PART_ATTN), (double)B * ncand * D * 4,
                        4.0 * B * H * ncand * D);
                    row("HCA", c, "attention: x3 tensor cores", time_parts(c, PART_X3), (double)B * ncand * D * 4,
                        4.0 * B * H * ncand * D);
                }
                destroy(c);
            }
    free(c);
    free(pattern);
    return 0;
}
