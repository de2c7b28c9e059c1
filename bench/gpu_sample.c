/* gpu_sample.c - bench_gpu_sample: a decode step's sampled rows drawn on the GPU (src/backend/cuda/sample.cu,
 * bcu_sample) against what it replaces, measured in the same run: the rows' logits copied to the host (pinned) and
 * drawn there by the host sampler (engine/sampler.c, its certified fast paths on) over the threads the engine would
 * use (one an online CPU, up to 16).
 *
 * Rows of V = 129280 logits (DeepSeek V4's vocabulary), synthetic, as bench_sampler's:
 *   flat      uniform in [-4, 4] (a random-weight model's rows; top_p's nucleus is most of the vocabulary)
 *   body+head a Gaussian body (sd 2.5) under eight tokens 15-22 above its mean (a trained model's row)
 * Per (rows, setting, batch B): us a step on each path (median of 7), the ratio, and how many of the B tokens
 * agree (the kernel's draws against eng_sample_u01 on the same rows and uniforms; sample.cu says when they may
 * not: never in practice, a uniform within 1e-8 of a boundary).
 *
 *   bench_gpu_sample [--batches 1,16,64,256]
 * Without a GPU it prints "SKIPPED: no CUDA device" and exits 77. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/pool.h"
#include "engine/sampler.h"
#include "sample_rows.h"

#define V 129280
#define NREP 7
#define BMAX 256

cudaError_t bcu_sample(int32_t *ids, const float *x, size_t Vn, const be_draw *draws, size_t n, cudaStream_t st);


typedef struct {
    const float *rows; /* host, [B][V] */
    const eng_sampling *s;
    const be_draw *d;
    eng_sample_scratch *ws;
    int *toks;
    size_t n, nt;
} host_job;

static void host_task(void *arg, size_t t)
{
    host_job *j = arg;
    for (size_t r = t; r < j->n; r += j->nt)
        j->toks[r] = eng_sample_u01(j->rows + r * (size_t)V, V, j->s, j->d[r].u01, &j->ws[t]);
}

static int check(cudaError_t r, const char *what)
{
    if (r == cudaSuccess) return 0;
    fprintf(stderr, "bench_gpu_sample: %s: %s\n", what, cudaGetErrorString(r));
    return 1;
}

