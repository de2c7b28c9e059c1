/* engine.h - request lifecycle and the continuous-batching loop.
 *
 * One engine thread owns the model.  Requests arrive through eng_submit
 * (any thread) into a bounded waiting queue; each loop iteration admits
 * waiting requests while the step's token budget allows, runs ONE batched
 * forward over every running sequence (prefill chunks for new ones, one token
 * for decoding ones), samples, and reports tokens through the request's
 * callbacks.  Batching never changes a greedy result: the model computes each
 * row independently (backend.h).
 *
 * Callbacks run on the engine thread and must not block: on_token per
 * generated token, then exactly one on_done.  eng_cancel (any thread) makes
 * the engine drop the request within one step; on_done still comes, with
 * ENG_CANCELLED, and after it the engine never touches the request again. */
#ifndef ENGINE_ENGINE_H
#define ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/draw.h"
#include "base/err.h"

/* What the engine runs: the real model, or a test backend. */
struct eng_request;

typedef struct eng_backend {
    int vocab;
    int eos_id;
    int max_context;                 /* tokens per sequence (prompt + output) */
    void *impl;
    void *(*seq_new)(void *impl);
    void (*seq_free)(void *impl, void *seq);
    /* n items: each appends ids[0..n) to seq and, if logits != NULL, writes the
     * vocab logits after the last id.  One call = one batched forward. */
    int (*forward)(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                   rc_err *err);
    /* optional: forward, where an item with logits[i] NULL and top1[i] not gets only its greedy token (the argmax
     * of the logits after its last id, ties to the lowest id, NaN as -inf: sampler.h's greedy) in *top1[i].  The
     * engine asks it for greedy requests, whose tokens need no logits (a GPU backend then copies 4 bytes a row
     * instead of the vocabulary). */
    int (*forward_top1)(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                        int32_t **top1, size_t count, rc_err *err);
    /* optional: forward_top1, where an item with draw[i] not NULL (a sampled one, logits[i] its row's buffer) may
     * have its token drawn by the backend from draw[i]'s parameters and uniform (base/draw.h): draw[i]->token >= 0
     * is that token and logits[i] is unwritten; -1 (the engine's value) leaves logits[i] written and the draw to the
     * engine, with the same uniform.  A GPU backend then copies 4 bytes a sampled row instead of the vocabulary. */
    int (*forward_draw)(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                        int32_t **top1, rc_draw **draw, size_t count, rc_err *err);
    /* optional, for test backends that know their output: after forward, a
     * value >= 0 is the sequence's next token and its logits are not read
     * (the scripted backend then skips writing them: serving overhead can be
     * measured without a vocabulary-sized softmax per token) */
    int32_t (*forced)(void *impl, void *seq);
    /* optional prefix cache: called once at admission on the fresh seq;
     * returns how many prompt tokens the state already holds (< n: the last
     * prompt token is always computed) and sets req->cached_tokens and
     * req->cache_path */
    size_t (*prefix_attach)(void *impl, void *seq, const int32_t *prompt, size_t n, struct eng_request *req);
} eng_backend;

typedef enum { ENG_STOP_EOS, ENG_STOP_ID, ENG_STOP_LENGTH, ENG_STOP_CONTEXT, ENG_CANCELLED, ENG_ERROR } eng_reason;

typedef struct {
    double temperature;  /* 0 = greedy */
    double top_p;        /* 1 = off */
    int top_k;           /* 0 = off */
    double min_p;        /* 0 = off */
    uint64_t seed;
    int has_seed;        /* without: a seed from the request id */
    int max_tokens;      /* > 0 */
    const int32_t *stop_ids; /* generation ends after emitting one of these (not EOS) */
    size_t n_stop_ids;
    int ignore_eos;
} eng_sampling;

typedef struct eng_request {
    const int32_t *prompt;   /* copied at submit */
    size_t n_prompt;
    eng_sampling sampling;
    const char *cache_salt;  /* prefix-cache namespace (NULL = shared); valid until on_done */
    int cache_class;         /* KV_CLASS_* (kv/cache.h): the TTL of what this request publishes */
    void *ctx;
    void (*on_token)(void *ctx, int32_t id);
    void (*on_done)(void *ctx, eng_reason why, size_t completion_tokens, const char *error);
    /* filled by the engine at admission (before any on_token): prompt tokens
     * whose KV came from the prefix cache, and how (kv_path) */
    size_t cached_tokens;
    int cache_path;
    /* timing filled by the engine, read in on_done */
    double t_submit, t_first_token, t_done;
} eng_request;

typedef struct {
    int max_batch_tokens;    /* tokens per forward (prefill chunks + decodes); default 2048 */
    int max_running;         /* sequences decoding at once; default 256 */
    int max_waiting;         /* queue depth; beyond: eng_submit returns RC_EBUSY (-> 429) */
    int sample_threads;      /* threads (the engine's own among them) that sample a step's rows; 0: one per online
                              * CPU up to 16; 1: the engine thread alone.  The tokens do not depend on it. */
} eng_cfg;

enum { ENG_EBUSY = -20 };

typedef struct engine engine;

engine *eng_create(const eng_backend *be, const eng_cfg *cfg, rc_err *err);
/* 0, ENG_EBUSY (queue full), RC_EINVAL (empty prompt, prompt + max_tokens
 * over max_context: the error says which), RC_ENOMEM.  On success the engine
 * owns *req until on_done returns; req must stay valid until then. */
int eng_submit(engine *e, eng_request *req, rc_err *err);
void eng_cancel(engine *e, eng_request *req);
/* stop admitting; finish running requests (or cancel them after deadline_ms); join */
void eng_shutdown(engine *e, int deadline_ms);
void eng_destroy(engine *e);

typedef struct {
    int running, waiting;
    uint64_t steps, prompt_tokens, completion_tokens;
    size_t state_bytes;      /* decoding state held by running sequences */
} eng_stats;
void eng_get_stats(engine *e, eng_stats *out);
/* state bytes of one sequence (for backends that know), else 0 */
void eng_set_state_bytes_fn(engine *e, size_t (*fn)(void *impl, void *seq));

/* The model backend: wraps md_model (src/model/v4.h), with the prefix KV
 * cache when kv is not NULL.  impl must outlive the engine.  max_context is
 * 65536; the caller may overwrite it in the returned struct before
 * eng_create.  eng_model_seq_bytes (md_seq_bytes) is its fn for
 * eng_set_state_bytes_fn. */
struct md_model;
struct kv_cache;
typedef struct eng_model_impl {
    struct md_model *m;
    struct kv_cache *kv;
} eng_model_impl;
eng_backend eng_model_backend(eng_model_impl *impl);
size_t eng_model_seq_bytes(void *impl, void *seq);

#endif
