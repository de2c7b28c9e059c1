/* gpu_chain.c - bench_gpu_chain: a chain of dependent batch-1 FP8 GEMVs at V4-Flash shapes, as the backend runs
 * it today (bcu_rowdot, a launch a step with PDL, replayed from a CUDA graph) and as chain.cu runs it: a launch a
 * step with PDL, and one persistent launch whose blocks pass the steps on through memory (one counter a step, or a
 * flag a block and step) and stream the next steps' weights while they wait (src/backend/cuda/chain.cu says why).
 *
 * The chain is one layer's critical FP8 row-dots, repeated: wq_a 1024 x 4096, wq_b 32768 x 1024, wo_a as one
 * 8192 x 4096 (the grouped projection's bytes), wo_b 4096 x 8192, a shared expert's w1 2048 x 4096 (--chain
 * NxK,NxK,... changes it).  Step i's x is step i - 1's y (its first K floats; zeros past its n).  Every step's
 * weight is its own copy, so the chain (453 MB at 4 layers) streams from HBM.
 *
 *   floor     (weight codes + scales) / the copy bandwidth of a 1 GiB device-to-device copy, measured here
 *   us        one chain, a CUDA graph replay timed with events, median of --reps after a warm-up; the four
 *             variants alternate round by round
 *   %floor    floor / us
 *   vs rowdot the variant's time against the backend's row-dots in the same rounds
 * Then each step's time in chain.cu's three modes (the latest block's globaltimer at the end of the step, mean
 * of --reps launches), and block 0's way through a step in the persistent ones (seeing the step before done,
 * staging x, its sums, its signal).  Checks: chain.cu's modes give the same bits and match double sums of the
 * same chain (max error relative to max |y| of each step, below 1e-5 or the run fails); the row-dots act_quant
 * their x as the backend does (official semantics): their first step's error is printed, not held.
 *
 * Usage: bench_gpu_chain [--layers L] [--chain NxK,...] [--reps R]
 * Exits 77 with "SKIPPED" where there is no CUDA device. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/chain.h"
#include "backend/cuda/cuda_internal.h"
#include "model/dtype.h"

#define BENCH_NAME "bench_gpu_chain"
#include "backend/cuda/bench_util.h"

#define MAXS 64

typedef struct {
    int n, K;
} shape;

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gpu_chain [--layers L] [--chain NxK,NxK,...] [--reps R]\n"
               "  --layers L   repeat the chain L times (default 4)\n"
               "  --chain      the steps of one repeat, rows x columns of FP8 weights (default one V4-Flash layer's\n"
               "               critical row-dots: 1024x4096,32768x1024,8192x4096,4096x8192,2048x4096); K a multiple\n"
               "               of 512, at most %d\n"
               "  --reps R     timed rounds (default 21)\n",
            BCU_CHAIN_KMAX);
}

static int parse_chain(const char *s, shape *out, int max)
{
    int n = 0;
    while (*s) {
        char *e;
        const long a = strtol(s, &e, 10);
        if (e == s || *e != 'x') return -1;
        const long b = strtol(e + 1, &e, 10);
        if (a <= 0 || b <= 0 || a > (1 << 20) || b > BCU_CHAIN_KMAX || b % 512 || n == max) return -1;
        out[n++] = (shape){(int)a, (int)b};
        if (*e == ',') e++;
        else if (*e) return -1;
        s = e;
    }
    return n;
}

/* e4m3 codes with exponent fields 5..8 (|w| in [0.25, 3.75]) and either sign: no NaN, sums that neither grow nor
 * vanish along the chain with the scale below */
static uint8_t rnd_code(void)
{
    const uint32_t r = rnd();
    return (uint8_t)(((r & 1u) << 7) | ((5u + ((r >> 1) & 3u)) << 3) | ((r >> 3) & 7u));
}

typedef struct {
    shape sh;
    uint8_t *hw, *hs;  /* host codes and scales */
    void *dw, *ds;     /* device */
    float *dy;         /* y of this step (chain.cu) */
    float *dyr;        /* y of this step (row-dots) */
    size_t ylen;       /* floats allocated for y: max(n, the next K) */
} step;

