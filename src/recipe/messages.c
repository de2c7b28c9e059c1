/* messages.c - Anthropic Messages request -> conversation (docs/RECIPE-RM.md).
 *
 * Owns: the Messages deserialisation checks (serde wording, keys in input
 * order), the semantic validation of deepseek-recipe 0.2.0 (tool_use /
 * tool_result pairing with its exact messages) and the conversion into an
 * rc_conversation.  Errors use the OpenAI-style body like every API here.
 * Does not own rendering (render.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol_internal.h"
#include "recipe/pyjson.h"

#define OOM(e) rc_pfail(e, "out of memory")

/* DeepSeek-V4.1-Flash keeps role "system" messages as system messages;
 * DeepSeek-V4-Pro turns them into <system-reminder> user messages */
static _Thread_local int g_flash; /* set per call, read only on the converting thread */



/* ------------------------------------------------------------------ serde pass */

static const char *const BLOCK_TYPES = "`text`, `image`, `document`, `thinking`, `server_tool_use`, `tool_use`, "
                                       "`tool_result`, `web_search_tool_result`, `tool_addition`";

static int need_str(const json_t *o, const char *const *f, size_t n, rc_api_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v) for (size_t q = 0; q < n; q++) if (!strcmp(k, f[q]) && !json_is_string(v))
        return rc_pbad_type(e, v, "a string");
    for (size_t q = 0; q < n; q++)
        if (!json_object_get(o, f[q])) return rc_pmissing(e, f[q]);
    return 0;
}

static int deser_text_list(const json_t *c, rc_api_error *e) {
    if (!json_is_string(c) && !json_is_array(c)) return rc_pfail(e, "invalid request body: expected a string or a list");
    return 0;
}

static int deser_block(const json_t *b, int nested, rc_api_error *e) {
    if (!json_is_object(b)) return rc_pbad_type(e, b, "internally tagged enum MessagesContentBlock");
    json_t *ty = json_object_get(b, "type");
    if (!ty) return rc_pmissing(e, "type");
    if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
    const char *t = json_string_value(ty);
    static const char *const TX[] = {"text"}, *const TH[] = {"thinking"}, *const TU[] = {"id", "name"},
                             *const TR[] = {"tool_use_id"};
    if (!strcmp(t, "text")) return need_str(b, TX, 1, e);
    if (!strcmp(t, "thinking")) return need_str(b, TH, 1, e);
    if (!strcmp(t, "tool_use")) {
        if (need_str(b, TU, 2, e)) return -1;
        if (!json_object_get(b, "input")) return rc_pmissing(e, "input");
        return 0;
    }
    if (!strcmp(t, "tool_result")) {
        if (need_str(b, TR, 1, e)) return -1;
        json_t *c = json_object_get(b, "content");
        if (!c || json_is_null(c)) return 0;
        if (deser_text_list(c, e)) return -1;
        size_t i;
        json_t *x;
        if (json_is_array(c)) json_array_foreach(c, i, x) if (deser_block(x, 1, e)) return -1;
        return 0;
    }
    if (!strcmp(t, "image") || !strcmp(t, "document")) {
        json_t *s = json_object_get(b, "source");
        if (!s) return rc_pmissing(e, "source");
        if (!json_object_get(s, "type")) return rc_pmissing(e, "type");
        return 0;
    }
    if (!strcmp(t, "server_tool_use") || !strcmp(t, "web_search_tool_result") || !strcmp(t, "tool_addition") ||
        (nested && !strcmp(t, "tool_reference")))
        return 0;
    return rc_punknown_variant(e, t, BLOCK_TYPES);
}

static int deser_message(const json_t *m, rc_api_error *e) {
    if (!json_is_object(m)) return rc_pbad_type(e, m, "adjacently tagged enum MessagesMessage");
    json_t *role = json_object_get(m, "role");
    if (!role) return rc_pmissing(e, "role");
    if (!json_is_string(role)) return rc_pbad_type(e, role, "string or map");
    const char *r = json_string_value(role);
    if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system"))
        return rc_punknown_variant(e, r, "`user`, `assistant`, `system`");
    json_t *c = json_object_get(m, "content");
    if (!c) return rc_pmissing(e, "content");
    if (deser_text_list(c, e)) return -1;
    size_t i;
    json_t *b;
    if (json_is_array(c)) json_array_foreach(c, i, b) if (deser_block(b, 0, e)) return -1;
    return 0;
}

