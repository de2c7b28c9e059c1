/* cmd_model.c - `deepinfer logits` and `deepinfer generate`: the model run
 * from the command line, for people checking a checkpoint and for the tests
 * that hold the engine against transformers.
 *
 * Output shapes are a contract (scripts parse them):
 *   logits   --json  {"input_ids":[...],"positions":[{"pos":0,"top":[[id,logit]x5],"probe":[...]},...]}
 *   generate --json  {"input_ids":[...],"output_ids":[...]} */
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/vec.h"
#include "cli.h"
#include "model/v4.h"
#include "recipe/tokenizer.h"

static int parse_ids(const char *s, rc_ids *out, const char *flag)
{
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "%s: expected comma-separated non-negative token ids, got '%s'\n", flag, s);
            return 1;
        }
        rc_ids_push(out, (int32_t)v);
        s = end;
        if (*s == ',') s++;
        else if (*s) {
            fprintf(stderr, "%s: unexpected '%c' in id list\n", flag, *s);
            return 1;
        }
    }
    return 0;
}

static void load_progress(void *arg, const char *stage, uint64_t done, uint64_t total)
{
    (void)arg;
    if (!isatty(2)) return;
    fprintf(stderr, "\rloading: %s %llu/%llu", stage, (unsigned long long)done, (unsigned long long)total);
    if (done == total) fputc('\n', stderr);
}

typedef struct {
    const char *model, *input_ids, *probe_ids, *prompt, *tokenizer, *out_f32;
    int json, threads, chunk, max_tokens, recompute, cuda;
    double temperature;
    unsigned long long seed;
    md_semantics sem;
} opts;

static int common_flag(opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
#define NEXT() (*i + 1 < argc ? argv[++*i] : (fprintf(stderr, "%s needs a value\n", a), (char *)NULL))
    if (!strcmp(a, "--model")) { if (!(o->model = NEXT())) return -1; return 1; }
    if (!strcmp(a, "--input-ids")) { if (!(o->input_ids = NEXT())) return -1; return 1; }
    if (!strcmp(a, "--json")) { o->json = 1; return 1; }
    if (!strcmp(a, "--threads")) {
        const char *v = NEXT();
        long t;
        if (!v || cli_int(a, v, 1, 1024, &t)) return -1;
        o->threads = (int)t;
        return 1;
    }
    if (!strcmp(a, "--backend")) {
        const char *v = NEXT();
        if (!v) return -1;
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) { fprintf(stderr, "--backend: 'cpu' or 'cuda', not '%s'\n", v); return -1; }
        o->cuda = !strcmp(v, "cuda");
        return 1;
    }
    if (!strcmp(a, "--semantics")) {
        const char *v = NEXT();
        if (!v) return -1;
        if (md_semantics_parse(v, &o->sem)) {
            fprintf(stderr, "--semantics: 'official' or 'transformers', not '%s'\n", v);
            return -1;
        }
        return 1;
    }
#undef NEXT
    return 0;
}

/* The CUDA backend is a module (libdeepinfer_cuda.so beside the binary),
 * loaded only when asked for: linking cuBLAS into the CLI would slow every
 * process start. */
static const char *(*cuda_error_fn)(const be_backend *);

be_backend *cli_load_cuda(int threads, char *msg, size_t cap)
{
#ifdef DEEPINFER_CUDA_MODULE
    char path[4096];
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 64);
    if (n <= 0) { snprintf(msg, cap, "cannot locate the deepinfer binary"); return NULL; }
    path[n] = 0;
    char *slash = strrchr(path, '/');
    strcpy(slash ? slash + 1 : path, DEEPINFER_CUDA_MODULE);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { snprintf(msg, cap, "cannot load %.300s: %.180s", path, dlerror()); return NULL; }
    be_backend *(*create)(int, int, char *, size_t) = (be_backend * (*)(int, int, char *, size_t)) dlsym(h, "be_cuda_create");
    cuda_error_fn = (const char *(*)(const be_backend *))dlsym(h, "be_cuda_error");
    if (!create || !cuda_error_fn) { snprintf(msg, cap, "%.400s lacks be_cuda_create", path); return NULL; }
    return create(0, threads, msg, cap);
#else
    (void)threads;
    snprintf(msg, cap, "this build has no CUDA backend (CMake found no nvcc)");
    return NULL;
#endif
}

const char *cli_cuda_error(const be_backend *be) { return cuda_error_fn && be ? cuda_error_fn(be) : NULL; }

static void close_backend(be_backend *be) { be_destroy(be); }

