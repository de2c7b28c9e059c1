/* test_model.c - the V4 graph against itself: the state machine must make
 * chunked prefill, token-by-token decode and batching invisible.
 *
 * Reference numbers (transformers) are checked by tests/py/test_model_ref.py;
 * here the claims are exact equalities that need no reference:
 *   - prefill in chunks of 1, 3, 7, 64 == one-shot prefill, bit for bit;
 *   - the whole state (snapshot bytes) after any segmentation, segments
 *     starting mid-block and bounded replay included == after one segment;
 *   - a batch of segments from different sequences == each run alone;
 *   - the FP8/FP4 checkpoint == its dequantised twin, bit for bit;
 *   - state bytes grow by exactly the documented per-token amount. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"

#include "base/greedy.h"
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

/* feed ids[0..n) to s in segments of the sizes in sch (cycled), all logits into lg */
static void feed_sched(md_model *m, md_seq *s, const int32_t *ids, size_t n, const size_t *sch, size_t nsch, float *lg)
{
    const size_t V = (size_t)md_model_config(m)->vocab_size;
    rc_err err = {0};
    for (size_t a = 0, k = 0; a < n; k++) {
        size_t c = sch[k % nsch] < n - a ? sch[k % nsch] : n - a;
        md_segment seg = {.seq = s, .ids = ids + a, .n = c, .logits = lg + a * V, .all_logits = 1};
        if (md_forward(m, &seg, 1, &err)) fail_msg("forward: %s", err.msg);
        a += c;
    }
}

static uint8_t *snapshot_of(const md_seq *s, size_t *len)
{
    rc_err err = {0};
    *len = md_seq_snapshot_size(s);
    uint8_t *b = malloc(*len);
    if (md_seq_snapshot(s, b, *len, &err)) fail_msg("snapshot: %s", err.msg);
    return b;
}

/* Where partial block f (0 c_kv, 1 c_gate, 2 i_kv, 3 i_gate) of layer l starts in the snapshot of a state of
 * len tokens (docs/KV.md: per layer win, c_kv, c_gate, c_ovkv, c_ovg, c_ent, i_kv, i_gate, i_ovkv, i_ovg, i_ent). */
static const uint8_t *snap_partial(const uint8_t *snap, const md_config *c, int64_t len, int l, int f)
{
    static const int before[4] = {1, 2, 6, 7};
    size_t p = 64 + 24 * (size_t)c->n_layers;
    for (int j = 0;; j++) {
        const size_t d = (size_t)c->head_dim, id = (size_t)c->index_head_dim, r = (size_t)c->ratio[j];
        const size_t csa = r && c->ratio[j] == c->csa_ratio, cd = (csa ? 2 : 1) * d, ne = r ? (size_t)len / r : 0;
        const size_t sz[11] = {(size_t)c->window * d, r * cd, r * cd, csa * r * d, csa * r * d, ne * d,
                               csa * r * 2 * id, csa * r * 2 * id, csa * r * id, csa * r * id, csa * ne * id};
        for (int k = 0; k < (j == l ? before[f] : 11); k++) p += sz[k] * 4;
        if (j == l) return snap + p;
    }
}

/* The compressors pool a segment's entries in parallel and then rebuild the partial blocks: the whole state
 * (snapshot bytes, stale partial-block slots included) and the logits must not depend on where segments start.
 * Segments that start mid-block and complete many entries: 5 + 295 (CSA ratio 4: p0 % 4 = 1, 73 entries; the
 * first HCA block straddles p0), 130 + 170 (p0 mid-block for both ratios), against one-shot and token by token;
 * and a bounded replay that starts mid-block (at 6), fed in one segment, token by token and as 5 + rest.
 * The stale slots are those token-by-token pushes leave: at length q, partial-block slots q % r .. r-1 still
 * hold the last complete block's, as at length r * floor(q / r). */
