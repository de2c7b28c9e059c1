/* test_kv_mirror.c - the CUDA backend's bookkeeping of its full-block mirror and pointer cache
 * (src/backend/kv_mirror.h), on the host: slots over a host array stand for the device's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/kv_mirror.h"

#define STRIDE 64 /* bytes a slot */

/* a mirror of n slots over a fake address range (never dereferenced) */
static void mk(kv_mirror *m, size_t n)
{
    memset(m, 0, sizeof *m);
    assert_int_equal(kvm_init(m, n, (uintptr_t)0x100000, STRIDE), 0);
}

static long get(kv_mirror *m, uint64_t id, int want_miss)
{
    int miss;
    const long v = kvm_get(m, id, &miss);
    if (v >= 0 && miss != want_miss) fail_msg("block %llu: miss %d, wanted %d", (unsigned long long)id, miss, want_miss);
    return v;
}

/* Never-used slots first, hits keep their slot, the clock hand's victims skip this call's blocks, and a call
 * whose blocks fill every slot gets -1. */
static void test_slots(void **st)
{
    (void)st;
    kv_mirror m;
    mk(&m, 4);
    kvm_begin(&m, 1);
    for (uint64_t id = 1; id <= 4; id++) assert_int_equal(get(&m, id, 1), (long)id - 1);
    assert_int_equal(get(&m, 2, 0), 1);
    assert_int_equal(get(&m, 5, 1), -1); /* all four are this call's */
    kvm_begin(&m, 2);
    assert_int_equal(get(&m, 1, 0), 0); /* slot 0 is call 2's now */
    assert_int_equal(get(&m, 5, 1), 1); /* the hand passes slot 0, takes block 2's */
    assert_int_equal(get(&m, 6, 1), 2);
    assert_int_equal(get(&m, 2, 1), 3); /* block 2 was evicted: a miss again */
    assert_int_equal(get(&m, 7, 1), -1);
    assert_int_equal(m.uploads, 7);
    kvm_begin(&m, 3);
    const long v = get(&m, 8, 1);
    assert_int_equal(v, 0);
    kvm_forget(&m, v); /* its upload failed: nothing holds block 8 */
    assert_int_equal(get(&m, 8, 1), 1);
    kvm_free(&m);
}

/* A hit served from the pointer cache is stamped by the call's first eviction: two contexts of 6 blocks fill a
 * 12-slot mirror in order (the hand stays on the first's), both are cached, then one call serves the first from
 * the cache and brings in a third context: its 6 victims are the second's, not the first's. */
static void test_served_blocks_survive_the_call(void **st)
{
    (void)st;
    kv_mirror m;
    mk(&m, 12);
    const void *addr[3][6];
    uint64_t call = 0;
    for (int c = 0; c < 2; c++) {
        kvm_begin(&m, ++call);
        int fill;
        kvm_entry *e = kvm_pc_find(&m, 100 * c + 1, 100 * c + 6, 6, &fill);
        assert_non_null(e);
        assert_int_equal(fill, 1);
        for (int i = 0; i < 6; i++) addr[c][i] = kvm_addr(&m, (size_t)get(&m, 100 * c + 1 + i, 1));
        kvm_pc_store(&m, e, addr[c]);
    }
    kvm_begin(&m, ++call);
    int fill;
    kvm_entry *e = kvm_pc_find(&m, 1, 6, 6, &fill);
    assert_non_null(e);
    assert_int_equal(fill, 0);
    assert_memory_equal(e->p, addr[0], sizeof addr[0]);
    assert_int_equal(kvm_pc_served(&m, e), 0);
    for (int i = 0; i < 6; i++) {
        const long v = get(&m, 201 + i, 1);
        assert_true(v >= 0);
        for (int j = 0; j < 6; j++)
            if (kvm_addr(&m, (size_t)v) == addr[0][j]) fail_msg("the served block %d was evicted within its call", j);
    }
    for (int j = 0; j < 6; j++) assert_int_equal(m.s[kvm_slot_of(&m, addr[0][j])].id, 1 + j);
    /* the eviction voided every entry: the first context's is refilled next call */
    kvm_begin(&m, ++call);
    e = kvm_pc_find(&m, 1, 6, 6, &fill);
    assert_non_null(e);
    assert_int_equal(fill, 1);
    kvm_free(&m);
}

