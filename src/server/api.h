/* api.h - the HTTP API: routes, the three generation endpoints, /v1/models,
 * /health and /metrics, glued to the codec (src/recipe) and the engine.
 *
 * A generation request goes: JSON body -> protocol converter (the reference's
 * validation and error bodies) -> DeepSeek prompt -> token ids -> engine.
 * Each generated id goes through rc_idfeed -> rc_stream -> the protocol's
 * writer -> SSE chunk (streaming) or, at the end, one JSON body.  A client
 * that goes away cancels its sequence within one engine step. */
#ifndef SERVER_API_H
#define SERVER_API_H

#include "engine/engine.h"
#include "recipe/conv.h"
#include "recipe/tokenizer.h"
#include "server/http.h"
#include "server/metrics.h"

struct kv_cache;

typedef struct {
    struct kv_cache *kv;      /* prefix cache (counters for /metrics), or NULL */
    const char *model_name;   /* reported in /v1/models and responses when the request has none */
    rc_encoding encoding;     /* V4 or V4.1 prompt format */
    int default_max_tokens;   /* when the request gives none (capped by the context) */
    int max_tokens_limit;     /* larger max_tokens -> 400 */
    int context_length;       /* prompt + output tokens per sequence */
    int log_requests;         /* one line per request on stderr */
    const char *backend_note; /* e.g. "scripted test backend" (NULL for the model) */
} srv_app_cfg;

typedef struct srv_app srv_app;

srv_app *srv_app_create(const srv_app_cfg *cfg, engine *eng, const rc_tokenizer *tok, srv_metrics *m);
void srv_app_set_http(srv_app *a, srv_http *h);
void srv_app_destroy(srv_app *a);
/* the srv_handler: arg is the srv_app */
void srv_app_handle(void *arg, srv_req *r);

#endif
