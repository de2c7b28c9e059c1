/* bench_linear.c - the CUDA backend's be_linear, timed on the GPU, beside the
 * bandwidth floor (tools/gpu_check.sh runs it; it belongs in bench/ once the
 * CUDA backend leaves its foundation stage).
 *
 * Ceilings first: a device-to-device copy of 1 GiB (bytes read + written per
 * second) is the bandwidth the floors use.  Then, per case (shape, weight
 * format, batch T, math mode):
 *   op us      the whole be_linear on host pointers (copy x in, GEMM, copy y
 *              out, synchronize): what the graph pays today, wall clock;
 *   dev us     bcu_linear_dev on device pointers (the kernels alone, timed
 *              with CUDA events over 20 calls), rotating over enough weight
 *              copies that they do not sit in the 50 MB L2;
 *   GB/s       (weight + x + y bytes) / dev time, and % of the copy bandwidth:
 *              decode GEMMs are bandwidth-bound, so this is the roofline %;
 *   TFLOP/s    2*rows*cols*T / dev time (bf16x3 does 3x these FLOPs).
 * Medians of 15 repetitions (fewer calls per repetition at T >= 256).  The
 * host round trip is not timed where x and y exceed 64 MB ("-").
 *
 * A second table times bcu_rowdot itself on device copies of FP8 / FP4
 * weights, its simple kernel against its mma kernel (the one be_linear
 * uses), at the V4-Flash shapes; the simple kernel only up to T = 64.
 *
 * A decode table (T = 1, 2, 5) times the mma kernel's two forms for T <= 5,
 * the decode kernel (staged x, no barrier per chunk) against rowmma with one
 * m16 tile, at every V4-Flash FP8 decode shape, and the grouped wo_a as
 * cuda.cu runs it (8 strided calls) beside the same bytes in one call.
 *
 * An act_quant table (T = 1 .. 64, x holding e4m3 values times powers of two,
 * as official semantics give the FP8 GEMMs): what bcu_rowdot ran before on
 * such x (three bf16 planes: the decode kernel to T = 5, rowmma above)
 * against the decode kernel on f16 codes (bcu_rowdot_args.xq), with the
 * largest difference between the two (0: the same bits).
 *
 * BENCH_LINEAR_ONLY=decode runs the decode and act_quant tables alone; BENCH_LINEAR_SHAPE=S only their shapes whose
 * label holds S (e.g. "wq_b": one shape for a profiler); BENCH_LINEAR_GEMV=1 forces the GEMV kernel in the act_quant
 * table's auto columns wherever it can run.  BENCH_LINEAR_L2=1 times every call on
 * one copy of the weight (what a GEMV takes when its weight is already in L2).
 *
 * A third table is prefill on FP8 weights (T = 512 .. 16384), device
 * pointers: bcu_rowdot as be_linear runs it today, against expanding the
 * weight to a transient bf16 copy (bcu_dequant_bf16, timed alone too, with
 * its % of the copy bandwidth) and one cuBLAS bf16 x bf16 -> fp32 GEMM, the
 * activations as three bf16 planes and bcu_sum3 (what core() in cuda.cu does
 * for dense bf16 weights in bf16x3 mode) or as one plane (bf16 mode).
 * TFLOP/s count the useful 2*T*rows*cols; % peak is of the square cuBLAS
 * bf16 GEMM (gemm_peak); diff is max |y - y_rowdot| / max |y_rowdot| over
 * the first 64 tokens, a check of the wiring. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_internal.h"

#define BENCH_NAME "bench_cuda_linear"
#define BENCH_WITH_CUBLAS
#include "backend/cuda/bench_util.h"

#define REPS 15
#define INNER 20






typedef struct {
    const char *label;
    int64_t rows, cols;
    be_wfmt fmt;
} shape;

/* a random weight of the format; copies share the contents, not the address */
static void make_weight(const shape *s, be_weight *w, void **data, void **scale)
{
    size_t n = (size_t)(s->rows * s->cols), bytes = 0, sbytes = 0;
    memset(w, 0, sizeof *w);
    w->fmt = s->fmt;
    w->rows = s->rows;
    w->cols = s->cols;
    if (s->fmt == BE_W_DENSE) {
        w->dtype = MD_BF16;
        bytes = n * 2;
    } else if (s->fmt == BE_W_FP8) {
        w->dtype = MD_F8_E4M3;
        w->block = 128;
        w->scale_dtype = MD_F8_E8M0;
        bytes = n;
        sbytes = (size_t)(((s->rows + 127) / 128) * ((s->cols + 127) / 128));
    } else {
        w->dtype = MD_U8;
        w->block = 32;
        w->scale_dtype = MD_F8_E8M0;
        bytes = n / 2;
        sbytes = (size_t)(s->rows * (s->cols / 32));
    }
    uint8_t *d = malloc(bytes);
    if (s->fmt == BE_W_DENSE)
        for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = md_f32_to_bf16((float)(rnd() >> 8) / 8388608.0f - 1.0f);
    else
        for (size_t i = 0; i < bytes; i++) {
            uint8_t b = (uint8_t)rnd();
            if (s->fmt == BE_W_FP8 && (b & 0x7f) == 0x7f) b ^= 1;
            d[i] = b;
        }
    uint8_t *sc = NULL;
    if (sbytes) {
        sc = malloc(sbytes);
        for (size_t i = 0; i < sbytes; i++) sc[i] = (uint8_t)(120 + rnd() % 8);
    }
    w->data = d;
    w->scale = sc;
    *data = d;
    *scale = sc;
}