static int deser_body(const json_t *body, rc_api_error *e) {
    if (json_is_array(body)) {
        json_t *first = json_array_get(body, 0), *second = json_array_get(body, 1);
        if (first && !json_is_string(first)) return rc_pbad_type(e, first, "a string");
        if (second && !json_is_array(second)) return rc_pbad_type(e, second, "a sequence");
        return rc_pfail(e, "invalid request body: invalid length %zu, expected struct MessagesRequest with 13 elements",
                        json_array_size(body));
    }
    if (!json_is_object(body)) return rc_pbad_type(e, body, "struct MessagesRequest");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (!strcmp(key, "model")) {
            if (!json_is_string(v)) return rc_pbad_type(e, v, "a string");
        } else if (!strcmp(key, "messages")) {
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *m;
            json_array_foreach(v, i, m) if (deser_message(m, e)) return -1;
        } else if (!strcmp(key, "system")) {
            if (json_is_null(v) || json_is_string(v)) continue;
            if (!json_is_array(v)) return rc_pfail(e, "invalid request body: expected a string or a list");
            size_t i;
            json_t *b;
            json_array_foreach(v, i, b) {
                if (!json_is_object(b)) return rc_pbad_type(e, b, "internally tagged enum MessagesSystemBlock");
                json_t *ty = json_object_get(b, "type");
                if (!ty) return rc_pmissing(e, "type");
                if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
                if (strcmp(json_string_value(ty), "text"))
                    return rc_pfail(e, "invalid request body: unknown variant `%s`, expected `text`", json_string_value(ty));
                static const char *const TX[] = {"text"};
                if (need_str(b, TX, 1, e)) return -1;
            }
        } else if (!strcmp(key, "max_tokens")) {
            if (rc_pcheck_uint(e, v, 32)) return -1;
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p")) {
            if (!json_is_null(v) && !json_is_number(v)) return rc_pbad_type(e, v, "f32");
        } else if (!strcmp(key, "stop_sequences")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) if (!json_is_string(x)) return rc_pbad_type(e, x, "a string");
        } else if (!strcmp(key, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) return rc_pbad_type(e, v, "a boolean");
        } else if (!strcmp(key, "thinking")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "struct MessagesThinking");
            json_t *ty = json_object_get(v, "type");
            if (!ty) return rc_pmissing(e, "type");
            if (!json_is_string(ty)) return rc_pbad_type(e, ty, "string or map");
            const char *t = json_string_value(ty);
            if (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "disabled"))
                return rc_punknown_variant(e, t, "`adaptive`, `enabled`, `disabled`");
        } else if (!strcmp(key, "output_config")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "struct MessagesOutputConfig");
            json_t *ef = json_object_get(v, "effort");
            if (!ef || json_is_null(ef)) continue;
            if (rc_pcheck_effort(ef, e)) return -1;
        } else if (!strcmp(key, "tools")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *t;
            json_array_foreach(v, i, t) {
                json_t *nm = json_object_get(t, "name"), *d = json_object_get(t, "description");
                if (!nm) return rc_pmissing(e, "name");
                if (!json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
                if (d && !json_is_null(d) && !json_is_string(d)) {
                    char u[300];
                    rc_punexp(d, u, sizeof u);
                    return rc_pfail(e, "invalid request body: field `description`: invalid type: %s, expected a string", u);
                }
            }
        } else if (!strcmp(key, "tool_choice")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "internally tagged enum MessagesToolChoice");
            json_t *ty = json_object_get(v, "type");
            if (!ty) return rc_pmissing(e, "type");
            if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
            const char *t = json_string_value(ty);
            if (!strcmp(t, "tool")) {
                json_t *nm = json_object_get(v, "name");
                if (!nm) return rc_pmissing(e, "name");
                if (!json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
            } else if (strcmp(t, "auto") && strcmp(t, "any") && strcmp(t, "none")) {
                return rc_punknown_variant(e, t, "`auto`, `any`, `tool`, `none`");
            }
        }
    }
    if (!json_object_get(body, "model")) return rc_pmissing(e, "model");
    if (!json_object_get(body, "messages")) return rc_pmissing(e, "messages");
    return 0;
}

