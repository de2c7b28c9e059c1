/* responses.c - OpenAI Responses request -> conversation (docs/RECIPE-RM.md).
 *
 * Owns: the Responses deserialisation checks (serde wording, keys in input
 * order), the semantic validation of deepseek-recipe 0.2.0 in its order
 * (model, ranges, tools, input items, tool_choice, text.format) and the
 * conversion of input items (messages, reasoning, call/output groups) into
 * an rc_conversation.  Does not own rendering (render.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol_internal.h"
#include "recipe/pyjson.h"

#define OOM(e) rc_pfail(e, "out of memory")

/* 0.2.0 converts differently per model: for DeepSeek-V4.1-Flash developer
 * items are system messages and namespace tools are "ns::fn" with the
 * namespace description prefixed; for DeepSeek-V4-Pro developer items are
 * user messages and namespace tools are "ns__fn" with the function's own
 * description.  Set once per request by rc_responses_convert. */
static _Thread_local int g_flash; /* set per call, read only on the converting thread */



/* ------------------------------------------------------------------ serde pass */

static const char *const CONTENT_TYPES = "`input_text`, `output_text`, `input_image`, `input_file`";

static int deser_parts(const json_t *v, int output, rc_api_error *e) {
    size_t i;
    json_t *p;
    json_array_foreach(v, i, p) {
        if (!json_is_object(p))
            return rc_pbad_type(e, p, output ? "internally tagged enum ResponsesOutputContent"
                                             : "internally tagged enum ResponsesContentBlock");
        json_t *ty = json_object_get(p, "type");
        if (!ty) return rc_pmissing(e, "type");
        if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
        const char *t = json_string_value(ty);
        int text = !strcmp(t, "input_text") || (!output && !strcmp(t, "output_text"));
        if (!text && strcmp(t, "input_image") && strcmp(t, "input_file"))
            return rc_punknown_variant(e, t, output ? "`input_text`, `input_image`, `input_file`" : CONTENT_TYPES);
        if (text) {
            json_t *tx = json_object_get(p, "text");
            if (!tx) return rc_pmissing(e, "text");
            if (!json_is_string(tx)) return rc_pbad_type(e, tx, "a string");
        }
    }
    return 0;
}

/* string fields of an item, in input order, then the required ones */
static int deser_fields(const json_t *it, const char *const *req, size_t nreq, rc_api_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)it, k, v) {
        for (size_t q = 0; q < nreq; q++)
            if (!strcmp(k, req[q]) && !json_is_string(v)) return rc_pbad_type(e, v, "a string");
        if (!strcmp(k, "namespace") && !json_is_string(v) && !json_is_null(v)) return rc_pbad_type(e, v, "a string");
    }
    for (size_t q = 0; q < nreq; q++)
        if (!json_object_get(it, req[q])) return rc_pmissing(e, req[q]);
    return 0;
}

static int deser_item(const json_t *it, rc_api_error *e) {
    if (!json_is_object(it)) return rc_pfail(e, "invalid request body: invalid input item");
    json_t *ty = json_object_get(it, "type"), *role = json_object_get(it, "role");
    if (!ty && !role) return rc_pfail(e, "invalid request body: invalid input item");
    if (ty && !json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
    const char *t = ty ? json_string_value(ty) : "message";
    if (!strcmp(t, "message")) {
        if (!role) return rc_pmissing(e, "role");
        if (!json_is_string(role)) return rc_pbad_type(e, role, "string or map");
        const char *r = json_string_value(role);
        if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
            return rc_punknown_variant(e, r, "`user`, `assistant`, `system`, `developer`");
        json_t *c = json_object_get(it, "content");
        if (!c) return rc_pmissing(e, "content");
        if (json_is_string(c)) return 0;
        if (!json_is_array(c))
            return rc_pfail(e, "invalid request body: content should be a string or a list of content blocks");
        return deser_parts(c, 0, e);
    }
    if (!strcmp(t, "function_call")) {
        static const char *const R[] = {"call_id", "name", "arguments"};
        return deser_fields(it, R, 3, e);
    }
    if (!strcmp(t, "custom_tool_call")) {
        static const char *const R[] = {"call_id", "name", "input"};
        return deser_fields(it, R, 3, e);
    }
    if (!strcmp(t, "function_call_output") || !strcmp(t, "custom_tool_call_output")) {
        json_t *id = json_object_get(it, "call_id"), *o = json_object_get(it, "output");
        if (id && !json_is_string(id)) return rc_pbad_type(e, id, "a string");
        if (!o) return rc_pmissing(e, "output");
        if (json_is_string(o)) return 0;
        if (!json_is_array(o))
            return rc_pfail(e, "invalid request body: output should be a string or a list of output content parts");
        return deser_parts(o, 1, e);
    }
    if (!strcmp(t, "reasoning")) {
        json_t *c = json_object_get(it, "content");
        if (!c || json_is_null(c)) return 0;
        if (!json_is_array(c)) return rc_pbad_type(e, c, "a sequence");
        size_t i;
        json_t *p;
        json_array_foreach(c, i, p) {
            if (!json_is_object(p)) return rc_pbad_type(e, p, "struct ResponsesReasoningContent");
            json_t *tx = json_object_get(p, "text");
            if (!tx) return rc_pmissing(e, "text");
            if (!json_is_string(tx)) return rc_pbad_type(e, tx, "a string");
        }
    }
    return 0; /* unknown item types are ignored */
}

static int deser_fn_tool(const json_t *t, rc_api_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)t, k, v) {
        if ((!strcmp(k, "name")) && !json_is_string(v)) return rc_pbad_type(e, v, "a string");
        if (!strcmp(k, "description") && !json_is_string(v) && !json_is_null(v)) return rc_pbad_type(e, v, "a string");
        if (!strcmp(k, "strict") && !json_is_boolean(v) && !json_is_null(v)) return rc_pbad_type(e, v, "a boolean");
    }
    if (!json_object_get(t, "name")) return rc_pmissing(e, "name");
    return 0;
}