static size_t wbytes(const be_weight *w)
{
    size_t n = (size_t)(w->rows * w->cols);
    if (w->fmt == BE_W_DENSE) return n * 2;
    if (w->fmt == BE_W_FP8) return n + (size_t)(((w->rows + 127) / 128) * ((w->cols + 127) / 128));
    return n / 2 + (size_t)(w->rows * (w->cols / 32));
}

static void run_case(be_backend *be, const shape *s, size_t T, double bw)
{
    be_weight w0;
    void *d0, *s0;
    make_weight(s, &w0, &d0, &s0);
    const size_t wb = wbytes(&w0);
    /* enough copies to cover 256 MB, so the timed loop streams from HBM */
    int ncopy = (int)((256u << 20) / wb) + 1;
    if (ncopy > 64) ncopy = 64;
    const char *l2 = getenv("BENCH_LINEAR_L2");
    if (l2 && *l2 && atoi(l2)) ncopy = 1; /* one copy: up to ~40 MB it stays in L2 between calls */
    be_weight *ws = calloc((size_t)ncopy, sizeof *ws);
    void **bufs = calloc((size_t)ncopy * 2, sizeof *bufs);
    size_t db = s->fmt == BE_W_DENSE ? (size_t)(s->rows * s->cols) * 2
                                     : s->fmt == BE_W_FP8 ? (size_t)(s->rows * s->cols) : (size_t)(s->rows * s->cols) / 2;
    size_t sb = wb - db;
    for (int k = 0; k < ncopy; k++) {
        ws[k] = w0;
        bufs[2 * k] = malloc(db);
        memcpy(bufs[2 * k], d0, db);
        ws[k].data = bufs[2 * k];
        if (sb) {
            bufs[2 * k + 1] = malloc(sb);
            memcpy(bufs[2 * k + 1], s0, sb);
            ws[k].scale = bufs[2 * k + 1];
        }
    }
    /* the host round trip is timed only where x and y are small enough to copy 300 times */
    const int host = 4.0 * (double)T * (double)(s->rows + s->cols) <= 64.0 * 1024 * 1024;
    const size_t hT = host ? T : 1;
    const int inner = T >= 1024 ? 2 : T >= 256 ? 5 : INNER;
    float *x = malloc(T * (size_t)s->cols * sizeof *x), *y = malloc(hT * (size_t)s->rows * sizeof *y);
    for (size_t i = 0; i < T * (size_t)s->cols; i++) x[i] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
    float *dx, *dy;
    CK(cudaMalloc((void **)&dx, T * (size_t)s->cols * 4));
    CK(cudaMalloc((void **)&dy, T * (size_t)s->rows * 4));
    CK(cudaMemcpy(dx, x, T * (size_t)s->cols * 4, cudaMemcpyHostToDevice));
    /* upload every copy, warm up cuBLAS */
    for (int k = 0; k < ncopy; k++) be->ops->linear(be, y, x, hT, &ws[k]);
    if (be_cuda_error(be)) {
        fprintf(stderr, "bench_cuda_linear: %s\n", be_cuda_error(be));
        exit(1);
    }
    double top[REPS], tdev[REPS];
    for (int r = 0; r < REPS && host; r++) {
        double t0 = bench_now();
        for (int i = 0; i < INNER; i++) be->ops->linear(be, y, x, T, &ws[(r * INNER + i) % ncopy]);
        top[r] = (bench_now() - t0) / INNER;
    }
    cudaStream_t st = bcu_stream(be);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int r = -1; r < REPS; r++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < inner; i++)
            if (bcu_linear_dev(be, dy, dx, T, &ws[((r + 1) * inner + i) % ncopy])) {
                fprintf(stderr, "bench_cuda_linear: %s\n", be_cuda_error(be));
                exit(1);
            }
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) tdev[r] = ms * 1e-3 / inner;
    }
    double to = host ? median(top, REPS) : 0, td = median(tdev, REPS);
    double bytes = (double)wb + 4.0 * (double)T * (double)(s->rows + s->cols);
    double gbs = bytes / td / 1e9;
    double tf = 2.0 * (double)s->rows * (double)s->cols * (double)T / td / 1e12;
    const char *fmt = s->fmt == BE_W_DENSE ? "bf16" : s->fmt == BE_W_FP8 ? "fp8" : "fp4";
    char ops[16];
    if (host) snprintf(ops, sizeof ops, "%9.1f", to * 1e6);
    else snprintf(ops, sizeof ops, "%9s", "-");
    printf("| %-16s | %5lldx%-5lld | %-4s | %-6s | %4zu | %s | %9.2f | %7.0f | %5.1f%% | %7.2f |\n", s->label,
           (long long)s->rows, (long long)s->cols, fmt, s->fmt == BE_W_DENSE ? bcu_math_name(bcu_get_math(be)) : "-", T,
           ops, td * 1e6, gbs, 100.0 * bytes / td / bw, tf);
    fflush(stdout);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    for (int k = 0; k < 2 * ncopy; k++) free(bufs[k]);
    free(bufs);
    free(ws);
    free(x);
    free(y);
    free(d0);
    free(s0);
}

/* seconds per call of fn(ctx, k), median of REPS runs of `inner` calls (one untimed run first), k rotating over
 * ncopy weight copies so that they come from HBM */
/* the row-dot arguments for the whole weight of shape s (codes dw, scales ds, ue8m0 blocks of block) on dx [T, cols]
 * into dy [T, rows] */