static double max_rel(const float *a, const double *ref, int n)
{
    double m = 0.0, e = 0.0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(ref[i]));
    for (int i = 0; i < n; i++) e = fmax(e, fabs((double)a[i] - ref[i]));
    return m > 0 ? e / m : e;
}

int main(int argc, char **argv)
{
    int layers = 4, reps = 21;
    shape chain[MAXS] = {{1024, 4096}, {32768, 1024}, {8192, 4096}, {4096, 8192}, {2048, 4096}};
    int nc = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            layers = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--chain") && i + 1 < argc) {
            if ((nc = parse_chain(argv[++i], chain, MAXS)) <= 0) {
                fprintf(stderr, "bench_gpu_chain: bad --chain '%s' (NxK,... with K a multiple of 512, <= %d)\n",
                        argv[i], BCU_CHAIN_KMAX);
                return 2;
            }
        } else {
            fprintf(stderr, "bench_gpu_chain: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (layers < 1 || layers * nc > MAXS || reps < 1 || reps > 999) {
        fprintf(stderr, "bench_gpu_chain: --layers x steps must be 1..%d and --reps 1..999\n", MAXS);
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    const int ns = layers * nc;
    step st[MAXS];
    memset(st, 0, sizeof st);
    int kmax = 0;
    for (int i = 0; i < ns; i++) kmax = chain[i % nc].K > kmax ? chain[i % nc].K : kmax;
    double bytes = 0.0;
    fprintf(stderr, "bench_gpu_chain: %d steps, making weights\n", ns);
    for (int i = 0; i < ns; i++) {
        step *s = &st[i];
        s->sh = chain[i % nc];
        const size_t nb = (size_t)s->sh.n * s->sh.K, nsc = (size_t)((s->sh.n + 127) / 128) * (s->sh.K / 128);
        s->hw = malloc(nb);
        s->hs = malloc(nsc);
        if (!s->hw || !s->hs) {
            fprintf(stderr, "bench_gpu_chain: out of host memory\n");
            return 1;
        }
        for (size_t k = 0; k < nb; k++) s->hw[k] = rnd_code();
        /* 2^-round(log2 sqrt(3 K)): |y| ~ |x| along the chain */
        const int sh = (int)lround(log2(sqrt(3.0 * s->sh.K)));
        for (size_t k = 0; k < nsc; k++) s->hs[k] = (uint8_t)(127 - sh - (int)(rnd() % 2u));
        CK(cudaMalloc(&s->dw, nb));
        CK(cudaMalloc(&s->ds, nsc));
        CK(cudaMemcpy(s->dw, s->hw, nb, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(s->ds, s->hs, nsc, cudaMemcpyHostToDevice));
        const int nextk = chain[(i + 1) % nc].K;
        s->ylen = (size_t)(s->sh.n > nextk ? s->sh.n : nextk);
        CK(cudaMalloc((void **)&s->dy, s->ylen * 4));
        CK(cudaMalloc((void **)&s->dyr, s->ylen * 4));
        CK(cudaMemset(s->dy, 0, s->ylen * 4));
        CK(cudaMemset(s->dyr, 0, s->ylen * 4));
        bytes += (double)nb + (double)nsc;
    }
    float *x0 = malloc((size_t)kmax * 4), *dx0;
    for (int k = 0; k < kmax; k++) x0[k] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
    CK(cudaMalloc((void **)&dx0, (size_t)kmax * 4));
    CK(cudaMemcpy(dx0, x0, (size_t)kmax * 4, cudaMemcpyHostToDevice));

    /* chain.cu */
    bcu_chain_step cs[MAXS];
    for (int i = 0; i < ns; i++)
        cs[i] = (bcu_chain_step){st[i].dw, st[i].ds, i ? st[i - 1].dy : dx0, st[i].dy, st[i].sh.n, st[i].sh.K};
    bcu_chain *ch;
    CK(bcu_chain_create(cs, ns, &ch));
    /* the backend's row-dots: x act_quant'd in the kernel where it can (official semantics' FP8 linears) */
    bcu_rowdot_args ra[MAXS];
    for (int i = 0; i < ns; i++) {
        bcu_rowdot_args *a = &ra[i];
        memset(a, 0, sizeof *a);
        a->fmt = BCU_RW_FP8;
        a->sc_dtype = BCU_SC_E8M0;
        a->wrows = st[i].sh.n;
        a->wcols = st[i].sh.K;
        a->block = 128;
        a->n = st[i].sh.n;
        a->K = st[i].sh.K;
        a->x = i ? st[i - 1].dyr : dx0;
        a->T = 1;
        a->y = st[i].dyr;
        a->w = st[i].dw;
        a->scale = st[i].ds;
        a->xq = 2;
        if (!bcu_rowdot_aq_ok(a)) a->xq = 0;
    }

    cudaStream_t sm;
    CK(cudaStreamCreateWithFlags(&sm, cudaStreamNonBlocking));
    enum { NV = 4 };
    cudaGraphExec_t gx[NV];
    const char *name[NV] = {"rowdot (backend)", "chain, a launch a step", "chain, persistent, a counter a step",
                            "chain, persistent, a flag a block"};
    for (int v = 0; v < NV; v++) {
        /* one eager run first: module loading and the kernels' attributes outside the capture */
        if (v == 0)
            for (int i = 0; i < ns; i++) CK(bcu_rowdot(&ra[i], sm));
        else
            CK(bcu_chain_launch(ch, v - 1, sm));
        CK(cudaStreamSynchronize(sm));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(sm, cudaStreamCaptureModeThreadLocal));
        if (v == 0)
            for (int i = 0; i < ns; i++) CK(bcu_rowdot(&ra[i], sm));
        else
            CK(bcu_chain_launch(ch, v - 1, sm));
        CK(cudaStreamEndCapture(sm, &g));
        CK(cudaGraphInstantiate(&gx[v], g, 0));
        CK(cudaGraphDestroy(g));
    }

    const double bw = copy_bandwidth();
    const double floor_us = bytes / bw * 1e6;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double *tv[NV];
    for (int v = 0; v < NV; v++) tv[v] = malloc((size_t)reps * sizeof(double));
    for (int r = -2; r < reps; r++)
        for (int v = 0; v < NV; v++) {
            CK(cudaEventRecord(e0, sm));
            CK(cudaGraphLaunch(gx[v], sm));
            CK(cudaEventRecord(e1, sm));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 0) tv[v][r] = ms * 1e3;
        }
    double med[NV];
    for (int v = 0; v < NV; v++) med[v] = median(tv[v], reps);

    /* each step's time in the two modes (after the timed rounds: the clocks are warm) */
    double *stime[3];
    for (int m = 0; m < 3; m++) {
        stime[m] = calloc((size_t)ns, sizeof(double));
        double *one = malloc((size_t)ns * sizeof(double));
        for (int r = 0; r < reps; r++) {
            CK(cudaGraphLaunch(gx[1 + m], sm));
            CK(bcu_chain_times(ch, one));
            for (int i = 0; i < ns; i++) stime[m][i] += one[i] / reps;
        }
        free(one);
    }

    /* block 0's path through each step of the persistent modes (mean of --reps launches; the flags' mode last) */
    double (*hop)[2][4] = calloc((size_t)ns, sizeof *hop), (*one4)[4] = malloc((size_t)ns * sizeof *one4);
    for (int m = 0; m < 2; m++)
        for (int r = 0; r < reps; r++) {
            CK(cudaGraphLaunch(gx[2 + m], sm));
            CK(bcu_chain_hops(ch, one4));
            for (int i = 0; i < ns; i++)
                for (int k = 0; k < 4; k++) hop[i][m][k] += one4[i][k] / reps;
        }
    free(one4);

    /* checks: the modes' bits (the flags' mode ran last), then both against the host */
    float **ys = malloc((size_t)ns * sizeof *ys);
    for (int i = 0; i < ns; i++) {
        ys[i] = malloc(st[i].ylen * 4);
        CK(cudaMemcpy(ys[i], st[i].dy, st[i].ylen * 4, cudaMemcpyDeviceToHost));
    }
    CK(cudaGraphLaunch(gx[1], sm));
    CK(cudaStreamSynchronize(sm));
    size_t differ = 0;
    for (int i = 0; i < ns; i++) {
        float *y1 = malloc(st[i].ylen * 4);
        CK(cudaMemcpy(y1, st[i].dy, st[i].ylen * 4, cudaMemcpyDeviceToHost));
        differ += memcmp(y1, ys[i], (size_t)st[i].sh.n * 4) != 0;
        free(y1);
    }
    /* the host's sums in double, each step on the device's own x (the y of the step before), so that one step's
     * rounding does not carry into the next step's error */
    double err_chain = 0.0, err_row = 0.0;
    float lut[256];
    for (int c = 0; c < 256; c++) lut[c] = md_e4m3_to_f32((uint8_t)c);
    for (int i = 0; i < ns; i++) {
        const int n = st[i].sh.n, K = st[i].sh.K, nsb = K / 128;
        const float *xin = i ? ys[i - 1] : x0;
        const int xlen = i ? (int)st[i - 1].ylen : kmax;
        double *yr = malloc((size_t)n * 8);
        for (int o = 0; o < n; o++) {
            const uint8_t *w = st[i].hw + (size_t)o * K;
            double acc = 0.0;
            for (int cb = 0; cb < nsb; cb++) {
                double blk = 0.0;
                for (int c = 128 * cb; c < 128 * cb + 128 && c < xlen; c++) blk += (double)lut[w[c]] * xin[c];
                acc += blk * (double)md_ue8m0_to_f32(st[i].hs[(o / 128) * nsb + cb]);
            }
            yr[o] = acc;
        }
        const double e = max_rel(ys[i], yr, n);
        err_chain = e > err_chain ? e : err_chain;
        if (i == 0) { /* the row-dots' chain has its own x from step 1 on: step 0 alone, whose x is the input */
            float *yrow = malloc((size_t)n * 4);
            CK(cudaMemcpy(yrow, st[i].dyr, (size_t)n * 4, cudaMemcpyDeviceToHost));
            err_row = max_rel(yrow, yr, n);
            free(yrow);
        }
        free(yr);
    }

    int dev = 0;
    struct cudaDeviceProp pr;
    CK(cudaGetDevice(&dev));
    CK(cudaGetDeviceProperties(&pr, dev));
    printf("bench_gpu_chain: %s, %d SMs, copy bandwidth %.0f GB/s; %d steps (%d x %d), %.1f MB of weights, floor "
           "%.1f us (%.1f a repeat); %d rounds\n\n",
           pr.name, pr.multiProcessorCount, bw / 1e9, ns, layers, nc, bytes / 1e6, floor_us, floor_us / layers, reps);
    printf("| variant | us a chain | us a repeat | %% of floor | vs rowdot |\n| --- | --- | --- | --- | --- |\n");
    for (int v = 0; v < NV; v++)
        printf("| %s | %.1f | %.1f | %.1f%% | %.2fx |\n", name[v], med[v], med[v] / layers, 100.0 * floor_us / med[v],
               med[0] / med[v]);
    printf("\n| step | n x K | MB | floor us | a launch a step us | persistent, counter us | persistent, flags us |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    for (int i = 0; i < ns; i++) {
        const double b = (double)st[i].sh.n * st[i].sh.K * (1.0 + 1.0 / 16384.0);
        printf("| %d | %dx%d | %.1f | %.2f | %.2f | %.2f | %.2f |\n", i, st[i].sh.n, st[i].sh.K, b / 1e6, b / bw * 1e6,
               stime[0][i], stime[1][i], stime[2][i]);
    }
    for (int m = 0; m < 2 && ns > 1; m++) {
        double hm[4] = {0, 0, 0, 0};
        for (int i = 1; i < ns; i++)
            for (int k = 0; k < 4; k++) hm[k] += hop[i][m][k] / (ns - 1);
        printf("%spersistent (%s), block 0's path through a step (mean of steps 1..%d, us): sees the step before done "
               "%.2f, stages x %.2f, sums its rows %.2f, signals %.2f; the step %.2f\n",
               m ? "" : "\n", m ? "flags" : "counter", ns - 1, hm[0], hm[1], hm[2], hm[3], (med[2 + m] / ns));
    }
    printf("\nchecks: the chain's persistent (flags) and launch-a-step y differ in %zu of %d steps (bits); chain vs the host's double sums %.2e "
           "(max over steps, relative to max |y|); row-dots (x act_quant'd) vs the host, step 0: %.2e\n",
           differ, ns, err_chain, err_row);
    const int ok = differ == 0 && err_chain < 1e-5;
    if (!ok) printf("bench_gpu_chain: CHECK FAILED\n");
    return ok ? 0 : 1;
}
