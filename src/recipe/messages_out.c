/* messages_out.c - stream events -> Anthropic Messages responses (spec recipe.md §4.4).
 *
 * Matches deepseek-recipe 0.2.0 byte for byte (docs/STREAM-MESSAGES.md,
 * tests/py/test_stream_messages_diff.py):
 *
 *   stream   `event: T\ndata: {...}\n\n` per event, no [DONE]:
 *            message_start; in thinking mode a thinking block (index 0) is
 *            opened at once; `ping` right after the first content_block_start;
 *            one content_block_delta per stream event (text_delta,
 *            thinking_delta, input_json_delta); a new kind of output closes
 *            the open block (a thinking block first gets signature_delta with
 *            the signature = the message id) and opens the next index;
 *            finish: close the open block, message_delta (stop_reason,
 *            stop_sequence, usage), message_stop.
 *   body     {"id","type":"message","role","model","content":[blocks],
 *            "stop_reason","stop_sequence","usage"}; a tool_use block's input
 *            is the concatenated partial JSON parsed and re-serialised the way
 *            serde_json does it (compact, duplicate keys keep the first
 *            position and the last value, floats in ryu style, depth < 128);
 *            anything serde_json rejects becomes {}.
 *
 * JSON is written by hand with serde_json's string escaping (rc_pyjson_string)
 * and the reference's key order.  Tool ids are call_{k:02}_[ET_]{24 chars},
 * as in Chat; --deterministic fixes the id "msg_test" and the id suffix. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/out.h"
#include "recipe/pyjson.h"

typedef enum { B_NONE, B_THINKING, B_TEXT, B_TOOL } block_kind;

typedef struct {
    block_kind kind;
    rc_bytes text;  /* thinking / text / tool input (partial JSON concatenated) */
    rc_bytes name;  /* tool name */
    char id[48];    /* tool id */
} block;

typedef struct {
    rc_out_opts o;
    char *id, *model, *stop_seq;
    block *b;
    size_t nb;
    int open;               /* the last block is still open (streaming) */
    int pinged;
    size_t ncalls;
    int reasoning_emitted;  /* decides the ET_ infix of tool ids */
    rc_bytes ev;            /* streaming: events not yet flushed */
} messages_w;

#define S(out, str) rc_bytes_append((out), (str), strlen(str))

static void jstr(rc_bytes *out, const char *s, size_t n) { rc_pyjson_string(s ? s : "", n, out); }

/* ------------------------------------------------- serde_json re-serialising */

typedef struct {
    const char *p, *e;
    int depth;
} jp;

static void ws(jp *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hex4(jp *j, unsigned *u) {
    if (j->e - j->p < 4) return -1;
    *u = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15) return -1;
        *u = *u * 16 + d;
    }
    return 0;
}

static void utf8(rc_bytes *o, unsigned c) {
    char b[4];
    size_t n;
    if (c < 0x80) b[0] = (char)c, n = 1;
    else if (c < 0x800) b[0] = (char)(0xC0 | c >> 6), b[1] = (char)(0x80 | (c & 63)), n = 2;
    else if (c < 0x10000)
        b[0] = (char)(0xE0 | c >> 12), b[1] = (char)(0x80 | (c >> 6 & 63)), b[2] = (char)(0x80 | (c & 63)), n = 3;
    else
        b[0] = (char)(0xF0 | c >> 18), b[1] = (char)(0x80 | (c >> 12 & 63)), b[2] = (char)(0x80 | (c >> 6 & 63)),
        b[3] = (char)(0x80 | (c & 63)), n = 4;
    rc_bytes_append(o, b, n);
}

