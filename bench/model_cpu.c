/* model_cpu.c - CPU model throughput: prefill and decode tokens/s, decoding
 * state per token, against this machine's memory bandwidth measured in the
 * same run.
 *
 * usage: bench_model_cpu [--threads N] [--prefill P] [--decode G] [--semantics official|transformers|both] DIR...
 *
 * --semantics both runs each model under both semantics, official first, and
 * prints official's time over transformers' (on an FP8 / FP4 checkpoint that
 * is the cost of the GEMM-activation quantisation and the KV round trips).
 *
 * Decode at batch 1 is bound by reading the active weights once per token, so
 * the reference is the roofline time bytes_active / memcpy-bandwidth; the
 * table's ratio says how far from that floor the engine runs (1.0 = at the
 * floor).  Weights here are bf16 and are widened to f32 on every read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model/v4.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double memcpy_gbs(void)
{
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        memcpy(b, a, n);
        double t = now() - t0;
        double gbs = 2.0 * (double)n / t / 1e9; /* read + write */
        if (gbs > best) best = gbs;
    }
    free(a);
    free(b);
    return best;
}

/* bytes one decode step reads: all weights except the routed experts not chosen */
static double active_bytes(const md_config *c)
{
    double D = c->hidden_size, I = c->moe_inter, E = c->n_experts, k = c->top_k, L = c->n_layers;
    double H = c->n_heads, d = c->head_dim, ql = c->q_lora_rank, g = c->o_groups, ol = c->o_lora_rank;
    double attn = ql * D + H * d * ql + d * D + g * ol * H * d / g + D * g * ol;
    double per_layer = attn + E * D + (k + 1) * 3 * I * D;
    return 2.0 * (per_layer * L + c->vocab_size * D); /* bf16; the head is read whole */
}

int main(int argc, char **argv)
{
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), P = 512, G = 64;
    int first = 1, nsem = 1;
    md_semantics sems[2] = {MD_SEM_OFFICIAL, MD_SEM_TRANSFORMERS};
    const char *usage =
        "usage: bench_model_cpu [--threads N] [--prefill P] [--decode G] [--semantics official|transformers|both] DIR...\n";
    for (; first < argc && argv[first][0] == '-'; first++) {
        if (!strcmp(argv[first], "--threads") && first + 1 < argc) threads = atoi(argv[++first]);
        else if (!strcmp(argv[first], "--prefill") && first + 1 < argc) P = atoi(argv[++first]);
        else if (!strcmp(argv[first], "--decode") && first + 1 < argc) G = atoi(argv[++first]);
        else if (!strcmp(argv[first], "--semantics") && first + 1 < argc) {
            const char *v = argv[++first];
            if (!strcmp(v, "both")) nsem = 2;
            else if (md_semantics_parse(v, &sems[0])) { fputs(usage, stderr); return 2; }
        } else { fputs(usage, stderr); return 2; }
    }
    if (first >= argc) { fputs(usage, stderr); return 2; }
    double bw = memcpy_gbs();
    printf("memcpy bandwidth %.1f GB/s (read+write), %d threads, prefill %d tokens, decode %d tokens\n\n", bw, threads, P, G);
    printf("%-28s %9s %12s %12s %12s %12s %9s %14s %12s\n", "model", "params", "prefill t/s", "decode t/s",
           "decode ms", "floor ms", "ratio", "state fixed", "state B/tok");
    for (int a = first; a < argc; a++) {
        be_backend *be = be_cpu_create(threads);
        md_model *m;
        rc_err err = {0};
        if (md_model_load(argv[a], be, MD_SEM_OFFICIAL, NULL, NULL, &m, &err)) {
            fprintf(stderr, "%s: %s\n", argv[a], err.msg);
            return 1;
        }
        const md_config *c = md_model_config(m);
        double tps[2] = {0, 0}, tds[2] = {0, 0};
        for (int si = 0; si < nsem; si++) {
        md_model_set_semantics(m, sems[si]);
        int32_t *ids = malloc((size_t)(P + G) * sizeof *ids);
        uint64_t s = 12345;
        for (int i = 0; i < P + G; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)((s >> 33) % (uint64_t)c->vocab_size);
        }
        float *lg = malloc((size_t)c->vocab_size * sizeof *lg);
        md_seq *q = md_seq_create(m);
        md_segment seg = {.seq = q, .ids = ids, .n = (size_t)P, .logits = lg};
        double t0 = now();
        if (md_forward(m, &seg, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        double tp = now() - t0;
        t0 = now();
        for (int i = 0; i < G; i++) {
            md_segment one = {.seq = q, .ids = ids + P + i, .n = 1, .logits = lg};
            if (md_forward(m, &one, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
        }
        double td = (now() - t0) / G;
        double floor_s = active_bytes(c) / (bw / 2 * 1e9); /* read bandwidth = half of copy traffic */
        const char *name = strrchr(argv[a], '/');
        name = name && name[1] ? name + 1 : argv[a];
        char label[64];
        snprintf(label, sizeof label, "%s%s%s", name, nsem > 1 ? " " : "", nsem > 1 ? md_semantics_name(sems[si]) : "");
        printf("%-28s %8.1fM %12.1f %12.2f %12.2f %12.2f %9.2f %12.1fKB %12.1f\n", label,
               (double)md_model_param_count(m) / 1e6, P / tp, 1.0 / td, td * 1e3, floor_s * 1e3, td / floor_s,
               (double)md_seq_fixed_bytes(m) / 1024.0, md_seq_bytes_per_token(m));
        tps[si] = tp;
        tds[si] = td;
        free(ids);
        free(lg);
        md_seq_free(q);
        }
        if (nsem > 1)
            printf("%-28s official / transformers: prefill time %.3fx, decode time %.3fx\n", "", tps[0] / tps[1],
                   tds[0] / tds[1]);
        md_model_free(m);
        be_destroy(be);
    }
    printf("\nratio = decode ms / floor ms (floor: active bf16 weight bytes / read bandwidth).\n"
           "state fixed = window rings + compressor partial blocks; B/tok = compressed entries (f32).\n");
    return 0;
}
