/* gpu_moe.c - bench_gpu_moe: the grouped FP4 routed-expert FFN (moe.cu) at
 * V4-Flash dims (dim 4096, inter 2048, 256 experts, top-6, ue8m0 1x32),
 * beside the floors measured in the same run.
 *
 * Ceilings first:
 *   copy     a 1 GiB device-to-device cudaMemcpy, (read + written bytes) / s
 *   bf16     a cublasGemmEx 8192^3, bf16 x bf16 -> fp32 (COMPUTE_32F): the
 *            dense bf16 tensor-core peak as cuBLAS reaches it
 *   fp32     a cublasSgemm 4096^3 without TF32 (pedantic): the SIMT peak
 * Then per T (1, 8, 64, 256, 1024, 2048, 4096, 16384) and per path / math:
 *   us        one bcu_moe_forward (routing + 2 GEMMs + combine), cudaEvent
 *             timed, median of the repetitions after a warmup; the routing
 *             rotates over 8 random draws so the experts come from HBM
 *   experts   distinct experts the draws touch (mean)
 *   bw floor  (distinct experts x (FP4 codes + scales) + x + y bytes) / copy
 *   fl floor  2 * T * topk * 3 * dim * inter FLOPs / the bf16 peak
 *   %bw, %fl  floor / measured; the larger one is how close the call is to
 *             its roofline
 *   bits      a hash of the last call's output bits (two builds on the same
 *             T list print the same hash when a change kept every bit)
 * Rows marked "aq" run official semantics with act_quant'd x and h, as the V4
 * graph does: the mma rows on one bf16 plane, and the wgmma path (moe_wg.cu,
 * sm_90a only) on f16 values (bf16x3) and on e4m3 codes (bf16), the one-plane
 * tiles (prefill) and the wgmma tiles (wg-tiles, sm_90a: bf16 values with their
 * scales, 128 tokens a tile).
 * Environment: BENCH_GPU_MOE_T=1,256 (these T only), BENCH_GPU_MOE_AQ=1 (the
 * aq rows only), DEEPINFER_CUDA_MOE_MR=MT,KS (the mma rows' tiling).
 * Prints one markdown table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/moe.h"
#include "backend/cuda/moe_wg.h"

#define BENCH_NAME "bench_gpu_moe"
#define BENCH_WITH_CUBLAS
#include "backend/cuda/bench_util.h"

#define E 256
#define TOPK 6
#define DIM 4096
#define INTER 2048
#define NDRAW 8




static cudaEvent_t ev0, ev1;
static double elapsed(void)
{
    float ms;
    CK(cudaEventSynchronize(ev1));
    CK(cudaEventElapsedTime(&ms, ev0, ev1));
    return ms * 1e-3;
}


/* FNV-1a over the bits of the last call's y: the same inputs give the same hash exactly when a kernel change kept
 * every output bit (the routing draws depend on BENCH_GPU_MOE_T only) */
