/* api.c - see api.h.
 *
 * Threads: srv_app_handle runs on the HTTP loop thread (parse, validate,
 * render, tokenize, submit); on_token/on_done run on the engine thread
 * (decode, parse the output, write SSE); the client-gone callback runs on the
 * loop thread and only calls eng_cancel.  A generation's state (struct gen)
 * is freed in on_done after its stream is closed or its response given: the
 * HTTP layer guarantees no callback of a closed stream/answered request runs
 * afterwards, and the engine guarantees nothing after on_done. */
#include "server/api.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "kv/cache.h"
#include "recipe/idfeed.h"
#include "recipe/out.h"
#include "recipe/protocol.h"
#include "recipe/pyjson.h"

struct srv_app {
    srv_app_cfg cfg;
    engine *eng;
    const rc_tokenizer *tok;
    srv_metrics *m;
    srv_http *http;
    atomic_ullong cancelled;
    atomic_ullong seq;
};

srv_app *srv_app_create(const srv_app_cfg *cfg, engine *eng, const rc_tokenizer *tok, srv_metrics *m)
{
    srv_app *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->cfg = *cfg;
    a->eng = eng;
    a->tok = tok;
    a->m = m;
    return a;
}

void srv_app_set_http(srv_app *a, srv_http *h) { a->http = h; }
void srv_app_destroy(srv_app *a) { free(a); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------------- errors */

static void respond_error(srv_app *a, srv_req *r, const char *api, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

static void respond_error(srv_app *a, srv_req *r, const char *api, int status, const char *type, const char *fmt, ...)
{
    rc_api_error e = {.status = status, .type = type};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    rc_bytes body = {0};
    rc_api_error_json(&e, &body);
    srv_respond(r, status, "application/json", body.v, body.n, NULL);
    rc_bytes_free(&body);
    srv_metrics_request(a->m, api, status);
}

/* -------------------------------------------------------------- generation */

typedef struct gen {
    srv_app *app;
    srv_req *r;
    srv_stream *st;
    const char *api_name;
    const rc_out_api *api;
    void *w;
    rc_stream *rs;
    rc_idfeed feed;
    json_t *body;
    rc_conversation conv;
    rc_inference inf;
    rc_ids prompt;
    eng_request er;
    int streaming, stop_hit;
    atomic_int client_gone;
    double t_arrival, t_last;
    uint64_t reqid;
    char id[64];
    rc_bytes out;
} gen;

static void gen_free(gen *g)
{
    if (g->w) g->api->destroy(g->w);
    if (g->rs) rc_stream_free(g->rs);
    rc_idfeed_free(&g->feed);
    json_decref(g->body);
    rc_conv_free(&g->conv);
    rc_inference_free(&g->inf);
    free(g->prompt.v);
    rc_bytes_free(&g->out);
    free(g);
}

static void on_client_gone(void *arg)
{
    gen *g = arg;
    atomic_store(&g->client_gone, 1);
    eng_cancel(g->app->eng, &g->er);
}

static void on_token(void *ctx, int32_t id)
{
    gen *g = ctx;
    double t = now_s();
    if (g->t_last > 0) srv_metrics_itl(g->app->m, t - g->t_last);
    else srv_metrics_ttft(g->app->m, t - g->t_arrival);
    g->t_last = t;
    if (g->stop_hit || atomic_load(&g->client_gone)) return;
    int done = rc_idfeed_push(&g->feed, g->rs, &id, 1, g->api->event, g->w);
    if (g->streaming) {
        g->out.n = 0;
        g->api->flush(g->w, &g->out);
        if (g->out.n && srv_stream_write(g->st, g->out.v, g->out.n) < 0) atomic_store(&g->client_gone, 1);
    }
    if (done) { /* a stop sequence matched: no more tokens are wanted */
        g->stop_hit = 1;
        eng_cancel(g->app->eng, &g->er);
    }
}

static const char *reason_name(eng_reason r)
{
    static const char *n[] = {"eos", "stop_id", "length", "context", "cancelled", "error"};
    return (unsigned)r < 6 ? n[r] : "?";
}

static void on_done(void *ctx, eng_reason why, size_t completion_tokens, const char *error)
{
    gen *g = ctx;
    srv_app *a = g->app;
    int gone = atomic_load(&g->client_gone);
    const int cancelled = why == ENG_CANCELLED && !g->stop_hit;
    const int status = cancelled ? 499 : why == ENG_ERROR ? 500 : 200;
    /* counted before the answer is queued: this runs on the engine thread, and
     * a client that reads /metrics right after its response (or its stream's
     * end) must find the request and its tokens counted */
    double t = now_s();
    srv_metrics_request(a->m, g->api_name, status);
    srv_metrics_tokens(a->m, g->prompt.n, g->er.cached_tokens, completion_tokens);
    srv_metrics_e2e(a->m, t - g->t_arrival);
    if (cancelled) {
        /* the client went away: nobody to answer */
        atomic_fetch_add(&a->cancelled, 1);
        if (g->streaming) srv_stream_close(g->st);
        else srv_respond(g->r, 499, "application/json", "{}", 2, NULL);
    } else if (why == ENG_ERROR) {
        rc_api_error e = {.status = 500, .type = "internal_error"};
        snprintf(e.message, sizeof e.message, "generation failed: %s", error ? error : "unknown error");
        g->out.n = 0;
        if (g->streaming) {
            rc_bytes_append(&g->out, "data: ", 6);
            rc_api_error_json(&e, &g->out);
            rc_bytes_append(&g->out, "\n\n", 2);
            srv_stream_write(g->st, g->out.v, g->out.n);
            srv_stream_close(g->st);
        } else {
            rc_api_error_json(&e, &g->out);
            srv_respond(g->r, 500, "application/json", g->out.v, g->out.n, NULL);
        }
    } else {
        rc_finish backend = (why == ENG_STOP_LENGTH || why == ENG_STOP_CONTEXT) ? RC_FINISH_LENGTH : RC_FINISH_STOP;
        rc_finish fin = rc_stream_finish(g->rs, backend, g->api->event, g->w);
        rc_out_usage usage = {rc_idfeed_completion_tokens(&g->feed), rc_stream_reasoning_tokens(g->rs),
                              (long long)g->er.cached_tokens};
        g->out.n = 0;
        g->api->finish(g->w, fin, rc_stream_stop_sequence(g->rs), &usage, &g->out);
        if (g->streaming) {
            if (!gone) srv_stream_write(g->st, g->out.v, g->out.n);
            srv_stream_close(g->st);
        } else {
            srv_respond(g->r, 200, "application/json", g->out.v, g->out.n, NULL);
        }
    }
    if (a->cfg.log_requests) {
        double gen_s = g->t_last > 0 && g->er.t_first_token > 0 ? t - g->er.t_first_token : 0;
        fprintf(stderr,
                "req %llu %s status=%d prompt=%zu cached=%zu cache=%s completion=%zu ttft=%.1fms tok/s=%.1f end=%s%s\n",
                (unsigned long long)g->reqid, g->api_name, status, g->prompt.n, g->er.cached_tokens,
                a->cfg.kv ? kv_path_name((kv_path)g->er.cache_path) : "off", completion_tokens,
                g->er.t_first_token > 0 ? (g->er.t_first_token - g->t_arrival) * 1e3 : 0.0,
                gen_s > 0 && completion_tokens > 1 ? (double)(completion_tokens - 1) / gen_s : 0.0, reason_name(why),
                g->stop_hit ? "+stop_sequence" : "");
    }
    gen_free(g);
}

typedef int (*convert_fn)(const json_t *, rc_conversation *, rc_inference *, rc_api_error *);

/* optional numeric field: 0 absent, 1 present and valid, -1 invalid (error sent) */
static int opt_num(srv_app *a, srv_req *r, const char *api, json_t *body, const char *key, double lo, double hi,
                   int integer, double *out)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || (integer && !json_is_integer(v))) {
        respond_error(a, r, api, 400, "invalid_request_error", "%s must be %s", key, integer ? "an integer" : "a number");
        return -1;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        respond_error(a, r, api, 400, "invalid_request_error", "%s must be between %g and %g, got %g", key, lo, hi, d);
        return -1;
    }
    *out = d;
    return 1;
}

