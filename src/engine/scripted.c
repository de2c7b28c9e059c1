/* scripted.c - see scripted.h.  Each sequence remembers the prompt it was
 * fed (decoded once the prompt is complete) and its position in the chosen
 * script; the next token goes to the engine through eng_backend.forced, so
 * no logits are written and no sampling runs: whatever the request's sampling
 * parameters, the script is replayed exactly, at almost no cost. */
#include "engine/scripted.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    char *name;
    rc_ids ids;
} script;

typedef struct {
    const rc_tokenizer *tok;
    script *v;
    size_t n;
    int vocab, eos, end_think;
    int step_ms; /* sleep per forward, so tests can act mid-stream */
} scripted;

typedef struct {
    rc_ids prompt;
    const script *sc;
    size_t pos;
    int32_t next; /* what forced() hands the engine */
} sseq;

static const char *const BUILTIN[][2] = {
    {"hello", "Hello! This is the scripted test backend of deepinfer; no model ran."},
    {"reasoning", "The user asks for 2 + 2. Adding gives 4.</think>2 + 2 = 4."},
    {"tool", "I should look up the weather.</think>\n\n<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>\n"
             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke name=\"get_weather\">\n"
             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"city\" string=\"true\">Paris</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter>\n"
             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"days\" string=\"false\">3</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter>\n"
             "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke>\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>"},
    {"tool_plain", "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>\n"
             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke name=\"get_weather\">\n"
             "<\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter name=\"city\" string=\"true\">Paris</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cparameter>\n"
             "</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Cinvoke>\n</\xEF\xBD\x9C" "DSML\xEF\xBD\x9Ctool_calls>"},
    {"stop", "one two three STOP four five"},
    {"long", "Counting: one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
             "sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five "
             "twenty-six twenty-seven twenty-eight twenty-nine thirty."},
};

static int add_script(scripted *s, const char *name, const char *text, rc_err *err)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->v[i].name, name)) { /* a file overrides a built-in */
            s->v[i].ids.n = 0;
            return rc_tokenizer_encode(s->tok, text, strlen(text), RC_ENCODE_TEMPLATE, &s->v[i].ids, err);
        }
    script *nv = realloc(s->v, (s->n + 1) * sizeof *nv);
    if (!nv) return rc_errf(err, RC_ENOMEM, "out of memory");
    s->v = nv;
    script *c = &s->v[s->n];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    s->n++;
    return rc_tokenizer_encode(s->tok, text, strlen(text), RC_ENCODE_TEMPLATE, &c->ids, err);
}

static void *seq_new(void *impl)
{
    (void)impl;
    return calloc(1, sizeof(sseq));
}

static void seq_free(void *impl, void *seq)
{
    (void)impl;
    sseq *q = seq;
    if (!q) return;
    free(q->prompt.v);
    free(q);
}

static const script *choose(const scripted *s, const rc_ids *prompt)
{
    rc_bytes text = {0};
    rc_err err = {0};
    const script *pick = NULL;
    if (rc_tokenizer_decode(s->tok, prompt->v, prompt->n, RC_DECODE_ADDED, &text, &err) == 0 && text.n) {
        rc_bytes_append(&text, "", 1); /* NUL */
        const char *p = text.v, *last = NULL;
        while ((p = strstr(p, "[[script:"))) last = p++;
        if (last) {
            const char *a = last + 9, *b = strstr(a, "]]");
            if (b)
                for (size_t i = 0; i < s->n; i++)
                    if (strlen(s->v[i].name) == (size_t)(b - a) && !strncmp(s->v[i].name, a, (size_t)(b - a)))
                        pick = &s->v[i];
        }
    }
    rc_bytes_free(&text);
    if (!pick)
        for (size_t i = 0; i < s->n; i++)
            if (!strcmp(s->v[i].name, "hello")) pick = &s->v[i];
    return pick;
}

static int32_t forced(void *impl, void *seq)
{
    (void)impl;
    return ((sseq *)seq)->next;
}

static int forward(void *impl, void **seqs, const int32_t **ids, const size_t *n, float **logits, size_t count,
                   rc_err *err)
{
    scripted *s = impl;
    if (s->step_ms > 0) {
        struct timespec ts = {s->step_ms / 1000, (long)(s->step_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    for (size_t k = 0; k < count; k++) {
        sseq *q = seqs[k];
        if (!q->sc) {
            for (size_t i = 0; i < n[k]; i++)
                if (rc_ids_push(&q->prompt, ids[k][i])) return rc_errf(err, RC_ENOMEM, "out of memory");
        } else {
            q->pos++; /* the token we emitted came back as input */
        }
        if (!logits[k]) continue;
        if (!q->sc) {
            q->sc = choose(s, &q->prompt);
            /* scripts are written as thinking-mode output ("reasoning</think>
             * answer"); a non-thinking prompt already ends in </think>, so
             * replay only what follows the script's first </think> */
            if (q->prompt.n && q->prompt.v[q->prompt.n - 1] == s->end_think)
                for (size_t i = 0; i < q->sc->ids.n; i++)
                    if (q->sc->ids.v[i] == s->end_think) {
                        q->pos = i + 1;
                        break;
                    }
        }
        q->next = q->pos < q->sc->ids.n ? q->sc->ids.v[q->pos] : s->eos;
    }
    return 0;
}

int eng_scripted_backend(const rc_tokenizer *tok, const char *path, eng_backend *out, rc_err *err)
{
    scripted *s = calloc(1, sizeof *s);
    if (!s) return rc_errf(err, RC_ENOMEM, "out of memory");
    s->tok = tok;
    s->vocab = rc_tokenizer_n_ids(tok);
    s->eos = rc_tokenizer_added_id(tok, "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
    if (s->eos < 0) s->eos = 1;
    s->end_think = rc_tokenizer_added_id(tok, "</think>");
    int rc = 0;
    for (size_t i = 0; i < sizeof BUILTIN / sizeof BUILTIN[0] && !rc; i++)
        rc = add_script(s, BUILTIN[i][0], BUILTIN[i][1], err);
    if (!rc && path) {
        json_error_t je;
        json_t *j = json_load_file(path, 0, &je);
        if (!j || !json_is_object(j)) {
            rc = rc_errf(err, RC_EINVAL, "scripts %s: %s", path, j ? "must be a JSON object {name: text}" : je.text);
        } else {
            const char *k;
            json_t *v;
            json_object_foreach(j, k, v) {
                if (!json_is_string(v)) { rc = rc_errf(err, RC_EINVAL, "scripts %s: \"%s\" is not a string", path, k); break; }
                if ((rc = add_script(s, k, json_string_value(v), err))) break;
            }
        }
        json_decref(j);
    }
    memset(out, 0, sizeof *out);
    out->vocab = s->vocab;
    out->eos_id = s->eos;
    out->max_context = 1 << 20;
    out->impl = s;
    out->seq_new = seq_new;
    out->seq_free = seq_free;
    out->forward = forward;
    out->forced = forced;
    if (rc) eng_scripted_free(out);
    return rc;
}

void eng_scripted_free(eng_backend *be)
{
    scripted *s = be->impl;
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].ids.v);
    }
    free(s->v);
    free(s);
    be->impl = NULL;
}

void eng_scripted_set_step_ms(eng_backend *be, int ms)
{
    scripted *s = be->impl;
    if (s) s->step_ms = ms;
}
