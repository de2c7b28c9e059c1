/* test_kv.c - the foundation of the KV system: block identity and state
 * snapshots.
 *
 *   - SHA-256 against the FIPS 180-4 / NIST vectors, in one piece and split;
 *   - block keys: golden values recomputed by tools/kv_key_vector.py (hashlib),
 *     equal inputs give equal keys, any changed input gives another key;
 *   - model fingerprints tell checkpoints apart;
 *   - a state snapshotted at 256 (a block boundary) or 302 (mid-block, ring
 *     wrapped, every partial block holding live slots), restored or cloned, then
 *     continued in chunks gives logits bit-identical to the original and to a
 *     one-shot prefill, under both semantics;
 *   - damaged, foreign and crafted snapshots are refused with RC_EINVAL and a
 *     message and leave the target state fresh (run this under ASan). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_util.h"

#include "kv/blockkey.h"
#include "kv/sha256.h"
#include "model/v4.h"

#define FIX(name) MODEL_FIXTURE_DIR "/" name

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

/* ---------------------------------------------------------------- SHA-256 */

static void test_sha256_nist_vectors(void **st)
{
    (void)st;
    static const char m896[] = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqr"
                               "lmnopqrsmnopqrstnopqrstu";
    struct { const char *msg; const char *want; } v[] = {
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {m896, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    uint8_t d[32];
    char h[65];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        kv_sha256(v[i].msg, strlen(v[i].msg), d);
        hex(d, 32, h);
        assert_string_equal(h, v[i].want);
        /* every split into two updates gives the same digest */
        for (size_t cut = 0; cut <= strlen(v[i].msg); cut++) {
            kv_sha256_ctx c;
            kv_sha256_init(&c);
            kv_sha256_update(&c, v[i].msg, cut);
            kv_sha256_update(&c, v[i].msg + cut, strlen(v[i].msg) - cut);
            kv_sha256_final(&c, d);
            hex(d, 32, h);
            assert_string_equal(h, v[i].want);
        }
    }
    /* one million 'a': one piece, and pieces of awkward sizes */
    const char *want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    kv_sha256(a, 1000000, d);
    hex(d, 32, h);
    assert_string_equal(h, want);
    kv_sha256_ctx c;
    kv_sha256_init(&c);
    static const size_t steps[] = {1, 63, 64, 65, 127, 1000, 4099};
    size_t done = 0;
    for (int k = 0; done < 1000000; k++) {
        size_t n = steps[k % 7] < 1000000 - done ? steps[k % 7] : 1000000 - done;
        kv_sha256_update(&c, a + done, n);
        done += n;
    }
    kv_sha256_final(&c, d);
    hex(d, 32, h);
    assert_string_equal(h, want);
    free(a);
}

/* ------------------------------------------------------------- block keys */

static void fixed_block(int32_t *ids, uint32_t mul, uint32_t add)
{
    for (uint32_t i = 0; i < KV_BLOCK_TOKENS; i++) ids[i] = (int32_t)((i * mul + add) % 129280u);
}

static kv_ns fixed_ns(uint8_t sem, const char *salt)
{
    kv_ns ns = {.semantics = sem, .salt = salt};
    for (int i = 0; i < 32; i++) ns.model[i] = (uint8_t)i;
    return ns;
}

/* the output of `python3 tools/kv_key_vector.py` (hashlib over docs/KV.md's encoding) */
static void test_key_golden(void **st)
{
    (void)st;
    int32_t b0[KV_BLOCK_TOKENS], b1[KV_BLOCK_TOKENS];
    fixed_block(b0, 7919, 13);
    fixed_block(b1, 104729, 7);
    kv_ns a = fixed_ns(0, "tenant-a"), t = fixed_ns(1, "");
    kv_key k0, k1, k2, back;
    char h[KV_KEY_HEX];
    assert_int_equal(kv_key_chain(NULL, b0, KV_BLOCK_TOKENS, &a, &k0), 0);
    assert_int_equal(kv_key_chain(&k0, b1, KV_BLOCK_TOKENS, &a, &k1), 0);
    assert_int_equal(kv_key_chain(NULL, b0, KV_BLOCK_TOKENS, &t, &k2), 0);
    kv_key_hex(&k0, h);
    assert_string_equal(h, "c1714cea09bd429bb6f7a3bfc07797f3c668b25069d8776bf1848f99ac9e032f");
    kv_key_hex(&k1, h);
    assert_string_equal(h, "af2557b4da5d1c46156deaaa8f31fd9c8421b1e758c965b09359ff0f094c2b7f");
    kv_key_hex(&k2, h);
    assert_string_equal(h, "df9c0a2cadc7e929bf40ae26e653a5b636162f91a7af62433261bbc45b79140b");
    /* hex round trip, either case; anything else refused */
    assert_int_equal(kv_key_from_hex(h, &back), 0);
    assert_true(kv_key_eq(&back, &k2));
    assert_int_equal(kv_key_from_hex("DF9C0A2CADC7E929BF40AE26E653A5B636162F91A7AF62433261BBC45B79140B", &back), 0);
    assert_true(kv_key_eq(&back, &k2));
    assert_int_equal(kv_key_from_hex("df9c", &back), RC_EINVAL);
    assert_int_equal(kv_key_from_hex("zf9c0a2cadc7e929bf40ae26e653a5b636162f91a7af62433261bbc45b79140b", &back), RC_EINVAL);
    assert_int_equal(kv_key_from_hex("df9c0a2cadc7e929bf40ae26e653a5b636162f91a7af62433261bbc45b79140b0", &back), RC_EINVAL);
    /* bad arguments */
    assert_int_equal(kv_key_chain(NULL, b0, 0, &a, &k0), RC_EINVAL);
    assert_int_equal(kv_key_chain(NULL, NULL, 1, &a, &k0), RC_EINVAL);
    assert_int_equal(kv_key_chain(NULL, b0, 1, NULL, &k0), RC_EINVAL);
}

#define MAX_KEYS 1024

static void test_key_sensitivity(void **st)
{
    (void)st;
    int32_t ids[KV_BLOCK_TOKENS];
    fixed_block(ids, 7919, 13);
    kv_ns ns = fixed_ns(0, "tenant-a");
    kv_key parent, base, again, *all = malloc(MAX_KEYS * sizeof *all);
    size_t nall = 0;
    memset(parent.b, 0x5a, sizeof parent.b);
    assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &ns, &base), 0);
    all[nall++] = base;

    /* same inputs, same key: another call, another copy of every input */
    char salt_copy[] = "tenant-a";
    kv_ns ns2 = fixed_ns(0, salt_copy);
    kv_key parent2 = parent;
    int32_t ids2[KV_BLOCK_TOKENS];
    memcpy(ids2, ids, sizeof ids);
    assert_int_equal(kv_key_chain(&parent2, ids2, KV_BLOCK_TOKENS, &ns2, &again), 0);
    assert_true(kv_key_eq(&base, &again));
    /* a NULL salt is the empty salt */
    kv_ns en = fixed_ns(0, ""), nn = fixed_ns(0, NULL);
    kv_key ke, kn;
    assert_int_equal(kv_key_chain(NULL, ids, KV_BLOCK_TOKENS, &en, &ke), 0);
    assert_int_equal(kv_key_chain(NULL, ids, KV_BLOCK_TOKENS, &nn, &kn), 0);
    assert_true(kv_key_eq(&ke, &kn));
    all[nall++] = ke;

    /* every single-id change, at every position */
    for (int i = 0; i < KV_BLOCK_TOKENS; i++) {
        int32_t save = ids[i];
        ids[i] = save + 1;
        assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &ns, &all[nall++]), 0);
        ids[i] = save;
    }
    /* two adjacent ids swapped */
    int32_t t = ids[10];
    ids[10] = ids[11];
    ids[11] = t;
    assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &ns, &all[nall++]), 0);
    ids[11] = ids[10];
    ids[10] = t;
    /* every single-bit change of the parent; no parent; an all-zero parent */
    for (int bit = 0; bit < 256; bit++) {
        kv_key p = parent;
        p.b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_equal(kv_key_chain(&p, ids, KV_BLOCK_TOKENS, &ns, &all[nall++]), 0);
    }
    kv_key zero = {{0}};
    assert_int_equal(kv_key_chain(NULL, ids, KV_BLOCK_TOKENS, &ns, &all[nall++]), 0);
    assert_int_equal(kv_key_chain(&zero, ids, KV_BLOCK_TOKENS, &ns, &all[nall++]), 0);
    /* every single-bit change of the model fingerprint */
    for (int bit = 0; bit < 256; bit++) {
        kv_ns n2 = ns;
        n2.model[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &n2, &all[nall++]), 0);
    }
    /* semantics, salts (including ones that only differ in length or case) */
    kv_ns n3 = ns;
    n3.semantics = 1;
    assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &n3, &all[nall++]), 0);
    n3.semantics = 2;
    assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &n3, &all[nall++]), 0);
    /* the cache's bytes, as docs/KV.md gives them: official 2 (0 was official before act_quant and is never
     * written again), transformers 1 */
    assert_int_equal(kv_semantics_byte(MD_SEM_OFFICIAL), 2);
    assert_int_equal(kv_semantics_byte(MD_SEM_TRANSFORMERS), 1);
    assert_true(KV_SEM_OFFICIAL != KV_SEM_OFFICIAL_V0 && KV_SEM_OFFICIAL != KV_SEM_TRANSFORMERS &&
                KV_SEM_OFFICIAL_V0 != KV_SEM_TRANSFORMERS);
    static const char *salts[] = {"", "tenant-b", "tenant-a ", "tenant-", "Tenant-a", "tenant-aa", "t"};
    for (size_t i = 0; i < sizeof salts / sizeof salts[0]; i++) {
        kv_ns n4 = fixed_ns(0, salts[i]);
        assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS, &n4, &all[nall++]), 0);
    }
    /* a shorter block (the length is hashed) */
    assert_int_equal(kv_key_chain(&parent, ids, KV_BLOCK_TOKENS - 1, &ns, &all[nall++]), 0);
    assert_true(nall <= MAX_KEYS);

    /* all different from each other */
    for (size_t i = 0; i < nall; i++)
        for (size_t j = i + 1; j < nall; j++)
            if (kv_key_eq(&all[i], &all[j])) fail_msg("keys %zu and %zu collide", i, j);
    free(all);
}

