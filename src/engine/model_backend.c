/* model_backend.c - md_model (src/model/v4.h) as an eng_backend, with the
 * prefix KV cache (src/kv/cache.h) when one is given.
 *
 * A step's items become one md_forward with one md_segment each; a segment
 * asks for logits of its last token only, and only when the engine does.
 * With a cache, a segment that crosses a block boundary before its end is
 * split there and the step runs as two forwards, so that the state exists
 * at that boundary and its window state can be published (every row is
 * computed independently, so the split changes no value).  After each
 * forward the tracker publishes the blocks each sequence completed. */
#include <stdlib.h>

#include "engine/engine.h"
#include "kv/cache.h"
#include "model/v4.h"

/* Context per sequence when the caller sets nothing: the model's positions
 * reach far beyond this, the limit is about memory held per request. */
enum { ENG_MODEL_DEFAULT_CONTEXT = 65536 };

typedef struct {
    md_seq *s;
    kv_track *t;   /* with a cache, from prefix_attach on */
} mb_seq;

static void *mb_seq_new(void *impl)
{
    eng_model_impl *mi = impl;
    mb_seq *q = calloc(1, sizeof *q);
    if (!q) return NULL;
    if (!(q->s = md_seq_create(mi->m))) {
        free(q);
        return NULL;
    }
    return q;
}

static void mb_seq_free(void *impl, void *seq)
{
    mb_seq *q = seq;
    if (!q) return;
    kv_track_free(q->t);
    md_seq_free(q->s);
    free(q);
}

static size_t mb_prefix_attach(void *impl, void *seq, const int32_t *prompt, size_t n, eng_request *req)
{
    eng_model_impl *mi = impl;
    mb_seq *q = seq;
    if (!mi->kv) return 0;
    if (!q->t && !(q->t = kv_track_new(mi->kv, req->cache_salt, req->cache_class))) return 0;
    kv_attach_result r;
    kv_cache_attach(mi->kv, q->t, q->s, prompt, n, &r);
    req->cached_tokens = r.hit_tokens;
    req->cache_path = (int)r.path;
    return r.state_tokens;
}

static int run(md_model *m, md_segment *seg, size_t count, rc_err *err)
{
    size_t k = 0;
    for (size_t i = 0; i < count; i++)
        if (seg[i].n) seg[k++] = seg[i];
    return k ? md_forward(m, seg, k, err) : 0;
}

static int mb_forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                      rc_err *err)
{
    eng_model_impl *mi = impl;
    md_segment *seg = calloc(count ? 2 * count : 1, sizeof *seg);
    if (!seg) return rc_errf(err, RC_ENOMEM, "out of memory for a batch of %zu sequences", count);
    md_segment *tail = seg + count;
    size_t ntail = 0;
    for (size_t i = 0; i < count; i++) {
        mb_seq *q = seqs[i];
        size_t first = n[i];
        if (q->t) {
            /* the last block boundary strictly inside the segment */
            const int64_t p0 = md_seq_len(q->s);
            const int64_t b = (p0 + (int64_t)n[i]) / MD_BLOCK_TOKENS * MD_BLOCK_TOKENS;
            if (b > p0 && b < p0 + (int64_t)n[i]) first = (size_t)(b - p0);
            if (kv_track_tokens(q->t, ids[i], n[i])) {
                free(seg);
                return rc_errf(err, RC_ENOMEM, "out of memory");
            }
        }
        seg[i] = (md_segment){.seq = q->s, .ids = ids[i], .n = first, .logits = first == n[i] ? logits[i] : NULL};
        tail[i] = (md_segment){.seq = q->s, .ids = ids[i] + first, .n = n[i] - first, .logits = logits[i]};
        ntail += first < n[i];
    }
    int rc = run(mi->m, seg, count, err);
    for (size_t i = 0; !rc && mi->kv && i < count; i++)
        if (((mb_seq *)seqs[i])->t) kv_track_commit(((mb_seq *)seqs[i])->t, ((mb_seq *)seqs[i])->s);
    if (!rc && ntail) {
        rc = run(mi->m, tail, count, err);
        for (size_t i = 0; !rc && i < count; i++)
            if (tail[i].n && ((mb_seq *)seqs[i])->t) kv_track_commit(((mb_seq *)seqs[i])->t, ((mb_seq *)seqs[i])->s);
    }
    free(seg);
    return rc;
}

size_t eng_model_seq_bytes(void *impl, void *seq) { return seq ? md_seq_bytes(((mb_seq *)seq)->s) : 0; }

eng_backend eng_model_backend(eng_model_impl *impl)
{
    const md_config *c = md_model_config(impl->m);
    return (eng_backend){
        .vocab = c->vocab_size,
        .eos_id = c->eos_id,
        .max_context = ENG_MODEL_DEFAULT_CONTEXT,
        .impl = impl,
        .seq_new = mb_seq_new,
        .seq_free = mb_seq_free,
        .forward = mb_forward,
        .prefix_attach = impl->kv ? mb_prefix_attach : NULL,
    };
}