static bcu_rowdot_args bench_args(const shape *s, int block, const void *dw, const void *ds, const float *dx,
                                  size_t T, float *dy)
{
    bcu_rowdot_args a;
    memset(&a, 0, sizeof a);
    a.fmt = s->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4;
    a.sc_dtype = BCU_SC_E8M0;
    a.wrows = s->rows;
    a.wcols = s->cols;
    a.block = block;
    a.n = s->rows;
    a.K = s->cols;
    a.x = dx;
    a.T = (int64_t)T;
    a.y = dy;
    a.w = dw;
    a.scale = ds;
    return a;
}

static double time_calls(void (*fn)(void *ctx, int k), void *ctx, int ncopy, int inner)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double t[REPS];
    for (int r = -1; r < REPS; r++) {
        CK(cudaEventRecord(e0, 0));
        for (int i = 0; i < inner; i++) fn(ctx, ((r + 1) * inner + i) % ncopy);
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 0) t[r] = ms * 1e-3 / inner;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return median(t, REPS);
}

/* bcu_rowdot on device copies of the weight: the simple kernel vs the mma kernel */
typedef struct {
    bcu_rowdot_args a;
    void **dw, **ds;
} rowdot_ctx;

static void rd_call(void *ctx, int k)
{
    rowdot_ctx *c = ctx;
    c->a.w = c->dw[k];
    c->a.scale = c->ds[k];
    CK(bcu_rowdot(&c->a, 0));
}

static double time_rowdot(bcu_rowdot_args a, void **dw, void **ds, int ncopy, int path, int inner)
{
    rowdot_ctx c = {a, dw, ds};
    c.a.path = path;
    return time_calls(rd_call, &c, ncopy, inner);
}

/* the read probe over a weight copy's codes */
typedef struct {
    void **dw;
    size_t bytes;
    uint32_t *sink;
    int per_sm;    /* 0: the rows pattern */
    int64_t rows; /* the rows pattern's matrix */
} read_ctx;

static void read_call(void *ctx, int k)
{
    read_ctx *c = ctx;
    if (c->per_sm)
        CK(bcu_read_probe(c->dw[k], c->bytes, c->sink, c->per_sm, 0));
    else
        CK(bcu_read_probe_rows(c->dw[k], c->rows, (int64_t)(c->bytes / (size_t)c->rows), c->sink, 0));
}

/* the grouped wo_a as grouped_locked in cuda.cu runs it: one bcu_rowdot per group, strided x and y */
typedef struct {
    bcu_rowdot_args a; /* group 0's */
    int groups;
    void **dw, **ds;
} grouped_ctx;

static void rd_grouped_call(void *ctx, int k)
{
    grouped_ctx *c = ctx;
    for (int g = 0; g < c->groups; g++) {
        bcu_rowdot_args a = c->a;
        a.w = c->dw[k];
        a.scale = c->ds[k];
        a.r0 = g * a.n;
        a.x += (size_t)g * (size_t)a.K;
        a.y += (size_t)g * (size_t)a.n;
        CK(bcu_rowdot(&a, 0));
    }
}

/* enough device copies of a quantised weight (codes in dw, scales in ds, at most 64) that a timing loop over
 * them reads ≥ 256 MB, so the weights come from HBM and not from L2 */
static int device_copies(const shape *s, const be_weight *w0, const void *d0, const void *s0, void **dw, void **ds)
{
    const size_t wb = wbytes(w0);
    const size_t db = s->fmt == BE_W_FP8 ? (size_t)(s->rows * s->cols) : (size_t)(s->rows * s->cols) / 2, sb = wb - db;
    int ncopy = (int)((256u << 20) / wb) + 1;
    if (ncopy > 64) ncopy = 64;
    const char *l2 = getenv("BENCH_LINEAR_L2");
    if (l2 && *l2 && atoi(l2)) ncopy = 1; /* one copy: up to ~40 MB it stays in L2 between calls */
    for (int k = 0; k < ncopy; k++) {
        CK(cudaMalloc(&dw[k], db));
        CK(cudaMalloc(&ds[k], sb));
        CK(cudaMemcpy(dw[k], d0, db, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ds[k], s0, sb, cudaMemcpyHostToDevice));
    }
    return ncopy;
}

static void free_copies(void **dw, void **ds, int ncopy)
{
    for (int k = 0; k < ncopy; k++) {
        CK(cudaFree(dw[k]));
        CK(cudaFree(ds[k]));
    }
}

/* what a run allocated: the weight copies, x and y on the device, x and the weight on the host */
static void run_free(void **dw, void **ds, int ncopy, float *dx, float *dy, float *x, void *d0, void *s0)
{
    free_copies(dw, ds, ncopy);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    free(x);
    free(d0);
    free(s0);
}