/* ------------------------------------------------------------------ semantics */

static const char *btype(const json_t *b) { return json_string_value(json_object_get(b, "type")); }

static int text_blocks(const json_t *c, rc_str *out) {
    if (rc_str_set(out, "", 0)) return -1;
    if (json_is_string(c)) return rc_str_set(out, json_string_value(c), json_string_length(c));
    size_t i, n = 0;
    json_t *b;
    json_array_foreach(c, i, b) {
        json_t *t = json_object_get(b, "text");
        if (!json_is_string(t)) continue;
        if ((n++ && rc_str_append(out, "\n\n", 2)) || rc_str_append(out, json_string_value(t), json_string_length(t)))
            return -1;
    }
    return 0;
}

static int missing_results(rc_api_error *e, const char *where, int space, const rc_message *a, const json_t *next) {
    char ids[700] = "";
    size_t off = 0;
    for (size_t k = 0; k < a->ncalls; k++) {
        int found = 0;
        size_t j;
        json_t *b;
        if (json_is_array(next)) json_array_foreach(next, j, b) {
            if (strcmp(btype(b), "tool_result")) break;
            found |= !strcmp(json_string_value(json_object_get(b, "tool_use_id")), a->calls[k].id.s);
        }
        if (!found && off < sizeof ids - 1)
            off += snprintf(ids + off, sizeof ids - off, "%s%s", off ? ", " : "", a->calls[k].id.s);
    }
    return rc_pfail(e, "%s:%s`tool_use` ids were found without `tool_result` blocks immediately after: %s. "
                    "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    where, space ? " " : "", ids);
}

static int convert_user(rc_conversation *c, const json_t *m, size_t i, const rc_message *prev, rc_api_error *e) {
    json_t *ct = json_object_get(m, "content");
    /* prev points into c->msgs, which rc_conv_push may move: keep its index */
    size_t prev_at = prev ? (size_t)(prev - c->msgs) : 0;
    if (prev && prev->ncalls && (json_is_string(ct) || strcmp(btype(json_array_get(ct, 0)), "tool_result"))) {
        char w[48];
        snprintf(w, sizeof w, "messages.%zu", i);
        return missing_results(e, w, 1, prev, NULL);
    }
    if (json_is_string(ct)) return rc_conv_push(c, RC_ROLE_USER, json_string_value(ct), json_string_length(ct)) ? 0 : OOM(e);
    size_t k;
    json_t *b;
    int lead = 1;
    size_t nres = 0;
    json_array_foreach(ct, k, b) {
        const char *t = btype(b);
        if (!strcmp(t, "thinking")) return rc_pfail(e, "messages.%zu.content: thinking blocks may only be in `assistant` messages", i);
        if (!strcmp(t, "tool_use")) return rc_pfail(e, "messages.%zu: `tool_use` blocks can only be in `assistant` messages", i);
    }
    json_array_foreach(ct, k, b) {
        const char *t = btype(b);
        if (!strcmp(t, "tool_result")) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            int known = 0;
            for (size_t q = 0; lead && prev && q < prev->ncalls; q++) known |= !strcmp(prev->calls[q].id.s, id);
            if (!known)
                return rc_pfail(e, "unexpected `messages.%zu.content.%zu: tool_use_id` found in `tool_result` blocks: %s. "
                                "Each `tool_result` block must have a corresponding `tool_use` block in the previous "
                                "message.", i, k, id);
            for (size_t q = 0; q < k; q++)
                if (!strcmp(json_string_value(json_object_get(json_array_get(ct, q), "tool_use_id")), id))
                    return rc_pfail(e, "messages.%zu.content.%zu: each tool_use must have a single result. Found "
                                    "multiple `tool_result` blocks with id: %s", i, k, id);
            rc_str txt = {0};
            json_t *rc_ = json_object_get(b, "content");
            if (rc_ && !json_is_null(rc_) ? text_blocks(rc_, &txt) : rc_str_set(&txt, "", 0)) return OOM(e);
            rc_message *tm = rc_conv_push(c, RC_ROLE_TOOL, txt.s, txt.n);
            free(txt.s);
            if (prev) prev = &c->msgs[prev_at];
            if (!tm || rc_str_set(&tm->tool_call_id, id, strlen(id))) return OOM(e);
            nres++;
            continue;
        }
        lead = 0;
    }
    if (prev && prev->ncalls && nres < prev->ncalls) {
        char w[48];
        snprintf(w, sizeof w, "messages.%zu", nres ? i - 1 : i);
        return missing_results(e, w, !nres, prev, ct);
    }
    json_array_foreach(ct, k, b) {
        const char *t = btype(b);
        const char *s = NULL;
        size_t n = 0;
        if (!strcmp(t, "text")) {
            json_t *tx = json_object_get(b, "text");
            s = json_string_value(tx);
            n = json_string_length(tx);
        } else if (!strcmp(t, "image")) {
            s = "[Unsupported Image]";
        } else if (!strcmp(t, "document")) {
            s = "[Unsupported document type: unknown]";
        }
        if (s && !n) n = strlen(s);
        if (s && !rc_conv_push(c, RC_ROLE_USER, s, n)) return OOM(e);
    }
    return 0;
}

