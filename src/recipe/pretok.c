/* pretok.c - the three Split stages of the DeepSeek pre-tokenizer.
 *
 * Owns: turning text into the pieces BPE runs on.  Does not own: added-token
 * extraction (tokenizer.c) or BPE.
 *
 * Stage 3 is the interesting one.  The regex alternation is leftmost-first,
 * so at each position we try the alternatives in order; every alternative is
 * a run of a class with at most one optional leading char, so "try and
 * backtrack" collapses into a few run scans:
 *   alt1  [punct][A-Za-z]+        ASCII punct followed by a letter
 *   alt2  X?[LM]+                 X = any char but \r \n L P S; if X is there
 *                                 and an L/M follows, take it, else start at c
 *   alt3  ' '?[PS]+[\r\n]*
 *   alt4  \s*[\r\n]+              ends right after the last CR/LF of the
 *                                 whitespace run (greedy \s* backs off to it)
 *   alt5  \s+(?!\S)               the whole run at end of piece, else the run
 *                                 minus its last char (if that leaves one)
 *   alt6  \s+                     the whole run
 * A position where nothing matches joins the gap before the next match. */
#include "recipe/pretok.h"

#include <pthread.h>

#include "recipe/unicode.h"

#define R3A "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
#define R3B " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
const char *const rc_pretok_patterns[3] = {
    "\\p{N}{1,3}",
    "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
    R3A R3B,
};

/* ASCII classes; byte >= 0x80 goes through the generated table */
enum { A_PUNCT = 0x40, A_ALPHA = 0x80 };
static uint8_t ascii_cls[128];
static pthread_once_t ascii_once = PTHREAD_ONCE_INIT;

static void ascii_init(void) {
    for (int c = 0; c < 128; c++) {
        uint8_t f = rc_uc_flags((uint32_t)c);
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) f |= A_ALPHA;
        if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
            (c >= 123 && c <= 126))
            f |= A_PUNCT;
        ascii_cls[c] = f;
    }
}

/* class flags and length of the char at s (valid UTF-8, at least 1 byte) */
static inline uint8_t cls_at(const uint8_t *s, int *len, uint32_t *cpo) {
    if (s[0] < 0x80) {
        *len = 1;
        *cpo = s[0];
        return ascii_cls[s[0]];
    }
    uint32_t cp;
    *len = rc_utf8_next(s, &cp);
    *cpo = cp;
    return rc_uc_flags(cp);
}

static inline int is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
}

#define LM (RC_UC_L | RC_UC_M)
#define PS (RC_UC_P | RC_UC_S)

/* end of the run of chars whose flags intersect `want`, starting at i */
static inline size_t run(const uint8_t *s, size_t i, size_t e, uint8_t want) {
    while (i < e) {
        int l;
        uint32_t cp;
        if (!(cls_at(s + i, &l, &cp) & want)) break;
        i += (size_t)l;
    }
    return i;
}

