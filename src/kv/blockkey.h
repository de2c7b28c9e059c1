/* blockkey.h - the identity of a prefix block, and of the model it belongs to.
 *
 *   kv_model_fingerprint  32 bytes naming a checkpoint: config.json bytes,
 *                         every tensor's name, dtype and shape, a sample of
 *                         its bytes, and an optional revision string
 *   kv_key_chain          key of one block of token ids = SHA-256 over a
 *                         versioned, length-prefixed encoding of (parent key,
 *                         namespace, ids); block i's parent is block i-1's key
 *
 * Keys are pure functions of their inputs: no seeds, no host byte order, no
 * pointer values, so every process on every machine, before and after a
 * restart, computes the same key for the same prefix (docs/KV.md has the
 * exact byte encoding; tools/kv_key_vector.py recomputes it with hashlib).
 * A key commits to the whole prefix before it, so equal keys mean equal
 * prefixes under the same namespace. */
#ifndef KV_BLOCKKEY_H
#define KV_BLOCKKEY_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/safetensors.h"

#define KV_BLOCK_TOKENS 128 /* the prefix cache's block: a multiple of every V4 compress ratio and the window */
#define KV_KEY_BYTES 32
#define KV_KEY_HEX 65       /* 64 hex digits and a NUL */

typedef struct kv_key {
    uint8_t b[KV_KEY_BYTES];
} kv_key;

/* What, besides the tokens, decides a block's KV bytes (and who may share it). */
typedef struct kv_ns {
    uint8_t model[KV_KEY_BYTES]; /* kv_model_fingerprint */
    uint8_t semantics;           /* md_semantics: official and transformers KV differ */
    const char *salt;            /* cache salt / tenant namespace, NUL-terminated; NULL = "" */
} kv_ns;

/* kv_ns.semantics for a model under semantics `sem` (md_semantics: 0 official, 1 transformers).  The byte
 * names the numerics whose KV values a block holds, so that a store written by an engine with other numerics is
 * never read as this one's: 1 transformers; official 2 since the GEMM activation quantisation (act_quant,
 * 2026-11-30), 0 before it (no longer written). */
#define KV_SEM_TRANSFORMERS 1
#define KV_SEM_OFFICIAL_V0 0 /* official without act_quant: engines before 2026-11-30 */
#define KV_SEM_OFFICIAL 2
static inline uint8_t kv_semantics_byte(int sem) { return sem == 1 ? KV_SEM_TRANSFORMERS : KV_SEM_OFFICIAL; }

/* Key of the block `ids[0..n)` following `parent` (NULL for the first block
 * of a sequence).  The prefix cache uses n = KV_BLOCK_TOKENS; any n >= 1 is
 * accepted and hashed with its length.  RC_EINVAL when n is 0 or above
 * INT32_MAX, or ids/ns/out is NULL. */
int kv_key_chain(const kv_key *parent, const int32_t *ids, size_t n, const kv_ns *ns, kv_key *out);

/* lowercase hex, NUL-terminated */
void kv_key_hex(const kv_key *k, char out[KV_KEY_HEX]);
/* 64 hex digits (either case), nothing else -> 0; else RC_EINVAL */
int kv_key_from_hex(const char *hex, kv_key *out);
int kv_key_eq(const kv_key *a, const kv_key *b);

/* Fingerprint of a checkpoint from the bytes of its config.json and its
 * open tensor table.  revision (NULL = "") is mixed in as given: pass the
 * weights' revision (e.g. a hub commit) when two checkpoints could share
 * names, shapes and config yet differ in values beyond the sampled bytes. */
int kv_model_fingerprint(const uint8_t *config_json, size_t config_len, const md_ckpt *ck, const char *revision,
                         uint8_t out[KV_KEY_BYTES], rc_err *err);
/* The same for a model directory (config.json + safetensors, as md_model_load reads it). */
int kv_model_fingerprint_dir(const char *dir, const char *revision, uint8_t out[KV_KEY_BYTES], rc_err *err);

#endif
