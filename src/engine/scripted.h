/* scripted.h - a TEST backend that replays scripted model output.
 *
 * It exists for protocol tests that need reasoning, tool calls or stop
 * sequences from the "model" — things random weights never produce.  It is
 * chosen only by `deepinfer serve --backend scripted`, never by default, and
 * the server says so in /v1/models and in its startup line.
 *
 * A request selects a script by containing the text [[script:NAME]] anywhere
 * in its prompt (the last one wins); without one it gets the script "hello".
 * The script's text is tokenized in template mode (so "</think>" becomes the
 * control token the real model emits) and replayed one token per step, then
 * EOS.  Scripts come from a JSON file {"name": "text", ...} merged over the
 * built-in ones (hello, reasoning, tool, long, stop). */
#ifndef ENGINE_SCRIPTED_H
#define ENGINE_SCRIPTED_H

#include "engine/engine.h"
#include "recipe/tokenizer.h"

/* path may be NULL (built-ins only).  The returned backend's impl is freed by
 * eng_scripted_free. */
int eng_scripted_backend(const rc_tokenizer *tok, const char *path, eng_backend *out, rc_err *err);
void eng_scripted_free(eng_backend *be);
/* sleep ms in every forward (tests that act mid-stream) */
void eng_scripted_set_step_ms(eng_backend *be, int ms);

#endif
