/* out.h - one interface for the three protocols' response writers.
 *
 * A writer turns stream events (stream.h) into what the server sends: SSE
 * events when streaming, one JSON body otherwise.  The server and the
 * `recipe parse` CLI pick a writer by API and drive it the same way:
 *   w = api->create(opts, request); api->start(w, out)   (streaming only)
 *   per backend chunk: rc_stream_feed(..., api->event, w); api->flush(w, out)
 *   at the end: rc_stream_finish(..., api->event, w);
 *               api->finish(w, reason, rc_stream_stop_sequence(stream), &usage, out)
 *   api->destroy(w) */
#ifndef RECIPE_OUT_H
#define RECIPE_OUT_H

#include <jansson.h>

#include "base/vec.h"
#include "recipe/chat_out.h"
#include "recipe/stream.h"

/* usage known at the end; reasoning_tokens < 0 when unknown
 * (text input: only token-id input says which tokens were reasoning) */
typedef struct {
    long long completion_tokens, reasoning_tokens;
    long long cached_tokens;   /* prompt tokens served from the prefix cache; < 0: the value given at create */
} rc_out_usage;

/* the options every writer gets (the Chat names are historical) */
typedef rc_chat_out_opts rc_out_opts;

typedef struct {
    const char *name; /* "chat", "responses", "messages" */
    /* request: the request body (writers that echo request fields read it) */
    void *(*create)(const rc_out_opts *o, const json_t *request);
    void (*destroy)(void *w);
    rc_event_fn event;
    int (*start)(void *w, rc_bytes *out);
    int (*flush)(void *w, rc_bytes *out);
    /* stop_sequence: the stop string that ended the output (rc_stream_stop_sequence), or NULL */
    int (*finish)(void *w, rc_finish reason, const char *stop_sequence, const rc_out_usage *usage, rc_bytes *out);
} rc_out_api;

extern const rc_out_api rc_out_chat, rc_out_responses, rc_out_messages;

#endif
