/* chat.c - OpenAI Chat Completions request -> conversation (spec §4.2).
 *
 * Validation follows deepseek-recipe 0.2.0: the same checks in the same
 * order, the same messages, status 400 with type invalid_request_error.
 * Does not own: rendering (render.c) or the response side. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol.h"

static int fail(rc_api_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(rc_api_error *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = 400;
    e->type = "invalid_request_error";
    return -1;
}

void rc_inference_free(rc_inference *inf) {
    for (size_t i = 0; i < inf->nstop; i++) free(inf->stop[i]);
    free(inf->stop);
    memset(inf, 0, sizeof *inf);
}

int rc_api_error_json(const rc_api_error *e, rc_bytes *out) {
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", e->message, "type", e->type, "param",
                          "code", e->type);
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!s) return RC_ENOMEM;
    int rc = rc_bytes_append(out, s, strlen(s));
    free(s);
    return rc;
}

/* message content: a string, or an array of {"type":"text","text":...}
 * parts joined with "\n\n"; null counts as absent */
static int content_text(const json_t *c, rc_str *out, int *present, const char *where, rc_api_error *e) {
    *present = 0;
    if (!c || json_is_null(c)) return 0;
    *present = 1;
    if (json_is_string(c)) return rc_str_set(out, json_string_value(c), json_string_length(c)) ? fail(e, "out of memory") : 0;
    if (!json_is_array(c)) return fail(e, "%s: content must be a string or an array of content parts", where);
    if (rc_str_set(out, "", 0)) return fail(e, "out of memory");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *ty = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!ty || strcmp(ty, "text") || !json_is_string(text))
            return fail(e, "%s: unsupported content part", where);
        if ((i && rc_str_append(out, "\n\n", 2)) ||
            rc_str_append(out, json_string_value(text), json_string_length(text)))
            return fail(e, "out of memory");
    }
    return 0;
}