static uint32_t out_hash(const float *dy, size_t n)
{
    uint32_t *h = malloc(n * sizeof *h), x = 2166136261u;
    CK(cudaMemcpy(h, dy, n * sizeof *h, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) x = (x ^ ((h[i] >> (8 * b)) & 255u)) * 16777619u;
    free(h);
    return x;
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    const double bw = copy_bandwidth();
    const double pk16 = gemm_peak(1, 8192), pk32 = gemm_peak(0, 4096);
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1 << 30));
    printf("device-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 15)\n", bw / 1e9);
    printf("bf16 dense peak (cublasGemmEx 8192^3, bf16 in, fp32 out and compute): %.0f TFLOP/s\n", pk16 / 1e12);
    printf("fp32 SIMT peak (cublasSgemm 4096^3, pedantic, no TF32): %.1f TFLOP/s\n", pk32 / 1e12);

    /* the experts: random codes, scales 2^-9..2^-2, one allocation per matrix kind */
    const size_t b13 = (size_t)INTER * DIM / 2, sc13 = (size_t)INTER * (DIM / 32);
    const size_t b2 = (size_t)DIM * INTER / 2, sc2 = (size_t)DIM * (INTER / 32);
    const size_t per_expert = 2 * (b13 + sc13) + b2 + sc2;
    uint8_t *dw1, *dw3, *dw2, *ds1, *ds3, *ds2;
    CK(cudaMalloc((void **)&dw1, b13 * E));
    CK(cudaMalloc((void **)&dw3, b13 * E));
    CK(cudaMalloc((void **)&dw2, b2 * E));
    CK(cudaMalloc((void **)&ds1, sc13 * E));
    CK(cudaMalloc((void **)&ds3, sc13 * E));
    CK(cudaMalloc((void **)&ds2, sc2 * E));
    {
        const size_t chunk = (size_t)16 << 20;
        uint8_t *codes = malloc(chunk), *scales = malloc(chunk);
        for (size_t i = 0; i < chunk; i++) {
            codes[i] = (uint8_t)rnd();
            scales[i] = (uint8_t)(118 + rnd() % 8);
        }
        uint8_t *dst[6] = {dw1, dw3, dw2, ds1, ds3, ds2};
        const size_t len[6] = {b13 * E, b13 * E, b2 * E, sc13 * E, sc13 * E, sc2 * E};
        for (int m = 0; m < 6; m++)
            for (size_t o = 0; o < len[m]; o += chunk)
                CK(cudaMemcpy(dst[m] + o, m < 3 ? codes : scales, len[m] - o < chunk ? len[m] - o : chunk,
                              cudaMemcpyHostToDevice));
        free(codes);
        free(scales);
    }
    const uint8_t *tab[6 * E];
    for (int e = 0; e < E; e++) {
        tab[0 * E + e] = dw1 + (size_t)e * b13;
        tab[1 * E + e] = ds1 + (size_t)e * sc13;
        tab[2 * E + e] = dw3 + (size_t)e * b13;
        tab[3 * E + e] = ds3 + (size_t)e * sc13;
        tab[4 * E + e] = dw2 + (size_t)e * b2;
        tab[5 * E + e] = ds2 + (size_t)e * sc2;
    }
    const uint8_t **dtab;
    CK(cudaMalloc((void **)&dtab, sizeof tab));
    CK(cudaMemcpy(dtab, tab, sizeof tab, cudaMemcpyHostToDevice));
    const bcu_moe_experts ex = {.n_experts = E, .dim = DIM, .inter = INTER, .swiglu_limit = 10.0f,
                                .weight_before_w2 = 0, .w1 = dtab + 0 * E, .s1 = dtab + 1 * E,
                                .w3 = dtab + 2 * E, .s3 = dtab + 3 * E, .w2 = dtab + 4 * E, .s2 = dtab + 5 * E};

    bcu_moe_experts exq = ex; /* official semantics, act_quant'd x and h */
    exq.weight_before_w2 = 1;
    exq.act_fp8_h = 1;
    /* BENCH_GPU_MOE_AQ=1: only the act_quant'd runs */
    const int only_aq = getenv("BENCH_GPU_MOE_AQ") && atoi(getenv("BENCH_GPU_MOE_AQ"));
    int64_t Ts[8] = {1, 8, 64, 256, 1024, 2048, 4096, 16384};
    int nT = (int)(sizeof Ts / sizeof Ts[0]);
    /* DEEPINFER_CUDA_MOE_MR=MT,KS: the mma rows in that tiling (bcu_moe_set_tiling) */
    const char *mr = getenv("DEEPINFER_CUDA_MOE_MR");
    if (mr && *mr && bcu_moe_set_tiling(atoi(mr), strchr(mr, ',') ? atoi(strchr(mr, ',') + 1) : 1)) {
        fprintf(stderr, "bench_gpu_moe: DEEPINFER_CUDA_MOE_MR must be MT,KS with MT 1, 2 or 4 and KS 1 or 4\n");
        return 2;
    }
    /* BENCH_GPU_MOE_T=1,256: only these batch sizes (ascending; e.g. for a profiler) */
    const char *only = getenv("BENCH_GPU_MOE_T");
    if (only && *only) {
        nT = 0;
        for (char *e; *only && nT < 8; only = *e ? e + 1 : e) {
            const long v = strtol(only, &e, 10);
            if (v <= 0 || e == only) break;
            Ts[nT++] = v;
        }
        if (!nT) {
            fprintf(stderr, "bench_gpu_moe: BENCH_GPU_MOE_T must be a list of positive sizes\n");
            return 2;
        }
    }
    const int64_t Tmax = Ts[nT - 1];
    const size_t wsb = bcu_moe_workspace_bytes(Tmax, TOPK, E, DIM, INTER);
    void *ws;
    float *dx, *dy, *dwt;
    int32_t *dids;
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMalloc((void **)&dx, (size_t)Tmax * DIM * 4));
    CK(cudaMalloc((void **)&dy, (size_t)Tmax * DIM * 4));
    CK(cudaMalloc((void **)&dids, (size_t)NDRAW * Tmax * TOPK * 4));
    CK(cudaMalloc((void **)&dwt, (size_t)NDRAW * Tmax * TOPK * 4));
    {
        float *x = malloc((size_t)Tmax * DIM * 4);
        for (size_t i = 0; i < (size_t)Tmax * DIM; i++) x[i] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
        CK(cudaMemcpy(dx, x, (size_t)Tmax * DIM * 4, cudaMemcpyHostToDevice));
        free(x);
    }
    int32_t *ids = malloc((size_t)NDRAW * Tmax * TOPK * 4);
    float *wt = malloc((size_t)NDRAW * Tmax * TOPK * 4);
    printf("workspace at T = %lld: %.2f GB\n\n", (long long)Tmax, (double)wsb / 1e9);

    printf("| T | path | math | experts | us | GB/s | bw floor us | %% bw | TFLOP/s | fl floor us | %% fl | bits |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int ti = 0; ti < nT; ti++) {
        const int64_t T = Ts[ti];
        /* NDRAW routings: top-6 distinct experts per token, uniform */
        double distinct = 0;
        for (int d = 0; d < NDRAW; d++) {
            int seen[E] = {0};
            int32_t *id = ids + (size_t)d * T * TOPK;
            for (int64_t t = 0; t < T; t++) {
                int perm[E];
                for (int e = 0; e < E; e++) perm[e] = e;
                for (int k = 0; k < TOPK; k++) {
                    int j = k + (int)(rnd() % (uint32_t)(E - k)), tmp = perm[k];
                    perm[k] = perm[j];
                    perm[j] = tmp;
                    id[t * TOPK + k] = perm[k];
                    wt[(size_t)d * T * TOPK + t * TOPK + k] = 0.25f;
                    seen[perm[k]] = 1;
                }
            }
            for (int e = 0; e < E; e++) distinct += seen[e];
        }
        distinct /= NDRAW;
        CK(cudaMemcpy(dids, ids, (size_t)NDRAW * T * TOPK * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwt, wt, (size_t)NDRAW * T * TOPK * 4, cudaMemcpyHostToDevice));
        const double bytes = distinct * (double)per_expert + 2.0 * (double)T * DIM * 4;
        const double flops = 2.0 * (double)T * TOPK * 3.0 * DIM * INTER;
        const double tbw = bytes / bw, tfl = flops / pk16;

        /* aq: official semantics with act_quant'd x and h (BE_MOE_ACT_FP8_H), what the V4 graph runs: the mma
         * rows on one bf16 plane, and wgmma (sm_90a) on f16 values (bf16x3) and on the e4m3 codes (bf16) */
        struct {
            bcu_moe_path path;
            bcu_moe_math math;
            int aq;
        } runs[] = {{BCU_MOE_ROWS, BCU_MOE_FP32, 0},    {BCU_MOE_TILED, BCU_MOE_FP32, 0},
                    {BCU_MOE_TILED, BCU_MOE_BF16X3, 0}, {BCU_MOE_TILED, BCU_MOE_BF16, 0},
                    {BCU_MOE_MMAROWS, BCU_MOE_BF16X3, 0}, {BCU_MOE_MMAROWS, BCU_MOE_BF16, 1},
                    {BCU_MOE_WGMMA, BCU_MOE_BF16X3, 1}, {BCU_MOE_WGMMA, BCU_MOE_BF16, 1},
                    {BCU_MOE_TILED, BCU_MOE_BF16, 1},    {BCU_MOE_WGTILES, BCU_MOE_BF16X3, 1},
                    {BCU_MOE_WGGEMV, BCU_MOE_BF16X3, 1}};
        for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
            if (runs[ri].path == BCU_MOE_ROWS && T > 4096) continue; /* a 4-token pass per weight read: far too slow */
            if (runs[ri].path == BCU_MOE_MMAROWS && T > 4096) continue; /* 21 rows per weight read */
            if (runs[ri].path == BCU_MOE_WGMMA && (T > 4096 || !bcu_wg_available())) continue; /* 8 rows a read */
            if (runs[ri].path == BCU_MOE_WGTILES && !bcu_wg_available()) continue;
            if (runs[ri].path == BCU_MOE_WGGEMV && (T > 64 || !bcu_wg_available())) continue; /* 2 rows a read */
            if (only_aq && !runs[ri].aq) continue;
            const bcu_moe_experts *exr = runs[ri].aq ? &exq : &ex;
            /* short calls: several per event pair; long ones: one, fewer repetitions */
            const int inner = T <= 256 ? 10 : 1, reps = T <= 256 ? 15 : T <= 4096 ? 7 : 3;
            double t[15];
            for (int r = -1; r < reps; r++) {
                CK(cudaEventRecord(ev0, 0));
                for (int i = 0; i < inner; i++) {
                    const int d = (r + 1) * inner + i;
                    const size_t o = (size_t)(d % NDRAW) * T * TOPK;
                    cudaError_t e = bcu_moe_forward(exr, dy, dx, dids + o, dwt + o, T, TOPK, runs[ri].math,
                                                    runs[ri].path, ws, wsb, 0);
                    die_cuda(e, "bcu_moe_forward");
                }
                CK(cudaEventRecord(ev1, 0));
                const double s = elapsed() / inner;
                if (r >= 0) t[r] = s;
            }
            CK(cudaGetLastError());
            const double tm = median(t, reps);
            printf("| %lld | %s | %s%s | %.0f | %.1f | %.0f | %.1f | %.1f%% | %.2f | %.1f | %.1f%% | %08x |\n", (long long)T,
                   bcu_moe_path_name(runs[ri].path), bcu_moe_math_name(runs[ri].math), runs[ri].aq ? " aq" : "", distinct, tm * 1e6,
                   bytes / tm / 1e9, tbw * 1e6, 100.0 * tbw / tm, flops / tm / 1e12, tfl * 1e6, 100.0 * tfl / tm,
                   out_hash(dy, (size_t)T * DIM));
            fflush(stdout);
        }
    }
    printf("\nauto picks: ");
    for (int ti = 0; ti < nT; ti++)
        printf("T=%lld %s/%s%s", (long long)Ts[ti], bcu_moe_path_name(bcu_moe_auto_path(Ts[ti], TOPK, E, BCU_MOE_FP32, 0)),
               bcu_moe_path_name(bcu_moe_auto_path(Ts[ti], TOPK, E, BCU_MOE_BF16X3, 0)), ti + 1 < nT ? ", " : "\n");
    printf("(fp32 / bf16 maths; the rows path always computes in fp32, the mma rows in three bf16 planes)\n");
    free(ids);
    free(wt);
    cudaFree(ws); cudaFree(dx); cudaFree(dy); cudaFree(dids); cudaFree(dwt); cudaFree((void *)dtab);
    cudaFree(dw1); cudaFree(dw3); cudaFree(dw2); cudaFree(ds1); cudaFree(ds3); cudaFree(ds2);
    return 0;
}