static int deser_tool(const json_t *t, rc_api_error *e) {
    if (!json_is_object(t)) return rc_pbad_type(e, t, "internally tagged enum ResponsesTool");
    json_t *ty = json_object_get(t, "type");
    if (!ty) return rc_pmissing(e, "type");
    if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
    const char *tt = json_string_value(ty);
    if (!strcmp(tt, "function") || !strcmp(tt, "custom")) return deser_fn_tool(t, e);
    if (!strcmp(tt, "namespace")) {
        json_t *nm = json_object_get(t, "name"), *in = json_object_get(t, "tools");
        if (nm && !json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
        if (in && !json_is_array(in)) return rc_pbad_type(e, in, "a sequence");
        if (!nm) return rc_pmissing(e, "name");
        if (!in) return rc_pmissing(e, "tools");
        size_t i;
        json_t *x;
        json_array_foreach(in, i, x) if (deser_tool(x, e)) return -1;
    }
    return 0;
}

static int deser_body(const json_t *body, rc_api_error *e) {
    if (json_is_array(body)) {
        json_t *first = json_array_get(body, 0);
        if (first && !json_is_string(first)) return rc_pbad_type(e, first, "a string");
        json_t *second = json_array_get(body, 1);
        if (second && !json_is_string(second) && !json_is_array(second) && !json_is_null(second))
            return rc_pfail(e, "invalid request body: input should be a string or a list of input items");
        return rc_pfail(e, "invalid request body: invalid length %zu, expected struct ResponsesRequest with 13 elements",
                        json_array_size(body));
    }
    if (!json_is_object(body)) return rc_pbad_type(e, body, "struct ResponsesRequest");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (!strcmp(key, "model")) {
            if (!json_is_string(v)) return rc_pbad_type(e, v, "a string");
        } else if (!strcmp(key, "input")) {
            if (json_is_null(v) || json_is_string(v)) continue;
            if (!json_is_array(v))
                return rc_pfail(e, "invalid request body: input should be a string or a list of input items");
            size_t i;
            json_t *it;
            json_array_foreach(v, i, it) if (deser_item(it, e)) return -1;
        } else if (!strcmp(key, "instructions")) {
            if (!json_is_null(v) && !json_is_string(v)) return rc_pbad_type(e, v, "a string");
        } else if (!strcmp(key, "max_output_tokens")) {
            if (rc_pcheck_uint(e, v, 32)) return -1;
        } else if (!strcmp(key, "temperature") || !strcmp(key, "top_p")) {
            if (!json_is_null(v) && !json_is_number(v)) return rc_pbad_type(e, v, "f32");
        } else if (!strcmp(key, "top_logprobs")) {
            if (json_is_null(v)) continue;
            if (!json_is_integer(v)) return rc_pbad_type(e, v, "u8");
            long long x = json_integer_value(v);
            if (x < 0 || x > 255)
                return rc_pfail(e, "invalid request body: invalid value: integer `%lld`, expected u8", x);
        } else if (!strcmp(key, "stream")) {
            if (!json_is_null(v) && !json_is_boolean(v)) return rc_pbad_type(e, v, "a boolean");
        } else if (!strcmp(key, "reasoning")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "struct ResponsesReasoningConfig");
            json_t *ef = json_object_get(v, "effort");
            if (!ef || json_is_null(ef)) continue;
            if (rc_pcheck_effort(ef, e)) return -1;
        } else if (!strcmp(key, "text")) {
            if (json_is_null(v)) continue;
            if (!json_is_object(v)) return rc_pbad_type(e, v, "struct ResponsesTextConfig");
            json_t *f = json_object_get(v, "format");
            if (!f || json_is_null(f)) continue;
            if (!json_is_object(f)) return rc_pbad_type(e, f, "internally tagged enum ResponsesTextFormat");
            json_t *ty = json_object_get(f, "type");
            if (!ty) return rc_pmissing(e, "type");
            if (!json_is_string(ty)) return rc_pbad_type(e, ty, "variant identifier");
            const char *t = json_string_value(ty);
            if (!strcmp(t, "json_schema")) {
                json_t *nm = json_object_get(f, "name");
                if (nm && !json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
                if (!nm) return rc_pmissing(e, "name");
                if (!json_object_get(f, "schema")) return rc_pmissing(e, "schema");
            } else if (strcmp(t, "text") && strcmp(t, "json_object")) {
                return rc_punknown_variant(e, t, "`text`, `json_schema`, `json_object`");
            }
        } else if (!strcmp(key, "tools")) {
            if (json_is_null(v)) continue;
            if (!json_is_array(v)) return rc_pbad_type(e, v, "a sequence");
            size_t i;
            json_t *t;
            json_array_foreach(v, i, t) if (deser_tool(t, e)) return -1;
        } else if (!strcmp(key, "tool_choice")) {
            if (json_is_null(v)) continue;
            static const char *const BAD = "invalid request body: expected one of `none`, `auto`, `required` or a tool "
                                           "choice object";
            if (json_is_string(v)) {
                const char *t = json_string_value(v);
                if (strcmp(t, "none") && strcmp(t, "auto") && strcmp(t, "required")) return rc_pfail(e, "%s", BAD);
            } else if (json_is_object(v)) {
                json_t *ty = json_object_get(v, "type");
                if (!json_is_string(ty)) return rc_pfail(e, "%s", BAD);
                const char *t = json_string_value(ty);
                if (!strcmp(t, "function") || !strcmp(t, "custom")) {
                    json_t *nm = json_object_get(v, "name");
                    if (!nm) return rc_pmissing(e, "name");
                    if (!json_is_string(nm)) return rc_pbad_type(e, nm, "a string");
                } else if (strcmp(t, "web_search") && strcmp(t, "web_search_2025_08_26")) {
                    return rc_punknown_variant(e, t, "`function`, `web_search`, `web_search_2025_08_26`, `custom`");
                }
            } else {
                return rc_pfail(e, "%s", BAD);
            }
        }
    }
    if (!json_object_get(body, "model")) return rc_pmissing(e, "model");
    return 0;
}

