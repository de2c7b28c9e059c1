/* test_model.c - the V4 graph against itself: the state machine must make
 * chunked prefill, token-by-token decode and batching invisible.
 *
 * Reference numbers (transformers) are checked by tests/py/test_model_ref.py;
 * here the claims are exact equalities that need no reference:
 *   - prefill in chunks of 1, 3, 7, 64 == one-shot prefill, bit for bit;
 *   - a batch of segments from different sequences == each run alone;
 *   - the FP8/FP4 checkpoint == its dequantised twin, bit for bit;
 *   - state bytes grow by exactly the documented per-token amount. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"

#include "model/v4.h"

#define FIX(name) MODEL_FIXTURE_DIR "/" name



/* logits of all n tokens fed in chunks of `chunk` (0 = one call) */
static float *run_chunked(md_model *m, const int32_t *ids, size_t n, size_t chunk)
{
    const int V = md_model_config(m)->vocab_size;
    float *lg = malloc(n * (size_t)V * sizeof *lg);
    md_seq *s = md_seq_create(m);
    rc_err err = {0};
    if (!chunk) chunk = n;
    for (size_t a = 0; a < n; a += chunk) {
        size_t k = n - a < chunk ? n - a : chunk;
        md_segment seg = {.seq = s, .ids = ids + a, .n = k, .logits = lg + a * (size_t)V, .all_logits = 1};
        assert_int_equal(md_forward(m, &seg, 1, &err), 0);
    }
    assert_int_equal(md_seq_len(s), (int64_t)n);
    md_seq_free(s);
    return lg;
}

static void chunking_is_invisible(md_semantics sem)
{
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, sem);
    const int V = md_model_config(m)->vocab_size;
    const size_t n = 300; /* wraps the 16-token window, 75 CSA entries for top-8, 2 HCA entries */
    int32_t *ids = make_ids(n, V, 7);
    float *base = run_chunked(m, ids, n, 0);
    const size_t chunks[] = {1, 3, 7, 64};
    for (size_t c = 0; c < 4; c++) {
        float *lg = run_chunked(m, ids, n, chunks[c]);
        for (size_t i = 0; i < n * (size_t)V; i++)
            if (lg[i] != base[i]) fail_msg("chunk %zu: position %zu differs (%g vs %g)", chunks[c], i / V, lg[i], base[i]);
        free(lg);
    }
    free(base);
    free(ids);
    md_model_free(m);
    be_destroy(be);
}

static void test_chunking_official(void **st) { (void)st; chunking_is_invisible(MD_SEM_OFFICIAL); }
static void test_chunking_transformers(void **st) { (void)st; chunking_is_invisible(MD_SEM_TRANSFORMERS); }

/* Three sequences at different points (fresh prefill, mid-decode, chunk),
 * run in one batch, give what each gives alone. */
static void test_batching_is_invisible(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, MD_SEM_OFFICIAL);
    const int V = md_model_config(m)->vocab_size;
    int32_t *ids = make_ids(400, V, 11);
    rc_err err = {0};
    md_seq *solo[3], *bat[3];
    const size_t pre[3] = {0, 130, 257}, add[3] = {40, 1, 9};
    for (int k = 0; k < 3; k++) {
        solo[k] = md_seq_create(m);
        bat[k] = md_seq_create(m);
        if (pre[k]) {
            md_segment a = {.seq = solo[k], .ids = ids, .n = pre[k]};
            md_segment b = {.seq = bat[k], .ids = ids, .n = pre[k]};
            assert_int_equal(md_forward(m, &a, 1, &err), 0);
            assert_int_equal(md_forward(m, &b, 1, &err), 0);
        }
    }
    float *ls[3], *lb[3];
    md_segment segs[3];
    for (int k = 0; k < 3; k++) {
        ls[k] = malloc(add[k] * (size_t)V * sizeof(float));
        lb[k] = malloc(add[k] * (size_t)V * sizeof(float));
        md_segment a = {.seq = solo[k], .ids = ids + pre[k], .n = add[k], .logits = ls[k], .all_logits = 1};
        assert_int_equal(md_forward(m, &a, 1, &err), 0);
        segs[k] = (md_segment){.seq = bat[k], .ids = ids + pre[k], .n = add[k], .logits = lb[k], .all_logits = 1};
    }
    assert_int_equal(md_forward(m, segs, 3, &err), 0);
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(ls[k], lb[k], add[k] * (size_t)V * sizeof(float));
        assert_int_equal(md_seq_len(bat[k]), (int64_t)(pre[k] + add[k]));
        free(ls[k]);
        free(lb[k]);
        md_seq_free(solo[k]);
        md_seq_free(bat[k]);
    }
    /* a sequence twice in one batch is refused, not corrupted */
    md_seq *s = md_seq_create(m);
    md_segment twice[2] = {{.seq = s, .ids = ids, .n = 1}, {.seq = s, .ids = ids + 1, .n = 1}};
    assert_int_equal(md_forward(m, twice, 2, &err), RC_EINVAL);
    int32_t bad = V;
    md_segment oob = {.seq = s, .ids = &bad, .n = 1};
    assert_int_equal(md_forward(m, &oob, 1, &err), RC_ERANGE);
    assert_int_equal(md_seq_len(s), 0);
    md_seq_free(s);
    free(ids);
    md_model_free(m);
    be_destroy(be);
}

/* forward_dev, the device-resident graph, run on the host with the host ops (md_model_set_host_dev_graph)
 * gives the host graph's logits bit for bit: one-shot, in chunks, token by token, and three sequences in one
 * batch, on every fixture (bf16 / FP8+FP4 / hash routing / HCA-only / the e2e vocabulary), both semantics.
 * That pins down its buffers, its per-layer state exchange and its fallbacks before any GPU runs it. */
