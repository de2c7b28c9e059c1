/* tokenizer_internal.h - rc_tokenizer's layout, shared by tokenizer.c,
 * tokenizer_parallel.c and decode.c only. */
#ifndef RECIPE_TOKENIZER_INTERNAL_H
#define RECIPE_TOKENIZER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "recipe/tokenizer.h"

/* byte trie of added-token contents; node 0 is the root */
typedef struct {
    uint32_t child, sibling;
    int32_t id; /* token ending here, or -1 */
    uint8_t byte;
} rc_trie_node;

typedef struct {
    rc_trie_node *nodes;
    size_t n, cap;
    uint8_t first[256]; /* bytes that can start a token */
} rc_trie;

typedef struct {
    uint32_t tag; /* high hash bits | 1; 0 = empty */
    uint32_t koff, voff;
    uint16_t klen, vlen;
} rc_cache_slot;

/* per-thread BPE memo and scratch (see tokenizer.c) */
typedef struct rc_bpe_cache {
    struct rc_tokenizer *owner;
    struct rc_bpe_cache *next_cache;
    rc_cache_slot *slots;
    size_t nslots; /* power of two; grows up to a cap, so a fresh cache is small */
    uint8_t *keys;
    int32_t *vals;
    size_t nkeys, kcap, nvals, vcap, nentries;
    /* BPE work arrays: symbol id (-1 = merged away), links, pair rank/result */
    int32_t *w_id, *w_prev, *w_next, *w_res;
    uint32_t *w_rank;
    uint64_t *heap;
    size_t w_cap;
} rc_bpe_cache;

struct rc_tokenizer {
    int32_t n_ids;
    size_t n_added, n_merges;
    /* token id -> raw bytes in `bytes`; tok_len UINT32_MAX = unused id */
    uint32_t *tok_off, *tok_len;
    uint8_t *is_added;
    char *bytes;
    size_t bytes_len;
    int32_t byte_id[256];
    /* merges: open addressing over 8-byte slots packing left id (21 bits),
     * right id (21 bits) and rank (22 bits); all ones = empty.  Small slots
     * keep the table (2 MiB for V4) cache-friendly: cold BPE is bound by
     * these probes.  merge_res[rank] is the merged id. */
    uint64_t *merges;
    int32_t *merge_res;
    uint32_t merge_mask;
    /* pieces that BPE maps to exactly one token, found at load time by
     * running BPE over every vocab entry: slot = hash tag << 32 | id, 0 =
     * empty.  Exact by construction, shared by all threads, so the common
     * case needs neither the per-thread cache nor any merge lookups. */
    uint64_t *whole;
    uint32_t whole_mask;
    rc_trie trie_raw, trie_norm; /* normalized=false / normalized=true tokens */
    pthread_key_t cache_key;
    pthread_mutex_t cache_mu; /* guards `caches` */
    rc_bpe_cache *caches;
};

/* a template-mode span: an added token (id >= 0) or text to BPE (id < 0) */
typedef struct {
    size_t off, len;
    int32_t id;
} rc_span;

/* 0 if text is valid UTF-8, else RC_EINVAL naming the first bad byte */
int rc_check_utf8(const char *text, size_t len, rc_err *err);
int rc_split_added(const rc_tokenizer *t, const uint8_t *s, size_t n, rc_span **out, size_t *nout);
/* content-mode encode of already-validated UTF-8; RC_ENOMEM only */
int rc_encode_content_span(const rc_tokenizer *t, const uint8_t *s, size_t n, rc_ids *out);

#endif
