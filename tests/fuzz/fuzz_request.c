/* fuzz_request.c - libFuzzer harness for API requests (all three protocols).
 *
 * Any bytes: JSON syntax check, parse, then each converter (Chat Completions,
 * Responses, Messages), render, tokenize.  Properties: no crash, no leak, no
 * hang; a rejected request has status 400 and a message; an accepted one
 * renders, and its control ids are exactly the renderer's spans (text from
 * the request never becomes a control token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol.h"
#include "recipe/pyjson.h"

static rc_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    rc_err err = {0};
    if (rc_tokenizer_load(V4_DIR "/tokenizer.json", &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    return 0;
}

typedef int (*convert_fn)(const json_t *, rc_conversation *, rc_inference *, rc_api_error *);

static void one(const json_t *req, convert_fn convert) {
    rc_conversation conv;
    rc_inference inf;
    rc_api_error e = {0};
    if (convert(req, &conv, &inf, &e)) {
        if (e.status != 400 || !e.message[0]) abort();
    } else {
        for (int enc = 0; enc < 2; enc++) {
            rc_prompt p;
            rc_err err = {0};
            if (rc_render(&conv, (rc_encoding)enc, &p, &err)) abort();
            if (enc == RC_ENC_V4) { /* the bundled tokenizer is V4's */
                rc_ids ids = {0};
                if (rc_prompt_tokens(&p, tok, NULL, &ids, &err)) abort();
                size_t nadded = 0;
                for (size_t i = 0; i < ids.n; i++) nadded += rc_tokenizer_is_added(tok, ids.v[i]);
                if (nadded != p.nspecial) abort();
                rc_ids_free(&ids);
            }
            rc_prompt_free(&p);
        }
    }
    rc_conv_free(&conv);
    rc_inference_free(&inf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char msg[256];
    if (rc_json_syntax_error((const char *)data, size, msg, sizeof msg)) return 0;
    json_t *req = rc_json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!req) return 0;
    one(req, rc_chat_convert);
    one(req, rc_responses_convert);
    one(req, rc_messages_convert);
    json_decref(req);
    return 0;
}