static void test_host_dev_graph_is_the_host_graph(void **st)
{
    (void)st;
    const char *fx[] = {"tiny-mixed", "tiny-mixed-fp8fp4", "tiny-hash-swa", "tiny-hca16", "e2e-v4vocab"};
    be_backend *be = be_cpu_create(2);
    for (size_t f = 0; f < sizeof fx / sizeof fx[0]; f++)
        for (int sem = 0; sem < 2; sem++) {
            char dir[512];
            snprintf(dir, sizeof dir, "%s/%s", MODEL_FIXTURE_DIR, fx[f]);
            md_model *m = load_fixture_model(dir, be, sem ? MD_SEM_TRANSFORMERS : MD_SEM_OFFICIAL);
            const int V = md_model_config(m)->vocab_size;
            const size_t n = 150;
            int32_t *ids = make_ids(n + 64, V, 40 + f);
            float *ref = run_chunked(m, ids, n, 0);
            float *ref_b = malloc(3 * 9 * (size_t)V * sizeof(float)), *got_b = malloc(3 * 9 * (size_t)V * sizeof(float));
            for (int dev = 0; dev < 2; dev++) {
                assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
                /* batch: three sequences at 0, 1 and 140 tokens, each adding 9 */
                md_seq *q[3];
                rc_err err = {0};
                const size_t pre[3] = {0, 1, 140};
                md_segment sg[3];
                for (int k = 0; k < 3; k++) {
                    q[k] = md_seq_create(m);
                    if (pre[k]) {
                        md_segment a = {.seq = q[k], .ids = ids + 64, .n = pre[k]};
                        assert_int_equal(md_forward(m, &a, 1, &err), 0);
                    }
                    sg[k] = (md_segment){.seq = q[k], .ids = ids + k, .n = 9,
                                         .logits = (dev ? got_b : ref_b) + (size_t)k * 9 * V, .all_logits = 1};
                }
                assert_int_equal(md_forward(m, sg, 3, &err), 0);
                for (int k = 0; k < 3; k++) md_seq_free(q[k]);
            }
            const size_t chunks[] = {0, 7, 1};
            for (size_t c = 0; c < 3; c++) {
                float *lg = run_chunked(m, ids, n, chunks[c]);
                for (size_t i = 0; i < n * (size_t)V; i++)
                    if (lg[i] != ref[i])
                        fail_msg("%s %s chunk %zu: position %zu differs (%.9g vs %.9g)", fx[f],
                                 sem ? "transformers" : "official", chunks[c], i / V, lg[i], ref[i]);
                free(lg);
            }
            assert_memory_equal(got_b, ref_b, 3 * 9 * (size_t)V * sizeof(float));
            assert_int_equal(md_model_set_host_dev_graph(m, 0), 0);
            free(ref); free(ref_b); free(got_b); free(ids);
            md_model_free(m);
        }
    be_destroy(be);
}

static void test_quantized_equals_twin(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(2);
    md_model *q = load_fixture_model(FIX("tiny-mixed-fp8fp4"), be, MD_SEM_OFFICIAL);
    md_model *t = load_fixture_model(FIX("tiny-mixed-fp8fp4-twin"), be, MD_SEM_OFFICIAL);
    const int V = md_model_config(q)->vocab_size;
    int32_t *ids = make_ids(150, V, 3);
    float *a = run_chunked(q, ids, 150, 0), *b = run_chunked(t, ids, 150, 0);
    assert_memory_equal(a, b, 150 * (size_t)V * sizeof(float));
    free(a);
    free(b);
    free(ids);
    md_model_free(q);
    md_model_free(t);
    be_destroy(be);
}

static void test_state_size(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(1);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, MD_SEM_OFFICIAL);
    const md_config *c = md_model_config(m);
    md_seq *s = md_seq_create(m);
    assert_int_equal(md_seq_bytes(s), md_seq_fixed_bytes(m));
    int32_t *ids = make_ids(512, c->vocab_size, 5);
    md_segment seg = {.seq = s, .ids = ids, .n = 512};
    rc_err err = {0};
    assert_int_equal(md_forward(m, &seg, 1, &err), 0);
    /* 512 is a multiple of every ratio: growth is exactly per_token * 512 */
    double grown = (double)(md_seq_bytes(s) - md_seq_fixed_bytes(m));
    assert_true(grown == md_seq_bytes_per_token(m) * 512);
    /* tiny-mixed: CSA layers 1, 3 (d 128 + indexer 128, ratio 4), HCA 2, 4 (d 128, ratio 128) */
    assert_true(md_seq_bytes_per_token(m) == 2 * (128 + 128) * 4 / 4.0 + 2 * 128 * 4 / 128.0);
    free(ids);
    md_seq_free(s);
    md_model_free(m);
    be_destroy(be);
}

static void test_load_errors_name_the_tensor(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(1);
    md_model *m = NULL;
    rc_err err = {0};
    assert_int_not_equal(md_model_load(MODEL_FIXTURE_DIR "/no-such-model", be, MD_SEM_OFFICIAL, NULL, NULL, &m, &err), 0);
    assert_non_null(strstr(err.msg, "no-such-model"));
    assert_null(m);
    be_destroy(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunking_official),
        cmocka_unit_test(test_chunking_transformers),
        cmocka_unit_test(test_batching_is_invisible),
        cmocka_unit_test(test_host_dev_graph_is_the_host_graph),
        cmocka_unit_test(test_quantized_equals_twin),
        cmocka_unit_test(test_state_size),
        cmocka_unit_test(test_load_errors_name_the_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