static void state_is_invisible(md_semantics sem)
{
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, sem);
    const md_config *c = md_model_config(m);
    const size_t V = (size_t)c->vocab_size, n = 300;
    int32_t *ids = make_ids(n + 2, (int)V, 13);
    float *ref = malloc(n * V * sizeof(float)), *lg = malloc(n * V * sizeof(float));
    static const size_t sch[][4] = {{300}, {1}, {5, 295}, {130, 170}, {2, 61, 127, 110}};
    static const size_t nsch[] = {1, 1, 2, 2, 4};
    size_t rl = 0;
    uint8_t *rs = NULL;
    md_seq *full = NULL;
    for (size_t k = 0; k < 5; k++) {
        md_seq *s = md_seq_create(m);
        size_t len;
        feed_sched(m, s, ids, n, sch[k], nsch[k], k ? lg : ref);
        uint8_t *snap = snapshot_of(s, &len);
        if (!k) {
            rs = snap;
            rl = len;
            full = s;
            continue;
        }
        assert_memory_equal(lg, ref, n * V * sizeof(float));
        assert_int_equal(len, rl);
        if (memcmp(snap, rs, len)) fail_msg("schedule %zu: the state differs from one-shot prefill", k);
        free(snap);
        md_seq_free(s);
    }
    /* bounded replay from 6 over the blocks of the first 256 tokens, then 44 more */
    md_block *blk[2] = {md_seq_block(full, 0), md_seq_block(full, 1)};
    static const size_t rsch[][2] = {{294}, {1}, {5, 289}};
    uint8_t *r0 = NULL;
    float *rlg = malloc(294 * V * sizeof(float));
    for (size_t k = 0; k < 3; k++) {
        md_seq *r = md_seq_create(m);
        rc_err err = {0};
        assert_int_equal(md_seq_attach(r, blk, 2, NULL, 0, 250, &err), 0);
        feed_sched(m, r, ids + 6, 294, rsch[k], k == 2 ? 2 : 1, k ? lg : rlg);
        size_t len;
        uint8_t *snap = snapshot_of(r, &len);
        assert_int_equal(len, rl);
        if (!k) r0 = snap;
        else {
            assert_memory_equal(lg, rlg, 294 * V * sizeof(float));
            if (memcmp(snap, r0, len)) fail_msg("replay schedule %zu: the state differs from one segment", k);
            free(snap);
        }
        md_seq_free(r);
    }
    free(r0);
    free(rlg);

    /* stale slots at 302: CSA (ratio 4) slots 2, 3 as at 300, HCA (ratio 128) slots 46..127 as at 256 */
    md_seq *s256 = md_seq_create(m);
    const size_t one[] = {256}, two[] = {2};
    feed_sched(m, s256, ids, 256, one, 1, lg);
    feed_sched(m, full, ids + n, 2, two, 1, lg);
    size_t l256, l302;
    uint8_t *p256 = snapshot_of(s256, &l256), *p302 = snapshot_of(full, &l302);
    int checked = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const int r = c->ratio[l], csa = r && r == c->csa_ratio;
        if (!r) continue;
        const uint8_t *at = r == 4 ? rs : r == 128 ? p256 : NULL;
        const int64_t len = r == 4 ? 300 : 256;
        assert_non_null(at);
        for (int f = 0; f < (csa ? 4 : 2); f++) {
            const size_t w = (f < 2 ? (csa ? 2 : 1) * (size_t)c->head_dim : 2 * (size_t)c->index_head_dim) * 4;
            const size_t s0 = (size_t)(n + 2) % (size_t)r;
            if (memcmp(snap_partial(p302, c, 302, l, f) + s0 * w, snap_partial(at, c, len, l, f) + s0 * w,
                       ((size_t)r - s0) * w))
                fail_msg("layer %d partial block %d: the stale slots are not the last complete block's", l, f);
            checked++;
        }
    }
    assert_int_equal(checked, 2 * 4 + 2 * 2); /* tiny-mixed: CSA layers 1, 3, HCA layers 2, 4 */
    free(p256);
    free(p302);
    md_seq_free(s256);
    free(rs);
    md_seq_free(full);
    free(ref);
    free(lg);
    free(ids);
    md_model_free(m);
    be_destroy(be);
}

