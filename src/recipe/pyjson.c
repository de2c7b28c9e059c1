/* pyjson.c - Python-style JSON serialisation for prompt text.
 *
 * Floats follow Python's repr: the shortest digit string that reads back to
 * the same double (found by trying 1..17 significant digits), laid out in
 * fixed notation when the decimal exponent is in [-4, 16) and as d.ddde+XX
 * otherwise; integral values keep ".0". */
#define _GNU_SOURCE /* memmem */
#include "recipe/pyjson.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT(s, n) \
    do { \
        if (rc_bytes_append(out, (s), (n))) return RC_ENOMEM; \
    } while (0)
#define OUTS(s) OUT((s), strlen(s))

int rc_pyfloat(double x, rc_bytes *out) { return rc_pyfloat_style(x, RC_FLOAT_PY, out); }

int rc_pyfloat_style(double x, rc_float_style st, rc_bytes *out) {
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
    int lo = st == RC_FLOAT_V4 ? -5 : -4;
    if (exp10 >= lo && exp10 < 16) {
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
        snprintf(buf, sizeof buf, st == RC_FLOAT_V4 && exp10 < 0 ? "e%c%d" : "e%c%02d", exp10 < 0 ? '-' : '+',
                 exp10 < 0 ? -exp10 : exp10);
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

int rc_json_is_u64(const json_t *v) {
    return json_is_string(v) && json_string_length(v) > 5 && !memcmp(json_string_value(v), "\0U64:", 5);
}

int rc_pyjson(const json_t *v, rc_bytes *out) { return rc_pyjson_style(v, RC_FLOAT_PY, out); }

int rc_pyjson_style(const json_t *v, rc_float_style st, rc_bytes *out) {
    char buf[32];
    switch (json_typeof(v)) {
    case JSON_NULL: OUTS("null"); return 0;
    case JSON_TRUE: OUTS("true"); return 0;
    case JSON_FALSE: OUTS("false"); return 0;
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        OUTS(buf);
        return 0;
    case JSON_REAL: return rc_pyfloat_style(json_real_value(v), st, out);
    case JSON_STRING:
        if (rc_json_is_u64(v)) {
            OUT(json_string_value(v) + 5, json_string_length(v) - 5); /* see rc_json_loadb */
            return 0;
        }
        return rc_pyjson_string(json_string_value(v), json_string_length(v), out);
    case JSON_ARRAY: {
        OUTS("[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) OUTS(", ");
            int rc = rc_pyjson_style(json_array_get(v, i), st, out);
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
            if ((rc = rc_pyjson_style(x, st, out))) return rc;
        }
        OUTS("}");
        return 0;
    }
    }
    return RC_EINVAL;
}

/* Rewrite integer literals that do not fit int64 into float literals
 * (append ".0"), leaving strings alone; then parse again. */
json_t *rc_json_loadb(const char *text, size_t n, size_t flags, json_error_t *je) {
    json_error_t local;
    if (!je) je = &local;
    json_t *v = json_loadb(text, n, flags, je);
    /* "-0" is an integer to jansson but -0.0 to the reference */
    int neg_zero = memmem(text, n, "-0", 2) != NULL;
    if (v ? !neg_zero : !strstr(je->text, "too big")) return v;
    json_decref(v);
    rc_bytes b = {0};
    int in_str = 0;
    /* the marker must not be forgeable by the input itself */
    int sentinel_ok = !memmem(text, n, "\\u0000U64:", 10);
    for (size_t i = 0; i < n;) {
        char c = text[i];
        if (in_str) {
            if (c == '\\' && i + 1 < n) {
                rc_bytes_append(&b, text + i, 2);
                i += 2;
                continue;
            }
            if (c == '"') in_str = 0;
            rc_bytes_append(&b, &c, 1);
            i++;
            continue;
        }
        if (c == '"') {
            in_str = 1;
            rc_bytes_append(&b, &c, 1);
            i++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i + (c == '-');
            while (j < n && text[j] >= '0' && text[j] <= '9') j++;
            int is_int = !(j < n && (text[j] == '.' || text[j] == 'e' || text[j] == 'E'));
            size_t digits = j - i - (c == '-');
            rc_bytes_append(&b, text + i, j - i);
            if (is_int && digits == 1 && c == '-' && text[i + 1] == '0') rc_bytes_append(&b, ".0", 2);
            if (is_int && digits >= 19) {
                /* the literal is not NUL-terminated: range-check a copy */
                char num[32];
                int fits_i64 = 0, fits_u64 = 0;
                if (j - i < sizeof num) {
                    memcpy(num, text + i, j - i);
                    num[j - i] = 0;
                    errno = 0;
                    (void)strtoll(num, NULL, 10);
                    fits_i64 = errno != ERANGE;
                    errno = 0;
                    (void)strtoull(num, NULL, 10);
                    fits_u64 = c != '-' && errno != ERANGE;
                }
                if (!fits_i64) {
                    if (fits_u64 && sentinel_ok) {
                        /* u64 range: kept as its digits behind a marker */
                        b.n -= j - i;
                        rc_bytes_append(&b, "\"\\u0000U64:", 11);
                        rc_bytes_append(&b, text + i, j - i);
                        rc_bytes_append(&b, "\"", 1);
                    } else {
                        rc_bytes_append(&b, ".0", 2);
                    }
                }
            }
            i = j;
            continue;
        }
        rc_bytes_append(&b, &c, 1);
        i++;
    }
    v = json_loadb(b.v ? b.v : "", b.n, flags | JSON_ALLOW_NUL, je);
    rc_bytes_free(&b);
    return v;
}
