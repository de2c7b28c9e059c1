/* model_backend.c - md_model (src/model/v4.h) as an eng_backend.
 *
 * A step's items become one md_forward with one md_segment each; a segment
 * asks for logits of its last token only, and only when the engine does.
 * The sequence handle is the md_seq itself.  Nothing is cached here: every
 * call maps straight through, so the model's "rows are independent" property
 * carries over to the engine unchanged. */
#include <stdlib.h>

#include "engine/engine.h"
#include "model/v4.h"

/* Context per sequence when the caller sets nothing: the model's positions
 * reach far beyond this, the limit is about memory held per request. */
enum { ENG_MODEL_DEFAULT_CONTEXT = 65536 };

static void *mb_seq_new(void *impl) { return md_seq_create(impl); }

static void mb_seq_free(void *impl, void *seq) { md_seq_free(seq); }

static int mb_forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                      rc_err *err)
{
    md_segment *seg = calloc(count ? count : 1, sizeof *seg);
    if (!seg) return rc_errf(err, RC_ENOMEM, "out of memory for a batch of %zu sequences", count);
    for (size_t i = 0; i < count; i++)
        seg[i] = (md_segment){.seq = seqs[i], .ids = ids[i], .n = n[i], .logits = logits[i], .all_logits = 0};
    int rc = md_forward(impl, seg, count, err);
    free(seg);
    return rc;
}

size_t eng_model_seq_bytes(void *impl, void *seq) { return seq ? md_seq_bytes(seq) : 0; }

eng_backend eng_model_backend(struct md_model *m)
{
    const md_config *c = md_model_config(m);
    return (eng_backend){
        .vocab = c->vocab_size,
        .eos_id = c->eos_id,
        .max_context = ENG_MODEL_DEFAULT_CONTEXT,
        .impl = m,
        .seq_new = mb_seq_new,
        .seq_free = mb_seq_free,
        .forward = mb_forward,
    };
}