int main(int argc, char **argv)
{
    int batches[8] = {1, 16, 64, 256}, nb = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
            nb = 0;
            for (char *p = argv[++i]; *p && nb < 8;) {
                const long b = strtol(p, &p, 10);
                if (b < 1 || b > BMAX) { fprintf(stderr, "bench_gpu_sample: batches 1..%d\n", BMAX); return 2; }
                batches[nb++] = (int)b;
                if (*p == ',') p++;
                else if (*p) { fprintf(stderr, "bench_gpu_sample: --batches 1,16,64,256\n"); return 2; }
            }
        } else {
            fprintf(stderr, "usage: bench_gpu_sample [--batches 1,16,64,256]\n");
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    const int nt = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    rc_pool *pool = nt > 1 ? rc_pool_create(nt) : NULL;
    eng_sample_scratch *ws = calloc((size_t)nt, sizeof *ws);
    float *host = NULL, *dx = NULL;
    be_draw *hd = calloc(BMAX, sizeof *hd), *dd = NULL;
    int32_t *did = NULL, got[BMAX];
    int want[BMAX];
    if (!ws || !hd || check(cudaMallocHost((void **)&host, (size_t)BMAX * V * sizeof(float)), "cudaMallocHost") ||
        check(cudaMalloc((void **)&dx, (size_t)BMAX * V * sizeof(float)), "cudaMalloc") ||
        check(cudaMalloc((void **)&dd, BMAX * sizeof *dd), "cudaMalloc") ||
        check(cudaMalloc((void **)&did, BMAX * sizeof *did), "cudaMalloc"))
        return 1;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    static const char *const kind_name[2] = {"flat", "body+head"};
    static const struct {
        const char *name;
        eng_sampling s;
    } set[] = {
        {"T 1", {.temperature = 1.0}},
        {"T 0.7, top_p 0.9", {.temperature = 0.7, .top_p = 0.9}},
        {"top_k 50", {.temperature = 1.0, .top_k = 50}},
    };
    printf("# bench_gpu_sample: a step's sampled rows (V %d) drawn on the GPU against their logits copied to the host\n"
           "# and drawn there over %d threads (engine/sampler.c, fast paths on); us a step, median of %d\n\n",
           V, nt, NREP);
    printf("| rows | setting | B | GPU draw, us | copy + host draw, us | host / GPU | same tokens |\n");
    printf("| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    int bad = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (int r = 0; r < BMAX; r++)
            sr_make_row(host + (size_t)r * V, V, kind, 77 + (uint64_t)r + 1000 * (uint64_t)kind);
        if (check(cudaMemcpy(dx, host, (size_t)BMAX * V * sizeof(float), cudaMemcpyHostToDevice), "upload")) return 1;
        for (size_t k = 0; k < sizeof set / sizeof set[0]; k++) {
            const eng_sampling *s = &set[k].s;
            uint64_t st = eng_rng_init(9 + k);
            for (int r = 0; r < BMAX; r++)
                hd[r] = (be_draw){.row = (uint32_t)r, .top_k = s->top_k, .inv_t = 1.0 / s->temperature,
                                  .top_p = s->top_p, .min_p = s->min_p, .u01 = eng_sample_uniform(&st)};
            if (check(cudaMemcpy(dd, hd, BMAX * sizeof *hd, cudaMemcpyHostToDevice), "upload")) return 1;
            for (int bi = 0; bi < nb; bi++) {
                const int B = batches[bi];
                double tg[NREP], th[NREP];
                for (int rep = 0; rep < NREP; rep++) {
                    cudaEventRecord(e0, 0);
                    if (check(bcu_sample(did, dx, V, dd, (size_t)B, 0), "bcu_sample")) return 1;
                    cudaEventRecord(e1, 0);
                    cudaEventSynchronize(e1);
                    float ms = 0;
                    cudaEventElapsedTime(&ms, e0, e1);
                    tg[rep] = ms * 1e3;
                    /* the path it replaces: the rows down into pinned memory, then the host sampler over threads */
                    const double t0 = sr_now();
                    if (check(cudaMemcpy(host, dx, (size_t)B * V * sizeof(float), cudaMemcpyDeviceToHost), "download"))
                        return 1;
                    host_job j = {host, s, hd, ws, want, (size_t)B, (size_t)(pool && B > 1 ? (B < nt ? B : nt) : 1)};
                    if (j.nt > 1) rc_pool_run(pool, j.nt, host_task, &j);
                    else host_task(&j, 0);
                    th[rep] = (sr_now() - t0) * 1e6;
                }
                if (check(cudaMemcpy(got, did, (size_t)B * sizeof *got, cudaMemcpyDeviceToHost), "ids")) return 1;
                int same = 0;
                for (int r = 0; r < B; r++) same += got[r] == want[r];
                bad += same != B;
                qsort(tg, NREP, sizeof *tg, sr_cmp_d);
                qsort(th, NREP, sizeof *th, sr_cmp_d);
                printf("| %s | %s | %d | %.0f | %.0f | %.1fx | %d / %d |\n", kind_name[kind], set[k].name, B,
                       tg[NREP / 2], th[NREP / 2], th[NREP / 2] / tg[NREP / 2], same, B);
            }
        }
    }
    for (int t = 0; t < nt; t++) eng_sample_scratch_free(&ws[t]);
    free(ws);
    free(hd);
    rc_pool_destroy(pool);
    cudaFreeHost(host);
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(did);
    if (bad) printf("\n%d cases with a token that differs from the host sampler's\n", bad);
    return bad ? 1 : 0;
}
