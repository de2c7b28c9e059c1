/* test_pyjson.c - Python-style JSON: the spec's vectors T-J1..T-J3 (taken
 * from the reference's tests) and Python repr() of floats (values printed by
 * CPython, listed here as literals). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "recipe/pyjson.h"

static void check(const char *in, const char *want) {
    json_error_t je;
    json_t *v = json_loads(in, JSON_DECODE_ANY, &je);
    assert_non_null(v);
    rc_bytes out = {0};
    assert_int_equal(rc_pyjson(v, &out), 0);
    assert_string_equal(out.v, want);
    rc_bytes_free(&out);
    json_decref(v);
}

static void test_vectors(void **state) {
    check("{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"The location "
          "user interested in\"}},\"required\":[\"location\"],\"additionalProperties\":false}",
          "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"The "
          "location user interested in\"}}, \"required\": [\"location\"], \"additionalProperties\": false}");
    check("[0.0, -0.0, 0.0001, 1e-5, 1e-6, 1e-9, 2.5, 1]", "[0.0, -0.0, 0.0001, 1e-05, 1e-06, 1e-09, 2.5, 1]");
    check("{\"s\":\"a\\u0001b\\\"c\\\\d\\n/\xc3\xa9\"}", "{\"s\": \"a\\u0001b\\\"c\\\\d\\n/\xc3\xa9\"}");
    check("{\"z\":{\"b\":1,\"a\":2},\"a\":true}", "{\"z\": {\"b\": 1, \"a\": 2}, \"a\": true}");
    check("[{}, [], null, \"\\u2028\"]", "[{}, [], null, \"\xe2\x80\xa8\"]");
}

static void test_floats(void **state) {
    /* repr() in CPython 3.11 */
    static const struct { double x; const char *s; } v[] = {
        {1e16, "1e+16"},          {1e-5, "1e-05"},       {123456789012345.6, "123456789012345.6"},
        {1234567890123456.7, "1234567890123456.8"}, {0.0001, "0.0001"}, {1.5e300, "1.5e+300"},
        {-2.5e-7, "-2.5e-07"},    {0.1, "0.1"},          {1.0 / 3, "0.3333333333333333"},
        {100.0, "100.0"},         {1e15, "1000000000000000.0"}, {5e-324, "5e-324"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {-1.25, "-1.25"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        rc_bytes out = {0};
        assert_int_equal(rc_pyfloat(v[i].x, &out), 0);
        assert_string_equal(out.v, v[i].s);
        rc_bytes_free(&out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_vectors), cmocka_unit_test(test_floats)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