static void generate(srv_app *a, srv_req *r, const char *api_name, const rc_out_api *api, convert_fn convert)
{
    const srv_req_info *ri = srv_req_info_of(r);
    const char *ct = srv_req_header(r, "content-type");
    if (!ct || strncasecmp(ct, "application/json", 16)) {
        respond_error(a, r, api_name, 415, "invalid_request_error",
                      "Content-Type must be application/json (got %s)", ct ? ct : "none");
        return;
    }
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        respond_error(a, r, api_name, 503, "server_error", "out of memory");
        return;
    }
    g->app = a;
    g->r = r;
    g->api = api;
    g->api_name = api_name;
    g->t_arrival = ri->t_arrival;
    g->reqid = ri->id;
    rc_idfeed_init(&g->feed, a->tok);
    json_error_t je;
    char syn[256];
    /* serde's wording for syntax errors, as the reference answers */
    if (rc_json_syntax_error(ri->body, ri->body_len, syn, sizeof syn)) {
        respond_error(a, r, api_name, 400, "invalid_request_error", "invalid JSON request: %s", syn);
        gen_free(g);
        return;
    }
    g->body = rc_json_loadb(ri->body, ri->body_len, JSON_DECODE_ANY, &je);
    rc_api_error e = {0};
    if (!g->body) {
        respond_error(a, r, api_name, 400, "invalid_request_error", "invalid JSON request: %s", je.text);
        gen_free(g);
        return;
    }
    /* The codec knows the official API's model names (they choose conversion
     * details); the name this server serves stands for the official name of
     * its prompt format.  Other names are refused by the converter, in the
     * reference's words, which list the accepted names. */
    const char *canonical = a->cfg.encoding == RC_ENC_V41 ? "DeepSeek-V4.1-Flash" : "DeepSeek-V4-Pro";
    json_t *mj = json_is_object(g->body) ? json_object_get(g->body, "model") : NULL;
    if (json_is_string(mj) && !strcmp(json_string_value(mj), a->cfg.model_name))
        json_object_set_new(g->body, "model", json_string(canonical));
    if (convert(g->body, &g->conv, &g->inf, &e)) {
        rc_bytes b = {0};
        rc_api_error_json(&e, &b);
        srv_respond(r, e.status, "application/json", b.v, b.n, NULL);
        srv_metrics_request(a->m, api_name, e.status);
        rc_bytes_free(&b);
        gen_free(g);
        return;
    }
    rc_prompt p;
    rc_err err = {0};
    if (rc_render(&g->conv, a->cfg.encoding, &p, &err)) {
        respond_error(a, r, api_name, 400, "invalid_request_error", "%s", err.msg);
        gen_free(g);
        return;
    }
    int rc = rc_prompt_tokens(&p, a->tok, NULL, &g->prompt, &err);
    rc_prompt_free(&p);
    if (rc) {
        respond_error(a, r, api_name, 500, "internal_error", "tokenizing the prompt failed: %s", err.msg);
        gen_free(g);
        return;
    }
    /* sampling */
    eng_sampling *s = &g->er.sampling;
    s->temperature = g->inf.has_temperature ? g->inf.temperature : 1.0;
    s->top_p = g->inf.has_top_p ? g->inf.top_p : 1.0;
    double d;
    int k;
    if ((k = opt_num(a, r, api_name, g->body, "top_k", -1, 1e9, 1, &d)) < 0) goto fail_sent;
    if (k) s->top_k = d < 0 ? 0 : (int)d;
    if ((k = opt_num(a, r, api_name, g->body, "min_p", 0, 1, 0, &d)) < 0) goto fail_sent;
    if (k) s->min_p = d;
    if ((k = opt_num(a, r, api_name, g->body, "seed", -9.3e18, 9.3e18, 1, &d)) < 0) goto fail_sent;
    if (k) {
        s->has_seed = 1;
        s->seed = (uint64_t)json_integer_value(json_object_get(g->body, "seed"));
    }
    /* prefix-cache namespace and traffic class (extensions; vLLM names the salt cache_salt) */
    json_t *salt = json_object_get(g->body, "cache_salt");
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt) || json_string_length(salt) > 256 || strlen(json_string_value(salt)) != json_string_length(salt)) {
            respond_error(a, r, api_name, 400, "invalid_request_error",
                          "cache_salt must be a string of at most 256 bytes without NUL");
            goto fail_sent;
        }
        g->er.cache_salt = json_string_value(salt);
    }
    {
        json_t *cc = json_object_get(g->body, "cache_class");
        const char *cls = cc && json_is_string(cc) ? json_string_value(cc) : srv_req_header(r, "x-cache-class");
        if (cc && !json_is_null(cc) && !json_is_string(cc)) cls = "";
        g->er.cache_class = g->conv.ntools > 0 ? KV_CLASS_AGENT : KV_CLASS_CHAT;
        if (cls) {
            if (!strcmp(cls, "agent")) g->er.cache_class = KV_CLASS_AGENT;
            else if (!strcmp(cls, "chat")) g->er.cache_class = KV_CLASS_CHAT;
            else {
                respond_error(a, r, api_name, 400, "invalid_request_error",
                              "cache_class must be \"agent\" or \"chat\" (body field or X-Cache-Class header)");
                goto fail_sent;
            }
        }
    }
    const long long ctx = a->cfg.context_length, np = (long long)g->prompt.n;
    if (np >= ctx) {
        respond_error(a, r, api_name, 400, "invalid_request_error",
                      "the prompt is %lld tokens; this server's context length is %lld tokens", np, ctx);
        gen_free(g);
        return;
    }
    long long mt = g->inf.max_tokens;
    if (mt > a->cfg.max_tokens_limit) {
        respond_error(a, r, api_name, 400, "invalid_request_error",
                      "max_tokens is %lld; this server allows at most %d", mt, a->cfg.max_tokens_limit);
        gen_free(g);
        return;
    }
    if (mt <= 0) mt = a->cfg.default_max_tokens;
    if (np + mt > ctx) {
        if (g->inf.max_tokens > 0) {
            respond_error(a, r, api_name, 400, "invalid_request_error",
                          "prompt (%lld tokens) + max_tokens (%lld) exceeds the context length (%lld)", np, mt, ctx);
            gen_free(g);
            return;
        }
        mt = ctx - np;
    }
    s->max_tokens = (int)mt;

    /* output side: the stream parser and the protocol writer */
    rc_reasoning_stage rs = g->conv.thinking ? RC_REASONING_START : RC_REASONING_NONE;
    const rc_message *lastm = g->conv.nmsgs ? &g->conv.msgs[g->conv.nmsgs - 1] : NULL;
    if (lastm && lastm->prefix && g->conv.thinking) {
        if (lastm->content.n) rs = RC_REASONING_CONTENT;
        else if (lastm->reasoning.n) rs = RC_REASONING_REASONING;
    }
    rc_stream_opts so = {
        .parse_tool_calls = g->conv.ntools > 0,
        .tool_call_initial = g->conv.tool_choice == RC_CHOICE_REQUIRED && g->conv.ntools > 0,
        .json_output = g->conv.json_mode,
        .reasoning = rs,
        .stop = (const char *const *)g->inf.stop,
        .nstop = g->inf.nstop,
    };
    g->rs = rc_stream_new(&so);
    g->streaming = g->inf.stream;
    static const char hx[] = "0123456789abcdef";
    uint64_t x = ri->id * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL) ^ atomic_fetch_add(&a->seq, 1);
    const char *prefix = api == &rc_out_messages ? "msg_" : "chatcmpl-";
    size_t pl = strlen(prefix);
    memcpy(g->id, prefix, pl);
    for (int i = 0; i < 24; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        g->id[pl + (size_t)i] = hx[x & 15];
    }
    json_t *so_opts = json_object_get(g->body, "stream_options");
    const char *model = json_string_value(json_object_get(g->body, "model"));
    rc_out_opts co = {
        .id = g->id,
        .created = (long long)time(NULL),
        .model = model ? model : a->cfg.model_name,
        .thinking = g->conv.thinking,
        .stream = g->streaming,
        .include_usage = !g->streaming || json_is_true(json_object_get(so_opts, "include_usage")),
        .reasoning_start = g->conv.thinking && rs != RC_REASONING_CONTENT,
        .content_continuation = g->conv.thinking && rs == RC_REASONING_CONTENT,
        .prompt_tokens = np,
        .cached_tokens = 0,
    };
    g->w = api->create(&co, g->body);
    if (!g->rs || !g->w) {
        respond_error(a, r, api_name, 503, "server_error", "out of memory");
        gen_free(g);
        return;
    }
    g->er.prompt = g->prompt.v;
    g->er.n_prompt = g->prompt.n;
    g->er.ctx = g;
    g->er.on_token = on_token;
    g->er.on_done = on_done;
    if (g->streaming) {
        g->st = srv_stream_open(r, 200, "text/event-stream", on_client_gone, g);
        if (!g->st) {
            respond_error(a, r, api_name, 503, "server_error", "cannot open a stream");
            gen_free(g);
            return;
        }
        g->api->start(g->w, &g->out);
        if (g->out.n) srv_stream_write(g->st, g->out.v, g->out.n);
    } else {
        srv_req_on_close(r, on_client_gone, g);
    }
    rc = eng_submit(a->eng, &g->er, &err);
    if (rc) {
        int status = rc == ENG_EBUSY ? 429 : rc == RC_EINVAL ? 400 : 503;
        rc_api_error fe = {.status = status,
                           .type = status == 429 ? "rate_limit_error" : status == 400 ? "invalid_request_error" : "server_error"};
        snprintf(fe.message, sizeof fe.message, "%s",
                 rc == ENG_EBUSY ? "the server is at capacity (request queue full); retry later" : err.msg);
        g->out.n = 0;
        rc_api_error_json(&fe, &g->out);
        if (g->streaming) {
            /* headers are out already: the error becomes the stream's only event */
            rc_bytes ev = {0};
            rc_bytes_append(&ev, "data: ", 6);
            rc_bytes_append(&ev, g->out.v, g->out.n);
            rc_bytes_append(&ev, "\n\n", 2);
            srv_stream_write(g->st, ev.v, ev.n);
            rc_bytes_free(&ev);
            srv_stream_close(g->st);
        } else {
            srv_respond(r, status, "application/json", g->out.v, g->out.n, NULL);
        }
        srv_metrics_request(a->m, api_name, status);
        gen_free(g);
    }
    return;
