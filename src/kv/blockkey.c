/* blockkey.c - block keys and model fingerprints (encodings in docs/KV.md).
 *
 * Both are SHA-256 over a byte string built so that no two different inputs
 * give the same string: a version tag first (a new encoding gets a new tag,
 * so old and new keys never collide), every variable-length field preceded
 * by its length, every integer little-endian of a fixed width.  Nothing here
 * caches, stores or looks blocks up; that is the pool's and the tiers' job. */
#include "kv/blockkey.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/sha256.h"

#define KEY_TAG "deepinfer-kv-v1"
#define FP_TAG "deepinfer-model-v1"
#define FP_SAMPLE 64 /* bytes hashed from each end of every tensor */

static void put_u8(kv_sha256_ctx *h, uint8_t v) { kv_sha256_update(h, &v, 1); }

static void put_u32(kv_sha256_ctx *h, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    kv_sha256_update(h, b, 4);
}

static void put_u64(kv_sha256_ctx *h, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    kv_sha256_update(h, b, 8);
}

/* u32 length, then the bytes */
static void put_str(kv_sha256_ctx *h, const char *s, size_t n)
{
    put_u32(h, (uint32_t)n);
    kv_sha256_update(h, s, n);
}

int kv_key_chain(const kv_key *parent, const int32_t *ids, size_t n, const kv_ns *ns, kv_key *out)
{
    if (!ids || !ns || !out || n == 0 || n > INT32_MAX) return RC_EINVAL;
    const char *salt = ns->salt ? ns->salt : "";
    const size_t salt_len = strlen(salt);
    if (salt_len > UINT32_MAX) return RC_EINVAL;
    kv_sha256_ctx h;
    kv_sha256_init(&h);
    kv_sha256_update(&h, KEY_TAG, strlen(KEY_TAG));
    put_u8(&h, parent ? 1 : 0);
    if (parent) kv_sha256_update(&h, parent->b, KV_KEY_BYTES);
    kv_sha256_update(&h, ns->model, KV_KEY_BYTES);
    put_u8(&h, ns->semantics);
    put_str(&h, salt, salt_len);
    put_u32(&h, (uint32_t)n);
    uint8_t buf[4 * 64];
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < 64 && i < n; k++, i++) {
            uint32_t v = (uint32_t)ids[i];
            buf[4 * k] = (uint8_t)v;
            buf[4 * k + 1] = (uint8_t)(v >> 8);
            buf[4 * k + 2] = (uint8_t)(v >> 16);
            buf[4 * k + 3] = (uint8_t)(v >> 24);
        }
        kv_sha256_update(&h, buf, 4 * k);
    }
    kv_sha256_final(&h, out->b);
    return 0;
}

void kv_key_hex(const kv_key *k, char out[KV_KEY_HEX])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < KV_KEY_BYTES; i++) {
        out[2 * i] = hx[k->b[i] >> 4];
        out[2 * i + 1] = hx[k->b[i] & 15];
    }
    out[2 * KV_KEY_BYTES] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int kv_key_from_hex(const char *hex, kv_key *out)
{
    if (!hex || strlen(hex) != 2 * KV_KEY_BYTES) return RC_EINVAL;
    for (int i = 0; i < KV_KEY_BYTES; i++) {
        int a = hexval(hex[2 * i]), b = hexval(hex[2 * i + 1]);
        if (a < 0 || b < 0) return RC_EINVAL;
        out->b[i] = (uint8_t)(a << 4 | b);
    }
    return 0;
}

int kv_key_eq(const kv_key *a, const kv_key *b) { return !memcmp(a->b, b->b, KV_KEY_BYTES); }

/* ------------------------------------------------------------ fingerprint */

static int cmp_name(const void *a, const void *b)
{
    const md_tensor *x = *(const md_tensor *const *)a, *y = *(const md_tensor *const *)b;
    return strcmp(x->name, y->name);
}

int kv_model_fingerprint(const uint8_t *config_json, size_t config_len, const md_ckpt *ck, const char *revision,
                         uint8_t out[KV_KEY_BYTES], rc_err *err)
{
    if (!config_json || !ck || !out) return rc_errf(err, RC_EINVAL, "kv_model_fingerprint: missing argument");
    const char *rev = revision ? revision : "";
    const size_t nt = md_ckpt_count(ck);
    /* tensors in byte order of their normalized names, so sharding and file
     * order do not matter; names are unique (md_st_parse refuses duplicates) */
    const md_tensor **ord = malloc((nt ? nt : 1) * sizeof *ord);
    if (!ord) return rc_errf(err, RC_ENOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++) ord[i] = md_ckpt_at(ck, i);
    qsort(ord, nt, sizeof *ord, cmp_name);

    kv_sha256_ctx h;
    kv_sha256_init(&h);
    kv_sha256_update(&h, FP_TAG, strlen(FP_TAG));
    put_u64(&h, config_len);
    kv_sha256_update(&h, config_json, config_len);
    put_str(&h, rev, strlen(rev));
    put_u64(&h, nt);
    for (size_t i = 0; i < nt; i++) {
        const md_tensor *t = ord[i];
        const char *dt = md_dtype_name(t->dtype);
        put_str(&h, t->name, strlen(t->name));
        put_str(&h, dt, strlen(dt));
        put_u32(&h, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->shape[d]);
        put_u64(&h, t->nbytes);
        const uint8_t *p = t->data;
        if (t->nbytes <= 2 * FP_SAMPLE) {
            kv_sha256_update(&h, p, t->nbytes);
        } else {
            kv_sha256_update(&h, p, FP_SAMPLE);
            kv_sha256_update(&h, p + t->nbytes - FP_SAMPLE, FP_SAMPLE);
        }
    }
    kv_sha256_final(&h, out);
    free(ord);
    return 0;
}

int kv_model_fingerprint_dir(const char *dir, const char *revision, uint8_t out[KV_KEY_BYTES], rc_err *err)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return rc_errf(err, RC_EINVAL, "%s: path too long", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return rc_errf(err, RC_EIO, "%s: %s", path, strerror(errno));
    uint8_t *cfg = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            size_t nc = cap ? cap * 2 : 65536;
            uint8_t *p = realloc(cfg, nc);
            if (!p) { rc = rc_errf(err, RC_ENOMEM, "out of memory"); break; }
            cfg = p;
            cap = nc;
        }
        size_t k = fread(cfg + len, 1, cap - len, f);
        len += k;
        if (k == 0) {
            if (ferror(f)) rc = rc_errf(err, RC_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    md_ckpt *ck = NULL;
    if (!rc) rc = md_ckpt_open(dir, &ck, err);
    if (!rc) rc = kv_model_fingerprint(cfg, len, ck, revision, out, err);
    if (ck) md_ckpt_close(ck);
    free(cfg);
    return rc;
}
