/* gpu_fp8_tiles.c - bench_gpu_fp8_tiles: official semantics' FP8 linears at decode batches (linear_aq on an FP8
 * weight with ue8m0 128 x 128 scales), the FP8 tiles (fp8_tile.cu, DEEPINFER_CUDA_FT=1) against what they replace
 * in the same run: the weight dequantised to a bf16 copy, x act_quant'd into its bf16 plane, one cuBLAS GEMM
 * (DEEPINFER_CUDA_FT=0; below DEEPINFER_CUDA_DEQUANT_T, 17 tokens, the decode row-dot instead).  Both on one bf16x3 backend each, on device pointers, as the device graph calls them.
 *
 * Ceilings first: the device-to-device copy bandwidth and the bf16 GEMM peak (bench_util.h).  Then per V4-Flash
 * FP8 linear (wq_a, wq_b, wkv, wo_b, the shared expert's w1 / w3 and w2) and token count T:
 *   tiles us, deq us   one call (act_quant of x included; "deq" is the row-dot below 17 tokens), CUDA events over 20 calls rotating over enough
 *                      copies of the weight that it comes from HBM, median of 7 repetitions
 *   ratio              deq / tiles (above 1: the tiles are faster)
 *   floor us           max(weight + x + y bytes / copy bandwidth, 2 T n K / bf16 peak)
 *   %floor             floor / tiles
 *   ks                 the K slices the tiles ran in (bcu_ft_splits)
 *   diff               max |y_tiles - y_deq| / max |y_deq| on the last call (same inputs)
 * BENCH_FT_T=17,64 runs those T only, BENCH_FT_SHAPE=wq_b the shapes whose name holds it.  Prints one markdown
 * table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fp8_tile.h"

#define BENCH_NAME "bench_gpu_fp8_tiles"
#define BENCH_WITH_CUBLAS
#include "backend/cuda/bench_util.h"

#define NREP 7
#define NCALL 20

static be_backend *backend(const char *ft)
{
    char err[256] = "";
    setenv("DEEPINFER_CUDA_FT", ft, 1);
    setenv("DEEPINFER_CUDA_FT_MIN", "1", 1); /* every T of the table: the backend's thresholds are what it picks */
    setenv("DEEPINFER_CUDA_FT_MAX", "1000000", 1);
    be_backend *be = bcu_create(0, 2, BCU_MATH_BF16X3, err, sizeof err);
    unsetenv("DEEPINFER_CUDA_FT");
    unsetenv("DEEPINFER_CUDA_FT_MIN");
    unsetenv("DEEPINFER_CUDA_FT_MAX");
    if (!be) {
        fprintf(stderr, BENCH_NAME ": bcu_create: %s\n", err);
        exit(1);
    }
    return be;
}

