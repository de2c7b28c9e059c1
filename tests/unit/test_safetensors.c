/* test_safetensors.c - checkpoint reading: every robustness case gives an
 * error naming the file and the tensor; a two-shard checkpoint with an index
 * loads with normalized names and the bytes that were written.
 *
 * Files are built byte by byte here (8-byte length, JSON header, data), so
 * the expected values come from the test, not from the reader. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"

static char tmpdir[256];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }

static int setup(void **state) {
    strcpy(tmpdir, "/tmp/test_safetensors.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) { return nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static char *path_of(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static void write_raw(const char *name, const void *bytes, size_t n) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* header length (as given, may lie), header text, data */
static void write_st_len(const char *name, uint64_t hlen, const char *header, const void *data,
                         size_t dlen) {
    size_t h = strlen(header);
    uint8_t *buf = malloc(8 + h + dlen + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, h);
    if (dlen) memcpy(buf + 8 + h, data, dlen);
    write_raw(name, buf, 8 + h + dlen);
    free(buf);
}

static void write_st(const char *name, const char *header, size_t dlen) {
    uint8_t *data = malloc(dlen + 1);
    for (size_t i = 0; i < dlen; i++) data[i] = (uint8_t)(i * 7 + 3);
    write_st_len(name, strlen(header), header, data, dlen);
    free(data);
}

/* Opening name must fail with a message containing every given fragment. */
static void expect_open_fails(const char *what, int code, ...) {
    md_ckpt *c = (md_ckpt *)1;
    rc_err err = {0};
    int rc = md_ckpt_open(what, &c, &err);
    if (rc == 0) fail_msg("%s: opened, expected an error", what);
    assert_null(c);
    if (code) assert_int_equal(rc, code);
    va_list ap;
    va_start(ap, code);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(err.msg, frag)) fail_msg("error \"%s\" does not mention \"%s\"", err.msg, frag);
    va_end(ap);
}

static void test_truncated(void **state) {
    write_raw("model.safetensors", "\x10\0\0\0", 4);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "shorter than", NULL);
    write_raw("model.safetensors", "", 0); /* empty file: no mmap possible, same message */
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "shorter than", NULL);
}

static void test_header_larger_than_file(void **state) {
    write_st_len("model.safetensors", 1000, "{}", NULL, 0);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "header length 1000", NULL);
    write_st_len("model.safetensors", UINT64_MAX, "{}", NULL, 0);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "larger than the file", NULL);
}

static void test_bad_headers(void **state) {
    static const struct {
        const char *header, *frag;
        int code;
    } cases[] = {
        {"{\"a\": ", "not valid JSON", RC_EINVAL},
        {"[1, 2]", "not a JSON object", RC_EINVAL},
        {"{\"w\": 5}", "'w': entry is not an object", RC_EINVAL},
        {"{\"w\": {\"shape\": [2], \"data_offsets\": [0, 4]}}", "'w': missing dtype", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"data_offsets\": [0, 4]}}", "'w': missing shape", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2]}}", "'w': missing data_offsets", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"F8_E5M2\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
         "'w': unknown dtype 'F8_E5M2'", RC_EUNSUP},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [-2], \"data_offsets\": [0, 4]}}", "'w': shape[0]",
         RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2.0], \"data_offsets\": [0, 4]}}", "'w': shape[0]",
         RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [-1, 3]}}",
         "'w': data_offsets are not", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4.5]}}",
         "'w': data_offsets are not", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0]}}", "'w': data_offsets is not",
         RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [0], \"data_offsets\": [4, 0]}}", "'w': data_offsets begin 4 > end 0",
         RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 4]}}", "'w': shape [3] of BF16 needs 6 bytes",
         RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [1,1,1,1,1,1,1,1,2], \"data_offsets\": [0, 4]}}",
         "'w': 9 dimensions", RC_EUNSUP},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}",
         "'w': shape is too large", RC_EINVAL},
        {"{\"w\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [0, 4]}, \"w\": {}}",
         "duplicate object key near '\"w\"'", RC_EINVAL},
        {"{\"__metadata__\": {\"format\": 1}}", "__metadata__ value 'format' is not a string", RC_EINVAL},
        {"{\"__metadata__\": [1]}", "__metadata__ is not an object", RC_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st("model.safetensors", cases[i].header, 16);
        expect_open_fails(tmpdir, cases[i].code, "model.safetensors", cases[i].frag, NULL);
    }
}

