/* messages_out.c - stream events -> messages API responses (SSE events or one body).
 * Not implemented yet: the writer produces an error body. */
#include <stdlib.h>
#include <string.h>

#include "recipe/out.h"

typedef struct {
    int stream;
} messages_w;

static void *w_create(const rc_out_opts *o, const json_t *request) {
    (void)request;
    messages_w *w = calloc(1, sizeof *w);
    if (w) w->stream = o->stream;
    return w;
}
static void w_destroy(void *w) { free(w); }
static void w_event(void *ctx, rc_event_kind k, const char *t, size_t n) {
    (void)ctx;
    (void)k;
    (void)t;
    (void)n;
}
static int w_start(void *w, rc_bytes *out) {
    (void)w;
    (void)out;
    return 0;
}
static int w_flush(void *w, rc_bytes *out) {
    (void)w;
    (void)out;
    return 0;
}
static int w_finish(void *w, rc_finish r, long long n, rc_bytes *out) {
    (void)w;
    (void)r;
    (void)n;
    const char *msg = "{\"error\":{\"message\":\"messages responses are not implemented yet\",\"type\":\"internal_error\","
                      "\"param\":null,\"code\":\"internal_error\"}}";
    return rc_bytes_append(out, msg, strlen(msg));
}

const rc_out_api rc_out_messages = {"messages", w_create, w_destroy, w_event, w_start, w_flush, w_finish};
