/* test_http.c - the HTTP front end over real sockets: keep-alive, pipelining,
 * limits (413/431/400/408/503), chunked streams, SSE keep-alive comments,
 * disconnects (on_close exactly once, later writes fail), deferred answers,
 * slow readers and the graceful stop.  Each test starts its own server on
 * port 0 with the limits it needs.  The client reads responses with
 * libhttp-parser in response mode, so our framing is checked by an
 * independent reader rather than by our own assumptions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/http.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ the server */

typedef struct fix {
    srv_http *h;
    pthread_t th;
    int port;
    pthread_mutex_t mu;
    pthread_t prod[64];
    int nprod;
    atomic_int on_close_calls;    /* every on_close of every route */
    atomic_int producer_done;     /* producers that finished their script */
    atomic_int write_failed;      /* a write returned -1 */
    atomic_int late_write_failed; /* a write after on_close returned -1 */
    atomic_long flood_bytes;
    atomic_int gate;              /* the client saw what it waited for (prod_slow, prod_drain) */
} fix;

typedef struct {
    fix *f;
    srv_req *r;
    srv_stream *s;
    int closes_before; /* on_close_calls when the job began */
    char body[256];
} job;

static void on_close_cb(void *arg) {
    fix *f = arg;
    atomic_fetch_add(&f->on_close_calls, 1);
}

static void spawn(fix *f, void *(*fn)(void *), job *j) {
    /* server thread: no cmocka asserts here, they longjmp */
    pthread_mutex_lock(&f->mu);
    if (f->nprod >= 64 || pthread_create(&f->prod[f->nprod++], NULL, fn, j)) abort();
    pthread_mutex_unlock(&f->mu);
}