static void test_out_of_range(void **state) {
    write_st("model.safetensors",
             "{\"ok\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
             " \"far\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
             16);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "'far'", "[12, 20) out of range", NULL);
}

static void test_overlap(void **state) {
    write_st("model.safetensors",
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
             " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
             " \"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [14, 22]}}",
             32);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "'a' [0, 16)", "'b' [14, 22)", "overlap",
                      NULL);
    /* tensors nested inside a longer one */
    write_st("model.safetensors",
             "{\"long\": {\"dtype\": \"U8\", \"shape\": [20], \"data_offsets\": [0, 20]},"
             " \"mid\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]},"
             " \"in\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [10, 12]}}",
             32);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "'long'", "overlap", NULL);
}

static void test_duplicate_after_normalization(void **state) {
    write_st("model.safetensors",
             "{\"model.embed_tokens.weight\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
             " \"embed.weight\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [4, 8]}}",
             8);
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors", "'model.embed_tokens.weight'",
                      "'embed.weight'", NULL);
}

/* ---- index checkpoints */

static void write_two_shards(void) {
    /* shard 1: 4 + 8 + 4 bytes of data; shard 2: 6 + 4 */
    write_st("model-00001-of-00002.safetensors",
             "{\"__metadata__\": {\"format\": \"pt\"},"
             " \"model.embed_tokens.weight\": {\"dtype\": \"BF16\", \"shape\": [2, 1], \"data_offsets\": [0, 4]},"
             " \"model.layers.0.attn.wq_a.weight\": {\"dtype\": \"F8_E4M3\", \"shape\": [2, 4], \"data_offsets\": [4, 12]},"
             " \"model.hc_head.hc_fn\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [12, 16]}}",
             16);
    write_st("model-00002-of-00002.safetensors",
             "{\"lm_head.weight\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 6]},"
             " \"model.layers.0.attn.wq_a.scale\": {\"dtype\": \"F8_E8M0\", \"shape\": [1, 1], \"data_offsets\": [6, 7]},"
             " \"model.layers.0.ffn.experts.0.w1.weight\": {\"dtype\": \"I8\", \"shape\": [1, 3], \"data_offsets\": [7, 10]}}",
             10);
}

static const char *good_index =
    "{\"metadata\": {\"total_size\": 26}, \"weight_map\": {"
    "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
    "\"model.layers.0.attn.wq_a.weight\": \"model-00001-of-00002.safetensors\","
    "\"model.hc_head.hc_fn\": \"model-00001-of-00002.safetensors\","
    "\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
    "\"model.layers.0.attn.wq_a.scale\": \"model-00002-of-00002.safetensors\","
    "\"model.layers.0.ffn.experts.0.w1.weight\": \"model-00002-of-00002.safetensors\"}}";

static void write_index(const char *text) { write_raw("model.safetensors.index.json", text, strlen(text)); }

static void progress(void *arg, uint64_t done, uint64_t total) {
    uint64_t *last = arg;
    assert_true(done <= total);
    last[0] = done;
    last[1] = total;
    last[2]++;
}