/* ------------------------------------------------------------------ tools */

static const char APPLY_PATCH_DESC[] =
    "Use the `apply_patch` tool to edit files.\n"
    "Your patch language is a stripped\342\200\221down, file\342\200\221oriented diff format designed"
    " to be easy to parse and safe to apply. You can think of it as a high\342\200\221level envelope:"
    "\n"
    "*** Begin Patch\n"
    "[ one or more file sections ]\n"
    "*** End Patch\n"
    "\n"
    "Within that envelope, you get a sequence of file operations.\n"
    "You MUST include a header to specify the action you are taking.\n"
    "Each operation starts with one of three headers:\n"
    "\n"
    "*** Add File: <path> - create a new file. Every following line is a + line (the initial contents"
    ").\n"
    "*** Delete File: <path> - remove an existing file. Nothing follows.\n"
    "*** Update File: <path> - patch an existing file in place (optionally with a rename).\n"
    "\n"
    "May be immediately followed by *** Move to: <new path> if you want to rename the file.\n"
    "Then one or more \342\200\234hunks\342\200\235, each introduced by @@ (optionally followed by a "
    "hunk header).\n"
    "Within a hunk each line starts with:\n"
    "\n"
    "For instructions on [context_before] and [context_after]:\n"
    "- By default, show 3 lines of code immediately above and 3 lines immediately below each change. "
    "If a change is within 3 lines of a previous change, do NOT duplicate the first change\342\200\231"
    "s [context_after] lines in the second change\342\200\231s [context_before] lines.\n"
    "- If 3 lines of context is insufficient to uniquely identify the snippet of code within the file"
    ", use the @@ operator to indicate the class or function to which the snippet belongs. For instan"
    "ce, we might have:\n"
    "@@ class BaseClass\n"
    "[3 lines of pre-context]\n"
    "- [old_code]\n"
    "+ [new_code]\n"
    "[3 lines of post-context]\n"
    "\n"
    "- If a code block is repeated so many times in a class or function such that even a single `@@` "
    "statement and 3 lines of context cannot uniquely identify the snippet of code, you can use multi"
    "ple `@@` statements to jump to the right context. For instance:\n"
    "\n"
    "@@ class BaseClass\n"
    "@@ \t def method():\n"
    "[3 lines of pre-context]\n"
    "- [old_code]\n"
    "+ [new_code]\n"
    "[3 lines of post-context]\n"
    "\n"
    "The full grammar definition is below:\n"
    "Patch := Begin { FileOp } End\n"
    "Begin := \"*** Begin Patch\" NEWLINE\n"
    "End := \"*** End Patch\" NEWLINE\n"
    "FileOp := AddFile | DeleteFile | UpdateFile\n"
    "AddFile := \"*** Add File: \" path NEWLINE { \"+\" line NEWLINE }\n"
    "DeleteFile := \"*** Delete File: \" path NEWLINE\n"
    "UpdateFile := \"*** Update File: \" path NEWLINE [ MoveTo ] { Hunk }\n"
    "MoveTo := \"*** Move to: \" newPath NEWLINE\n"
    "Hunk := \"@@\" [ header ] NEWLINE { HunkLine } [ \"*** End of File\" NEWLINE ]\n"
    "HunkLine := (\" \" | \"-\" | \"+\") text NEWLINE\n"
    "\n"
    "A full patch can combine several operations:\n"
    "\n"
    "*** Begin Patch\n"
    "*** Add File: hello.txt\n"
    "+Hello world\n"
    "*** Update File: src/app.py\n"
    "*** Move to: src/main.py\n"
    "@@ def greet():\n"
    "-print(\"Hi\")\n"
    "+print(\"Hello, world!\")\n"
    "*** Delete File: obsolete.txt\n"
    "*** End Patch\n"
    "\n"
    "It is important to remember:\n"
    "\n"
    "- You must include a header with your intended action (Add/Delete/Update)\n"
    "- You must prefix new lines with `+` even when creating a new file\n"
    "- File references can only be relative, NEVER ABSOLUTE.\n"
    ;

