/* chat_out.c - Chat Completions chunks and bodies (spec recipe.md §4.2).
 *
 * JSON is written by hand, compact, with serde_json's escaping (the same
 * set as Python's, lowercase \u00xx) and the reference's key order; jansson
 * would escape differently and reorder nothing we need reordered. */
#include "recipe/chat_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/pyjson.h"

typedef struct {
    rc_event_kind kind;
    size_t off, len; /* text in pend */
    int call;        /* tool call index */
} ev;

struct rc_chat_out {
    rc_chat_out_opts o;
    char *id, *model, *fp;
    /* events since the last flush (streaming) */
    ev *evs;
    size_t nev, cap;
    rc_bytes pend;
    /* whole message (non-streaming) */
    rc_bytes content, reasoning;
    int has_content, has_reasoning;
    rc_bytes *names, *args;
    char (*ids)[48];
    size_t ncalls;
    int reasoning_emitted; /* any reasoning text before a call decides its id */
    long long reasoning_tokens; /* < 0: unknown (text input), else reported in usage */
};

const char *rc_finish_name(rc_finish f) {
    switch (f) {
    case RC_FINISH_LENGTH: return "length";
    case RC_FINISH_CONTENT_FILTER: return "content_filter";
    case RC_FINISH_TOOL_CALLS: return "tool_calls";
    default: return "stop";
    }
}

rc_chat_out *rc_chat_out_new(const rc_chat_out_opts *o) {
    rc_chat_out *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->o = *o;
    c->id = strdup(o->id ? o->id : "");
    c->model = strdup(o->model ? o->model : "");
    c->fp = o->fingerprint ? strdup(o->fingerprint) : NULL;
    c->reasoning_tokens = -1;
    return c;
}

void rc_chat_out_free(rc_chat_out *c) {
    if (!c) return;
    free(c->id);
    free(c->model);
    free(c->fp);
    free(c->evs);
    rc_bytes_free(&c->pend);
    rc_bytes_free(&c->content);
    rc_bytes_free(&c->reasoning);
    for (size_t i = 0; i < c->ncalls; i++) {
        rc_bytes_free(&c->names[i]);
        rc_bytes_free(&c->args[i]);
    }
    free(c->names);
    free(c->args);
    free(c->ids);
    free(c);
}