static void run_ab(const shape *s, size_t T, double bw)
{
    be_weight w0;
    void *d0, *s0;
    make_weight(s, &w0, &d0, &s0);
    void *dw[64], *ds[64];
    const int ncopy = device_copies(s, &w0, d0, s0, dw, ds);
    const size_t wb = wbytes(&w0);
    float *x = malloc(T * (size_t)s->cols * sizeof *x), *dx, *dy;
    for (size_t i = 0; i < T * (size_t)s->cols; i++) x[i] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
    CK(cudaMalloc((void **)&dx, T * (size_t)s->cols * 4));
    CK(cudaMalloc((void **)&dy, T * (size_t)s->rows * 4));
    CK(cudaMemcpy(dx, x, T * (size_t)s->cols * 4, cudaMemcpyHostToDevice));
    bcu_rowdot_args a = bench_args(s, w0.block, dw[0], ds[0], dx, T, dy);
    const int inner = T >= 1024 ? 2 : T >= 256 ? 5 : INNER;
    const double bytes = (double)wb + 4.0 * (double)T * (double)(s->rows + s->cols);
    const double flop = 2.0 * (double)s->rows * (double)s->cols * (double)T;
    const double tm = time_rowdot(a, dw, ds, ncopy, BCU_ROWDOT_MMA, inner);
    char simple[64] = "        - |       - |";
    if (T <= 64) {
        const double ts = time_rowdot(a, dw, ds, ncopy, BCU_ROWDOT_SIMPLE, inner);
        snprintf(simple, sizeof simple, "%9.2f | %6.1f%% |", ts * 1e6, 100.0 * bytes / ts / bw);
    }
    printf("| %-16s | %5lldx%-5lld | %-4s | %4zu | %s %9.2f | %6.1f%% | %7.2f | %s |\n", s->label, (long long)s->rows,
           (long long)s->cols, s->fmt == BE_W_FP8 ? "fp8" : "fp4", T, simple, tm * 1e6, 100.0 * bytes / tm / bw,
           flop / tm / 1e12, bcu_rowdot_path(&a) == BCU_ROWDOT_MMA ? "mma" : "simple");
    fflush(stdout);
    run_free(dw, ds, ncopy, dx, dy, x, d0, s0);
}

/* the act_quant table: bf16 planes (xq = 0, automatic tile) vs f16 codes (xq = 1) on x of e4m3 values times 2^-6 */
static void run_xq(const shape *s, double bw)
{
    be_weight w0;
    void *d0, *s0;
    make_weight(s, &w0, &d0, &s0);
    void *dw[64], *ds[64];
    const int ncopy = device_copies(s, &w0, d0, s0, dw, ds);
    const size_t wb = wbytes(&w0), cols = (size_t)s->cols, rows = (size_t)s->rows, TM = 64;
    float *x = malloc(TM * cols * sizeof *x), *dx, *dy;
    for (size_t i = 0; i < TM * cols; i++) x[i] = (float)((int)(rnd() % 31) - 15) * 0.015625f; /* e4m3 x 2^-6 */
    CK(cudaMalloc((void **)&dx, TM * cols * 4));
    CK(cudaMalloc((void **)&dy, TM * rows * 4));
    CK(cudaMemcpy(dx, x, TM * cols * 4, cudaMemcpyHostToDevice));
    float *yv[4];
    for (int v = 0; v < 4; v++) yv[v] = malloc(TM * rows * 4);
    bcu_rowdot_args a = bench_args(s, w0.block, dw[0], ds[0], dx, 1, dy);
    a.path = BCU_ROWDOT_MMA;
    const size_t Ts[] = {1, 2, 5, 8, 16, 32, 64};
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
        a.T = (int64_t)Ts[t];
        const double bytes = (double)wb + 4.0 * (double)Ts[t] * (double)(rows + cols);
        /* 0: the bf16 planes (decode kernel); 1: the decode kernel on codes; 2: the automatic tile on codes (the GEMV
         * kernel where it runs); 3: the same with act_quant in the kernel (xq = 2) */
        double tm[4];
        const char *fg = getenv("BENCH_LINEAR_GEMV"); /* 1: the auto columns force the GEMV kernel where it can run */
        for (int v = 0; v < 4; v++) {
            if (v == 3 && Ts[t] > 16) { /* xq = 2 takes at most 16 tokens */
                tm[3] = NAN;
                memcpy(yv[3], yv[2], Ts[t] * rows * 4);
                continue;
            }
            a.xq = v == 0 ? 0 : v == 3 ? 2 : 1;
            a.tile = v <= 1 ? BCU_ROWDOT_TILE_DEC : 0;
            if (v >= 2 && fg && !strcmp(fg, "1") && bcu_rowdot_gemv_ok(&a)) a.tile = BCU_ROWDOT_TILE_GEMV;
            grouped_ctx c = {a, 1, dw, ds};
            tm[v] = time_calls(rd_grouped_call, &c, ncopy, INNER);
            CK(bcu_rowdot(&a, 0));
            CK(cudaMemcpy(yv[v], dy, Ts[t] * rows * 4, cudaMemcpyDeviceToHost));
        }
        a.xq = 1;
        const int gv = bcu_rowdot_gemv_auto(&a); /* a.tile: the auto columns' */
        a.tile = 0;
        double trd = 0;
        if (t == 0) { /* the weight's codes alone, read at the best rate a plain stream gets */
            uint32_t *sink;
            CK(cudaMalloc((void **)&sink, 256 * 4));
            double tr[5];
            for (int b = 0; b < 5; b++) { /* 1, 2, 4, 8 blocks an SM: 8 .. 64 warps of 128 bytes in flight a lane;
                                           * then the GEMV kernel's pattern (16 rows x 64 bytes a warp's load pair) */
                read_ctx rc = {dw, (size_t)(rows * cols), sink, b < 4 ? 1 << b : 0, (int64_t)rows};
                tr[b] = time_calls(read_call, &rc, ncopy, INNER);
            }
            trd = tr[3];
            printf("| %-16s | %5lldx%-5lld | read | 1 / 2 / 4 blocks an SM: %.2f / %.2f / %.2f us; rows pattern %.2f us\n",
                   s->label, (long long)s->rows, (long long)s->cols, tr[0] * 1e6, tr[1] * 1e6, tr[2] * 1e6, tr[4] * 1e6);
            CK(cudaFree(sink));
        }
        double md = 0, mx = 0;
        size_t nd = 0;
        for (size_t i = 0; i < Ts[t] * rows; i++) {
            md = fmax(md, fabs((double)yv[1][i] - (double)yv[0][i]));
            mx = fmax(mx, fabs((double)yv[0][i]));
            nd += memcmp(&yv[2][i], &yv[1][i], 4) != 0;
        }
        if (t == 0)
            printf("| %-16s | %5lldx%-5lld | read | %9.2f | %6.1f%% | (codes alone: the read probe, 8 blocks an SM)\n", s->label,
                   (long long)s->rows, (long long)s->cols, trd * 1e6, 100.0 * (double)(rows * cols) / trd / bw);
        printf("| %-16s | %5lldx%-5lld | %4zu | %9.2f | %6.1f%% | %9.2f | %6.1f%% | %9.2f | %6.1f%% | %4s | %9.2f | "
               "%6.1f%% | %5.2fx | %7.1e | %6zu |\n",
               s->label, (long long)s->rows, (long long)s->cols, Ts[t], tm[0] * 1e6, 100.0 * bytes / tm[0] / bw,
               tm[1] * 1e6, 100.0 * bytes / tm[1] / bw, tm[2] * 1e6, 100.0 * bytes / tm[2] / bw, gv ? "gemv" : "dec",
               tm[3] * 1e6, 100.0 * bytes / tm[3] / bw, tm[1] / tm[2], mx > 0 ? md / mx : md, nd);
        fflush(stdout);
    }
    for (int v = 0; v < 4; v++) free(yv[v]);
    run_free(dw, ds, ncopy, dx, dy, x, d0, s0);
}

