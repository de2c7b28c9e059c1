/* metrics.c - see metrics.h.  Histograms use fixed log-spaced buckets in
 * seconds, the usual Prometheus cumulative `le` form. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define NB (sizeof BUCKETS / sizeof BUCKETS[0])

typedef struct {
    uint64_t count[NB + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
} hist;

static const char *APIS[] = {"chat", "responses", "messages", "models", "health", "metrics", "other"};
#define NAPI (sizeof APIS / sizeof APIS[0])
static const int STATUSES[] = {200, 400, 404, 405, 408, 413, 415, 422, 429, 431, 500, 503};
#define NST (sizeof STATUSES / sizeof STATUSES[0])

struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t req[NAPI][NST + 1]; /* last column: other statuses */
    uint64_t prompt, cached, completion;
    hist ttft, itl, e2e;
};

srv_metrics *srv_metrics_create(void)
{
    srv_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_destroy(srv_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m, const char *api, int status)
{
    size_t a = NAPI - 1, s = NST;
    for (size_t i = 0; i < NAPI; i++)
        if (!strcmp(api, APIS[i])) a = i;
    for (size_t i = 0; i < NST; i++)
        if (STATUSES[i] == status) s = i;
    pthread_mutex_lock(&m->mu);
    m->req[a][s]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tokens(srv_metrics *m, uint64_t prompt, uint64_t cached, uint64_t completion)
{
    pthread_mutex_lock(&m->mu);
    m->prompt += prompt;
    m->cached += cached;
    m->completion += completion;
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, hist *h, double v)
{
    size_t b = NB;
    for (size_t i = 0; i < NB; i++)
        if (v <= BUCKETS[i]) { b = i; break; }
    pthread_mutex_lock(&m->mu);
    h->count[b]++;
    h->sum += v;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_ttft(srv_metrics *m, double s) { observe(m, &m->ttft, s); }
void srv_metrics_itl(srv_metrics *m, double s) { observe(m, &m->itl, s); }
void srv_metrics_e2e(srv_metrics *m, double s) { observe(m, &m->e2e, s); }

static void put(rc_bytes *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(rc_bytes *o, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) rc_bytes_append(o, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void put_hist(rc_bytes *o, const char *name, const char *help, const hist *h)
{
    put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (size_t i = 0; i < NB; i++) {
        cum += h->count[i];
        put(o, "%s_bucket{le=\"%g\"} %llu\n", name, BUCKETS[i], (unsigned long long)cum);
    }
    cum += h->count[NB];
    put(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
        name, (unsigned long long)h->n);
}

int srv_metrics_render(srv_metrics *m, const srv_gauges *g, rc_bytes *o)
{
    pthread_mutex_lock(&m->mu);
    put(o, "# HELP deepinfer_requests_total Requests answered, by API and HTTP status.\n"
           "# TYPE deepinfer_requests_total counter\n");
    for (size_t a = 0; a < NAPI; a++)
        for (size_t s = 0; s <= NST; s++)
            if (m->req[a][s]) {
                if (s < NST)
                    put(o, "deepinfer_requests_total{api=\"%s\",status=\"%d\"} %llu\n", APIS[a], STATUSES[s],
                        (unsigned long long)m->req[a][s]);
                else
                    put(o, "deepinfer_requests_total{api=\"%s\",status=\"other\"} %llu\n", APIS[a],
                        (unsigned long long)m->req[a][s]);
            }
    put(o, "# HELP deepinfer_prompt_tokens_total Prompt tokens of admitted requests.\n"
           "# TYPE deepinfer_prompt_tokens_total counter\ndeepinfer_prompt_tokens_total %llu\n",
        (unsigned long long)m->prompt);
    put(o, "# HELP deepinfer_prompt_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n"
           "# TYPE deepinfer_prompt_cache_hit_tokens_total counter\ndeepinfer_prompt_cache_hit_tokens_total %llu\n",
        (unsigned long long)m->cached);
    put(o, "# HELP deepinfer_completion_tokens_total Generated tokens.\n"
           "# TYPE deepinfer_completion_tokens_total counter\ndeepinfer_completion_tokens_total %llu\n",
        (unsigned long long)m->completion);
    put_hist(o, "deepinfer_time_to_first_token_seconds", "Arrival to first generated token.", &m->ttft);
    put_hist(o, "deepinfer_inter_token_seconds", "Time between consecutive generated tokens.", &m->itl);
    put_hist(o, "deepinfer_request_seconds", "Arrival to the last byte of the response.", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    put(o, "# HELP deepinfer_running_sequences Sequences in the batch.\n# TYPE deepinfer_running_sequences gauge\n"
           "deepinfer_running_sequences %d\n", g->running);
    put(o, "# HELP deepinfer_waiting_sequences Requests queued for admission.\n"
           "# TYPE deepinfer_waiting_sequences gauge\ndeepinfer_waiting_sequences %d\n", g->waiting);
    put(o, "# HELP deepinfer_kv_bytes Decoding state held by running sequences.\n# TYPE deepinfer_kv_bytes gauge\n"
           "deepinfer_kv_bytes %zu\n", g->kv_bytes);
    put(o, "# HELP deepinfer_open_connections Open HTTP connections.\n# TYPE deepinfer_open_connections gauge\n"
           "deepinfer_open_connections %d\n", g->open_connections);
    put(o, "# HELP deepinfer_open_streams Open streamed responses.\n# TYPE deepinfer_open_streams gauge\n"
           "deepinfer_open_streams %d\n", g->open_streams);
    put(o, "# HELP deepinfer_cancelled_total Requests ended because the client went away.\n"
           "# TYPE deepinfer_cancelled_total counter\ndeepinfer_cancelled_total %llu\n",
        (unsigned long long)g->cancelled);
    const kv_cache_stats *k = g->kv;
    if (!k) return 0;
#define KC(name, help, type, v) \
    put(o, "# HELP deepinfer_kv_" name " " help "\n# TYPE deepinfer_kv_" name " " type "\ndeepinfer_kv_" name " %llu\n", \
        (unsigned long long)(v))
    KC("lookups_total", "Prefix-cache lookups (one per admitted request).", "counter", k->lookups);
    KC("lookup_tokens_total", "Prompt tokens of those lookups.", "counter", k->lookup_tokens);
    KC("hit_tokens_total", "Prompt tokens whose KV came from the cache (replayed tokens excluded).", "counter",
       k->hit_tokens);
    KC("replayed_tokens_total", "Tokens recomputed by bounded replay.", "counter", k->replayed_tokens);
    static const char *const paths[] = {"miss", "short", "exact", "replay"};
    put(o, "# HELP deepinfer_kv_lookups_by_path_total Lookups by outcome: miss (no cached block), short (no full "
           "block before the last prompt token), exact (window state present), replay (bounded replay).\n"
           "# TYPE deepinfer_kv_lookups_by_path_total counter\n");
    for (int i = 0; i < 4; i++)
        put(o, "deepinfer_kv_lookups_by_path_total{path=\"%s\"} %llu\n", paths[i], (unsigned long long)k->path[i]);
    static const char *const tiers[] = {"memory", "host", "disk"};
    put(o, "# HELP deepinfer_kv_block_hits_total 128-token blocks found, by tier.\n"
           "# TYPE deepinfer_kv_block_hits_total counter\n");
    for (int i = 0; i < 3; i++)
        put(o, "deepinfer_kv_block_hits_total{tier=\"%s\"} %llu\n", tiers[i], (unsigned long long)k->block_hits[i]);
    put(o, "# HELP deepinfer_kv_window_hits_total Window states found, by tier.\n"
           "# TYPE deepinfer_kv_window_hits_total counter\n"
           "deepinfer_kv_window_hits_total{tier=\"memory\"} %llu\ndeepinfer_kv_window_hits_total{tier=\"disk\"} %llu\n",
        (unsigned long long)k->swa_hits_ram, (unsigned long long)k->swa_hits_disk);
    KC("published_blocks_total", "Blocks added to the cache.", "counter", k->published_blocks);
    KC("published_window_states_total", "Window states added to the cache.", "counter", k->published_swa);
    KC("memory_blocks", "Blocks in the memory tier.", "gauge", k->mem_blocks);
    KC("memory_bytes", "Bytes of the memory tier's blocks.", "gauge", k->mem_bytes);
    KC("host_bytes", "Bytes in the host tier.", "gauge", k->host_bytes);
    KC("window_bytes", "Bytes of window states in RAM.", "gauge", k->swa_bytes);
    put(o, "# HELP deepinfer_kv_evicted_total Entries evicted for capacity, by tier.\n"
           "# TYPE deepinfer_kv_evicted_total counter\n"
           "deepinfer_kv_evicted_total{tier=\"memory\"} %llu\ndeepinfer_kv_evicted_total{tier=\"host\"} %llu\n"
           "deepinfer_kv_evicted_total{tier=\"window\"} %llu\n",
        (unsigned long long)k->evicted_mem, (unsigned long long)k->evicted_host, (unsigned long long)k->evicted_swa);
    KC("disk_files", "Files in the disk tier.", "gauge", k->disk_files);
    KC("disk_bytes", "Bytes in the disk tier.", "gauge", k->disk_bytes);
    KC("disk_write_errors_total", "Disk writes that failed (disk full, directory gone); the block stays uncached.",
       "counter", k->disk_write_errors);
    KC("disk_damaged_total", "Damaged, truncated or foreign files read (treated as misses and removed).", "counter",
       k->disk_damaged);
    KC("disk_dropped_total", "Disk writes dropped because the write queue was full.", "counter", k->disk_dropped);
#undef KC
    return 0;
}