static int open_model(const opts *o, be_backend **be, md_model **m)
{
    if (!o->model) {
        fprintf(stderr, "--model DIR is required (a directory with config.json and *.safetensors)\n");
        return 2;
    }
    int threads = o->threads > 0 ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (o->cuda) {
        char msg[512] = "";
        if (!(*be = cli_load_cuda(threads, msg, sizeof msg))) {
            fprintf(stderr, "deepinfer: --backend cuda: %s\n", msg);
            return 1;
        }
    } else {
        *be = be_cpu_create(threads);
    }
    rc_err err = {0};
    if (!*be || md_model_load(o->model, *be, o->sem, load_progress, NULL, m, &err)) {
        fprintf(stderr, "deepinfer: cannot load model from %s: %s\n", o->model, err.msg);
        close_backend(*be);
        return 1;
    }
    return 0;
}

/* md_forward, plus the CUDA backend's sticky error (its ops cannot return one) */
static int forward(md_model *m, be_backend *be, md_segment *seg, rc_err *err)
{
    if (md_forward(m, seg, 1, err)) return -1;
    if (cli_cuda_error(be)) return rc_errf(err, RC_EIO, "%s", cli_cuda_error(be));
    return 0;
}

static void print_ids(FILE *f, const int32_t *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", v[i]);
    fputc(']', f);
}

/* ------------------------------------------------------------------ logits */

static const char logits_help[] =
    "usage: deepinfer logits --model DIR --input-ids 1,2,3 [options]\n\n"
    "Prefill logits of every position of the input, one forward pass with an empty state.\n\n"
    "  --model DIR          checkpoint directory (config.json + model*.safetensors)\n"
    "  --input-ids LIST     comma-separated token ids\n"
    "  --probe-ids LIST     also print the logits of these ids at every position\n"
    "  --json               one JSON object: {\"input_ids\":[..],\"positions\":[{\"pos\",\"top\":[[id,logit]x5],\"probe\"}]}\n"
    "                       (without --json: one line per position, top-5 ids)\n"
    "  --semantics S        official (default: DeepSeek's inference code, with its FP8/FP4 round trips)\n"
    "                       or transformers (transformers 5.17, no round trips)\n"
    "  --chunk N            feed the input in chunks of N tokens through the decoding state instead of one\n"
    "                       pass (N=1 is token-by-token decode); the logits must not change\n"
    "  --out-f32 FILE       write all logits as raw little-endian float32 [positions, vocab]\n"
    "  --backend B          cpu (default) or cuda (GPU 0; DEEPINFER_CUDA_MATH=bf16x3|bf16|fp32,\n"
    "                       DEEPINFER_CUDA_GRAPH=device|host; docs/CUDA.md)\n"
    "  --threads N          CPU threads (default: all)\n";

