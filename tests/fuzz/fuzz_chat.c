/* fuzz_chat.c - libFuzzer harness for Chat Completions requests.
 *
 * Any bytes: parse, convert, render, tokenize.  Properties: no crash, no
 * leak, no hang; a rejected request has status 400 and a message; an
 * accepted one renders, and its control ids are exactly the renderer's
 * spans (text from the request never becomes a control token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/protocol.h"

static rc_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    rc_err err = {0};
    if (rc_tokenizer_load(V4_DIR "/tokenizer.json", &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *req = json_loadb((const char *)data, size, 0, NULL);
    if (!req) return 0;
    rc_conversation conv;
    rc_inference inf;
    rc_api_error e = {0};
    if (rc_chat_convert(req, &conv, &inf, &e)) {
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
    json_decref(req);
    return 0;
}
