/* chat_out.h - stream events -> OpenAI Chat Completions responses.
 *
 * Streaming: rc_chat_out_event collects the events of one backend chunk,
 * rc_chat_out_flush writes them as SSE `data:` events; rc_chat_out_finish
 * writes the final chunk (finish_reason, usage) and `data: [DONE]`.
 * Non-streaming: events accumulate; rc_chat_out_finish writes one body. */
#ifndef RECIPE_CHAT_OUT_H
#define RECIPE_CHAT_OUT_H

#include "base/vec.h"
#include "recipe/stream.h"

typedef struct {
    const char *id;          /* completion id, e.g. "chatcmpl-..." */
    long long created;       /* unix seconds */
    const char *model;
    const char *fingerprint; /* system_fingerprint, NULL -> null */
    int thinking;            /* reasoning_content fields present in deltas */
    int reasoning_start;     /* parsing starts in reasoning: the body has reasoning_content */
    int content_continuation; /* thinking, but a prefill resumes in content */
    int deterministic;       /* tool-call ids with a fixed suffix instead of random */
    int stream;
    int include_usage;       /* every stream chunk carries "usage" */
    long long prompt_tokens, cached_tokens;
} rc_chat_out_opts;

typedef struct rc_chat_out rc_chat_out;

rc_chat_out *rc_chat_out_new(const rc_chat_out_opts *o);
void rc_chat_out_free(rc_chat_out *c);
/* an rc_event_fn: ctx is the rc_chat_out */
void rc_chat_out_event(void *ctx, rc_event_kind kind, const char *text, size_t n);
/* streaming: the first chunk (role) */
int rc_chat_out_start(rc_chat_out *c, rc_bytes *out);
/* streaming: write the events collected since the last flush */
int rc_chat_out_flush(rc_chat_out *c, rc_bytes *out);
int rc_chat_out_finish(rc_chat_out *c, rc_finish reason, long long completion_tokens, rc_bytes *out);

const char *rc_finish_name(rc_finish f);

#endif
