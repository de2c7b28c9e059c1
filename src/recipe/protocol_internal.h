/* protocol_internal.h - helpers shared by the API converters (internal). */
#ifndef RECIPE_PROTOCOL_INTERNAL_H
#define RECIPE_PROTOCOL_INTERNAL_H

#include "recipe/protocol.h"

/* fill e as a 400 invalid_request_error; returns -1 */
int rc_pfail(rc_api_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* serde wording: "invalid request body: invalid type: <v>, expected <expected>" */
int rc_pbad_type(rc_api_error *e, const json_t *v, const char *expected);
void rc_punexp(const json_t *v, char *buf, size_t n);
int rc_pmissing(rc_api_error *e, const char *field);
int rc_pcheck_uint(rc_api_error *e, const json_t *v, int bits);
int rc_prange_fail(rc_api_error *e, const char *field, const char *range);
int rc_pvalid_tool_name(const char *s, size_t n);
/* effort name -> thinking off ("none") or an effort; -1 if unknown */
int rc_pparse_effort(const char *s, int *thinking, rc_effort *eff);
void rc_pcopy_key(json_t *dst, const json_t *src, const char *k);
/* a strict tool's schema as the reference re-serialises it, or NULL + e */
json_t *rc_pstrict_schema(const json_t *in, int top, rc_api_error *e);
void rc_pfree_tool(rc_tool_def *t);
/* serde's "unknown variant `v`, expected one of <list>" */
int rc_punknown_variant(rc_api_error *e, const char *v, const char *list);
/* the subset of JSON-Schema checks whose messages the reference reports:
 * 0, or -1 with the message in msg */
int rc_pschema_check(const json_t *s, char *msg, size_t n);
/* the request's model if it is one the reference serves, else NULL + e */
const char *rc_pcheck_model(const json_t *body, rc_api_error *e);
/* a named tool_choice: keep only that tool and force a call, or fail */
int rc_pkeep_tool(rc_conversation *conv, const char *name, rc_api_error *e);
/* temperature in [0, 2] and top_p in (0, 1] (already type-checked) into inf */
int rc_psampling(const json_t *body, rc_inference *inf, rc_api_error *e);
/* a reasoning effort value as serde reads it */
int rc_pcheck_effort(const json_t *ef, rc_api_error *e);
/* "json" (ASCII case-insensitive) in any message content */
int rc_pmentions_json(const rc_conversation *c);

#endif
