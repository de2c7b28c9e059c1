/* responses_out.c - stream events -> OpenAI Responses output (SSE events or one body).
 *
 * Mirrors deepseek-recipe 0.2.0's Responses generator (docs/STREAM-RESPONSES.md):
 * every event is `event: TYPE\ndata: JSON\n\n` with a sequence_number from 0;
 * response.created / response.in_progress, then per output item (reasoning,
 * message, function_call, custom_tool_call) added / deltas / done, and
 * response.completed or response.incomplete carrying the whole response.
 * The non-stream body is that final response object.  The response object
 * echoes request settings (instructions, sampling, reasoning, text, tools ...)
 * which are rendered once from the request body at create time.
 *
 * JSON is written by hand in the reference's key order with serde_json's
 * escaping (rc_pyjson_string) and serde's float layout (ryu, f32 for
 * temperature / top_p). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/out.h"
#include "recipe/pyjson.h"

enum { IT_REASONING, IT_MESSAGE, IT_FUNCTION, IT_CUSTOM };
/* custom tool input decoding: waiting for `{"input": "`, inside the string, after it, raw JSON */
enum { CU_PREFIX, CU_STRING, CU_AFTER, CU_RAW };

typedef struct {
    int type;
    int status_incomplete;
    int commentary;
    rc_bytes text;     /* reasoning / content / arguments / custom input */
    char *name, *ns;   /* calls */
    char call_id[48];
    int cu;            /* custom decoder state */
    rc_bytes cubuf;    /* custom: buffered prefix, then a pending escape */
} item;

typedef struct {
    rc_out_opts o;
    char id[64];
    char *model;
    rc_bytes echo_a; /* "instructions" .. "moderation":null, */
    rc_bytes echo_b; /* "parallel_tool_calls" .. "truncation":"disabled", */
    rc_bytes echo_user;
    char **nsmap;    /* flattened name, namespace, local name triples */
    size_t nns;
    char **custom;
    size_t ncustom;
    item *items;
    size_t nitems;
    int open;        /* an item is open (the last one) */
    long long seq;
    int reasoning_emitted;
    rc_bytes ev;     /* events since the last flush */
} rw;

#define S(b, str) rc_bytes_append((b), (str), strlen(str))

static void jstr(rc_bytes *b, const char *s, size_t n) { rc_pyjson_string(s ? s : "", n, b); }
static void jcstr(rc_bytes *b, const char *s) {
    if (s) jstr(b, s, strlen(s));
    else S(b, "null");
}
static void jint(rc_bytes *b, long long v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    S(b, t);
}

/* serde_json / ryu float layout from the shortest round-trip digits */
static void jfloat(rc_bytes *b, double x, int f32) {
    char t[64], d[32];
    if (x == 0) {
        S(b, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    if (x < 0) {
        S(b, "-");
        x = -x;
    }
    if (f32) x = (double)(float)x;
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (f32 ? strtof(t, NULL) == (float)x : strtod(t, NULL) == x) break;
    }
    int n = 0;
    char *e = strchr(t, 'e');
    for (char *c = t; c < e; c++)
        if (*c != '.') d[n++] = *c;
    while (n > 1 && d[n - 1] == '0') n--;
    d[n] = 0;
    int kk = atoi(e + 1) + 1; /* decimal point position */
    int lim = 16;
    if (kk - n >= 0 && kk <= lim) {
        rc_bytes_append(b, d, (size_t)n);
        for (int i = n; i < kk; i++) S(b, "0");
        S(b, ".0");
    } else if (kk > 0 && kk <= lim) {
        rc_bytes_append(b, d, (size_t)kk);
        S(b, ".");
        rc_bytes_append(b, d + kk, (size_t)(n - kk));
    } else if (kk > -5 && kk <= 0) {
        S(b, "0.");
        for (int i = 0; i < -kk; i++) S(b, "0");
        rc_bytes_append(b, d, (size_t)n);
    } else {
        rc_bytes_append(b, d, 1);
        if (n > 1) {
            S(b, ".");
            rc_bytes_append(b, d + 1, (size_t)(n - 1));
        }
        snprintf(t, sizeof t, "e%s%d", kk - 1 > 0 ? "+" : "", kk - 1);
        S(b, t);
    }
}

/* compact serde_json of a request value (objects keep their order) */
static void jvalue(rc_bytes *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        S(b, "{");
        json_object_foreach((json_t *)v, k, x) {
            if (!first) S(b, ",");
            first = 0;
            jstr(b, k, strlen(k));
            S(b, ":");
            jvalue(b, x);
        }
        S(b, "}");
        break;
    }
    case JSON_ARRAY:
        S(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) S(b, ",");
            jvalue(b, json_array_get(v, i));
        }
        S(b, "]");
        break;
    case JSON_STRING: jstr(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: jint(b, json_integer_value(v)); break;
    case JSON_REAL: jfloat(b, json_real_value(v), 0); break;
    case JSON_TRUE: S(b, "true"); break;
    case JSON_FALSE: S(b, "false"); break;
    default: S(b, "null"); break;
    }
}