/* ------------------------------------------------------------ fingerprint */

static void test_model_fingerprint(void **st)
{
    (void)st;
    uint8_t a[32], a2[32], b[32], q[32], tw[32], r[32], cfgd[32];
    rc_err err = {0};
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed"), NULL, a, &err), 0);
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed"), "", a2, &err), 0);
    assert_memory_equal(a, a2, 32);
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-hca16"), NULL, b, &err), 0);
    assert_memory_not_equal(a, b, 32);
    /* the FP8/FP4 checkpoint and its dequantised twin give the same logits but
     * are different checkpoints (dtypes, shapes of the scale tensors) */
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed-fp8fp4"), NULL, q, &err), 0);
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed-fp8fp4-twin"), NULL, tw, &err), 0);
    assert_memory_not_equal(q, tw, 32);
    assert_memory_not_equal(q, a, 32);
    assert_int_equal(kv_model_fingerprint_dir(FIX("tiny-mixed"), "rev-2", r, &err), 0);
    assert_memory_not_equal(a, r, 32);

    /* the config bytes count: one byte of config.json changed */
    md_ckpt *ck = NULL;
    assert_int_equal(md_ckpt_open(FIX("tiny-mixed"), &ck, &err), 0);
    FILE *f = fopen(FIX("tiny-mixed") "/config.json", "rb");
    assert_non_null(f);
    uint8_t cfg[65536];
    size_t n = fread(cfg, 1, sizeof cfg, f);
    fclose(f);
    assert_true(n > 0 && n < sizeof cfg);
    assert_int_equal(kv_model_fingerprint(cfg, n, ck, NULL, cfgd, &err), 0);
    assert_memory_equal(cfgd, a, 32);
    cfg[n / 2] ^= 1;
    assert_int_equal(kv_model_fingerprint(cfg, n, ck, NULL, cfgd, &err), 0);
    assert_memory_not_equal(cfgd, a, 32);
    md_ckpt_close(ck);

    err.msg[0] = 0;
    assert_int_not_equal(kv_model_fingerprint_dir(FIX("no-such-model"), NULL, r, &err), 0);
    assert_non_null(strstr(err.msg, "no-such-model"));
}

