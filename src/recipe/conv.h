/* conv.h - the protocol-neutral conversation every API request becomes, and
 * the prompt rendered from it.
 *
 * A Conversation owns all of its strings (malloc'd, NUL-terminated, length
 * kept) and JSON values (jansson references); rc_conv_free releases them.
 * The rendered prompt is one string plus the byte spans where the renderer
 * wrote an added (control) token: only those spans become control ids, all
 * other text is tokenized in content mode, so text from a request can never
 * turn into a control token (strategy C of the spec, §6.3). */
#ifndef RECIPE_CONV_H
#define RECIPE_CONV_H

#include <jansson.h>
#include <stddef.h>

#include "base/vec.h"
#include "recipe/tokenizer.h"

typedef struct {
    char *s;
    size_t n;
} rc_str;

typedef enum { RC_ROLE_SYSTEM, RC_ROLE_USER, RC_ROLE_ASSISTANT, RC_ROLE_TOOL, RC_ROLE_REMINDER } rc_role;
typedef enum { RC_CHOICE_NONE, RC_CHOICE_AUTO, RC_CHOICE_REQUIRED } rc_tool_choice;
typedef enum { RC_EFFORT_UNSET, RC_EFFORT_LOW, RC_EFFORT_HIGH, RC_EFFORT_XHIGH, RC_EFFORT_MAX } rc_effort;
typedef enum { RC_ENC_V4, RC_ENC_V41 } rc_encoding;

typedef struct {
    rc_str id, name, arguments;
} rc_tool_call;

typedef struct {
    rc_role role;
    rc_str content;
    rc_str reasoning; /* assistant; has_reasoning says if it was given */
    int has_reasoning;
    rc_tool_call *calls;
    size_t ncalls;
    rc_str tool_call_id; /* tool */
    int prefix;          /* assistant prefill: last message, continued by the model */
} rc_message;

typedef struct {
    rc_str name;
    rc_str description;
    int has_description;
    json_t *parameters; /* owned reference, may be NULL */
} rc_tool_def;

typedef struct {
    rc_message *msgs;
    size_t nmsgs, capmsgs;
    int thinking;
    rc_tool_def *tools;
    size_t ntools;
    rc_tool_choice tool_choice;
    rc_effort effort;
    int json_mode;         /* response_format json_object */
    json_t *json_schema;   /* response_format json_schema: its schema (owned), else NULL */
} rc_conversation;

void rc_conv_free(rc_conversation *c);
/* append a message (content copied); returns the new message or NULL */
rc_message *rc_conv_push(rc_conversation *c, rc_role role, const char *content, size_t n);
int rc_str_set(rc_str *d, const char *s, size_t n);
int rc_str_append(rc_str *d, const char *s, size_t n);

typedef struct {
    size_t off, len;
} rc_prompt_span;

typedef struct {
    rc_bytes text;
    rc_prompt_span *special; /* added tokens written by the renderer, in order */
    size_t nspecial, capspecial;
} rc_prompt;

void rc_prompt_free(rc_prompt *p);

/* Render c with encoding enc (V4 or V4.1).  c is normalised on a copy. */
int rc_render(const rc_conversation *c, rc_encoding enc, rc_prompt *out, rc_err *err);

/* Token ids of a rendered prompt: special spans -> their added-token ids,
 * everything between -> content mode.  RC_EINVAL if a span is not an added
 * token of tok (a renderer/tokenizer mismatch). */
int rc_prompt_tokens(const rc_prompt *p, const rc_tokenizer *tok, rc_pool *pool, rc_ids *out,
                     rc_err *err);

#endif
