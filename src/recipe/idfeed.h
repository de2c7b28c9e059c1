/* idfeed.h - generated token ids -> rc_stream, the way the reference parses
 * token-id output.
 *
 * Ids are decoded to bytes with a token's whole text held back while the held
 * bytes end inside a UTF-8 character (ill-formed bytes become U+FFFD); a push
 * of several ids becomes several source chunks split at added (control)
 * tokens; completion tokens are counted when they yield text.  Used by the
 * server for every generated token and by `recipe parse --tokens`. */
#ifndef RECIPE_IDFEED_H
#define RECIPE_IDFEED_H

#include <stdint.h>

#include "base/vec.h"
#include "recipe/stream.h"
#include "recipe/tokenizer.h"

typedef struct {
    const rc_tokenizer *tok;
    rc_bytes piece, held;
    long long ctok, pending;
    size_t *ends, ends_cap;
} rc_idfeed;

void rc_idfeed_init(rc_idfeed *f, const rc_tokenizer *tok);
void rc_idfeed_free(rc_idfeed *f);
/* Returns 1 once the stream reports a stop sequence (stop generating). */
int rc_idfeed_push(rc_idfeed *f, rc_stream *s, const int32_t *ids, size_t n, rc_event_fn fn, void *ctx);
/* ids that produced text so far (ids still holding an unfinished character count later) */
long long rc_idfeed_completion_tokens(const rc_idfeed *f);

#endif