static void test_state_official(void **st) { (void)st; state_is_invisible(MD_SEM_OFFICIAL); }
static void test_state_transformers(void **st) { (void)st; state_is_invisible(MD_SEM_TRANSFORMERS); }

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

/* forward_dev, the device-resident graph, run on the host with the host ops (md_model_set_host_dev_graph: with
 * its attention op, compressor op and linear_aq, again with the attention op declining and no linear_aq, and with
 * one partial-block copy)
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
            /* the device graph with its attention op (dev 1), with the op declining (dev 2: the host fallback), and
             * with one partial-block copy for the whole model (dev 3: copies taken from other blocks, calls
             * without) */
            for (int dev = 1; dev <= 3; dev++) {
                assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
                const size_t chunks[] = {0, 7, 1};
                for (size_t c = 0; c < 3; c++) {
                    float *lg = run_chunked(m, ids, n, chunks[c]);
                    for (size_t i = 0; i < n * (size_t)V; i++)
                        if (lg[i] != ref[i])
                            fail_msg("%s %s dev %d chunk %zu: position %zu differs (%.9g vs %.9g)", fx[f],
                                     sem ? "transformers" : "official", dev, chunks[c], i / V, lg[i], ref[i]);
                    free(lg);
                }
            }
            assert_memory_equal(got_b, ref_b, 3 * 9 * (size_t)V * sizeof(float));
            assert_int_equal(md_model_set_host_dev_graph(m, 0), 0);
            free(ref); free(ref_b); free(got_b); free(ids);
            md_model_free(m);
        }
    be_destroy(be);
}

/* out[1] (the host-dev graph's steps x ns logits of V, step-major) must be out[0] (the host graph's) bit for bit;
 * then m back on the host graph and both freed */
static void same_steps(md_model *m, const char *what, float *out[2], size_t steps, size_t ns, int V)
{
    for (size_t i = 0; i < steps * ns * (size_t)V; i++)
        if (out[1][i] != out[0][i])
            fail_msg("%s: step %zu sequence %zu differs (%.9g vs %.9g)", what, i / V / ns, i / V % ns, out[1][i],
                     out[0][i]);
    assert_int_equal(md_model_set_host_dev_graph(m, 0), 0);
    free(out[0]);
    free(out[1]);
}

/* A decode batch of many sequences through the device graph run on the host, on more host threads than one (a third
 * of them offering draws, which the host ops hand back as logits):
 * comp_dev stages each segment's compressor state and late_state updates each segment's state as tasks over the
 * threads (one segment a task).  Twenty sequences at lengths 0 .. 57, then 12 steps of one token each, every
 * step completing CSA and HCA entries for some of them: the logits are the host graph's, bit for bit. */
