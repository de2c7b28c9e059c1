/* protocol_common.c - validation helpers shared by the three API converters
 * (chat.c, responses.c, messages.c): the reference's error wording (serde's
 * "invalid type: X, expected Y"), number ranges, tool names, effort names,
 * strict tool schemas, the JSON-mode gate. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol_internal.h"
#include "recipe/pyjson.h"

int rc_pfail(rc_api_error *e, const char *fmt, ...) {
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

int rc_pvalid_tool_name(const char *s, size_t n) {
    if (n < 1 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int rc_pparse_effort(const char *s, int *thinking, rc_effort *eff) {
    if (!strcmp(s, "none")) *thinking = 0;
    else if (!strcmp(s, "minimal") || !strcmp(s, "low")) *eff = RC_EFFORT_LOW;
    else if (!strcmp(s, "medium") || !strcmp(s, "high")) *eff = RC_EFFORT_HIGH;
    else if (!strcmp(s, "xhigh")) *eff = RC_EFFORT_XHIGH;
    else if (!strcmp(s, "max") || !strcmp(s, "ultra")) *eff = RC_EFFORT_MAX;
    else return -1;
    return 0;
}

void rc_punexp(const json_t *v, char *buf, size_t n) {
    switch (json_typeof(v)) {
    case JSON_NULL: snprintf(buf, n, "null"); break;
    case JSON_TRUE: snprintf(buf, n, "boolean `true`"); break;
    case JSON_FALSE: snprintf(buf, n, "boolean `false`"); break;
    case JSON_INTEGER: snprintf(buf, n, "integer `%lld`", (long long)json_integer_value(v)); break;
    case JSON_REAL: {
        rc_bytes b = {0};
        rc_pyfloat(json_real_value(v), &b);
        snprintf(buf, n, "floating point `%s`", b.v ? b.v : "");
        rc_bytes_free(&b);
        break;
    }
    case JSON_STRING: snprintf(buf, n, "string \"%.200s\"", json_string_value(v)); break;
    case JSON_ARRAY: snprintf(buf, n, "sequence"); break;
    case JSON_OBJECT: snprintf(buf, n, "map"); break;
    }
}

int rc_pbad_type(rc_api_error *e, const json_t *v, const char *expected) {
    char u[300];
    rc_punexp(v, u, sizeof u);
    return rc_pfail(e, "invalid request body: invalid type: %s, expected %s", u, expected);
}

int rc_pmissing(rc_api_error *e, const char *field) {
    return rc_pfail(e, "invalid request body: missing field `%s`", field);
}

int rc_pcheck_uint(rc_api_error *e, const json_t *v, int bits) {
    const char *ty = bits == 32 ? "u32" : "u64";
    if (json_is_null(v) || (bits == 64 && rc_json_is_u64(v))) return 0;
    if (json_is_integer(v)) {
        long long x = json_integer_value(v);
        if (x < 0 || (bits == 32 && x > 4294967295LL))
            return rc_pfail(e, "invalid request body: invalid value: integer `%lld`, expected %s", x, ty);
        return 0;
    }
    return rc_pbad_type(e, v, ty);
}

void rc_pcopy_key(json_t *dst, const json_t *src, const char *k) {
    json_t *v = json_object_get(src, k);
    if (v && !json_is_null(v)) json_object_set(dst, k, v);
}

json_t *rc_pstrict_schema(const json_t *in, int top, rc_api_error *e) {
    static const char *const PFX = "Invalid tool parameters schema : ";
    if (!json_is_object(in)) {
        rc_pfail(e, "%sinvalid type: expected a map", PFX);
        return NULL;
    }
    json_t *out = json_object();
    json_t *ty = json_object_get(in, "type");
    if (json_object_get(in, "$ref")) {
        rc_pcopy_key(out, in, "$ref");
        return out;
    }
    if (json_object_get(in, "anyOf") && !ty) {
        json_t *arr = json_array(), *any = json_object_get(in, "anyOf");
        for (size_t k = 0; k < json_array_size(any); k++) {
            json_t *x = rc_pstrict_schema(json_array_get(any, k), 0, e);
            if (!x) goto bad_arr;
            json_array_append_new(arr, x);
        }
        json_object_set_new(out, "anyOf", arr);
        rc_pcopy_key(out, in, "description");
        return out;
    bad_arr:
        json_decref(arr);
        json_decref(out);
        return NULL;
    }
    if (!ty) {
        json_decref(out);
        rc_pfail(e, "%sone of `type`, `anyOf`, `$ref` field is required", PFX);
        return NULL;
    }
    json_object_set(out, "type", ty);
    const char *t = json_string_value(ty);
    if (!t) { /* a list of types */
        rc_pcopy_key(out, in, "description");
        return out;
    }
    if (!strcmp(t, "string")) {
        rc_pcopy_key(out, in, "description");
        rc_pcopy_key(out, in, "pattern");
        const char *f = json_string_value(json_object_get(in, "format"));
        if (f && strcmp(f, "email") && strcmp(f, "hostname") && strcmp(f, "ipv4") && strcmp(f, "ipv6") &&
            strcmp(f, "uuid")) {
            json_decref(out);
            rc_pfail(e, "%sunknown variant `%s`, expected one of `email`, `hostname`, `ipv4`, `ipv6`, `uuid`", PFX, f);
            return NULL;
        }
        rc_pcopy_key(out, in, "format");
        rc_pcopy_key(out, in, "enum");
    } else if (!strcmp(t, "number") || !strcmp(t, "integer")) {
        static const char *const keys[] = {"description", "default", "const", "minimum", "maximum",
                                           "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) rc_pcopy_key(out, in, keys[k]);
    } else if (!strcmp(t, "array")) {
        json_t *items = json_object_get(in, "items");
        if (!items) {
            json_decref(out);
            rc_pfail(e, "%smissing field `items`", PFX);
            return NULL;
        }
        json_t *x = rc_pstrict_schema(items, 0, e);
        if (!x) {
            json_decref(out);
            return NULL;
        }
        json_object_set_new(out, "items", x);
        rc_pcopy_key(out, in, "description");
    } else if (!strcmp(t, "object")) {
        json_t *props = json_object_get(in, "properties");
        if (!json_is_object(props)) {
            if (!top) {
                json_decref(out);
                rc_pfail(e, "An object with no properties is not allowed.");
                return NULL;
            }
            props = NULL;
        }
        if (json_is_true(json_object_get(in, "additionalProperties"))) {
            json_decref(out);
            rc_pfail(e, "additionalProperties should not be true");
            return NULL;
        }
        json_t *req = json_object_get(in, "required");
        size_t np = props ? json_object_size(props) : 0;
        if (req) {
            int ok = json_is_array(req) && json_array_size(req) == np;
            for (size_t i = 0; ok && i < json_array_size(req); i++)
                ok = json_is_string(json_array_get(req, i)) && props &&
                     json_object_get(props, json_string_value(json_array_get(req, i)));
            if (!ok) {
                json_decref(out);
                rc_pfail(e, "Required properties must match all properties in the object");
                return NULL;
            }
        }
        json_t *np_obj = json_object(), *all = json_array();
        const char *k;
        json_t *v;
        if (props) json_object_foreach(props, k, v) {
            json_t *x = rc_pstrict_schema(v, 0, e);
            if (!x) {
                json_decref(np_obj);
                json_decref(all);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(np_obj, k, x);
            json_array_append_new(all, json_string(k));
        }
        json_object_set_new(out, "properties", np_obj);
        json_object_set_new(out, "additionalProperties", json_false());
        if (req) {
            json_object_set(out, "required", req);
            json_decref(all);
        } else {
            json_object_set_new(out, "required", all);
        }
        rc_pcopy_key(out, in, "description");
    } else { /* boolean, null */
        rc_pcopy_key(out, in, "description");
    }
    return out;
}

int rc_prange_fail(rc_api_error *e, const char *field, const char *range) {
    return rc_pfail(e, "Invalid %s value, the valid range of %s is %s", field, field, range);
}

void rc_pfree_tool(rc_tool_def *t) {
    free(t->name.s);
    free(t->description.s);
    json_decref(t->parameters);
}

int rc_pmentions_json(const rc_conversation *c) {
    for (size_t i = 0; i < c->nmsgs; i++) {
        const rc_str *t = &c->msgs[i].content;
        for (size_t k = 0; k + 4 <= t->n; k++)
            if ((t->s[k] | 32) == 'j' && (t->s[k + 1] | 32) == 's' && (t->s[k + 2] | 32) == 'o' &&
                (t->s[k + 3] | 32) == 'n')
                return 1;
    }
    return 0;
}

int rc_punknown_variant(rc_api_error *e, const char *v, const char *list) {
    return rc_pfail(e, "invalid request body: unknown variant `%s`, expected one of %s", v, list);
}

/* a JSON-schema sanity check like the reference's validator (the subset it reports) */
int rc_pschema_check(const json_t *s, char *msg, size_t n) {
    static const char *const TYPES[] = {"array", "boolean", "integer", "null", "number", "object", "string"};
    if (!json_is_object(s) && !json_is_boolean(s)) {
        char *d = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
        snprintf(msg, n, "%s is not of types \"boolean\", \"object\"", d ? d : "?");
        free(d);
        return -1;
    }
    if (!json_is_object(s)) return 0;
    json_t *ty = json_object_get(s, "type");
    if (ty) {
        int ok = 1;
        if (json_is_string(ty)) {
            ok = 0;
            for (size_t k = 0; k < 7; k++) ok |= !strcmp(json_string_value(ty), TYPES[k]);
        } else if (json_is_array(ty)) {
            for (size_t i = 0; ok && i < json_array_size(ty); i++) {
                const char *t = json_string_value(json_array_get(ty, i));
                int one = 0;
                for (size_t k = 0; t && k < 7; k++) one |= !strcmp(t, TYPES[k]);
                ok = one;
            }
        } else {
            ok = 0;
        }
        if (!ok) {
            char *d = json_dumps(ty, JSON_COMPACT | JSON_ENCODE_ANY);
            snprintf(msg, n, "%s is not valid under any of the schemas listed in the 'anyOf' keyword", d ? d : "?");
            free(d);
            return -1;
        }
    }
    json_t *props = json_object_get(s, "properties");
    if (json_is_object(props)) {
        const char *k;
        json_t *v;
        json_object_foreach(props, k, v) if (rc_pschema_check(v, msg, n)) return -1;
    }
    json_t *items = json_object_get(s, "items");
    if (items && !json_is_array(items) && rc_pschema_check(items, msg, n)) return -1;
    return 0;
}

const char *rc_pcheck_model(const json_t *body, rc_api_error *e) {
    const char *model = json_string_value(json_object_get(body, "model"));
    if (model && (!strcmp(model, "DeepSeek-V4-Pro") || !strcmp(model, "DeepSeek-V4.1-Flash"))) return model;
    rc_pfail(e, "The supported API model names are DeepSeek-V4-Pro, DeepSeek-V4.1-Flash, but you passed %s.",
             model ? model : "");
    return NULL;
}

int rc_pkeep_tool(rc_conversation *conv, const char *name, rc_api_error *e) {
    size_t keep = SIZE_MAX;
    for (size_t q = 0; q < conv->ntools; q++)
        if (!strcmp(conv->tools[q].name.s, name)) keep = q;
    if (keep == SIZE_MAX)
        return rc_pfail(e, "Invalid value for 'tool_call': no function named '%s' was specified in the 'tools' "
                           "parameter.", name);
    rc_tool_def only = conv->tools[keep];
    for (size_t q = 0; q < conv->ntools; q++)
        if (q != keep) rc_pfree_tool(&conv->tools[q]);
    conv->tools[0] = only;
    conv->ntools = 1;
    conv->tool_choice = RC_CHOICE_REQUIRED;
    return 0;
}

int rc_psampling(const json_t *body, rc_inference *inf, rc_api_error *e) {
    json_t *v;
    if ((v = json_object_get(body, "temperature")) && !json_is_null(v)) {
        double t = json_number_value(v);
        if (!(t >= 0 && t <= 2)) return rc_prange_fail(e, "temperature", "[0, 2]");
        inf->temperature = t;
        inf->has_temperature = 1;
    }
    if ((v = json_object_get(body, "top_p")) && !json_is_null(v)) {
        double t = json_number_value(v);
        if (!(t > 0 && t <= 1)) return rc_prange_fail(e, "top_p", "(0, 1.0]");
        inf->top_p = t;
        inf->has_top_p = 1;
    }
    return 0;
}

int rc_pcheck_effort(const json_t *ef, rc_api_error *e) {
    if (!json_is_string(ef)) return rc_pbad_type(e, ef, "string or map");
    int th;
    rc_effort x;
    if (rc_pparse_effort(json_string_value(ef), &th, &x))
        return rc_punknown_variant(e, json_string_value(ef),
                                   "`none`, `minimal`, `low`, `medium`, `high`, `xhigh`, `ultra`, `max`");
    return 0;
}
