/* protocol.h - API requests -> rc_conversation, with the reference's errors.
 *
 * Each converter validates like deepseek-recipe 0.2.0 and, on failure,
 * fills an rc_api_error with the HTTP status and the message that goes into
 * {"error":{"message":M,"type":T,"param":null,"code":T}}. */
#ifndef RECIPE_PROTOCOL_H
#define RECIPE_PROTOCOL_H

#include <jansson.h>

#include "recipe/conv.h"

typedef struct {
    int status;        /* 400, 500 */
    const char *type;  /* "invalid_request_error", "internal_error" */
    char message[1024];
} rc_api_error;

/* parsing options the stream parser will need, filled by the converters */
typedef struct {
    int stream;
    long long max_tokens; /* 0 = unset */
    double temperature, top_p;
    int has_temperature, has_top_p;
    char **stop;
    size_t nstop;
} rc_inference;

void rc_inference_free(rc_inference *inf);

/* body: a parsed JSON object.  Returns 0 or -1 with e filled. */
int rc_chat_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e);

/* OpenAI Responses and Anthropic Messages requests (responses.c, messages.c) */
int rc_responses_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e);
int rc_messages_convert(const json_t *body, rc_conversation *conv, rc_inference *inf, rc_api_error *e);

/* The error body JSON (compact) for e, appended to out. */
int rc_api_error_json(const rc_api_error *e, rc_bytes *out);

#endif