static void test_host_dev_graph_many_sequences(void **st)
{
    (void)st;
    enum { NS = 20, STEPS = 12 };
    const char *fx[] = {FIX("tiny-mixed"), FIX("tiny-mixed-fp8fp4")};
    be_backend *be = be_cpu_create(4);
    for (int f = 0; f < 2; f++) {
        md_model *m = load_fixture_model(fx[f], be, MD_SEM_OFFICIAL);
        const int V = md_model_config(m)->vocab_size;
        int32_t *ids = make_ids(NS * 3 + 64 + STEPS * NS, V, 90 + (uint64_t)f);
        float *out[2];
        for (int dev = 0; dev < 2; dev++) {
            assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
            out[dev] = malloc((size_t)STEPS * NS * V * sizeof(float));
            md_seq *q[NS];
            md_segment sg[NS];
            rc_err err = {0};
            for (int k = 0; k < NS; k++) {
                q[k] = md_seq_create(m);
                const size_t pre = (size_t)k * 3;
                if (pre) {
                    md_segment a = {.seq = q[k], .ids = ids + k, .n = pre};
                    if (md_forward(m, &a, 1, &err)) fail_msg("prefill: %s", err.msg);
                }
            }
            for (int t = 0; t < STEPS; t++) {
                /* every third sequence offers a draw (md_segment.draw): the host ops take none, so its logits come
                 * down through the drawn rows' path (the rows the device graph puts after the logits rows) */
                rc_draw dr[NS];
                for (int k = 0; k < NS; k++) {
                    dr[k] = (rc_draw){.temperature = 0.8, .top_p = 0.9, .u01 = 0.5, .token = -1};
                    sg[k] = (md_segment){.seq = q[k], .ids = ids + NS * 3 + 64 + t * NS + k, .n = 1,
                                         .logits = out[dev] + ((size_t)t * NS + k) * V, .draw = k % 3 == 1 ? &dr[k] : NULL};
                }
                if (md_forward(m, sg, NS, &err)) fail_msg("step %d: %s", t, err.msg);
                for (int k = 0; k < NS; k++) assert_int_equal(dr[k].token, -1);
            }
            for (int k = 0; k < NS; k++) md_seq_free(q[k]);
        }
        same_steps(m, fx[f], out, STEPS, NS, V);
        free(ids);
        md_model_free(m);
    }
    be_destroy(be);
}

/* The block tables the attention op reads (md_seq's data pointers and ids beside its block table) on every path
 * that builds one: a prefill across three blocks (blocks appended one by one), a clone (the full blocks shared, the
 * partial one copied), a restore from a snapshot (a fresh table), an attach of the full blocks with a bounded replay,
 * and an attach with the boundary state.  md_seq_check after each, then the five decode 6 steps together and the
 * host-dev graph (whose attention op reads those tables) gives the host graph's logits bit for bit. */
static void test_host_dev_graph_block_tables(void **st)
{
    (void)st;
    enum { NS = 5, PRE = 300, STEPS = 6 };
    be_backend *be = be_cpu_create(4);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, MD_SEM_OFFICIAL);
    const int V = md_model_config(m)->vocab_size;
    int32_t *ids = make_ids(PRE + STEPS * NS, V, 123);
    float *out[2];
    for (int dev = 0; dev < 2; dev++) {
        assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
        out[dev] = malloc((size_t)STEPS * NS * V * sizeof(float));
        rc_err err = {0};
        md_seq *q[NS];
        q[0] = md_seq_create(m);
        md_segment a = {.seq = q[0], .ids = ids, .n = PRE};
        if (md_forward(m, &a, 1, &err)) fail_msg("prefill: %s", err.msg);
        q[1] = md_seq_clone(q[0]);
        q[2] = md_seq_create(m);
        size_t sz = md_seq_snapshot_size(q[0]);
        uint8_t *snap = malloc(sz);
        if (md_seq_snapshot(q[0], snap, sz, &err) || md_seq_restore(q[2], snap, sz, &err)) fail_msg("%s", err.msg);
        free(snap);
        /* the full blocks again, through attach: with a bounded replay of the last block's 128 tokens (fed next),
         * and with the boundary state saved at the same point by a state prefilled to it */
        const size_t nf = md_seq_full_blocks(q[0]);
        md_block *blk[8];
        for (size_t k = 0; k < nf; k++) blk[k] = md_seq_block(q[0], k);
        q[3] = md_seq_create(m);
        if (md_seq_attach(q[3], blk, nf, NULL, 0, MD_BLOCK_TOKENS, &err)) fail_msg("attach: %s", err.msg);
        md_segment r = {.seq = q[3], .ids = ids + (nf - 1) * MD_BLOCK_TOKENS, .n = MD_BLOCK_TOKENS};
        if (md_forward(m, &r, 1, &err)) fail_msg("replay: %s", err.msg);
        md_seq *b = md_seq_create(m);
        md_segment bp = {.seq = b, .ids = ids, .n = nf * MD_BLOCK_TOKENS};
        if (md_forward(m, &bp, 1, &err)) fail_msg("boundary prefill: %s", err.msg);
        sz = md_seq_boundary_size(m);
        uint8_t *bnd = malloc(sz);
        if (md_seq_boundary_save(b, bnd, sz, &err)) fail_msg("boundary: %s", err.msg);
        for (size_t k = 0; k < nf; k++) blk[k] = md_seq_block(b, k);
        q[4] = md_seq_create(m);
        if (md_seq_attach(q[4], blk, nf, bnd, sz, 0, &err)) fail_msg("attach boundary: %s", err.msg);
        free(bnd);
        md_seq_free(b);
        /* q[3] and q[4] stand at nf blocks; feed them the rest of q[0]'s prefill so all five decode from PRE */
        for (int k = 3; k < NS; k++) {
            md_segment rest = {.seq = q[k], .ids = ids + nf * MD_BLOCK_TOKENS, .n = PRE - nf * MD_BLOCK_TOKENS};
            if (md_forward(m, &rest, 1, &err)) fail_msg("rest: %s", err.msg);
        }
        for (int k = 0; k < NS; k++) {
            const char *why = md_seq_check(q[k]);
            if (why) fail_msg("sequence %d after its construction: %s", k, why);
            assert_int_equal(md_seq_len(q[k]), PRE);
        }
        md_segment sg[NS];
        for (int t = 0; t < STEPS; t++) {
            for (int k = 0; k < NS; k++)
                sg[k] = (md_segment){.seq = q[k], .ids = ids + PRE + t * NS + k, .n = 1,
                                     .logits = out[dev] + ((size_t)t * NS + k) * V};
            if (md_forward(m, sg, NS, &err)) fail_msg("step %d: %s", t, err.msg);
        }
        for (int k = 0; k < NS; k++) {
            const char *why = md_seq_check(q[k]);
            if (why) fail_msg("sequence %d after decoding: %s", k, why);
            md_seq_free(q[k]);
        }
    }
    same_steps(m, "tiny-mixed", out, STEPS, NS, V);
    free(ids);
    md_model_free(m);
    be_destroy(be);
}

