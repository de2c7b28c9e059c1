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

#include "recipe/protocol_internal.h"
#include "recipe/pyjson.h"




/* message content: a string, or an array of {"type":"text","text":...}
 * parts joined with "\n\n"; null counts as absent */
static int content_text(const json_t *c, rc_str *out, int *present, const char *where, rc_api_error *e) {
    *present = 0;
    if (!c || json_is_null(c)) return 0;
    *present = 1;
    if (json_is_string(c)) return rc_str_set(out, json_string_value(c), json_string_length(c)) ? rc_pfail(e, "out of memory") : 0;
    if (!json_is_array(c)) return rc_pfail(e, "%s: content must be a string or an array of content parts", where);
    if (rc_str_set(out, "", 0)) return rc_pfail(e, "out of memory");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *ty = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        /* the text-only encodings write a marker where an image was */
        const char *t = !strcmp(ty, "text") ? json_string_value(text) : "[Unsupported Image]";
        size_t tn = !strcmp(ty, "text") ? json_string_length(text) : strlen(t);
        if ((i && rc_str_append(out, "\n\n", 2)) || rc_str_append(out, t, tn))
            return rc_pfail(e, "out of memory");
    }
    return 0;
}



static int convert_messages(const json_t *msgs, rc_conversation *conv, rc_api_error *e) {
    size_t i;
    json_t *m;
    /* ids of the pending tool calls the next tool messages must answer */
    const json_t *pending = NULL;
    size_t pending_at = 0, answered = 0;
    char where[64];
    size_t nmsgs = json_array_size(msgs);
    int any_calls = 0;
    json_array_foreach(msgs, i, m) {
        snprintf(where, sizeof where, "messages[%zu]", i);
        const char *role0 = json_string_value(json_object_get(m, "role"));
        (void)role0;
        any_calls |= json_array_size(json_object_get(m, "tool_calls")) > 0;
        if (!json_is_object(m)) return rc_pfail(e, "%s: expected an object", where);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role) return rc_pfail(e, "%s: missing field `role`", where);
        rc_str text = {0};
        int present;
        if (content_text(json_object_get(m, "content"), &text, &present, where, e)) {
            free(text.s);
            return -1;
        }
        if (pending && strcmp(role, "tool") && answered < json_array_size(pending)) {
            free(text.s);
            return rc_pfail(e, "An assistant message with 'tool_calls' must be followed by tool messages responding "
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
                return rc_pfail(e, "%s: missing field `content`", where);
            }
            msg = rc_conv_push(conv, RC_ROLE_USER, text.s, text.n);
        } else if (!strcmp(role, "latest_reminder")) {
            msg = rc_conv_push(conv, RC_ROLE_REMINDER, text.s, text.n);
        } else if (!strcmp(role, "assistant")) {
            json_t *calls = json_object_get(m, "tool_calls");
            if (calls && json_is_null(calls)) calls = NULL;
            if (!present && !calls) {
                free(text.s);
                return rc_pfail(e, "Invalid assistant message: content or tool_calls must be set");
            }
            msg = rc_conv_push(conv, RC_ROLE_ASSISTANT, text.s, text.n);
            if (!msg) break;
            msg->prefix = json_is_true(json_object_get(m, "prefix"));
            json_t *rs = json_object_get(m, "reasoning_content");
            if (json_is_string(rs)) {
                msg->has_reasoning = 1;
                rc_str_set(&msg->reasoning, json_string_value(rs), json_string_length(rs));
            }
            if (calls) {
                if (!json_is_array(calls) || json_array_size(calls) == 0) {
                    free(text.s);
                    return rc_pfail(e, "Invalid '%s.tool_calls': empty array. Expected an array with minimum length 1, but got "
                           "an empty array instead.", where);
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
                        return rc_pfail(e, "%s.tool_calls[%zu]: expected id, function.name and function.arguments",
                                    where, k);
                    }
                    for (size_t q = 0; q < msg->ncalls; q++)
                        if (!strcmp(msg->calls[q].id.s, id)) {
                            free(text.s);
                            return rc_pfail(e, "Duplicate value for 'tool_call_id' of %s in message[%zu]", id, i);
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
                return rc_pfail(e, "Messages with role 'tool' must be a response to a preceding message with "
                               "'tool_calls'");
            }
            if (!id) {
                free(text.s);
                return rc_pfail(e, "%s: missing field `tool_call_id`", where);
            }
            /* each id answered exactly once */
            const rc_message *am = &conv->msgs[conv->nmsgs - 1 - answered];
            int known = 0;
            for (size_t k = 0; k < am->ncalls; k++) known |= !strcmp(am->calls[k].id.s, id);
            for (size_t k = 0; k < answered; k++)
                if (!strcmp(conv->msgs[conv->nmsgs - answered + k].tool_call_id.s, id)) {
                    free(text.s);
                    return rc_pfail(e, "Duplicate value for 'tool_call_id' of %s in message[%zu]", id, pending_at);
                }
            if (!known) {
                free(text.s);
                return rc_pfail(e, "An assistant message with 'tool_calls' must be followed by tool messages responding "
                               "to each 'tool_call_id', The following tool_call_ids did not have response messages: "
                               "%s", id);
            }
            msg = rc_conv_push(conv, RC_ROLE_TOOL, text.s, text.n);
            if (msg) rc_str_set(&msg->tool_call_id, id, strlen(id));
            answered++;
        } else {
            free(text.s);
            return rc_pfail(e, "%s: unknown variant `%s`, expected one of `system`, `user`, `assistant`, `tool`, "
                           "`latest_reminder`",
                        where, role);
        }
        free(text.s);
        if (!msg) return rc_pfail(e, "out of memory");
    }
    (void)pending_at;
    /* prefill checks come after the tool-call sequence checks */
    json_array_foreach(msgs, i, m) {
        const char *r = json_string_value(json_object_get(m, "role"));
        if (json_is_true(json_object_get(m, "prefix")) && (i + 1 != nmsgs || strcmp(r, "assistant")))
            return rc_pfail(e, "Invalid completion message: prefix set true with message which is not final message "
                           "or message role is not assistant");
    }
    const json_t *last = json_array_get(msgs, nmsgs - 1);
    if (json_is_true(json_object_get(last, "prefix")) && any_calls)
        return rc_pfail(e, "Function call should not be used with prefix");
    if (pending && answered < json_array_size(pending))
        return rc_pfail(e, "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                       "each 'tool_call_id'. (insufficient tool messages following tool_calls message)");
    return 0;
}

/* serde's wording for an unexpected JSON value ("invalid type: X, expected Y") */



/* an unsigned integer field of width `bits` (32 or 64) */

static const char *const ROLES = "`system`, `user`, `assistant`, `tool`, `latest_reminder`";

/* the deserialisation checks of one message (serde's order: the tag, then fields) */
static int deser_message(const json_t *m, rc_api_error *e) {
    if (!json_is_object(m)) return rc_pbad_type(e, m, "internally tagged enum ChatCompletionRequestMessage");
    json_t *role = json_object_get(m, "role");
    if (!role) return rc_pmissing(e, "role");
    if (!json_is_string(role)) return rc_pbad_type(e, role, "variant identifier");
    const char *r = json_string_value(role);
    if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool") &&
        strcmp(r, "latest_reminder"))
        return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of %s", r, ROLES);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)m, key, v) {
        if (!strcmp(key, "content")) {
            if (json_is_string(v) || (json_is_null(v) && !strcmp(r, "assistant"))) continue;
            if (!json_is_array(v)) return rc_pfail(e, "invalid request body: content should be a string or a list");
            size_t i;
            json_t *part;
            json_array_foreach(v, i, part) {
                if (!json_is_object(part))
                    return rc_pbad_type(e, part, "internally tagged enum ChatCompletionRequestContentBlock");
                json_t *ty = json_object_get(part, "type");
                if (!ty) return rc_pmissing(e, "type");
                if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
                const char *t = json_string_value(ty);
                if (!strcmp(t, "text")) {
                    json_t *tx = json_object_get(part, "text");
                    if (!tx) return rc_pmissing(e, "text");
                    if (!json_is_string(tx)) return rc_pbad_type(e, tx, "a string");
                } else if (strcmp(t, "image_url") && strcmp(t, "file")) {
                    return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of `text`, `image_url`, `file`", t);
                }
            }
        } else if (!strcmp(key, "reasoning_content") || (!strcmp(key, "tool_call_id") && !strcmp(r, "tool"))) {
            if (!json_is_string(v) && !json_is_null(v)) return rc_pbad_type(e, v, "a string");
        } else if (!strcmp(key, "tool_calls") && !strcmp(r, "assistant")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *tc;
            json_array_foreach(v, i, tc) {
                if (!json_is_object(tc)) return rc_pbad_type(e, tc, "struct ChatCompletionMessageToolCall");
                const char *k2;
                json_t *v2;
                json_object_foreach(tc, k2, v2) {
                    if (!strcmp(k2, "id") && !json_is_string(v2)) return rc_pbad_type(e, v2, "a string");
                    if (!strcmp(k2, "function")) {
                        if (!json_is_object(v2)) return rc_pbad_type(e, v2, "struct FunctionCall");
                        json_t *nm = json_object_get(v2, "name"), *ar = json_object_get(v2, "arguments");
                        const char *k3;
                        json_t *v3;
                        json_object_foreach(v2, k3, v3) {
                            if ((!strcmp(k3, "name") || !strcmp(k3, "arguments")) && !json_is_string(v3))
                                return rc_pbad_type(e, v3, "a string");
                        }
                        if (!nm) return rc_pmissing(e, "name");
                        if (!ar) return rc_pmissing(e, "arguments");
                    }
                }
                if (!json_object_get(tc, "id")) return rc_pmissing(e, "id");
                if (!json_object_get(tc, "function")) return rc_pmissing(e, "function");
            }
        }
    }
    if (!strcmp(r, "tool") && !json_object_get(m, "tool_call_id")) return rc_pmissing(e, "tool_call_id");
    if ((!strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "tool") || !strcmp(r, "latest_reminder")) &&
        !json_object_get(m, "content"))
        return rc_pmissing(e, "content");
    return 0;
}

