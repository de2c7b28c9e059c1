/* test_stream.c - the output state machine on the spec's worked examples
 * (recipe.md §5.7), under every chunking: whole, one byte per chunk, and
 * every two-way split.  The differential tests against deepseek-recipe live
 * in tests/py/test_stream_chat_diff.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/vec.h"
#include "recipe/stream.h"

typedef struct {
    rc_bytes content, reasoning, names, args;
    int ncalls;
} agg;

static void on_ev(void *vp, rc_event_kind k, const char *t, size_t n) {
    agg *a = vp;
    switch (k) {
    case RC_EV_CONTENT: rc_bytes_append(&a->content, t, n); break;
    case RC_EV_REASONING: rc_bytes_append(&a->reasoning, t, n); break;
    case RC_EV_TOOL_CALL:
        if (a->ncalls++) rc_bytes_append(&a->names, ",", 1);
        rc_bytes_append(&a->names, t, n);
        if (a->ncalls > 1) rc_bytes_append(&a->args, "|", 1);
        break;
    case RC_EV_TOOL_ARGS: rc_bytes_append(&a->args, t, n); break;
    }
}

static const char *s_(const rc_bytes *b) { return b->v ? b->v : ""; }

/* run text split at the given cut points; check the aggregate */
static void run(const rc_stream_opts *o, const char *text, const size_t *cuts, size_t ncuts, const char *content,
                const char *reasoning, const char *names, const char *args, rc_finish fin) {
    agg a = {0};
    rc_stream *s = rc_stream_new(o);
    size_t at = 0, n = strlen(text);
    for (size_t k = 0; k <= ncuts; k++) {
        size_t end = k < ncuts ? cuts[k] : n;
        rc_stream_feed(s, text + at, end - at, on_ev, &a);
        at = end;
    }
    rc_finish f = rc_stream_finish(s, RC_FINISH_STOP, on_ev, &a);
    assert_string_equal(s_(&a.content), content);
    assert_string_equal(s_(&a.reasoning), reasoning);
    assert_string_equal(s_(&a.names), names);
    assert_string_equal(s_(&a.args), args);
    assert_int_equal(f, fin);
    rc_stream_free(s);
    rc_bytes_free(&a.content);
    rc_bytes_free(&a.reasoning);
    rc_bytes_free(&a.names);
    rc_bytes_free(&a.args);
}

static void all_chunkings(const rc_stream_opts *o, const char *text, const char *content, const char *reasoning,
                          const char *names, const char *args, rc_finish fin) {
    size_t n = strlen(text);
    run(o, text, NULL, 0, content, reasoning, names, args, fin);
    static size_t cuts[4096];
    for (size_t i = 1; i < n && i <= 4096; i++) cuts[i - 1] = i; /* one byte per chunk */
    run(o, text, cuts, n - 1, content, reasoning, names, args, fin);
    for (size_t i = 1; i < n; i++) run(o, text, &i, 1, content, reasoning, names, args, fin);
}

static void test_worked_trace(void **state) {
    rc_stream_opts o = {.parse_tool_calls = 1, .reasoning = RC_REASONING_NONE};
    all_chunkings(&o,
                  "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"get_weather\">\n"
                  "<\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter name=\"city\" string=\"true\">Paris</\xef\xbd\x9c"
                  "DSML\xef\xbd\x9c parameter>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>",
                  "", "", "get_weather", "{\"city\": \"Paris\"}", RC_FINISH_TOOL_CALLS);
    all_chunkings(&o,
                  "Sure.\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"f\">\n</\xef\xbd\x9c"
                  "DSML\xef\xbd\x9c invoke>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c calls>trailing",
                  "Sure.", "", "f", "{}", RC_FINISH_TOOL_CALLS);
    rc_stream_opts th = {.parse_tool_calls = 1, .reasoning = RC_REASONING_START};
    all_chunkings(&th, "think\n</think>\n\nAnswer", "Answer", "think", "", "", RC_FINISH_STOP);
    /* a stray </think> is dropped; a dangling "<" is content at the end */
    all_chunkings(&o, "\nhi</think>\nthere <", "hi\nthere <", "", "", "", RC_FINISH_STOP);
}

static void test_stop_and_json(void **state) {
    const char *stop[] = {"END", "xyz"};
    rc_stream_opts o = {.parse_tool_calls = 1, .reasoning = RC_REASONING_NONE, .stop = stop, .nstop = 2};
    all_chunkings(&o, "abc EN ENDtail", "abc EN ", "", "", "", RC_FINISH_STOP_SEQUENCE);
    rc_stream_opts j = {.json_output = 1, .reasoning = RC_REASONING_NONE};
    all_chunkings(&j, "```json\n{\"a\": [1]}\n```", "{\"a\": [1]}", "", "", "", RC_FINISH_STOP);
    /* escaping of string parameter fragments */
    rc_stream_opts t = {.parse_tool_calls = 1, .tool_call_initial = 1};
    all_chunkings(&t,
                  "<\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke name=\"f\">\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter name=\"q\" string=\"true\">"
                  "a \"b\"\n\\c</\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter>\n<\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter name=\"n\" "
                  "string=\"false\">[1, 2]</\xef\xbd\x9c" "DSML\xef\xbd\x9c parameter>\n</\xef\xbd\x9c" "DSML\xef\xbd\x9c invoke>",
                  "", "", "f", "{\"q\": \"a \\\"b\\\"\\n\\\\c\", \"n\": [1, 2]}", RC_FINISH_TOOL_CALLS);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_worked_trace), cmocka_unit_test(test_stop_and_json)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
