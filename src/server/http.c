/* http.c - the HTTP/1.1 front end: one epoll loop, bounded everything.
 *
 * What this file owns: the listening socket, one event-loop thread (Redis ae
 * spirit: level-triggered epoll, non-blocking sockets, no thread per
 * connection), every client connection, the limits on requests (libhttp-parser
 * does the grammar, this file counts the bytes), response framing, timeouts
 * and the graceful stop.  It does not route, authenticate or read bodies: the
 * handler does all of that, including 404/405.
 *
 * One loop iteration: epoll_wait (timeout = nearest timer, at most 250 ms) ->
 * socket events -> the dirty list (requests other threads wrote to) -> expired
 * timers.  Timers are four FIFO lists, one per fixed timeout (head, idle,
 * stream keep-alive, linger): a touch moves a connection to the tail in O(1)
 * and a tick only looks at expired heads.
 *
 * Connection states: HEAD (reading a request head; header_timeout counts from
 * accept or from the first byte after keep-alive) -> BODY (idle_timeout
 * between reads) -> BUSY (handed to the handler; further input is buffered,
 * not parsed, so pipelined requests are answered one at a time in order) ->
 * IDLE (keep-alive) or CLOSING (flush the last response) -> LINGER (write side
 * shut, input discarded until EOF or 2 s, so closing on unread input does not
 * turn into an RST that destroys the response just sent).
 *
 * Threads and ownership -- the rules every function below keeps:
 *  1. A conn belongs to the loop thread alone; only the loop reads, writes or
 *     frees it.  No other thread ever holds a conn pointer.
 *  2. A srv_req (a srv_stream is the same object) is reference counted under
 *     the one global lock h->lock.  References: the connection while the
 *     request is its current one; the producer from dispatch until its
 *     srv_respond / srv_stream_close returns; the dirty list while queued.
 *     Whoever drops the last reference frees it.  Method, path, headers and
 *     body are written before dispatch and never after; everything both sides
 *     touch (pend, done, gone, on_close, flags, refs) is under h->lock.
 *  3. Producers frame bytes into r->pend under the lock and queue r on
 *     h->dirty, signalling the eventfd when the list was empty (not when the
 *     caller is the loop thread itself).  The loop swaps r->pend with the
 *     conn's own output buffer (O(1), under the lock) only once that buffer is
 *     fully written, and calls send() without the lock.
 *  4. Client gone (EOF, HUP/ERR, EPIPE/ECONNRESET, or more than 64 MiB unsent
 *     on a stream): the loop marks r gone, detaches it, and if the response is
 *     not complete runs on_close once, on the loop thread, without the lock.
 *     srv_respond / srv_stream_close called from another thread wait while
 *     that on_close is running, so once they return on_close is neither
 *     running nor ever going to run and the producer may free its context.
 *     Hence on_close must not wait for the producer thread.
 *  5. srv_http_destroy waits until every srv_req is freed: h outlives them.
 *  6. Beyond http.h: srv_stream_open works from any thread (not only inside
 *     the handler); a zero-length srv_stream_write sends nothing; chunked
 *     request trailers are parsed and dropped.
 * One global lock rather than one per connection: producers are few (the
 * engine thread), critical sections are memcpy-sized, and a conn can be freed
 * by the loop without any producer holding a pointer to its lock. */
#define _GNU_SOURCE
#include "server/http.h"

#include "base/err.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STREAM_MAX_UNSENT ((size_t)64 << 20) /* per stream, queued by producers; more = disconnect */
#define BUSY_IN_CAP (64 * 1024)             /* pipelined input buffered while a request runs */
#define BUF_KEEP (64 * 1024)                /* an emptied buffer larger than this is freed */
#define READ_CHUNK (64 * 1024)
#define LINGER_MS 2000
#define MAX_TICK_MS 250
#define MAX_EVENTS 512
#define ACCEPT_BATCH 256

/* ---------------------------------------------------------------- buffers */

typedef struct {
    char *p;
    size_t len, off, cap; /* bytes [off, len) are pending */
} buf_t;

static int buf_reserve(buf_t *b, size_t extra) {
    if (b->cap - b->len >= extra) return 0;
    if (extra > SIZE_MAX - b->len) return -1;
    size_t need = b->len + extra, cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int buf_add(buf_t *b, const void *d, size_t n) {
    if (!n) return 0;
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, d, n);
    b->len += n;
    return 0;
}

static int buf_str(buf_t *b, const char *s) { return buf_add(b, s, strlen(s)); }