fail_sent:
    gen_free(g);
}

/* ------------------------------------------------------------------ routes */

static void models(srv_app *a, srv_req *r)
{
    json_t *j = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", a->cfg.model_name, "object",
                          "model", "created", (json_int_t)time(NULL), "owned_by",
                          a->cfg.backend_note ? a->cfg.backend_note : "deepinfer");
    char *s = json_dumps(j, JSON_COMPACT);
    srv_respond(r, 200, "application/json", s, strlen(s), NULL);
    free(s);
    json_decref(j);
    srv_metrics_request(a->m, "models", 200);
}

static void metrics(srv_app *a, srv_req *r)
{
    srv_gauges g = {0};
    eng_stats es;
    eng_get_stats(a->eng, &es);
    g.running = es.running;
    g.waiting = es.waiting;
    g.kv_bytes = es.state_bytes;
    g.cancelled = atomic_load(&a->cancelled);
    kv_cache_stats kv;
    if (a->cfg.kv) {
        kv_cache_get_stats(a->cfg.kv, &kv);
        g.kv = &kv;
    }
    if (a->http) {
        srv_http_stats hs;
        srv_http_get_stats(a->http, &hs);
        g.open_connections = hs.open_connections;
        g.open_streams = hs.open_streams;
    }
    rc_bytes out = {0};
    srv_metrics_render(a->m, &g, &out);
    srv_respond(r, 200, "text/plain; version=0.0.4", out.v, out.n, NULL);
    rc_bytes_free(&out);
    srv_metrics_request(a->m, "metrics", 200);
}