static void jopt(rc_bytes *b, const json_t *v) {
    if (v) jvalue(b, v);
    else S(b, "null");
}

static void echo_fn(rc_bytes *b, const json_t *t) {
    S(b, "{\"type\":\"function\",\"name\":");
    jopt(b, json_object_get(t, "name"));
    S(b, ",\"description\":");
    jopt(b, json_object_get(t, "description"));
    S(b, ",\"parameters\":");
    jopt(b, json_object_get(t, "parameters"));
    S(b, ",\"strict\":");
    jopt(b, json_object_get(t, "strict"));
    S(b, "}");
}

static char *xstrdup(const char *s) { return strdup(s ? s : ""); }

static int name_used(rw *w, const json_t *tools, const char *nm) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *n = json_string_value(json_object_get(t, "name"));
        if (ty && n && (!strcmp(ty, "function") || !strcmp(ty, "custom")) && !strcmp(n, nm)) return 1;
    }
    for (size_t k = 0; k < w->nns; k++)
        if (!strcmp(w->nsmap[3 * k], nm)) return 1;
    return 0;
}

static void add_ns(rw *w, const char *flat, const char *ns, const char *fn) {
    char **m = realloc(w->nsmap, (w->nns + 1) * 3 * sizeof *m);
    if (!m) return;
    w->nsmap = m;
    m[3 * w->nns] = xstrdup(flat);
    m[3 * w->nns + 1] = xstrdup(ns);
    m[3 * w->nns + 2] = xstrdup(fn);
    w->nns++;
}