/* end of the stage-3 match at i (exclusive), or 0 if none matches here */
static size_t match3(const uint8_t *s, size_t i, size_t e) {
    int l0, l1 = 0;
    uint32_t c0, c1 = 0;
    uint8_t f0 = cls_at(s + i, &l0, &c0), f1 = 0;
    size_t i1 = i + (size_t)l0;
    if (i1 < e) f1 = cls_at(s + i1, &l1, &c1);

    if ((f0 & A_PUNCT) && c0 < 128 && i1 < e && c1 < 128 && (f1 & A_ALPHA)) { /* alt1 */
        size_t j = i1;
        while (j < e && s[j] < 128 && (ascii_cls[s[j]] & A_ALPHA)) j++;
        return j;
    }
    /* alt2: X is the lone optional char, so try "X then LM+" before "LM+" */
    if (c0 != '\r' && c0 != '\n' && !(f0 & (RC_UC_L | PS)) && i1 < e && (f1 & LM))
        return run(s, i1, e, LM);
    if (f0 & LM) return run(s, i1, e, LM);
    /* alt3 */
    if ((c0 == ' ' && i1 < e && (f1 & PS)) || (f0 & PS)) {
        size_t j = run(s, (f0 & PS) ? i : i1, e, PS);
        while (j < e && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    if (!(f0 & RC_UC_WS)) return 0;
    /* alt4..6 share the whitespace run [i, j) */
    size_t j = i, last_start = i, after_crlf = 0, nchars = 0;
    while (j < e) {
        int l;
        uint32_t cp;
        if (!(cls_at(s + j, &l, &cp) & RC_UC_WS)) break;
        last_start = j;
        j += (size_t)l;
        nchars++;
        if (cp == '\r' || cp == '\n') after_crlf = j;
    }
    if (after_crlf) return after_crlf;        /* alt4 */
    if (j == e || nchars == 1) return j;      /* alt5 at end of piece, or alt6 */
    return last_start;                        /* alt5: leave the last ws char */
}

static void stage3(const uint8_t *s, size_t b, size_t e, rc_piece_fn fn, void *ctx) {
    size_t i = b, gap = b;
    while (i < e) {
        size_t m = match3(s, i, e);
        if (m) {
            if (gap < i) fn(ctx, s + gap, i - gap);
            fn(ctx, s + i, m - i);
            i = gap = m;
        } else {
            int l;
            uint32_t cp;
            cls_at(s + i, &l, &cp);
            i += (size_t)l;
        }
    }
    if (gap < e) fn(ctx, s + gap, e - gap);
}

static void stage2(const uint8_t *s, size_t b, size_t e, rc_piece_fn fn, void *ctx) {
    size_t i = b, gap = b;
    while (i < e) {
        if (s[i] < 0xE3) { /* every char of the ranges is 3 bytes, E3..E9 lead */
            i++;
            while (i < e && (s[i] & 0xC0) == 0x80) i++;
            continue;
        }
        uint32_t cp;
        int l = rc_utf8_next(s + i, &cp);
        if (!is_cjk(cp)) {
            i += (size_t)l;
            continue;
        }
        size_t j = i + (size_t)l;
        while (j < e) {
            int l2 = rc_utf8_next(s + j, &cp);
            if (!is_cjk(cp)) break;
            j += (size_t)l2;
        }
        if (gap < i) stage3(s, gap, i, fn, ctx);
        stage3(s, i, j, fn, ctx);
        i = gap = j;
    }
    if (gap < e) stage3(s, gap, e, fn, ctx);
}

void rc_pretok_split(const uint8_t *s, size_t n, rc_piece_fn fn, void *ctx) {
    pthread_once(&ascii_once, ascii_init);
    size_t i = 0, gap = 0;
    while (i < n) {
        int l;
        uint32_t cp;
        uint8_t f = cls_at(s + i, &l, &cp);
        if (!(f & RC_UC_N)) {
            i += (size_t)l;
            continue;
        }
        /* \p{N}{1,3}: greedy, so a run splits into 3,3,...,rest */
        size_t j = i + (size_t)l;
        for (int k = 1; k < 3 && j < n; k++) {
            int l2;
            if (!(cls_at(s + j, &l2, &cp) & RC_UC_N)) break;
            j += (size_t)l2;
        }
        if (gap < i) stage2(s, gap, i, fn, ctx);
        stage2(s, i, j, fn, ctx);
        i = gap = j;
    }
    if (gap < n) stage2(s, gap, n, fn, ctx);
}

/* Safe cuts.  Cutting at p is exact when (a) in the uncut text some stage-3
 * match ends exactly at p, and (b) nothing the scan decided before p looked
 * at bytes at or after p.  Then the right part is scanned from p exactly as
 * before (scans only move forward), and the left part ends the same way.
 *
 * Rule A: s[p-1] == '\n' and s[p] is not whitespace.  The '\n' is always
 * inside a match (alt4 matches at any whitespace run holding a CR/LF, and
 * alt3 can end in CR/LF); no alternative continues after a CR/LF with a
 * non-space, so that match ends at p.  The only construct that peeks past
 * its match is alt5's (?!\S), and it is never reached in a run holding a
 * CR/LF because alt4 comes first.  Stages 1-2 never match '\n'.
 *
 * Rule B: s[p-1] is a letter (L) and s[p] == ' '.  A letter is always inside
 * an alt1/alt2 match (alt2 matches at any letter), both runs stop at the
 * space, and no alternative contains a letter followed by anything that is
 * not L/M/ASCII-alpha.  Stage 1 never matches letters and stage 2's run stops
 * at the space.
 *
 * Both rules are checked by the fuzz harness (serial == parallel). */
size_t rc_pretok_safe_cut(const uint8_t *s, size_t n, size_t from, size_t to) {
    pthread_once(&ascii_once, ascii_init);
    if (to > n) to = n;
    if (from < 1) from = 1;
    for (size_t p = from; p < to; p++) {
        uint8_t c = s[p];
        if (c == ' ') {
            /* find the char before p */
            size_t q = p - 1;
            while (q > 0 && (s[q] & 0xC0) == 0x80) q--;
            int l;
            uint32_t cp;
            if (cls_at(s + q, &l, &cp) & RC_UC_L) return p;
        } else if (s[p - 1] == '\n' && (c & 0xC0) != 0x80) {
            int l;
            uint32_t cp;
            if (!(cls_at(s + p, &l, &cp) & RC_UC_WS)) return p;
        }
    }
    return to;
}
