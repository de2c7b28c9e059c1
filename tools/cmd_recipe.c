/* cmd_recipe.c - `deepinfer recipe render|tokens`: the codec from the shell.
 *
 * render: request JSON on stdin -> the exact prompt on stdout (no newline).
 * tokens: the same, as a JSON array of ids (control tokens only where the
 * renderer wrote them).  --jsonl: one request per line, one JSON object per
 * line out: {"prompt": ...} / {"ids": [...]} or {"status": N, "error": {...}}. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "recipe/idfeed.h"
#include "recipe/out.h"
#include "recipe/protocol.h"
#include "recipe/pyjson.h"
#include "recipe/unicode.h"

static const char recipe_help[] =
    "usage: deepinfer recipe render --api chat --encoding v4|v4.1 [--jsonl] < request.json\n"
    "       deepinfer recipe tokens --api chat --encoding v4|v4.1 [--tokenizer FILE] [--jsonl] < request.json\n"
    "\n"
    "render  prints the prompt the request becomes, exactly (no trailing newline).\n"
    "tokens  prints its token ids as one JSON array; control tokens appear only where the\n"
    "        template put them, never from text inside the request.\n"
    "\n"
    "  --api API           chat (OpenAI Chat Completions), responses (OpenAI Responses) or\n"
    "                      messages (Anthropic Messages)\n"
    "  --encoding v4|v4.1  DeepSeek prompt encoding (default v4)\n"
    "  --tokenizer FILE    for tokens (default: the bundled V4 tokenizer)\n"
    "  --jsonl             one request per stdin line; one JSON object per output line:\n"
    "                      {\"prompt\": ...} or {\"ids\": [...]}, or {\"status\": 400, \"error\": {...}}\n"
    "\n"
    "A rejected request prints the API error body on stdout and exits 1 (400-class).\n"
    "\n"
    "       deepinfer recipe parse --api chat --request REQ.json [--stream] [--deterministic]\n"
    "                              [--prompt-tokens P] [--cached-tokens C]\n"
    "                              [--finish stop|length|content_filter] < chunks.jsonl\n"
    "parse   runs model output through the output parser and prints what the server would\n"
    "        send: the SSE stream (--stream) or the JSON body. stdin: one JSON string per\n"
    "        line, each one backend text chunk (or {\"text\": ..., \"tokens\": N}).\n"
    "        --deterministic fixes id \"chatcmpl-test\", created 1767225600, fingerprint\n"
    "        \"fp_test\" so outputs can be compared byte for byte.\n"
    "        --tokens: stdin lines are JSON arrays of token ids instead (decoded with\n"
    "        --tokenizer; a character split across ids is held back until complete).\n";

typedef int (*convert_fn)(const json_t *, rc_conversation *, rc_inference *, rc_api_error *);

typedef struct {
    convert_fn convert;
    int tokens;
    rc_encoding enc;
    rc_tokenizer *tok;
} opts;

/* one request -> result JSON (jsonl) or raw output; returns 0 ok, 1 rejected */
static int one(const opts *o, const char *body, size_t n, int jsonl, rc_bytes *out) {
    rc_api_error e = {0};
    json_error_t je;
    if (jsonl && n && body[n - 1] == '\n') n--; /* the line break is framing, not body */
    char syn[256];
    json_t *req = rc_json_syntax_error(body, n, syn, sizeof syn) ? NULL : rc_json_loadb(body, n, JSON_DECODE_ANY, &je);
    rc_conversation conv;
    rc_inference inf;
    memset(&conv, 0, sizeof conv);
    memset(&inf, 0, sizeof inf);
    int bad = 0;
    if (!req) {
        e.status = 400;
        e.type = "invalid_request_error";
        if (rc_json_syntax_error(body, n, syn, sizeof syn))
            snprintf(e.message, sizeof e.message, "invalid JSON request: %s", syn);
        else
            snprintf(e.message, sizeof e.message, "invalid JSON request: %s", je.text);
        bad = 1;
    } else if (o->convert(req, &conv, &inf, &e)) {
        bad = 1;
    }
    if (bad) {
        if (jsonl) {
            char head[32];
            snprintf(head, sizeof head, "{\"status\":%d,\"error\":", e.status);
            rc_bytes_append(out, head, strlen(head));
            rc_api_error_json(&e, out);
            rc_bytes_append(out, "}", 1);
        } else {
            rc_api_error_json(&e, out);
        }
        json_decref(req);
        rc_conv_free(&conv);
        rc_inference_free(&inf);
        return 1;
    }
    rc_prompt p;
    rc_err err = {0};
    int rc = rc_render(&conv, o->enc, &p, &err);
    if (!rc && o->tokens) {
        rc_ids ids = {0};
        rc = rc_prompt_tokens(&p, o->tok, NULL, &ids, &err);
        if (!rc) {
            rc_bytes_append(out, jsonl ? "{\"ids\":[" : "[", jsonl ? 8 : 1);
            char num[16];
            for (size_t i = 0; i < ids.n; i++) {
                int l = snprintf(num, sizeof num, i ? ",%d" : "%d", ids.v[i]);
                rc_bytes_append(out, num, (size_t)l);
            }
            rc_bytes_append(out, jsonl ? "]}" : "]", jsonl ? 2 : 1);
        }
        rc_ids_free(&ids);
    } else if (!rc) {
        if (jsonl) {
            json_t *j = json_pack("{s:s%}", "prompt", p.text.v ? p.text.v : "", p.text.n);
            char *s = json_dumps(j, JSON_COMPACT);
            rc_bytes_append(out, s, strlen(s));
            free(s);
            json_decref(j);
        } else {
            rc_bytes_append(out, p.text.v, p.text.n);
        }
    }
    if (rc) {
        /* not the client's fault: 500 */
        char msg[600];
        snprintf(msg, sizeof msg, "{\"status\":500,\"error\":{\"message\":\"%s\"}}", err.msg);
        rc_bytes_append(out, msg, strlen(msg));
    }
    if (!rc) rc_prompt_free(&p);
    json_decref(req);
    rc_conv_free(&conv);
    rc_inference_free(&inf);
    return rc ? 1 : 0;
}

