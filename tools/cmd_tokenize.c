/* cmd_tokenize.c - `deepinfer tokenize` and `deepinfer detokenize`.
 *
 * Thin shells over src/recipe/tokenizer.h; scripts and tests depend on the
 * exact output shapes documented in --help, so change them with care. */
#include <getopt.h>
#include <jansson.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "recipe/tokenizer.h"

const char *cli_default_tokenizer(void) {
    const char *env = getenv("DEEPINFER_TOKENIZER");
    return env && *env ? env : DEEPINFER_ASSET_DIR "/tokenizers/deepseek-v4/tokenizer.json";
}

int cli_int(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "deepinfer: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cli_read_all(FILE *f, rc_bytes *out, const char *what) {
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (rc_bytes_append(out, buf, n)) {
            fprintf(stderr, "deepinfer: out of memory reading %s\n", what);
            return 1;
        }
    if (ferror(f)) {
        fprintf(stderr, "deepinfer: read error on %s\n", what);
        return 1;
    }
    if (!out->v && rc_bytes_reserve(out, 0)) return 1;
    return 0;
}

static void print_ids(FILE *f, const rc_ids *ids, int json) {
    /* ids are small non-negative ints: format by hand, it is the hot path of
     * the --jsonl differential tests */
    if (json) fputc('[', f);
    for (size_t i = 0; i < ids->n; i++) {
        if (i) fputc(json ? ',' : ' ', f);
        fprintf(f, "%d", ids->v[i]);
    }
    if (json) fputc(']', f);
    fputc('\n', f);
}

static const char tokenize_help[] =
    "usage: deepinfer tokenize [--tokenizer FILE] [--template] [--json | --jsonl] [--threads N]\n"
    "\n"
    "Reads UTF-8 text on stdin and prints its token ids.\n"
    "\n"
    "  --tokenizer FILE  HF tokenizer.json (byte-level BPE, DeepSeek V3/V4 family).\n"
    "                    Default: $DEEPINFER_TOKENIZER, else the bundled V4 tokenizer\n"
    "                    (assets/tokenizers/deepseek-v4/tokenizer.json).\n"
    "  --template        template mode: added tokens such as <｜User｜> or <think> in the\n"
    "                    text become their control ids. Default is content mode, where\n"
    "                    they are tokenized as plain text - the mode for anything a user,\n"
    "                    a tool or the model wrote.\n"
    "  --json            print exactly one JSON array of ids (default: ids separated by\n"
    "                    spaces on one line).\n"
    "  --jsonl           batch mode: every stdin line is a JSON string; print one JSON\n"
    "                    array per line, in order. A bad line prints {\"error\": ...}.\n"
    "  --threads N       encode long texts in parallel segments on N threads (default 1;\n"
    "                    the ids are identical for every N).\n"
    "\n"
    "Input that is not valid UTF-8 is rejected (exit 1) with the offset of the first\n"
    "ill-formed byte. No BOS/EOS is added.\n"
    "\n"
    "example: printf 'Hello, world!' | deepinfer tokenize --json\n";

static int tokenize_jsonl(const rc_tokenizer *tok, rc_pool *pool, enum rc_encode_mode mode) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    rc_ids ids = {0};
    int bad = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!v || !json_is_string(v)) {
            printf("{\"error\":\"line is not a JSON string\"}\n");
            bad = 1;
            json_decref(v);
            continue;
        }
        rc_err err = {0};
        ids.n = 0;
        if (rc_tokenizer_encode_parallel(tok, pool, json_string_value(v), json_string_length(v), mode,
                                         &ids, &err)) {
            json_t *e = json_pack("{s:s}", "error", err.msg);
            char *s = json_dumps(e, JSON_COMPACT);
            printf("%s\n", s);
            free(s);
            json_decref(e);
            bad = 1;
        } else {
            print_ids(stdout, &ids, 1);
        }
        json_decref(v);
    }
    free(line);
    rc_ids_free(&ids);
    return bad;
}

int cmd_tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, 0, 't'}, {"template", no_argument, 0, 'T'},
        {"json", no_argument, 0, 'j'},            {"jsonl", no_argument, 0, 'l'},
        {"threads", required_argument, 0, 'n'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    const char *path = cli_default_tokenizer();
    int json = 0, jsonl = 0, threads = 1;
    enum rc_encode_mode mode = RC_ENCODE_CONTENT;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': path = optarg; break;
        case 'T': mode = RC_ENCODE_TEMPLATE; break;
        case 'j': json = 1; break;
        case 'l': jsonl = 1; break;
        case 'n':
            threads = atoi(optarg);
            if (threads < 1 || threads > 256) {
                fprintf(stderr, "deepinfer tokenize: --threads must be 1..256\n");
                return 2;
            }
            break;
        case 'h': fputs(tokenize_help, stdout); return 0;
        default: fputs(tokenize_help, stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "deepinfer tokenize: unexpected argument '%s' (text comes on stdin)\n",
                argv[optind]);
        return 2;
    }
    rc_err err = {0};
    rc_tokenizer *tok;
    if (rc_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "deepinfer tokenize: %s\n", err.msg);
        return 1;
    }
    rc_pool *pool = threads > 1 ? rc_pool_create(threads) : NULL;
    int rc = 0;
    if (jsonl) {
        rc = tokenize_jsonl(tok, pool, mode);
    } else {
        rc_bytes in = {0};
        rc_ids ids = {0};
        if (cli_read_all(stdin, &in, "stdin")) rc = 1;
        else if (rc_tokenizer_encode_parallel(tok, pool, in.v, in.n, mode, &ids, &err)) {
            fprintf(stderr, "deepinfer tokenize: %s\n", err.msg);
            rc = 1;
        } else {
            print_ids(stdout, &ids, json);
        }
        rc_bytes_free(&in);
        rc_ids_free(&ids);
    }
    rc_pool_destroy(pool);
    rc_tokenizer_free(tok);
    return rc;
}