/* Where the device graph waits for the state.  With the compressors on the host (DEEPINFER_DEV_COMP=0) only at
 * the layers where a segment completes a compressed entry (layer l with ratio r, a segment at p0 adding k
 * tokens: floor((p0 + k) / r) > floor(p0 / r)), every other layer's update running after the forward; with the
 * backend's comp_pool (the host-dev graph has one) at none.  Counted by md_model_state_stats over token-by-token,
 * chunked and one-shot runs, whose logits must be those of the host graph. */
static void test_state_waits_only_for_entries(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(2);
    const char *fx[] = {FIX("tiny-mixed"), FIX("tiny-hca16")};
    for (int f = 0; f < 2; f++) {
        md_model *m = load_fixture_model(fx[f], be, MD_SEM_OFFICIAL);
        const md_config *c = md_model_config(m);
        const int V = c->vocab_size;
        const size_t n = 150, chunks[] = {1, 7, 150};
        int32_t *ids = make_ids(n, V, 11);
        float *ref = run_chunked(m, ids, n, 0);
        assert_int_equal(md_model_set_host_dev_graph(m, 1), 0);
        for (int host_comp = 0; host_comp < 2; host_comp++) {
            if (host_comp) setenv("DEEPINFER_DEV_COMP", "0", 1);
            for (size_t ci = 0; ci < 3; ci++) {
                uint64_t want_now = 0, want_late = 0, now0, late0, now1, late1;
                for (size_t p0 = 0; p0 < n; p0 += chunks[ci]) {
                    const size_t k = n - p0 < chunks[ci] ? n - p0 : chunks[ci];
                    for (int l = 0; l < c->n_layers; l++) {
                        const size_t r = (size_t)c->ratio[l];
                        if (host_comp && r && (p0 + k) / r > p0 / r) want_now++;
                        else want_late++;
                    }
                }
                /* the attention op's partial-block copies (part_slots.h): with the compressors on the device every
                 * entry reaches its copy from the device, so no row is copied from the host; with them on the host
                 * every entry (and indexer key) is copied once, at the call that completes it */
                uint64_t want_rows = 0, hits0, rows0, hits1, rows1;
                for (int l = 0; host_comp && l < c->n_layers; l++)
                    if (c->ratio[l]) want_rows += (c->ratio[l] == c->csa_ratio ? 2 : 1) * (n / (size_t)c->ratio[l]);
                md_model_state_stats(m, &now0, &late0);
                md_model_host_dev_slot_stats(m, &hits0, &rows0);
                float *lg = run_chunked(m, ids, n, chunks[ci]);
                md_model_state_stats(m, &now1, &late1);
                md_model_host_dev_slot_stats(m, &hits1, &rows1);
                if (rows1 - rows0 != want_rows)
                    fail_msg("%s %s compressors, chunk %zu: %llu rows copied into the partial-block copies, want %llu",
                             fx[f], host_comp ? "host" : "device", chunks[ci], (unsigned long long)(rows1 - rows0),
                             (unsigned long long)want_rows);
                if (chunks[ci] == 1 && !host_comp && hits1 - hits0 < n / 2)
                    fail_msg("%s: decode found its copies complete %llu times in %zu steps", fx[f],
                             (unsigned long long)(hits1 - hits0), n);
                if (now1 - now0 != want_now || late1 - late0 != want_late)
                    fail_msg("%s %s compressors, chunk %zu: %llu waits and %llu late updates, want %llu and %llu",
                             fx[f], host_comp ? "host" : "device", chunks[ci], (unsigned long long)(now1 - now0),
                             (unsigned long long)(late1 - late0), (unsigned long long)want_now,
                             (unsigned long long)want_late);
                if (host_comp && chunks[ci] == 1) assert_true(want_late > want_now); /* decode: most do not wait */
                for (size_t i = 0; i < n * (size_t)V; i++)
                    if (lg[i] != ref[i])
                        fail_msg("%s %s compressors, chunk %zu: position %zu differs from the host graph", fx[f],
                                 host_comp ? "host" : "device", chunks[ci], i / V);
                free(lg);
            }
            unsetenv("DEEPINFER_DEV_COMP");
        }
        free(ref);
        free(ids);
        md_model_free(m);
    }
    be_destroy(be);
}