static void test_two_shards(void **state) {
    write_two_shards();
    write_index(good_index);
    md_ckpt *c = NULL;
    rc_err err = {0};
    int rc = md_ckpt_open(tmpdir, &c, &err);
    if (rc) fail_msg("open: %s", err.msg);
    assert_int_equal(md_ckpt_count(c), 6);
    assert_int_equal(md_ckpt_total_bytes(c), 26);
    /* file order: shard 1 by offset, then shard 2 */
    static const char *order[] = {"embed.weight", "layers.0.attn.wq_a.weight", "hc_head_fn", "head.weight",
                                  "layers.0.attn.wq_a.scale", "layers.0.ffn.experts.0.w1.weight"};
    for (size_t i = 0; i < 6; i++) assert_string_equal(md_ckpt_at(c, i)->name, order[i]);
    assert_null(md_ckpt_at(c, 6));

    const md_tensor *t = md_ckpt_find(c, "layers.0.attn.wq_a.weight");
    assert_non_null(t);
    assert_string_equal(t->raw_name, "model.layers.0.attn.wq_a.weight");
    assert_non_null(strstr(t->file, "model-00001-of-00002.safetensors"));
    assert_int_equal(t->dtype, MD_F8_E4M3);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 4);
    assert_int_equal(t->nbytes, 8);
    for (size_t i = 0; i < 8; i++) assert_int_equal(((const uint8_t *)t->data)[i], (uint8_t)((4 + i) * 7 + 3));
    t = md_ckpt_find(c, "head.weight");
    assert_non_null(t);
    assert_string_equal(t->raw_name, "lm_head.weight");
    for (size_t i = 0; i < 6; i++) assert_int_equal(((const uint8_t *)t->data)[i], (uint8_t)(i * 7 + 3));
    assert_non_null(md_ckpt_find(c, "embed.weight"));
    assert_non_null(md_ckpt_find(c, "hc_head_fn"));
    assert_null(md_ckpt_find(c, "model.embed_tokens.weight")); /* only normalized names */
    assert_null(md_ckpt_find(c, "hc_head.hc_fn"));
    assert_null(md_ckpt_find(c, "lm_head.weight"));

    /* md_ckpt_get: good, wrong dtype, wrong shape, missing */
    int64_t shp[2] = {2, 4};
    rc = md_ckpt_get(c, "layers.0.attn.wq_a.weight", MD_DT(MD_F8_E4M3) | MD_DT(MD_BF16), 2, shp, &t, &err);
    assert_int_equal(rc, 0);
    assert_string_equal(t->name, "layers.0.attn.wq_a.weight");
    assert_int_equal(md_ckpt_get(c, "hc_head_fn", 0, -1, NULL, NULL, &err), 0);

    rc = md_ckpt_get(c, "head.weight", MD_DT(MD_F32), -1, NULL, &t, &err);
    assert_int_equal(rc, RC_EINVAL);
    assert_null(t);
    assert_non_null(strstr(err.msg, "'head.weight'"));
    assert_non_null(strstr(err.msg, "lm_head.weight"));
    assert_non_null(strstr(err.msg, "model-00002-of-00002.safetensors"));
    assert_non_null(strstr(err.msg, "dtype BF16, expected F32"));

    rc = md_ckpt_get(c, "layers.0.attn.wq_a.weight", MD_DT(MD_BF16) | MD_DT(MD_F32), -1, NULL, NULL, &err);
    assert_int_equal(rc, RC_EINVAL);
    assert_non_null(strstr(err.msg, "dtype F8_E4M3, expected BF16 or F32"));

    int64_t bad[2] = {4, 2};
    rc = md_ckpt_get(c, "layers.0.attn.wq_a.weight", 0, 2, bad, NULL, &err);
    assert_int_equal(rc, RC_EINVAL);
    assert_non_null(strstr(err.msg, "'layers.0.attn.wq_a.weight'"));
    assert_non_null(strstr(err.msg, "shape [2, 4], expected [4, 2]"));
    rc = md_ckpt_get(c, "layers.0.attn.wq_a.weight", 0, 1, bad, NULL, &err);
    assert_non_null(strstr(err.msg, "shape [2, 4], expected [4]"));

    rc = md_ckpt_get(c, "layers.1.attn.wq_a.weight", 0, -1, NULL, NULL, &err);
    assert_int_equal(rc, RC_EINVAL);
    assert_non_null(strstr(err.msg, "'layers.1.attn.wq_a.weight' is missing"));

    uint64_t last[3] = {0};
    md_ckpt_touch(c, progress, last);
    assert_int_equal(last[0], last[1]);
    assert_true(last[1] > 26 && last[2] >= 1);
    md_ckpt_touch(c, NULL, NULL);
    md_ckpt_close(c);
}

