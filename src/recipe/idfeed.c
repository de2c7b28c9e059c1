/* idfeed.c - see idfeed.h. */
#include "recipe/idfeed.h"

#include <stdlib.h>

#include "recipe/unicode.h"

void rc_idfeed_init(rc_idfeed *f, const rc_tokenizer *tok)
{
    memset(f, 0, sizeof *f);
    f->tok = tok;
}

void rc_idfeed_free(rc_idfeed *f)
{
    rc_bytes_free(&f->piece);
    rc_bytes_free(&f->held);
    free(f->ends);
    memset(f, 0, sizeof *f);
}

long long rc_idfeed_completion_tokens(const rc_idfeed *f) { return f->ctok; }

/* bytes with each ill-formed subpart replaced by U+FFFD */
static void append_lossy(rc_bytes *out, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        int k = rc_utf8_step((const uint8_t *)p + i, n - i);
        if (k > 0) {
            rc_bytes_append(out, p + i, (size_t)k);
            i += (size_t)k;
        } else {
            rc_bytes_append(out, "\xEF\xBF\xBD", 3);
            i += k < 0 ? (size_t)(-k) : n - i;
        }
    }
}

int rc_idfeed_push(rc_idfeed *f, rc_stream *s, const int32_t *ids, size_t n, rc_event_fn fn, void *ctx)
{
    int done = 0;
    for (size_t k = 0; k < n && !done;) {
        /* a source chunk: one added token alone, or a run of ordinary ones */
        size_t e = k;
        if (!rc_tokenizer_is_added(f->tok, ids[k]))
            while (e < n && !rc_tokenizer_is_added(f->tok, ids[e])) e++;
        else
            e = k + 1;
        f->piece.n = 0;
        if (e - k > f->ends_cap) {
            size_t nc = (e - k) * 2;
            size_t *p = realloc(f->ends, nc * sizeof *p);
            if (!p) return -1;
            f->ends = p;
            f->ends_cap = nc;
        }
        for (size_t q = k; q < e; q++) {
            size_t before = f->piece.n;
            f->pending++;
            size_t tl;
            const char *tb = rc_tokenizer_token_bytes(f->tok, ids[q], &tl);
            if (tb) {
                /* hold a token's whole text while the held bytes end inside a
                 * character; emit when complete */
                rc_bytes_append(&f->held, tb, tl);
                size_t ok = rc_utf8_valid_prefix((const uint8_t *)f->held.v, f->held.n);
                int incomplete = ok < f->held.n && rc_utf8_step((const uint8_t *)f->held.v + ok, f->held.n - ok) == 0;
                if (ok == f->held.n) {
                    rc_bytes_append(&f->piece, f->held.v, f->held.n);
                    f->held.n = 0;
                } else if (!incomplete) {
                    append_lossy(&f->piece, f->held.v, f->held.n);
                    f->held.n = 0;
                }
            }
            /* an id that ends a character (and unknown ids before it) counts then */
            if (f->piece.n > before) {
                f->ctok += f->pending;
                f->pending = 0;
            }
            f->ends[q - k] = f->piece.n;
        }
        done = rc_stream_feed_ids(s, f->piece.v ? f->piece.v : "", f->piece.n, f->ends, e - k, fn, ctx);
        k = e;
    }
    return done;
}