static int recipe_parse(const char *api_name, convert_fn convert, const char *req_path, int stream,
                        int deterministic, long long ptoks, long long ctoks, const char *finish,
                        const rc_tokenizer *tok) {
    const rc_out_api *api = !strcmp(api_name, "responses") ? &rc_out_responses
                            : !strcmp(api_name, "messages") ? &rc_out_messages : &rc_out_chat;
    rc_bytes body = {0};
    FILE *f = fopen(req_path, "rb");
    if (!f) {
        fprintf(stderr, "deepinfer recipe parse: cannot open %s\n", req_path);
        return 1;
    }
    int rd = cli_read_all(f, &body, req_path);
    fclose(f);
    if (rd) return 1;
    json_error_t je;
    json_t *req = rc_json_loadb(body.v ? body.v : "", body.n, 0, &je);
    rc_bytes_free(&body);
    rc_conversation conv;
    rc_inference inf;
    memset(&conv, 0, sizeof conv);
    memset(&inf, 0, sizeof inf);
    rc_api_error e = {0};
    if (!req || convert(req, &conv, &inf, &e)) {
        fprintf(stderr, "deepinfer recipe parse: request rejected: %s\n", req ? e.message : je.text);
        json_decref(req);
        rc_conv_free(&conv);
        rc_inference_free(&inf);
        return 1;
    }
    /* an assistant prefill continues where it stopped: in reasoning (reasoning
     * only), in content (some content), or from the start (empty) */
    rc_reasoning_stage rs = conv.thinking ? RC_REASONING_START : RC_REASONING_NONE;
    const rc_message *lastm = conv.nmsgs ? &conv.msgs[conv.nmsgs - 1] : NULL;
    if (lastm && lastm->prefix && conv.thinking) {
        if (lastm->content.n) rs = RC_REASONING_CONTENT;
        else if (lastm->reasoning.n) rs = RC_REASONING_REASONING;
    }
    rc_stream_opts so = {
        .parse_tool_calls = conv.ntools > 0,
        .tool_call_initial = conv.tool_choice == RC_CHOICE_REQUIRED && conv.ntools > 0,
        .json_output = conv.json_mode,
        .reasoning = rs,
        .stop = (const char *const *)inf.stop,
        .nstop = inf.nstop,
    };
    json_t *so_opts = json_object_get(req, "stream_options");
    rc_out_opts co = {
        .id = deterministic ? "chatcmpl-test" : "chatcmpl-local",
        .created = deterministic ? 1767225600 : (long long)time(NULL),
        .model = json_string_value(json_object_get(req, "model")),
        .fingerprint = deterministic ? "fp_test" : NULL,
        .thinking = conv.thinking,
        .stream = stream,
        .include_usage = !json_is_true(json_object_get(req, "stream")) ||
                         json_is_true(json_object_get(so_opts, "include_usage")),
        .reasoning_start = conv.thinking && rs != RC_REASONING_CONTENT,
        .content_continuation = conv.thinking && rs == RC_REASONING_CONTENT,
        .deterministic = deterministic,
        .prompt_tokens = ptoks,
        .cached_tokens = ctoks,
    };
    rc_stream *st = rc_stream_new(&so);
    void *co_ = api->create(&co, req);
    rc_bytes out = {0};
    if (stream) api->start(co_, &out);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long ctok = 0;
    int done = 0;
    rc_idfeed feed;
    rc_idfeed_init(&feed, tok);
    while (!done && (n = getline(&line, &cap, stdin)) > 0) {
        json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (tok) {
            /* token ids: decoded with UTF-8 held back across ids; a chunk becomes
             * several source chunks, split at added tokens, as the reference does */
            if (!json_is_array(v)) {
                fprintf(stderr, "deepinfer recipe parse: with --tokens, stdin lines must be JSON arrays of ids\n");
                json_decref(v);
                break;
            }
            size_t nid = json_array_size(v);
            int32_t *idv = malloc((nid ? nid : 1) * sizeof *idv);
            for (size_t q = 0; q < nid; q++) idv[q] = (int32_t)json_integer_value(json_array_get(v, q));
            done = rc_idfeed_push(&feed, st, idv, nid, api->event, co_);
            free(idv);
            if (stream) api->flush(co_, &out);
            json_decref(v);
            continue;
        }
        json_t *t = json_is_object(v) ? json_object_get(v, "text") : v;
        if (!json_is_string(t)) {
            fprintf(stderr, "deepinfer recipe parse: stdin lines must be JSON strings\n");
            json_decref(v);
            break;
        }
        json_t *nt = json_object_get(v, "tokens");
        ctok += json_is_integer(nt) ? json_integer_value(nt) : 1;
        done = rc_stream_feed(st, json_string_value(t), json_string_length(t), api->event, co_);
        if (stream) api->flush(co_, &out);
        json_decref(v);
    }
    free(line);
    if (tok) ctok = rc_idfeed_completion_tokens(&feed);
    rc_idfeed_free(&feed);
    /* ids that never produced text (an unfinished character, unknown ids) count 0 */
    rc_finish backend = !strcmp(finish, "length") ? RC_FINISH_LENGTH
                        : !strcmp(finish, "content_filter") ? RC_FINISH_CONTENT_FILTER
                        : !strcmp(finish, "none") ? RC_FINISH_END_OF_STREAM : RC_FINISH_STOP;
    rc_finish fin = rc_stream_finish(st, backend, api->event, co_);
    rc_out_usage usage = {ctok, tok ? rc_stream_reasoning_tokens(st) : -1, -1};
    api->finish(co_, fin, rc_stream_stop_sequence(st), &usage, &out);
    fwrite(out.v, 1, out.n, stdout);
    rc_bytes_free(&out);
    api->destroy(co_);
    rc_stream_free(st);
    json_decref(req);
    rc_conv_free(&conv);
    rc_inference_free(&inf);
    return 0;
}