static void test_single_file(void **state) {
    write_st("model.safetensors",
             "{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             " \"scalar\": {\"dtype\": \"F64\", \"shape\": [], \"data_offsets\": [8, 16]},"
             " \"empty\": {\"dtype\": \"BOOL\", \"shape\": [0, 5], \"data_offsets\": [16, 16]}}",
             20); /* trailing bytes after the last tensor are allowed */
    write_index("{ broken"); /* model.safetensors wins; the index is not read */
    const char *paths[] = {tmpdir, path_of("model.safetensors")};
    for (int k = 0; k < 2; k++) {
        md_ckpt *c = NULL;
        rc_err err = {0};
        if (md_ckpt_open(paths[k], &c, &err)) fail_msg("open %s: %s", paths[k], err.msg);
        assert_int_equal(md_ckpt_count(c), 3);
        assert_non_null(md_ckpt_find(c, "norm.weight"));
        const md_tensor *s = md_ckpt_find(c, "scalar");
        assert_int_equal(s->ndim, 0);
        assert_int_equal(s->nbytes, 8);
        assert_int_equal(md_ckpt_find(c, "empty")->nbytes, 0);
        md_ckpt_close(c);
    }
}

static void test_bad_index(void **state) {
    write_two_shards();
    /* the shard a tensor maps to does not exist */
    write_index("{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                " \"lm_head.weight\": \"model-00003-of-00003.safetensors\"}}");
    expect_open_fails(tmpdir, RC_EIO, "model.safetensors.index.json", "'lm_head.weight'",
                      "'model-00003-of-00003.safetensors'", "does not exist", NULL);
    /* a listed tensor is not in its shard */
    write_index("{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(tmpdir, RC_EINVAL, "'model.embed_tokens.weight'", "'model-00002-of-00002.safetensors'",
                      "does not hold it", NULL);
    /* the tensor is in the other shard */
    char *idx = strdup(good_index);
    char *p = strstr(idx, "\"lm_head.weight\": \"model-00002");
    p[strlen("\"lm_head.weight\": \"model-0000")] = '1';
    write_index(idx);
    free(idx);
    expect_open_fails(tmpdir, RC_EINVAL, "'lm_head.weight'", "'model-00001-of-00002.safetensors'",
                      "does not hold it", "it is in", NULL);
    /* a shard tensor the index does not list */
    write_index("{\"weight_map\": {"
                "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                "\"model.layers.0.attn.wq_a.weight\": \"model-00001-of-00002.safetensors\"}}");
    expect_open_fails(tmpdir, RC_EINVAL, "model-00001-of-00002.safetensors", "'model.hc_head.hc_fn'",
                      "not listed", NULL);
    /* malformed index files */
    write_index("{\"weight_map\": [1]}");
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors.index.json", "weight_map", NULL);
    write_index("{\"weight_map\": {}}");
    expect_open_fails(tmpdir, RC_EINVAL, "weight_map is empty", NULL);
    write_index("{\"weight_map\": {\"x\": 3}}");
    expect_open_fails(tmpdir, RC_EINVAL, "entry 'x' is not a file name", NULL);
    write_index("{\"weight_map\": {\"x\": \"../etc/passwd\"}}");
    expect_open_fails(tmpdir, RC_EINVAL, "'x' maps to '../etc/passwd'", NULL);
    write_index("{\"weight_map\": ");
    expect_open_fails(tmpdir, RC_EINVAL, "model.safetensors.index.json", "not valid JSON", NULL);
    /* the same tensor in two shards */
    write_st("model-00002-of-00002.safetensors",
             "{\"embed.weight\": {\"dtype\": \"BF16\", \"shape\": [2, 1], \"data_offsets\": [0, 4]}}", 4);
    write_index("{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
                " \"embed.weight\": \"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(tmpdir, RC_EINVAL, "'embed.weight' appears twice", "model.embed_tokens.weight",
                      "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", NULL);
    /* a bad shard inside an index checkpoint names the shard */
    write_st("model-00002-of-00002.safetensors",
             "{\"lm_head.weight\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 5]}}", 6);
    write_index(good_index);
    expect_open_fails(tmpdir, RC_EINVAL, "model-00002-of-00002.safetensors", "'lm_head.weight'", NULL);
    /* nothing to open */
    unlink(path_of("model.safetensors.index.json"));
    expect_open_fails(tmpdir, RC_EIO, "no model.safetensors", NULL);
    expect_open_fails(path_of("nonexistent"), RC_EIO, "nonexistent", NULL);
}

