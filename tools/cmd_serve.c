/* cmd_serve.c - `deepinfer serve`: the HTTP API server.
 *
 * Wiring only: load the tokenizer and the model (or the scripted test
 * backend), start the engine thread, run the HTTP loop on this thread until
 * SIGINT/SIGTERM, then drain: open streams get drain time, the engine
 * finishes or cancels what is running. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scripted.h"
#include "kv/blockkey.h"
#include "kv/cache.h"
#include "model/v4.h"
#include "recipe/tokenizer.h"
#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"

static const char help[] =
    "usage: deepinfer serve --model DIR [options]\n\n"
    "Serve OpenAI Chat Completions (/v1/chat/completions), OpenAI Responses (/v1/responses) and\n"
    "Anthropic Messages (/v1/messages) for a DeepSeek V4 checkpoint, plus GET /v1/models, /health\n"
    "and /metrics (Prometheus).\n\n"
    "model\n"
    "  --model DIR             checkpoint directory (config.json + *.safetensors [+ tokenizer.json])\n"
    "  --model-name NAME       id reported by /v1/models and in responses (default: the directory name)\n"
    "  --backend B             cpu (default) runs the model on the CPU; cuda runs it on GPU 0 with the\n"
    "                          activations on the device (builds with nvcc; DEEPINFER_CUDA_GRAPH=host for\n"
    "                          the per-op form; docs/CUDA.md); scripted is a TEST backend that\n"
    "                          replays canned output chosen by [[script:NAME]] in the prompt (no model)\n"
    "  --scripts FILE          JSON {name: text} for --backend scripted, merged over the built-ins\n"
    "  --scripted-step-ms MS   --backend scripted: sleep MS per step (tests that act mid-stream)\n"
    "  --semantics S           official (default) or transformers: see `deepinfer logits --help`\n"
    "  --encoding v4|v4.1      prompt format (default v4)\n"
    "  --tokenizer FILE        tokenizer.json (default: DIR/tokenizer.json, else the bundled V4 one)\n"
    "  --threads N             CPU threads for the model (default: all)\n\n"
    "scheduling\n"
    "  --max-batch-tokens N    tokens per forward step: decodes + prefill chunks (default 2048)\n"
    "  --max-running N         sequences decoding at once (default 64)\n"
    "  --sample-threads N      threads that draw a step's sampled tokens (temperature > 0) on the host;\n"
    "                          the tokens do not depend on it (default: one a CPU, at most 16;\n"
    "                          DEEPINFER_SAMPLE_PRUNE=0 turns the sampler's fast paths off, for measurement)\n"
    "  --max-waiting N         queued requests; beyond it requests get 429 (default 256)\n"
    "  --context-length N      prompt + output tokens per request (default 65536)\n"
    "  --max-tokens-default N  max_tokens when a request gives none (default 1024)\n"
    "  --max-tokens-limit N    larger max_tokens is a 400 (default 65536)\n\n"
    "HTTP\n"
    "  --host ADDR             listen address (default 127.0.0.1)\n"
    "  --port N                listen port (default 8000)\n"
    "  --max-body BYTES        request body limit, 413 beyond (default 8388608)\n"
    "  --max-header BYTES      request head limit, 431 beyond (default 16384)\n"
    "  --max-connections N     open connections, 503 beyond (default 8192)\n"
    "  --header-timeout MS     a request head must arrive within this, 408 after (default 10000)\n"
    "  --keepalive-ms MS       SSE comment on a silent stream every MS (default 15000)\n"
    "  --quiet                 no per-request log lines\n\n"
    "prefix KV cache (128-token blocks; docs/KV.md):\n"
    "  --kv-cache on|off       reuse the KV of cached prompt prefixes (default on)\n"
    "  --kv-mem-mb N           memory tier: blocks kept for reuse beyond those in use (default 1024)\n"
    "  --kv-host-mb N          host tier: blocks evicted from the memory tier (default 1024; 0 = none)\n"
    "  --kv-dir DIR            disk tier: every block written through to DIR (atomic files, checksummed,\n"
    "                          expiring); servers sharing DIR (NFS, 3FS) hit each other's blocks\n"
    "  --kv-disk-gb N          disk tier capacity, least recently used files go first (default: unlimited)\n"
    "  --kv-compress LEVEL     zstd level for disk files (default 0 = off)\n"
    "  --kv-ttl-agent HOURS    lifetime of blocks of requests in class agent (default 72)\n"
    "  --kv-ttl-chat HOURS     lifetime of blocks of requests in class chat (default 168); a request picks\n"
    "                          its class by the body field \"cache_class\" or the header X-Cache-Class\n"
    "  --kv-swa-ttl S          lifetime of window states (default 180 s)\n"
    "  --kv-swa-mb N           RAM for window states (default 1024)\n"
    "  --kv-replay N           without a window state, recompute the last N tokens before the hit (window\n"
    "                          truncated to them; approximate unless N covers W + (L-1)(W-1)); 0 = exact\n"
    "                          hits only (default 128)\n"
    "  --kv-replay-publish on|off\n"
    "                          cache what a sequence computes after an approximate replay (default on: the\n"
    "                          session's later turns hit it); off: the cache holds only exact KV, and a\n"
    "                          session resumed after the window TTL replays again at every turn\n"
    "  --kv-window-every N     keep window states every N blocks of a prefill (and at each chunk's last block\n"
    "                          boundary, and every boundary while decoding); a hit up to N blocks past one is\n"
    "                          exact, the rest of it recomputed (default 4)\n"
    "  --kv-revision STR       weights revision mixed into the model fingerprint of every block key\n\n"
    "Each request logs one line on stderr: id, API, status, prompt/cached/completion tokens, TTFT, tok/s.\n"
    "`make run` serves a tiny random model made by `deepinfer make-tiny-model`: its answers are noise.\n";

static srv_http *g_http;

static eng_model_impl g_mi;

/* --backend cuda: the wrapped forward, and the backend whose error it checks */
static int (*g_fwd)(void *, void **, const int32_t **, const size_t *, float **, size_t, rc_err *);
static be_backend *g_be;