/* decode, T = 1, 2, 5 on device pointers: the decode kernel (what bcu_rowdot runs at T <= 5) against rowmma with one
 * m16 tile (BCU_ROWDOT_TILE_DEC vs tile 1: the same bits).  groups > 1: the weight's rows in that many groups of
 * rows / groups, each its own call on strided x [T, groups * cols] and y [T, rows] (the grouped wo_a); then the
 * same as one grouped launch of the decode kernel (bcu_rowdot_args.groups; only its decode-kernel column is
 * measured, the tile-1 column repeats it); then a last line times the same bytes as one plain call. */
static void run_decode(const shape *s, int groups, double bw)
{
    be_weight w0;
    void *d0, *s0;
    make_weight(s, &w0, &d0, &s0);
    void *dw[64], *ds[64];
    const int ncopy = device_copies(s, &w0, d0, s0, dw, ds);
    const size_t wb = wbytes(&w0), cols = (size_t)s->cols, rows = (size_t)s->rows;
    const size_t xcols = cols * (size_t)groups;
    float *x = malloc(32 * xcols * sizeof *x), *dx, *dy;
    for (size_t i = 0; i < 32 * xcols; i++) x[i] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
    CK(cudaMalloc((void **)&dx, 32 * xcols * 4));
    CK(cudaMalloc((void **)&dy, 32 * rows * 4));
    CK(cudaMemcpy(dx, x, 32 * xcols * 4, cudaMemcpyHostToDevice));
    bcu_rowdot_args a = bench_args(s, w0.block, dw[0], ds[0], dx, 1, dy);
    a.n = s->rows / groups;
    a.path = BCU_ROWDOT_MMA;
    if (groups > 1) {
        a.ldx = (int64_t)xcols;
        a.ldy = s->rows;
    }
    const size_t Ts[] = {1, 2, 5, 8, 16, 32}, nT = groups > 1 ? 6 : 3; /* grouped: to BCU_ROWDOT_GROUPED_T */
    for (int var = 0; var < (groups > 1 ? 3 : 1); var++) {
        char label[64];
        const int one = var == 2, grouped = var == 1;
        if (one) { /* the same bytes in one call */
            a.n = s->rows;
            a.ldx = a.ldy = 0;
            a.groups = 0;
            snprintf(label, sizeof label, "%s, 1 call", s->label);
        } else if (grouped) { /* one grouped launch */
            a.groups = groups;
            a.xg = (int64_t)cols;
            a.yg = a.n;
            snprintf(label, sizeof label, "%s, 1 grouped", s->label);
        } else if (groups > 1) snprintf(label, sizeof label, "%s, %d calls", s->label, groups);
        else snprintf(label, sizeof label, "%s", s->label);
        for (size_t t = 0; t < nT; t++) {
            a.T = (int64_t)Ts[t];
            const double bytes = (double)wb + 4.0 * (double)Ts[t] * (double)(rows + (one ? cols : xcols));
            /* 0: tile 1 (T > 5: auto); 1: the decode kernel; 2: the automatic tile (the GEMV kernel where it runs;
             * BENCH_LINEAR_GEMV=1: wherever it can) */
            double tm[3];
            float *yo[3] = {NULL, NULL, NULL};
            const char *fg = getenv("BENCH_LINEAR_GEMV");
            int gv = 0;
            for (int v = grouped ? 1 : 0; v < 3; v++) {
                a.tile = v == 2 ? 0 : v ? BCU_ROWDOT_TILE_DEC : Ts[t] > 5 ? 0 : 1; /* T > 5: what auto runs */
                if (v == 2) {
                    if (fg && !strcmp(fg, "1") && bcu_rowdot_gemv_ok(&a)) a.tile = BCU_ROWDOT_TILE_GEMV;
                    gv = bcu_rowdot_gemv_auto(&a);
                }
                grouped_ctx c = {a, one || grouped || groups == 1 ? 1 : groups, dw, ds};
                tm[v] = time_calls(rd_grouped_call, &c, ncopy, INNER);
                if (v) {
                    c.a.x = dx; /* one call on the first copy, its y kept */
                    rd_grouped_call(&c, 0);
                    yo[v] = malloc(Ts[t] * rows * 4);
                    CK(cudaMemcpy(yo[v], dy, Ts[t] * rows * 4, cudaMemcpyDeviceToHost));
                }
            }
            if (grouped) tm[0] = tm[1];
            size_t nd = 0;
            for (size_t i = 0; i < Ts[t] * rows; i++) nd += memcmp(&yo[1][i], &yo[2][i], 4) != 0;
            free(yo[1]);
            free(yo[2]);
            printf("| %-28s | %5lldx%-5lld | %-4s | %4zu | %9.2f | %6.1f%% | %9.2f | %6.1f%% | %5.2fx | %9.2f | %6.1f%% | "
                   "%4s | %6zu |\n", label, (long long)s->rows, (long long)s->cols, s->fmt == BE_W_FP8 ? "fp8" : "fp4",
                   Ts[t], tm[0] * 1e6, 100.0 * bytes / tm[0] / bw, tm[1] * 1e6, 100.0 * bytes / tm[1] / bw,
                   tm[0] / tm[1], tm[2] * 1e6, 100.0 * bytes / tm[2] / bw, gv ? "gemv" : "dec", nd);
            fflush(stdout);
        }
    }
    run_free(dw, ds, ncopy, dx, dy, x, d0, s0);
}