/* a string literal (at '"') decoded into raw */
static int jstring(jp *j, rc_bytes *raw) {
    j->p++;
    while (j->p < j->e) {
        unsigned char c = (unsigned char)*j->p++;
        if (c == '"') return 0;
        if (c < 0x20) return -1;
        if (c != '\\') {
            rc_bytes_append(raw, (const char *)&c, 1);
            continue;
        }
        if (j->p >= j->e) return -1;
        char x = *j->p++;
        unsigned u, lo;
        switch (x) {
        case '"': case '\\': case '/': rc_bytes_append(raw, &x, 1); break;
        case 'b': rc_bytes_append(raw, "\b", 1); break;
        case 'f': rc_bytes_append(raw, "\f", 1); break;
        case 'n': rc_bytes_append(raw, "\n", 1); break;
        case 'r': rc_bytes_append(raw, "\r", 1); break;
        case 't': rc_bytes_append(raw, "\t", 1); break;
        case 'u':
            if (hex4(j, &u)) return -1;
            if (u >= 0xDC00 && u < 0xE000) return -1;
            if (u >= 0xD800 && u < 0xDC00) {
                if (j->e - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u') return -1;
                j->p += 2;
                if (hex4(j, &lo) || lo < 0xDC00 || lo >= 0xE000) return -1;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            utf8(raw, u);
            break;
        default: return -1;
        }
    }
    return -1;
}

static int digits(jp *j) {
    const char *s = j->p;
    while (j->p < j->e && *j->p >= '0' && *j->p <= '9') j->p++;
    return j->p > s ? 0 : -1;
}

static int jnumber(jp *j, rc_bytes *out) {
    const char *s = j->p;
    int neg = *j->p == '-', isf = 0;
    if (neg) j->p++;
    if (j->p >= j->e) return -1;
    if (*j->p == '0') j->p++;
    else if (digits(j)) return -1;
    if (j->p < j->e && *j->p == '.') {
        j->p++;
        isf = 1;
        if (digits(j)) return -1;
    }
    if (j->p < j->e && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        isf = 1;
        if (j->p < j->e && (*j->p == '+' || *j->p == '-')) j->p++;
        if (digits(j)) return -1;
    }
    size_t n = (size_t)(j->p - s);
    char *buf = malloc(n + 1);
    if (!buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    if (!isf) {
        /* u64 when non-negative, i64 when negative (but -0 is a float), else f64 */
        const char *d = buf + neg;
        size_t nd = n - (size_t)neg;
        int fits = neg ? nd < 19 || (nd == 19 && strcmp(d, "9223372036854775808") <= 0)
                       : nd < 20 || (nd == 20 && strcmp(d, "18446744073709551615") <= 0);
        if (fits && !(neg && !strcmp(d, "0"))) {
            rc_bytes_append(out, buf, n);
            free(buf);
            return 0;
        }
    }
    double x = strtod(buf, NULL);
    free(buf);
    if (isinf(x)) return -1;
    rc_pyfloat_style(x, RC_FLOAT_V4, out);
    return 0;
}

static int jvalue(jp *j, rc_bytes *out);

static int jcontainer(jp *j, rc_bytes *out) {
    int obj = *j->p == '{';
    if (++j->depth >= 128) return -1;
    j->p++;
    rc_bytes *keys = NULL, *vals = NULL;
    size_t n = 0;
    int rc = -1;
    ws(j);
    if (j->p < j->e && *j->p == (obj ? '}' : ']')) {
        j->p++;
        rc = 0;
        goto done;
    }
    for (;;) {
        rc_bytes k = {0}, v = {0};
        ws(j);
        if (obj) {
            if (j->p >= j->e || *j->p != '"' || jstring(j, &k)) goto bad;
            ws(j);
            if (j->p >= j->e || *j->p != ':') goto bad;
            j->p++;
            ws(j);
        }
        if (jvalue(j, &v)) goto bad;
        size_t i = n;
        if (obj)
            for (i = 0; i < n; i++)
                if (keys[i].n == k.n && (!k.n || !memcmp(keys[i].v, k.v, k.n))) break;
        if (i < n) { /* duplicate key: first position, last value */
            rc_bytes_free(&vals[i]);
            vals[i] = v;
            rc_bytes_free(&k);
        } else {
            rc_bytes *nk = realloc(keys, (n + 1) * sizeof *nk);
            if (nk) keys = nk;
            rc_bytes *nv = nk ? realloc(vals, (n + 1) * sizeof *nv) : NULL;
            if (!nv) {
            bad:
                rc_bytes_free(&k);
                rc_bytes_free(&v);
                goto done;
            }
            vals = nv;
            keys[n] = k;
            vals[n++] = v;
        }
        ws(j);
        if (j->p < j->e && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->e && *j->p == (obj ? '}' : ']')) {
            j->p++;
            rc = 0;
            break;
        }
        break;
    }
done:
    if (!rc) {
        S(out, obj ? "{" : "[");
        for (size_t i = 0; i < n; i++) {
            if (i) S(out, ",");
            if (obj) {
                jstr(out, keys[i].v, keys[i].n);
                S(out, ":");
            }
            rc_bytes_append(out, vals[i].v ? vals[i].v : "", vals[i].n);
        }
        S(out, obj ? "}" : "]");
    }
    for (size_t i = 0; i < n; i++) {
        rc_bytes_free(&keys[i]);
        rc_bytes_free(&vals[i]);
    }
    free(keys);
    free(vals);
    j->depth--;
    return rc;
}

static int jvalue(jp *j, rc_bytes *out) {
    if (j->p >= j->e) return -1;
    char c = *j->p;
    if (c == '{' || c == '[') return jcontainer(j, out);
    if (c == '"') {
        rc_bytes raw = {0};
        int rc = jstring(j, &raw);
        if (!rc) jstr(out, raw.v, raw.n);
        rc_bytes_free(&raw);
        return rc;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return jnumber(j, out);
    static const char *const lit[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t l = strlen(lit[i]);
        if ((size_t)(j->e - j->p) >= l && !memcmp(j->p, lit[i], l)) {
            j->p += l;
            S(out, lit[i]);
            return 0;
        }
    }
    return -1;
}

/* the tool input the reference reports: the JSON re-serialised, or {} */
static void tool_input(const rc_bytes *args, rc_bytes *out) {
    jp j = {args->v ? args->v : "", (args->v ? args->v : "") + args->n, 0};
    rc_bytes v = {0};
    ws(&j);
    int rc = jvalue(&j, &v);
    ws(&j);
    if (!rc && j.p == j.e) rc_bytes_append(out, v.v, v.n);
    else S(out, "{}");
    rc_bytes_free(&v);
}

/* ---------------------------------------------------------------- events */

static block *open_block(messages_w *w, block_kind k, const char *name, size_t n);

static void *w_create(const rc_out_opts *o, const json_t *request) {
    (void)request;
    messages_w *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->o = *o;
    w->id = strdup(o->deterministic ? "msg_test" : o->id ? o->id : "");
    w->model = strdup(o->model ? o->model : "");
    /* thinking mode opens its block at once; streaming does it in w_start,
     * after message_start */
    if (o->thinking && !o->stream) open_block(w, B_THINKING, NULL, 0);
    return w;
}

static void w_destroy(void *p) {
    messages_w *w = p;
    if (!w) return;
    for (size_t i = 0; i < w->nb; i++) {
        rc_bytes_free(&w->b[i].text);
        rc_bytes_free(&w->b[i].name);
    }
    free(w->b);
    free(w->id);
    free(w->model);
    free(w->stop_seq);
    rc_bytes_free(&w->ev);
    free(w);
}

/* the stop sequence that ended the output, from finish */
static void set_stop_sequence(void *p, const char *s) {
    messages_w *w = p;
    free(w->stop_seq);
    w->stop_seq = s ? strdup(s) : NULL;
}

static void event_head(rc_bytes *out, const char *type) {
    S(out, "event: ");
    S(out, type);
    S(out, "\ndata: {\"type\":\"");
    S(out, type);
    S(out, "\"");
}

static void delta_head(messages_w *w, const char *type) {
    char b[96];
    event_head(&w->ev, "content_block_delta");
    snprintf(b, sizeof b, ",\"index\":%zu,\"delta\":{\"type\":\"%s\",", w->nb - 1, type);
    S(&w->ev, b);
}

static void close_block(messages_w *w) {
    if (!w->open) return;
    w->open = 0;
    if (!w->o.stream) return;
    block *b = &w->b[w->nb - 1];
    if (b->kind == B_THINKING) {
        delta_head(w, "signature_delta");
        S(&w->ev, "\"signature\":");
        jstr(&w->ev, w->id, strlen(w->id));
        S(&w->ev, "}}\n\n");
    }
    char num[64];
    event_head(&w->ev, "content_block_stop");
    snprintf(num, sizeof num, ",\"index\":%zu}\n\n", w->nb - 1);
    S(&w->ev, num);
}

static block *open_block(messages_w *w, block_kind k, const char *name, size_t n) {
    close_block(w);
    block *nb = realloc(w->b, (w->nb + 1) * sizeof *nb);
    if (!nb) return NULL;
    w->b = nb;
    block *b = &w->b[w->nb++];
    memset(b, 0, sizeof *b);
    b->kind = k;
    w->open = 1;
    if (k == B_TOOL) {
        /* call_{k:02}_ + "ET_" when thinking produced no reasoning first + 24
         * random chars (20 alphanumerics, 4 digits), as the reference does */
        char suf[25];
        if (w->o.deterministic) {
            memcpy(suf, "TESTTESTTESTTESTTEST0000", 25);
        } else {
            static const char an[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
            for (int i = 0; i < 24; i++) suf[i] = i < 20 ? an[rand() % 62] : (char)('0' + rand() % 10);
            suf[24] = 0;
        }
        snprintf(b->id, sizeof b->id, "call_%02zu_%s%s", w->ncalls++,
                 w->o.thinking && !w->reasoning_emitted ? "ET_" : "", suf);
        rc_bytes_append(&b->name, name, n);
    }
    if (!w->o.stream) return b;
    char num[64];
    event_head(&w->ev, "content_block_start");
    snprintf(num, sizeof num, ",\"index\":%zu,\"content_block\":", w->nb - 1);
    S(&w->ev, num);
    if (k == B_THINKING) {
        S(&w->ev, "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}");
    } else if (k == B_TEXT) {
        S(&w->ev, "{\"type\":\"text\",\"text\":\"\"}");
    } else {
        S(&w->ev, "{\"type\":\"tool_use\",\"id\":");
        jstr(&w->ev, b->id, strlen(b->id));
        S(&w->ev, ",\"name\":");
        jstr(&w->ev, name, n);
        S(&w->ev, ",\"input\":{}}");
    }
    S(&w->ev, "}\n\n");
    if (!w->pinged) {
        w->pinged = 1;
        event_head(&w->ev, "ping");
        S(&w->ev, "}\n\n");
    }
    return b;
}

static void w_event(void *ctx, rc_event_kind k, const char *t, size_t n) {
    messages_w *w = ctx;
    block *b = w->open ? &w->b[w->nb - 1] : NULL;
    const char *dt = NULL, *key = NULL;
    switch (k) {
    case RC_EV_REASONING:
        if (!b || b->kind != B_THINKING) b = open_block(w, B_THINKING, NULL, 0);
        if (n) w->reasoning_emitted = 1;
        dt = "thinking_delta", key = "\"thinking\":";
        break;
    case RC_EV_CONTENT:
        if (!b || b->kind != B_TEXT) b = open_block(w, B_TEXT, NULL, 0);
        dt = "text_delta", key = "\"text\":";
        break;
    case RC_EV_TOOL_CALL:
        open_block(w, B_TOOL, t, n);
        return;
    case RC_EV_TOOL_ARGS:
        if (!b || b->kind != B_TOOL) return;
        dt = "input_json_delta", key = "\"partial_json\":";
        break;
    }
    if (!b) return;
    rc_bytes_append(&b->text, t, n);
    if (!w->o.stream) return;
    delta_head(w, dt);
    S(&w->ev, key);
    jstr(&w->ev, t, n);
    S(&w->ev, "}}\n\n");
}

static void usage_json(const messages_w *w, long long out_tokens, rc_bytes *out) {
    char b[256];
    long long p = w->o.prompt_tokens, h = w->o.cached_tokens;
    snprintf(b, sizeof b,
             "{\"input_tokens\":%lld,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":%lld,"
             "\"output_tokens\":%lld,\"service_tier\":\"standard\"}",
             p > h ? p - h : 0, h, out_tokens);
    S(out, b);
}

static int w_start(void *p, rc_bytes *out) {
    messages_w *w = p;
    event_head(out, "message_start");
    S(out, ",\"message\":{\"id\":");
    jstr(out, w->id, strlen(w->id));
    S(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    jstr(out, w->model, strlen(w->model));
    S(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":");
    usage_json(w, 0, out);
    S(out, "}}\n\n");
    /* thinking mode opens its block at once (parsing starts in reasoning) */
    if (w->o.thinking) open_block(w, B_THINKING, NULL, 0);
    rc_bytes_append(out, w->ev.v ? w->ev.v : "", w->ev.n);
    w->ev.n = 0;
    return 0;
}

static int w_flush(void *p, rc_bytes *out) {
    messages_w *w = p;
    rc_bytes_append(out, w->ev.v ? w->ev.v : "", w->ev.n);
    w->ev.n = 0;
    return 0;
}

static const char *stop_reason(rc_finish f) {
    switch (f) {
    case RC_FINISH_LENGTH: return "max_tokens";
    case RC_FINISH_CONTENT_FILTER: return "refusal";
    case RC_FINISH_TOOL_CALLS: return "tool_use";
    case RC_FINISH_STOP_SEQUENCE: return "stop_sequence";
    default: return "end_turn";
    }
}

static void stop_fields(const messages_w *w, rc_finish r, rc_bytes *out) {
    S(out, "\"stop_reason\":\"");
    S(out, stop_reason(r));
    S(out, "\",\"stop_sequence\":");
    if (r == RC_FINISH_STOP_SEQUENCE && w->stop_seq) jstr(out, w->stop_seq, strlen(w->stop_seq));
    else S(out, "null");
}

static int w_finish(void *p, rc_finish r, const char *stop, const rc_out_usage *u, rc_bytes *out) {
    long long n = u->completion_tokens;
    set_stop_sequence(p, stop);
    messages_w *w = p;
    if (u->cached_tokens >= 0) w->o.cached_tokens = u->cached_tokens;
    if (w->o.stream) {
        close_block(w);
        w_flush(w, out);
        event_head(out, "message_delta");
        S(out, ",\"delta\":{");
        stop_fields(w, r, out);
        S(out, "},\"usage\":");
        usage_json(w, n, out);
        S(out, "}\n\n");
        event_head(out, "message_stop");
        S(out, "}\n\n");
        return 0;
    }
    S(out, "{\"id\":");
    jstr(out, w->id, strlen(w->id));
    S(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    jstr(out, w->model, strlen(w->model));
    S(out, ",\"content\":[");
    for (size_t i = 0; i < w->nb; i++) {
        const block *b = &w->b[i];
        if (i) S(out, ",");
        if (b->kind == B_THINKING) {
            S(out, "{\"type\":\"thinking\",\"thinking\":");
            jstr(out, b->text.v, b->text.n);
            S(out, ",\"signature\":");
            jstr(out, w->id, strlen(w->id));
        } else if (b->kind == B_TEXT) {
            S(out, "{\"type\":\"text\",\"text\":");
            jstr(out, b->text.v, b->text.n);
        } else {
            S(out, "{\"type\":\"tool_use\",\"id\":");
            jstr(out, b->id, strlen(b->id));
            S(out, ",\"name\":");
            jstr(out, b->name.v, b->name.n);
            S(out, ",\"input\":");
            tool_input(&b->text, out);
        }
        S(out, "}");
    }
    S(out, "],");
    stop_fields(w, r, out);
    S(out, ",\"usage\":");
    usage_json(w, n, out);
    S(out, "}");
    return 0;
}

const rc_out_api rc_out_messages = {"messages", w_create, w_destroy, w_event, w_start, w_flush, w_finish};
