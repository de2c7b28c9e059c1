/* test_kv_cache.c - the prefix cache end to end below the engine: a state
 * publishes its blocks and window states through a tracker, a fresh state
 * attaches them from each tier, and continues with logits bit-identical to a
 * one-shot prefill.
 *
 *   - memory tier: blocks shared by reference, window state in RAM;
 *   - host tier: the memory tier at capacity 0 pushes blocks to host bytes;
 *   - disk tier: memory and host at 0, everything read back from --kv-dir;
 *   - restart: a new cache over the same directory (blocks and window state
 *     from disk);
 *   - bounded replay: window states expired (TTL 0) -> path replay, exact
 *     here because 128 tokens cover tiny-mixed's dependency cone; with a
 *     disk tier too (TTL 0 must not become "never expires" on disk);
 *   - namespaces: another salt misses; a prompt of one block + 1 token hits
 *     its block, one of exactly one block does not (its last token must be
 *     computed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model_util.h"

#include "kv/blockkey.h"
#include "kv/cache.h"
#include "model/v4.h"

#define FIX(name) MODEL_FIXTURE_DIR "/" name

enum { N = 300, CUT = 256 };

typedef struct {
    be_backend *be;
    md_model *m;
    uint8_t fp[KV_KEY_BYTES];
    int32_t *ids;
    float *ref;   /* [N, V] one-shot logits */
    size_t V;
    char dir[64];
} fix;

static void fwd(fix *f, md_seq *s, kv_track *t, const int32_t *ids, size_t n, float *lg)
{
    rc_err err = {0};
    if (t) assert_int_equal(kv_track_tokens(t, ids, n), 0);
    md_segment seg = {.seq = s, .ids = ids, .n = n, .logits = lg, .all_logits = 1};
    if (md_forward(f->m, &seg, 1, &err)) fail_msg("forward: %s", err.msg);
    if (t) kv_track_commit(t, s);
}

static int setup(void **st)
{
    fix *f = calloc(1, sizeof *f);
    f->be = be_cpu_create(2);
    f->m = load_fixture_model(FIX("tiny-mixed"), f->be, MD_SEM_OFFICIAL);
    rc_err err = {0};
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed"), NULL, f->fp, &err), 0);
    f->V = (size_t)md_model_config(f->m)->vocab_size;
    f->ids = make_ids(N, (int)f->V, 4242);
    f->ref = malloc(N * f->V * sizeof(float));
    md_seq *s = md_seq_create(f->m);
    fwd(f, s, NULL, f->ids, N, f->ref);
    md_seq_free(s);
    snprintf(f->dir, sizeof f->dir, "/tmp/test_kv_cache.%d", (int)getpid());
    *st = f;
    return 0;
}

static int teardown(void **st)
{
    fix *f = *st;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd)) { /* best effort */ }
    free(f->ids);
    free(f->ref);
    md_model_free(f->m);
    be_destroy(f->be);
    free(f);
    return 0;
}

static kv_cache *mk(fix *f, uint64_t mem, uint64_t host, int disk, uint32_t swa_ttl, const char *what)
{
    kv_cache_cfg cfg;
    kv_cache_cfg_defaults(&cfg);
    cfg.mem_bytes = mem;
    cfg.host_bytes = host;
    cfg.dir = disk ? f->dir : NULL;
    cfg.swa_ttl_s = swa_ttl;
    kv_cache *c = NULL;
    rc_err err = {0};
    if (kv_cache_create(f->m, &cfg, f->fp, &c, &err)) fail_msg("%s: %s", what, err.msg);
    return c;
}

/* a sequence absorbs ids[0..CUT) (publishing 2 blocks and the window states at 128 and 256) */
static void publish(fix *f, kv_cache *c, const char *salt)
{
    md_seq *s = md_seq_create(f->m);
    kv_track *t = kv_track_new(c, salt, KV_CLASS_CHAT);
    fwd(f, s, t, f->ids, 128, NULL);
    fwd(f, s, t, f->ids + 128, 72, NULL);
    fwd(f, s, t, f->ids + 200, CUT - 200, NULL);
    kv_track_free(t);
    md_seq_free(s);
    kv_cache_flush(c);
}

/* a fresh sequence attaches the prompt ids[0..N) and continues; its logits must equal the one-shot ones */
static void attach_check(fix *f, kv_cache *c, const char *salt, kv_path want, size_t want_hit, int tier)
{
    md_seq *s = md_seq_create(f->m);
    kv_track *t = kv_track_new(c, salt, KV_CLASS_CHAT);
    kv_attach_result r;
    kv_cache_attach(c, t, s, f->ids, N, &r);
    if (r.path != want) fail_msg("path %s, expected %s", kv_path_name(r.path), kv_path_name(want));
    assert_int_equal(r.hit_tokens, want_hit);
    assert_int_equal((size_t)md_seq_len(s), r.state_tokens);
    if (tier >= 0) assert_int_equal(r.blocks[tier], CUT / 128);
    float *lg = malloc(N * f->V * sizeof(float));
    const size_t from = r.state_tokens;
    fwd(f, s, t, f->ids + from, N - from, lg + from * f->V);
    /* rows before CUT may come from a replay: only the continuation is compared */
    assert_memory_equal(lg + CUT * f->V, f->ref + CUT * f->V, (N - CUT) * f->V * sizeof(float));
    free(lg);
    kv_track_free(t);
    md_seq_free(s);
}