static int buf_printf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int buf_printf(buf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || buf_reserve(b, (size_t)n + 1)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

static void buf_free(buf_t *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* Empty the buffer; keep small allocations for reuse. */
static void buf_clear(buf_t *b) {
    b->len = b->off = 0;
    if (b->cap > BUF_KEEP) buf_free(b);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ the objects */

enum { C_HEAD, C_BODY, C_BUSY, C_IDLE, C_CLOSING, C_LINGER };
enum { Q_HEAD, Q_IDLE, Q_STREAM, Q_LINGER, NQ };
enum { HS_URL, HS_FIELD, HS_VALUE };

struct srv_req {
    srv_http *h;
    /* written by the loop before dispatch, immutable afterwards */
    srv_req_info info;
    char *hb; /* "url\0name\0value\0...path\0query\0" */
    size_t hb_len, hb_cap;
    size_t *hoff; /* name, value offsets into hb, pairs */
    int nh, hoff_cap;
    char *bodybuf;
    size_t body_cap;
    bool keep_alive, http10, is_head;
    /* loop thread only: the connection while this is its current request */
    struct conn *conn;
    /* under h->lock */
    int refs;
    buf_t pend;             /* framed bytes not yet taken by the loop */
    bool done;              /* srv_respond or srv_stream_close happened */
    bool gone;              /* the client went away (or overflowed); writes return -1 */
    bool overflow;          /* the loop must drop the connection */
    bool is_stream, sse, resp_keep;
    bool queued;            /* on h->dirty (holds a reference) */
    bool cb_fired, cb_running;
    int cb_waiters;
    void (*on_close)(void *);
    void *on_close_arg;
    srv_req *dirty_next;
};

/* A stream is its request: the handle the header hands out is the same object. */
struct srv_stream {
    struct srv_req r;
};

typedef struct conn {
    srv_http *h;
    int fd, state;
    uint32_t ev; /* current epoll interest */
    buf_t in, out;
    http_parser parser;
    srv_req *parsing; /* being parsed; loop-private (1 reference) */
    srv_req *cur;     /* dispatched and not yet finished */
    size_t head_bytes;
    int reject; /* status a parser callback decided on */
    const char *reject_msg;
    unsigned hstate : 2, headers_done : 1, msg_done : 1, peer_eof : 1, wr_blocked : 1;
    unsigned resp_done : 1, resp_keep : 1, resp_started : 1, is_stream : 1, sse : 1, http10 : 1;
    int tq; /* timer queue or -1 */
    int64_t t;
    struct conn *tprev, *tnext, *prev, *next;
} conn;

typedef struct {
    conn *head, *tail;
    int64_t timeout;
} tqueue;

struct srv_http {
    srv_http_cfg cfg;
    char host[256];
    srv_handler handler;
    void *arg;
    int lfd, epfd, evfd, reserve_fd, port;
    char tag_listen, tag_event; /* their addresses tag epoll events */
    char reject_msg[512];
    size_t reject_len;
    /* loop thread only */
    conn *conns;
    int nconns;
    tqueue tq[NQ];
    int64_t now, drain_deadline;
    uint64_t next_id;
    bool draining;
    char *rbuf;
    /* any thread */
    atomic_int stop;
    pthread_mutex_t lock; /* guards every srv_req's shared fields, dirty, live_reqs */
    pthread_cond_t cond;  /* on_close finished / a request freed */
    srv_req *dirty;
    long live_reqs;
    bool destroying;
    atomic_int st_conns, st_streams;
    atomic_uint_fast64_t st_requests, st_rejected, st_timeouts, st_bad;
};

static _Thread_local srv_http *tl_loop; /* set while this thread runs h's loop */

static void conn_run(srv_http *h, conn *c);
static void conn_close(srv_http *h, conn *c);

/* ------------------------------------------------------------------ timers */

static void tq_del(srv_http *h, conn *c) {
    if (c->tq < 0) return;
    tqueue *q = &h->tq[c->tq];
    if (c->tprev) c->tprev->tnext = c->tnext;
    else q->head = c->tnext;
    if (c->tnext) c->tnext->tprev = c->tprev;
    else q->tail = c->tprev;
    c->tprev = c->tnext = NULL;
    c->tq = -1;
}

/* (Re)arm c on queue qi from now; qi < 0 disarms.  A queue of timeout <= 0 is off. */
static void tq_set(srv_http *h, conn *c, int qi) {
    tq_del(h, c);
    if (qi < 0 || h->tq[qi].timeout <= 0) return;
    tqueue *q = &h->tq[qi];
    c->tq = qi;
    c->t = h->now;
    c->tprev = q->tail;
    c->tnext = NULL;
    if (q->tail) q->tail->tnext = c;
    else q->head = c;
    q->tail = c;
}

/* -------------------------------------------------------- request objects */

static srv_req *req_new(srv_http *h) {
    srv_req *r = calloc(1, sizeof(struct srv_stream));
    if (!r) return NULL;
    r->h = h;
    r->refs = 1;
    r->info.id = ++h->next_id;
    r->info.t_arrival = (double)h->now / 1000.0;
    r->info.method = "";
    r->info.path = "";
    r->info.query = "";
    r->info.body = "";
    pthread_mutex_lock(&h->lock);
    h->live_reqs++;
    pthread_mutex_unlock(&h->lock);
    return r;
}

static void req_unref(srv_req *r) {
    srv_http *h = r->h;
    pthread_mutex_lock(&h->lock);
    bool last = --r->refs == 0;
    if (last && --h->live_reqs == 0 && h->destroying) pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    if (!last) return; /* from here h may already be gone: touch only r */
    free(r->hb);
    free(r->hoff);
    free(r->bodybuf);
    free(r->pend.p);
    free(r);
}

/* Under h->lock.  Returns true when the loop must be woken. */
static bool req_queue_locked(srv_http *h, srv_req *r) {
    if (r->queued) return false;
    r->queued = true;
    r->refs++;
    bool was_empty = h->dirty == NULL;
    r->dirty_next = h->dirty;
    h->dirty = r;
    return was_empty;
}

static void wake_loop(srv_http *h) {
    if (tl_loop == h) return; /* the loop looks at h->dirty before it sleeps */
    uint64_t one = 1;
    if (write(h->evfd, &one, sizeof one) < 0) { /* EAGAIN: counter full, already awake */ }
}

/* Under h->lock: a producer of another thread waits out a running on_close. */
static void wait_cb_locked(srv_http *h, srv_req *r) {
    if (tl_loop == h) return; /* on_close itself (or the loop) may call us */
    while (r->cb_running) {
        r->cb_waiters++;
        pthread_cond_wait(&h->cond, &h->lock);
        r->cb_waiters--;
    }
}

/* Loop thread.  Run on_close if the response is unfinished, at most once. */
static void req_fire_on_close(srv_http *h, srv_req *r) {
    void (*fn)(void *) = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&h->lock);
    if (!r->done && r->on_close && !r->cb_fired) {
        r->cb_fired = r->cb_running = true;
        fn = r->on_close;
        arg = r->on_close_arg;
    }
    pthread_mutex_unlock(&h->lock);
    if (!fn) return;
    fn(arg);
    pthread_mutex_lock(&h->lock);
    r->cb_running = false;
    if (r->cb_waiters) pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
}

/* ------------------------------------------------------- response framing */

enum { BODY_LEN, BODY_NONE, BODY_CHUNKED, BODY_UNTIL_CLOSE };

static int fmt_head(buf_t *b, int status, const char *ctype, int mode, size_t len, bool keep,
                    const char *extra) {
    if (status < 100 || status > 999) status = 500;
    const char *reason = http_status_str((enum http_status)status);
    if (!reason || reason[0] == '<') reason = "Unknown";
    int rc = buf_printf(b, "HTTP/1.1 %d %s\r\nServer: deepinfer\r\n", status, reason);
    if (ctype) rc |= buf_printf(b, "Content-Type: %s\r\n", ctype);
    switch (mode) {
    case BODY_LEN: rc |= buf_printf(b, "Content-Length: %zu\r\n", len); break;
    case BODY_CHUNKED: rc |= buf_str(b, "Transfer-Encoding: chunked\r\n"); /* fall through */
    case BODY_UNTIL_CLOSE: rc |= buf_str(b, "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n"); break;
    default: break;
    }
    rc |= buf_printf(b, "Connection: %s\r\n", keep ? "keep-alive" : "close");
    if (extra) rc |= buf_str(b, extra);
    rc |= buf_add(b, "\r\n", 2);
    return rc ? -1 : 0;
}

static int fmt_error(buf_t *b, int status, const char *type, const char *msg) {
    char body[512];
    int n = snprintf(body, sizeof body,
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}", msg, type);
    if (n < 0 || (size_t)n >= sizeof body) n = (int)strlen(body);
    if (fmt_head(b, status, "application/json", BODY_LEN, (size_t)n, false, NULL)) return -1;
    return buf_add(b, body, (size_t)n);
}

/* --------------------------------------------------------- the public API */

const char *srv_req_header(const srv_req *r, const char *name) {
    for (int i = 0; i < r->nh; i++)
        if (!strcasecmp(r->hb + r->hoff[2 * i], name)) return r->hb + r->hoff[2 * i + 1];
    return NULL;
}

const srv_req_info *srv_req_info_of(const srv_req *r) { return &r->info; }

void srv_respond(srv_req *r, int status, const char *content_type, const char *body, size_t len,
                 const char *extra_headers) {
    srv_http *h = r->h;
    bool keep = r->keep_alive && !atomic_load(&h->stop);
    bool no_body = status / 100 == 1 || status == 204 || status == 304;
    if (!body) len = 0;
    buf_t b = {0};
    int rc = fmt_head(&b, status, content_type, no_body ? BODY_NONE : BODY_LEN, len, keep, extra_headers);
    if (!rc && !no_body && !r->is_head && body) rc = buf_add(&b, body, len);
    bool wake = false;
    pthread_mutex_lock(&h->lock);
    wait_cb_locked(h, r);
    assert(!r->done && !r->is_stream && "srv_respond: exactly once, and not on a stream");
    if (!r->done) {
        r->done = true;
        r->resp_keep = keep;
        if (!r->gone) {
            if (rc) r->gone = r->overflow = true; /* out of memory: drop the connection */
            else {
                buf_t t = r->pend; /* empty: nothing else writes a plain response */
                r->pend = b;
                b = t;
            }
            wake = req_queue_locked(h, r);
        }
    }
    pthread_mutex_unlock(&h->lock);
    buf_free(&b);
    if (wake) wake_loop(h);
    req_unref(r);
}

void srv_req_on_close(srv_req *r, void (*on_close)(void *arg), void *arg) {
    srv_http *h = r->h;
    bool wake = false;
    pthread_mutex_lock(&h->lock);
    r->on_close = on_close;
    r->on_close_arg = arg;
    if (on_close && r->gone && !r->done && !r->cb_fired) wake = req_queue_locked(h, r); /* fire it now */
    pthread_mutex_unlock(&h->lock);
    if (wake) wake_loop(h);
}

/* Under h->lock: append to a stream; on failure the stream counts as gone. */
static int pend_add_locked(srv_req *r, const void *d, size_t n) {
    if (r->pend.len + n > STREAM_MAX_UNSENT || buf_add(&r->pend, d, n)) {
        r->gone = r->overflow = true;
        buf_free(&r->pend);
        return -1;
    }
    return 0;
}

srv_stream *srv_stream_open(srv_req *r, int status, const char *content_type, void (*on_close)(void *arg),
                            void *arg) {
    srv_http *h = r->h;
    if (!content_type) content_type = "text/event-stream";
    bool keep = r->keep_alive && !r->http10 && !atomic_load(&h->stop);
    buf_t b = {0};
    int rc = fmt_head(&b, status, content_type, r->http10 ? BODY_UNTIL_CLOSE : BODY_CHUNKED, 0, keep, NULL);
    bool wake;
    pthread_mutex_lock(&h->lock);
    assert(!r->done && !r->is_stream && "srv_stream_open: once, instead of srv_respond");
    r->is_stream = true;
    r->sse = !strncasecmp(content_type, "text/event-stream", 17);
    r->resp_keep = keep;
    r->on_close = on_close;
    r->on_close_arg = arg;
    if (!r->gone) {
        if (rc) r->gone = r->overflow = true;
        else pend_add_locked(r, b.p, b.len);
    }
    wake = req_queue_locked(h, r); /* also when gone: the loop then fires on_close */
    pthread_mutex_unlock(&h->lock);
    buf_free(&b);
    if (wake) wake_loop(h);
    return (srv_stream *)r;
}

int srv_stream_write(srv_stream *s, const char *data, size_t len) {
    srv_req *r = &s->r;
    srv_http *h = r->h;
    char hdr[24];
    int hl = r->http10 ? 0 : snprintf(hdr, sizeof hdr, "%zx\r\n", len);
    size_t need = (size_t)hl + len + (r->http10 ? 0 : 2);
    int rc = 0;
    bool wake = false;
    pthread_mutex_lock(&h->lock);
    if (r->gone || r->done) rc = -1;
    else if (len) { /* a zero-length chunk would end the response */
        if (r->pend.len + need > STREAM_MAX_UNSENT || buf_reserve(&r->pend, need)) {
            r->gone = r->overflow = true; /* a reader this slow counts as gone */
            buf_free(&r->pend);
            rc = -1;
        } else {
            buf_add(&r->pend, hdr, (size_t)hl);
            buf_add(&r->pend, data, len);
            if (!r->http10) buf_add(&r->pend, "\r\n", 2);
        }
        wake = req_queue_locked(h, r);
    }
    pthread_mutex_unlock(&h->lock);
    if (wake) wake_loop(h);
    return rc;
}

void srv_stream_close(srv_stream *s) {
    srv_req *r = &s->r;
    srv_http *h = r->h;
    bool wake = false;
    pthread_mutex_lock(&h->lock);
    wait_cb_locked(h, r);
    assert(r->is_stream && !r->done && "srv_stream_close: exactly once per stream");
    if (!r->done) {
        r->done = true;
        if (!r->gone) {
            if (!r->http10) pend_add_locked(r, "0\r\n\r\n", 5);
            wake = req_queue_locked(h, r);
        }
    }
    pthread_mutex_unlock(&h->lock);
    if (wake) wake_loop(h);
    req_unref(r);
}

void srv_http_get_stats(const srv_http *hc, srv_http_stats *out) {
    srv_http *h = (srv_http *)hc; /* atomic loads want non-const */
    out->open_connections = atomic_load(&h->st_conns);
    out->open_streams = atomic_load(&h->st_streams);
    out->requests = atomic_load(&h->st_requests);
    out->rejected_connections = atomic_load(&h->st_rejected);
    out->timeouts = atomic_load(&h->st_timeouts);
    out->bad_requests = atomic_load(&h->st_bad);
}

int srv_http_port(const srv_http *h) { return h->port; }

void srv_http_stop(srv_http *h) {
    int saved = errno; /* async-signal-safe: an atomic store and a write(2) */
    atomic_store(&h->stop, 1);
    uint64_t one = 1;
    if (write(h->evfd, &one, sizeof one) < 0) { /* already signalled */ }
    errno = saved;
}

/* ---------------------------------------------------------- request parsing */

/* Room for n more bytes and a terminator. */
static int hb_reserve(srv_req *r, size_t n) {
    if (r->hb_cap - r->hb_len >= n + 1) return 0;
    size_t cap = r->hb_cap ? r->hb_cap : 512;
    while (cap - r->hb_len < n + 1) cap *= 2;
    char *p = realloc(r->hb, cap);
    if (!p) return -1;
    r->hb = p;
    r->hb_cap = cap;
    return 0;
}

static int hb_add(srv_req *r, const char *d, size_t n) {
    if (hb_reserve(r, n)) return -1;
    if (n) memcpy(r->hb + r->hb_len, d, n);
    r->hb_len += n;
    return 0;
}

static int hb_end(srv_req *r) { /* terminate the current string */
    if (hb_reserve(r, 0)) return -1;
    r->hb[r->hb_len++] = '\0';
    return 0;
}

static int cb_oom(conn *c) {
    c->reject = 503;
    c->reject_msg = "out of memory";
    return -1;
}

static int on_url(http_parser *p, const char *at, size_t n) {
    conn *c = p->data;
    return hb_add(c->parsing, at, n) ? cb_oom(c) : 0;
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
    conn *c = p->data;
    srv_req *r = c->parsing;
    if (c->headers_done) return 0; /* chunked trailers: dropped, hb (and path) must not move */
    if (c->hstate != HS_FIELD) { /* ends the url or the previous value */
        if (hb_end(r)) return cb_oom(c);
        if (r->nh == r->hoff_cap) {
            int cap = r->hoff_cap ? 2 * r->hoff_cap : 16;
            size_t *o = realloc(r->hoff, sizeof(size_t) * 2 * (size_t)cap);
            if (!o) return cb_oom(c);
            r->hoff = o;
            r->hoff_cap = cap;
        }
        r->hoff[2 * r->nh] = r->hb_len;
        r->hoff[2 * r->nh + 1] = 0;
        r->nh++;
        c->hstate = HS_FIELD;
    }
    return hb_add(r, at, n) ? cb_oom(c) : 0;
}

/* libhttp-parser calls this with n == 0 for an empty value, so field/value
 * alternation always tells where one header ends. */
static int on_header_value(http_parser *p, const char *at, size_t n) {
    conn *c = p->data;
    srv_req *r = c->parsing;
    if (c->headers_done) return 0;
    if (c->hstate != HS_VALUE) {
        if (hb_end(r)) return cb_oom(c);
        r->hoff[2 * (r->nh - 1) + 1] = r->hb_len;
        c->hstate = HS_VALUE;
    }
    return hb_add(r, at, n) ? cb_oom(c) : 0;
}

static int on_headers_complete(http_parser *p) {
    conn *c = p->data;
    srv_req *r = c->parsing;
    srv_http *h = c->h;
    if (hb_end(r)) return cb_oom(c);
    c->headers_done = 1;
    for (int i = 0; i < r->nh; i++) {
        size_t *vo = &r->hoff[2 * i + 1];
        if (!*vo) *vo = r->hoff[2 * i] + strlen(r->hb + r->hoff[2 * i]); /* no value: "" */
        char *v = r->hb + *vo;
        size_t l = strlen(v);
        while (l && (v[l - 1] == ' ' || v[l - 1] == '\t')) v[--l] = '\0';
    }
    /* split the target; the url is the first string of hb */
    struct http_parser_url u;
    http_parser_url_init(&u);
    size_t ulen = strlen(r->hb);
    if (!ulen || http_parser_parse_url(r->hb, ulen, p->method == HTTP_CONNECT, &u)) {
        c->reject = 400;
        c->reject_msg = "malformed request target";
        return -1;
    }
    size_t po = 0, pl = 0, qo = 0, ql = 0;
    if (u.field_set & (1 << UF_PATH)) po = u.field_data[UF_PATH].off, pl = u.field_data[UF_PATH].len;
    if (u.field_set & (1 << UF_QUERY)) qo = u.field_data[UF_QUERY].off, ql = u.field_data[UF_QUERY].len;
    if (hb_reserve(r, pl + ql + 4)) return cb_oom(c); /* the copies below read from hb itself */
    size_t path_at = r->hb_len;
    if (pl) hb_add(r, r->hb + po, pl);
    else hb_add(r, "/", 1);
    hb_end(r);
    size_t query_at = r->hb_len;
    hb_add(r, r->hb + qo, ql);
    hb_end(r);
    r->info.method = http_method_str((enum http_method)p->method);
    r->info.path = r->hb + path_at;
    r->info.query = r->hb + query_at;
    if ((p->flags & F_CONTENTLENGTH) && p->content_length > h->cfg.max_body) {
        c->reject = 413; /* before reading any of it */
        return -1;
    }
    const char *ex = srv_req_header(r, "expect");
    bool has_body = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENTLENGTH) && p->content_length > 0);
    if (ex && !strcasecmp(ex, "100-continue") && has_body && p->http_major == 1 && p->http_minor >= 1)
        if (buf_str(&c->out, "HTTP/1.1 100 Continue\r\n\r\n")) return cb_oom(c);
    return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
    conn *c = p->data;
    srv_req *r = c->parsing;
    if (r->info.body_len + n > c->h->cfg.max_body) {
        c->reject = 413; /* chunked, or a body longer than declared cannot be; kept for safety */
        return -1;
    }
    if (r->body_cap < r->info.body_len + n + 1) {
        size_t cap = r->body_cap ? r->body_cap : 1024;
        while (cap < r->info.body_len + n + 1) cap *= 2;
        char *b = realloc(r->bodybuf, cap);
        if (!b) return cb_oom(c);
        r->bodybuf = b;
        r->body_cap = cap;
    }
    memcpy(r->bodybuf + r->info.body_len, at, n);
    r->info.body_len += n;
    r->bodybuf[r->info.body_len] = '\0';
    return 0;
}