static const char detokenize_help[] =
    "usage: deepinfer detokenize [--tokenizer FILE] [--added]\n"
    "\n"
    "Reads a JSON array of token ids on stdin and writes the decoded text to stdout,\n"
    "byte-exact, with no trailing newline. Bytes that do not form valid UTF-8 become\n"
    "U+FFFD, as in HF tokenizers' decode.\n"
    "\n"
    "  --tokenizer FILE  as for tokenize\n"
    "  --added           also render added/control tokens (<｜User｜>, <think>, ...) as\n"
    "                    their text; by default they are left out.\n"
    "  --jsonl           batch mode: every stdin line is a JSON array of ids; print one\n"
    "                    JSON string per line, in order.\n"
    "\n"
    "example: echo '[19923,14,2058,3]' | deepinfer detokenize\n";

/* JSON array -> ids; 0 or -1 with a message in err */
static int ids_from_json(json_t *arr, rc_ids *ids, rc_err *err) {
    if (!json_is_array(arr)) return rc_errf(err, RC_EINVAL, "not a JSON array of ids");
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return rc_errf(err, RC_EINVAL, "element %zu is not a token id", i);
        if (rc_ids_push(ids, (int32_t)json_integer_value(v))) return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    return 0;
}

static int detokenize_jsonl(const char *path, unsigned flags) {
    rc_err err = {0};
    rc_tokenizer *tok;
    if (rc_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "deepinfer detokenize: %s\n", err.msg);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int bad = 0;
    rc_ids ids = {0};
    rc_bytes out = {0};
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *arr = json_loadb(line, (size_t)n, 0, &je);
        ids.n = out.n = 0;
        json_t *res;
        if (ids_from_json(arr, &ids, &err) || rc_tokenizer_decode(tok, ids.v, ids.n, flags, &out, &err)) {
            res = json_pack("{s:s}", "error", err.msg);
            bad = 1;
        } else {
            res = json_stringn(out.v, out.n);
        }
        char *s = json_dumps(res, JSON_COMPACT | JSON_ENCODE_ANY);
        printf("%s\n", s);
        free(s);
        json_decref(res);
        json_decref(arr);
    }
    free(line);
    rc_ids_free(&ids);
    rc_bytes_free(&out);
    rc_tokenizer_free(tok);
    return bad;
}

int cmd_detokenize(int argc, char **argv) {
    static const struct option opts[] = {{"tokenizer", required_argument, 0, 't'},
                                         {"added", no_argument, 0, 'a'},
                                         {"jsonl", no_argument, 0, 'l'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *path = cli_default_tokenizer();
    unsigned flags = 0;
    int c, jsonl = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': path = optarg; break;
        case 'a': flags |= RC_DECODE_ADDED; break;
        case 'l': jsonl = 1; break;
        case 'h': fputs(detokenize_help, stdout); return 0;
        default: fputs(detokenize_help, stderr); return 2;
        }
    }
    if (jsonl) return detokenize_jsonl(path, flags);
    rc_bytes in = {0};
    if (cli_read_all(stdin, &in, "stdin")) return 1;
    json_error_t je;
    json_t *arr = json_loadb(in.v, in.n, 0, &je);
    rc_bytes_free(&in);
    if (!json_is_array(arr)) {
        fprintf(stderr, "deepinfer detokenize: stdin must be a JSON array of ids (%s)\n",
                arr ? "got another JSON value" : je.text);
        json_decref(arr);
        return 1;
    }
    rc_ids ids = {0};
    rc_err err = {0};
    if (ids_from_json(arr, &ids, &err)) {
        fprintf(stderr, "deepinfer detokenize: %s\n", err.msg);
        json_decref(arr);
        rc_ids_free(&ids);
        return 1;
    }
    json_decref(arr);
    rc_tokenizer *tok;
    if (rc_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "deepinfer detokenize: %s\n", err.msg);
        rc_ids_free(&ids);
        return 1;
    }
    rc_bytes out = {0};
    int rc = 0;
    if (rc_tokenizer_decode(tok, ids.v, ids.n, flags, &out, &err)) {
        fprintf(stderr, "deepinfer detokenize: %s\n", err.msg);
        rc = 1;
    } else {
        fwrite(out.v, 1, out.n, stdout);
    }
    rc_bytes_free(&out);
    rc_ids_free(&ids);
    rc_tokenizer_free(tok);
    return rc;
}