/* median us of one linear_aq over NCALL calls rotating over nw weights; y gets the last call's output */
static double time_linear(be_backend *g, be_weight *ws, int nw, float *dx, float *dy, size_t T)
{
    const be_dev_ops *dv = g->ops->dev;
    cudaStream_t st = bcu_stream(g);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < nw; i++) dv->linear_aq(g, dy, dx, T, &ws[i]); /* uploads, warms */
    double t[NREP];
    for (int r = 0; r < NREP; r++) {
        CK(cudaStreamSynchronize(st));
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < NCALL; i++) dv->linear_aq(g, dy, dx, T, &ws[(i + 1) % nw]);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = ms * 1000.0 / NCALL;
    }
    if (be_cuda_error(g)) {
        fprintf(stderr, BENCH_NAME ": %s\n", be_cuda_error(g));
        exit(1);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(t, NREP);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf(BENCH_NAME ": no CUDA device, nothing measured\n");
        return 0;
    }
    const double bw = copy_bandwidth(), peak = gemm_peak(1, 8192);
    printf("copy bandwidth %.0f GB/s, bf16 GEMM peak %.0f TFLOP/s\n\n", bw / 1e9, peak / 1e12);
    static const struct { const char *name; int64_t n, K; } shapes[] = {
        {"wq_a", 1024, 4096}, {"wq_b", 32768, 1024}, {"wkv", 512, 4096}, {"wo_b", 4096, 8192},
        {"sw1/sw3", 2048, 4096}, {"sw2", 4096, 2048}};
    size_t Ts[16] = {17, 32, 64, 128, 256, 512};
    int nT = 6;
    const char *te = getenv("BENCH_FT_T");
    if (te && *te) {
        nT = 0;
        for (const char *p = te; *p && nT < 16;) {
            char *end;
            const unsigned long v = strtoul(p, &end, 10);
            if (end == p || v < 1 || v > 65536) {
                fprintf(stderr, BENCH_NAME ": BENCH_FT_T: token counts 1 .. 65536, comma separated\n");
                return 2;
            }
            Ts[nT++] = (size_t)v;
            for (p = end; *p == ','; p++) {}
        }
    }
    be_backend *on = backend("1"), *off = backend("0");
    printf("| linear | n x K | T | tiles us | deq us | ratio | floor us | %%floor | ks | diff |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const char *only = getenv("BENCH_FT_SHAPE"); /* a substring of the names to run, e.g. "wq_b" */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        if (only && *only && !strstr(shapes[s].name, only)) continue;
        const int64_t n = shapes[s].n, K = shapes[s].K;
        const size_t wb = (size_t)(n * K);
        const int nw = (int)(160e6 / (double)wb) + 2; /* more than three L2s of weights */
        be_weight *ws = calloc((size_t)nw, sizeof *ws);
        const size_t nsc = (size_t)(((n + 127) / 128) * (K / 128));
        for (int i = 0; i < nw; i++) {
            uint8_t *d = malloc(wb), *sc = malloc(nsc);
            for (size_t j = 0; j < wb; j++) {
                uint8_t b = (uint8_t)rnd();
                if ((b & 0x7f) == 0x7f) b ^= 1; /* no NaN codes */
                d[j] = b;
            }
            for (size_t j = 0; j < nsc; j++) sc[j] = (uint8_t)(116 + rnd() % 6);
            ws[i] = (be_weight){.fmt = BE_W_FP8, .dtype = MD_F8_E4M3, .data = d, .rows = n, .cols = K,
                                .scale = sc, .scale_dtype = MD_F8_E8M0, .block = 128};
        }
        for (int ti = 0; ti < nT; ti++) {
            const size_t T = Ts[ti];
            float *x = malloc(T * (size_t)K * sizeof *x);
            for (size_t j = 0; j < T * (size_t)K; j++) x[j] = ((float)(rnd() % 20001) - 10000.0f) * 1e-4f;
            float *y[2];
            double us[2];
            for (int v = 0; v < 2; v++) {
                be_backend *g = v ? off : on;
                const be_dev_ops *dv = g->ops->dev;
                dv->reset(g);
                float *dx = dv->alloc(g, T * (size_t)K * 4), *dy = dv->alloc(g, T * (size_t)n * 4);
                if (!dx || !dy) {
                    fprintf(stderr, BENCH_NAME ": device alloc\n");
                    return 1;
                }
                dv->upload(g, dx, x, T * (size_t)K * 4);
                us[v] = time_linear(g, ws, nw, dx, dy, T);
                y[v] = malloc(T * (size_t)n * sizeof(float));
                dv->linear_aq(g, dy, dx, T, &ws[0]);
                if (dv->download(g, y[v], dy, T * (size_t)n * 4)) {
                    fprintf(stderr, BENCH_NAME ": download\n");
                    return 1;
                }
            }
            double md = 0, mb = 0;
            for (size_t j = 0; j < T * (size_t)n; j++) {
                md = fmax(md, fabs((double)y[0][j] - y[1][j]));
                mb = fmax(mb, fabs((double)y[1][j]));
            }
            const double bytes = (double)wb + (double)nsc + (double)T * K * 4 + (double)T * n * 4;
            const double fl = fmax(bytes / bw, 2.0 * T * (double)n * K / peak) * 1e6;
            printf("| %s | %lldx%lld | %zu | %.1f | %.1f | %.2f | %.1f | %.0f%% | %d | %.1e |\n", shapes[s].name,
                   (long long)n, (long long)K, T, us[0], us[1], us[1] / us[0], fl, 100.0 * fl / us[0],
                   bcu_ft_splits((int64_t)T, n, K), mb > 0 ? md / mb : md);
            fflush(stdout);
            free(x);
            free(y[0]);
            free(y[1]);
        }
        for (int i = 0; i < nw; i++) {
            free((void *)ws[i].data);
            free((void *)ws[i].scale);
        }
        free(ws);
    }
    be_cuda_destroy(on);
    be_cuda_destroy(off);
    return 0;
}
