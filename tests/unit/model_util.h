/* model_util.h - helpers the model-level unit tests share (test_model,
 * test_kv, test_engine, test_cuda): deterministic token ids and loading a
 * fixture model with the error shown.  Include after <cmocka.h>. */
#ifndef TESTS_UNIT_MODEL_UTIL_H
#define TESTS_UNIT_MODEL_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/v4.h"

/* n ids in [0, vocab) from a 64-bit LCG: the same on every run and machine */
static inline int32_t *make_ids(size_t n, int vocab, uint64_t seed)
{
    int32_t *v = malloc((n ? n : 1) * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    }
    return v;
}

/* a fixture model that must load (the test fails with the loader's message) */
static inline md_model *load_fixture_model(const char *dir, be_backend *be, md_semantics sem)
{
    md_model *m = NULL;
    rc_err err = {0};
    int rc = md_model_load(dir, be, sem, NULL, NULL, &m, &err);
    if (rc) fprintf(stderr, "%s: %s\n", dir, err.msg);
    assert_int_equal(rc, 0);
    return m;
}

#endif
