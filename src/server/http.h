/* http.h - the HTTP/1.1 front end: one epoll event loop thread, the request
 * parser from libhttp-parser, keep-alive, bounded everything, and streamed
 * responses that other threads feed.
 *
 * Lifecycle: srv_http_create(cfg, handler) -> srv_http_run (blocks, on its
 * own thread or the caller's) -> srv_http_stop (from any thread or a signal
 * handler: stops accepting, answers 503 to any request that arrives after it
 * returned, lets streams finish up to cfg->drain_ms) -> srv_http_destroy.
 *
 * A request is handed to the handler only once it is complete and within the
 * limits; limit violations are answered by this layer itself (413 body too
 * large, 431 headers too large, 408 slow headers, 503 too many connections,
 * 400 malformed HTTP), with a JSON body {"error":{"message","type"}}.
 *
 * Responses: the handler either answers at once (srv_respond) or opens a
 * stream (srv_stream_open) and returns; then any thread may srv_stream_write
 * chunks and must finally srv_stream_close.  Streams use chunked transfer
 * encoding; while a stream has had nothing to send for cfg->keepalive_ms the
 * loop sends an SSE comment line (":\n\n") so proxies and clients keep
 * waiting through a long prefill.  If the client goes away, the stream's
 * on_close callback runs (on the loop thread) so the producer can cancel;
 * later writes to it are accepted and dropped until srv_stream_close. */
#ifndef SERVER_HTTP_H
#define SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>

typedef struct srv_http srv_http;
typedef struct srv_req srv_req;       /* valid until it is answered / its stream is closed */
typedef struct srv_stream srv_stream; /* reference-counted; valid until srv_stream_close */

typedef struct {
    const char *host;           /* default "127.0.0.1" */
    int port;                   /* 0 = pick a free port (see srv_http_port) */
    size_t max_body;            /* bytes; default 8 MiB -> 413 */
    size_t max_header;          /* bytes of request line + headers; default 16 KiB -> 431 */
    int max_connections;        /* default 8192; beyond -> 503 and close */
    int header_timeout_ms;      /* whole head must arrive within this; default 10000 -> 408 */
    int idle_timeout_ms;        /* keep-alive idle; default 60000 */
    int keepalive_ms;           /* SSE comment interval on a silent stream; default 15000 */
    int drain_ms;               /* on stop: how long open streams may continue; default 5000 */
} srv_http_cfg;

typedef struct {
    const char *method;         /* "GET", "POST", ... */
    const char *path;           /* without the query string */
    const char *query;          /* after '?', or "" */
    const char *body;           /* NUL-terminated copy; body_len bytes */
    size_t body_len;
    uint64_t id;                /* unique per request, for logs */
    double t_arrival;           /* seconds (CLOCK_MONOTONIC) when the head started */
} srv_req_info;

/* Header lookup, case-insensitive; NULL if absent. */
const char *srv_req_header(const srv_req *r, const char *name);
const srv_req_info *srv_req_info_of(const srv_req *r);

/* Called on the loop thread for each complete request; must not block. */
typedef void (*srv_handler)(void *arg, srv_req *r);

srv_http *srv_http_create(const srv_http_cfg *cfg, srv_handler handler, void *arg, char *errbuf, size_t errlen);
int srv_http_port(const srv_http *h);
int srv_http_run(srv_http *h);        /* returns when stopped and drained */
void srv_http_stop(srv_http *h);      /* async-signal-safe */
void srv_http_destroy(srv_http *h);

/* Live gauges for /metrics. */
typedef struct {
    int open_connections, open_streams;
    uint64_t requests, rejected_connections, timeouts, bad_requests;
} srv_http_stats;
void srv_http_get_stats(const srv_http *h, srv_http_stats *out);

/* One complete response (any thread; exactly once per request unless a stream
 * is opened).  extra_headers: "Name: value\r\n" lines or NULL. */
void srv_respond(srv_req *r, int status, const char *content_type, const char *body, size_t len,
                 const char *extra_headers);

/* For a response given later from another thread: on_close runs (loop
 * thread) if the client disconnects first; srv_respond must still be called
 * exactly once, and is then dropped. */
void srv_req_on_close(srv_req *r, void (*on_close)(void *arg), void *arg);

/* Open a chunked streamed response (on the loop thread, inside the handler). */
srv_stream *srv_stream_open(srv_req *r, int status, const char *content_type,
                            void (*on_close)(void *arg), void *arg);
/* Queue bytes (any thread). Returns 0, or -1 once the client is gone. */
int srv_stream_write(srv_stream *s, const char *data, size_t len);
/* Finish the response (any thread); the handle is invalid afterwards. */
void srv_stream_close(srv_stream *s);

#endif
