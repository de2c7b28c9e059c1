/* metrics.h - the server's counters and histograms, rendered as Prometheus
 * text for GET /metrics.  All updates are thread-safe (one mutex; a few
 * updates per request and per token are far below contention). */
#ifndef SERVER_METRICS_H
#define SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/vec.h"

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
    const struct kv_cache_stats_view *kv; /* prefix cache counters, or NULL */
} srv_gauges;

/* the prefix cache's counters as /metrics shows them (filled from kv_cache_stats) */
typedef struct kv_cache_stats_view {
    uint64_t lookups, lookup_tokens, hit_tokens, replayed_tokens;
    uint64_t path[4];                 /* miss, short, exact, replay */
    uint64_t block_hits[3];           /* memory, host, disk */
    uint64_t swa_hits_ram, swa_hits_disk, published_blocks, published_swa;
    uint64_t mem_blocks, mem_bytes, host_bytes, swa_bytes;
    uint64_t evicted_mem, evicted_host, evicted_swa;
    uint64_t disk_files, disk_bytes, disk_write_errors, disk_damaged, disk_dropped;
} kv_cache_stats_view;

int srv_metrics_render(srv_metrics *m, const srv_gauges *g, rc_bytes *out);

#endif