/* The FP8 / FP4 checkpoint and its dequantised twin (the same weight values in bf16 / f32) are the same model
 * under transformers semantics, bit for bit.  Under official semantics they are not: the official linear()
 * quantises the activation of every FP8 / FP4 GEMM (act_quant), which the twin's bf16 GEMMs do not do;
 * test_model_official.py checks those values against the oracle. */
static void test_quantized_equals_twin(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(2);
    md_model *q = load_fixture_model(FIX("tiny-mixed-fp8fp4"), be, MD_SEM_TRANSFORMERS);
    md_model *t = load_fixture_model(FIX("tiny-mixed-fp8fp4-twin"), be, MD_SEM_TRANSFORMERS);
    const int V = md_model_config(q)->vocab_size;
    int32_t *ids = make_ids(150, V, 3);
    float *a = run_chunked(q, ids, 150, 0), *b = run_chunked(t, ids, 150, 0);
    assert_memory_equal(a, b, 150 * (size_t)V * sizeof(float));
    free(a);
    free(b);
    md_model_set_semantics(q, MD_SEM_OFFICIAL);
    md_model_set_semantics(t, MD_SEM_OFFICIAL);
    a = run_chunked(q, ids, 150, 0);
    b = run_chunked(t, ids, 150, 0);
    size_t differ = 0;
    for (size_t i = 0; i < 150 * (size_t)V; i++) differ += a[i] != b[i];
    assert_true(differ > 150 * (size_t)V / 2); /* act_quant moves (nearly) every logit */
    free(a);
    free(b);
    free(ids);
    md_model_free(q);
    md_model_free(t);
    be_destroy(be);
}

