/* test_rng.h - the GPU tests' deterministic random numbers (xorshift64*):
 * rnd() 64 bits, unif01() uniform in [0, 1), unif() in [-1, 1).  One state per test program
 * (rng_state), reseedable by assigning it or by rng_seed_test. */
#ifndef TESTS_UNIT_TEST_RNG_H
#define TESTS_UNIT_TEST_RNG_H

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static inline uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* uniform in [0, 1) and in [-1, 1), from the top 53 bits */
static inline double unif01(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
static inline float unif(void) { return (float)(unif01() * 2.0 - 1.0); }

/* rng_state for one test from its name (FNV-1a), so that a test's data does not depend on which tests ran before
 * it (TEST_CUDA_FILTER); TEST_SEED=n mixes n in, for other data */
static inline void rng_seed_test(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = name; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    const char *e = getenv("TEST_SEED");
    if (e && *e) h ^= (strtoull(e, NULL, 10) + 1) * 0x9E3779B97F4A7C15ull;
    rng_state = h ? h : 1;
}

#endif
