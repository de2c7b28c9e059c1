/* decode.c - ids -> UTF-8 text, streaming.
 *
 * Token bytes are concatenated and pushed through a UTF-8 checker that holds
 * back a valid-but-incomplete tail (a multi-byte char split across tokens is
 * the normal case for CJK and emoji) and replaces each maximal ill-formed
 * subpart with U+FFFD.  Feeding ids one at a time or all at once gives the
 * same bytes, and those bytes equal HF tokenizers' decode (which runs Rust's
 * from_utf8_lossy over the whole sequence). */
#include "recipe/tokenizer_internal.h"
#include "recipe/unicode.h"

static const char REPL[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

void rc_decoder_init(rc_decoder *d, const rc_tokenizer *tok, unsigned flags) {
    d->tok = tok;
    d->flags = flags;
    d->npend = 0;
}

/* emit the well-formed part of pend+p; keep an incomplete tail in pend */
static int feed(rc_decoder *d, const uint8_t *p, size_t n, rc_bytes *out) {
    /* finish a pending sequence byte by byte (at most 3 bytes) */
    while (d->npend && n) {
        d->pend[d->npend++] = *p++;
        n--;
        int k = rc_utf8_step(d->pend, (size_t)d->npend);
        if (k == 0) continue;
        if (k > 0) {
            if (rc_bytes_append(out, d->pend, (size_t)k)) return RC_ENOMEM;
            d->npend = 0;
        } else {
            /* -k bytes are garbage; the rest is input again */
            if (rc_bytes_append(out, REPL, 3)) return RC_ENOMEM;
            int keep = d->npend + k;
            uint8_t tmp[4];
            __builtin_memcpy(tmp, d->pend - k, (size_t)keep);
            d->npend = 0;
            int rc = feed(d, tmp, (size_t)keep, out);
            if (rc) return rc;
        }
    }
    size_t i = 0, run = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = rc_utf8_step(p + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (rc_bytes_append(out, p + run, i - run)) return RC_ENOMEM;
        if (k == 0) { /* incomplete at the end: hold it */
            d->npend = (int)(n - i);
            __builtin_memcpy(d->pend, p + i, n - i);
            return 0;
        }
        if (rc_bytes_append(out, REPL, 3)) return RC_ENOMEM;
        i += (size_t)(-k);
        run = i;
    }
    return rc_bytes_append(out, p + run, n - run);
}

int rc_decoder_push(rc_decoder *d, const int32_t *ids, size_t n, rc_bytes *out, rc_err *err) {
    const rc_tokenizer *t = d->tok;
    for (size_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        if (id < 0 || id >= t->n_ids || t->tok_len[id] == UINT32_MAX)
            return rc_errf(err, RC_ERANGE, "token id %d is not in the vocabulary (0..%d)", id,
                           t->n_ids - 1);
        if (t->is_added[id] && !(d->flags & RC_DECODE_ADDED)) continue;
        if (feed(d, (const uint8_t *)t->bytes + t->tok_off[id], t->tok_len[id], out))
            return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    if (out->v == NULL && rc_bytes_reserve(out, 0)) return rc_errf(err, RC_ENOMEM, "out of memory");
    return 0;
}

int rc_decoder_flush(rc_decoder *d, rc_bytes *out) {
    /* an incomplete tail is one maximal subpart: one U+FFFD */
    int rc = 0;
    if (d->npend) rc = rc_bytes_append(out, REPL, 3);
    d->npend = 0;
    return rc;
}

int rc_tokenizer_decode(const rc_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                        rc_bytes *out, rc_err *err) {
    rc_decoder d;
    rc_decoder_init(&d, tok, flags);
    int rc = rc_decoder_push(&d, ids, n, out, err);
    if (rc) return rc;
    if (rc_decoder_flush(&d, out)) return rc_errf(err, RC_ENOMEM, "out of memory");
    return 0;
}
