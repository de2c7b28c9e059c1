/* stream.h - model output -> reasoning / content / tool calls, incrementally.
 *
 * A byte-oriented state machine (spec recipe.md §5): each stage has ordered
 * marker matchers (KMP); bytes that could still be the start of a marker are
 * withheld, everything else is emitted at once, so output never depends on
 * how the backend chunked its text.  The stream turns bytes into output
 * events; the protocol layers (Chat, Responses, Messages) turn events into
 * SSE or response bodies.
 *
 * Lifecycle: rc_stream_new(opts) -> rc_stream_feed(...)* -> rc_stream_finish
 * -> rc_stream_free.  Events go to a callback; their text pointers are valid
 * only during the call. */
#ifndef RECIPE_STREAM_H
#define RECIPE_STREAM_H

#include <stddef.h>

typedef enum {
    RC_REASONING_NONE,      /* content from the start, leading newlines dropped */
    RC_REASONING_START,     /* thinking: reasoning first, leading newlines dropped */
    RC_REASONING_REASONING, /* reasoning, newlines kept */
    RC_REASONING_CONTENT,   /* content, newlines kept */
} rc_reasoning_stage;

typedef struct {
    int parse_tool_calls;      /* recognise DSML tool-call blocks */
    int tool_call_initial;     /* output starts inside a tool-call block (forced tool) */
    int json_output;           /* response_format json_object */
    rc_reasoning_stage reasoning;
    const char *const *stop;   /* stop sequences (non-empty) */
    size_t nstop;
} rc_stream_opts;

typedef enum {
    RC_EV_CONTENT,       /* text: content */
    RC_EV_REASONING,     /* text: reasoning */
    RC_EV_TOOL_CALL,     /* text: tool name; a new call starts */
    RC_EV_TOOL_ARGS,     /* text: a fragment of the current call's JSON arguments */
} rc_event_kind;

typedef void (*rc_event_fn)(void *ctx, rc_event_kind kind, const char *text, size_t n);

typedef enum {
    RC_FINISH_STOP,           /* backend stop (EOS) */
    RC_FINISH_LENGTH,
    RC_FINISH_CONTENT_FILTER,
    RC_FINISH_END_OF_STREAM,  /* backend ended without saying why */
    RC_FINISH_TOOL_CALLS,     /* derived: backend stop with at least one call */
    RC_FINISH_STOP_SEQUENCE,  /* derived: a stop sequence matched */
} rc_finish;

typedef struct rc_stream rc_stream;

rc_stream *rc_stream_new(const rc_stream_opts *opts);
void rc_stream_free(rc_stream *s);
/* Feed backend text.  Returns 1 once a stop sequence matched: the caller
 * stops reading the backend.  (After a closed tool-call block the output is
 * finished too, but the reference keeps reading and counting tokens.) */
int rc_stream_feed(rc_stream *s, const char *text, size_t n, rc_event_fn fn, void *ctx);
/* The same for text decoded from token ids: ends[k] is the end offset in
 * text of id k's bytes (ids without text repeat the previous end).  Lets
 * the stream count reasoning tokens: ids with some text emitted as
 * reasoning (rc_stream_reasoning_tokens).  n may be 0: the ids are noted,
 * no (empty) source chunk is created. */
int rc_stream_feed_ids(rc_stream *s, const char *text, size_t n, const size_t *ends, size_t nids, rc_event_fn fn,
                       void *ctx);
long long rc_stream_reasoning_tokens(const rc_stream *s);
/* End of backend output: flush withheld text; returns the final reason given
 * the backend's (stop sequence and tool calls take precedence over Stop). */
rc_finish rc_stream_finish(rc_stream *s, rc_finish backend, rc_event_fn fn, void *ctx);
/* the stop sequence that ended the output, or NULL */
const char *rc_stream_stop_sequence(const rc_stream *s);
int rc_stream_has_tool_calls(const rc_stream *s);
/* counters of skipped invalid output: stray </think>, text after the end */
void rc_stream_invalid_counts(const rc_stream *s, size_t *extra_end_think, size_t *after_finished);

#endif
