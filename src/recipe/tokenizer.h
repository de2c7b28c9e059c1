/* tokenizer.h - byte-level BPE tokenizer for DeepSeek V3/V4 tokenizer.json.
 *
 * Lifecycle: rc_tokenizer_load -> encode/decode from any number of threads ->
 * rc_tokenizer_free.  A loaded tokenizer is immutable; each thread that
 * encodes gets its own BPE cache behind the scenes.
 *
 * Two encode modes, and the difference is the prompt-injection boundary:
 *   RC_ENCODE_CONTENT   user text, tool output, reasoning: added/special tokens
 *                       are never recognised; "<｜User｜>" becomes plain ids.
 *   RC_ENCODE_TEMPLATE  template text written by us: added tokens are matched
 *                       (leftmost-longest, HF's two passes) and emitted as ids.
 *
 * Input must be valid UTF-8; anything else is RC_EINVAL with the byte offset
 * of the first ill-formed byte (docs/TOKENIZER.md).  No BOS/EOS is ever added:
 * the prompt renderer writes them explicitly. */
#ifndef RECIPE_TOKENIZER_H
#define RECIPE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/pool.h"
#include "base/vec.h"

typedef struct rc_tokenizer rc_tokenizer;

enum rc_encode_mode { RC_ENCODE_CONTENT = 0, RC_ENCODE_TEMPLATE = 1 };

int rc_tokenizer_load(const char *path, rc_tokenizer **out, rc_err *err);
int rc_tokenizer_load_mem(const char *json, size_t len, rc_tokenizer **out, rc_err *err);
void rc_tokenizer_free(rc_tokenizer *tok);

/* Append the ids of text[0..len) to out. */
int rc_tokenizer_encode(const rc_tokenizer *tok, const char *text, size_t len,
                        enum rc_encode_mode mode, rc_ids *out, rc_err *err);

/* Same result, computed in segments on pool (NULL pool = serial).  Texts
 * shorter than a few KiB are encoded serially. */
int rc_tokenizer_encode_parallel(const rc_tokenizer *tok, rc_pool *pool, const char *text,
                                 size_t len, enum rc_encode_mode mode, rc_ids *out,
                                 rc_err *err);

/* Empty every thread's BPE cache (memory pressure, benchmarks).  Only while
 * no encode with this tokenizer is running. */
void rc_tokenizer_drop_caches(rc_tokenizer *tok);

/* Number of ids (1 + the largest id of vocab and added tokens). */
int32_t rc_tokenizer_n_ids(const rc_tokenizer *tok);
/* Id of an added token by its exact content, or -1. */
int32_t rc_tokenizer_added_id(const rc_tokenizer *tok, const char *content);
/* 1 if id is an added token (control or special), else 0. */
int rc_tokenizer_is_added(const rc_tokenizer *tok, int32_t id);
/* Raw bytes of a token (added tokens: their content), NULL if no such id. */
const char *rc_tokenizer_token_bytes(const rc_tokenizer *tok, int32_t id, size_t *len);

/* Streaming decoder: ids in, UTF-8 out.  An incomplete UTF-8 sequence at the
 * end of a push is held back until later ids complete it; an ill-formed
 * subpart becomes U+FFFD, exactly like HF's decode of the whole sequence.
 * Added tokens are dropped unless RC_DECODE_ADDED is set: rendering control
 * tokens as text is always an explicit choice. */
enum { RC_DECODE_ADDED = 1 };

typedef struct rc_decoder {
    const rc_tokenizer *tok;
    unsigned flags;
    uint8_t pend[4];
    int npend;
} rc_decoder;

void rc_decoder_init(rc_decoder *d, const rc_tokenizer *tok, unsigned flags);
/* RC_ERANGE (and nothing appended for that id) on an id outside the vocab. */
int rc_decoder_push(rc_decoder *d, const int32_t *ids, size_t n, rc_bytes *out, rc_err *err);
/* End of stream: a held-back incomplete sequence becomes U+FFFD. */
int rc_decoder_flush(rc_decoder *d, rc_bytes *out);
/* Whole-sequence convenience: push + flush. */
int rc_tokenizer_decode(const rc_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags,
                        rc_bytes *out, rc_err *err);

#endif