void srv_app_handle(void *arg, srv_req *r)
{
    srv_app *a = arg;
    const srv_req_info *ri = srv_req_info_of(r);
    static const struct {
        const char *path, *method, *api;
    } routes[] = {
        {"/v1/chat/completions", "POST", "chat"}, {"/v1/responses", "POST", "responses"},
        {"/v1/messages", "POST", "messages"},     {"/v1/models", "GET", "models"},
        {"/health", "GET", "health"},             {"/metrics", "GET", "metrics"},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(ri->path, routes[i].path)) continue;
        if (strcmp(ri->method, routes[i].method)) {
            char allow[64];
            snprintf(allow, sizeof allow, "Allow: %s\r\n", routes[i].method);
            rc_api_error e = {.status = 405, .type = "invalid_request_error"};
            snprintf(e.message, sizeof e.message, "%s %s is not allowed; use %s", ri->method, ri->path,
                     routes[i].method);
            rc_bytes b = {0};
            rc_api_error_json(&e, &b);
            srv_respond(r, 405, "application/json", b.v, b.n, allow);
            rc_bytes_free(&b);
            srv_metrics_request(a->m, routes[i].api, 405);
            return;
        }
        switch (i) {
        case 0: generate(a, r, "chat", &rc_out_chat, rc_chat_convert); return;
        case 1: generate(a, r, "responses", &rc_out_responses, rc_responses_convert); return;
        case 2: generate(a, r, "messages", &rc_out_messages, rc_messages_convert); return;
        case 3: models(a, r); return;
        case 4:
            srv_respond(r, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
            srv_metrics_request(a->m, "health", 200);
            return;
        case 5: metrics(a, r); return;
        }
    }
    respond_error(a, r, "other", 404, "invalid_request_error", "no route for %s %s", ri->method, ri->path);
}
