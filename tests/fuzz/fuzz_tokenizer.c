/* fuzz_tokenizer.c - libFuzzer harness for the tokenizer.
 *
 * Properties checked on every input:
 *   - ill-formed UTF-8 is rejected with RC_EINVAL, never crashes;
 *   - content mode never yields an added token, and decodes back to the input;
 *   - template mode decodes back to the input with RC_DECODE_ADDED;
 *   - every safe cut is exact: encode(s) == encode(s[0,p)) ++ encode(s[p,n))
 *     (the invariant segmented parallel encoding rests on);
 *   - the bytes read as ids: streaming decode one id at a time == decode of
 *     the whole sequence, and the output is always valid UTF-8.
 * Run: build-asan/fuzz_tokenizer -max_total_time=60 tests/fuzz/corpus */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/pretok.h"
#include "recipe/tokenizer.h"
#include "recipe/unicode.h"

static rc_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    rc_err err = {0};
    if (rc_tokenizer_load(V4_DIR "/tokenizer.json", &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    return 0;
}

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "fuzz_tokenizer: check failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                               \
        }                                                                          \
    } while (0)

static void check_roundtrip(const char *s, size_t n, const rc_ids *ids, unsigned flags) {
    rc_bytes out = {0};
    rc_err err = {0};
    CHECK(rc_tokenizer_decode(tok, ids->v, ids->n, flags, &out, &err) == 0);
    CHECK(out.n == n && (n == 0 || memcmp(out.v, s, n) == 0));
    rc_bytes_free(&out);
}

static void fuzz_decoder(const uint8_t *data, size_t size) {
    size_t n = size / 2;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    int32_t nid = rc_tokenizer_n_ids(tok);
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)data[2 * i] | ((uint32_t)data[2 * i + 1] << 8);
        /* bias toward single-byte tokens so broken UTF-8 is common */
        ids[i] = (int32_t)((v & 1) ? (v >> 1) % 300 : (v >> 1) % (uint32_t)nid);
    }
    rc_bytes whole = {0}, step = {0};
    rc_err err = {0};
    int rc = rc_tokenizer_decode(tok, ids, n, RC_DECODE_ADDED, &whole, &err);
    rc_decoder d;
    rc_decoder_init(&d, tok, RC_DECODE_ADDED);
    int rc2 = 0;
    for (size_t i = 0; i < n && !rc2; i++) rc2 = rc_decoder_push(&d, &ids[i], 1, &step, &err);
    if (!rc2) rc_decoder_flush(&d, &step);
    CHECK((rc == 0) == (rc2 == 0));
    if (rc == 0) {
        CHECK(whole.n == step.n && (whole.n == 0 || !memcmp(whole.v, step.v, whole.n)));
        CHECK(rc_utf8_valid_prefix((const uint8_t *)whole.v, whole.n) == whole.n);
    }
    rc_bytes_free(&whole);
    rc_bytes_free(&step);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    rc_ids a = {0}, b = {0}, c = {0};
    rc_err err = {0};
    int valid = rc_utf8_valid_prefix(data, size) == size;
    int rc = rc_tokenizer_encode(tok, s, size, RC_ENCODE_CONTENT, &a, &err);
    CHECK(valid ? rc == 0 : rc == RC_EINVAL);
    if (valid) {
        for (size_t i = 0; i < a.n; i++) CHECK(!rc_tokenizer_is_added(tok, a.v[i]));
        check_roundtrip(s, size, &a, 0);
        CHECK(rc_tokenizer_encode(tok, s, size, RC_ENCODE_TEMPLATE, &b, &err) == 0);
        check_roundtrip(s, size, &b, RC_DECODE_ADDED);
        /* every safe cut, up to 16 of them */
        size_t p = 0;
        for (int k = 0; k < 16; k++) {
            p = rc_pretok_safe_cut(data, size, p + 1, size);
            if (p >= size) break;
            c.n = 0;
            CHECK(rc_tokenizer_encode(tok, s, p, RC_ENCODE_CONTENT, &c, &err) == 0);
            CHECK(rc_tokenizer_encode(tok, s + p, size - p, RC_ENCODE_CONTENT, &c, &err) == 0);
            if (c.n != a.n || memcmp(c.v, a.v, a.n * sizeof *a.v)) {
                fprintf(stderr, "safe cut at %zu changed the ids\n", p);
                abort();
            }
        }
    }
    fuzz_decoder(data, size);
    rc_ids_free(&a);
    rc_ids_free(&b);
    rc_ids_free(&c);
    return 0;
}
