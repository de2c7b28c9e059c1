/* sha256.h - SHA-256 (FIPS 180-4), written from the specification.
 *
 * Used for identities that must agree across processes and machines (prefix
 * block keys, model fingerprints), so it is the standard function and nothing
 * else: no seeds, no truncation.  Streaming: init, update any number of
 * times with any split, final.  Not constant-time-hardened; nothing here
 * hashes secrets. */
#ifndef KV_SHA256_H
#define KV_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define KV_SHA256_BYTES 32

typedef struct kv_sha256_ctx {
    uint32_t h[8];
    uint64_t nbytes;   /* message bytes so far */
    uint8_t buf[64];   /* the current, incomplete 64-byte block */
    size_t nbuf;
} kv_sha256_ctx;

void kv_sha256_init(kv_sha256_ctx *c);
void kv_sha256_update(kv_sha256_ctx *c, const void *data, size_t n);
void kv_sha256_final(kv_sha256_ctx *c, uint8_t out[KV_SHA256_BYTES]);
/* one-shot */
void kv_sha256(const void *data, size_t n, uint8_t out[KV_SHA256_BYTES]);

#endif