static int name_taken(const rc_conversation *c, const char *n) {
    for (size_t q = 0; q < c->ntools; q++)
        if (!strcmp(c->tools[q].name.s, n)) return 1;
    return 0;
}

static int bad_name(rc_api_error *e, const char *where, const char *name) {
    size_t nl = strlen(name);
    if (nl == 0)
        return rc_pfail(e, "Invalid '%s.name': empty string. Expected a string with minimum length 1, but got an "
                        "empty string instead.", where);
    if (nl > 128)
        return rc_pfail(e, "Invalid '%s.name': string too long. Expected a string with maximum length 128, but got a "
                        "string with length %zu instead.", where, nl);
    if (!rc_pvalid_tool_name(name, nl))
        return rc_pfail(e, "Invalid '%s.name': string does not match pattern. Expected a string that matches the "
                        "pattern '^[a-zA-Z0-9_-]+$'.", where);
    return 0;
}

/* one function tool -> conv->tools (name already final) */
static int add_fn(rc_conversation *c, const json_t *t, const char *name, int *nstrict, rc_api_error *e) {
    rc_tool_def *d = &c->tools[c->ntools++];
    if (rc_str_set(&d->name, name, strlen(name))) return OOM(e);
    json_t *desc = json_object_get(t, "description");
    d->has_description = 1;
    if (rc_str_set(&d->description, json_is_string(desc) ? json_string_value(desc) : "",
                   json_is_string(desc) ? json_string_length(desc) : 0))
        return OOM(e);
    json_t *params = json_object_get(t, "parameters");
    if (params && !json_is_null(params)) {
        char msg[700];
        if (rc_pschema_check(params, msg, sizeof msg))
            return rc_pfail(e, "Invalid schema for function '%s': %s", name, msg);
        json_t *pt = json_object_get(params, "type");
        if (!json_is_object(params) || !json_is_string(pt) || strcmp(json_string_value(pt), "object")) {
            char *g = pt ? json_dumps(pt, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
            rc_pfail(e, "Invalid schema for function '%s': schema must be a JSON Schema of 'type: \"object\"', got "
                     "'type: %s'.", name, g ? g : "null");
            free(g);
            return -1;
        }
        d->parameters = json_incref(params);
    } else {
        d->parameters = json_object();
    }
    if (json_is_true(json_object_get(t, "strict"))) {
        ++*nstrict;
        json_t *st = rc_pstrict_schema(d->parameters, 1, e);
        json_decref(d->parameters);
        d->parameters = st;
        if (!st) return -1;
    }
    return 0;
}

static int convert_tools(const json_t *tools, rc_conversation *c, int *nstrict, rc_api_error *e) {
    size_t n = 0, i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *in = json_object_get(t, "tools");
        n += 1 + json_array_size(in);
    }
    c->tools = calloc(n + 1, sizeof *c->tools);
    if (!c->tools) return OOM(e);
    char where[64];
    /* names first */
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        snprintf(where, sizeof where, "tools[%zu]", i);
        if (!strcmp(ty, "function") || !strcmp(ty, "namespace")) {
            if (bad_name(e, where, name)) return -1;
        } else if (!strcmp(ty, "custom") && strcmp(name, "apply_patch")) {
            return rc_pfail(e, "Unsupported custom tool: '%s'. Only 'apply_patch' is supported.", name);
        }
        if (!strcmp(ty, "namespace")) {
            size_t j;
            json_t *x;
            json_t *in = json_object_get(t, "tools");
            json_array_foreach(in, j, x) {
                const char *xt = json_string_value(json_object_get(x, "type"));
                const char *xn = json_string_value(json_object_get(x, "name"));
                if (!strcmp(xt, "custom"))
                    return rc_pfail(e, "Currently custom tools are not allowed inside a namespace. Found custom tool "
                                    "'%s' in tools[%zu].tools[%zu].", xn, i, j);
                snprintf(where, sizeof where, "tools[%zu].tools[%zu]", i, j);
                if (!strcmp(xt, "function") && bad_name(e, where, xn)) return -1;
                for (size_t q = 0; q < j; q++)
                    if (!strcmp(xn, json_string_value(json_object_get(json_array_get(in, q), "name"))))
                        return rc_pfail(e, "Tool names within a namespace must be unique.");
            }
        }
    }
    for (size_t a = 0; a < json_array_size(tools); a++)
        for (size_t b = 0; b < a; b++) {
            json_t *ta = json_array_get(tools, a), *tb = json_array_get(tools, b);
            const char *xa = json_string_value(json_object_get(ta, "type")),
                       *xb = json_string_value(json_object_get(tb, "type"));
            if ((!strcmp(xa, "function") || !strcmp(xa, "custom")) && (!strcmp(xb, "function") || !strcmp(xb, "custom")) &&
                !strcmp(json_string_value(json_object_get(ta, "name")), json_string_value(json_object_get(tb, "name"))))
                return rc_pfail(e, "Tool names must be unique.");
        }
    json_array_foreach(tools, i, t) {
        const char *ty = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!strcmp(ty, "function")) {
            if (add_fn(c, t, name, nstrict, e)) return -1;
        } else if (!strcmp(ty, "custom")) {
            rc_tool_def *d = &c->tools[c->ntools++];
            d->has_description = 1;
            d->parameters = json_loads("{\"type\": \"object\", \"additionalProperties\": false, \"properties\": "
                                       "{\"input\": {\"type\": \"string\", \"description\": \"The entire contents of "
                                       "the apply_patch command (the *** Begin Patch ... *** End Patch "
                                       "envelope).\"}}, \"required\": [\"input\"]}",
                                       JSON_DECODE_ANY, NULL);
            /* DeepSeek-V4.1-Flash's text has one more blank line after "envelope:" */
            const char *cut = strstr(APPLY_PATCH_DESC, "envelope:\n") + 10;
            size_t head = g_flash ? (size_t)(cut - APPLY_PATCH_DESC) : sizeof APPLY_PATCH_DESC - 1;
            if (rc_str_set(&d->name, "apply_patch", 11) || rc_str_set(&d->description, APPLY_PATCH_DESC, head) ||
                (g_flash && (rc_str_append(&d->description, "\n", 1) ||
                             rc_str_append(&d->description, cut, strlen(cut)))) ||
                !d->parameters)
                return OOM(e);
        } else if (!strcmp(ty, "namespace")) {
            size_t j;
            json_t *x;
            json_array_foreach(json_object_get(t, "tools"), j, x) {
                if (strcmp(json_string_value(json_object_get(x, "type")), "function")) continue;
                char base[600], nm[640];
                snprintf(base, sizeof base, "%s%s%s", name, g_flash ? "::" : "__",
                         json_string_value(json_object_get(x, "name")));
                snprintf(nm, sizeof nm, "%s", base);
                /* plain function names are reserved; later duplicates get _1, _2, ... */
                for (int sfx = 1;; sfx++) {
                    int clash = name_taken(c, nm);
                    size_t q;
                    json_t *o;
                    json_array_foreach(tools, q, o) {
                        const char *ot = json_string_value(json_object_get(o, "type"));
                        if ((!strcmp(ot, "function") || !strcmp(ot, "custom")) &&
                            !strcmp(json_string_value(json_object_get(o, "name")), nm))
                            clash = 1;
                    }
                    if (!clash) break;
                    snprintf(nm, sizeof nm, "%s_%d", base, sfx);
                }
                if (add_fn(c, x, nm, nstrict, e)) return -1;
                const char *nd = json_string_value(json_object_get(t, "description"));
                if (g_flash && nd && *nd) {
                    rc_str *d = &c->tools[c->ntools - 1].description;
                    rc_str full = {0};
                    if (rc_str_set(&full, nd, strlen(nd)) || rc_str_append(&full, "\n", 1) ||
                        rc_str_append(&full, d->s, d->n))
                        return OOM(e);
                    free(d->s);
                    *d = full;
                }
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ input items */

/* message content / tool output: a string or parts joined "\n\n" */
static int parts_text(const json_t *c, rc_str *out) {
    if (rc_str_set(out, "", 0)) return -1;
    if (json_is_string(c)) return rc_str_set(out, json_string_value(c), json_string_length(c));
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *t = json_string_value(json_object_get(p, "type"));
        json_t *tx = json_object_get(p, "text");
        const char *s = json_is_string(tx) && strstr(t, "_text") ? json_string_value(tx)
                        : !strcmp(t, "input_file")                 ? "[Unsupported Document]"
                                                                   : "[Unsupported Image]";
        size_t n = json_is_string(tx) && strstr(t, "_text") ? json_string_length(tx) : strlen(s);
        if ((i && rc_str_append(out, "\n\n", 2)) || rc_str_append(out, s, n)) return -1;
    }
    return 0;
}

typedef struct {
    rc_tool_call call;
    rc_str output;
    int answered;
} pend_call;

typedef struct {
    pend_call *v;
    size_t n, cap;
    char **seen; /* every call_id of the request */
    size_t nseen, capseen;
    char **done; /* answered call_ids */
    size_t ndone, capdone;
} item_state;

static int push_id(char ***v, size_t *n, size_t *cap, const char *s) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        char **nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return -1;
        *v = nv;
        *cap = nc;
    }
    return ((*v)[(*n)++] = strdup(s)) ? 0 : -1;
}