static void build_echo(rw *w, const json_t *req) {
    rc_bytes *a = &w->echo_a, *b = &w->echo_b;
    json_t *v;
    S(a, "\"instructions\":");
    jopt(a, json_object_get(req, "instructions"));
    S(a, ",\"max_output_tokens\":");
    jopt(a, json_object_get(req, "max_output_tokens"));
    S(a, ",\"max_tool_calls\":null,\"model\":");
    jcstr(a, w->model);
    S(a, ",\"moderation\":null,");

    S(b, "\"parallel_tool_calls\":true,\"presence_penalty\":0.0,\"previous_response_id\":null,"
         "\"prompt_cache_key\":null,\"prompt_cache_retention\":null,\"reasoning\":{\"effort\":");
    json_t *r = json_object_get(req, "reasoning");
    jopt(b, json_object_get(r, "effort"));
    S(b, ",\"summary\":");
    jopt(b, json_object_get(r, "summary"));
    S(b, "},\"safety_identifier\":null,\"service_tier\":\"default\",\"store\":false,\"temperature\":");
    v = json_object_get(req, "temperature");
    jfloat(b, v && json_is_number(v) ? json_number_value(v) : 1.0, 1);
    S(b, ",\"text\":{\"format\":");
    json_t *text = json_object_get(req, "text");
    json_t *fmt = json_object_get(text, "format");
    if (fmt && !json_is_null(fmt)) jvalue(b, fmt);
    else S(b, "{\"type\":\"text\"}");
    S(b, ",\"verbosity\":");
    jopt(b, json_object_get(text, "verbosity"));
    S(b, "},\"tool_choice\":");
    v = json_object_get(req, "tool_choice");
    if (json_is_object(v)) {
        S(b, "{\"type\":");
        jopt(b, json_object_get(v, "type"));
        S(b, ",\"name\":");
        jopt(b, json_object_get(v, "name"));
        S(b, "}");
    } else if (v && !json_is_null(v)) {
        jvalue(b, v);
    } else {
        S(b, "\"auto\"");
    }
    S(b, ",\"tools\":[");
    json_t *tools = json_object_get(req, "tools");
    const char *sep = w->model && !strcmp(w->model, "DeepSeek-V4.1-Flash") ? "::" : "__";
    size_t i;
    json_t *t;
    int first = 1;
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *nm = json_string_value(json_object_get(t, "name"));
        if (!ty) continue;
        if (!strcmp(ty, "function")) {
            if (!first) S(b, ",");
            echo_fn(b, t);
        } else if (!strcmp(ty, "custom")) {
            if (!first) S(b, ",");
            S(b, "{\"type\":\"custom\",\"name\":");
            jcstr(b, nm);
            S(b, "}");
            char **c = realloc(w->custom, (w->ncustom + 1) * sizeof *c);
            if (c) {
                w->custom = c;
                c[w->ncustom++] = xstrdup(nm);
            }
        } else if (!strcmp(ty, "namespace")) {
            if (!first) S(b, ",");
            S(b, "{\"type\":\"namespace\",\"name\":");
            jcstr(b, nm);
            S(b, ",\"description\":");
            jopt(b, json_object_get(t, "description"));
            S(b, ",\"tools\":[");
            size_t j;
            json_t *x;
            json_array_foreach(json_object_get(t, "tools"), j, x) {
                if (j) S(b, ",");
                echo_fn(b, x);
                const char *fn = json_string_value(json_object_get(x, "name"));
                if (!fn) continue;
                char base[600], flat[640];
                snprintf(base, sizeof base, "%s%s%s", nm ? nm : "", sep, fn);
                snprintf(flat, sizeof flat, "%s", base);
                for (int sfx = 1; name_used(w, tools, flat); sfx++) snprintf(flat, sizeof flat, "%s_%d", base, sfx);
                add_ns(w, flat, nm, fn);
            }
            S(b, "]}");
        } else {
            continue;
        }
        first = 0;
    }
    S(b, "],\"top_logprobs\":");
    v = json_object_get(req, "top_logprobs");
    jint(b, json_is_integer(v) ? json_integer_value(v) : 0);
    S(b, ",\"top_p\":");
    v = json_object_get(req, "top_p");
    jfloat(b, v && json_is_number(v) ? json_number_value(v) : 1.0, 1);
    S(b, ",\"truncation\":\"disabled\",");
    S(&w->echo_user, ",\"user\":");
    jopt(&w->echo_user, json_object_get(req, "user"));
    S(&w->echo_user, ",\"metadata\":{}}");
}

static void *w_create(const rc_out_opts *o, const json_t *request) {
    rw *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->o = *o;
    if (o->deterministic) {
        snprintf(w->id, sizeof w->id, "resp_test");
    } else {
        static const char hx[] = "0123456789abcdef";
        memcpy(w->id, "resp_", 5);
        for (int i = 0; i < 32; i++) w->id[5 + i] = hx[rand() % 16];
        w->id[37] = 0;
    }
    w->model = xstrdup(o->model);
    build_echo(w, request);
    return w;
}

static void item_free(item *it) {
    rc_bytes_free(&it->text);
    rc_bytes_free(&it->cubuf);
    free(it->name);
    free(it->ns);
}

static void w_destroy(void *p) {
    rw *w = p;
    if (!w) return;
    for (size_t i = 0; i < w->nitems; i++) item_free(&w->items[i]);
    free(w->items);
    for (size_t i = 0; i < 3 * w->nns; i++) free(w->nsmap[i]);
    free(w->nsmap);
    for (size_t i = 0; i < w->ncustom; i++) free(w->custom[i]);
    free(w->custom);
    free(w->model);
    rc_bytes_free(&w->echo_a);
    rc_bytes_free(&w->echo_b);
    rc_bytes_free(&w->echo_user);
    rc_bytes_free(&w->ev);
    free(w);
}

/* ------------------------------------------------------------ JSON pieces */

static const char *const PREFIX[] = {"rs_", "msg_", "fc_", "ctc_"};

static void item_id(rw *w, size_t i, rc_bytes *b) {
    char t[128];
    snprintf(t, sizeof t, "\"%s%s_%zu\"", PREFIX[w->items[i].type], w->id, i);
    S(b, t);
}

static const char *status(const item *it, int done) {
    return !done ? "in_progress" : it->status_incomplete ? "incomplete" : "completed";
}