int cmd_recipe(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(recipe_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    opts o = {0};
    int parse = 0;
    if (!strcmp(argv[1], "tokens")) o.tokens = 1;
    else if (!strcmp(argv[1], "parse")) parse = 1;
    else if (strcmp(argv[1], "render")) {
        fprintf(stderr, "deepinfer recipe: unknown subcommand '%s' (render, tokens, parse)\n", argv[1]);
        return 2;
    }
    static const struct option lo[] = {{"api", required_argument, 0, 'a'},   {"encoding", required_argument, 0, 'e'},
                                       {"tokenizer", required_argument, 0, 't'}, {"jsonl", no_argument, 0, 'l'},
                                       {"help", no_argument, 0, 'h'},           {"request", required_argument, 0, 'r'},
                                       {"stream", no_argument, 0, 's'},         {"deterministic", no_argument, 0, 'd'},
                                       {"prompt-tokens", required_argument, 0, 'p'},
                                       {"cached-tokens", required_argument, 0, 'c'},
                                       {"finish", required_argument, 0, 'f'},   {"tokens", no_argument, 0, 'k'},
                                       {0, 0, 0, 0}};
    const char *req_path = NULL, *finish = "none"; /* no --finish: the backend never said why */
    int stream = 0, deterministic = 0, tokens_in = 0;
    long long ptoks = 0, ctoks = 0;
    const char *api = "chat", *path = cli_default_tokenizer();
    int jsonl = 0, c;
    optind = 1;
    while ((c = getopt_long(argc - 1, argv + 1, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'a': api = optarg; break;
        case 'e':
            if (!strcmp(optarg, "v4")) o.enc = RC_ENC_V4;
            else if (!strcmp(optarg, "v4.1")) o.enc = RC_ENC_V41;
            else {
                fprintf(stderr, "deepinfer recipe: --encoding must be v4 or v4.1\n");
                return 2;
            }
            break;
        case 't': path = optarg; break;
        case 'l': jsonl = 1; break;
        case 'r': req_path = optarg; break;
        case 's': stream = 1; break;
        case 'd': deterministic = 1; break;
        case 'p': ptoks = atoll(optarg); break;
        case 'c': ctoks = atoll(optarg); break;
        case 'f': finish = optarg; break;
        case 'k': tokens_in = 1; break;
        case 'h': fputs(recipe_help, stdout); return 0;
        default: fputs(recipe_help, stderr); return 2;
        }
    }
    if (!strcmp(api, "chat")) o.convert = rc_chat_convert;
    else if (!strcmp(api, "responses")) o.convert = rc_responses_convert;
    else if (!strcmp(api, "messages")) o.convert = rc_messages_convert;
    else {
        fprintf(stderr, "deepinfer recipe: --api must be chat, responses or messages\n");
        return 2;
    }
    if (parse) {
        if (!req_path) {
            fprintf(stderr, "deepinfer recipe parse: --request FILE is required\n");
            return 2;
        }
        rc_tokenizer *ptok = NULL;
        rc_err terr = {0};
        if (tokens_in && rc_tokenizer_load(path, &ptok, &terr)) {
            fprintf(stderr, "deepinfer recipe parse: %s\n", terr.msg);
            return 1;
        }
        int prc = recipe_parse(api, o.convert, req_path, stream, deterministic, ptoks, ctoks, finish, ptok);
        rc_tokenizer_free(ptok);
        return prc;
    }
    rc_err err = {0};
    if (o.tokens && rc_tokenizer_load(path, &o.tok, &err)) {
        fprintf(stderr, "deepinfer recipe: %s\n", err.msg);
        return 1;
    }
    int bad = 0;
    rc_bytes out = {0};
    if (jsonl) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) > 0) {
            out.n = 0;
            one(&o, line, (size_t)n, 1, &out); /* a rejected request is data here, not a failure */
            rc_bytes_append(&out, "\n", 1);
            fwrite(out.v, 1, out.n, stdout);
        }
        free(line);
    } else {
        rc_bytes in = {0};
        if (cli_read_all(stdin, &in, "stdin")) return 1;
        bad = one(&o, in.v, in.n, 0, &out);
        fwrite(out.v, 1, out.n, stdout);
        if (bad) fputc('\n', stdout);
        rc_bytes_free(&in);
    }
    rc_bytes_free(&out);
    rc_tokenizer_free(o.tok);
    return bad;
}