/* -------------------------------------------------------------- snapshots */



/* feed ids[0..n) in chunks of the given sizes (cycled); all logits into lg if not NULL */
static void feed(md_model *m, md_seq *s, const int32_t *ids, size_t n, const size_t *chunks, size_t nchunks,
                 float *lg)
{
    const size_t V = (size_t)md_model_config(m)->vocab_size;
    rc_err err = {0};
    for (size_t a = 0, k = 0; a < n; k++) {
        size_t c = chunks[k % nchunks] < n - a ? chunks[k % nchunks] : n - a;
        md_segment seg = {.seq = s, .ids = ids + a, .n = c, .logits = lg ? lg + a * V : NULL, .all_logits = 1};
        int rc = md_forward(m, &seg, 1, &err);
        if (rc) fail_msg("forward: %s", err.msg);
        a += c;
    }
}

static uint8_t *snapshot(const md_seq *s, size_t *len)
{
    rc_err err = {0};
    *len = md_seq_snapshot_size(s);
    uint8_t *b = malloc(*len);
    assert_int_equal(md_seq_snapshot(s, b, *len, &err), 0);
    return b;
}

/* dev: the device graph run on the host (md_model_set_host_dev_graph), whose state updates come after each
 * forward, whose compressors are its comp_pool op and whose attention reads partial blocks through copies kept
 * by block id (dev 3: one copy, changing hands): the state must come out the same */