static int has_id(char **v, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], s)) return 1;
    return 0;
}

static void free_state(item_state *st) {
    for (size_t i = 0; i < st->n; i++) {
        free(st->v[i].call.id.s);
        free(st->v[i].call.name.s);
        free(st->v[i].call.arguments.s);
        free(st->v[i].output.s);
    }
    free(st->v);
    for (size_t i = 0; i < st->nseen; i++) free(st->seen[i]);
    free(st->seen);
    for (size_t i = 0; i < st->ndone; i++) free(st->done[i]);
    free(st->done);
}

static int cmp_pend(const void *a, const void *b) {
    const rc_str *x = &((const pend_call *)a)->call.id, *y = &((const pend_call *)b)->call.id;
    size_t n = x->n < y->n ? x->n : y->n;
    int r = memcmp(x->s, y->s, n);
    return r ? r : (x->n > y->n) - (x->n < y->n);
}

static rc_message *last_plain_assistant(rc_conversation *c) {
    if (!c->nmsgs) return NULL;
    rc_message *m = &c->msgs[c->nmsgs - 1];
    return m->role == RC_ROLE_ASSISTANT && !m->ncalls ? m : NULL;
}

/* every pending call answered: attach the sorted calls, then the tool messages */
static int flush(rc_conversation *c, item_state *st, rc_api_error *e) {
    qsort(st->v, st->n, sizeof *st->v, cmp_pend);
    rc_message *a = last_plain_assistant(c);
    if (!a && !(a = rc_conv_push(c, RC_ROLE_ASSISTANT, "", 0))) return OOM(e);
    a->calls = calloc(st->n, sizeof *a->calls);
    if (!a->calls) return OOM(e);
    for (size_t i = 0; i < st->n; i++) {
        a->calls[a->ncalls++] = st->v[i].call;
        memset(&st->v[i].call, 0, sizeof st->v[i].call);
    }
    for (size_t i = 0; i < st->n; i++) {
        rc_message *t = rc_conv_push(c, RC_ROLE_TOOL, st->v[i].output.s, st->v[i].output.n);
        if (!t) return OOM(e);
        a = &c->msgs[c->nmsgs - 2 - i]; /* (push may move the array) */
        if (rc_str_set(&t->tool_call_id, a->calls[i].id.s, a->calls[i].id.n)) return OOM(e);
        free(st->v[i].output.s);
        st->v[i].output.s = NULL;
    }
    st->n = 0;
    return 0;
}