void rc_chat_out_event(void *ctx, rc_event_kind kind, const char *text, size_t n) {
    rc_chat_out *c = ctx;
    if (kind == RC_EV_TOOL_CALL) {
        rc_bytes *nn = realloc(c->names, (c->ncalls + 1) * sizeof *nn);
        if (nn) c->names = nn;
        rc_bytes *na = nn ? realloc(c->args, (c->ncalls + 1) * sizeof *na) : NULL;
        if (na) c->args = na;
        char(*ni)[48] = na ? realloc(c->ids, (c->ncalls + 1) * sizeof *ni) : NULL;
        if (!ni) return;
        c->ids = ni;
        /* call_{k:02}_ + "ET_" when thinking produced no reasoning first + 24
         * random chars (20 alphanumerics, 4 digits), as the reference does */
        char suf[25];
        if (c->o.deterministic) {
            memcpy(suf, "TESTTESTTESTTESTTEST0000", 25);
        } else {
            static const char an[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
            for (int i = 0; i < 24; i++) suf[i] = i < 20 ? an[rand() % 62] : (char)('0' + rand() % 10);
            suf[24] = 0;
        }
        snprintf(c->ids[c->ncalls], 48, "call_%02zu_%s%s", c->ncalls,
                 c->o.thinking && !c->reasoning_emitted ? "ET_" : "", suf);
        memset(&c->names[c->ncalls], 0, sizeof(rc_bytes));
        memset(&c->args[c->ncalls], 0, sizeof(rc_bytes));
        rc_bytes_append(&c->names[c->ncalls], text, n);
        rc_bytes_append(&c->args[c->ncalls], "", 0);
        c->ncalls++;
    } else if (kind == RC_EV_TOOL_ARGS && c->ncalls) {
        rc_bytes_append(&c->args[c->ncalls - 1], text, n);
    } else if (kind == RC_EV_CONTENT) {
        c->has_content = 1;
        rc_bytes_append(&c->content, text, n);
    } else if (kind == RC_EV_REASONING) {
        c->has_reasoning = 1;
        if (n) c->reasoning_emitted = 1;
        rc_bytes_append(&c->reasoning, text, n);
    }
    if (!c->o.stream) return;
    if (c->nev == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        ev *v = realloc(c->evs, cap * sizeof *v);
        if (!v) return;
        c->evs = v;
        c->cap = cap;
    }
    c->evs[c->nev++] = (ev){kind, c->pend.n, n, (int)c->ncalls - 1};
    rc_bytes_append(&c->pend, text, n);
}

#define S(str) rc_bytes_append(out, (str), strlen(str))

static void jstr(rc_bytes *out, const char *s, size_t n) { rc_pyjson_string(s, n, out); }

static void usage_json(const rc_chat_out *c, long long completion, rc_bytes *out) {
    char b[480], rt[96] = "";
    /* reasoning tokens are known only from token-id input, and only in thinking mode */
    if (c->reasoning_tokens >= 0 && c->o.thinking)
        snprintf(rt, sizeof rt, "\"completion_tokens_details\":{\"reasoning_tokens\":%lld},", c->reasoning_tokens);
    snprintf(b, sizeof b,
             "{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
             "\"prompt_tokens_details\":{\"cached_tokens\":%lld},%s\"prompt_cache_hit_tokens\":%lld,"
             "\"prompt_cache_miss_tokens\":%lld}",
             c->o.prompt_tokens, completion, c->o.prompt_tokens + completion, c->o.cached_tokens, rt,
             c->o.cached_tokens,
             c->o.prompt_tokens > c->o.cached_tokens ? c->o.prompt_tokens - c->o.cached_tokens : 0);
    S(b);
}

static void chunk_head(const rc_chat_out *c, rc_bytes *out) {
    char b[64];
    S("data: {\"id\":");
    jstr(out, c->id, strlen(c->id));
    snprintf(b, sizeof b, ",\"object\":\"chat.completion.chunk\",\"created\":%lld,\"model\":", c->o.created);
    S(b);
    jstr(out, c->model, strlen(c->model));
    S(",\"system_fingerprint\":");
    if (c->fp) jstr(out, c->fp, strlen(c->fp));
    else S("null");
    S(",\"choices\":[{\"index\":0,\"delta\":");
}

static void chunk_tail(const rc_chat_out *c, const char *finish, long long completion, rc_bytes *out) {
    S(",\"logprobs\":null,\"finish_reason\":");
    if (finish) {
        S("\"");
        S(finish);
        S("\"");
    } else {
        S("null");
    }
    S("}]");
    if (finish) {
        S(",\"usage\":");
        usage_json(c, completion, out);
    } else if (c->o.include_usage) {
        S(",\"usage\":null");
    }
    S("}\n\n");
}

int rc_chat_out_start(rc_chat_out *c, rc_bytes *out) {
    chunk_head(c, out);
    S(c->o.content_continuation ? "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":null}"
      : c->o.thinking           ? "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"\"}"
                                : "{\"role\":\"assistant\",\"content\":\"\"}");
    chunk_tail(c, NULL, 0, out);
    return 0;
}