static void snapshot_is_exact(md_semantics sem, int dev)
{
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, sem);
    assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
    const md_config *c = md_model_config(m);
    const size_t V = (size_t)c->vocab_size, N = 402;
    int32_t *ids = make_ids(N, c->vocab_size, 23);
    const size_t one[] = {(size_t)-1}, cont[] = {1, 7, 32, 60}; /* 100 tokens in four chunks */
    rc_err err = {0};

    /* references: one-shot prefill of 356 and of 402 tokens */
    float *ref356 = malloc(356 * V * sizeof(float)), *ref402 = malloc(N * V * sizeof(float));
    md_seq *r = md_seq_create(m);
    feed(m, r, ids, 356, one, 1, ref356);
    md_seq_free(r);
    r = md_seq_create(m);
    feed(m, r, ids, N, one, 1, ref402);
    md_seq_free(r);

    /* 256: a block boundary (HCA partials empty); 302: mid-block, the window
     * ring wrapped, the HCA partial block holding 46 live slots and the CSA
     * and indexer partial blocks 2 each */
    const size_t cut[] = {256, 302};
    for (int ci = 0; ci < 2; ci++) {
        const size_t p = cut[ci];
        const float *ref = p == 256 ? ref356 : ref402;
        md_seq *orig = md_seq_create(m);
        feed(m, orig, ids, p, one, 1, NULL);
        size_t len;
        uint8_t *snap = snapshot(orig, &len);
        /* size = header + the state's bytes (docs/KV.md) + CRC */
        assert_int_equal(len, 64 + 24 * (size_t)c->n_layers + md_seq_bytes(orig) + 4);

        md_seq *rest = md_seq_create(m);
        if (md_seq_restore(rest, snap, len, &err)) fail_msg("restore at %zu: %s", p, err.msg);
        assert_int_equal(md_seq_len(rest), (int64_t)p);
        assert_int_equal(md_seq_bytes(rest), md_seq_bytes(orig));
        md_seq *cl = md_seq_clone(orig);
        assert_non_null(cl);
        /* restore and clone rebuild the state byte for byte */
        size_t l2, l3;
        uint8_t *s2 = snapshot(rest, &l2), *s3 = snapshot(cl, &l3);
        assert_int_equal(l2, len);
        assert_int_equal(l3, len);
        assert_memory_equal(s2, snap, len);
        assert_memory_equal(s3, snap, len);
        free(s2);
        free(s3);

        /* continue all three with the same 100 tokens in chunks */
        md_seq *seqs[3] = {orig, rest, cl};
        float *lg[3];
        for (int k = 0; k < 3; k++) {
            lg[k] = malloc(100 * V * sizeof(float));
            feed(m, seqs[k], ids + p, 100, cont, 4, lg[k]);
            assert_int_equal(md_seq_len(seqs[k]), (int64_t)(p + 100));
        }
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < 100 * V; i++)
                if (lg[k][i] != ref[p * V + i])
                    fail_msg("cut %zu, state %d: position %zu differs from one-shot (%.9g vs %.9g)", p, k, p + i / V,
                             lg[k][i], ref[p * V + i]);
        for (int k = 0; k < 3; k++) {
            free(lg[k]);
            md_seq_free(seqs[k]);
        }
        free(snap);
    }
    /* an empty state round-trips too */
    md_seq *e = md_seq_create(m), *e2 = md_seq_create(m);
    size_t el;
    uint8_t *es = snapshot(e, &el);
    assert_int_equal(md_seq_restore(e2, es, el, &err), 0);
    assert_int_equal(md_seq_len(e2), 0);
    free(es);
    md_seq_free(e);
    md_seq_free(e2);

    free(ref356);
    free(ref402);
    free(ids);
    md_model_free(m);
    be_destroy(be);
}