static int convert_assistant(rc_conversation *c, const json_t *m, size_t i, rc_api_error *e) {
    json_t *ct = json_object_get(m, "content");
    rc_message *a = rc_conv_push(c, RC_ROLE_ASSISTANT, "", 0);
    if (!a) return OOM(e);
    if (json_is_string(ct)) return rc_str_set(&a->content, json_string_value(ct), json_string_length(ct)) ? OOM(e) : 0;
    size_t k, ntext = 0, nth = 0;
    json_t *b;
    a->calls = calloc(json_array_size(ct) + 1, sizeof *a->calls);
    if (!a->calls) return OOM(e);
    json_array_foreach(ct, k, b) {
        const char *t = btype(b);
        if (!strcmp(t, "tool_result"))
            return rc_pfail(e, "messages.%zu: `tool_result` blocks can only be in `user` messages", i);
    }
    json_array_foreach(ct, k, b) {
        const char *t = btype(b);
        if (a->ncalls && strcmp(t, "tool_use")) {
            char w[64];
            snprintf(w, sizeof w, "messages.%zu.%zu", i, k);
            return missing_results(e, w, 1, a, NULL);
        }
        if (!strcmp(t, "text")) {
            json_t *tx = json_object_get(b, "text");
            (void)ntext; /* a separator only after non-empty content */
            if ((a->content.n && rc_str_append(&a->content, "\n\n", 2)) ||
                rc_str_append(&a->content, json_string_value(tx), json_string_length(tx)))
                return OOM(e);
        } else if (!strcmp(t, "thinking")) {
            json_t *tx = json_object_get(b, "thinking");
            a->has_reasoning = 1;
            if ((nth++ && rc_str_append(&a->reasoning, "\n\n", 2)) ||
                rc_str_append(&a->reasoning, json_string_value(tx), json_string_length(tx)))
                return OOM(e);
        } else if (!strcmp(t, "tool_use")) {
            const char *id = json_string_value(json_object_get(b, "id"));
            for (size_t q = 0; q < a->ncalls; q++)
                if (!strcmp(a->calls[q].id.s, id))
                    return rc_pfail(e, "messages.%zu.content.%zu: `tool_use` ids must be unique", i, k);
            rc_tool_call *tc = &a->calls[a->ncalls++];
            const char *nm = json_string_value(json_object_get(b, "name"));
            rc_bytes args = {0};
            /* the reference writes the input with V4-style floats whatever the
             * model; an object is re-read (and re-written per encoding) later,
             * anything else stays this text */
            int rc = rc_pyjson_style(json_object_get(b, "input"), RC_FLOAT_V4, &args);
            if (rc || rc_str_set(&tc->id, id, strlen(id)) || rc_str_set(&tc->name, nm, strlen(nm)) ||
                rc_str_set(&tc->arguments, args.v ? args.v : "", args.n)) {
                rc_bytes_free(&args);
                return OOM(e);
            }
            rc_bytes_free(&args);
        }
    }
    return 0;
}

