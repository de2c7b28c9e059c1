/* jsonsyntax.c - JSON syntax errors worded the way serde_json words them.
 *
 * The reference parses request bodies with serde_json; its error text
 * ("EOF while parsing an object at line 1 column 1") is part of the API's
 * error body, so a rejected body must be described the same way.  This is
 * a validating scanner only (no values are built): jansson parses bodies
 * that pass.  It also enforces serde_json's nesting limit of 128, which
 * jansson (2048) would let through. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/pyjson.h"
#include "recipe/unicode.h"

typedef struct {
    const char *s;
    size_t n, i;
    int depth;
    const char *what; /* error text, NULL while fine */
    size_t at;        /* bytes consumed when the error was seen */
} sc;

static int err(sc *x, const char *what, size_t at) {
    if (!x->what) {
        x->what = what;
        x->at = at;
    }
    return -1;
}

static void ws(sc *x) {
    while (x->i < x->n && (x->s[x->i] == ' ' || x->s[x->i] == '\t' || x->s[x->i] == '\n' || x->s[x->i] == '\r'))
        x->i++;
}

static int value(sc *x);

static int string(sc *x) { /* at the opening quote */
    x->i++;
    while (x->i < x->n) {
        unsigned char c = (unsigned char)x->s[x->i];
        if (c == '"') {
            x->i++;
            return 0;
        }
        if (c < 0x20) return err(x, "control character (\\u0000-\\u001F) found while parsing a string", x->i + 1);
        if (c == '\\') {
            if (x->i + 1 >= x->n) return err(x, "EOF while parsing a string", x->n);
            char e = x->s[x->i + 1];
            if (e == 'u') {
                for (int k = 0; k < 4; k++) {
                    size_t j = x->i + 2 + (size_t)k;
                    if (j >= x->n) return err(x, "EOF while parsing a string", x->n);
                    char h = x->s[j];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F')))
                        return err(x, "invalid escape", j + 1);
                }
                x->i += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) return err(x, "invalid escape", x->i + 2);
            x->i += 2;
            continue;
        }
        x->i++;
    }
    return err(x, "EOF while parsing a string", x->n);
}

static int number(sc *x) {
    size_t b = x->i;
    if (x->s[x->i] == '-') x->i++;
    if (x->i >= x->n) return err(x, "EOF while parsing a value", x->n);
    if (!(x->s[x->i] >= '0' && x->s[x->i] <= '9')) return err(x, "invalid number", x->i + 1);
    while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') x->i++;
    if (x->i < x->n && x->s[x->i] == '.') {
        x->i++;
        if (x->i >= x->n) return err(x, "EOF while parsing a value", x->n);
        if (!(x->s[x->i] >= '0' && x->s[x->i] <= '9')) return err(x, "invalid number", x->i + 1);
        while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') x->i++;
    }
    if (x->i < x->n && (x->s[x->i] == 'e' || x->s[x->i] == 'E')) {
        x->i++;
        if (x->i < x->n && (x->s[x->i] == '+' || x->s[x->i] == '-')) x->i++;
        if (x->i >= x->n) return err(x, "EOF while parsing a value", x->n);
        if (!(x->s[x->i] >= '0' && x->s[x->i] <= '9')) return err(x, "invalid number", x->i + 1);
        while (x->i < x->n && x->s[x->i] >= '0' && x->s[x->i] <= '9') x->i++;
    }
    char buf[64];
    size_t len = x->i - b;
    if (len < sizeof buf) {
        memcpy(buf, x->s + b, len);
        buf[len] = 0;
        if (isinf(strtod(buf, NULL))) return err(x, "number out of range", x->i);
    }
    return 0;
}

static int literal(sc *x, const char *word) {
    for (size_t k = 0; word[k]; k++) {
        if (x->i >= x->n) return err(x, "EOF while parsing a value", x->n);
        if (x->s[x->i] != word[k]) return err(x, "expected ident", x->i + 1);
        x->i++;
    }
    return 0;
}

static int container(sc *x, int obj) {
    const char *eof = obj ? "EOF while parsing an object" : "EOF while parsing a list";
    if (++x->depth > 128) return err(x, "recursion limit exceeded", x->i); /* before the bracket */
    x->i++;
    ws(x);
    if (x->i >= x->n) return err(x, eof, x->n);
    if (x->s[x->i] == (obj ? '}' : ']')) {
        x->i++;
        x->depth--;
        return 0;
    }
    for (;;) {
        if (obj) {
            if (x->s[x->i] != '"') return err(x, "key must be a string", x->i + 1);
            if (string(x)) return -1;
            ws(x);
            if (x->i >= x->n) return err(x, eof, x->n);
            if (x->s[x->i] != ':') return err(x, "expected `:`", x->i + 1);
            x->i++;
        }
        if (value(x)) return -1;
        ws(x);
        if (x->i >= x->n) return err(x, eof, x->n);
        char c = x->s[x->i];
        if (c == ',') {
            x->i++;
            ws(x);
            if (x->i >= x->n) return err(x, obj ? eof : "EOF while parsing a value", x->n);
            if (x->s[x->i] == (obj ? '}' : ']')) return err(x, "trailing comma", x->i + 1);
            continue;
        }
        if (c == (obj ? '}' : ']')) {
            x->i++;
            x->depth--;
            return 0;
        }
        return err(x, obj ? "expected `,` or `}`" : "expected `,` or `]`", x->i + 1);
    }
}

static int value(sc *x) {
    ws(x);
    if (x->i >= x->n) return err(x, "EOF while parsing a value", x->n);
    switch (x->s[x->i]) {
    case '{': return container(x, 1);
    case '[': return container(x, 0);
    case '"': return string(x);
    case 'n': return literal(x, "null");
    case 't': return literal(x, "true");
    case 'f': return literal(x, "false");
    default:
        if (x->s[x->i] == '-' || (x->s[x->i] >= '0' && x->s[x->i] <= '9')) return number(x);
        return err(x, "expected value", x->i + 1);
    }
}

int rc_json_syntax_error(const char *s, size_t n, char *msg, size_t cap) {
    /* serde reads from a str the server already checked: report bad UTF-8 first */
    size_t ok = rc_utf8_valid_prefix((const uint8_t *)s, n);
    if (ok != n) {
        snprintf(msg, cap, "the body is not valid UTF-8 (ill-formed byte 0x%02X at offset %zu)", (unsigned char)s[ok], ok);
        return 1;
    }
    sc x = {.s = s, .n = n};
    if (!value(&x)) {
        ws(&x);
        if (x.i < n) err(&x, "trailing characters", x.i + 1);
    }
    if (!x.what) return 0;
    size_t line = 1, last_nl = 0;
    int seen_nl = 0;
    for (size_t k = 0; k < x.at && k < n; k++)
        if (s[k] == '\n') {
            line++;
            last_nl = k;
            seen_nl = 1;
        }
    size_t col = seen_nl ? x.at - last_nl - 1 : x.at;
    snprintf(msg, cap, "%s at line %zu column %zu", x.what, line, col);
    return 1;
}