/* Pausing stops the parser right after this message, so a pipelined next
 * request stays in the input buffer until this one is answered. */
static int on_message_complete(http_parser *p) {
    conn *c = p->data;
    c->msg_done = 1;
    http_parser_pause(p, 1);
    return 0;
}

static const http_parser_settings parser_settings = {
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ------------------------------------------------------------- connections */

/* Queue an error response (this layer's own) and close after it. */
static void conn_error(srv_http *h, conn *c, int status, const char *msg) {
    if (c->parsing) {
        req_unref(c->parsing);
        c->parsing = NULL;
    }
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    if (fmt_error(&c->out, status, type, msg)) c->out.len = c->out.off; /* no memory: just close */
    if (status == 408) atomic_fetch_add(&h->st_timeouts, 1);
    else if (status < 500) atomic_fetch_add(&h->st_bad, 1);
    c->state = C_CLOSING;
    tq_set(h, c, Q_IDLE);
}

static void conn_arm(srv_http *h, conn *c) {
    uint32_t ev = 0;
    switch (c->state) {
    case C_HEAD:
    case C_BODY:
    case C_IDLE:
    case C_LINGER: ev = EPOLLIN | EPOLLRDHUP; break;
    case C_BUSY:
        if (!c->peer_eof) {
            ev = EPOLLRDHUP; /* a disconnect must be seen even when input is full */
            if (c->in.len - c->in.off < BUSY_IN_CAP) ev |= EPOLLIN;
        }
        break;
    default: break;
    }
    if (c->wr_blocked) ev |= EPOLLOUT;
    if (ev == c->ev) return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(h->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->ev = ev;
}

/* Write c->out.  1 = all written, 0 = the socket is full, -1 = c was closed. */
static int conn_write(srv_http *h, conn *c) {
    while (c->out.off < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out.off, c->out.len - c->out.off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out.off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->wr_blocked = 1;
            return 0;
        }
        conn_close(h, c); /* EPIPE, ECONNRESET: the client is gone */
        return -1;
    }
    c->wr_blocked = 0;
    buf_clear(&c->out);
    return 1;
}

static conn *conn_new(srv_http *h, int fd) {
    conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->h = h;
    c->fd = fd;
    c->tq = -1;
    c->state = C_HEAD;
    c->ev = EPOLLIN | EPOLLRDHUP;
    struct epoll_event e = {.events = c->ev, .data.ptr = c};
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &e)) {
        free(c);
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->next = h->conns;
    if (h->conns) h->conns->prev = c;
    h->conns = c;
    h->nconns++;
    atomic_fetch_add(&h->st_conns, 1);
    tq_set(h, c, Q_HEAD); /* the first head must arrive header_timeout after accept */
    return c;
}