/* prefill on an FP8 / FP4 weight: bcu_rowdot vs bcu_dequant_bf16 + one cuBLAS bf16 GEMM */
typedef struct {
    const shape *s;
    int block;
    void **dw, **ds;
    int ncopy;
    size_t T;
    const float *dx;
    float *dy;
    uint16_t *wb;  /* the transient bf16 weight [rows, cols] */
    uint16_t *xb;  /* the activations' bf16 planes [planes * T, cols] */
    float *part;   /* bf16x3: the three partial products [3T, rows] */
    cublasHandle_t h;
    int planes;    /* 1 or 3 */
} prefill_ctx;

static void pf_rowdot(void *ctx, int k)
{
    prefill_ctx *c = ctx;
    bcu_rowdot_args a = bench_args(c->s, c->block, c->dw[k], c->ds[k], c->dx, c->T, c->dy);
    CK(bcu_rowdot(&a, 0));
}

static void pf_dequant(void *ctx, int k)
{
    prefill_ctx *c = ctx;
    CK(bcu_dequant_bf16(c->wb, c->s->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4, c->dw[k], c->ds[k], BCU_SC_E8M0,
                        c->s->rows, c->s->cols, c->block, 0, c->s->rows, 0));
}

/* y = x . W^T through the bf16 copy, as core() in cuda.cu runs a dense bf16 weight */
static void pf_gemm(void *ctx, int k)
{
    prefill_ctx *c = ctx;
    const int n = (int)c->s->rows, K = (int)c->s->cols, planes = c->planes;
    const float one = 1.0f, zero = 0.0f;
    pf_dequant(c, k);
    CK(bcu_split_bf16(c->xb, c->dx, c->T * (size_t)K, planes, 0));
    cublasStatus_t st = cublasGemmEx(c->h, CUBLAS_OP_T, CUBLAS_OP_N, n, (int)c->T * planes, K, &one, c->wb,
                                     CUDA_R_16BF, K, c->xb, CUDA_R_16BF, K, &zero, planes == 1 ? c->dy : c->part,
                                     CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cuda_linear: cublasGemmEx: %s\n", cublasGetStatusString(st));
        exit(1);
    }
    if (planes == 3) CK(bcu_sum3(c->dy, c->part, c->T * (size_t)n, 0));
}

/* seconds per call of a prefill variant, median of REPS, rotating over the weight copies */
static double time_prefill(void (*fn)(void *, int), prefill_ctx *c, int inner)
{
    return time_calls(fn, c, c->ncopy, inner);
}

/* the first min(T, 64) rows of y after fn */
static void prefill_rows(void (*fn)(void *, int), prefill_ctx *c, float *out, size_t nt)
{
    fn(c, 0);
    CK(cudaMemcpy(out, c->dy, nt * (size_t)c->s->rows * sizeof *out, cudaMemcpyDeviceToHost));
}

static double max_rel_diff(const float *y, const float *ref, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)y[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return m > 0 ? d / m : d;
}