static void test_normalize(void **state) {
    static const char *cases[][2] = {
        {"model.embed_tokens.weight", "embed.weight"},
        {"embed_tokens.weight", "embed.weight"},
        {"model.hc_head.hc_fn", "hc_head_fn"},
        {"model.hc_head.hc_base", "hc_head_base"},
        {"model.hc_head.hc_scale", "hc_head_scale"},
        {"lm_head.weight", "head.weight"},
        {"head.weight", "head.weight"},
        {"model.norm.weight", "norm.weight"},
        {"model.layers.0.ffn.gate.tid2eid", "layers.0.ffn.gate.tid2eid"},
        {"layers.3.attn.wkv.scale", "layers.3.attn.wkv.scale"},
        {"model.model.x", "model.x"}, /* one prefix only */
        {"mtp.0.hc_head_fn", "mtp.0.hc_head_fn"},
    };
    char out[128];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(md_st_normalize(cases[i][0], out, sizeof out), (int)strlen(cases[i][1]));
        assert_string_equal(out, cases[i][1]);
    }
    assert_int_equal(md_st_normalize("model.norm.weight", out, 5), -1);
}

/* md_st_parse on memory: the fuzz entry point */
static void test_parse_memory(void **state) {
    const char *h = "{\"b\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
                    " \"a\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    size_t hl = strlen(h);
    uint8_t buf[256] = {0};
    buf[0] = (uint8_t)hl;
    memcpy(buf + 8, h, hl);
    md_tensor *t;
    size_t n;
    rc_err err = {0};
    assert_int_equal(md_st_parse(buf, 8 + hl + 8, "mem", &t, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(t[0].name, "a"); /* sorted by offset */
    assert_ptr_equal(t[0].data, buf + 8 + hl);
    assert_ptr_equal(t[1].data, buf + 8 + hl + 4);
    assert_string_equal(t[1].file, "mem");
    md_st_free(t);
    assert_int_equal(md_st_parse(buf, 8 + hl + 7, NULL, &t, &n, &err), RC_EINVAL);
    assert_null(t);
    assert_non_null(strstr(err.msg, "'b'"));

    /* two raw names, one normalized name */
    h = "{\"lm_head.weight\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
        " \"model.head.weight\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
    hl = strlen(h);
    buf[0] = (uint8_t)hl;
    memcpy(buf + 8, h, hl);
    assert_int_equal(md_st_parse(buf, 8 + hl + 8, "mem", &t, &n, &err), RC_EINVAL);
    assert_non_null(strstr(err.msg, "mem: tensors"));
    assert_non_null(strstr(err.msg, "'lm_head.weight'"));
    assert_non_null(strstr(err.msg, "'model.head.weight'"));
    assert_non_null(strstr(err.msg, "normalize to 'head.weight'"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_larger_than_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_after_normalization, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_index, setup, teardown),
        cmocka_unit_test(test_normalize),
        cmocka_unit_test(test_parse_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
