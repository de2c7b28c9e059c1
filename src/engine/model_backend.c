/* model_backend.c - md_model (src/model/v4.h) as an eng_backend, with the
 * prefix KV cache (src/kv/cache.h) when one is given.
 *
 * A step's items become one md_forward with one md_segment each; a segment
 * asks for logits of its last token only, and only when the engine does.
 * With a cache, a segment is cut at its last block boundary and at every
 * kv_cache_window_every-th one, and the step runs as one batched forward per
 * piece index, so that the state exists at those boundaries and their window
 * states can be published (every row is computed independently, so cutting
 * changes no value).  After each forward the tracker publishes the blocks
 * each sequence completed. */
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

/* Where a tracked segment is cut so that the state exists at block
 * boundaries worth a window state: every `every`-th boundary inside it, and
 * its last boundary (the end of a prompt lies in its last chunk).  Returns
 * the number of pieces; cut[i] = end offset of piece i. */
static size_t cuts(int64_t p0, size_t n, int every, size_t *cut, size_t cap)
{
    size_t k = 0;
    const int64_t end = p0 + (int64_t)n, last = end / MD_BLOCK_TOKENS * MD_BLOCK_TOKENS;
    for (int64_t b = (p0 / MD_BLOCK_TOKENS + 1) * MD_BLOCK_TOKENS; b < end && k + 1 < cap; b += MD_BLOCK_TOKENS)
        if (b == last || (b / MD_BLOCK_TOKENS) % every == 0) cut[k++] = (size_t)(b - p0);
    cut[k++] = n;
    return k;
}

enum { MAX_PIECES = 64 };

static int mb_forward_draw(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                           int32_t **top1, rc_draw **draw, size_t count, rc_err *err)
{
    eng_model_impl *mi = impl;
    md_segment *seg = calloc(count ? count : 1, sizeof *seg);
    size_t *cut = calloc(count ? count * MAX_PIECES : 1, sizeof *cut), *npc = calloc(count ? count : 1, sizeof *npc);
    int rc = 0;
    if (!seg || !cut || !npc) { rc = rc_errf(err, RC_ENOMEM, "out of memory for a batch of %zu sequences", count); goto out; }
    size_t rounds = 1;
    const int every = mi->kv ? kv_cache_window_every(mi->kv) : 0;
    for (size_t i = 0; i < count; i++) {
        mb_seq *q = seqs[i];
        if (q->t) {
            npc[i] = cuts(md_seq_len(q->s), n[i], every, cut + i * MAX_PIECES, MAX_PIECES);
            if (kv_track_tokens(q->t, ids[i], n[i])) { rc = rc_errf(err, RC_ENOMEM, "out of memory"); goto out; }
        } else {
            npc[i] = 1;
            cut[i * MAX_PIECES] = n[i];
        }
        if (npc[i] > rounds) rounds = npc[i];
    }
    /* round k runs piece k of every sequence that has one, in one batch */
    for (size_t k = 0; k < rounds && !rc; k++) {
        size_t ns = 0;
        for (size_t i = 0; i < count; i++) {
            if (k >= npc[i]) continue;
            const size_t a = k ? cut[i * MAX_PIECES + k - 1] : 0, e = cut[i * MAX_PIECES + k];
            mb_seq *q = seqs[i];
            const int last = k + 1 == npc[i];
            seg[ns++] = (md_segment){.seq = q->s, .ids = ids[i] + a, .n = e - a, .logits = last ? logits[i] : NULL,
                                     .top1 = last && top1 ? top1[i] : NULL, .draw = last && draw ? draw[i] : NULL};
        }
        rc = md_forward(mi->m, seg, ns, err);
        for (size_t i = 0; !rc && i < count; i++) {
            mb_seq *q = seqs[i];
            if (k < npc[i] && q->t) kv_track_commit(q->t, q->s);
        }
    }
out:
    free(seg);
    free(cut);
    free(npc);
    return rc;
}

static int mb_forward_top1(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                           int32_t **top1, size_t count, rc_err *err)
{
    return mb_forward_draw(impl, seqs, ids, n, logits, top1, NULL, count, err);
}

static int mb_forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                      rc_err *err)
{
    return mb_forward_draw(impl, seqs, ids, n, logits, NULL, NULL, count, err);
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
        .forward_top1 = mb_forward_top1,
        .forward_draw = mb_forward_draw,
        .prefix_attach = impl->kv ? mb_prefix_attach : NULL,
    };
}
