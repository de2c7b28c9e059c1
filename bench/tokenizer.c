/* bench/tokenizer.c - our side of the tokenizer benchmark.
 *
 * usage: bench_tokenizer TOKENIZER.json TEXT_FILE PROMPT_FILE THREADS [cold]
 * Prints one JSON object: throughput of serial and parallel encoding over
 * TEXT_FILE and the latency of encoding PROMPT_FILE (the 77K-token agent
 * prompt), warm (median of repeats).  With "cold": only the first encode of
 * PROMPT_FILE in a fresh process on THREADS threads (empty BPE caches).
 * bench/tokenizer.py runs this beside HF tokenizers and prints the table. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "recipe/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (fread(b, 1, (size_t)sz, f) != (size_t)sz) exit(1);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* seconds per encode: best and median over reps */
static void time_encode(const rc_tokenizer *t, rc_pool *pool, const char *s, size_t n, int reps,
                        double *first, double *best, double *median, size_t *ntok) {
    double v[64];
    rc_ids ids = {0};
    rc_err err = {0};
    for (int r = 0; r < reps; r++) {
        ids.n = 0;
        double t0 = now();
        if (rc_tokenizer_encode_parallel(t, pool, s, n, RC_ENCODE_CONTENT, &ids, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        v[r] = now() - t0;
    }
    *first = v[0];
    *ntok = ids.n;
    qsort(v, (size_t)reps, sizeof v[0], cmp);
    *best = v[0];
    *median = v[reps / 2];
    rc_ids_free(&ids);
}

static void noop(void *arg, size_t i) {
    (void)arg;
    (void)i;
}

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && !strcmp(argv[5], "cold"))) {
        fprintf(stderr, "usage: %s TOKENIZER.json TEXT_FILE PROMPT_FILE THREADS [cold]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[4]);
    rc_err err = {0};
    rc_tokenizer *t;
    double t0 = now();
    if (rc_tokenizer_load(argv[1], &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;
    size_t ntext, nprompt, ntok, ptok;
    char *text = slurp(argv[2], &ntext), *prompt = slurp(argv[3], &nprompt);
    rc_pool *pool = rc_pool_create(threads);
    double f, b1, m1, bn, mn, pc1, pb1, pm1, pcn, pbn, pmn;
    if (argc == 6) {
        /* a server's threads are up long before a request: start them, but
         * leave every BPE cache empty */
        rc_pool_run(pool, (size_t)threads * 4, noop, NULL);
        time_encode(t, pool, prompt, nprompt, 1, &pcn, &pbn, &pmn, &ptok);
        /* then a server that has been up a while: the tokenizer's tables are
         * warm from other traffic (the second half of TEXT_FILE, which the
         * prompt does not overlap), but every BPE cache is empty */
        double ec;
        time_encode(t, pool, text + ntext / 2, ntext / 8, 1, &ec, &pbn, &pmn, &ntok);
        rc_tokenizer_drop_caches(t);
        time_encode(t, pool, prompt, nprompt, 1, &ec, &pbn, &pmn, &ptok);
        printf("{\"cold_s\":%.5f,\"empty_cache_s\":%.5f,\"threads\":%d,\"prompt_tokens\":%zu}\n", pcn,
               ec, threads, ptok);
        return 0;
    }
    /* prompt first, in a fresh process: its first call is the cold number */
    time_encode(t, NULL, prompt, nprompt, 15, &pc1, &pb1, &pm1, &ptok);
    time_encode(t, pool, prompt, nprompt, 15, &pcn, &pbn, &pmn, &ptok);
    time_encode(t, NULL, text, ntext, 3, &f, &b1, &m1, &ntok);
    time_encode(t, pool, text, ntext, 3, &f, &bn, &mn, &ntok);
    printf("{\"load_s\":%.4f,\"text_bytes\":%zu,\"text_tokens\":%zu,\"serial_s\":%.5f,"
           "\"parallel_s\":%.5f,\"threads\":%d,\"prompt_bytes\":%zu,\"prompt_tokens\":%zu,"
           "\"prompt_cold_1t_s\":%.5f,\"prompt_warm_1t_s\":%.5f,\"prompt_cold_nt_s\":%.5f,"
           "\"prompt_warm_nt_s\":%.5f}\n",
           load_s, ntext, ntok, m1, mn, threads, nprompt, ptok, pc1, pm1, pcn, pmn);
    rc_pool_destroy(pool);
    rc_tokenizer_free(t);
    free(text);
    free(prompt);
    return 0;
}