int rc_chat_out_flush(rc_chat_out *c, rc_bytes *out) {
    char b[96];
    for (size_t i = 0; i < c->nev; i++) {
        const ev *e = &c->evs[i];
        const char *t = c->pend.v + e->off;
        chunk_head(c, out);
        switch (e->kind) {
        case RC_EV_CONTENT:
            S("{\"content\":");
            jstr(out, t, e->len);
            if (c->o.thinking) S(",\"reasoning_content\":null");
            S("}");
            break;
        case RC_EV_REASONING:
            S("{\"content\":null,\"reasoning_content\":");
            jstr(out, t, e->len);
            S("}");
            break;
        case RC_EV_TOOL_CALL:
            snprintf(b, sizeof b, "{\"tool_calls\":[{\"index\":%d,\"id\":", e->call);
            S(b);
            jstr(out, c->ids[e->call], strlen(c->ids[e->call]));
            S(",\"type\":\"function\",\"function\":{\"name\":");
            jstr(out, t, e->len);
            S(",\"arguments\":\"\"}}]}");
            break;
        case RC_EV_TOOL_ARGS:
            snprintf(b, sizeof b, "{\"tool_calls\":[{\"index\":%d,\"function\":{\"arguments\":", e->call);
            S(b);
            jstr(out, t, e->len);
            S("}}]}");
            break;
        }
        chunk_tail(c, NULL, 0, out);
    }
    c->nev = 0;
    c->pend.n = 0;
    return 0;
}

int rc_chat_out_finish(rc_chat_out *c, rc_finish reason, long long completion, rc_bytes *out) {
    const char *fin = rc_finish_name(reason);
    if (c->o.stream) {
        rc_chat_out_flush(c, out);
        chunk_head(c, out);
        S(c->o.thinking ? "{\"content\":\"\",\"reasoning_content\":null}" : "{\"content\":\"\"}");
        chunk_tail(c, fin, completion, out);
        S("data: [DONE]\n\n");
        return 0;
    }
    char b[96];
    S("{\"id\":");
    jstr(out, c->id, strlen(c->id));
    snprintf(b, sizeof b, ",\"object\":\"chat.completion\",\"created\":%lld,\"model\":", c->o.created);
    S(b);
    jstr(out, c->model, strlen(c->model));
    S(",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    jstr(out, c->content.v ? c->content.v : "", c->content.n);
    if (c->o.reasoning_start) {
        S(",\"reasoning_content\":");
        jstr(out, c->reasoning.v ? c->reasoning.v : "", c->reasoning.n);
    }
    if (c->ncalls) {
        S(",\"tool_calls\":[");
        for (size_t i = 0; i < c->ncalls; i++) {
            if (i) S(",");
            snprintf(b, sizeof b, "{\"index\":%zu,\"id\":", i);
            S(b);
            jstr(out, c->ids[i], strlen(c->ids[i]));
            S(",\"type\":\"function\",\"function\":{\"name\":");
            jstr(out, c->names[i].v ? c->names[i].v : "", c->names[i].n);
            S(",\"arguments\":");
            jstr(out, c->args[i].v ? c->args[i].v : "", c->args[i].n);
            S("}}");
        }
        S("]");
    }
    S("},\"logprobs\":null,\"finish_reason\":\"");
    S(fin);
    S("\"}],\"usage\":");
    usage_json(c, completion, out);
    S(",\"system_fingerprint\":");
    if (c->fp) jstr(out, c->fp, strlen(c->fp));
    else S("null");
    S("}");
    return 0;
}

/* ------------------------------------------------------------ interface */

#include "recipe/out.h"

static void *chat_create(const rc_out_opts *o, const json_t *request) {
    (void)request;
    return rc_chat_out_new(o);
}
static void chat_destroy(void *w) { rc_chat_out_free(w); }
static int chat_start(void *w, rc_bytes *out) { return rc_chat_out_start(w, out); }
static int chat_flush(void *w, rc_bytes *out) { return rc_chat_out_flush(w, out); }
static int chat_finish(void *w, rc_finish r, const char *stop, const rc_out_usage *u, rc_bytes *out) {
    (void)stop; /* Chat reports only finish_reason "stop" */
    ((rc_chat_out *)w)->reasoning_tokens = u->reasoning_tokens;
    if (u->cached_tokens >= 0) ((rc_chat_out *)w)->o.cached_tokens = u->cached_tokens;
    return rc_chat_out_finish(w, r, u->completion_tokens, out);
}

const rc_out_api rc_out_chat = {"chat", chat_create, chat_destroy, rc_chat_out_event, chat_start, chat_flush,
                                chat_finish};