int cmd_logits(int argc, char **argv)
{
    opts o = {.sem = MD_SEM_OFFICIAL};
    for (int i = 1; i < argc; i++) {
        int r = common_flag(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(logits_help, stdout); return 0; }
        if (!strcmp(argv[i], "--probe-ids") && i + 1 < argc) o.probe_ids = argv[++i];
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) {
            long v;
            if (cli_int("--chunk", argv[++i], 0, 1L << 30, &v)) return 2;
            o.chunk = (int)v;
        }
        else if (!strcmp(argv[i], "--out-f32") && i + 1 < argc) o.out_f32 = argv[++i];
        else {
            fprintf(stderr, "logits: unknown or incomplete option '%s'\n\n%s", argv[i], logits_help);
            return 2;
        }
    }
    rc_ids ids = {0}, probe = {0};
    if (!o.input_ids) { fprintf(stderr, "logits: --input-ids is required\n\n%s", logits_help); return 2; }
    if (parse_ids(o.input_ids, &ids, "--input-ids")) return 2;
    if (o.probe_ids && parse_ids(o.probe_ids, &probe, "--probe-ids")) return 2;
    if (!ids.n) { fprintf(stderr, "logits: --input-ids is empty\n"); return 2; }
    be_backend *be;
    md_model *m;
    int rc = open_model(&o, &be, &m);
    if (rc) { free(ids.v); free(probe.v); return rc; }
    const int V = md_model_config(m)->vocab_size;
    for (size_t i = 0; i < probe.n; i++)
        if (probe.v[i] >= V) { fprintf(stderr, "--probe-ids: %d is outside the vocabulary (%d)\n", probe.v[i], V); return 2; }
    float *lg = malloc(ids.n * (size_t)V * sizeof(float));
    md_seq *s = md_seq_create(m);
    rc_err err = {0};
    size_t step = o.chunk > 0 ? (size_t)o.chunk : ids.n;
    for (size_t a = 0; a < ids.n && !rc; a += step) {
        size_t nn = ids.n - a < step ? ids.n - a : step;
        md_segment seg = {.seq = s, .ids = ids.v + a, .n = nn, .logits = lg + a * (size_t)V, .all_logits = 1};
        if (forward(m, be, &seg, &err)) {
            fprintf(stderr, "logits: %s\n", err.msg);
            rc = 1;
        }
    }
    if (!rc && o.out_f32) {
        FILE *f = fopen(o.out_f32, "wb");
        if (!f || fwrite(lg, sizeof(float), ids.n * (size_t)V, f) != ids.n * (size_t)V || fclose(f)) {
            fprintf(stderr, "logits: cannot write %s\n", o.out_f32);
            rc = 1;
        }
    }
    if (!rc) {
        if (o.json) {
            printf("{\"input_ids\":");
            print_ids(stdout, ids.v, ids.n);
            printf(",\"positions\":[");
        }
        for (size_t p = 0; p < ids.n; p++) {
            const float *row = lg + p * (size_t)V;
            int top[5];
            int nt = V < 5 ? V : 5;
            for (int k = 0; k < nt; k++) {
                int best = -1;
                for (int v = 0; v < V; v++) {
                    int taken = 0;
                    for (int q = 0; q < k; q++) taken |= top[q] == v;
                    if (!taken && (best < 0 || row[v] > row[best])) best = v;
                }
                top[k] = best;
            }
            if (o.json) {
                printf("%s{\"pos\":%zu,\"top\":[", p ? "," : "", p);
                for (int k = 0; k < nt; k++) printf("%s[%d,%.9g]", k ? "," : "", top[k], row[top[k]]);
                printf("],\"probe\":[");
                for (size_t k = 0; k < probe.n; k++) printf("%s%.9g", k ? "," : "", row[probe.v[k]]);
                printf("]}");
            } else {
                printf("pos %zu:", p);
                for (int k = 0; k < nt; k++) printf(" %d(%.4f)", top[k], row[top[k]]);
                putchar('\n');
            }
        }
        if (o.json) printf("]}\n");
    }
    free(lg);
    md_seq_free(s);
    md_model_free(m);
    close_backend(be);
    free(ids.v);
    free(probe.v);
    return rc;
}

/* ---------------------------------------------------------------- generate */

static const char generate_help[] =
    "usage: deepinfer generate --model DIR (--input-ids LIST | --prompt TEXT) [options]\n\n"
    "Continue a token sequence: prefill once, then decode token by token through the state.\n\n"
    "  --model DIR          checkpoint directory\n"
    "  --input-ids LIST     comma-separated prompt token ids\n"
    "  --prompt TEXT        prompt text, tokenized as plain content (no chat template, no BOS)\n"
    "  --tokenizer FILE     tokenizer.json for --prompt and text output (default: DIR/tokenizer.json,\n"
    "                       else the bundled DeepSeek V4 tokenizer)\n"
    "  --max-tokens N       tokens to generate (default 16); stops early at the model's EOS id\n"
    "  --temperature T      0 (default) = greedy; > 0 samples from softmax(logits / T)\n"
    "  --seed N             sampling seed (default 0)\n"
    "  --json               {\"input_ids\":[..],\"output_ids\":[..]} (without: the decoded text)\n"
    "  --semantics S        official (default) or transformers; see `deepinfer logits --help`\n"
    "  --recompute          check mode: recompute the whole sequence from scratch at every step\n"
    "                       instead of using the decoding state (slow; must give the same tokens)\n"
    "  --backend B          cpu (default) or cuda (GPU 0; DEEPINFER_CUDA_MATH=bf16x3|bf16|fp32,\n"
    "                       DEEPINFER_CUDA_GRAPH=device|host; docs/CUDA.md)\n"
    "  --threads N          CPU threads (default: all)\n";

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static int pick(const float *row, int V, double temp, uint64_t *rng)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (row[v] > row[best]) best = v;
    if (temp <= 0) return best;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((row[v] - row[best]) / temp);
    double u = (double)(xorshift(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int v = 0; v < V; v++) {
        acc += exp((row[v] - row[best]) / temp);
        if (acc >= u) return v;
    }
    return best;
}

