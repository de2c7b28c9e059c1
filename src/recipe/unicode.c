/* unicode.c - UTF-8 well-formedness per Unicode Table 3-7.
 *
 * One stepping function serves both the validator (reject bad input before
 * tokenization) and the streaming decoder (replace ill-formed subparts by
 * U+FFFD, one per maximal subpart, as Rust's from_utf8_lossy and therefore
 * HF tokenizers' decode do; hold back a valid incomplete tail). */
#include "recipe/unicode.h"

int rc_utf8_step(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }
    else return -1; /* stray continuation byte or impossible lead */
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return 0; /* incomplete but so far valid */
        uint8_t b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -k;
    }
    return len;
}

size_t rc_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        while (i + 8 <= n) {
            uint64_t w;
            __builtin_memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) { i++; continue; }
        int k = rc_utf8_step(s + i, n - i);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}
