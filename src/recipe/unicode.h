/* unicode.h - code point classes for the pre-tokenizer, and UTF-8 helpers.
 *
 * The class table is generated from HF tokenizers itself (see
 * tools/gen_unicode_tables.py), so \p{L} here means exactly what it means to
 * the Oniguruma build the reference links - including its Unicode version. */
#ifndef RECIPE_UNICODE_H
#define RECIPE_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    RC_UC_L = 0x01,  /* \p{L} letters */
    RC_UC_M = 0x02,  /* \p{M} marks */
    RC_UC_N = 0x04,  /* \p{N} numbers */
    RC_UC_P = 0x08,  /* \p{P} punctuation */
    RC_UC_S = 0x10,  /* \p{S} symbols */
    RC_UC_WS = 0x20, /* \s */
};

extern const uint16_t rc_uni_page[0x110000 / 256];
extern const uint8_t rc_uni_flags[][256];

static inline uint8_t rc_uc_flags(uint32_t cp) {
    return cp < 0x110000 ? rc_uni_flags[rc_uni_page[cp >> 8]][cp & 255] : 0;
}

/* Decode one code point from well-formed UTF-8 (already validated): returns
 * its length in bytes. */
static inline int rc_utf8_next(const uint8_t *s, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (c < 0xF0) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

/* Length of the longest well-formed prefix of s[0..n) (Unicode Table 3-7:
 * no overlongs, no surrogates, nothing above U+10FFFF).  Equals n iff the
 * whole buffer is valid UTF-8. */
size_t rc_utf8_valid_prefix(const uint8_t *s, size_t n);

/* One step of the same check: given at least one byte at s (n bytes
 * available), return the length of the well-formed sequence starting there
 * (1..4), or -k where k >= 1 is the length of the maximal ill-formed subpart
 * (bytes to replace by one U+FFFD), or 0 if the bytes are a valid but
 * incomplete prefix that more input could complete. */
int rc_utf8_step(const uint8_t *s, size_t n);

#endif