/* Random calls over a small mirror, checked against what a call may rely on: every address it was handed (by
 * kvm_get or from the cache) still holds its block when the call ends, a cached entry is only served while each
 * of its addresses holds its block, and a call is refused (-1) only when its blocks outnumber the slots.
 * Sequences share prefixes (clones) and grow a block at a time. */
static void test_random_calls(void **st)
{
    (void)st;
    enum { NSEQ = 12, MAXB = 24, CALLS = 4000, NSLOT = 56 };
    uint64_t rng = 0x9E3779B97F4A7C15ull;
#define RND(n) ((rng = rng * 6364136223846793005ull + 1442695040888963407ull), (size_t)((rng >> 33) % (n)))
    uint64_t ids[NSEQ][MAXB];
    size_t nb[NSEQ];
    uint64_t next_id = 1;
    for (int q = 0; q < NSEQ; q++) {
        if (q % 3 == 1) { /* a clone of the sequence before: the same blocks (until one of them grows) */
            nb[q] = nb[q - 1];
            memcpy(ids[q], ids[q - 1], sizeof ids[q]);
            continue;
        }
        nb[q] = 8 + RND(8);
        for (size_t i = 0; i < nb[q]; i++) ids[q][i] = next_id++;
    }
    kv_mirror m;
    mk(&m, NSLOT);
    size_t served = 0, refused = 0, evictions0 = 0;
    for (uint64_t call = 1; call <= CALLS; call++) {
        kvm_begin(&m, call);
        /* a batch of 1..4 sequences */
        int batch[4], nbat = 1 + (int)RND(3);
        for (int k = 0; k < nbat; k++) batch[k] = (int)RND(NSEQ);
        const void *got[4][MAXB];
        uint64_t want[4][MAXB];
        size_t ngot[4] = {0};
        int ok = 1;
        for (int k = 0; k < nbat && ok; k++) {
            const int q = batch[k];
            if (RND(10) == 0 && nb[q] < MAXB) ids[q][nb[q]++] = next_id++; /* a block completes */
            int fill;
            kvm_entry *e = kvm_pc_find(&m, ids[q][0], ids[q][nb[q] - 1], nb[q], &fill);
            if (e && !fill) {
                for (size_t i = 0; i < nb[q]; i++)
                    if (m.s[kvm_slot_of(&m, e->p[i])].id != ids[q][i])
                        fail_msg("call %llu: a cached address of sequence %d no longer holds its block",
                                 (unsigned long long)call, q);
                assert_int_equal(kvm_pc_served(&m, e), 0);
                memcpy(got[k], e->p, nb[q] * sizeof *e->p);
                served++;
            } else {
                for (size_t i = 0; i < nb[q]; i++) {
                    const uint64_t before = m.gen;
                    int miss;
                    const long v = kvm_get(&m, ids[q][i], &miss);
                    if (v < 0) {
                        ok = 0;
                        break;
                    }
                    evictions0 += m.gen != before;
                    got[k][i] = kvm_addr(&m, (size_t)v);
                }
                if (ok && e) kvm_pc_store(&m, e, got[k]);
            }
            if (ok) {
                memcpy(want[k], ids[q], nb[q] * sizeof *ids[q]);
                ngot[k] = nb[q];
            }
        }
        if (!ok) { /* refused: only when the call's distinct blocks outnumber the slots */
            size_t distinct = 0;
            uint64_t seen[4 * MAXB];
            for (int k = 0; k < nbat; k++)
                for (size_t i = 0; i < nb[batch[k]]; i++) {
                    size_t j = 0;
                    while (j < distinct && seen[j] != ids[batch[k]][i]) j++;
                    if (j == distinct) seen[distinct++] = ids[batch[k]][i];
                }
            if (distinct <= NSLOT) fail_msg("call %llu refused with %zu blocks for %d slots", (unsigned long long)call,
                                            distinct, NSLOT);
            refused++;
            continue;
        }
        for (int k = 0; k < nbat; k++)
            for (size_t i = 0; i < ngot[k]; i++)
                if (m.s[kvm_slot_of(&m, got[k][i])].id != want[k][i])
                    fail_msg("call %llu: sequence %d's block %zu lost its slot before the call ended",
                             (unsigned long long)call, batch[k], i);
    }
    printf("  %d calls: %zu sequences served from the cache, %zu calls refused, %zu evictions seen, %zu uploads\n",
           CALLS, served, refused, evictions0, m.uploads);
    assert_true(served > 100);
    assert_true(evictions0 > 100);
    kvm_free(&m);
#undef RND
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_served_blocks_survive_the_call),
        cmocka_unit_test(test_random_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