static void test_memory_tier(void **st)
{
    fix *f = *st;
    kv_cache *c = mk(f, 1 << 30, 0, 0, 180, "memory");
    attach_check(f, c, NULL, KV_PATH_MISS, 0, -1);  /* empty cache */
    publish(f, c, NULL);
    attach_check(f, c, NULL, KV_PATH_EXACT, CUT, 0);
    attach_check(f, c, "tenant-b", KV_PATH_MISS, 0, -1);
    kv_cache_stats cs;
    kv_cache_get_stats(c, &cs);
    assert_int_equal(cs.path[KV_PATH_EXACT], 1);
    assert_int_equal(cs.hit_tokens, CUT);
    /* a prompt of exactly one block: its last token is in that block, no hit */
    md_seq *s = md_seq_create(f->m);
    kv_track *t = kv_track_new(c, NULL, KV_CLASS_CHAT);
    kv_attach_result r;
    kv_cache_attach(c, t, s, f->ids, 128, &r);
    assert_int_equal(r.path, KV_PATH_SHORT);
    kv_track_free(t);
    md_seq_free(s);
    s = md_seq_create(f->m);
    t = kv_track_new(c, NULL, KV_CLASS_CHAT);
    kv_cache_attach(c, t, s, f->ids, 129, &r);
    assert_int_equal(r.path, KV_PATH_EXACT);
    assert_int_equal(r.hit_tokens, 128);
    kv_track_free(t);
    md_seq_free(s);
    kv_cache_destroy(c);
}

static void test_host_tier(void **st)
{
    fix *f = *st;
    kv_cache *c = mk(f, 0, 1 << 30, 0, 180, "host");
    publish(f, c, NULL);
    attach_check(f, c, NULL, KV_PATH_EXACT, CUT, 1);
    kv_cache_destroy(c);
}

static void test_disk_tier_and_restart(void **st)
{
    fix *f = *st;
    kv_cache *c = mk(f, 0, 0, 1, 180, "disk");
    publish(f, c, "t1");
    attach_check(f, c, "t1", KV_PATH_EXACT, CUT, 2);
    kv_cache_stats cs;
    kv_cache_get_stats(c, &cs);
    assert_true(cs.disk_files >= 3);   /* 2 blocks + at least one window state */
    kv_cache_destroy(c);
    /* a new process's cache over the same directory */
    c = mk(f, 0, 0, 1, 180, "restart");
    attach_check(f, c, "t1", KV_PATH_EXACT, CUT, 2);
    kv_cache_get_stats(c, &cs);
    assert_int_equal(cs.swa_hits_disk, 1);
    assert_int_equal(cs.block_hits[2], 2);
    kv_cache_destroy(c);
}

static void test_replay_when_window_expired(void **st)
{
    fix *f = *st;
    kv_cache *c = mk(f, 1 << 30, 0, 0, 0, "replay");   /* window states expire at once */
    publish(f, c, NULL);
    attach_check(f, c, NULL, KV_PATH_REPLAY, CUT - 128, 0);
    kv_cache_stats cs;
    kv_cache_get_stats(c, &cs);
    assert_int_equal(cs.replayed_tokens, 128);
    kv_cache_destroy(c);
}

/* swa_ttl_s 0 = window states expire at once, with a disk tier too: the
 * store's TTL 0 means "never expires", so none may reach the disk (blocks
 * from disk, then a replay; also for a later cache over the directory) */
static void test_window_ttl0_with_disk(void **st)
{
    fix *f = *st;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir); /* earlier tests left window states with a 180 s TTL */
    if (system(cmd)) { /* best effort */ }
    kv_cache *c = mk(f, 0, 0, 1, 0, "ttl0 disk");
    publish(f, c, NULL);
    kv_cache_stats cs;
    kv_cache_get_stats(c, &cs);
    assert_int_equal(cs.disk_files, CUT / 128); /* the blocks only */
    attach_check(f, c, NULL, KV_PATH_REPLAY, CUT - 128, 2);
    kv_cache_get_stats(c, &cs);
    assert_int_equal(cs.swa_hits_disk, 0);
    kv_cache_destroy(c);
    c = mk(f, 0, 0, 1, 180, "ttl0 disk, restart");
    attach_check(f, c, NULL, KV_PATH_REPLAY, CUT - 128, 2);
    kv_cache_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_tier),
        cmocka_unit_test(test_host_tier),
        cmocka_unit_test(test_disk_tier_and_restart),
        cmocka_unit_test(test_replay_when_window_expired),
        cmocka_unit_test(test_window_ttl0_with_disk),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
