/* v4.h - the DeepSeek V4 model: weights, per-sequence state, forward pass.
 *
 *   md_model_load   config.json + safetensors (official or transformers names,
 *                   dense / FP8 / FP4 weights) -> a model bound to a backend
 *   md_seq_create   an empty decoding state for one sequence
 *   md_forward      run a batch of segments (each: one sequence, some new
 *                   tokens) through the model, advancing every state
 *   md_seq_snapshot / md_seq_restore / md_seq_clone
 *                   the state as checksummed bytes and back, or a deep copy
 *
 * Prefill in one call, prefill in chunks of any size, and token-by-token decode
 * all go through md_forward and give the same logits: every computation for a
 * token depends only on the token, its position and the sequence's state.  The
 * state layout is documented in docs/MODEL-STATE.md. */
#ifndef MODEL_V4_H
#define MODEL_V4_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/draw.h"
#include "base/err.h"
#include "model/config.h"

typedef enum {
    MD_SEM_OFFICIAL = 0,      /* DeepSeek inference/model.py: KV FP8, indexer FP4 and GEMM-input FP8 round trips */
    MD_SEM_TRANSFORMERS = 1,  /* transformers 5.17 DeepseekV4ForCausalLM: none of them */
} md_semantics;

int md_semantics_parse(const char *s, md_semantics *out);
const char *md_semantics_name(md_semantics s);

typedef struct md_model md_model;
typedef struct md_seq md_seq;

typedef void (*md_progress_fn)(void *arg, const char *stage, uint64_t done, uint64_t total);

int md_model_load(const char *dir, be_backend *be, md_semantics sem, md_progress_fn progress,
                  void *progress_arg, md_model **out, rc_err *err);
void md_model_free(md_model *m);
const md_config *md_model_config(const md_model *m);
md_semantics md_model_semantics(const md_model *m);
void md_model_set_semantics(md_model *m, md_semantics sem);
uint64_t md_model_param_count(const md_model *m);

md_seq *md_seq_create(const md_model *m);
void md_seq_free(md_seq *s);
/* tokens the state has absorbed (= next position) */
int64_t md_seq_len(const md_seq *s);
/* bytes held by the state now; fixed part (window rings + partial blocks) and
 * the part that grows with length (compressed entries), per token */
size_t md_seq_bytes(const md_seq *s);
size_t md_seq_fixed_bytes(const md_model *m);
double md_seq_bytes_per_token(const md_model *m);

/* Snapshot of a state at any length (docs/KV.md "Snapshot format"): a state
 * restored from it, or a clone, continues bit for bit like the original.
 * md_seq_snapshot_size is the exact byte count; md_seq_snapshot fails
 * (RC_EINVAL) when cap is smaller.  md_seq_restore fills a fresh state (len 0)
 * of the same model and semantics; anything else -- truncated, padded,
 * corrupted (CRC32C), another format version, another model's shapes or
 * semantics -- is refused with RC_EINVAL and a message, leaving s fresh.
 * The header carries shapes, not weights: keep snapshots of different
 * checkpoints apart by the model fingerprint (kv/blockkey.h).
 * md_seq_clone returns a deep copy, or NULL when out of memory. */
size_t md_seq_snapshot_size(const md_seq *s);
int md_seq_snapshot(const md_seq *s, uint8_t *buf, size_t cap, rc_err *err);
int md_seq_restore(md_seq *s, const uint8_t *buf, size_t len, rc_err *err);
md_seq *md_seq_clone(const md_seq *s);

/* ------------------------------------------------------------ KV blocks
 *
 * The compressed entries and indexer keys of a sequence live in blocks of
 * MD_BLOCK_TOKENS tokens: block k holds, for every compressed layer l (ratio
 * r), the entries of positions [128k, 128k+128), i.e. 128/r rows of head_dim
 * floats, then (CSA) 128/r indexer rows of index_head_dim floats; layers in
 * order.  A sequence holds a table of blocks.  A block whose 128 tokens the
 * sequence has absorbed is FULL: nothing ever writes it again, so sequences
 * (and the KV cache) share full blocks by reference count.  The partial last
 * block is the sequence's own.
 *
 * Blocks come from an allocator (md_model_set_block_alloc; default malloc):
 * the KV cache (src/kv/cache.h) pools them.  refs counts holders; the last
 * md_block_unref hands the block to the allocator's release.  All block calls
 * happen on the thread that runs md_forward (no locking). */
#define MD_BLOCK_TOKENS 128

typedef struct md_block {
    int32_t refs;
    uint32_t tag;     /* for the allocator */
    void *owner;      /* for the allocator */
    float *data;      /* md_block_floats(m) floats */
    uint64_t id;      /* new for every md_block_new, process-wide: a device copy of a full block is keyed by it */
} md_block;

typedef struct {
    void *ctx;
    md_block *(*alloc)(void *ctx);              /* refs = 1 on return, or NULL */
    void (*release)(void *ctx, md_block *b);    /* refs reached 0 */
} md_block_alloc;

