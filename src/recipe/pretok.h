/* pretok.h - the DeepSeek byte-level pre-tokenizer, hand-written (internal).
 *
 * tokenizer.json describes it as Sequence[Split(r1), Split(r2), Split(r3),
 * ByteLevel(use_regex=false)] with Isolated behaviour:
 *   r1  \p{N}{1,3}
 *   r2  [一-龥぀-ゟ゠-ヿ]+
 *   r3  [ASCII punct][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 *        ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * Each stage splits every piece of the previous stage; matches and the gaps
 * between them both become pieces.  rc_pretok_split reproduces that exactly
 * (proved by the differential tests against HF tokenizers) without a regex
 * engine: one forward scan per stage, no backtracking beyond one char. */
#ifndef RECIPE_PRETOK_H
#define RECIPE_PRETOK_H

#include <stddef.h>
#include <stdint.h>

typedef void (*rc_piece_fn)(void *ctx, const uint8_t *p, size_t n);

/* s must be valid UTF-8. */
void rc_pretok_split(const uint8_t *s, size_t n, rc_piece_fn fn, void *ctx);

/* Segmentation for parallel encoding: the smallest p in [from, to) such that
 * cutting s at p cannot change the pieces (so encode(s) == encode(s[0,p)) ++
 * encode(s[p,n))), or `to` if there is none.  See pretok.c for the proof. */
size_t rc_pretok_safe_cut(const uint8_t *s, size_t n, size_t from, size_t to);

/* The patterns above, as written in tokenizer.json, for load-time checks. */
extern const char *const rc_pretok_patterns[3];

#endif