static int checked_forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits,
                           size_t count, rc_err *err)
{
    int rc = g_fwd(impl, seqs, ids, n, logits, count, err);
    if (!rc && cli_cuda_error(g_be)) rc = rc_errf(err, RC_EIO, "%s", cli_cuda_error(g_be));
    return rc;
}

static void on_signal(int sig)
{
    (void)sig;
    if (g_http) srv_http_stop(g_http);
}

int cmd_serve(int argc, char **argv)
{
    const char *model_dir = NULL, *model_name = NULL, *backend = "cpu", *scripts = NULL, *tok_path = NULL;
    md_semantics sem = MD_SEM_OFFICIAL;
    rc_encoding enc = RC_ENC_V4;
    long threads = 0, sample_threads = 0, max_batch = 2048, max_running = 64, max_waiting = 256, ctx = 65536, mt_def = 1024,
         mt_lim = 65536, port = 8000, max_body = 8 << 20, max_header = 16 << 10, max_conn = 8192,
         header_to = 10000, ka = 15000, step_ms = 0;
    int quiet = 0, kv_on = 1;
    long kv_mem = 1024, kv_host = 1024, kv_disk = 0, kv_comp = 0, kv_ttl_a = 72, kv_ttl_c = 168, kv_swa_ttl = 180,
         kv_swa_mb = 1024, kv_replay = 128, kv_every = 4;
    const char *kv_dir = NULL, *kv_rev = NULL;
    int kv_replay_pub = 1;
    srv_http_cfg hc = {.host = "127.0.0.1"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(help, stdout); return 0; }
        if (!strcmp(a, "--quiet")) { quiet = 1; continue; }
        if (!v) { fprintf(stderr, "serve: %s needs a value (see --help)\n", a); return 2; }
        i++;
        int bad = 0;
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--model-name")) model_name = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--scripts")) scripts = v;
        else if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--host")) hc.host = v;
        else if (!strcmp(a, "--semantics")) bad = md_semantics_parse(v, &sem) ? (fprintf(stderr, "serve: --semantics official|transformers\n"), -1) : 0;
        else if (!strcmp(a, "--encoding")) {
            if (!strcmp(v, "v4")) enc = RC_ENC_V4;
            else if (!strcmp(v, "v4.1")) enc = RC_ENC_V41;
            else { fprintf(stderr, "serve: --encoding v4|v4.1\n"); bad = -1; }
        }
        else if (!strcmp(a, "--threads")) bad = cli_int(a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--port")) bad = cli_int(a, v, 0, 65535, &port);
        else if (!strcmp(a, "--max-batch-tokens")) bad = cli_int(a, v, 1, 1 << 20, &max_batch);
        else if (!strcmp(a, "--max-running")) bad = cli_int(a, v, 1, 1 << 16, &max_running);
        else if (!strcmp(a, "--sample-threads")) bad = cli_int(a, v, 1, 1024, &sample_threads);
        else if (!strcmp(a, "--max-waiting")) bad = cli_int(a, v, 0, 1 << 20, &max_waiting);
        else if (!strcmp(a, "--context-length")) bad = cli_int(a, v, 2, 1 << 24, &ctx);
        else if (!strcmp(a, "--max-tokens-default")) bad = cli_int(a, v, 1, 1 << 24, &mt_def);
        else if (!strcmp(a, "--max-tokens-limit")) bad = cli_int(a, v, 1, 1 << 24, &mt_lim);
        else if (!strcmp(a, "--max-body")) bad = cli_int(a, v, 1024, 1L << 32, &max_body);
        else if (!strcmp(a, "--max-header")) bad = cli_int(a, v, 512, 1 << 24, &max_header);
        else if (!strcmp(a, "--max-connections")) bad = cli_int(a, v, 1, 1 << 20, &max_conn);
        else if (!strcmp(a, "--header-timeout")) bad = cli_int(a, v, 10, 1 << 30, &header_to);
        else if (!strcmp(a, "--keepalive-ms")) bad = cli_int(a, v, 10, 1 << 30, &ka);
        else if (!strcmp(a, "--scripted-step-ms")) bad = cli_int(a, v, 0, 60000, &step_ms);
        else if (!strcmp(a, "--kv-cache")) {
            if (!strcmp(v, "on")) kv_on = 1;
            else if (!strcmp(v, "off")) kv_on = 0;
            else { fprintf(stderr, "serve: --kv-cache on|off\n"); bad = -1; }
        }
        else if (!strcmp(a, "--kv-dir")) kv_dir = v;
        else if (!strcmp(a, "--kv-replay-publish")) {
            if (!strcmp(v, "on")) kv_replay_pub = 1;
            else if (!strcmp(v, "off")) kv_replay_pub = 0;
            else { fprintf(stderr, "serve: --kv-replay-publish on|off\n"); bad = -1; }
        }
        else if (!strcmp(a, "--kv-revision")) kv_rev = v;
        else if (!strcmp(a, "--kv-mem-mb")) bad = cli_int(a, v, 0, 1L << 30, &kv_mem);
        else if (!strcmp(a, "--kv-host-mb")) bad = cli_int(a, v, 0, 1L << 30, &kv_host);
        else if (!strcmp(a, "--kv-disk-gb")) bad = cli_int(a, v, 0, 1L << 30, &kv_disk);
        else if (!strcmp(a, "--kv-compress")) bad = cli_int(a, v, 0, 19, &kv_comp);
        else if (!strcmp(a, "--kv-ttl-agent")) bad = cli_int(a, v, 0, 24 * 365, &kv_ttl_a);
        else if (!strcmp(a, "--kv-ttl-chat")) bad = cli_int(a, v, 0, 24 * 365, &kv_ttl_c);
        else if (!strcmp(a, "--kv-swa-ttl")) bad = cli_int(a, v, 0, 1L << 30, &kv_swa_ttl);
        else if (!strcmp(a, "--kv-swa-mb")) bad = cli_int(a, v, 0, 1L << 30, &kv_swa_mb);
        else if (!strcmp(a, "--kv-replay")) bad = cli_int(a, v, 0, 1 << 20, &kv_replay);
        else if (!strcmp(a, "--kv-window-every")) bad = cli_int(a, v, 1, 1 << 20, &kv_every);
        else { fprintf(stderr, "serve: unknown option '%s' (see --help)\n", a); return 2; }
        if (bad) return 2;
    }
    int scripted_be = !strcmp(backend, "scripted"), cuda_be = !strcmp(backend, "cuda");
    if (!scripted_be && !cuda_be && strcmp(backend, "cpu")) { fprintf(stderr, "serve: --backend cpu|cuda|scripted\n"); return 2; }
    if (!scripted_be && !model_dir) { fprintf(stderr, "serve: --model DIR is required (see --help)\n"); return 2; }

    char tpath[4096];
    if (!tok_path && model_dir) {
        snprintf(tpath, sizeof tpath, "%s/tokenizer.json", model_dir);
        if (access(tpath, R_OK) == 0) tok_path = tpath;
    }
    if (!tok_path) tok_path = cli_default_tokenizer();
    rc_err err = {0};
    rc_tokenizer *tok = NULL;
    if (rc_tokenizer_load(tok_path, &tok, &err)) { fprintf(stderr, "serve: tokenizer %s: %s\n", tok_path, err.msg); return 1; }

    be_backend *be = NULL;
    md_model *m = NULL;
    eng_backend eb;
    if (scripted_be) {
        if (eng_scripted_backend(tok, scripts, &eb, &err)) { fprintf(stderr, "serve: %s\n", err.msg); return 1; }
        eng_scripted_set_step_ms(&eb, (int)step_ms);
    } else {
        int nt = threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (cuda_be) {
            char msg[512] = "";
            if (!(be = cli_load_cuda(nt, msg, sizeof msg))) {
                fprintf(stderr, "serve: --backend cuda: %s\n", msg);
                return 1;
            }
        } else {
            be = be_cpu_create(nt);
        }
        if (!be || md_model_load(model_dir, be, sem, NULL, NULL, &m, &err)) {
            fprintf(stderr, "serve: cannot load model from %s: %s\n", model_dir, err.msg);
            return 1;
        }
        if (md_model_config(m)->vocab_size < rc_tokenizer_n_ids(tok))
            fprintf(stderr, "serve: warning: the model's vocabulary (%d) is smaller than the tokenizer's (%d)\n",
                    md_model_config(m)->vocab_size, rc_tokenizer_n_ids(tok));
        g_mi.m = m;
        if (kv_on) {
            kv_cache_cfg kc;
            kv_cache_cfg_defaults(&kc);
            kc.mem_bytes = (uint64_t)kv_mem << 20;
            kc.host_bytes = (uint64_t)kv_host << 20;
            kc.dir = kv_dir;
            kc.disk_bytes = (uint64_t)kv_disk << 30;
            kc.compress = (int)kv_comp;
            kc.ttl_s[KV_CLASS_AGENT] = (uint32_t)kv_ttl_a * 3600;
            kc.ttl_s[KV_CLASS_CHAT] = (uint32_t)kv_ttl_c * 3600;
            kc.swa_ttl_s = (uint32_t)kv_swa_ttl;
            kc.swa_bytes = (uint64_t)kv_swa_mb << 20;
            kc.replay = (int)kv_replay;
            kc.publish_replayed = kv_replay_pub;
            kc.window_every = (int)kv_every;
            uint8_t fp[KV_KEY_BYTES];
            if (kv_model_fingerprint_dir(model_dir, kv_rev, fp, &err) || kv_cache_create(m, &kc, fp, &g_mi.kv, &err)) {
                fprintf(stderr, "serve: prefix cache: %s\n", err.msg);
                return 1;
            }
        }
        eb = eng_model_backend(&g_mi);
        if (cuda_be) { /* a CUDA failure is sticky in the backend: make it a forward error */
            g_fwd = eb.forward;
            g_be = be;
            eb.forward = checked_forward;
        }
    }
    if (eb.max_context > ctx || eb.max_context <= 0) eb.max_context = (int)ctx;
    else ctx = eb.max_context;
    const char *prune = getenv("DEEPINFER_SAMPLE_PRUNE"); /* the sampler's fast-path bound in bits (0: off) */
    char *pend = NULL;
    const long pbits = prune && *prune ? strtol(prune, &pend, 10) : 0;
    if (prune && *prune && (*pend || eng_sample_set_prune((int)(pbits < -1 ? -1 : pbits > 61 ? 61 : pbits)))) {
        fprintf(stderr, "serve: DEEPINFER_SAMPLE_PRUNE takes 0..60, got '%s'\n", prune);
        return 2;
    }
    eng_cfg ec = {.max_batch_tokens = (int)max_batch, .max_running = (int)max_running, .max_waiting = (int)max_waiting,
                  .sample_threads = (int)sample_threads};
    engine *e = eng_create(&eb, &ec, &err);
    if (!e) { fprintf(stderr, "serve: engine: %s\n", err.msg); return 1; }
    if (!scripted_be) eng_set_state_bytes_fn(e, eng_model_seq_bytes);

    srv_metrics *met = srv_metrics_create();
    char namebuf[256];
    if (!model_name) {
        if (model_dir) {
            const char *b = strrchr(model_dir, '/');
            snprintf(namebuf, sizeof namebuf, "%s", b && b[1] ? b + 1 : model_dir);
            model_name = namebuf;
        } else {
            model_name = "scripted";
        }
    }
    srv_app_cfg ac = {.kv = g_mi.kv, .model_name = model_name, .encoding = enc, .default_max_tokens = (int)mt_def,
                      .max_tokens_limit = (int)mt_lim, .context_length = (int)ctx, .log_requests = !quiet,
                      .backend_note = scripted_be ? "deepinfer-scripted-test-backend" : NULL};
    srv_app *app = srv_app_create(&ac, e, tok, met);
    hc.port = (int)port;
    hc.max_body = (size_t)max_body;
    hc.max_header = (size_t)max_header;
    hc.max_connections = (int)max_conn;
    hc.header_timeout_ms = (int)header_to;
    hc.keepalive_ms = (int)ka;
    char eb_msg[256] = "";
    srv_http *h = srv_http_create(&hc, srv_app_handle, app, eb_msg, sizeof eb_msg);
    if (!h) { fprintf(stderr, "serve: %s\n", eb_msg); return 1; }
    srv_app_set_http(app, h);
    g_http = h;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (scripted_be)
        fprintf(stderr, "deepinfer: serving the SCRIPTED TEST BACKEND (no model) on http://%s:%d\n", hc.host,
                srv_http_port(h));
    else
        fprintf(stderr, "deepinfer: serving %s (%.1fM params, %s semantics, %s, %ld host threads) on http://%s:%d\n",
                model_name, (double)md_model_param_count(m) / 1e6, md_semantics_name(sem), cuda_be ? "cuda" : "cpu",
                threads > 0 ? threads : sysconf(_SC_NPROCESSORS_ONLN), hc.host, srv_http_port(h));
    if (g_mi.kv)
        fprintf(stderr, "deepinfer: prefix cache: memory %ld MiB, host %ld MiB, disk %s, window states %ld s, replay %ld tokens\n",
                kv_mem, kv_host, kv_dir ? kv_dir : "off", kv_swa_ttl, kv_replay);
    else if (!scripted_be)
        fprintf(stderr, "deepinfer: prefix cache off\n");
    fflush(stderr);
    int rc = srv_http_run(h);
    fprintf(stderr, "deepinfer: shutting down\n");
    eng_shutdown(e, 5000);
    srv_http_destroy(h);
    g_http = NULL;
    eng_destroy(e);
    srv_app_destroy(app);
    srv_metrics_destroy(met);
    if (scripted_be) eng_scripted_free(&eb);
    kv_cache_destroy(g_mi.kv);
    md_model_free(m);
    be_destroy(be);
    rc_tokenizer_free(tok);
    return rc ? 1 : 0;
}
