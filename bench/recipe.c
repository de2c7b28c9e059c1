/* bench/recipe.c - our side of the codec benchmark (bench/recipe.py runs it).
 *
 *   bench_recipe parse REQ.json OUTPUTS.jsonl CHUNK   output parsing + Chat SSE writing
 *   bench_recipe render REQ.json TOKENIZER THREADS    request -> prompt -> ids latency
 * Each prints one JSON object. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "recipe/out.h"
#include "recipe/protocol.h"
#include "recipe/pyjson.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void sink(void *ctx, rc_event_kind k, const char *t, size_t n) {
    (void)k;
    (void)t;
    *(size_t *)ctx += n;
}

static int parse_bench(json_t *req, const char *outputs, size_t chunk) {
    rc_conversation conv;
    rc_inference inf;
    rc_api_error e;
    if (rc_chat_convert(req, &conv, &inf, &e)) {
        fprintf(stderr, "request: %s\n", e.message);
        return 1;
    }
    FILE *f = fopen(outputs, "rb");
    if (!f) return 1;
    char *line = NULL;
    size_t cap = 0, total = 0, nout = 0;
    ssize_t n;
    json_t **texts = NULL;
    while ((n = getline(&line, &cap, f)) > 0) {
        texts = realloc(texts, (nout + 1) * sizeof *texts);
        texts[nout] = json_loadb(line, (size_t)n, JSON_DECODE_ANY, NULL);
        total += json_string_length(texts[nout]);
        nout++;
    }
    fclose(f);
    free(line);
    rc_stream_opts so = {.parse_tool_calls = conv.ntools > 0, .reasoning = conv.thinking ? RC_REASONING_START : RC_REASONING_NONE};
    double best_sm = 1e9, best_sse = 1e9;
    size_t sseb = 0;
    for (int rep = 0; rep < 5; rep++) {
        /* state machine alone */
        double t0 = now();
        size_t got = 0;
        for (size_t i = 0; i < nout; i++) {
            rc_stream *s = rc_stream_new(&so);
            const char *t = json_string_value(texts[i]);
            size_t len = json_string_length(texts[i]);
            for (size_t at = 0; at < len; at += chunk) rc_stream_feed(s, t + at, len - at < chunk ? len - at : chunk, sink, &got);
            rc_stream_finish(s, RC_FINISH_STOP, sink, &got);
            rc_stream_free(s);
        }
        double t1 = now();
        /* state machine + Chat SSE events */
        rc_out_opts oo = {.id = "chatcmpl-bench", .created = 1767225600, .model = "DeepSeek-V4-Pro", .thinking = conv.thinking,
                          .reasoning_start = conv.thinking, .stream = 1, .deterministic = 1, .prompt_tokens = 1};
        rc_bytes out = {0};
        for (size_t i = 0; i < nout; i++) {
            rc_stream *s = rc_stream_new(&so);
            void *w = rc_out_chat.create(&oo, req);
            rc_out_chat.start(w, &out);
            const char *t = json_string_value(texts[i]);
            size_t len = json_string_length(texts[i]);
            for (size_t at = 0; at < len; at += chunk) {
                rc_stream_feed(s, t + at, len - at < chunk ? len - at : chunk, rc_out_chat.event, w);
                rc_out_chat.flush(w, &out);
            }
            rc_out_usage u = {1, -1, -1};
            rc_out_chat.finish(w, rc_stream_finish(s, RC_FINISH_STOP, rc_out_chat.event, w), NULL, &u, &out);
            rc_out_chat.destroy(w);
            rc_stream_free(s);
            sseb = out.n;
            out.n = 0;
        }
        double t2 = now();
        rc_bytes_free(&out);
        if (t1 - t0 < best_sm) best_sm = t1 - t0;
        if (t2 - t1 < best_sse) best_sse = t2 - t1;
    }
    printf("{\"bytes\":%zu,\"outputs\":%zu,\"chunk\":%zu,\"sm_s\":%.6f,\"sse_s\":%.6f,\"last_sse_bytes\":%zu}\n", total,
           nout, chunk, best_sm, best_sse, sseb);
    for (size_t i = 0; i < nout; i++) json_decref(texts[i]);
    free(texts);
    rc_conv_free(&conv);
    rc_inference_free(&inf);
    return 0;
}

static int render_bench(json_t *req, const char *tokpath, int threads) {
    rc_tokenizer *tok;
    rc_err err = {0};
    if (rc_tokenizer_load(tokpath, &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    rc_pool *pool = rc_pool_create(threads);
    double v[25];
    size_t nids = 0, plen = 0;
    int reps = 25;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        rc_conversation conv;
        rc_inference inf;
        rc_api_error e;
        if (rc_chat_convert(req, &conv, &inf, &e)) {
            fprintf(stderr, "request: %s\n", e.message);
            return 1;
        }
        rc_prompt p;
        rc_render(&conv, RC_ENC_V4, &p, &err);
        rc_ids ids = {0};
        rc_prompt_tokens(&p, tok, pool, &ids, &err);
        v[r] = now() - t0;
        nids = ids.n;
        plen = p.text.n;
        rc_ids_free(&ids);
        rc_prompt_free(&p);
        rc_conv_free(&conv);
        rc_inference_free(&inf);
    }
    double first = v[0];
    qsort(v, (size_t)reps, sizeof v[0], cmp);
    printf("{\"threads\":%d,\"ids\":%zu,\"prompt_bytes\":%zu,\"first_s\":%.6f,\"median_s\":%.6f,\"best_s\":%.6f}\n",
           threads, nids, plen, first, v[reps / 2], v[0]);
    rc_pool_destroy(pool);
    rc_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[1], "parse") && strcmp(argv[1], "render"))) {
        fprintf(stderr, "usage: %s parse REQ.json OUTPUTS.jsonl CHUNK | render REQ.json TOKENIZER THREADS\n", argv[0]);
        return 2;
    }
    json_error_t je;
    json_t *req = json_load_file(argv[2], 0, &je);
    if (!req) {
        fprintf(stderr, "%s: %s\n", argv[2], je.text);
        return 1;
    }
    int rc = !strcmp(argv[1], "parse") ? parse_bench(req, argv[3], (size_t)atol(argv[4]))
                                       : render_bench(req, argv[3], atoi(argv[4]));
    json_decref(req);
    return rc;
}