int cmd_generate(int argc, char **argv)
{
    opts o = {.sem = MD_SEM_OFFICIAL, .max_tokens = 16};
    for (int i = 1; i < argc; i++) {
        int r = common_flag(&o, argc, argv, &i);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(generate_help, stdout); return 0; }
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc) o.prompt = argv[++i];
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) o.tokenizer = argv[++i];
        else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc) {
            long v;
            if (cli_int("--max-tokens", argv[++i], 0, 1L << 24, &v)) return 2;
            o.max_tokens = (int)v;
        }
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc) o.temperature = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) o.seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--recompute")) o.recompute = 1;
        else {
            fprintf(stderr, "generate: unknown or incomplete option '%s'\n\n%s", argv[i], generate_help);
            return 2;
        }
    }
    if (!o.input_ids == !o.prompt) {
        fprintf(stderr, "generate: give exactly one of --input-ids and --prompt\n\n%s", generate_help);
        return 2;
    }
    if (o.max_tokens < 0 || o.temperature < 0 || isnan(o.temperature)) {
        fprintf(stderr, "generate: --max-tokens and --temperature must be >= 0\n");
        return 2;
    }
    rc_ids ids = {0}, outv = {0};
    rc_tokenizer *tok = NULL;
    rc_err err = {0};
    if (o.input_ids && parse_ids(o.input_ids, &ids, "--input-ids")) return 2;
    if (o.prompt || !o.json) {
        char path[4096];
        const char *tp = o.tokenizer;
        if (!tp && o.model) {
            snprintf(path, sizeof path, "%s/tokenizer.json", o.model);
            if (access(path, R_OK) == 0) tp = path;
        }
        if (!tp) tp = cli_default_tokenizer();
        if (rc_tokenizer_load(tp, &tok, &err)) {
            fprintf(stderr, "generate: tokenizer %s: %s\n", tp, err.msg);
            return 1;
        }
        if (o.prompt && rc_tokenizer_encode(tok, o.prompt, strlen(o.prompt), RC_ENCODE_CONTENT, &ids, &err)) {
            fprintf(stderr, "generate: %s\n", err.msg);
            return 1;
        }
    }
    if (!ids.n) { fprintf(stderr, "generate: the prompt is empty\n"); return 2; }
    be_backend *be;
    md_model *m;
    int rc = open_model(&o, &be, &m);
    if (rc) { if (tok) rc_tokenizer_free(tok); free(ids.v); return rc; }
    const md_config *c = md_model_config(m);
    const int V = c->vocab_size;
    float *lg = malloc((size_t)V * sizeof(float));
    uint64_t rng = o.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    md_seq *s = md_seq_create(m);
    rc_ids all = {0};
    for (size_t i = 0; i < ids.n; i++) rc_ids_push(&all, ids.v[i]);
    md_segment seg = {.seq = s, .ids = ids.v, .n = ids.n, .logits = lg};
    if (forward(m, be, &seg, &err)) { fprintf(stderr, "generate: %s\n", err.msg); rc = 1; }
    for (int k = 0; k < o.max_tokens && !rc; k++) {
        int32_t next = pick(lg, V, o.temperature, &rng);
        rc_ids_push(&outv, next);
        rc_ids_push(&all, next);
        if (next == c->eos_id || k + 1 == o.max_tokens) break;
        if (o.recompute) {
            md_seq_free(s);
            s = md_seq_create(m);
            md_segment full = {.seq = s, .ids = all.v, .n = all.n, .logits = lg};
            if (forward(m, be, &full, &err)) { fprintf(stderr, "generate: %s\n", err.msg); rc = 1; }
        } else {
            md_segment one = {.seq = s, .ids = &next, .n = 1, .logits = lg};
            if (forward(m, be, &one, &err)) { fprintf(stderr, "generate: %s\n", err.msg); rc = 1; }
        }
    }
    if (!rc) {
        if (o.json) {
            printf("{\"input_ids\":");
            print_ids(stdout, ids.v, ids.n);
            printf(",\"output_ids\":");
            print_ids(stdout, outv.v, outv.n);
            printf("}\n");
        } else {
            rc_bytes text = {0};
            if (rc_tokenizer_decode(tok, outv.v, outv.n, 0, &text, &err) == 0) {
                fwrite(text.v, 1, text.n, stdout);
                putchar('\n');
            }
            free(text.v);
        }
    }
    free(lg);
    md_seq_free(s);
    md_model_free(m);
    close_backend(be);
    if (tok) rc_tokenizer_free(tok);
    free(ids.v);
    free(outv.v);
    free(all.v);
    return rc;
}