static void part(rc_bytes *b, const item *it, const char *text, size_t n) {
    S(b, it->type == IT_REASONING ? "{\"type\":\"reasoning_text\",\"text\":"
                                  : "{\"type\":\"output_text\",\"annotations\":[],\"logprobs\":[],\"text\":");
    jstr(b, text, n);
    S(b, "}");
}

static void item_json(rw *w, size_t i, int done, rc_bytes *b) {
    item *it = &w->items[i];
    char t[160];
    static const char *const TY[] = {"reasoning", "message", "function_call", "custom_tool_call"};
    S(b, "{\"type\":\"");
    S(b, TY[it->type]);
    S(b, "\",\"id\":");
    item_id(w, i, b);
    S(b, ",\"status\":\"");
    S(b, status(it, done));
    S(b, "\"");
    const char *txt = it->text.v ? it->text.v : "";
    switch (it->type) {
    case IT_REASONING:
        S(b, ",\"content\":[");
        if (done) part(b, it, txt, it->text.n);
        snprintf(t, sizeof t, "],\"summary\":[],\"encrypted_content\":\"%s-%zu\"}", w->id, i);
        S(b, t);
        break;
    case IT_MESSAGE:
        S(b, ",\"role\":\"assistant\",\"phase\":");
        S(b, done && it->commentary ? "\"commentary\"" : "\"final_answer\"");
        S(b, ",\"content\":[");
        if (done) part(b, it, txt, it->text.n);
        S(b, "]}");
        break;
    default:
        S(b, ",\"call_id\":");
        jcstr(b, it->call_id);
        S(b, ",\"name\":");
        jcstr(b, it->name);
        if (it->ns) {
            S(b, ",\"namespace\":");
            jcstr(b, it->ns);
        }
        S(b, it->type == IT_FUNCTION ? ",\"arguments\":" : ",\"input\":");
        if (done) jstr(b, txt, it->text.n);
        else S(b, "\"\"");
        S(b, "}");
    }
}

static void ev_head(rw *w, const char *type) {
    S(&w->ev, "event: ");
    S(&w->ev, type);
    S(&w->ev, "\ndata: {\"type\":\"");
    S(&w->ev, type);
    S(&w->ev, "\"");
}

static void ev_tail(rw *w) {
    S(&w->ev, ",\"sequence_number\":");
    jint(&w->ev, w->seq++);
    S(&w->ev, "}\n\n");
}

/* ,"item_id":ID,"output_index":i */
static void ev_loc(rw *w, size_t i, int logprobs) {
    S(&w->ev, ",\"item_id\":");
    item_id(w, i, &w->ev);
    if (logprobs) S(&w->ev, ",\"logprobs\":[]");
    S(&w->ev, ",\"output_index\":");
    jint(&w->ev, (long long)i);
}

static void ev_item(rw *w, const char *type, size_t i, int done) {
    ev_head(w, type);
    S(&w->ev, ",\"item\":");
    item_json(w, i, done, &w->ev);
    S(&w->ev, ",\"output_index\":");
    jint(&w->ev, (long long)i);
    ev_tail(w);
}

static void ev_part(rw *w, const char *type, size_t i, int done) {
    item *it = &w->items[i];
    ev_head(w, type);
    S(&w->ev, ",\"content_index\":0");
    ev_loc(w, i, 0);
    S(&w->ev, ",\"part\":");
    if (done) part(&w->ev, it, it->text.v ? it->text.v : "", it->text.n);
    else part(&w->ev, it, "", 0);
    ev_tail(w);
}

static void ev_delta(rw *w, size_t i, const char *d, size_t n) {
    item *it = &w->items[i];
    static const char *const TY[] = {"response.reasoning_text.delta", "response.output_text.delta",
                                     "response.function_call_arguments.delta", "response.custom_tool_call_input.delta"};
    ev_head(w, TY[it->type]);
    if (it->type <= IT_MESSAGE) S(&w->ev, ",\"content_index\":0");
    S(&w->ev, ",\"delta\":");
    jstr(&w->ev, d, n);
    ev_loc(w, i, it->type == IT_MESSAGE);
    ev_tail(w);
    rc_bytes_append(&it->text, d, n);
}