static void run_prefill(const shape *s, size_t T, double bw, double peak, cublasHandle_t h)
{
    be_weight w0;
    void *d0, *s0;
    make_weight(s, &w0, &d0, &s0);
    void *dw[64], *ds[64];
    const int ncopy = device_copies(s, &w0, d0, s0, dw, ds);
    const size_t wb = wbytes(&w0);
    const size_t rows = (size_t)s->rows, cols = (size_t)s->cols;
    float *x = malloc(T * cols * sizeof *x);
    for (size_t i = 0; i < T * cols; i++) x[i] = (float)(rnd() >> 8) / 8388608.0f - 1.0f;
    prefill_ctx c = {.s = s, .block = w0.block, .dw = dw, .ds = ds, .ncopy = ncopy, .T = T, .h = h};
    float *dx, *dy;
    CK(cudaMalloc((void **)&dx, T * cols * 4));
    CK(cudaMalloc((void **)&dy, T * rows * 4));
    CK(cudaMalloc((void **)&c.wb, rows * cols * 2));
    CK(cudaMalloc((void **)&c.xb, 3 * T * cols * 2));
    CK(cudaMalloc((void **)&c.part, 3 * T * rows * 4));
    CK(cudaMemcpy(dx, x, T * cols * 4, cudaMemcpyHostToDevice));
    c.dx = dx;
    c.dy = dy;
    const int inner = T >= 1024 ? 2 : 5;
    const double flop = 2.0 * (double)rows * (double)cols * (double)T;
    const double tdeq = time_prefill(pf_dequant, &c, inner);
    const double trd = time_prefill(pf_rowdot, &c, inner);
    c.planes = 3;
    const double tx3 = time_prefill(pf_gemm, &c, inner);
    c.planes = 1;
    const double tx1 = time_prefill(pf_gemm, &c, inner);
    /* the wiring: each result against the row-dot's on the first tokens */
    const size_t nt = T < 64 ? T : 64;
    float *yr = malloc(nt * rows * sizeof *yr), *y3 = malloc(nt * rows * sizeof *y3);
    float *y1 = malloc(nt * rows * sizeof *y1);
    prefill_rows(pf_rowdot, &c, yr, nt);
    c.planes = 3;
    prefill_rows(pf_gemm, &c, y3, nt);
    c.planes = 1;
    prefill_rows(pf_gemm, &c, y1, nt);
    const double deq_bytes = (double)wb + 2.0 * (double)rows * (double)cols;
    printf("| %-16s | %5lldx%-5lld | %-4s | %5zu | %7.1f | %5.1f%% | %9.1f | %7.1f | %9.1f | %7.1f | %5.1f%% | %7.1e | "
           "%9.1f | %7.1f | %5.1f%% | %7.1e |\n",
           s->label, (long long)s->rows, (long long)s->cols, s->fmt == BE_W_FP8 ? "fp8" : "fp4", T, tdeq * 1e6,
           100.0 * deq_bytes / tdeq / bw, trd * 1e6, flop / trd / 1e12, tx3 * 1e6, flop / tx3 / 1e12,
           100.0 * flop / tx3 / peak, max_rel_diff(y3, yr, nt * rows), tx1 * 1e6, flop / tx1 / 1e12,
           100.0 * flop / tx1 / peak, max_rel_diff(y1, yr, nt * rows));
    fflush(stdout);
    free_copies(dw, ds, ncopy);
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    CK(cudaFree(c.wb));
    CK(cudaFree(c.xb));
    CK(cudaFree(c.part));
    free(x);
    free(yr);
    free(y3);
    free(y1);
    free(d0);
    free(s0);
}

static void decode_tables(double bw)
{
    /* decode: the decode kernel vs rowmma tile 1 at the V4-Flash decode shapes */
    printf("\ndecode on device pointers: bcu_rowdot's decode kernel (what it runs at T <= 5) vs rowmma tile 1 (what it "
           "ran before; the same bits; the grouped wo_a to T = 32, where the first column is the automatic tile per group), "
           "and the automatic tile (auto: the GEMV kernel where it runs, else the decode kernel; bits = outputs where it "
           "differs from the decode kernel), %% copy as above\n\n");
    printf("| case                         | rows x cols | fmt  |    T | tile 1 us | %% copy | decode us | %% copy | "
           "speedup |   auto us | %% copy | kern |   bits |\n");
    printf("|------------------------------|-------------|------|------|-----------|---------|-----------|---------|"
           "---------|-----------|--------|------|--------|\n");
    const shape dshapes[] = {{"v4 fp8 wq_b", 32768, 1024, BE_W_FP8},   {"v4 fp8 wo_b", 4096, 8192, BE_W_FP8},
                             {"v4 fp8 1024x4096", 1024, 4096, BE_W_FP8}, {"v4 fp8 512x4096", 512, 4096, BE_W_FP8},
                             {"v4 fp8 2048x4096", 2048, 4096, BE_W_FP8}, {"v4 fp8 4096x2048", 4096, 2048, BE_W_FP8},
                             {"v4 fp4 2048x4096", 2048, 4096, BE_W_FP4}};
    const char *only = getenv("BENCH_LINEAR_SHAPE"); /* a substring of the labels to run, e.g. "wq_b" */
    for (size_t i = 0; i < sizeof dshapes / sizeof dshapes[0]; i++)
        if (!only || strstr(dshapes[i].label, only)) run_decode(&dshapes[i], 1, bw);
    const shape wo_a = {"v4 fp8 wo_a", 8192, 4096, BE_W_FP8}; /* 8 groups of 1024 rows */
    if (!only || strstr(wo_a.label, only)) run_decode(&wo_a, 8, bw);
    printf("\nact_quant'd x (official semantics' FP8 GEMMs), device pointers: the decode kernel on bf16 planes (xq = 0) "
           "and on f16 codes (xq = 1), the automatic tile on codes (auto: the GEMV kernel to T = 16 where it runs, "
           "launches of 16 of it to T = 64, else the decode kernel or rowmma) and the same with act_quant in the kernel "
           "(xq = 2, to T = 16); speedup = codes / auto; diff = max "
           "|y_codes - y_planes| / max |y_planes|; bits = outputs where auto differs from the decode kernel on codes\n\n");
    printf("| case             | rows x cols |    T | planes us | %% copy |  codes us | %% copy |   auto us | %% copy | "
           "kern |  xq=2 us | %% copy | speedup |    diff |   bits |\n");
    printf("|------------------|-------------|------|-----------|--------|-----------|--------|-----------|--------|"
           "------|-----------|--------|---------|---------|--------|\n");
    for (size_t i = 0; i < 6; i++)
        if (!only || strstr(dshapes[i].label, only)) run_xq(&dshapes[i], bw);
}