static void conn_close(srv_http *h, conn *c) {
    srv_req *r = c->cur;
    if (r) {
        c->cur = NULL;
        r->conn = NULL;
        pthread_mutex_lock(&h->lock);
        r->gone = true;
        buf_free(&r->pend);
        pthread_mutex_unlock(&h->lock);
        if (c->is_stream) atomic_fetch_sub(&h->st_streams, 1);
        req_fire_on_close(h, r);
        req_unref(r);
    }
    if (c->parsing) req_unref(c->parsing);
    tq_del(h, c);
    if (c->prev) c->prev->next = c->next;
    else h->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    close(c->fd); /* also leaves the epoll set */
    buf_free(&c->in);
    buf_free(&c->out);
    free(c);
    h->nconns--;
    atomic_fetch_sub(&h->st_conns, 1);
}

/* Read what the socket has.  -1 if c was closed. */
static int conn_read(srv_http *h, conn *c, uint32_t events) {
    for (int i = 0; i < 4; i++) {
        if (c->state == C_BUSY && c->in.len - c->in.off >= BUSY_IN_CAP) {
            if (events & EPOLLRDHUP) c->peer_eof = 1;
            break;
        }
        ssize_t n = recv(c->fd, h->rbuf, READ_CHUNK, 0);
        if (n > 0) {
            if (c->state == C_LINGER || c->state == C_CLOSING) continue; /* discard */
            if (c->state == C_IDLE) {
                c->state = C_HEAD; /* the head clock starts at the first byte */
                tq_set(h, c, Q_HEAD);
            } else if (c->state == C_BODY) tq_set(h, c, Q_IDLE);
            if (c->in.off == c->in.len) c->in.off = c->in.len = 0;
            else if (c->in.off && c->in.cap - c->in.len < (size_t)n) {
                memmove(c->in.p, c->in.p + c->in.off, c->in.len - c->in.off);
                c->in.len -= c->in.off;
                c->in.off = 0;
            }
            if (buf_add(&c->in, h->rbuf, (size_t)n)) {
                conn_close(h, c);
                return -1;
            }
            continue;
        }
        if (n == 0) {
            c->peer_eof = 1;
            break;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        conn_close(h, c);
        return -1;
    }
    if (c->peer_eof && (c->state == C_LINGER || c->state == C_CLOSING)) {
        conn_close(h, c);
        return -1;
    }
    return 0;
}

enum { PARSE_MORE, PARSE_NEXT, PARSE_CLOSED };

static int conn_dispatch(srv_http *h, conn *c) {
    srv_req *r = c->parsing;
    c->parsing = NULL;
    http_parser *p = &c->parser;
    r->keep_alive = http_should_keep_alive(p) && !p->upgrade;
    r->http10 = p->http_major < 1 || (p->http_major == 1 && p->http_minor == 0);
    r->is_head = p->method == HTTP_HEAD;
    if (r->bodybuf) r->info.body = r->bodybuf;
    /* the stop flag too, not only draining: a request that arrives after
     * srv_http_stop returned is refused even when the loop sees it in the same
     * epoll batch as the stop's wakeup, before begin_drain has run */
    if (h->draining || atomic_load(&h->stop)) {
        req_unref(r);
        conn_error(h, c, 503, "the server is shutting down");
        return PARSE_NEXT;
    }
    r->refs = 2; /* the connection's and the producer's; not shared yet */
    r->conn = c;
    c->cur = r;
    c->state = C_BUSY;
    tq_del(h, c);
    c->resp_done = c->resp_started = c->is_stream = c->sse = 0;
    c->http10 = r->http10;
    atomic_fetch_add(&h->st_requests, 1);
    h->handler(h->arg, r);
    return PARSE_NEXT;
}

static int parse_fail(srv_http *h, conn *c, int status, const char *why) {
    char msg[160];
    switch (status) {
    case 413: snprintf(msg, sizeof msg, "request body too large (limit %zu bytes)", h->cfg.max_body); break;
    case 431:
        snprintf(msg, sizeof msg, "request header fields too large (limit %zu bytes)", h->cfg.max_header);
        break;
    default: snprintf(msg, sizeof msg, "malformed HTTP request: %s", why ? why : "bad syntax"); break;
    }
    conn_error(h, c, status, status == 503 ? why : msg);
    return PARSE_NEXT;
}

/* Feed buffered input to the parser until a request completes (dispatched),
 * a limit is hit (error queued), or the input runs out. */
static int conn_parse(srv_http *h, conn *c) {
    while (c->in.off < c->in.len) {
        if (!c->parsing) {
            srv_req *r = req_new(h);
            if (!r) {
                conn_close(h, c);
                return PARSE_CLOSED;
            }
            c->parsing = r;
            http_parser_init(&c->parser, HTTP_REQUEST);
            c->parser.data = c;
            c->head_bytes = 0;
            c->headers_done = c->msg_done = 0;
            c->hstate = HS_URL;
            c->reject = 0;
            c->reject_msg = NULL;
            if (c->state == C_IDLE) {
                c->state = C_HEAD;
                tq_set(h, c, Q_HEAD);
            }
        }
        const char *data = c->in.p + c->in.off;
        size_t avail = c->in.len - c->in.off, feed = avail;
        bool in_head = !c->headers_done;
        if (in_head) { /* never let the parser see more head than the limit allows */
            size_t rem = h->cfg.max_header > c->head_bytes ? h->cfg.max_header - c->head_bytes : 0;
            if (!rem) return parse_fail(h, c, 431, NULL);
            if (feed > rem) feed = rem;
        }
        size_t n = http_parser_execute(&c->parser, &parser_settings, data, feed);
        if (in_head && !c->headers_done) c->head_bytes += n;
        c->in.off += n;
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (c->reject) return parse_fail(h, c, c->reject, c->reject_msg);
        if (c->msg_done) return conn_dispatch(h, c);
        if (e != HPE_OK)
            return parse_fail(h, c, e == HPE_HEADER_OVERFLOW ? 431 : 400, http_errno_description(e));
        if (in_head && c->headers_done) {
            c->state = C_BODY;
            tq_set(h, c, Q_IDLE);
        } else if (in_head && c->head_bytes >= h->cfg.max_header)
            return parse_fail(h, c, 431, NULL);
        if (n < feed) return parse_fail(h, c, 400, NULL);
    }
    c->in.off = c->in.len = 0;
    if (c->in.cap > BUF_KEEP) buf_free(&c->in);
    return PARSE_MORE;
}

enum { P_CLOSED, P_WAIT, P_FINISHED };

/* BUSY: move what the producer queued to the socket. */
static int conn_pump(srv_http *h, conn *c) {
    srv_req *r = c->cur;
    for (;;) {
        bool out_empty = c->out.off == c->out.len, took = false, ovf, fin, keep, stream, sse;
        pthread_mutex_lock(&h->lock);
        ovf = r->overflow; /* checked first: an overflowing stream is usually blocked */
        if (!ovf && out_empty && r->pend.len) {
            c->out.len = c->out.off = 0;
            buf_t t = c->out; /* empty, becomes the producer's next pend */
            c->out = r->pend;
            r->pend = t;
            took = true;
        }
        fin = r->done && !r->pend.len;
        keep = r->resp_keep;
        stream = r->is_stream;
        sse = r->sse;
        pthread_mutex_unlock(&h->lock);
        if (ovf) {
            conn_close(h, c);
            return P_CLOSED;
        }
        if (stream && !c->is_stream) {
            c->is_stream = 1;
            c->sse = sse;
            atomic_fetch_add(&h->st_streams, 1);
        }
        if (fin) {
            c->resp_done = 1;
            c->resp_keep = keep;
        }
        if (took) {
            c->resp_started = 1;
            if (c->is_stream && !c->resp_done) tq_set(h, c, Q_STREAM); /* silence counts from now */
        }
        if (c->out.off == c->out.len) break;
        int w = conn_write(h, c);
        if (w < 0) return P_CLOSED;
        if (w == 0) {
            if (!c->is_stream) tq_set(h, c, Q_IDLE); /* a reader that stalls idle_timeout goes */
            return P_WAIT;
        }
        if (!c->is_stream && c->tq == Q_IDLE) tq_del(h, c);
    }
    if (c->resp_done) return P_FINISHED;
    if (c->peer_eof) { /* half-close while the answer is pending: the client is gone */
        conn_close(h, c);
        return P_CLOSED;
    }
    return P_WAIT;
}

static void conn_finish(srv_http *h, conn *c) {
    srv_req *r = c->cur;
    c->cur = NULL;
    r->conn = NULL;
    if (c->is_stream) atomic_fetch_sub(&h->st_streams, 1);
    c->is_stream = c->sse = c->resp_started = c->resp_done = 0;
    req_unref(r);
    if (c->resp_keep && !c->peer_eof) {
        c->state = C_IDLE;
        tq_set(h, c, Q_IDLE);
    } else {
        c->state = C_CLOSING;
        tq_set(h, c, Q_IDLE);
    }
}

/* Drive c as far as it goes without blocking. */
static void conn_run(srv_http *h, conn *c) {
    for (;;) {
        switch (c->state) {
        case C_BUSY: {
            int rc = conn_pump(h, c);
            if (rc == P_CLOSED) return;
            if (rc == P_WAIT) {
                conn_arm(h, c);
                return;
            }
            conn_finish(h, c);
            continue;
        }
        case C_HEAD:
        case C_BODY:
        case C_IDLE:
            if (c->in.off < c->in.len) {
                int rc = conn_parse(h, c);
                if (rc == PARSE_CLOSED) return;
                if (rc == PARSE_NEXT) continue;
            }
            if (c->out.off < c->out.len && conn_write(h, c) < 0) return; /* 100 Continue */
            if (c->peer_eof) {
                conn_close(h, c);
                return;
            }
            conn_arm(h, c);
            return;
        case C_CLOSING: {
            int w = conn_write(h, c);
            if (w < 0) return;
            if (w > 0) {
                shutdown(c->fd, SHUT_WR);
                c->state = C_LINGER;
                tq_set(h, c, Q_LINGER);
                buf_free(&c->in);
            }
            conn_arm(h, c);
            return;
        }
        default: conn_arm(h, c); return;
        }
    }
}

static void conn_expire(srv_http *h, conn *c, int qi) {
    switch (qi) {
    case Q_HEAD:
        if (c->parsing || c->in.off < c->in.len) {
            conn_error(h, c, 408, "request head not received in time");
            conn_run(h, c);
        } else {
            atomic_fetch_add(&h->st_timeouts, 1);
            conn_close(h, c);
        }
        break;
    case Q_IDLE:
        if (c->state == C_BODY) {
            conn_error(h, c, 408, "request body not received in time");
            conn_run(h, c);
        } else conn_close(h, c); /* idle keep-alive, or a reader that stopped reading */
        break;
    case Q_STREAM:
        tq_set(h, c, Q_STREAM);
        if (c->state == C_BUSY && c->sse && c->resp_started && !c->resp_done && c->out.off == c->out.len) {
            const char *ka = c->http10 ? ":\n\n" : "3\r\n:\n\n\r\n";
            if (!buf_str(&c->out, ka)) conn_run(h, c);
        }
        break;
    default: conn_close(h, c); break;
    }
}

static void run_timers(srv_http *h) {
    for (int qi = 0; qi < NQ; qi++) {
        tqueue *q = &h->tq[qi];
        while (q->head && q->head->t + q->timeout <= h->now) conn_expire(h, q->head, qi);
    }
}

/* Requests producers touched since the last look. */
static bool process_dirty(srv_http *h) {
    pthread_mutex_lock(&h->lock);
    srv_req *list = h->dirty;
    h->dirty = NULL;
    pthread_mutex_unlock(&h->lock);
    if (!list) return false;
    while (list) {
        srv_req *r = list;
        pthread_mutex_lock(&h->lock);
        list = r->dirty_next;
        r->dirty_next = NULL;
        r->queued = false; /* before taking pend: a later write queues r again */
        pthread_mutex_unlock(&h->lock);
        if (r->conn) conn_run(h, r->conn);
        else req_fire_on_close(h, r); /* a stream or on_close that arrived after the client left */
        req_unref(r);
    }
    return true;
}

/* Beyond max_connections (or out of fds): answer 503 and close at once. */
static void reject_conn(srv_http *h, int fd) {
    /* counted before the client can see the answer: a client that reads the
     * stats after its 503 and EOF must find itself counted */
    atomic_fetch_add(&h->st_rejected, 1);
    if (send(fd, h->reject_msg, h->reject_len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* best effort */ }
    shutdown(fd, SHUT_WR);
    char tmp[4096]; /* read what already came so close() sends FIN, not RST */
    for (int i = 0; i < 4 && recv(fd, tmp, sizeof tmp, MSG_DONTWAIT) > 0; i++) {}
    close(fd);
}

static void do_accept(srv_http *h) {
    for (int i = 0; i < ACCEPT_BATCH && h->lfd >= 0; i++) {
        int fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if ((errno == EMFILE || errno == ENFILE) && h->reserve_fd >= 0) {
                /* out of fds: free the spare one to accept and refuse, or the
                 * level-triggered listener would spin */
                close(h->reserve_fd);
                fd = accept4(h->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd >= 0) reject_conn(h, fd);
                h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                continue;
            }
            break;
        }
        if (h->nconns >= h->cfg.max_connections || h->draining) {
            reject_conn(h, fd);
            continue;
        }
        if (!conn_new(h, fd)) reject_conn(h, fd);
    }
}

/* -------------------------------------------------------------- lifecycle */

static int fail(char *errbuf, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *errbuf, size_t errlen, const char *fmt, ...) {
    if (errbuf && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int open_listener(srv_http *h, char *errbuf, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", h->cfg.port);
    int gai = getaddrinfo(h->host, port, &hints, &res);
    if (gai) return fail(errbuf, errlen, "http: cannot resolve %s: %s", h->host, gai_strerror(gai));
    int err = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 4096) == 0) {
            h->lfd = fd;
            break;
        }
        err = errno;
        close(fd);
    }
    freeaddrinfo(res);
    if (h->lfd < 0) return fail(errbuf, errlen, "http: cannot listen on %s:%d: %s", h->host, h->cfg.port, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(h->lfd, (struct sockaddr *)&ss, &sl) == 0)
        h->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                           : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

srv_http *srv_http_create(const srv_http_cfg *cfg, srv_handler handler, void *arg, char *errbuf, size_t errlen) {
    srv_http_cfg c = cfg ? *cfg : (srv_http_cfg){0};
    if (!c.host || !*c.host) c.host = "127.0.0.1";
    if (!c.max_body) c.max_body = (size_t)8 << 20;
    if (!c.max_header) c.max_header = 16 * 1024;
    if (c.max_connections <= 0) c.max_connections = 8192;
    if (c.header_timeout_ms <= 0) c.header_timeout_ms = 10000;
    if (c.idle_timeout_ms <= 0) c.idle_timeout_ms = 60000;
    if (c.keepalive_ms <= 0) c.keepalive_ms = 15000;
    if (c.drain_ms < 0) c.drain_ms = 0;
    else if (!c.drain_ms) c.drain_ms = 5000;
    if (!handler) return fail(errbuf, errlen, "http: no handler"), NULL;
    if (c.port < 0 || c.port > 65535) return fail(errbuf, errlen, "http: bad port %d", c.port), NULL;
    if (strlen(c.host) >= sizeof(((srv_http *)0)->host)) return fail(errbuf, errlen, "http: host too long"), NULL;

    /* thousands of streams need thousands of fds: take the whole hard limit */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* the library's own head limit (80 KiB) must not undercut ours */
    if (c.max_header > 80 * 1024) http_parser_set_max_header_size((uint32_t)(c.max_header + 1024));

    srv_http *h = calloc(1, sizeof *h);
    if (!h) return fail(errbuf, errlen, "http: out of memory"), NULL;
    h->cfg = c;
    snprintf(h->host, sizeof h->host, "%s", c.host);
    h->cfg.host = h->host;
    h->handler = handler;
    h->arg = arg;
    h->lfd = h->epfd = h->evfd = h->reserve_fd = -1;
    h->tq[Q_HEAD].timeout = c.header_timeout_ms;
    h->tq[Q_IDLE].timeout = c.idle_timeout_ms;
    h->tq[Q_STREAM].timeout = c.keepalive_ms;
    h->tq[Q_LINGER].timeout = LINGER_MS;
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->cond, NULL);
    buf_t rb = {0};
    if (fmt_error(&rb, 503, "server_error", "too many connections")) goto oom;
    if (rb.len >= sizeof h->reject_msg) rb.len = sizeof h->reject_msg - 1;
    memcpy(h->reject_msg, rb.p, rb.len);
    h->reject_len = rb.len;
    buf_free(&rb);
    if (!(h->rbuf = malloc(READ_CHUNK))) goto oom;
    if (open_listener(h, errbuf, errlen)) goto err;
    h->epfd = epoll_create1(EPOLL_CLOEXEC);
    h->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->epfd < 0 || h->evfd < 0) {
        fail(errbuf, errlen, "http: epoll/eventfd: %s", strerror(errno));
        goto err;
    }
    struct epoll_event el = {.events = EPOLLIN, .data.ptr = &h->tag_listen};
    struct epoll_event ee = {.events = EPOLLIN, .data.ptr = &h->tag_event};
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->lfd, &el) || epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->evfd, &ee)) {
        fail(errbuf, errlen, "http: epoll_ctl: %s", strerror(errno));
        goto err;
    }
    h->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return h;