static void response_json(rw *w, rc_bytes *b, const char *st, const char *incomplete, int final,
                          long long completion) {
    char t[160];
    S(b, "{\"id\":");
    jcstr(b, w->id);
    snprintf(t, sizeof t, ",\"object\":\"response\",\"created_at\":%lld,\"status\":\"%s\",\"background\":false,",
             w->o.created, st);
    S(b, t);
    if (final) snprintf(t, sizeof t, "\"completed_at\":%lld,", w->o.created);
    else snprintf(t, sizeof t, "\"completed_at\":null,");
    S(b, t);
    S(b, "\"content_filters\":null,\"error\":null,\"frequency_penalty\":0.0,\"incomplete_details\":");
    if (incomplete) {
        S(b, "{\"reason\":\"");
        S(b, incomplete);
        S(b, "\"}");
    } else {
        S(b, "null");
    }
    S(b, ",");
    rc_bytes_append(b, w->echo_a.v, w->echo_a.n);
    S(b, "\"output\":[");
    if (final)
        for (size_t i = 0; i < w->nitems; i++) {
            if (i) S(b, ",");
            item_json(w, i, 1, b);
        }
    S(b, "],");
    rc_bytes_append(b, w->echo_b.v, w->echo_b.n);
    S(b, "\"usage\":");
    if (final) {
        long long p = w->o.prompt_tokens;
        snprintf(t, sizeof t,
                 "{\"input_tokens\":%lld,\"input_tokens_details\":{\"cached_tokens\":%lld},\"output_tokens\":%lld,",
                 p, w->o.cached_tokens, completion);
        S(b, t);
        snprintf(t, sizeof t, "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":%lld}", p + completion);
        S(b, t);
    } else {
        S(b, "null");
    }
    rc_bytes_append(b, w->echo_user.v, w->echo_user.n);
}

/* ------------------------------------------------------------ items */

/* Custom tool input (apply_patch): the argument JSON `{"input": "..."}` is
 * decoded as it streams, the way the reference does it (docs/STREAM-RESPONSES.md):
 *  - CU_PREFIX: bytes are held while they are a prefix of `{"input":` followed
 *    by JSON whitespace and the opening quote; any other byte turns the item
 *    raw: what was held plus the rest of that fragment is one delta, later
 *    fragments are copied as they come;
 *  - CU_STRING: JSON string escapes are decoded, also when a fragment ends in
 *    the middle of one (string="false" values arrive raw, split anywhere);
 *    a \uXXXX pair makes one character.  An escape that cannot be completed
 *    is written out raw, including the byte that broke it, and decoding goes
 *    on (`\x` -> `\x`; a lone surrogate `\ud83d"` -> `\ud83d"`, the quote
 *    does not close the string); a pending escape is flushed raw at close;
 *  - CU_AFTER: the closing quote was seen; the rest is dropped.
 * One delta per fragment (none when it decodes to nothing).  cubuf holds the
 * prefix in CU_PREFIX and the pending escape in CU_STRING. */
static const char CU_HEAD[] = "{\"input\":";

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static unsigned hex4(const char *s) {
    return (unsigned)(hexv(s[0]) << 12 | hexv(s[1]) << 8 | hexv(s[2]) << 4 | hexv(s[3]));
}

static void utf8_put(rc_bytes *d, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    rc_bytes_append(d, u, n);
}