int main(void)
{
    char err[256];
    be_backend *probe = bcu_create(0, 1, BCU_MATH_BF16X3, err, sizeof err);
    if (!probe) {
        printf("SKIPPED: %s\n", err);
        return 77;
    }
    printf("device: %s\n", bcu_device_name(probe));
    be_cuda_destroy(probe);
    const double bw = copy_bandwidth();
    printf("device-to-device copy: %.0f GB/s (read + write, 1 GiB, median of %d)\n\n", bw / 1e9, REPS);
    const char *only = getenv("BENCH_LINEAR_ONLY"); /* "decode": the decode and act_quant tables alone */
    if (only && !strcmp(only, "decode")) {
        decode_tables(bw);
        return 0;
    }
    printf("| case             | rows x cols | fmt  | math   |    T |     op us |    dev us |    GB/s | %% copy | TFLOP/s |\n");
    printf("|------------------|-------------|------|--------|------|-----------|-----------|---------|--------|---------|\n");
    const shape tiny[] = {{"tiny wq_a", 64, 128, BE_W_DENSE}, {"tiny head", 512, 128, BE_W_DENSE},
                          {"tiny wq_b fp8", 512, 64, BE_W_FP8}, {"tiny expert fp4", 64, 128, BE_W_FP4}};
    const shape v4[] = {{"v4 4096x1024", 4096, 1024, BE_W_DENSE}, {"v4 8192x4096", 8192, 4096, BE_W_DENSE}};
    const shape q[] = {{"v4 fp8", 8192, 4096, BE_W_FP8}, {"v4 expert fp4", 2048, 4096, BE_W_FP4},
                       {"v4 fp4 big", 8192, 4096, BE_W_FP4}};
    const shape v4q[] = {{"v4 fp8 q_a-like", 1024, 4096, BE_W_FP8},
                         {"v4 fp8 wq_b", 32768, 1024, BE_W_FP8},
                         {"v4 fp8 wo_b", 4096, 8192, BE_W_FP8},
                         {"v4 fp4 expert", 2048, 4096, BE_W_FP4}};
    const bcu_math modes[] = {BCU_MATH_BF16, BCU_MATH_BF16X3, BCU_MATH_FP32};
    const size_t Ts[] = {1, 64};
    be_backend *be = bcu_create(0, 1, BCU_MATH_BF16X3, err, sizeof err);
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++)
        for (int t = 0; t < 2; t++) run_case(be, &tiny[i], Ts[t], bw);
    be_cuda_destroy(be);
    for (int m = 0; m < 3; m++) {
        be = bcu_create(0, 1, modes[m], err, sizeof err);
        if (!be) {
            printf("bcu_create: %s\n", err);
            return 1;
        }
        for (size_t i = 0; i < sizeof v4 / sizeof v4[0]; i++)
            for (int t = 0; t < 2; t++) run_case(be, &v4[i], Ts[t], bw);
        be_cuda_destroy(be);
    }
    be = bcu_create(0, 1, BCU_MATH_BF16X3, err, sizeof err);
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        for (int t = 0; t < 2; t++) run_case(be, &q[i], Ts[t], bw);
    /* the V4-Flash FP8 / FP4 GEMMs of bcu_rowdot, decode to prefill */
    const size_t Tq[] = {1, 8, 64, 256, 4096};
    for (size_t i = 0; i < sizeof v4q / sizeof v4q[0]; i++)
        for (size_t t = 0; t < sizeof Tq / sizeof Tq[0]; t++) run_case(be, &v4q[i], Tq[t], bw);
    be_cuda_destroy(be);
    printf("\nbcu_rowdot on device pointers: the simple kernel vs the mma kernel (%% copy as above; TFLOP/s of mma)\n\n");
    printf("| case             | rows x cols | fmt  |    T | simple us | %% copy | mma us    | %% copy | TFLOP/s | auto   |\n");
    printf("|------------------|-------------|------|------|-----------|---------|-----------|--------|---------|--------|\n");
    for (size_t i = 0; i < sizeof v4q / sizeof v4q[0]; i++)
        for (size_t t = 0; t < sizeof Tq / sizeof Tq[0]; t++) run_ab(&v4q[i], Tq[t], bw);
    decode_tables(bw);
    /* prefill: the row-dot vs a transient bf16 copy and cuBLAS */
    const double peak = gemm_peak(1, 8192);
    printf("\nprefill on FP8 weights, device pointers: bcu_rowdot vs bcu_dequant_bf16 + cuBLAS bf16 GEMM "
           "(x as 3 bf16 planes + bcu_sum3, or 1 plane); cuBLAS bf16 peak (8192^3): %.0f TFLOP/s\n\n",
           peak / 1e12);
    printf("| case             | rows x cols | fmt  |     T |  deq us | %% copy | rowdot us | TFLOP/s | bf16x3 us | "
           "TFLOP/s | %% peak |    diff |   bf16 us | TFLOP/s | %% peak |    diff |\n");
    printf("|------------------|-------------|------|-------|---------|--------|-----------|---------|-----------|-"
           "--------|--------|---------|-----------|---------|--------|---------|\n");
    const shape pf[] = {{"v4 fp8 wq_b", 32768, 1024, BE_W_FP8}, {"v4 fp8", 8192, 4096, BE_W_FP8}};
    const size_t Tp[] = {512, 4096, 16384};
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cuda_linear: cublasCreate failed\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof pf / sizeof pf[0]; i++)
        for (size_t t = 0; t < sizeof Tp / sizeof Tp[0]; t++) run_prefill(&pf[i], Tp[t], bw, peak, h);
    cublasDestroy(h);
    return 0;
}
