/* pyjson.c - Python-style JSON serialisation for prompt text.
 *
 * Floats follow Python's repr: the shortest digit string that reads back to
 * the same double (found by trying 1..17 significant digits), laid out in
 * fixed notation when the decimal exponent is in [-4, 16) and as d.ddde+XX
 * otherwise; integral values keep ".0". */
#include "recipe/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT(s, n) \
    do { \
        if (rc_bytes_append(out, (s), (n))) return RC_ENOMEM; \
    } while (0)
#define OUTS(s) OUT((s), strlen(s))

int rc_pyfloat(double x, rc_bytes *out) {
    char buf[64], digits[32];
    int exp10 = 0;
    if (x == 0) {
        OUTS(signbit(x) ? "-0.0" : "0.0");
        return 0;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x || p == 17) break;
    }
    /* buf = [-]d[.ddd]e[+-]XX */
    const char *s = buf;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    digits[nd] = 0;
    exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0; /* %.*e may pad */
    if (neg) OUTS("-");
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) OUT(i < (int)nd ? &digits[i] : "0", 1);
            OUTS(".");
            if ((int)nd > exp10 + 1) OUT(digits + exp10 + 1, nd - (size_t)exp10 - 1);
            else OUTS("0");
        } else {
            OUTS("0.");
            for (int i = 0; i < -exp10 - 1; i++) OUTS("0");
            OUT(digits, nd);
        }
    } else {
        OUT(digits, 1);
        if (nd > 1) {
            OUTS(".");
            OUT(digits + 1, nd - 1);
        }
        snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        OUTS(buf);
    }
    return 0;
}

int rc_pyjson_string(const char *s, size_t n, rc_bytes *out) {
    OUTS("\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (esc) {
            OUT(s + run, i - run);
            OUTS(esc);
            run = i + 1;
        }
    }
    OUT(s + run, n - run);
    OUTS("\"");
    return 0;
}

int rc_pyjson(const json_t *v, rc_bytes *out) {
    char buf[32];
    switch (json_typeof(v)) {
    case JSON_NULL: OUTS("null"); return 0;
    case JSON_TRUE: OUTS("true"); return 0;
    case JSON_FALSE: OUTS("false"); return 0;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        OUTS(buf);
        return 0;
    case JSON_REAL: return rc_pyfloat(json_real_value(v), out);
    case JSON_STRING: return rc_pyjson_string(json_string_value(v), json_string_length(v), out);
    case JSON_ARRAY: {
        OUTS("[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) OUTS(", ");
            int rc = rc_pyjson(json_array_get(v, i), out);
            if (rc) return rc;
        }
        OUTS("]");
        return 0;
    }
    case JSON_OBJECT: {
        OUTS("{");
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) OUTS(", ");
            first = 0;
            int rc = rc_pyjson_string(k, strlen(k), out);
            if (rc) return rc;
            OUTS(": ");
            if ((rc = rc_pyjson(x, out))) return rc;
        }
        OUTS("}");
        return 0;
    }
    }
    return RC_EINVAL;
}