static int add_call(item_state *st, const json_t *it, int custom, size_t idx, rc_api_error *e) {
    const char *id = json_string_value(json_object_get(it, "call_id"));
    if (!*id)
        return rc_pfail(e, "Invalid 'input[%zu].call_id': empty string. Expected a string with minimum length 1, but "
                        "got an empty string instead.", idx);
    if (has_id(st->seen, st->nseen, id)) return rc_pfail(e, "Duplicate 'call_id': %s.", id);
    if (push_id(&st->seen, &st->nseen, &st->capseen, id)) return OOM(e);
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 4;
        pend_call *nv = realloc(st->v, nc * sizeof *nv);
        if (!nv) return OOM(e);
        st->v = nv;
        st->cap = nc;
    }
    pend_call *p = &st->v[st->n++];
    memset(p, 0, sizeof *p);
    const char *name = json_string_value(json_object_get(it, "name"));
    const char *ns = json_string_value(json_object_get(it, "namespace"));
    if (rc_str_set(&p->call.id, id, strlen(id))) return OOM(e);
    if (ns) {
        if (rc_str_set(&p->call.name, ns, strlen(ns)) || rc_str_append(&p->call.name, g_flash ? "::" : "__", 2) ||
            rc_str_append(&p->call.name, name, strlen(name)))
            return OOM(e);
    } else if (rc_str_set(&p->call.name, name, strlen(name))) {
        return OOM(e);
    }
    if (custom) {
        json_t *o = json_pack("{s:O}", "input", json_object_get(it, "input"));
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        int rc = s ? rc_str_set(&p->call.arguments, s, strlen(s)) : -1;
        free(s);
        if (rc) return OOM(e);
    } else {
        json_t *a = json_object_get(it, "arguments");
        if (rc_str_set(&p->call.arguments, json_string_value(a), json_string_length(a))) return OOM(e);
    }
    return 0;
}