/* serde pass over the body: fields in input order, then missing fields */
static int deser_body(const json_t *body, rc_api_error *e) {
    if (json_is_array(body)) { /* serde reads a sequence as the struct's fields in order */
        json_t *first = json_array_get(body, 0);
        if (first && !json_is_array(first)) return rc_pbad_type(e, first, "a sequence");
        return rc_pfail(e, "invalid request body: invalid length %zu, expected struct ChatCompletionRequest with 20 elements",
                    json_array_size(body));
    }
    if (!json_is_object(body)) return rc_pbad_type(e, body, "struct ChatCompletionRequest");
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
        } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
            if (rc_pcheck_uint(e, v, 32)) return -1;
        } else if (!strcmp(key, "seed")) {
            if (rc_pcheck_uint(e, v, 64)) return -1;
        } else if (!strcmp(key, "n")) {
            if (rc_pcheck_uint(e, v, 32)) return -1;
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p") || !strcmp(key, "frequency_penalty") ||
                   !strcmp(key, "presence_penalty")) {
            if (!json_is_null(v) && !json_is_number(v)) return rc_pbad_type(e, v, "f32");
        } else if (!strcmp(key, "stop")) {
            if (json_is_null(v) || json_is_string(v)) continue;
            if (!json_is_array(v)) return rc_pfail(e, "invalid request body: expected a string or a list");
            size_t i;
            json_t *x;
            json_array_foreach(v, i, x) if (!json_is_string(x)) return rc_pbad_type(e, x, "a string");
        } else if (!strcmp(key, "reasoning_effort")) {
            if (json_is_null(v)) continue;
            if (!json_is_string(v)) return rc_pbad_type(e, v, "string or map");
            int th;
            rc_effort ef;
            if (rc_pparse_effort(json_string_value(v), &th, &ef))
                return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of `none`, `minimal`, "
                               "`low`, `medium`, `high`, `xhigh`, `ultra`, `max`",
                            json_string_value(v));
        } else if (!strcmp(key, "thinking")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "struct ChatCompletionThinking");
            json_t *ty = json_object_get(v, "type");
            if (!ty) return rc_pmissing(e, "type");
            const char *t = json_string_value(ty);
            if (!t) return rc_pbad_type(e, ty, "variant identifier");
            if (strcmp(t, "enabled") && strcmp(t, "adaptive") && strcmp(t, "disabled"))
                return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of `adaptive`, `enabled`, `disabled`", t);
        } else if (!strcmp(key, "response_format")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "internally tagged enum ChatCompletionResponseFormat");
            json_t *ty = json_object_get(v, "type");
            if (!ty) return rc_pmissing(e, "type");
            const char *t = json_string_value(ty);
            if (!t) return rc_pbad_type(e, ty, "variant identifier");
            if (strcmp(t, "json_object") && strcmp(t, "json_schema") && strcmp(t, "regex") && strcmp(t, "text"))
                return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of `json_object`, `json_schema`, `regex`, `text`", t);
        } else if (!strcmp(key, "tools")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *t;
            json_array_foreach(v, i, t) {
                if (!json_is_object(t)) return rc_pbad_type(e, t, "internally tagged enum ChatCompletionTool");
                json_t *ty = json_object_get(t, "type");
                if (!ty) return rc_pmissing(e, "type");
                const char *tt = json_string_value(ty);
                if (!tt) return rc_pbad_type(e, ty, "variant identifier");
                if (strcmp(tt, "function"))
                    return rc_pfail(e, "invalid request body: unknown variant `%s`, expected `function`", tt);
                json_t *fn = json_object_get(t, "function");
                if (!fn) return rc_pmissing(e, "function");
                if (!json_is_object(fn)) return rc_pbad_type(e, fn, "struct FunctionObject");
                json_t *nm = json_object_get(fn, "name");
                if (!nm) return rc_pmissing(e, "name");
                if (!json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
            }
        } else if (!strcmp(key, "tool_choice")) {
            if (json_is_null(v)) continue;
            if (json_is_string(v)) {
                const char *t = json_string_value(v);
                if (strcmp(t, "none") && strcmp(t, "auto") && strcmp(t, "required"))
                    return rc_pfail(e, "invalid request body: expected one of `none`, `auto`, `required` or a tool");
            } else if (json_is_object(v)) {
                json_t *fn = json_object_get(v, "function");
                if (!fn) return rc_pmissing(e, "function");
                if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                    return rc_pmissing(e, "name");
            } else {
                return rc_pfail(e, "invalid request body: expected one of `none`, `auto`, `required` or a tool");
            }
        } else if (!strcmp(key, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) return rc_pbad_type(e, v, "a boolean");
        }
    }
    if (!json_object_get(body, "model")) return rc_pmissing(e, "model");
    if (!json_object_get(body, "messages")) return rc_pmissing(e, "messages");
    return 0;
}