/* md_segment.top1: in a batch that mixes logits segments (last row, all rows) and top1 segments, each top1 is
 * rc_greedy of the logits the same segment gives when it asks for them, on the host path and on the device
 * graph (run on the host); and rc_greedy is the first maximum with NaN as -inf. */
static void test_top1(void **st)
{
    (void)st;
    const float r1[] = {1, 3, 3, NAN}, r2[] = {NAN, NAN}, r3[] = {-INFINITY, -1, INFINITY, INFINITY};
    assert_int_equal(rc_greedy(r1, 4), 1);
    assert_int_equal(rc_greedy(r2, 2), 0);
    assert_int_equal(rc_greedy(r3, 4), 2);
    be_backend *be = be_cpu_create(2);
    const char *fx[] = {FIX("tiny-mixed"), FIX("tiny-mixed-fp8fp4")};
    for (int f = 0; f < 2; f++) {
        md_model *m = load_fixture_model(fx[f], be, MD_SEM_OFFICIAL);
        const int V = md_model_config(m)->vocab_size;
        for (int dev = 0; dev < 2; dev++) {
            assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
            enum { NS = 5 };
            const size_t lens[NS] = {7, 1, 40, 3, 129};
            int32_t *ids[NS];
            md_seq *a[NS], *b[NS];
            float *lg = malloc(NS * 129 * (size_t)V * sizeof *lg);
            int32_t top[NS];
            md_segment sa[NS], sb[NS];
            for (int i = 0; i < NS; i++) {
                ids[i] = make_ids(lens[i], V, 90 + (uint64_t)i);
                a[i] = md_seq_create(m);
                b[i] = md_seq_create(m);
                /* a: everything as logits (segment 2 all rows); b: segments 0, 2, 4 as top1 */
                sa[i] = (md_segment){.seq = a[i], .ids = ids[i], .n = lens[i], .logits = lg + (size_t)i * 129 * V,
                                     .all_logits = i == 2};
                sb[i] = (md_segment){.seq = b[i], .ids = ids[i], .n = lens[i]};
                if (i % 2) sb[i].logits = malloc((size_t)V * sizeof(float));
                else sb[i].top1 = &top[i];
                top[i] = -1;
            }
            rc_err err = {0};
            assert_int_equal(md_forward(m, sa, NS, &err), 0);
            assert_int_equal(md_forward(m, sb, NS, &err), 0);
            for (int i = 0; i < NS; i++) {
                const float *last = lg + (size_t)i * 129 * V + (i == 2 ? (lens[i] - 1) * (size_t)V : 0);
                if (i % 2) assert_memory_equal(sb[i].logits, last, (size_t)V * sizeof(float));
                else if (top[i] != (int32_t)rc_greedy(last, (size_t)V))
                    fail_msg("%s dev %d segment %d: top1 %d, greedy of the logits %d", fx[f], dev, i, top[i],
                             (int)rc_greedy(last, (size_t)V));
                free(sb[i].logits);
                free(ids[i]);
                md_seq_free(a[i]);
                md_seq_free(b[i]);
            }
            free(lg);
        }
        assert_int_equal(md_model_set_host_dev_graph(m, 0), 0);
        md_model_free(m);
    }
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
        cmocka_unit_test(test_state_official),
        cmocka_unit_test(test_state_transformers),
        cmocka_unit_test(test_batching_is_invisible),
        cmocka_unit_test(test_host_dev_graph_is_the_host_graph),
        cmocka_unit_test(test_host_dev_graph_many_sequences),
        cmocka_unit_test(test_host_dev_graph_block_tables),
        cmocka_unit_test(test_state_waits_only_for_entries),
        cmocka_unit_test(test_quantized_equals_twin),
        cmocka_unit_test(test_top1),
        cmocka_unit_test(test_state_size),
        cmocka_unit_test(test_load_errors_name_the_tensor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