oom:
    buf_free(&rb);
    fail(errbuf, errlen, "http: out of memory");
err:
    srv_http_destroy(h);
    return NULL;
}

static void begin_drain(srv_http *h) {
    h->draining = true;
    h->drain_deadline = h->now + h->cfg.drain_ms;
    if (h->lfd >= 0) {
        epoll_ctl(h->epfd, EPOLL_CTL_DEL, h->lfd, NULL);
        close(h->lfd);
        h->lfd = -1;
    }
}

/* Drain is over when every connection is between requests. */
static bool any_busy(srv_http *h) {
    for (conn *c = h->conns; c; c = c->next) {
        if (c->state == C_IDLE || c->state == C_LINGER) continue;
        if (c->state == C_HEAD && !c->parsing && c->in.off == c->in.len) continue;
        return true;
    }
    return false;
}

static int next_timeout(srv_http *h) {
    pthread_mutex_lock(&h->lock);
    bool dirty = h->dirty != NULL;
    pthread_mutex_unlock(&h->lock);
    if (dirty) return 0;
    int64_t t = MAX_TICK_MS;
    for (int qi = 0; qi < NQ; qi++)
        if (h->tq[qi].head) {
            int64_t d = h->tq[qi].head->t + h->tq[qi].timeout - h->now;
            if (d < t) t = d;
        }
    if (h->draining) {
        if (t > 20) t = 20;
        if (h->drain_deadline - h->now < t) t = h->drain_deadline - h->now;
    }
    return t < 0 ? 0 : (int)t;
}

