/* metrics.h - the server's counters and histograms, rendered as Prometheus
 * text for GET /metrics.  All updates are thread-safe (one mutex; a few
 * updates per request and per token are far below contention). */
#ifndef SERVER_METRICS_H
#define SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/vec.h"
#include "kv/cache.h"

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_create(void);
void srv_metrics_destroy(srv_metrics *m);

/* api: "chat", "responses", "messages", "models", "health", "metrics", "other" */
void srv_metrics_request(srv_metrics *m, const char *api, int status);
void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t cached, uint64_t completion);
void srv_metrics_ttft(srv_metrics *m, double seconds);
void srv_metrics_itl(srv_metrics *m, double seconds);
void srv_metrics_e2e(srv_metrics *m, double seconds);

/* gauges are read at render time */
typedef struct {
    int running, waiting;
    size_t kv_bytes;
    int open_connections, open_streams;
    uint64_t cancelled;
    const kv_cache_stats *kv; /* prefix cache counters, or NULL */
} srv_gauges;


int srv_metrics_render(srv_metrics *m, const srv_gauges *g, rc_bytes *out);

#endif