static int add_output(item_state *st, rc_conversation *c, const json_t *it, size_t idx, rc_api_error *e) {
    const char *id = json_string_value(json_object_get(it, "call_id"));
    if (!id) id = "";
    if (!*id)
        return rc_pfail(e, "Invalid 'input[%zu].call_id': empty string. Expected a string with minimum length 1, but "
                        "got an empty string instead.", idx);
    if (has_id(st->done, st->ndone, id)) return rc_pfail(e, "Duplicate tool output for call_id: %s.", id);
    pend_call *p = NULL;
    for (size_t i = 0; i < st->n; i++)
        if (!strcmp(st->v[i].call.id.s, id)) p = &st->v[i];
    if (!p) return rc_pfail(e, "No tool call found for tool output with call_id %s.", id);
    if (push_id(&st->done, &st->ndone, &st->capdone, id)) return OOM(e);
    p->answered = 1;
    if (parts_text(json_object_get(it, "output"), &p->output)) return OOM(e);
    for (size_t i = 0; i < st->n; i++)
        if (!st->v[i].answered) return 0;
    return flush(c, st, e);
}

static int unanswered(const item_state *st, rc_api_error *e) {
    for (size_t i = 0; i < st->n; i++)
        if (!st->v[i].answered) return rc_pfail(e, "No tool output found for tool call %s.", st->v[i].call.id.s);
    return 0;
}


static int add_message(rc_conversation *c, const json_t *it, rc_api_error *e) {
    const char *role = json_string_value(json_object_get(it, "role"));
    rc_str text = {0};
    if (parts_text(json_object_get(it, "content"), &text)) return OOM(e);
    int rc = 0;
    if (!strcmp(role, "assistant")) {
        rc_message *a = last_plain_assistant(c);
        if (!a) rc = rc_conv_push(c, RC_ROLE_ASSISTANT, text.s, text.n) ? 0 : -1;
        else if (text.n && a->content.n) rc = rc_str_append(&a->content, "\n\n", 2) || rc_str_append(&a->content, text.s, text.n);
        else if (text.n) rc = rc_str_set(&a->content, text.s, text.n);
    } else {
        rc = rc_conv_push(c, !strcmp(role, "system") || (g_flash && !strcmp(role, "developer")) ? RC_ROLE_SYSTEM : RC_ROLE_USER, text.s, text.n) ? 0 : -1;
    }
    free(text.s);
    return rc ? OOM(e) : 0;
}

static int add_reasoning(rc_conversation *c, const json_t *it, rc_api_error *e) {
    rc_str r = {0};
    size_t i;
    json_t *p;
    if (rc_str_set(&r, "", 0)) return OOM(e);
    json_array_foreach(json_object_get(it, "content"), i, p) {
        json_t *tx = json_object_get(p, "text");
        if ((i && rc_str_append(&r, "\n", 1)) || rc_str_append(&r, json_string_value(tx), json_string_length(tx))) {
            free(r.s);
            return OOM(e);
        }
    }
    int rc = 0;
    if (r.n) {
        rc_message *a = last_plain_assistant(c);
        if (a && !a->content.n) {
            if (a->has_reasoning && a->reasoning.n) rc = rc_str_append(&a->reasoning, "\n", 1);
            rc = rc || rc_str_append(&a->reasoning, r.s, r.n);
            a->has_reasoning = 1;
        } else if ((a = rc_conv_push(c, RC_ROLE_ASSISTANT, "", 0))) {
            a->has_reasoning = 1;
            rc = rc_str_set(&a->reasoning, r.s, r.n);
        } else {
            rc = -1;
        }
    }
    free(r.s);
    return rc ? OOM(e) : 0;
}

static int convert_items(const json_t *input, rc_conversation *c, rc_api_error *e) {
    item_state st = {0};
    size_t i;
    json_t *it;
    int rc = 0;
    json_array_foreach(input, i, it) {
        const char *t = json_string_value(json_object_get(it, "type"));
        if (!t) t = "message";
        if (!strcmp(t, "function_call") || !strcmp(t, "custom_tool_call")) {
            rc = add_call(&st, it, t[0] == 'c', i, e);
        } else if (!strcmp(t, "function_call_output") || !strcmp(t, "custom_tool_call_output")) {
            rc = add_output(&st, c, it, i, e);
        } else if (!strcmp(t, "message") || !strcmp(t, "reasoning")) {
            rc = unanswered(&st, e);
            if (!rc) rc = t[0] == 'm' ? add_message(c, it, e) : add_reasoning(c, it, e);
        }
        if (rc) break;
    }
    if (!rc) rc = unanswered(&st, e);
    free_state(&st);
    return rc;
}