static void *prod_stream(void *a) { /* 100 chunks, then close */
    job *j = a;
    for (int i = 0; i < 100; i++) {
        char line[64];
        int n = snprintf(line, sizeof line, "data: %d\n\n", i);
        srv_stream_write(j->s, line, (size_t)n);
        if (i % 10 == 0) sleep_ms(1);
    }
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_slow(void *a) { /* silent until the client has seen what it waits for (at most 5 s) */
    job *j = a;
    for (int i = 0; i < 1000 && !atomic_load(&j->f->gate); i++) sleep_ms(5);
    srv_stream_write(j->s, "data: done\n\n", 12);
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_drain(void *a) { /* 20 chunks, 10 ms apart; after the first, silent until the gate (at most 5 s) */
    job *j = a;
    for (int i = 0; i < 20; i++) {
        char line[64];
        int n = snprintf(line, sizeof line, "data: %d\n\n", i);
        srv_stream_write(j->s, line, (size_t)n);
        for (int w = 0; i == 0 && w < 1000 && !atomic_load(&j->f->gate); w++) sleep_ms(5);
        sleep_ms(10);
    }
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void wait_on_close(fix *f, int want) { /* up to 10 s */
    for (int i = 0; i < 2000 && atomic_load(&f->on_close_calls) < want; i++) sleep_ms(5);
}

static void *prod_endless(void *a) { /* write until the client is gone */
    job *j = a;
    while (srv_stream_write(j->s, "data: tick\n\n", 12) == 0) sleep_ms(2);
    atomic_fetch_add(&j->f->write_failed, 1);
    wait_on_close(j->f, j->closes_before + 1);
    if (srv_stream_write(j->s, "data: late\n\n", 12) == -1) atomic_fetch_add(&j->f->late_write_failed, 1);
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_forever(void *a) { /* only on_close ends it (or 10 s) */
    job *j = a;
    srv_stream_write(j->s, "data: hi\n\n", 10);
    for (int i = 0; i < 2000 && atomic_load(&j->f->on_close_calls) == 0; i++) sleep_ms(5);
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_flood(void *a) { /* a client that never reads */
    job *j = a;
    static char block[64 * 1024];
    memset(block, 'x', sizeof block);
    while (srv_stream_write(j->s, block, sizeof block) == 0) atomic_fetch_add(&j->f->flood_bytes, (long)sizeof block);
    atomic_fetch_add(&j->f->write_failed, 1);
    wait_on_close(j->f, j->closes_before + 1); /* overflow counts as a disconnect */
    srv_stream_close(j->s);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_defer(void *a) {
    job *j = a;
    sleep_ms(50);
    char out[300];
    int n = snprintf(out, sizeof out, "deferred:%s", j->body);
    srv_respond(j->r, 200, "text/plain", out, (size_t)n, NULL);
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static void *prod_defer_gone(void *a) { /* answers only after the client left */
    job *j = a;
    wait_on_close(j->f, j->closes_before + 1);
    srv_respond(j->r, 200, "text/plain", "late", 4, NULL); /* dropped */
    atomic_fetch_add(&j->f->producer_done, 1);
    free(j);
    return NULL;
}

static job *new_job(fix *f, srv_req *r) {
    job *j = calloc(1, sizeof *j);
    j->f = f;
    j->r = r;
    j->closes_before = atomic_load(&f->on_close_calls);
    return j;
}

static void handler(void *arg, srv_req *r) {
    fix *f = arg;
    const srv_req_info *in = srv_req_info_of(r);
    const char *m = in->method, *p = in->path;
    if (!strcmp(m, "GET") && !strcmp(p, "/hello")) {
        srv_respond(r, 200, "text/plain", "hello", 5, NULL);
    } else if (!strcmp(m, "POST") && !strcmp(p, "/echo")) {
        char extra[512];
        const char *e = srv_req_header(r, "x-empty");
        snprintf(extra, sizeof extra, "X-Query: %s\r\nX-Empty-Was: [%s]\r\n", in->query, e ? e : "absent");
        if (strlen(in->body) != in->body_len) abort(); /* a NUL-terminated copy */
        srv_respond(r, 200, "application/octet-stream", in->body, in->body_len, extra);
    } else if (!strcmp(m, "POST") && !strcmp(p, "/defer")) {
        job *j = new_job(f, r);
        snprintf(j->body, sizeof j->body, "%s", in->body);
        srv_req_on_close(r, on_close_cb, f);
        spawn(f, prod_defer, j);
    } else if (!strcmp(m, "GET") && !strcmp(p, "/defer-gone")) {
        srv_req_on_close(r, on_close_cb, f);
        spawn(f, prod_defer_gone, new_job(f, r));
    } else if (!strcmp(m, "GET") && !strncmp(p, "/", 1) &&
               (!strcmp(p, "/stream") || !strcmp(p, "/slow-stream") || !strcmp(p, "/endless") ||
                !strcmp(p, "/forever") || !strcmp(p, "/flood") || !strcmp(p, "/drain-stream"))) {
        job *j = new_job(f, r);
        j->s = srv_stream_open(r, 200, "text/event-stream", on_close_cb, f);
        void *(*fn)(void *) = !strcmp(p, "/stream")        ? prod_stream
                              : !strcmp(p, "/slow-stream") ? prod_slow
                              : !strcmp(p, "/endless")     ? prod_endless
                              : !strcmp(p, "/forever")     ? prod_forever
                              : !strcmp(p, "/flood")       ? prod_flood
                                                           : prod_drain;
        spawn(f, fn, j);
    } else {
        const char *b = "{\"error\":{\"message\":\"not found\",\"type\":\"invalid_request_error\"}}";
        srv_respond(r, 404, "application/json", b, strlen(b), NULL);
    }
}

static void *run_thread(void *a) {
    fix *f = a;
    if (srv_http_run(f->h) != 0) abort();
    return NULL;
}

static srv_http_cfg base_cfg(void) {
    srv_http_cfg c = {0};
    c.host = "127.0.0.1";
    c.port = 0;
    return c;
}

static fix *fx_start(srv_http_cfg cfg) {
    fix *f = calloc(1, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    char err[256] = "";
    f->h = srv_http_create(&cfg, handler, f, err, sizeof err);
    if (!f->h) fail_msg("create: %s", err);
    f->port = srv_http_port(f->h);
    assert_true(f->port > 0);
    assert_int_equal(pthread_create(&f->th, NULL, run_thread, f), 0);
    return f;
}

static void fx_join_producers(fix *f) {
    pthread_mutex_lock(&f->mu);
    int n = f->nprod;
    pthread_mutex_unlock(&f->mu);
    for (int i = 0; i < n; i++) pthread_join(f->prod[i], NULL);
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->nprod, n);
    f->nprod = 0;
    pthread_mutex_unlock(&f->mu);
}

static void fx_end(fix *f, int stopped) {
    if (!stopped) srv_http_stop(f->h);
    pthread_join(f->th, NULL);
    fx_join_producers(f);
    srv_http_destroy(f->h);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

/* ------------------------------------------------------------ the client */

typedef struct {
    int fd;
    char buf[1 << 16];
    size_t len, off;
} client;

typedef struct {
    int status, done;
    char headers[8192]; /* "name: value\n" */
    size_t hlen;
    int last_value;
    char *body;
    size_t body_len, body_cap;
} resp;

static client *cl_open(int port) {
    client *c = calloc(1, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return c;
}

static void cl_close(client *c) {
    close(c->fd);
    free(c);
}

static void cl_send(client *c, const char *d, size_t n) {
    while (n) {
        ssize_t k = send(c->fd, d, n, MSG_NOSIGNAL);
        assert_true(k > 0);
        d += k;
        n -= (size_t)k;
    }
}

static void cl_sends(client *c, const char *s) { cl_send(c, s, strlen(s)); }

static void hadd(resp *r, const char *d, size_t n) {
    if (r->hlen + n >= sizeof r->headers) n = sizeof r->headers - 1 - r->hlen;
    memcpy(r->headers + r->hlen, d, n);
    r->hlen += n;
    r->headers[r->hlen] = '\0';
}

static int rp_status(http_parser *p, const char *at, size_t n) {
    ((resp *)p->data)->status = (int)p->status_code;
    return 0;
}
static int rp_field(http_parser *p, const char *at, size_t n) {
    resp *r = p->data;
    if (r->last_value) hadd(r, "\n", 1);
    r->last_value = 0;
    hadd(r, at, n);
    return 0;
}
static int rp_value(http_parser *p, const char *at, size_t n) {
    resp *r = p->data;
    if (!r->last_value) hadd(r, ": ", 2);
    r->last_value = 1;
    hadd(r, at, n);
    return 0;
}
static int rp_hdone(http_parser *p) {
    resp *r = p->data;
    hadd(r, "\n", 1);
    r->status = (int)p->status_code;
    return 0;
}
static int rp_body(http_parser *p, const char *at, size_t n) {
    resp *r = p->data;
    if (r->body_len + n + 1 > r->body_cap) {
        r->body_cap = (r->body_len + n + 1) * 2;
        r->body = realloc(r->body, r->body_cap);
    }
    memcpy(r->body + r->body_len, at, n);
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}
static int rp_done(http_parser *p) {
    ((resp *)p->data)->done = 1;
    http_parser_pause(p, 1);
    return 0;
}
static const http_parser_settings rp_settings = {
    .on_status = rp_status,
    .on_header_field = rp_field,
    .on_header_value = rp_value,
    .on_headers_complete = rp_hdone,
    .on_body = rp_body,
    .on_message_complete = rp_done,
};

static void resp_free(resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

/* Wait for readable input up to ms; then recv into the client buffer. 0 on EOF/timeout/error. */
static ssize_t cl_fill(client *c, int ms) {
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    if (poll(&pf, 1, ms) <= 0) return -1;
    ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
    if (n > 0) {
        c->off = 0;
        c->len = (size_t)n;
    }
    return n;
}

/* Read one complete response.  0 ok, -1 EOF/timeout, -2 bad framing.
 * progress (optional) looks at the response after each piece that came. */
static int cl_read_cb(client *c, resp *r, int ms, void (*progress)(const resp *, void *), void *arg) {
    memset(r, 0, sizeof *r);
    http_parser p;
    http_parser_init(&p, HTTP_RESPONSE);
    p.data = r;
    double end = now_s() + ms / 1000.0;
    for (;;) {
        if (c->off < c->len) {
            size_t n = http_parser_execute(&p, &rp_settings, c->buf + c->off, c->len - c->off);
            c->off += n;
            if (progress) progress(r, arg);
            if (r->done) return 0;
            if (HTTP_PARSER_ERRNO(&p) != HPE_OK) return -2;
        }
        c->off = c->len = 0;
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0) return -1;
        ssize_t n = cl_fill(c, left);
        if (n == 0) { /* EOF ends a body that runs until close */
            http_parser_execute(&p, &rp_settings, NULL, 0);
            return r->done ? 0 : -1;
        }
        if (n < 0) return -1;
    }
}

static int cl_read(client *c, resp *r, int ms) { return cl_read_cb(c, r, ms, NULL, NULL); }

/* The server closes within ms (whatever it still sends is skipped). */
/* 1 when the server ends the connection within ms: a FIN, or any receive
 * error (a reset, which some network stacks report as EPIPE or ECONNABORTED
 * rather than ECONNRESET).  0 only when the connection is still open. */
static int cl_eof(client *c, int ms) {
    double end = now_s() + ms / 1000.0;
    c->off = c->len = 0;
    for (;;) {
        int left = (int)((end - now_s()) * 1000);
        if (left <= 0) return 0;
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pf, 1, left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return 0;
        ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
        if (n == 0) return 1;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            fprintf(stderr, "cl_eof: connection ended by %s\n", strerror(errno));
            return 1;
        }
    }
}

static const char *hdr(const resp *r, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    for (const char *l = r->headers; *l;) {
        const char *e = strchr(l, '\n');
        if (!e) break;
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 2;
            size_t vl = (size_t)(e - v) < cap - 1 ? (size_t)(e - v) : cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return out;
        }
        l = e + 1;
    }
    return NULL;
}

static void assert_hdr(const resp *r, const char *name, const char *want) {
    char v[256];
    const char *got = hdr(r, name, v, sizeof v);
    if (!got) fail_msg("missing header %s in:\n%s", name, r->headers);
    assert_string_equal(got, want);
}

static void get_hello(client *c) {
    resp r;
    cl_sends(c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    resp_free(&r);
}

static void assert_json_error(const resp *r, int status, const char *type) {
    assert_int_equal(r->status, status);
    assert_hdr(r, "Content-Type", "application/json");
    assert_hdr(r, "Connection", "close");
    char want[96];
    snprintf(want, sizeof want, "\"type\":\"%s\",\"param\":null,\"code\":null}}", type);
    assert_non_null(r->body);
    assert_non_null(strstr(r->body, want));
    assert_true(!strncmp(r->body, "{\"error\":{\"message\":\"", 21));
}

/* ------------------------------------------------------------- the tests */

static void test_keepalive(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    for (int i = 0; i < 3; i++) {
        resp r;
        cl_sends(c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_int_equal(cl_read(c, &r, 3000), 0);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, "hello");
        assert_hdr(&r, "Connection", "keep-alive");
        assert_hdr(&r, "Content-Length", "5");
        assert_hdr(&r, "Server", "deepinfer");
        resp_free(&r);
    }
    resp r;
    cl_sends(c, "POST /echo?x=1&y=2#frag HTTP/1.1\r\nHost: t\r\nX-Empty:\r\nContent-Length: 3\r\n\r\nabc");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "abc");
    assert_hdr(&r, "X-Query", "x=1&y=2");
    assert_hdr(&r, "X-Empty-Was", "[]");
    resp_free(&r);
    cl_sends(c, "GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"); /* the handler's 404 keeps the connection */
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 404);
    resp_free(&r);
    get_hello(c);
    cl_close(c);

    c = cl_open(f->port); /* HTTP/1.0: close unless asked */
    cl_sends(c, "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_hdr(&r, "Connection", "keep-alive");
    resp_free(&r);
    cl_sends(c, "GET /hello HTTP/1.0\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_hdr(&r, "Connection", "close");
    resp_free(&r);
    assert_true(cl_eof(c, 3000));
    cl_close(c);

    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.requests, 8);
    assert_int_equal(st.bad_requests, 0);
    fx_end(f, 0);
}

static void test_pipelining(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    cl_sends(c, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
                "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nfirst"
                "POST /echo?q=1 HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nsec\r\n3\r\nond\r\n0\r\n"
                "X-Trailer-With-A-Long-Name-To-Grow-The-Buffer: 0123456789012345678901234567890123456789012345678\r\n"
                "X-Trailer-2: 0123456789012345678901234567890123456789012345678901234567890123456789012345678\r\n"
                "X-Trailer-3: 0123456789012345678901234567890123456789012345678901234567890123456789012345678\r\n"
                "X-Trailer-4: 0123456789012345678901234567890123456789012345678901234567890123456789012345678\r\n"
                "X-Trailer-5: 0123456789012345678901234567890123456789012345678901234567890123456789012345678\r\n\r\n"
                "GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    resp r;
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "first");
    resp_free(&r);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "second");
    assert_hdr(&r, "X-Query", "q=1"); /* trailers do not disturb the parsed head */
    assert_hdr(&r, "X-Empty-Was", "[absent]");
    resp_free(&r);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "hello");
    assert_hdr(&r, "Connection", "close");
    resp_free(&r);
    assert_true(cl_eof(c, 3000));
    cl_close(c);

    /* pipelined behind a deferred answer: still in order */
    c = cl_open(f->port);
    cl_sends(c, "POST /defer HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nab"
                "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "deferred:ab");
    resp_free(&r);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    cl_close(c);
    fx_end(f, 0);
}

static void test_limits(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.max_body = 1024;
    cfg.max_header = 2048;
    fix *f = fx_start(cfg);
    resp r;

    client *c = cl_open(f->port); /* declared too large: answered before any body */
    cl_sends(c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_json_error(&r, 413, "invalid_request_error");
    resp_free(&r);
    assert_true(cl_eof(c, 3000));
    cl_close(c);

    c = cl_open(f->port); /* chunked past the limit */
    cl_sends(c, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n");
    char big[2048];
    memset(big, 'a', sizeof big);
    cl_send(c, big, sizeof big);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_json_error(&r, 413, "invalid_request_error");
    resp_free(&r);
    cl_close(c);

    c = cl_open(f->port); /* exactly at the limit is fine */
    cl_sends(c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1024\r\n\r\n");
    cl_send(c, big, 1024);
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 1024);
    resp_free(&r);
    cl_close(c);

    c = cl_open(f->port); /* huge header */
    cl_sends(c, "GET /hello HTTP/1.1\r\nHost: t\r\nX-Big: ");
    memset(big, 'b', sizeof big);
    cl_send(c, big, sizeof big);
    cl_sends(c, "\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_json_error(&r, 431, "invalid_request_error");
    resp_free(&r);
    cl_close(c);

    c = cl_open(f->port); /* garbage */
    cl_sends(c, "THIS IS NOT HTTP\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_json_error(&r, 400, "invalid_request_error");
    resp_free(&r);
    assert_true(cl_eof(c, 3000));
    cl_close(c);

    c = cl_open(f->port); /* smuggling shape: both Content-Length and chunked */
    cl_sends(c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_json_error(&r, 400, "invalid_request_error");
    resp_free(&r);
    cl_close(c);

    c = cl_open(f->port); /* 100-continue: the interim answer comes before the body is sent */
    cl_sends(c, "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 100);
    resp_free(&r);
    cl_sends(c, "hello");
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "hello");
    resp_free(&r);
    cl_close(c);

    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.bad_requests, 5);
    fx_end(f, 0);
}

static void test_slowloris(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.header_timeout_ms = 200;
    fix *f = fx_start(cfg);
    client *c = cl_open(f->port);
    double t0 = now_s();
    cl_sends(c, "GET /hello HTTP/1.1\r\n");
    /* a byte trickle does not extend the deadline: the whole head must come in
     * time.  The trickle goes on for 5 s, so an answer that waited for it to
     * stop is told apart from one at the deadline by seconds, not by
     * milliseconds of scheduling */
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    int sent = 0;
    for (; sent < 100 && poll(&pf, 1, 50) == 0; sent++) send(c->fd, "X-A: 1\r\n", 8, MSG_NOSIGNAL);
    if (sent == 100) fail_msg("no answer during 5 s of trickled headers (header timeout 200 ms)");
    resp r;
    assert_int_equal(cl_read(c, &r, 3000), 0);
    double dt = now_s() - t0;
    assert_json_error(&r, 408, "invalid_request_error");
    resp_free(&r);
    if (!(dt > 0.15 && dt < 4.0)) fail_msg("408 after %.3f s (header timeout 200 ms, trickle for 5 s)", dt);
    cl_close(c);
    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.timeouts, 1); /* counted before the 408 was queued */
    fx_end(f, 0);

    /* keep-alive: a finished request resets the head clock.  Its own server
     * with a 1 s header timeout: the first request comes 300 ms after accept
     * (700 ms to spare however late the sleep wakes), the second 800 ms after
     * the first answer, so more than 1 s after accept: a head clock still
     * counting from accept would have closed the connection before it */
    cfg.header_timeout_ms = 1000;
    f = fx_start(cfg);
    c = cl_open(f->port);
    sleep_ms(300);
    get_hello(c);
    sleep_ms(800);
    get_hello(c);
    cl_close(c);
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.timeouts, 0);
    fx_end(f, 0);
}

static void test_max_connections(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.max_connections = 4;
    fix *f = fx_start(cfg);
    client *cs[4];
    for (int i = 0; i < 4; i++) {
        cs[i] = cl_open(f->port);
        get_hello(cs[i]);
    }
    client *x = cl_open(f->port);
    cl_sends(x, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n");
    resp r;
    assert_int_equal(cl_read(x, &r, 3000), 0);
    assert_json_error(&r, 503, "server_error");
    resp_free(&r);
    assert_true(cl_eof(x, 3000));
    cl_close(x);
    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.rejected_connections, 1);
    assert_int_equal(st.open_connections, 4);

    cl_close(cs[0]); /* a freed slot is usable again */
    for (int i = 0; i < 2000; i++) {
        srv_http_get_stats(f->h, &st);
        if (st.open_connections == 3) break;
        sleep_ms(5);
    }
    assert_int_equal(st.open_connections, 3);
    cs[0] = cl_open(f->port);
    get_hello(cs[0]);
    for (int i = 0; i < 4; i++) cl_close(cs[i]);
    fx_end(f, 0);
}

static void test_stream(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    cl_sends(c, "GET /stream HTTP/1.1\r\nHost: t\r\n\r\n");
    resp r;
    assert_int_equal(cl_read(c, &r, 5000), 0);
    assert_int_equal(r.status, 200);
    assert_hdr(&r, "Transfer-Encoding", "chunked");
    assert_hdr(&r, "Cache-Control", "no-cache");
    assert_hdr(&r, "X-Accel-Buffering", "no");
    assert_hdr(&r, "Content-Type", "text/event-stream");
    assert_hdr(&r, "Connection", "keep-alive");
    char want[2048] = "";
    for (int i = 0; i < 100; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "data: %d\n\n", i);
    assert_string_equal(r.body, want);
    resp_free(&r);
    get_hello(c); /* the connection outlives its stream */

    /* HTTP/1.0 cannot read chunks: the stream is raw and ends with the connection */
    client *d = cl_open(f->port);
    cl_sends(d, "GET /stream HTTP/1.0\r\n\r\n");
    assert_int_equal(cl_read(d, &r, 5000), 0);
    assert_string_equal(r.body, want);
    assert_hdr(&r, "Connection", "close");
    resp_free(&r);
    cl_close(d);
    cl_close(c);
    assert_int_equal(atomic_load(&f->on_close_calls), 0); /* finished streams are not "closed by the client" */
    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.open_streams, 0);
    fx_end(f, 0);
}

/* Opens the gate of prod_slow once two keep-alive comments came. */
static void gate_after_two_comments(const resp *r, void *arg) {
    fix *f = arg;
    if (r->body && !strncmp(r->body, ":\n\n:\n\n", 6)) atomic_store(&f->gate, 1);
}

static void test_sse_keepalive(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.keepalive_ms = 50;
    fix *f = fx_start(cfg);
    client *c = cl_open(f->port);
    /* the producer stays silent until this client has seen two comments, not
     * for a fixed time that a loaded machine could spend elsewhere; without
     * comments it speaks after 5 s and the count below fails */
    cl_sends(c, "GET /slow-stream HTTP/1.1\r\nHost: t\r\n\r\n");
    resp r;
    assert_int_equal(cl_read_cb(c, &r, 10000, gate_after_two_comments, f), 0);
    assert_int_equal(r.status, 200);
    int comments = 0;
    const char *b = r.body;
    while (!strncmp(b, ":\n\n", 3)) {
        comments++;
        b += 3;
    }
    assert_true(comments >= 2);
    assert_string_equal(b, "data: done\n\n");
    resp_free(&r);
    cl_close(c);
    fx_end(f, 0);
}

static void test_disconnect_stream(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    cl_sends(c, "GET /endless HTTP/1.1\r\nHost: t\r\n\r\n");
    size_t got = 0;
    while (got < 300 && cl_fill(c, 3000) > 0) got += c->len;
    assert_true(got >= 300);
    cl_close(c); /* mid-stream */
    for (int i = 0; i < 2000 && atomic_load(&f->producer_done) < 1; i++) sleep_ms(5);
    assert_int_equal(atomic_load(&f->producer_done), 1);
    assert_int_equal(atomic_load(&f->write_failed), 1);
    assert_int_equal(atomic_load(&f->late_write_failed), 1);
    assert_int_equal(atomic_load(&f->on_close_calls), 1);

    /* a deferred answer whose client left: on_close once, the late answer dropped */
    c = cl_open(f->port);
    cl_sends(c, "GET /defer-gone HTTP/1.1\r\nHost: t\r\n\r\n");
    sleep_ms(30);
    cl_close(c);
    for (int i = 0; i < 2000 && atomic_load(&f->producer_done) < 2; i++) sleep_ms(5);
    assert_int_equal(atomic_load(&f->producer_done), 2);
    assert_int_equal(atomic_load(&f->on_close_calls), 2);

    c = cl_open(f->port); /* and the server is fine */
    get_hello(c);
    cl_close(c);
    srv_http_stats st;
    srv_http_get_stats(f->h, &st);
    assert_int_equal(st.open_streams, 0);
    fx_end(f, 0);
}

static void test_defer(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    double t0 = now_s();
    cl_sends(c, "POST /defer HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nxyz");
    resp r;
    assert_int_equal(cl_read(c, &r, 3000), 0);
    assert_true(now_s() - t0 >= 0.045);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "deferred:xyz");
    resp_free(&r);
    get_hello(c);
    cl_close(c);
    assert_int_equal(atomic_load(&f->on_close_calls), 0);
    fx_end(f, 0);
}

static void test_slow_reader(void **state) {
    fix *f = fx_start(base_cfg());
    client *c = cl_open(f->port);
    int small = 4096; /* a small receive window: the server's queue must take the blow */
    setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    cl_sends(c, "GET /flood HTTP/1.1\r\nHost: t\r\n\r\n");
    client *o = cl_open(f->port);
    for (int i = 0; i < 3; i++) get_hello(o); /* others are served meanwhile */
    for (int i = 0; i < 2000 && atomic_load(&f->producer_done) < 1; i++) sleep_ms(10);
    assert_int_equal(atomic_load(&f->producer_done), 1);
    assert_int_equal(atomic_load(&f->write_failed), 1);
    assert_int_equal(atomic_load(&f->on_close_calls), 1);
    long sent = atomic_load(&f->flood_bytes);
    assert_true(sent >= (60L << 20) && sent <= (200L << 20));
    get_hello(o);
    cl_close(o);
    cl_close(c);
    fx_end(f, 0);
}

static void test_stop_drains(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.drain_ms = 10000; /* far above the stream's ~0.2 s, so that run returning early is visible */
    fix *f = fx_start(cfg);
    client *idle = cl_open(f->port);
    get_hello(idle);
    client *s = cl_open(f->port);
    cl_sends(s, "GET /drain-stream HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_true(cl_fill(s, 3000) > 0); /* the stream has begun */
    double t0 = now_s();
    srv_http_stop(f->h);
    resp r; /* no pause: once stop has returned, a new request is refused */
    cl_sends(idle, "GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"); /* new request while draining */
    assert_int_equal(cl_read(idle, &r, 3000), 0);
    assert_json_error(&r, 503, "server_error");
    resp_free(&r);
    assert_true(cl_eof(idle, 3000));
    /* the stream holds the drain open until this client has its 503: were it
     * to end on a timer, a thread descheduled for ~0.2 s between the stop and
     * the send above would find the server gone (drained) instead */
    atomic_store(&f->gate, 1);
    assert_int_equal(cl_read(s, &r, 5000), 0); /* the open stream runs to its end */
    char want[512] = "";
    for (int i = 0; i < 20; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "data: %d\n\n", i);
    assert_string_equal(r.body, want);
    assert_hdr(&r, "Connection", "keep-alive"); /* opened before the stop */
    resp_free(&r);
    pthread_join(f->th, NULL); /* run returns once drained */
    double dt = now_s() - t0;
    if (!(dt < 6.0)) fail_msg("run returned %.3f s after stop: not once drained (the deadline is 10 s)", dt);
    assert_true(cl_eof(s, 3000));
    assert_int_equal(atomic_load(&f->on_close_calls), 0);
    cl_close(s);
    cl_close(idle);
    fx_join_producers(f);
    srv_http_destroy(f->h);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static void test_stop_deadline(void **state) {
    srv_http_cfg cfg = base_cfg();
    cfg.drain_ms = 200;
    fix *f = fx_start(cfg);
    client *s = cl_open(f->port);
    cl_sends(s, "GET /forever HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_true(cl_fill(s, 3000) > 0);
    double t0 = now_s();
    srv_http_stop(f->h);
    pthread_join(f->th, NULL);
    double dt = now_s() - t0;
    /* without the deadline run would return only when the producer gives up (>= 10 s) */
    if (!(dt >= 0.15 && dt < 6.0)) fail_msg("drain of 200 ms took %.3f s", dt);
    assert_int_equal(atomic_load(&f->on_close_calls), 1); /* the cut stream was told */
    assert_true(cl_eof(s, 3000));
    cl_close(s);
    fx_join_producers(f); /* its producer closes after run returned: fine */
    assert_int_equal(atomic_load(&f->producer_done), 1);
    srv_http_destroy(f->h);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keepalive),      cmocka_unit_test(test_pipelining),
        cmocka_unit_test(test_limits),         cmocka_unit_test(test_slowloris),
        cmocka_unit_test(test_max_connections), cmocka_unit_test(test_stream),
        cmocka_unit_test(test_sse_keepalive),  cmocka_unit_test(test_disconnect_stream),
        cmocka_unit_test(test_defer),          cmocka_unit_test(test_slow_reader),
        cmocka_unit_test(test_stop_drains),    cmocka_unit_test(test_stop_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