int rc_chat_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e) {
    memset(conv, 0, sizeof *conv);
    memset(inf, 0, sizeof *inf);
    if (deser_body(body, e)) return -1;
    if (!rc_pcheck_model(body, e)) return -1;
    json_t *msgs = json_object_get(body, "messages");
    if (json_array_size(msgs) == 0) return rc_pfail(e, "Empty input messages");

    json_t *v;
    if ((v = json_object_get(body, "max_tokens")) && !json_is_null(v)) {
        long long x = json_integer_value(v);
        if (x < 1 || x > 393216) return rc_prange_fail(e, "max_tokens", "[1, 393216]");
        inf->max_tokens = x;
    }
    if (rc_psampling(body, inf, e)) return -1;
    if ((v = json_object_get(body, "n")) && !json_is_null(v) && json_integer_value(v) != 1)
        return rc_pfail(e, "Invalid n value (currently only n = 1 is supported)");
    if ((v = json_object_get(body, "frequency_penalty")) && !json_is_null(v) &&
        !(json_number_value(v) >= -2 && json_number_value(v) <= 2))
        return rc_prange_fail(e, "frequency_penalty", "[-2, 2]");
    if ((v = json_object_get(body, "presence_penalty")) && !json_is_null(v) &&
        !(json_number_value(v) >= -2 && json_number_value(v) <= 2))
        return rc_prange_fail(e, "presence_penalty", "[-2, 2]");
    if ((v = json_object_get(body, "seed")) && rc_json_is_u64(v)) /* >= 2^63 */
        return rc_prange_fail(e, "seed", "[0, 2^63)");
    if ((v = json_object_get(body, "top_logprobs")) && !json_is_null(v)) {
        if (!json_is_true(json_object_get(body, "logprobs")))
            return rc_pfail(e, "Invalid top_logprobs and logprobs value, logprobs must be set to true if top_logprobs "
                           "is used.");
        if (!(json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= 20))
            return rc_pfail(e, "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].");
    }
    inf->stream = json_is_true(json_object_get(body, "stream"));
    if ((v = json_object_get(body, "stream_options")) && !json_is_null(v) && !inf->stream)
        return rc_pfail(e, "stream_options should be set along with stream = true");
    if ((v = json_object_get(body, "stop")) && !json_is_null(v)) {
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        if (n > 16) return rc_pfail(e, "Stop string array too long: %zu", n);
        inf->stop = calloc(n ? n : 1, sizeof *inf->stop);
        for (size_t k = 0; k < n; k++) {
            json_t *x = json_is_array(v) ? json_array_get(v, k) : v;
            if (!json_string_length(x))
                return json_is_array(v)
                           ? rc_pfail(e, "Invalid 'stop[%zu]': empty string. Expected a string with minimum length 1, but "
                                     "got an empty string instead.", k)
                           : rc_pfail(e, "Invalid 'stop': empty string. Expected a string with minimum length 1, but got "
                                     "an empty string instead.");
            inf->stop[inf->nstop++] = strdup(json_string_value(x));
        }
    }

    /* thinking and effort (spec §2.4; "ultra" = max) */
    conv->thinking = 1;
    const char *tty = json_string_value(json_object_get(json_object_get(body, "thinking"), "type"));
    json_t *re = json_object_get(body, "reasoning_effort");
    int re_think = 1;
    rc_effort eff = RC_EFFORT_UNSET;
    if (json_is_string(re)) rc_pparse_effort(json_string_value(re), &re_think, &eff);
    if (tty) conv->thinking = strcmp(tty, "disabled") != 0;
    else if (json_is_string(re)) conv->thinking = re_think;
    conv->effort = conv->thinking ? (eff == RC_EFFORT_UNSET ? RC_EFFORT_HIGH : eff) : RC_EFFORT_UNSET;

    /* response format */
    int rf_any = 0;
    if ((v = json_object_get(body, "response_format")) && !json_is_null(v)) {
        rf_any = 1;
        const char *ty = json_string_value(json_object_get(v, "type"));
        if (!strcmp(ty, "json_object")) conv->json_mode = 1;
        else if (!strcmp(ty, "json_schema")) {
            json_t *schema = json_object_get(json_object_get(v, "json_schema"), "schema");
            if (!schema) return rc_pfail(e, "invalid request body: missing field `schema`");
            conv->json_schema = json_incref(schema);
        }
    }

    /* tools */
    json_t *tools = json_object_get(body, "tools");
    size_t ntools = json_is_array(tools) ? json_array_size(tools) : 0;
    conv->tools = calloc(ntools + 1, sizeof *conv->tools);
    int nstrict = 0;
    for (size_t k = 0; k < ntools; k++) {
        json_t *fn = json_object_get(json_array_get(tools, k), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        size_t nl = strlen(name);
        if (nl == 0)
            return rc_pfail(e, "Invalid 'tools[%zu].function.name': empty string. Expected a string with minimum length 1, "
                           "but got an empty string instead.", k);
        if (nl > 128)
            return rc_pfail(e, "Invalid 'tools[%zu].function.name': string too long. Expected a string with maximum "
                           "length 128, but got a string with length %zu instead.", k, nl);
        if (!rc_pvalid_tool_name(name, nl))
            return rc_pfail(e, "Invalid 'tools[%zu].function.name': string does not match pattern. Expected a string "
                           "that matches the pattern '^[a-zA-Z0-9_-]+$'.", k);
        for (size_t q = 0; q < conv->ntools; q++)
            if (!strcmp(conv->tools[q].name.s, name)) return rc_pfail(e, "Tool names must be unique.");
        rc_tool_def *d = &conv->tools[conv->ntools++];
        rc_str_set(&d->name, name, nl);
        json_t *desc = json_object_get(fn, "description");
        if (json_is_string(desc)) {
            d->has_description = 1;
            rc_str_set(&d->description, json_string_value(desc), json_string_length(desc));
        }
        nstrict += json_is_true(json_object_get(fn, "strict"));
        json_t *params = json_object_get(fn, "parameters");
        if (params && !json_is_null(params)) {
            json_t *pt = json_object_get(params, "type");
            if (!json_is_object(params) || !json_is_string(pt) || strcmp(json_string_value(pt), "object")) {
                char got[300];
                if (!pt) snprintf(got, sizeof got, "null");
                else if (json_is_string(pt)) snprintf(got, sizeof got, "\"%.200s\"", json_string_value(pt));
                else snprintf(got, sizeof got, "%s", "?");
                return rc_pfail(e, "Invalid schema for function '%s': schema must be a JSON Schema of 'type: \"object\"', "
                               "got 'type: %s'.", name, got);
            }
            d->parameters = json_incref(params);
        }
        if (json_is_true(json_object_get(fn, "strict"))) {
            json_t *in = d->parameters ? d->parameters : json_pack("{s:s}", "type", "object");
            json_t *st = rc_pstrict_schema(in, 1, e);
            json_decref(in);
            d->parameters = st;
            if (!st) return -1;
        }
    }
    if (nstrict && nstrict != (int)conv->ntools)
        return rc_pfail(e, "Cannot use strict tool with non-strict tool in the same request");
    if (nstrict && rf_any) return rc_pfail(e, "response_format should not be used with tools");

    conv->tool_choice = conv->ntools ? RC_CHOICE_AUTO : RC_CHOICE_NONE;
    json_t *tc = json_object_get(body, "tool_choice");
    int forced = 0;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *x = json_string_value(tc);
            if (!strcmp(x, "none")) conv->tool_choice = RC_CHOICE_NONE;
            else if (!strcmp(x, "required")) {
                forced = 1;
                if (conv->ntools) conv->tool_choice = RC_CHOICE_REQUIRED;
            }
        } else {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            forced = 1;
            if (conv->ntools && rc_pkeep_tool(conv, name, e)) return -1;
        }
        if (forced && conv->thinking && conv->ntools)
            return rc_pfail(e, "Thinking mode does not support this tool_choice");
    }
    if (conv->tool_choice == RC_CHOICE_NONE) {
        for (size_t q = 0; q < conv->ntools; q++) rc_pfree_tool(&conv->tools[q]);
        conv->ntools = 0;
    }
    if (convert_messages(msgs, conv, e)) return -1;
    if (conv->json_mode && conv->nmsgs && conv->msgs[conv->nmsgs - 1].prefix)
        return rc_pfail(e, "response_format json_object should not be used with prefix");
    if (conv->json_mode && !rc_pmentions_json(conv))
        return rc_pfail(e, "Prompt must contain the word 'json' in some form to use 'response_format' of type "
                       "'json_object'.");
    return 0;
}