/* ------------------------------------------------------------------ entry */

int rc_responses_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e) {
    memset(conv, 0, sizeof *conv);
    memset(inf, 0, sizeof *inf);
    if (deser_body(body, e)) return -1;
    const char *model = rc_pcheck_model(body, e);
    if (!model) return -1;
    g_flash = !strcmp(model, "DeepSeek-V4.1-Flash");
    json_t *v;
    if (rc_psampling(body, inf, e)) return -1;
    if ((v = json_object_get(body, "top_logprobs")) && !json_is_null(v) && json_integer_value(v) > 20)
        return rc_pfail(e, "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].");
    if ((v = json_object_get(body, "max_output_tokens")) && !json_is_null(v)) {
        long long x = json_integer_value(v);
        if (x < 1 || x > 393216) return rc_prange_fail(e, "max_tokens", "[1, 393216]");
        inf->max_tokens = x;
    }
    inf->stream = json_is_true(json_object_get(body, "stream"));

    /* thinking: reasoning.effort "none" -> off, anything else (or absent) -> on */
    conv->thinking = 1;
    rc_effort eff = RC_EFFORT_UNSET;
    const char *es = json_string_value(json_object_get(json_object_get(body, "reasoning"), "effort"));
    if (es) rc_pparse_effort(es, &conv->thinking, &eff);
    conv->effort = conv->thinking ? (eff == RC_EFFORT_UNSET ? RC_EFFORT_HIGH : eff) : RC_EFFORT_UNSET;

    int nstrict = 0;
    json_t *tools = json_object_get(body, "tools");
    if (json_is_array(tools) && convert_tools(tools, conv, &nstrict, e)) return -1;
    if (nstrict && nstrict != (int)conv->ntools)
        return rc_pfail(e, "Cannot use strict tool with non-strict tool in the same request");

    json_t *input = json_object_get(body, "input"), *ins = json_object_get(body, "instructions");
    if ((!input || json_is_null(input)) && (!ins || json_is_null(ins)))
        return rc_pfail(e, "Either input or instructions must be provided");
    if (json_is_array(input) && !json_array_size(input)) return rc_pfail(e, "Input items array must not be empty");
    if (json_string_length(ins) && !rc_conv_push(conv, RC_ROLE_SYSTEM, json_string_value(ins), json_string_length(ins)))
        return OOM(e);
    if (json_is_string(input)) {
        if (!rc_conv_push(conv, RC_ROLE_USER, json_string_value(input), json_string_length(input))) return OOM(e);
    } else if (json_is_array(input) && convert_items(input, conv, e)) {
        return -1;
    }

    /* tool_choice */
    conv->tool_choice = conv->ntools ? RC_CHOICE_AUTO : RC_CHOICE_NONE;
    json_t *tc = json_object_get(body, "tool_choice");
    int forced = 0;
    if (json_is_string(tc)) {
        const char *x = json_string_value(tc);
        if (!strcmp(x, "none")) conv->tool_choice = RC_CHOICE_NONE;
        else if (!strcmp(x, "required")) {
            forced = 1;
            if (conv->ntools) conv->tool_choice = RC_CHOICE_REQUIRED;
        }
    } else if (json_is_object(tc) && json_object_get(tc, "name") && conv->ntools) {
        const char *name = json_string_value(json_object_get(tc, "name"));
        forced = 1;
        if (rc_pkeep_tool(conv, name, e)) return -1;
    }
    if (forced && conv->thinking && conv->ntools) return rc_pfail(e, "Thinking mode does not support this tool_choice");

    /* text.format */
    json_t *fmt = json_object_get(json_object_get(body, "text"), "format");
    const char *ft = json_string_value(json_object_get(fmt, "type"));
    if (ft && strcmp(ft, "text")) {
        if (nstrict) return rc_pfail(e, "response_format should not be used with tools");
        if (!strcmp(ft, "json_object")) {
            conv->json_mode = 1;
            if (!rc_pmentions_json(conv))
                return rc_pfail(e, "Response input messages must contain the word 'json' in some form to use "
                                "'text.format' of type 'json_object'.");
        } else {
            json_t *schema = json_object_get(fmt, "schema");
            char msg[700];
            if (rc_pschema_check(schema, msg, sizeof msg)) return rc_pfail(e, "Invalid json schema: %s", msg);
            conv->json_schema = json_incref(schema);
        }
    }
    if (conv->tool_choice == RC_CHOICE_NONE) {
        for (size_t q = 0; q < conv->ntools; q++) rc_pfree_tool(&conv->tools[q]);
        conv->ntools = 0;
    }
    return 0;
}