static void test_snapshot_exact_official(void **st) { (void)st; snapshot_is_exact(MD_SEM_OFFICIAL, 0); }
static void test_snapshot_exact_transformers(void **st) { (void)st; snapshot_is_exact(MD_SEM_TRANSFORMERS, 0); }
/* dev 3: one partial-block copy for the whole model (part_slots.h: copies change hands between blocks and layers) */
static void test_snapshot_exact_dev_graph(void **st)
{
    (void)st;
    snapshot_is_exact(MD_SEM_OFFICIAL, 1);
    snapshot_is_exact(MD_SEM_OFFICIAL, 3);
}

/* An independent, bitwise CRC32C (the format's checksum), for crafting
 * snapshots whose checksum is right but whose contents are not. */
static uint32_t crc32c_ref(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void reseal(uint8_t *b, size_t len) { put32(b + len - 4, crc32c_ref(b, len - 4)); }

/* restore must refuse with RC_EINVAL, say why (containing `why` when given),
 * and leave the state fresh */
static void refused(md_seq *s, const uint8_t *b, size_t len, const char *why)
{
    rc_err err = {0};
    int rc = md_seq_restore(s, b, len, &err);
    if (rc != RC_EINVAL) fail_msg("restore of a bad snapshot (%zu bytes) returned %d, want RC_EINVAL", len, rc);
    assert_int_equal(err.code, RC_EINVAL);
    assert_true(strlen(err.msg) > 0);
    if (why && !strstr(err.msg, why)) fail_msg("message \"%s\" does not mention \"%s\"", err.msg, why);
    assert_int_equal(md_seq_len(s), 0);
}

static void test_snapshot_refuses_bad_input(void **st)
{
    (void)st;
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, MD_SEM_OFFICIAL);
    md_model *mt = load_fixture_model(FIX("tiny-mixed"), be, MD_SEM_TRANSFORMERS);
    md_model *h = load_fixture_model(FIX("tiny-hca16"), be, MD_SEM_OFFICIAL);
    const md_config *c = md_model_config(m);
    int32_t *ids = make_ids(300, c->vocab_size, 5);
    const size_t one[] = {(size_t)-1};
    rc_err err = {0};
    md_seq *src = md_seq_create(m);
    feed(m, src, ids, 300, one, 1, NULL);
    size_t len;
    uint8_t *good = snapshot(src, &len);
    uint8_t *b = malloc(len + 16);
    md_seq *dst = md_seq_create(m);

    /* the format's checksum is CRC32C as documented */
    assert_int_equal(crc32c_ref((const uint8_t *)"123456789", 9), 0xE3069283u);
    assert_int_equal(get32(good + len - 4), crc32c_ref(good, len - 4));

    /* a buffer too small to snapshot into */
    assert_int_equal(md_seq_snapshot(src, b, len - 1, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "bytes"));

    /* truncated, and padded */
    const size_t cuts[] = {0, 1, 8, 15, 16, 63, 64, 67, 183, 184, 1000, len / 2, len - 4, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) refused(dst, good, cuts[i], NULL);
    refused(dst, NULL, len, NULL);
    memcpy(b, good, len);
    b[len] = 0;
    refused(dst, b, len + 1, "header says");

    /* one flipped bit: every header byte, then a spread of positions, the CRC */
    size_t nflip = 0;
    for (size_t pos = 0; pos < len; pos = pos < 256 ? pos + 1 : pos + 613, nflip++) {
        memcpy(b, good, len);
        b[pos] ^= (uint8_t)(1u << (pos % 8));
        refused(dst, b, len, NULL);
    }
    for (size_t pos = len - 8; pos < len; pos++) {
        memcpy(b, good, len);
        b[pos] ^= 0x80;
        refused(dst, b, len, NULL);
    }
    assert_true(nflip > 700);
    /* a flipped bit in the float data is caught by the checksum */
    memcpy(b, good, len);
    b[len / 2] ^= 4;
    refused(dst, b, len, "CRC32C");

    /* another format version, with or without a valid checksum */
    memcpy(b, good, len);
    put32(b + 8, 2);
    refused(dst, b, len, "version 2");
    reseal(b, len);
    refused(dst, b, len, "version 2");

    /* crafted with a valid checksum: another length, a huge length, a header
     * size field that lies, a total that lies (buffer padded to match) */
    memcpy(b, good, len);
    put64(b + 24, 304); /* one more CSA entry than the data holds */
    reseal(b, len);
    refused(dst, b, len, "does not match");
    memcpy(b, good, len);
    put64(b + 24, (uint64_t)1 << 62);
    reseal(b, len);
    refused(dst, b, len, "out of range");
    memcpy(b, good, len);
    put32(b + 12, 7);
    reseal(b, len);
    refused(dst, b, len, "malformed");
    memcpy(b, good, len);
    put64(b + 16, len + 4);
    memset(b + len, 0, 4);
    reseal(b, len + 4);
    refused(dst, b, len + 4, NULL);
    /* a layer header claiming another ratio */
    memcpy(b, good, len);
    put32(b + 64 + 24 * 1, 8);
    reseal(b, len);
    refused(dst, b, len, "ratio");

    /* another model: tiny-hca16 into tiny-mixed */
    md_seq *hs = md_seq_create(h);
    feed(h, hs, ids, 300, one, 1, NULL);
    size_t hl;
    uint8_t *hsnap = snapshot(hs, &hl);
    refused(dst, hsnap, hl, "another model");
    /* the same model under the other semantics */
    md_seq *tdst = md_seq_create(mt);
    refused(tdst, good, len, "semantics");
    /* a state that is not fresh */
    md_seq *used = md_seq_create(m);
    feed(m, used, ids, 3, one, 1, NULL);
    assert_int_equal(md_seq_restore(used, good, len, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "fresh"));
    assert_int_equal(md_seq_len(used), 3);

    /* after all that, dst is still fresh and takes the good snapshot */
    assert_int_equal(md_seq_restore(dst, good, len, &err), 0);
    assert_int_equal(md_seq_len(dst), 300);
    size_t l2;
    uint8_t *again = snapshot(dst, &l2);
    assert_int_equal(l2, len);
    assert_memory_equal(again, good, len);

    free(again);
    free(hsnap);
    free(good);
    free(b);
    free(ids);
    md_seq_free(used);
    md_seq_free(tdst);
    md_seq_free(hs);
    md_seq_free(dst);
    md_seq_free(src);
    md_model_free(m);
    md_model_free(mt);
    md_model_free(h);
    be_destroy(be);
}

