/* cache.h - the prefix KV cache: 128-token blocks in three tiers, window
 * states with a short TTL, and the per-sequence bookkeeping that feeds them.
 *
 *   memory tier  md_block objects (v4.h) in an index by block key; blocks in
 *                use by sequences are shared by reference count, the others
 *                wait in an LRU and leave when the tier is over capacity
 *   host tier    block bytes evicted from the memory tier (LRU, capacity)
 *   disk tier    every published block, written through asynchronously to
 *                --kv-dir (kv/store.h: atomic, checksummed, TTL per traffic
 *                class); a shared mount makes any server hit any prefix
 *   window       boundary states (md_seq_boundary_save: rings and compressor
 *                slices at a block boundary) keyed by the key of the block
 *                they end, in RAM with a short TTL (default 180 s) and, with
 *                a disk tier, on disk with the same TTL
 *
 * kv_cache_attach runs when a request is admitted: it walks the prompt's
 * block keys from the first block to the first miss (never the block holding
 * the last prompt token: its logits are needed), then attaches the hit blocks
 * to the fresh state either exactly (a window state at the hit point or up to
 * window_every blocks before it: the tokens after it are then recomputed,
 * exactly) or by bounded replay (the last `replay` tokens before
 * the hit point are recomputed with the window truncated to them).  Replayed
 * tokens are not hits.  A sequence tracked by kv_track publishes each block
 * it completes and the window state at each block boundary it reaches.
 *
 * A sequence that took an approximate replay (replay shorter than the model's
 * dependency cone W + (L-1)(W-1)) publishes what it computes after the hit
 * point (publish_replayed, the default, as DeepInfer does: the session goes
 * on from the state its answer came from, and later turns hit it); with
 * publish_replayed 0 it publishes nothing, and the cache only ever holds what
 * a full recompute gives.
 *
 * Threads: every call except kv_cache_get_stats comes from the engine thread.
 * Block bytes are host little-endian floats (every supported host). */
#ifndef KV_CACHE_H
#define KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "kv/blockkey.h"
#include "model/v4.h"

enum { KV_CLASS_AGENT = 0, KV_CLASS_CHAT = 1, KV_CLASS_COUNT };

typedef struct {
    uint64_t mem_bytes;        /* memory tier: unreferenced blocks kept beyond those in use; default 1 GiB */
    uint64_t host_bytes;       /* host tier; 0 = none */
    const char *dir;           /* disk tier; NULL = none */
    uint64_t disk_bytes;       /* 0 = unlimited */
    int compress;              /* zstd level for the disk tier; 0 = off */
    uint32_t ttl_s[KV_CLASS_COUNT]; /* default 72 h agent, 168 h chat */
    uint32_t swa_ttl_s;        /* window states; default 180 s; 0 = not kept (RAM or disk) */
    uint64_t swa_bytes;        /* RAM for window states; default 1 GiB */
    int replay;                /* bounded replay tokens; 0 = exact hits only; default 128 */
    int window_every;          /* publish window states every N blocks inside prefill chunks (and at each
                                * chunk's last boundary, and every boundary while decoding); default 4 */
    int publish_replayed;      /* publish what sequences compute after an approximate replay; default 1 */
} kv_cache_cfg;

void kv_cache_cfg_defaults(kv_cache_cfg *c);

typedef struct kv_cache kv_cache;

/* fingerprint: kv_model_fingerprint of the checkpoint m was loaded from */
int kv_cache_create(md_model *m, const kv_cache_cfg *cfg, const uint8_t fingerprint[KV_KEY_BYTES], kv_cache **out,
                    rc_err *err);
void kv_cache_destroy(kv_cache *c);   /* finishes disk writes */
void kv_cache_flush(kv_cache *c);     /* waits for queued disk writes (tests) */
int kv_cache_window_every(const kv_cache *c);

typedef enum {
    KV_PATH_MISS = 0,   /* no block of the prompt was cached */
    KV_PATH_SHORT,      /* the prompt has no full block before its last token */
    KV_PATH_EXACT,      /* blocks + window state: the continuation is exact */
    KV_PATH_REPLAY,     /* blocks + bounded replay */
} kv_path;
const char *kv_path_name(kv_path p);

typedef struct {
    kv_path path;
    size_t hit_tokens;    /* prompt tokens whose KV came from the cache */
    size_t state_tokens;  /* tokens the state holds after attach (replay starts here) */
    size_t blocks[3];     /* hit blocks per tier: memory, host, disk */
} kv_attach_result;

typedef struct kv_track kv_track;

/* A tracker for a sequence in namespace (salt, class).  NULL when out of memory. */
kv_track *kv_track_new(kv_cache *c, const char *salt, int cls);
void kv_track_free(kv_track *t);

/* On a fresh state s tracked by t: find and attach the longest cached
 * prefix of prompt[0..n).  Never fails: any problem is a miss. */
void kv_cache_attach(kv_cache *c, kv_track *t, md_seq *s, const int32_t *prompt, size_t n, kv_attach_result *res);

/* ids are about to be absorbed by the tracked state */
int kv_track_tokens(kv_track *t, const int32_t *ids, size_t n);
/* after a forward: publish the blocks s completed and, at a block boundary, its window state */
void kv_track_commit(kv_track *t, md_seq *s);

typedef struct {
    uint64_t lookups, lookup_tokens;          /* attach calls and their prompt tokens */
    uint64_t hit_tokens, replayed_tokens;
    uint64_t path[4];                         /* by kv_path */
    uint64_t block_hits[3];                   /* memory, host, disk */
    uint64_t swa_hits_ram, swa_hits_disk;
    uint64_t published_blocks, published_swa;
    uint64_t mem_blocks, mem_bytes, host_bytes, swa_bytes; /* current */
    uint64_t evicted_mem, evicted_host, evicted_swa;
    uint64_t disk_files, disk_bytes, disk_write_errors, disk_damaged, disk_dropped;
} kv_cache_stats;
void kv_cache_get_stats(kv_cache *c, kv_cache_stats *out);

#endif