/* one byte of the input string; e is the pending escape (starts with '\') */
static int cu_string_byte(rc_bytes *e, rc_bytes *d, char c) {
    if (!e->n) {
        if (c == '"') return 1; /* closed */
        if (c == '\\') rc_bytes_append(e, &c, 1);
        else rc_bytes_append(d, &c, 1);
        return 0;
    }
    size_t l = e->n;
    int ok;
    if (l == 1) {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *f = c ? strchr(from, c) : NULL;
        if (f) {
            rc_bytes_append(d, &to[f - from], 1);
            e->n = 0;
            return 0;
        }
        ok = c == 'u';
    } else if (l < 6 || (l >= 8 && l < 12)) {
        ok = hexv(c) >= 0; /* the four digits of \uXXXX */
    } else {
        ok = c == (l == 6 ? '\\' : 'u'); /* after a high surrogate: its \u pair */
    }
    rc_bytes_append(e, &c, 1);
    const char *q = e->v;
    l = e->n;
    if (!ok) { /* unfinishable: out raw, the breaking byte included */
        rc_bytes_append(d, q, l);
        e->n = 0;
        return 0;
    }
    if (l == 6) {
        unsigned cp = hex4(q + 2);
        if (cp >= 0xD800 && cp < 0xDC00) return 0; /* high surrogate: wait for the low one */
        if (cp >= 0xDC00 && cp < 0xE000) rc_bytes_append(d, q, l); /* lone low surrogate: raw */
        else utf8_put(d, cp);
        e->n = 0;
    } else if (l == 12) {
        unsigned hi = hex4(q + 2), lo = hex4(q + 8);
        if (lo >= 0xDC00 && lo < 0xE000) utf8_put(d, 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
        else rc_bytes_append(d, q, l);
        e->n = 0;
    }
    return 0;
}

static void custom_args(rw *w, size_t i, const char *s, size_t n) {
    item *it = &w->items[i];
    if (it->cu == CU_RAW) {
        if (n) ev_delta(w, i, s, n); /* the reference drops empty raw fragments */
        return;
    }
    if (it->cu == CU_AFTER) return;
    size_t k = 0;
    if (it->cu == CU_PREFIX) {
        const size_t hl = sizeof CU_HEAD - 1;
        for (; k < n; k++) {
            char c = s[k];
            size_t bl = it->cubuf.n;
            int ok = bl < hl ? c == CU_HEAD[bl] : c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"';
            if (!ok) {
                it->cu = CU_RAW;
                rc_bytes_append(&it->cubuf, s + k, n - k);
                ev_delta(w, i, it->cubuf.v, it->cubuf.n);
                it->cubuf.n = 0;
                return;
            }
            if (bl >= hl && c == '"') {
                it->cu = CU_STRING;
                it->cubuf.n = 0;
                k++;
                break;
            }
            rc_bytes_append(&it->cubuf, &c, 1);
        }
        if (it->cu == CU_PREFIX) return;
    }
    rc_bytes d = {0};
    rc_bytes_append(&d, "", 0);
    for (; k < n; k++)
        if (cu_string_byte(&it->cubuf, &d, s[k])) {
            it->cu = CU_AFTER;
            it->cubuf.n = 0;
            break;
        }
    if (d.n) ev_delta(w, i, d.v, d.n);
    rc_bytes_free(&d);
}

static void close_item(rw *w, int incomplete) {
    if (!w->open) return;
    w->open = 0;
    size_t i = w->nitems - 1;
    item *it = &w->items[i];
    it->status_incomplete = incomplete;
    const char *txt = it->text.v ? it->text.v : "";
    if (it->type <= IT_MESSAGE) {
        ev_head(w, it->type == IT_REASONING ? "response.reasoning_text.done" : "response.output_text.done");
        S(&w->ev, ",\"content_index\":0");
        ev_loc(w, i, it->type == IT_MESSAGE);
        S(&w->ev, ",\"sequence_number\":");
        jint(&w->ev, w->seq++);
        S(&w->ev, ",\"text\":");
        jstr(&w->ev, txt, it->text.n);
        S(&w->ev, "}\n\n");
        ev_part(w, "response.content_part.done", i, 1);
    } else {
        /* a still-pending prefix, or an escape cut off by the end: out raw */
        if (it->type == IT_CUSTOM && (it->cu == CU_PREFIX || it->cu == CU_STRING) && it->cubuf.n)
            ev_delta(w, i, it->cubuf.v, it->cubuf.n);
        txt = it->text.v ? it->text.v : "";
        ev_head(w, it->type == IT_FUNCTION ? "response.function_call_arguments.done"
                                           : "response.custom_tool_call_input.done");
        S(&w->ev, it->type == IT_FUNCTION ? ",\"arguments\":" : ",\"input\":");
        jstr(&w->ev, txt, it->text.n);
        ev_loc(w, i, 0);
        ev_tail(w);
    }
    ev_item(w, "response.output_item.done", i, 1);
}

static item *open_item(rw *w, int type) {
    item *n = realloc(w->items, (w->nitems + 1) * sizeof *n);
    if (!n) return NULL;
    w->items = n;
    item *it = &n[w->nitems++];
    memset(it, 0, sizeof *it);
    it->type = type;
    rc_bytes_append(&it->text, "", 0);
    w->open = 1;
    return it;
}

static void w_event(void *ctx, rc_event_kind k, const char *t, size_t n) {
    rw *w = ctx;
    item *cur = w->open ? &w->items[w->nitems - 1] : NULL;
    if (k == RC_EV_REASONING || k == RC_EV_CONTENT) {
        int type = k == RC_EV_REASONING ? IT_REASONING : IT_MESSAGE;
        if (k == RC_EV_REASONING && n) w->reasoning_emitted = 1;
        if (!cur || cur->type != type) {
            close_item(w, 0);
            if (!open_item(w, type)) return;
            ev_item(w, "response.output_item.added", w->nitems - 1, 0);
            ev_part(w, "response.content_part.added", w->nitems - 1, 0);
        }
        ev_delta(w, w->nitems - 1, t, n);
        return;
    }
    if (k == RC_EV_TOOL_CALL) {
        if (cur && cur->type == IT_MESSAGE) cur->commentary = 1;
        close_item(w, 0);
        size_t ncalls = 0;
        for (size_t i = 0; i < w->nitems; i++) ncalls += w->items[i].type >= IT_FUNCTION;
        char *name = malloc(n + 1);
        if (!name) return;
        memcpy(name, t, n);
        name[n] = 0;
        int custom = 0;
        for (size_t i = 0; i < w->ncustom; i++) custom |= !strcmp(w->custom[i], name);
        item *it = open_item(w, custom ? IT_CUSTOM : IT_FUNCTION);
        if (!it) {
            free(name);
            return;
        }
        it->name = name;
        for (size_t i = 0; !custom && i < w->nns; i++)
            if (!strcmp(w->nsmap[3 * i], name)) {
                it->ns = xstrdup(w->nsmap[3 * i + 1]);
                free(it->name);
                it->name = xstrdup(w->nsmap[3 * i + 2]);
                break;
            }
        char suf[25];
        if (w->o.deterministic) {
            memcpy(suf, "TESTTESTTESTTESTTEST0000", 25);
        } else {
            static const char an[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
            for (int i = 0; i < 24; i++) suf[i] = i < 20 ? an[rand() % 62] : (char)('0' + rand() % 10);
            suf[24] = 0;
        }
        snprintf(it->call_id, sizeof it->call_id, "call_%02zu_%s%s", ncalls,
                 w->o.thinking && !w->reasoning_emitted ? "ET_" : "", suf);
        ev_item(w, "response.output_item.added", w->nitems - 1, 0);
        return;
    }
    if (k == RC_EV_TOOL_ARGS && cur && cur->type >= IT_FUNCTION) {
        if (cur->type == IT_CUSTOM) custom_args(w, w->nitems - 1, t, n);
        else ev_delta(w, w->nitems - 1, t, n);
    }
}

static int w_start(void *p, rc_bytes *out) {
    rw *w = p;
    static const char *const T[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        ev_head(w, T[i]);
        S(&w->ev, ",\"response\":");
        response_json(w, &w->ev, "in_progress", NULL, 0, 0);
        ev_tail(w);
    }
    if (w->o.stream) rc_bytes_append(out, w->ev.v, w->ev.n);
    w->ev.n = 0;
    return 0;
}

static int w_flush(void *p, rc_bytes *out) {
    rw *w = p;
    if (w->o.stream && w->ev.n) rc_bytes_append(out, w->ev.v, w->ev.n);
    w->ev.n = 0;
    return 0;
}

static int w_finish(void *p, rc_finish r, const char *stop, const rc_out_usage *u, rc_bytes *out) {
    long long n = u->completion_tokens;
    (void)stop; /* Responses has no stop sequences */
    rw *w = p;
    if (u->cached_tokens >= 0) w->o.cached_tokens = u->cached_tokens;
    const char *inc = r == RC_FINISH_LENGTH ? "max_output_tokens" : r == RC_FINISH_CONTENT_FILTER ? "content_filter" : NULL;
    if (!w->o.stream) w->seq = 2; /* start() is not called without --stream */
    close_item(w, inc != NULL);
    if (!w->o.stream) {
        w->ev.n = 0;
        response_json(w, out, inc ? "incomplete" : "completed", inc, 1, n);
        return 0;
    }
    ev_head(w, inc ? "response.incomplete" : "response.completed");
    S(&w->ev, ",\"response\":");
    response_json(w, &w->ev, inc ? "incomplete" : "completed", inc, 1, n);
    ev_tail(w);
    return w_flush(w, out);
}

const rc_out_api rc_out_responses = {"responses", w_create, w_destroy, w_event, w_start, w_flush, w_finish};
