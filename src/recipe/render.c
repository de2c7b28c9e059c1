/* render.c - Conversation -> DeepSeek V4 / V4.1 prompt (spec recipe.md §2).
 *
 * Owns: normalisation (system merging, consecutive users, tool-result order),
 * the tool prompt, historical DSML tool calls, effort text, and recording
 * which byte spans are control tokens.  Does not own: request parsing or
 * validation (chat.c and friends), tokenization (rc_prompt_tokens below only
 * maps spans to ids).
 *
 * Every control token goes through tok() so that its span is recorded; every
 * other byte goes through txt().  That split is the injection boundary. */
#include <stdlib.h>
#include <string.h>

#include "recipe/conv.h"
#include "recipe/pyjson.h"

#define S_BOS "<｜begin▁of▁sentence｜>"
#define S_EOS "<｜end▁of▁sentence｜>"
#define S_USER "<｜User｜>"
#define S_ASSISTANT "<｜Assistant｜>"
#define S_SYSTEM "<｜System｜>"
#define S_REMINDER "<｜latest_reminder｜>"
#define S_THINK "<think>"
#define S_THINK_END "</think>"
#define S_DSML "｜DSML｜"

static const char EFFORT_HIGH[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

static const char EFFORT_MAX[] =
    "Reasoning Effort: Beyond maximum \xe2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

static const char SCHEMA_HEAD[] =
    "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
static const char JSON_SUFFIX_V41[] = "{\"type\": \"json_object\"}"; /* after SCHEMA_HEAD */
static const char JSON_SUFFIX_V4[] =
    "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object "
    "ONLY.";

/* ------------------------------------------------------------ strings */

int rc_str_set(rc_str *d, const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return RC_ENOMEM;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    free(d->s);
    d->s = p;
    d->n = n;
    return 0;
}

int rc_str_append(rc_str *d, const char *s, size_t n) {
    char *p = realloc(d->s, d->n + n + 1);
    if (!p) return RC_ENOMEM;
    if (n) memcpy(p + d->n, s, n);
    d->n += n;
    p[d->n] = 0;
    d->s = p;
    return 0;
}

static void msg_free(rc_message *m) {
    free(m->content.s);
    free(m->reasoning.s);
    for (size_t k = 0; k < m->ncalls; k++) {
        free(m->calls[k].id.s);
        free(m->calls[k].name.s);
        free(m->calls[k].arguments.s);
    }
    free(m->calls);
    free(m->tool_call_id.s);
}

void rc_conv_free(rc_conversation *c) {
    for (size_t i = 0; i < c->nmsgs; i++) msg_free(&c->msgs[i]);
    free(c->msgs);
    for (size_t i = 0; i < c->ntools; i++) {
        free(c->tools[i].name.s);
        free(c->tools[i].description.s);
        json_decref(c->tools[i].parameters);
    }
    free(c->tools);
    json_decref(c->json_schema);
    memset(c, 0, sizeof *c);
}

rc_message *rc_conv_push(rc_conversation *c, rc_role role, const char *content, size_t n) {
    if (c->nmsgs == c->capmsgs) {
        size_t cap = c->capmsgs ? c->capmsgs * 2 : 8;
        rc_message *m = realloc(c->msgs, cap * sizeof *m);
        if (!m) return NULL;
        c->msgs = m;
        c->capmsgs = cap;
    }
    rc_message *m = &c->msgs[c->nmsgs];
    memset(m, 0, sizeof *m);
    m->role = role;
    if (rc_str_set(&m->content, content ? content : "", content ? n : 0)) return NULL;
    c->nmsgs++;
    return m;
}

/* deep copy of a message (normalisation works on copies) */
static int msg_copy(rc_message *d, const rc_message *s) {
    memset(d, 0, sizeof *d);
    d->role = s->role;
    d->has_reasoning = s->has_reasoning;
    d->prefix = s->prefix;
    if (rc_str_set(&d->content, s->content.s ? s->content.s : "", s->content.n) ||
        rc_str_set(&d->reasoning, s->reasoning.s ? s->reasoning.s : "", s->reasoning.n) ||
        rc_str_set(&d->tool_call_id, s->tool_call_id.s ? s->tool_call_id.s : "", s->tool_call_id.n))
        return RC_ENOMEM;
    if (s->ncalls) {
        d->calls = calloc(s->ncalls, sizeof *d->calls);
        if (!d->calls) return RC_ENOMEM;
        d->ncalls = s->ncalls;
        for (size_t k = 0; k < s->ncalls; k++)
            if (rc_str_set(&d->calls[k].id, s->calls[k].id.s ? s->calls[k].id.s : "", s->calls[k].id.n) ||
                rc_str_set(&d->calls[k].name, s->calls[k].name.s ? s->calls[k].name.s : "", s->calls[k].name.n) ||
                rc_str_set(&d->calls[k].arguments, s->calls[k].arguments.s ? s->calls[k].arguments.s : "",
                           s->calls[k].arguments.n))
                return RC_ENOMEM;
    }
    return 0;
}

void rc_prompt_free(rc_prompt *p) {
    rc_bytes_free(&p->text);
    free(p->special);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ writing */

typedef struct {
    rc_prompt *p;
    rc_encoding enc;
    rc_float_style fs; /* how pyjson writes floats for this encoding */
    int rc;
} wr;

static void txt(wr *w, const char *s, size_t n) {
    if (!w->rc && rc_bytes_append(&w->p->text, s, n)) w->rc = RC_ENOMEM;
}
static void txts(wr *w, const char *s) { txt(w, s, strlen(s)); }

static void tok(wr *w, const char *s) {
    if (w->rc) return;
    rc_prompt *p = w->p;
    if (p->nspecial == p->capspecial) {
        size_t cap = p->capspecial ? p->capspecial * 2 : 16;
        rc_prompt_span *v = realloc(p->special, cap * sizeof *v);
        if (!v) {
            w->rc = RC_ENOMEM;
            return;
        }
        p->special = v;
        p->capspecial = cap;
    }
    p->special[p->nspecial++] = (rc_prompt_span){p->text.n, strlen(s)};
    txts(w, s);
}

/* DSML tag names (spec §1.3) */
static const char *dsml_block(rc_encoding e) { return e == RC_ENC_V41 ? " calls" : "tool_calls"; }
static const char *dsml_call(rc_encoding e) { return e == RC_ENC_V41 ? " invoke" : "invoke"; }
static const char *dsml_param(rc_encoding e) { return e == RC_ENC_V41 ? " parameter" : "parameter"; }

/* "<｜DSML｜name" or "</｜DSML｜name": '<' and the name are text, ｜DSML｜ a token */
static void dsml_open(wr *w, int closing, const char *name) {
    txts(w, closing ? "</" : "<");
    tok(w, S_DSML);
    txts(w, name);
}

static void tools_prompt(wr *w, const rc_conversation *c) {
    const char *B = dsml_block(w->enc), *C = dsml_call(w->enc), *P = dsml_param(w->enc);
    txts(w, "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
            "invoke tools by writing a \"");
    dsml_open(w, 0, B);
    txts(w, ">\" block like the following:\n\n");
    dsml_open(w, 0, B);
    txts(w, ">\n");
    for (int k = 0; k < 2; k++) {
        dsml_open(w, 0, C);
        txts(w, k ? " name=\"$TOOL_NAME2\">\n...\n" : " name=\"$TOOL_NAME\">\n");
        if (!k) {
            dsml_open(w, 0, P);
            txts(w, " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE");
            dsml_open(w, 1, P);
            txts(w, ">\n...\n");
        }
        dsml_open(w, 1, C);
        txts(w, ">\n");
    }
    dsml_open(w, 1, B);
    txts(w, ">\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types "
            "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
            "If thinking_mode is enabled (triggered by ");
    tok(w, S_THINK);
    txts(w, "), you MUST output your complete reasoning inside ");
    tok(w, S_THINK);
    txts(w, "...");
    tok(w, S_THINK_END);
    txts(w, " BEFORE any tool calls or final response.\n\nOtherwise, output directly after ");
    tok(w, S_THINK_END);
    txts(w, " with tool calls or final response.\n\n### Available Tool Schemas\n\n");
    for (size_t i = 0; i < c->ntools; i++) {
        const rc_tool_def *t = &c->tools[i];
        if (i) txts(w, "\n");
        txts(w, "{\"name\": ");
        if (!w->rc) w->rc = rc_pyjson_string(t->name.s, t->name.n, &w->p->text);
        txts(w, ", \"description\": ");
        if (!w->rc) w->rc = rc_pyjson_string(t->has_description ? t->description.s : "",
                                             t->has_description ? t->description.n : 0, &w->p->text);
        txts(w, ", \"parameters\": ");
        if (t->parameters) {
            if (!w->rc) w->rc = rc_pyjson_style(t->parameters, w->fs, &w->p->text);
        } else {
            txts(w, "{}");
        }
        txts(w, "}");
    }
    txts(w, "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
            "calls.\n");
}

static void tool_calls_block(wr *w, const rc_message *m) {
    const char *B = dsml_block(w->enc), *C = dsml_call(w->enc), *P = dsml_param(w->enc);
    dsml_open(w, 0, B);
    txts(w, ">\n");
    for (size_t k = 0; k < m->ncalls; k++) {
        const rc_tool_call *tc = &m->calls[k];
        if (k) txts(w, "\n");
        dsml_open(w, 0, C);
        txts(w, " name=\"");
        txt(w, tc->name.s, tc->name.n);
        txts(w, "\">\n");
        json_error_t je;
        /* U+0000 in a value is a character like any other (the reference renders
         * it; without JSON_ALLOW_NUL the whole call fell back to "arguments").
         * Still unlike the reference: a key holding U+0000 (jansson cannot), and
         * a string that spells rc_json_loadb's u64 marker ("\u0000U64:" + digits) */
        json_t *args = rc_json_loadb(tc->arguments.s, tc->arguments.n, JSON_ALLOW_NUL, &je);
        if (!json_is_object(args)) {
            /* not a JSON object: one parameter named "arguments" with the raw text */
            json_decref(args);
            args = json_pack("{s:s%}", "arguments", tc->arguments.s, tc->arguments.n);
        }
        const char *key;
        json_t *v;
        int first = 1;
        json_object_foreach(args, key, v) {
            if (!first) txts(w, "\n");
            first = 0;
            dsml_open(w, 0, P);
            txts(w, " name=\"");
            txts(w, key);
            int is_str = json_is_string(v) && !rc_json_is_u64(v);
            txts(w, is_str ? "\" string=\"true\">" : "\" string=\"false\">");
            if (is_str) txt(w, json_string_value(v), json_string_length(v));
            else if (!w->rc) w->rc = rc_pyjson_style(v, w->fs, &w->p->text);
            dsml_open(w, 1, P);
            txts(w, ">");
        }
        /* V4 writes no blank line for a call without arguments, V4.1 does */
        if (!first || w->enc == RC_ENC_V41) txts(w, "\n");
        json_decref(args);
        dsml_open(w, 1, C);
        txts(w, ">");
    }
    txts(w, "\n");
    dsml_open(w, 1, B);
    txts(w, ">");
}

/* ------------------------------------------------------- normalisation */

static int str_cmp(const rc_str *a, const rc_str *b) {
    size_t n = a->n < b->n ? a->n : b->n;
    int c = n ? memcmp(a->s, b->s, n) : 0;
    return c ? c : (a->n > b->n) - (a->n < b->n);
}

/* index of the call with this id in assistant a, 0 if none */
static size_t call_pos(const rc_message *a, const rc_str *id) {
    for (size_t q = 0; q < a->ncalls; q++)
        if (!str_cmp(&a->calls[q].id, id)) return q;
    return 0;
}

static int is_user_like(const rc_message *m) { return m->role == RC_ROLE_USER || m->role == RC_ROLE_TOOL; }


/* Normalisation as deepseek-recipe 0.2.0 does it (docs/RECIPE.md):
 *  - V4 has no system token: every non-empty system message, wherever it
 *    is, is merged ("\n\n") into one leading system message;
 *  - V4.1 keeps system messages in place (empty ones too);
 *  - consecutive user messages merge with "\n\n" (V4 skips empty ones,
 *    V4.1 joins them too);
 *  - V4 sorts an assistant's tool calls and their results by call id. */
static int normalize(const rc_conversation *c, rc_encoding enc, rc_message **outv, size_t *outn) {
    rc_message *v = calloc(c->nmsgs + 2, sizeof *v);
    if (!v) return RC_ENOMEM;
    size_t n = 0;
    int rc = 0;
    if (enc == RC_ENC_V4) {
        for (size_t i = 0; i < c->nmsgs && !rc; i++) {
            const rc_message *m = &c->msgs[i];
            if (m->role != RC_ROLE_SYSTEM || !m->content.n) continue;
            if (!n) {
                rc = msg_copy(&v[0], m);
                n = 1;
            } else {
                rc = rc_str_append(&v[0].content, "\n\n", 2);
                if (!rc) rc = rc_str_append(&v[0].content, m->content.s, m->content.n);
            }
        }
    }
    for (size_t i = 0; i < c->nmsgs && !rc; i++) {
        const rc_message *m = &c->msgs[i];
        rc_message *last = n ? &v[n - 1] : NULL;
        if (m->role == RC_ROLE_SYSTEM) {
            /* V4.1 keeps even an empty system message (Chat drops those at
             * conversion; Responses and Messages do not) */
            if (enc == RC_ENC_V4) continue;
        } else if (m->role == RC_ROLE_USER && last && last->role == RC_ROLE_USER) {
            if (enc == RC_ENC_V4) {
                if (!m->content.n) continue;
                if (last->content.n) rc = rc_str_append(&last->content, "\n\n", 2);
            } else {
                rc = rc_str_append(&last->content, "\n\n", 2);
            }
            if (!rc) rc = rc_str_append(&last->content, m->content.s, m->content.n);
            continue;
        }
        if (!(rc = msg_copy(&v[n], m))) n++;
    }
    /* V4 keys tool calls by id, so an assistant's calls come out sorted by id
     * (bytewise, stable); V4.1 keeps the request's order.  In both, the tool
     * results that follow are put in the order of the calls they answer
     * (unknown ids first, as position 0). */
    for (size_t i = 0; i < n; i++) {
        rc_message *a = &v[i];
        if (a->role != RC_ROLE_ASSISTANT || a->ncalls < 1) continue;
        for (size_t k = 1; enc == RC_ENC_V4 && k < a->ncalls; k++) {
            rc_tool_call tc = a->calls[k];
            size_t q = k;
            while (q > 0 && str_cmp(&a->calls[q - 1].id, &tc.id) > 0) {
                a->calls[q] = a->calls[q - 1];
                q--;
            }
            a->calls[q] = tc;
        }
        size_t b = i + 1, e = b;
        while (e < n && v[e].role == RC_ROLE_TOOL) e++;
        for (size_t k = b + 1; k < e; k++) {
            rc_message m = v[k];
            size_t pm = call_pos(a, &m.tool_call_id), q = k;
            while (q > b && call_pos(a, &v[q - 1].tool_call_id) > pm) {
                v[q] = v[q - 1];
                q--;
            }
            v[q] = m;
        }
    }
    if (rc) {
        for (size_t k = 0; k < n; k++) msg_free(&v[k]);
        free(v);
        return rc;
    }
    *outv = v;
    *outn = n;
    return 0;
}

/* ----------------------------------------------------------- rendering */

int rc_render(const rc_conversation *c, rc_encoding enc, rc_prompt *out, rc_err *err) {
    memset(out, 0, sizeof *out);
    rc_message *msgs;
    size_t n;
    int rc = normalize(c, enc, &msgs, &n);
    if (rc) return rc_errf(err, rc, "out of memory");
    wr w = {.p = out, .enc = enc};
    int prefixed = 0;
    int tools_on = c->tool_choice != RC_CHOICE_NONE && c->ntools > 0;

    /* the tool prompt and JSON suffix go at the end of a (possibly new) first
     * system message; we render them in place instead of editing content */
    int json_on = c->json_mode || c->json_schema;
    int sys0_inserted = (tools_on || json_on) && (n == 0 || msgs[0].role != RC_ROLE_SYSTEM);
    /* historical reasoning is kept only in thinking mode with tools present */
    int keep_reasoning = c->thinking && tools_on;
    w.fs = enc == RC_ENC_V4 ? RC_FLOAT_V4 : RC_FLOAT_PY;
    tok(&w, S_BOS);
    size_t total = n + (size_t)sys0_inserted;
    for (size_t idx = 0; idx < total && !w.rc; idx++) {
        const rc_message *m = sys0_inserted ? (idx ? &msgs[idx - 1] : NULL) : &msgs[idx];
        const rc_message *prev = idx == 0 ? NULL : (sys0_inserted ? (idx >= 2 ? &msgs[idx - 2] : NULL) : &msgs[idx - 1]);
        int is_system = !m || m->role == RC_ROLE_SYSTEM;
        /* effort text: index 0 and thinking only */
        const char *effort = "";
        char eb[160];
        if (idx == 0 && c->thinking) {
            if (enc == RC_ENC_V41) {
                int nv = c->effort == RC_EFFORT_LOW ? 50 : c->effort == RC_EFFORT_MAX ? 100 : 75;
                snprintf(eb, sizeof eb,
                         "Reasoning Effort: %d (range 1-100, the higher the value, the more thorough the "
                         "reasoning)\n\n",
                         nv);
                effort = eb;
            } else {
                effort = c->effort == RC_EFFORT_LOW ? "" : c->effort == RC_EFFORT_MAX ? EFFORT_MAX : EFFORT_HIGH;
            }
        }
        if (idx == 0 && (*effort || is_system) && enc == RC_ENC_V41) tok(&w, S_SYSTEM);
        txts(&w, effort);
        if (is_system) {
            if (idx > 0) tok(&w, S_SYSTEM);
            if (m) txt(&w, m->content.s, m->content.n);
            if (idx == 0) {
                if (tools_on) {
                    txts(&w, "\n\n");
                    tools_prompt(&w, c);
                }
                if (c->json_schema) {
                    txts(&w, SCHEMA_HEAD);
                    if (!w.rc) w.rc = rc_pyjson_style(c->json_schema, w.fs, &w.p->text);
                } else if (c->json_mode) {
                    if (enc == RC_ENC_V4) txts(&w, JSON_SUFFIX_V4);
                    else {
                        txts(&w, SCHEMA_HEAD);
                        txts(&w, JSON_SUFFIX_V41);
                    }
                }
            }
            continue;
        }
        switch (m->role) {
        case RC_ROLE_USER:
        case RC_ROLE_TOOL:
            if (prev && is_user_like(prev)) txts(&w, "\n\n");
            else tok(&w, S_USER);
            if (m->role == RC_ROLE_TOOL) txts(&w, "<tool_result>");
            txt(&w, m->content.s, m->content.n);
            if (m->role == RC_ROLE_TOOL) txts(&w, "</tool_result>");
            break;
        case RC_ROLE_REMINDER:
            tok(&w, S_REMINDER);
            txt(&w, m->content.s, m->content.n);
            break;
        case RC_ROLE_ASSISTANT:
            tok(&w, S_ASSISTANT);
            if (m->prefix) { /* prefill: the model continues this message */
                if (c->thinking) { /* the model continues its reasoning, or its answer */
                    tok(&w, S_THINK);
                    txt(&w, m->reasoning.s, m->reasoning.n);
                    if (m->content.n) {
                        tok(&w, S_THINK_END);
                        txt(&w, m->content.s, m->content.n);
                    }
                } else {
                    tok(&w, S_THINK_END);
                    txt(&w, m->content.s, m->content.n);
                }
                prefixed = 1;
                break;
            }
            if (keep_reasoning) {
                tok(&w, S_THINK);
                txt(&w, m->reasoning.s, m->reasoning.n);
                tok(&w, S_THINK_END);
            } else {
                tok(&w, S_THINK_END);
            }
            txt(&w, m->content.s, m->content.n);
            if (m->ncalls) {
                txts(&w, "\n\n");
                tool_calls_block(&w, m);
            }
            tok(&w, S_EOS);
            break;
        default:
            break;
        }
    }
    if (!prefixed) {
        tok(&w, S_ASSISTANT);
        tok(&w, c->thinking ? S_THINK : S_THINK_END);
    }
    if (!prefixed && c->tool_choice == RC_CHOICE_REQUIRED && c->ntools > 0) {
        txts(&w, "\n\n");
        dsml_open(&w, 0, dsml_block(enc));
        txts(&w, ">\n");
    }
    for (size_t k = 0; k < n; k++) msg_free(&msgs[k]);
    free(msgs);
    if (w.rc) {
        rc_prompt_free(out);
        return rc_errf(err, w.rc, "out of memory");
    }
    return 0;
}

/* Tokens of a rendered prompt.  Text between control spans is independent
 * (content mode), so the spans are the unit of parallelism: long ones are
 * encoded in segments on the pool one after another, short ones are handed
 * out to the pool's threads as tasks; the results are joined in order. */
typedef struct {
    const rc_prompt *p;
    const rc_tokenizer *tok;
    size_t *off, *len;
    rc_ids *ids;
    int *rc;
} span_job;

static void span_task(void *vp, size_t k) {
    span_job *j = vp;
    j->rc[k] = rc_tokenizer_encode(j->tok, j->p->text.v + j->off[k], j->len[k], RC_ENCODE_CONTENT, &j->ids[k], NULL);
}

enum { SPAN_BIG = 32 * 1024 };

int rc_prompt_tokens(const rc_prompt *p, const rc_tokenizer *tok_, rc_pool *pool, rc_ids *out, rc_err *err) {
    size_t n = p->nspecial + 1;
    size_t *off = calloc(n, sizeof *off), *len = calloc(n, sizeof *len);
    rc_ids *ids = calloc(n, sizeof *ids);
    int *rcs = calloc(n, sizeof *rcs);
    int32_t *sid = calloc(n, sizeof *sid);
    int rc = (!off || !len || !ids || !rcs || !sid) ? rc_errf(err, RC_ENOMEM, "out of memory") : 0;
    /* text span k precedes control span k; span n-1 is the tail */
    size_t at = 0;
    char name[64];
    for (size_t k = 0; !rc && k < n; k++) {
        size_t end = k < p->nspecial ? p->special[k].off : p->text.n;
        off[k] = at;
        len[k] = end - at;
        if (k == p->nspecial) break;
        size_t l = p->special[k].len;
        if (l >= sizeof name) {
            rc = rc_errf(err, RC_EINVAL, "control token too long");
            break;
        }
        memcpy(name, p->text.v + p->special[k].off, l);
        name[l] = 0;
        sid[k] = rc_tokenizer_added_id(tok_, name);
        if (sid[k] < 0) rc = rc_errf(err, RC_EINVAL, "tokenizer has no control token %s", name);
        at = p->special[k].off + l;
    }
    /* short spans: one task each; the UTF-8 check is done per span */
    size_t *small = rc ? NULL : calloc(n, sizeof *small), ns = 0;
    for (size_t k = 0; !rc && k < n; k++)
        if (len[k] && len[k] < SPAN_BIG) small[ns++] = k;
    if (!rc && ns) {
        size_t *so = calloc(ns, sizeof *so), *sl = calloc(ns, sizeof *sl);
        rc_ids *si = calloc(ns, sizeof *si);
        int *sr = calloc(ns, sizeof *sr);
        if (so && sl && si && sr) {
            for (size_t q = 0; q < ns; q++) {
                so[q] = off[small[q]];
                sl[q] = len[small[q]];
            }
            span_job j = {p, tok_, so, sl, si, sr};
            rc_pool_run(pool, ns, span_task, &j);
            for (size_t q = 0; q < ns; q++) {
                ids[small[q]] = si[q];
                if (sr[q]) rc = rc_errf(err, sr[q], "prompt text could not be tokenized");
            }
        } else {
            rc = rc_errf(err, RC_ENOMEM, "out of memory");
        }
        free(so);
        free(sl);
        free(si);
        free(sr);
    }
    free(small);
    for (size_t k = 0; !rc && k < n; k++)
        if (len[k] >= SPAN_BIG)
            rc = rc_tokenizer_encode_parallel(tok_, pool, p->text.v + off[k], len[k], RC_ENCODE_CONTENT, &ids[k], err);
    for (size_t k = 0; !rc && k < n; k++) {
        if (rc_ids_append(out, ids[k].v, ids[k].n)) rc = rc_errf(err, RC_ENOMEM, "out of memory");
        if (!rc && k < p->nspecial && rc_ids_push(out, sid[k])) rc = rc_errf(err, RC_ENOMEM, "out of memory");
    }
    for (size_t k = 0; ids && k < n; k++) rc_ids_free(&ids[k]);
    free(off);
    free(len);
    free(ids);
    free(rcs);
    free(sid);
    return rc;
}