/* --------------------------------------------------------- blocks, attach */

/* Exact attach: a state that absorbed 256 tokens gives its 2 full blocks and
 * its boundary state; a fresh state attached to them continues bit for bit
 * like the original (and both like a one-shot prefill), while the original
 * keeps running on the same shared blocks.  Bounded replay: attached without
 * the boundary state, replaying R tokens; with R at least the dependency cone
 * W + (L-1)(W-1) the result is bit-identical too (tiny-mixed: 16 + 4*15 = 76);
 * with R = W it must differ somewhere (the replay is an approximation). */
static void attach_is_exact(md_semantics sem, int dev)
{
    be_backend *be = be_cpu_create(2);
    md_model *m = load_fixture_model(FIX("tiny-mixed"), be, sem);
    assert_int_equal(md_model_set_host_dev_graph(m, dev), 0);
    const md_config *c = md_model_config(m);
    const size_t V = (size_t)c->vocab_size, N = 300, CUT = 256;
    int32_t *ids = make_ids(N, c->vocab_size, 77);
    float *ref = malloc(N * V * sizeof(float)), *got = malloc(N * V * sizeof(float));
    rc_err err = {0};

    md_seq *one = md_seq_create(m);
    const size_t all[] = {N};
    feed(m, one, ids, N, all, 1, ref);
    md_seq_free(one);

    md_seq *a = md_seq_create(m);
    const size_t ch[] = {100, 56};
    feed(m, a, ids, CUT, ch, 2, NULL);
    assert_int_equal(md_seq_full_blocks(a), 2);
    size_t bl = md_seq_boundary_size(m);
    uint8_t *bnd = malloc(bl);
    assert_int_equal(md_seq_boundary_save(a, bnd, bl, &err), 0);
    md_block *blk[2] = {md_seq_block(a, 0), md_seq_block(a, 1)};
    assert_int_equal(blk[0]->refs, 1);

    md_seq *b = md_seq_create(m);
    assert_int_equal(md_seq_attach(b, blk, 2, bnd, bl, 0, &err), 0);
    assert_int_equal(md_seq_len(b), (int64_t)CUT);
    assert_int_equal(blk[0]->refs, 2);
    const size_t c7[] = {7};
    feed(m, b, ids + CUT, N - CUT, c7, 1, got + CUT * V);
    assert_memory_equal(got + CUT * V, ref + CUT * V, (N - CUT) * V * sizeof(float));
    /* the original continues on the shared blocks, unchanged */
    feed(m, a, ids + CUT, N - CUT, c7, 1, got + CUT * V);
    assert_memory_equal(got + CUT * V, ref + CUT * V, (N - CUT) * V * sizeof(float));

    /* replay covering the cone: exact; replay of one window: not */
    const int64_t cone = c->window + (int64_t)(c->n_layers - 1) * (c->window - 1);
    const int64_t reps[] = {128, cone, c->window};
    for (size_t k = 0; k < 3; k++) {
        md_seq *r = md_seq_create(m);
        assert_int_equal(md_seq_attach(r, blk, 2, NULL, 0, reps[k], &err), 0);
        assert_int_equal(md_seq_len(r), (int64_t)CUT - reps[k]);
        /* inside the replay a snapshot is refused (the window reaches below it) */
        size_t sl = md_seq_snapshot_size(r);
        uint8_t *sb = malloc(sl);
        assert_int_equal(md_seq_snapshot(r, sb, sl, &err), RC_EINVAL);
        free(sb);
        feed(m, r, ids + CUT - reps[k], (size_t)reps[k], c7, 1, NULL);
        /* the replay kept the blocks' entries: nothing was written into them */
        assert_int_equal(blk[1]->refs, 3); /* a, b, r */
        feed(m, r, ids + CUT, N - CUT, c7, 1, got + CUT * V);
        int same = !memcmp(got + CUT * V, ref + CUT * V, (N - CUT) * V * sizeof(float));
        if (k < 2) assert_true(same);
        else assert_false(same);
        md_seq_free(r);
        assert_int_equal(blk[1]->refs, 2);
    }

    /* refusals, each leaving the state fresh */
    md_seq *f = md_seq_create(m);
    assert_int_equal(md_seq_attach(f, blk, 1, bnd, bl, 0, &err), RC_EINVAL);  /* boundary at 256, blocks end at 128 */
    assert_non_null(strstr(err.msg, "256"));
    bnd[bl / 2] ^= 1;
    assert_int_equal(md_seq_attach(f, blk, 2, bnd, bl, 0, &err), RC_EINVAL);  /* damaged */
    bnd[bl / 2] ^= 1;
    assert_int_equal(md_seq_attach(f, blk, 2, NULL, 0, c->window - 1, &err), RC_EINVAL); /* replay < window */
    assert_int_equal(md_seq_attach(f, blk, 2, NULL, 0, 257, &err), RC_EINVAL);          /* replay > blocks */
    assert_int_equal(md_seq_len(f), 0);
    assert_int_equal(blk[0]->refs, 2);
    /* a boundary state is not a snapshot, and a snapshot is not a boundary state */
    assert_int_equal(md_seq_restore(f, bnd, bl, &err), RC_EINVAL);
    size_t sl = md_seq_snapshot_size(b);
    uint8_t *snap = malloc(sl);
    md_seq *b2 = md_seq_create(m);
    md_seq *at = md_seq_create(m);
    feed(m, b2, ids, CUT, all, 1, NULL);
    sl = md_seq_snapshot_size(b2);
    snap = realloc(snap, sl);
    assert_int_equal(md_seq_snapshot(b2, snap, sl, &err), 0);
    assert_int_equal(md_seq_attach(at, blk, 2, snap, sl, 0, &err), RC_EINVAL);
    /* boundary saves need a block boundary */
    assert_int_equal(md_seq_boundary_save(b, bnd, bl, &err), RC_EINVAL); /* b is at 300 */

    md_seq_free(at);
    md_seq_free(b2);
    md_seq_free(f);
    md_seq_free(b);
    assert_int_equal(blk[0]->refs, 1);
    md_seq_free(a);
    free(snap);
    free(bnd);
    free(ids);
    free(ref);
    free(got);
    md_model_free(m);
    be_destroy(be);
}

static void test_attach_official(void **st) { (void)st; attach_is_exact(MD_SEM_OFFICIAL, 0); }
static void test_attach_transformers(void **st) { (void)st; attach_is_exact(MD_SEM_TRANSFORMERS, 0); }
static void test_attach_dev_graph(void **st)
{
    (void)st;
    attach_is_exact(MD_SEM_OFFICIAL, 1);
    attach_is_exact(MD_SEM_OFFICIAL, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_nist_vectors),
        cmocka_unit_test(test_key_golden),
        cmocka_unit_test(test_key_sensitivity),
        cmocka_unit_test(test_model_fingerprint),
        cmocka_unit_test(test_snapshot_exact_official),
        cmocka_unit_test(test_snapshot_exact_transformers),
        cmocka_unit_test(test_snapshot_refuses_bad_input),
        cmocka_unit_test(test_attach_official),
        cmocka_unit_test(test_attach_transformers),
        cmocka_unit_test(test_snapshot_exact_dev_graph),
        cmocka_unit_test(test_attach_dev_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
