/* test_pool.c - every task index runs exactly once, on any pool size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>

#include "base/pool.h"

typedef struct {
    atomic_int *hits;
} ctx;

static void task(void *vp, size_t i) {
    ctx *c = vp;
    atomic_fetch_add(&c->hits[i], 1);
}

static void test_each_once(void **state) {
    for (int th = 1; th <= 5; th++) {
        rc_pool *p = rc_pool_create(th);
        assert_non_null(p);
        for (size_t n = 0; n < 300; n += 37) {
            for (int rep = 0; rep < 20; rep++) {
                ctx c = {.hits = calloc(n + 1, sizeof(atomic_int))};
                rc_pool_run(p, n, task, &c);
                for (size_t i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 1);
                free(c.hits);
            }
        }
        rc_pool_destroy(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_each_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