int srv_http_run(srv_http *h) {
    struct epoll_event evs[MAX_EVENTS];
    int rc = 0;
    tl_loop = h;
    h->now = now_ms();
    for (;;) {
        if (atomic_load(&h->stop) && !h->draining) begin_drain(h);
        if (h->draining && (h->now >= h->drain_deadline || !any_busy(h))) break;
        int n = epoll_wait(h->epfd, evs, MAX_EVENTS, next_timeout(h));
        h->now = now_ms();
        if (n < 0 && errno != EINTR) {
            rc = RC_EIO;
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            uint32_t e = evs[i].events;
            if (p == &h->tag_listen) {
                do_accept(h);
                continue;
            }
            if (p == &h->tag_event) {
                uint64_t v;
                if (read(h->evfd, &v, sizeof v) < 0) { /* spurious */ }
                continue;
            }
            conn *c = p;
            if (e & (EPOLLERR | EPOLLHUP)) {
                conn_close(h, c);
                continue;
            }
            if ((e & (EPOLLIN | EPOLLRDHUP)) && conn_read(h, c, e) < 0) continue;
            conn_run(h, c);
        }
        process_dirty(h);
        run_timers(h);
    }
    /* past the drain: whatever is still open is cut, its on_close told */
    while (h->conns) conn_close(h, h->conns);
    while (process_dirty(h)) {}
    tl_loop = NULL;
    return rc;
}

void srv_http_destroy(srv_http *h) {
    if (!h) return;
    while (h->conns) conn_close(h, h->conns); /* only if run never ran to its end */
    while (process_dirty(h)) {}
    pthread_mutex_lock(&h->lock);
    h->destroying = true;
    while (h->live_reqs > 0) pthread_cond_wait(&h->cond, &h->lock); /* producers still hold requests */
    pthread_mutex_unlock(&h->lock);
    if (h->lfd >= 0) close(h->lfd);
    if (h->epfd >= 0) close(h->epfd);
    if (h->evfd >= 0) close(h->evfd);
    if (h->reserve_fd >= 0) close(h->reserve_fd);
    free(h->rbuf);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->cond);
    free(h);
}