static int valid_tool_name(const char *s, size_t n) {
    if (n < 1 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int parse_effort(const char *s, int *thinking, rc_effort *eff) {
    if (!strcmp(s, "none")) *thinking = 0;
    else if (!strcmp(s, "minimal") || !strcmp(s, "low")) *eff = RC_EFFORT_LOW;
    else if (!strcmp(s, "medium") || !strcmp(s, "high")) *eff = RC_EFFORT_HIGH;
    else if (!strcmp(s, "xhigh")) *eff = RC_EFFORT_XHIGH;
    else if (!strcmp(s, "max")) *eff = RC_EFFORT_MAX;
    else return -1;
    return 0;
}

static int convert_messages(const json_t *msgs, rc_conversation *conv, rc_api_error *e) {
    size_t i;
    json_t *m;
    /* ids of the pending tool calls the next tool messages must answer */
    const json_t *pending = NULL;
    size_t pending_at = 0, answered = 0;
    char where[64];
    json_array_foreach(msgs, i, m) {
        snprintf(where, sizeof where, "messages[%zu]", i);
        if (!json_is_object(m)) return fail(e, "%s: expected an object", where);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return fail(e, "%s: missing field `role`", where);
        rc_str text = {0};
        int present;
        if (content_text(json_object_get(m, "content"), &text, &present, where, e)) {
            free(text.s);
            return -1;
        }
        if (pending && strcmp(role, "tool") && answered < json_array_size(pending)) {
            free(text.s);
            return fail(e, "An assistant message with 'tool_calls' must be followed by tool messages responding "
                           "to each 'tool_call_id'. (insufficient tool messages following tool_calls message)");
        }
        if (strcmp(role, "tool")) pending = NULL;
        rc_message *msg = NULL;
        if (!strcmp(role, "system")) {
            if (text.n) msg = rc_conv_push(conv, RC_ROLE_SYSTEM, text.s, text.n);
            else {
                free(text.s);
                continue; /* empty system content is dropped */
            }
        } else if (!strcmp(role, "user")) {
            if (!present) {
                free(text.s);
                return fail(e, "%s: missing field `content`", where);
            }
            msg = rc_conv_push(conv, RC_ROLE_USER, text.s, text.n);
        } else if (!strcmp(role, "latest_reminder")) {
            msg = rc_conv_push(conv, RC_ROLE_REMINDER, text.s, text.n);
        } else if (!strcmp(role, "assistant")) {
            json_t *calls = json_object_get(m, "tool_calls");
            if (calls && json_is_null(calls)) calls = NULL;
            if (!present && !calls) {
                free(text.s);
                return fail(e, "Invalid assistant message: content or tool_calls must be set");
            }
            msg = rc_conv_push(conv, RC_ROLE_ASSISTANT, text.s, text.n);
            if (!msg) break;
            json_t *rs = json_object_get(m, "reasoning_content");
            if (json_is_string(rs)) {
                msg->has_reasoning = 1;
                rc_str_set(&msg->reasoning, json_string_value(rs), json_string_length(rs));
            }
            if (calls) {
                if (!json_is_array(calls) || json_array_size(calls) == 0) {
                    free(text.s);
                    return fail(e, "%s: tool_calls must be a non-empty array", where);
                }
                msg->calls = calloc(json_array_size(calls), sizeof *msg->calls);
                size_t k;
                json_t *tc;
                json_array_foreach(calls, k, tc) {
                    json_t *fn = json_object_get(tc, "function");
                    const char *id = json_string_value(json_object_get(tc, "id"));
                    const char *name = json_string_value(json_object_get(fn, "name"));
                    json_t *args = json_object_get(fn, "arguments");
                    if (!id || !name || !json_is_string(args)) {
                        free(text.s);
                        return fail(e, "%s.tool_calls[%zu]: expected id, function.name and function.arguments",
                                    where, k);
                    }
                    rc_tool_call *c = &msg->calls[msg->ncalls++];
                    rc_str_set(&c->id, id, strlen(id));
                    rc_str_set(&c->name, name, strlen(name));
                    rc_str_set(&c->arguments, json_string_value(args), json_string_length(args));
                }
                pending = calls;
                pending_at = i;
                answered = 0;
            }
        } else if (!strcmp(role, "tool")) {
            const char *id = json_string_value(json_object_get(m, "tool_call_id"));
            if (!pending) {
                free(text.s);
                return fail(e, "Messages with role 'tool' must be a response to a preceding message with "
                               "'tool_calls'");
            }
            if (!id) {
                free(text.s);
                return fail(e, "%s: missing field `tool_call_id`", where);
            }
            /* each id answered exactly once */
            const rc_message *am = &conv->msgs[conv->nmsgs - 1 - answered];
            int known = 0;
            for (size_t k = 0; k < am->ncalls; k++) known |= !strcmp(am->calls[k].id.s, id);
            for (size_t k = 0; k < answered; k++)
                if (!strcmp(conv->msgs[conv->nmsgs - answered + k].tool_call_id.s, id)) {
                    free(text.s);
                    return fail(e, "Duplicate value for 'tool_call_id' of %s in message[%zu]", id, i);
                }
            if (!known) {
                free(text.s);
                return fail(e, "Unexpected tool_call_id: %s", id);
            }
            msg = rc_conv_push(conv, RC_ROLE_TOOL, text.s, text.n);
            if (msg) rc_str_set(&msg->tool_call_id, id, strlen(id));
            answered++;
        } else {
            free(text.s);
            return fail(e, "%s: unknown variant `%s`, expected one of `system`, `user`, `assistant`, `tool`, "
                           "`latest_reminder`",
                        where, role);
        }
        free(text.s);
        if (!msg) return fail(e, "out of memory");
    }
    (void)pending_at;
    if (pending && answered < json_array_size(pending))
        return fail(e, "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                       "each 'tool_call_id'. (insufficient tool messages following tool_calls message)");
    return 0;
}

int rc_chat_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e) {
    memset(conv, 0, sizeof *conv);
    memset(inf, 0, sizeof *inf);
    if (!json_is_object(body)) return fail(e, "request body must be a JSON object");
    if (!json_is_string(json_object_get(body, "model"))) return fail(e, "missing field `model`");
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) return fail(e, "missing field `messages`");
    if (json_array_size(msgs) == 0) return fail(e, "Empty input messages");

    json_t *v;
    if ((v = json_object_get(body, "n")) && !json_is_null(v) && json_integer_value(v) != 1)
        return fail(e, "Invalid n value (currently only n = 1 is supported)");
    if ((v = json_object_get(body, "max_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) return fail(e, "max_tokens: invalid value");
        if (json_integer_value(v) == 0) return fail(e, "max_tokens must be greater than zero");
        inf->max_tokens = json_integer_value(v);
    }
    if ((v = json_object_get(body, "temperature")) && !json_is_null(v)) {
        double t = json_number_value(v);
        if (!json_is_number(v) || !(t >= 0 && t <= 2)) return fail(e, "temperature must be in [0, 2]");
        inf->temperature = t;
        inf->has_temperature = 1;
    }
    if ((v = json_object_get(body, "top_p")) && !json_is_null(v)) {
        double t = json_number_value(v);
        if (!json_is_number(v) || !(t > 0 && t <= 1)) return fail(e, "top_p must be in (0, 1]");
        inf->top_p = t;
        inf->has_top_p = 1;
    }
    json_t *stream = json_object_get(body, "stream");
    inf->stream = json_is_true(stream);
    if ((v = json_object_get(body, "stream_options")) && !json_is_null(v) && !inf->stream)
        return fail(e, "stream_options should be set along with stream = true");
    if ((v = json_object_get(body, "stop")) && !json_is_null(v)) {
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if (json_is_array(v) && n > 16) return fail(e, "ChatCompletionStopSequences string array too long: %zu", n);
        inf->stop = calloc(n ? n : 1, sizeof *inf->stop);
        for (size_t k = 0; k < n; k++) {
            json_t *s = json_is_array(v) ? json_array_get(v, k) : v;
            if (!json_is_string(s)) return fail(e, "stop: expected a string or an array of strings");
            if (json_string_length(s)) inf->stop[inf->nstop++] = strdup(json_string_value(s));
        }
    }

    /* thinking and effort (spec §2.4) */
    conv->thinking = 1;
    conv->effort = RC_EFFORT_UNSET;
    json_t *th = json_object_get(body, "thinking");
    const char *tty = json_string_value(json_object_get(th, "type"));
    json_t *re = json_object_get(body, "reasoning_effort");
    int th_think = 1;
    rc_effort eff = RC_EFFORT_UNSET;
    if (re && !json_is_null(re)) {
        if (!json_is_string(re) || parse_effort(json_string_value(re), &th_think, &eff))
            return fail(e, "reasoning_effort: unknown variant");
    }
    if (tty) {
        if (!strcmp(tty, "enabled") || !strcmp(tty, "adaptive")) conv->thinking = 1;
        else if (!strcmp(tty, "disabled")) conv->thinking = 0;
        else return fail(e, "thinking.type: unknown variant `%s`", tty);
    } else if (re && !json_is_null(re)) {
        conv->thinking = th_think;
    }
    conv->effort = conv->thinking ? (eff == RC_EFFORT_UNSET ? RC_EFFORT_HIGH : eff) : RC_EFFORT_UNSET;

    /* response format */
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        const char *ty = json_string_value(json_object_get(v, "type"));
        if (!ty) return fail(e, "response_format: missing field `type`");
        if (!strcmp(ty, "json_object")) conv->json_mode = 1;
        else if (strcmp(ty, "text") && strcmp(ty, "json_schema"))
            return fail(e, "response_format: only text and json_object are supported");
    }

    /* tools */
    json_t *tools = json_object_get(body, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return fail(e, "tools: expected an array");
        conv->tools = calloc(json_array_size(tools) + 1, sizeof *conv->tools);
        size_t k;
        json_t *t;
        json_array_foreach(tools, k, t) {
            json_t *fn = json_object_get(t, "function");
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!name) return fail(e, "tools[%zu].function: missing field `name`", k);
            if (!valid_tool_name(name, strlen(name)))
                return fail(e, "tools[%zu].function.name: expected 1-128 ASCII letters, digits, underscores or hyphens", k);
            for (size_t q = 0; q < conv->ntools; q++)
                if (!strcmp(conv->tools[q].name.s, name)) return fail(e, "Tool names must be unique");
            rc_tool_def *d = &conv->tools[conv->ntools++];
            rc_str_set(&d->name, name, strlen(name));
            json_t *desc = json_object_get(fn, "description");
            if (json_is_string(desc)) {
                d->has_description = 1;
                rc_str_set(&d->description, json_string_value(desc), json_string_length(desc));
            }
            json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params)) {
                const char *pty = json_string_value(json_object_get(params, "type"));
                if (!json_is_object(params) || !pty || strcmp(pty, "object"))
                    return fail(e, "tools[%zu].function.parameters must be a JSON Schema of type object", k);
                d->parameters = json_incref(params);
            }
        }
    }
    conv->tool_choice = conv->ntools ? RC_CHOICE_AUTO : RC_CHOICE_NONE;
    json_t *tc = json_object_get(body, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) conv->tool_choice = RC_CHOICE_NONE;
            else if (!strcmp(s, "auto")) conv->tool_choice = conv->ntools ? RC_CHOICE_AUTO : RC_CHOICE_NONE;
            else if (!strcmp(s, "required")) conv->tool_choice = RC_CHOICE_REQUIRED;
            else return fail(e, "tool_choice: unknown variant `%s`", s);
        } else {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) return fail(e, "tool_choice: expected a string or a named function");
            size_t keep = SIZE_MAX;
            for (size_t q = 0; q < conv->ntools; q++)
                if (!strcmp(conv->tools[q].name.s, name)) keep = q;
            if (keep == SIZE_MAX) return fail(e, "tool_choice: no tool named '%s' was specified", name);
            /* a named choice keeps only that tool and forces a call */
            rc_tool_def only = conv->tools[keep];
            for (size_t q = 0; q < conv->ntools; q++)
                if (q != keep) {
                    free(conv->tools[q].name.s);
                    free(conv->tools[q].description.s);
                    json_decref(conv->tools[q].parameters);
                }
            conv->tools[0] = only;
            conv->ntools = 1;
            conv->tool_choice = RC_CHOICE_REQUIRED;
        }
        if (conv->tool_choice == RC_CHOICE_REQUIRED && conv->thinking)
            return fail(e, "Thinking mode does not support this tool_choice");
    }
    if (conv->tool_choice == RC_CHOICE_NONE) {
        for (size_t q = 0; q < conv->ntools; q++) {
            free(conv->tools[q].name.s);
            free(conv->tools[q].description.s);
            json_decref(conv->tools[q].parameters);
        }
        conv->ntools = 0;
    }
    return convert_messages(msgs, conv, e);
}