static int convert_tools(const json_t *tools, rc_conversation *c, rc_api_error *e) {
    size_t i;
    json_t *t;
    c->tools = calloc(json_array_size(tools) + 1, sizeof *c->tools);
    if (!c->tools) return OOM(e);
    json_array_foreach(tools, i, t) {
        if (json_object_get(t, "type")) return rc_pfail(e, "tools[%zu]: server tools are not supported", i);
        const char *name = json_string_value(json_object_get(t, "name"));
        size_t nl = strlen(name);
        if (nl == 0)
            return rc_pfail(e, "Invalid 'tools[%zu].name': empty string. Expected a string with minimum length 1, but "
                            "got an empty string instead.", i);
        if (nl > 128)
            return rc_pfail(e, "Invalid 'tools[%zu].name': string too long. Expected a string with maximum length 128, "
                            "but got a string with length %zu instead.", i, nl);
        if (!rc_pvalid_tool_name(name, nl))
            return rc_pfail(e, "Invalid 'tools[%zu].name': string does not match pattern. Expected a string that "
                            "matches the pattern '^[a-zA-Z0-9_-]+$'.", i);
        for (size_t q = 0; q < i; q++)
            if (!strcmp(json_string_value(json_object_get(json_array_get(tools, q), "name")), name))
                return rc_pfail(e, "Tool names must be unique.");
    }
    json_array_foreach(tools, i, t) {
        const char *name = json_string_value(json_object_get(t, "name"));
        json_t *s = json_object_get(t, "input_schema");
        char msg[700];
        if (!s || json_is_null(s)) return rc_pfail(e, "Invalid schema for function '%s': null is not of types \"boolean\", \"object\"", name);
        if (rc_pschema_check(s, msg, sizeof msg)) return rc_pfail(e, "Invalid schema for function '%s': %s", name, msg);
        json_t *pt = json_object_get(s, "type");
        if (!json_is_object(s) || !json_is_string(pt) || strcmp(json_string_value(pt), "object")) {
            char *g = pt ? json_dumps(pt, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            rc_pfail(e, "Invalid schema for function '%s': schema must be a JSON Schema of 'type: \"object\"', got "
                     "'type: %s'.", name, g ? g : "null");
            free(g);
            return -1;
        }
        rc_tool_def *d = &c->tools[c->ntools++];
        json_t *desc = json_object_get(t, "description");
        d->has_description = 1;
        d->parameters = json_incref(s);
        if (rc_str_set(&d->name, name, strlen(name)) ||
            rc_str_set(&d->description, json_is_string(desc) ? json_string_value(desc) : "",
                       json_is_string(desc) ? json_string_length(desc) : 0))
            return OOM(e);
    }
    return 0;
}

int rc_messages_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e) {
    memset(conv, 0, sizeof *conv);
    memset(inf, 0, sizeof *inf);
    if (deser_body(body, e)) return -1;
    const char *model = rc_pcheck_model(body, e);
    if (!model) return -1;
    g_flash = !strcmp(model, "DeepSeek-V4.1-Flash");
    json_t *v;
    if ((v = json_object_get(body, "stop_sequences")) && json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n > 16) return rc_pfail(e, "Stop string array too long: %zu", n);
        inf->stop = calloc(n + 1, sizeof *inf->stop);
        if (!inf->stop) return OOM(e);
        for (size_t k = 0; k < n; k++) {
            json_t *x = json_array_get(v, k);
            if (!json_string_length(x))
                return rc_pfail(e, "Invalid 'stop[%zu]': empty string. Expected a string with minimum length 1, but got "
                                "an empty string instead.", k);
            if (!(inf->stop[inf->nstop++] = strdup(json_string_value(x)))) return OOM(e);
        }
    }
    json_t *tools = json_object_get(body, "tools");
    if (json_is_array(tools) && convert_tools(tools, conv, e)) return -1;
    json_t *msgs = json_object_get(body, "messages");
    if (!json_array_size(msgs)) return rc_pfail(e, "messages: at least one message is required");

    /* system */
    json_t *sys = json_object_get(body, "system");
    if (sys && !json_is_null(sys)) {
        rc_str s = {0};
        if (text_blocks(sys, &s)) return OOM(e);
        rc_message *m = rc_conv_push(conv, RC_ROLE_SYSTEM, s.s, s.n);
        free(s.s);
        if (!m) return OOM(e);
    }
    size_t i;
    json_t *m;
    size_t prev_at = SIZE_MAX; /* index in conv of the last assistant with tool calls, if it was the last message */
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *ct = json_object_get(m, "content");
        if (json_is_array(ct) && !json_array_size(ct))
            return rc_pfail(e, "messages.%zu: all messages must have non-empty content", i);
        const rc_message *prev = prev_at != SIZE_MAX ? &conv->msgs[prev_at] : NULL;
        if (prev && strcmp(role, "user")) {
            char w[48];
            snprintf(w, sizeof w, "messages.%zu", i);
            return missing_results(e, w, 1, prev, NULL);
        }
        if (!strcmp(role, "user")) {
            if (convert_user(conv, m, i, prev, e)) return -1;
            prev_at = SIZE_MAX;
        } else if (!strcmp(role, "assistant")) {
            if (convert_assistant(conv, m, i, e)) return -1;
            prev_at = conv->msgs[conv->nmsgs - 1].ncalls ? conv->nmsgs - 1 : SIZE_MAX;
        } else {
            rc_str s = {0};
            if (text_blocks(ct, &s)) return OOM(e);
            rc_message *x = NULL;
            if (g_flash) {
                x = rc_conv_push(conv, RC_ROLE_SYSTEM, s.s, s.n);
            } else if (!s.n) {
                x = (rc_message *)1; /* DeepSeek-V4-Pro drops an empty system message */
            } else {
                rc_str w = {0};
                int bad = rc_str_set(&w, "<system-reminder>\n", 18) || rc_str_append(&w, s.s, s.n) ||
                          rc_str_append(&w, "\n</system-reminder>", 19);
                x = bad ? NULL : rc_conv_push(conv, RC_ROLE_USER, w.s, w.n);
                free(w.s);
            }
            free(s.s);
            if (!x) return OOM(e);
            prev_at = SIZE_MAX;
        }
    }
    if (prev_at != SIZE_MAX) {
        char w[48];
        snprintf(w, sizeof w, "messages.%zu", json_array_size(msgs) - 1);
        return missing_results(e, w, 0, &conv->msgs[prev_at], NULL);
    }

    if (rc_psampling(body, inf, e)) return -1;
    if ((v = json_object_get(body, "max_tokens")) && !json_is_null(v)) {
        long long x = json_integer_value(v);
        if (x < 1) return rc_prange_fail(e, "max_tokens", "[1, 393216]");
        inf->max_tokens = x > 393216 ? 393216 : x;
    }
    inf->stream = json_is_true(json_object_get(body, "stream"));

    /* thinking: thinking.type wins, else output_config.effort "none" -> off */
    conv->thinking = 1;
    rc_effort eff = RC_EFFORT_UNSET;
    int eff_think = 1;
    const char *es = json_string_value(json_object_get(json_object_get(body, "output_config"), "effort"));
    if (es) rc_pparse_effort(es, &eff_think, &eff);
    const char *tt = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    conv->thinking = tt ? strcmp(tt, "disabled") != 0 : eff_think;
    conv->effort = conv->thinking ? (eff == RC_EFFORT_UNSET ? RC_EFFORT_HIGH : eff) : RC_EFFORT_UNSET;

    conv->tool_choice = conv->ntools ? RC_CHOICE_AUTO : RC_CHOICE_NONE;
    json_t *tc = json_object_get(body, "tool_choice");
    const char *ct = json_string_value(json_object_get(tc, "type"));
    if (ct && !strcmp(ct, "none")) conv->tool_choice = RC_CHOICE_NONE;
    else if (ct && !strcmp(ct, "tool") && conv->ntools) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        size_t keep = SIZE_MAX;
        for (size_t q = 0; q < conv->ntools; q++)
            if (!strcmp(conv->tools[q].name.s, name)) keep = q;
        if (keep == SIZE_MAX)
            return rc_pfail(e, "Invalid value for 'tool_call': no function named '%s' was specified in the 'tools' "
                            "parameter.", name);
        if (conv->thinking) return rc_pfail(e, "Thinking mode does not support this tool_choice");
        rc_tool_def only = conv->tools[keep];
        for (size_t q = 0; q < conv->ntools; q++)
            if (q != keep) rc_pfree_tool(&conv->tools[q]);
        conv->tools[0] = only;
        conv->ntools = 1;
        conv->tool_choice = RC_CHOICE_REQUIRED;
    }
    if (conv->tool_choice == RC_CHOICE_NONE) {
        for (size_t q = 0; q < conv->ntools; q++) rc_pfree_tool(&conv->tools[q]);
        conv->ntools = 0;
    }
    return 0;
}