size_t md_block_floats(const md_model *m);
void md_model_set_block_alloc(md_model *m, const md_block_alloc *a);  /* NULL: malloc/free */
md_block *md_block_new(const md_model *m);      /* from the allocator, refs = 1 */
void md_block_ref(md_block *b);
void md_block_unref(const md_model *m, md_block *b);
/* the malloc allocator's own pair, for allocators that wrap it */
md_block *md_block_malloc(const md_model *m);
void md_block_free(md_block *b);

/* full blocks of s: n = len / 128; md_seq_block(s, k) for k < n (not referenced for the caller) */
size_t md_seq_full_blocks(const md_seq *s);
md_block *md_seq_block(const md_seq *s, size_t k);

/* NULL when s's block table agrees with what is kept beside it (each block's data pointer and id, which the
 * attention op reads instead of the blocks' headers) and holds a reference to each block, else what does not (for
 * tests and assertions) */
const char *md_seq_check(const md_seq *s);

/* Boundary state: everything of a state at a block boundary except its
 * blocks -- window rings, compressor half-A slices (partial blocks are
 * empty there).  The snapshot format with flag "no entries" (docs/KV.md).
 * md_seq_boundary_save needs len % 128 == 0 and len > 0. */
size_t md_seq_boundary_size(const md_model *m);
int md_seq_boundary_save(const md_seq *s, uint8_t *buf, size_t cap, rc_err *err);

/* Attach n full blocks (references taken) to a fresh state.
 *  bnd != NULL: the boundary state saved at n*128 tokens; the state becomes
 *      exactly the one that saved it (len = n*128).
 *  bnd == NULL: bounded replay: len = n*128 - replay and the window starts
 *      there (attention never looks before it); the caller must feed tokens
 *      [len, n*128) next.  Entries those tokens complete are already in the
 *      blocks and are kept, not overwritten.  replay must be at least the
 *      window and at most n*128.
 * Errors (RC_EINVAL) leave s fresh. */
int md_seq_attach(md_seq *s, md_block *const *blocks, size_t n, const uint8_t *bnd, size_t bnd_len, int64_t replay,
                  rc_err *err);

/* One segment of a batched forward: n new tokens appended to seq. */
typedef struct md_segment {
    md_seq *seq;
    const int32_t *ids;
    size_t n;
    /* where to put logits: NULL for none; else [n, vocab] if all_logits,
     * else [vocab] for the last token only */
    float *logits;
    int all_logits;
    /* logits NULL and top1 not: *top1 = the greedy token after the last id
     * (base/greedy.h's rule), and the logits never leave the backend (on a
     * GPU: 4 bytes instead of a vocabulary of floats per row) */
    int32_t *top1;
    /* with logits (one row, not all_logits): a sampled draw the backend may take itself where it holds the logits
     * on a device (base/draw.h): draw->token >= 0 is the token and the logits were not written; else (-1, set by
     * the caller) the logits were written and the caller draws (always so for a temperature below 1e-5, the
     * sampler's greedy threshold).  NULL: the logits only. */
    rc_draw *draw;
} md_segment;

int md_forward(md_model *m, md_segment *segs, size_t nseg, rc_err *err);

/* Profiling: md_forward calls fn(arg, layer, part) as each layer starts
 * (part 0), after its attention half (1) and after its FFN half (2), and
 * with layer = n_layers, part 0 before the output head.  NULL turns it off.
 * The backend may still be working when it is called: a timer must
 * synchronise it first (bench/gpu_layers.c does). */
typedef void (*md_layer_hook)(void *arg, int layer, int part);
void md_model_set_layer_hook(md_model *m, md_layer_hook fn, void *arg);

/* A backend with be_ops.dev runs md_forward as the device-resident graph
 * (activations in the backend's memory; the state stays on the host and gets
 * the rows that extend it after the forward, the entries a forward completes
 * made by the backend's comp_pool; without comp_pool, before the layer's
 * attention where a segment completes an entry there).  This switch runs
 * that same graph code with host memory and the host path's own ops (and a
 * host comp_pool and attention op) on any backend: a check
 * of its plumbing without a GPU, bit-identical to the host graph (unit_model).
 * on = 2: the same, with its attention op declining (the graph's host
 * attention fallback runs) and without linear_aq (the graph quantises copies).  Its attention op reads partial KV blocks through
 * copies kept as a device would (backend/part_slots.h): 64 of them, or with
 * on = 3 only one (evictions, and blocks read without a copy).  0 or RC_ENOMEM. */
int md_model_set_host_dev_graph(md_model *m, int on);

/* The device graph's state updates, counted per (forward, layer) since load: now, those that ran on the host
 * before the layer's attention (the forward waits for the device there: a segment completed a compressed entry
 * and the backend has no comp_pool, or DEEPINFER_DEV_COMP=0; every layer with DEEPINFER_STATE_LATE=0); late,
 * those that ran after the forward (no wait). */
void md_model_state_stats(const md_model *m, uint64_t *now, uint64_t *late);

/* The host-dev graph's copies of partial KV blocks (backend/part_slots.h), since md_model_set_host_dev_graph:
 * hits, the block reads that found their copy complete; rows, the rows copied in from the host blocks (none in a
 * steady decode whose compressors run on the device).  0 without the host-dev graph. */
void md_model_host_dev_slot_stats(const md_model *m, uint64_t *hits, uint64_t *rows);

#endif
