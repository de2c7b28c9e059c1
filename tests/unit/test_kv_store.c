/* test_kv_store.c - the disk tier of the KV cache (src/kv/store.c).
 *
 *   - round trips, raw and zstd, with the file bytes checked against the
 *     format documented in store.h (an independent encoder here);
 *   - duplicate puts refresh mtime instead of rewriting, a longer TTL rewrites;
 *   - restart recovery (counts rebuilt, every blob back) and two instances on
 *     one directory seeing each other's blobs;
 *   - damage of every kind is a miss that unlinks the file: truncation and
 *     extension, every bit of the header and CRC and a sample of the payload,
 *     a foreign version / magic / flag with a correct CRC, another key's file;
 *   - expiry (mtime moved into the past), hits refreshing mtime, LRU capacity
 *     eviction, the background sweeper (timer and capacity kick);
 *   - writes and deletes landing in the middle of a sweep's walk (a
 *     test-only hook in store.c): files/bytes still exact afterwards;
 *   - faults: a file size limit (real EFBIG, in a child), the directory
 *     removed or replaced by a file, a writer killed with SIGKILL mid-stream,
 *     stale temp files, foreign files (a FIFO too) left alone; a FIFO at a
 *     key's own path: get and contains miss at once, a put replaces it;
 *   - a reader hammering get (through a second instance) while blobs are
 *     written and rewritten sees only misses or exact bytes.
 * The tests run as root: nothing here depends on permission bits. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "kv/store.h"

#define HOUR 3600u
#define FOREVER_MS 3600000 /* sweeper period for tests that sweep by hand */

/* ---------------------------------------------------------------- helpers */

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* key i: its first 4 bytes are i (so a file name tells its index), the rest spread */
static void mkkey(uint32_t i, uint8_t key[32])
{
    uint64_t x = i * 7919ull + 17;
    for (int k = 0; k < 32; k += 8) {
        uint64_t r = splitmix(&x);
        memcpy(key + k, &r, 8);
    }
    for (int k = 0; k < 4; k++) key[k] = (uint8_t)(i >> (8 * k));
}

static void fill_rand(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0) x ^= splitmix(&x);
        p[i] = (uint8_t)(x >> (8 * (i % 8)));
    }
}

/* compressible: text-like with a seed in it */
static void fill_text(uint8_t *p, size_t n, uint64_t seed)
{
    char line[64];
    int l = snprintf(line, sizeof line, "block %llu of the prefix cache, layer ", (unsigned long long)seed);
    for (size_t i = 0; i < n; i++) p[i] = i % 97 == 0 ? (uint8_t)('0' + (i / 97) % 10) : (uint8_t)line[i % (size_t)l];
}

static uint8_t *blob(size_t n, uint64_t seed, int text)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    if (text) fill_text(p, n, seed);
    else fill_rand(p, n, seed);
    return p;
}

static char *mkdir_tmp(void)
{
    char *d = strdup("/tmp/kvstore-test-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void rm_rf(const char *d)
{
    struct stat st;
    if (lstat(d, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(d);
        return;
    }
    nftw(d, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* the layout, computed independently of store.c */
static void fpath(const char *dir, const uint8_t key[32], unsigned kind, char out[512])
{
    char hx[65];
    for (int i = 0; i < 32; i++) sprintf(hx + 2 * i, "%02x", key[i]);
    snprintf(out, 512, "%s/v1/%c%c/%s.%u", dir, hx[0], hx[1], hx, kind);
}

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static long long fsize(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

static time_t fmtime(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? st.st_mtim.tv_sec : 0;
}

static void set_age(const char *p, time_t secs_ago)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= secs_ago;
    ts[1] = ts[0];
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
}

static void set_mtime_abs(const char *p, time_t t)
{
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
}

static uint8_t *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(l ? (size_t)l : 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)l, f), (size_t)l);
    fclose(f);
    *n = (size_t)l;
    return b;
}

static void spit(const char *p, const void *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
static void wle32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* recompute the trailing CRC after editing a file's bytes */
static void reseal(uint8_t *f, size_t n) { wle32(f + n - 4, rc_crc32c(f, n - 4)); }

static int count_dir(const char *d)
{
    DIR *x = opendir(d);
    if (!x) return -1;
    int c = 0;
    struct dirent *e;
    while ((e = readdir(x)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) c++;
    closedir(x);
    return c;
}

static kv_store *open_store(const char *dir, uint64_t cap, int level)
{
    kv_store_cfg c = {.dir = dir, .cap_bytes = cap, .compress = level, .sweep_interval_ms = FOREVER_MS};
    kv_store *s = NULL;
    rc_err err = {0};
    int rc = kv_store_open(&c, &s, &err);
    if (rc) print_error("kv_store_open: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(s);
    return s;
}

static kv_store_stats stats(kv_store *s)
{
    kv_store_stats st;
    kv_store_get_stats(s, &st);
    return st;
}

/* get must hit with exactly these bytes */
static void expect_hit(kv_store *s, const uint8_t key[32], uint8_t kind, const uint8_t *want, size_t n)
{
    void *d = NULL;
    size_t got = 12345;
    assert_int_equal(kv_store_get(s, key, kind, &d, &got), 0);
    assert_non_null(d);
    assert_int_equal(got, n);
    if (n) assert_memory_equal(d, want, n);
    free(d);
}

static void expect_miss(kv_store *s, const uint8_t key[32], uint8_t kind)
{
    void *d = (void *)1;
    size_t got = 12345;
    assert_int_equal(kv_store_get(s, key, kind, &d, &got), KV_STORE_ENOENT);
    assert_null(d);
    assert_int_equal(got, 0);
}

/* ---------------------------------------------------------------- round trips */

static void test_round_trip_raw(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    static const size_t sizes[] = {0, 1, 100, 4096, (1u << 20) + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    uint8_t keys[N][32], *data[N];
    uint64_t total = 0, disk = 0;
    for (int i = 0; i < N; i++) {
        mkkey(i, keys[i]);
        data[i] = blob(sizes[i], i, 0);
        assert_int_equal(kv_store_put(s, keys[i], 1, data[i], sizes[i], 72 * HOUR), 0);
        total += sizes[i];
    }
    /* same key, another kind: another entry */
    uint8_t *w = blob(333, 99, 0);
    assert_int_equal(kv_store_put(s, keys[2], 2, w, 333, 180), 0);
    kv_store_flush(s);

    char p[512];
    for (int i = 0; i < N; i++) {
        fpath(dir, keys[i], 1, p);
        assert_int_equal(fsize(p), 84 + (long long)sizes[i]);
        disk += 84 + sizes[i];
        /* the documented format, byte by byte */
        size_t fn;
        uint8_t *f = slurp(p, &fn);
        assert_memory_equal(f, "DIKVSTR1", 8);
        assert_int_equal(le32(f + 8), 1);
        assert_int_equal(f[12], 1);
        assert_int_equal(f[13], 0);
        assert_int_equal(f[14] | f[15], 0);
        assert_memory_equal(f + 16, keys[i], 32);
        assert_int_equal(le32(f + 48), 72 * HOUR);
        assert_int_equal(le32(f + 52), 0);
        /* the store stamps CLOCK_REALTIME seconds; glibc's time() reads the coarse clock, which can lag it by a
         * tick across a second boundary, so the upper bound reads the same clock the store does */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        assert_true(le64(f + 56) > 1600000000ull && le64(f + 56) <= (uint64_t)now.tv_sec);
        assert_int_equal(le64(f + 64), sizes[i]);
        assert_int_equal(le64(f + 72), sizes[i]);
        if (sizes[i]) assert_memory_equal(f + 80, data[i], sizes[i]);
        assert_int_equal(le32(f + fn - 4), rc_crc32c(f, fn - 4));
        free(f);
    }
    fpath(dir, keys[2], 2, p);
    assert_int_equal(fsize(p), 84 + 333);
    disk += 84 + 333;

    for (int i = 0; i < N; i++) {
        assert_int_equal(kv_store_contains(s, keys[i], 1), 1);
        expect_hit(s, keys[i], 1, data[i], sizes[i]);
    }
    expect_hit(s, keys[2], 2, w, 333);
    uint8_t other[32];
    mkkey(1000, other);
    expect_miss(s, other, 1);
    expect_miss(s, keys[0], 2);
    assert_int_equal(kv_store_contains(s, other, 1), 0);
    assert_int_equal(kv_store_contains(s, keys[0], 3), 0);

    kv_store_stats t = stats(s);
    assert_int_equal(t.puts, N + 1);
    assert_int_equal(t.put_bytes, total + 333);
    assert_int_equal(t.written, N + 1);
    assert_int_equal(t.existing, 0);
    assert_int_equal(t.hits, N + 1);
    assert_int_equal(t.misses, 2);
    assert_int_equal(t.files, N + 1);
    assert_int_equal(t.bytes, disk);
    assert_int_equal(t.damaged + t.expired + t.dropped + t.write_errors + t.evicted, 0);

    /* a sweep recounts the same */
    kv_store_sweep(s);
    t = stats(s);
    assert_int_equal(t.files, N + 1);
    assert_int_equal(t.bytes, disk);

    /* bad arguments */
    void *d;
    size_t n;
    assert_int_equal(kv_store_put(s, keys[0], 0, w, 10, 1), RC_EINVAL);
    assert_int_equal(kv_store_put(s, keys[0], 1, NULL, 10, 1), RC_EINVAL);
    assert_int_equal(kv_store_put(s, keys[0], 1, w, (size_t)KV_STORE_MAX_BLOB + 1, 1), RC_EINVAL);
    assert_int_equal(kv_store_get(s, keys[0], 0, &d, &n), RC_EINVAL);
    assert_int_equal(stats(s).puts, N + 1);

    kv_store_close(s);
    for (int i = 0; i < N; i++) free(data[i]);
    free(w);
    rm_rf(dir);
    free(dir);
}

static void test_round_trip_compressed(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 3);
    uint8_t k1[32], k2[32], k3[32];
    mkkey(1, k1), mkkey(2, k2), mkkey(3, k3);
    size_t n1 = 1 << 20, n2 = 65536;
    uint8_t *text = blob(n1, 5, 1), *noise = blob(n2, 6, 0);
    assert_int_equal(kv_store_put(s, k1, 1, text, n1, HOUR), 0);
    assert_int_equal(kv_store_put(s, k2, 1, noise, n2, HOUR), 0);
    assert_int_equal(kv_store_put(s, k3, 2, text, 0, HOUR), 0);
    kv_store_flush(s);

    char p[512];
    size_t fn;
    /* compressible: flag set, stored < raw, file = 84 + stored */
    fpath(dir, k1, 1, p);
    uint8_t *f = slurp(p, &fn);
    assert_int_equal(f[13], 1);
    assert_int_equal(le64(f + 64), n1);
    assert_true(le64(f + 72) < n1 / 10);
    assert_int_equal(fn, 84 + le64(f + 72));
    assert_int_equal(le32(f + fn - 4), rc_crc32c(f, fn - 4));
    free(f);
    /* incompressible: stored raw */
    fpath(dir, k2, 1, p);
    f = slurp(p, &fn);
    assert_int_equal(f[13], 0);
    assert_int_equal(fn, 84 + n2);
    assert_memory_equal(f + 80, noise, n2);
    free(f);
    /* empty: raw */
    fpath(dir, k3, 2, p);
    assert_int_equal(fsize(p), 84);

    expect_hit(s, k1, 1, text, n1);
    expect_hit(s, k2, 1, noise, n2);
    expect_hit(s, k3, 2, text, 0);
    kv_store_stats t = stats(s);
    assert_int_equal(t.hits, 3);
    assert_int_equal(t.written, 3);
    assert_int_equal(t.damaged, 0);
    kv_store_close(s);
    free(text);
    free(noise);
    rm_rf(dir);
    free(dir);
}

static void test_duplicate_put(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    uint8_t k[32];
    mkkey(7, k);
    uint8_t *b = blob(1000, 7, 0);
    char p[512];
    fpath(dir, k, 1, p);

    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 100), 0);
    kv_store_flush(s);
    struct stat st0;
    assert_int_equal(stat(p, &st0), 0);
    set_age(p, 50);
    /* same TTL: not rewritten (same inode), mtime refreshed */
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 100), 0);
    kv_store_flush(s);
    struct stat st1;
    assert_int_equal(stat(p, &st1), 0);
    assert_int_equal(st1.st_ino, st0.st_ino);
    assert_true(st1.st_mtim.tv_sec >= time(NULL) - 5);
    /* shorter TTL: covered, not rewritten */
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 10), 0);
    kv_store_flush(s);
    kv_store_stats t = stats(s);
    assert_int_equal(t.written, 1);
    assert_int_equal(t.existing, 2);
    /* longer TTL: rewritten with it (a new inode), counts unchanged */
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 1000), 0);
    kv_store_flush(s);
    size_t fn;
    uint8_t *f = slurp(p, &fn);
    assert_int_equal(le32(f + 48), 1000);
    free(f);
    /* ttl 0 (never) is longer than any */
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 0), 0);
    kv_store_flush(s);
    f = slurp(p, &fn);
    assert_int_equal(le32(f + 48), 0);
    free(f);
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, 5000), 0);
    kv_store_flush(s);
    t = stats(s);
    assert_int_equal(t.written, 3);
    assert_int_equal(t.existing, 3);
    assert_int_equal(t.files, 1);
    assert_int_equal(t.bytes, 1084);
    assert_int_equal(count_dir(dir), 1); /* only v1 */
    expect_hit(s, k, 1, b, 1000);
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- restart, sharing */

static void test_restart_recovery(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    enum { N = 40 };
    uint8_t keys[N][32], *data[N];
    size_t sz[N];
    kv_store *a = open_store(dir, 0, 1);
    for (int i = 0; i < N; i++) {
        mkkey(i, keys[i]);
        sz[i] = 500 + (size_t)i * 977;
        data[i] = blob(sz[i], 100 + i, i % 2);
        assert_int_equal(kv_store_put(a, keys[i], (uint8_t)(1 + i % 2), data[i], sz[i], 168 * HOUR), 0);
    }
    kv_store_close(a); /* no flush: close drains the queue */

    uint64_t disk = 0;
    char p[512];
    for (int i = 0; i < N; i++) {
        fpath(dir, keys[i], 1 + i % 2, p);
        assert_true(fsize(p) > 0);
        disk += (uint64_t)fsize(p);
    }
    kv_store *b = open_store(dir, 0, 1);
    kv_store_stats t = stats(b);
    assert_int_equal(t.files, N);
    assert_int_equal(t.bytes, disk);
    assert_int_equal(t.hits + t.puts + t.written, 0);
    for (int i = 0; i < N; i++) expect_hit(b, keys[i], (uint8_t)(1 + i % 2), data[i], sz[i]);
    assert_int_equal(stats(b).hits, N);
    assert_int_equal(stats(b).damaged, 0);
    kv_store_close(b);
    for (int i = 0; i < N; i++) free(data[i]);
    rm_rf(dir);
    free(dir);
}

static void test_two_instances(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *a = open_store(dir, 0, 0), *b = open_store(dir, 0, 3);
    uint8_t k1[32], k2[32], k3[32];
    mkkey(1, k1), mkkey(2, k2), mkkey(3, k3);
    uint8_t *d1 = blob(5000, 1, 0), *d2 = blob(70000, 2, 1), *d3 = blob(30000, 3, 1);
    expect_miss(b, k1, 1);
    assert_int_equal(kv_store_put(a, k1, 1, d1, 5000, HOUR), 0);
    kv_store_flush(a);
    assert_int_equal(kv_store_contains(b, k1, 1), 1);
    expect_hit(b, k1, 1, d1, 5000);
    assert_int_equal(kv_store_put(b, k2, 1, d2, 70000, HOUR), 0);
    kv_store_flush(b);
    expect_hit(a, k2, 1, d2, 70000);
    /* both write the same key at once: both fine, one good file */
    for (int r = 0; r < 20; r++) {
        mkkey(100 + r, k3);
        assert_int_equal(kv_store_put(a, k3, 1, d3, 30000, HOUR), 0);
        assert_int_equal(kv_store_put(b, k3, 1, d3, 30000, HOUR), 0);
    }
    kv_store_flush(a);
    kv_store_flush(b);
    kv_store_stats sa = stats(a), sb = stats(b);
    assert_int_equal(sa.written + sa.existing + sb.written + sb.existing, 2 + 40);
    assert_int_equal(sa.write_errors + sb.write_errors, 0);
    for (int r = 0; r < 20; r++) {
        mkkey(100 + r, k3);
        expect_hit(r % 2 ? a : b, k3, 1, d3, 30000);
    }
    kv_store_sweep(a);
    kv_store_sweep(b);
    assert_int_equal(stats(a).files, 22);
    assert_int_equal(stats(b).files, 22);
    assert_int_equal(stats(a).bytes, stats(b).bytes);
    assert_int_equal(stats(a).damaged + stats(b).damaged, 0);
    assert_int_equal(count_dir(dir), 1);
    char tmpd[512];
    snprintf(tmpd, sizeof tmpd, "%s/v1/tmp", dir);
    assert_int_equal(count_dir(tmpd), 0);
    kv_store_close(a);
    kv_store_close(b);
    free(d1), free(d2), free(d3);
    rm_rf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- damage */

/* a file for (key, kind) holding exactly these bytes must be a miss, counted
 * damaged once, and be gone afterwards */
static void expect_damaged(kv_store *s, const char *path, const uint8_t key[32], uint8_t kind, const uint8_t *f,
                           size_t n)
{
    uint64_t d0 = stats(s).damaged, m0 = stats(s).misses, e0 = stats(s).expired;
    spit(path, f, n);
    expect_miss(s, key, kind);
    kv_store_stats t = stats(s);
    assert_int_equal(t.damaged, d0 + 1);
    assert_int_equal(t.misses, m0 + 1);
    assert_int_equal(t.expired, e0);
    assert_false(exists(path));
}

static void test_truncated_and_extended(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    uint8_t k[32];
    mkkey(9, k);
    uint8_t *b = blob(5000, 9, 0);
    assert_int_equal(kv_store_put(s, k, 1, b, 5000, HOUR), 0);
    kv_store_flush(s);
    char p[512];
    fpath(dir, k, 1, p);
    size_t fn;
    uint8_t *good = slurp(p, &fn);
    assert_int_equal(fn, 5084);
    static const size_t cuts[] = {0, 1, 8, 79, 80, 83, 84, 2500, 5080, 5083};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        spit(p, good, cuts[i]);
        assert_int_equal(kv_store_contains(s, k, 1), 0); /* the header check sees the size */
        expect_damaged(s, p, k, 1, good, cuts[i]);
    }
    uint8_t *longer = malloc(fn + 1);
    memcpy(longer, good, fn);
    longer[fn] = 0;
    expect_damaged(s, p, k, 1, longer, fn + 1);
    /* the good bytes still read back */
    spit(p, good, fn);
    expect_hit(s, k, 1, b, 5000);
    assert_int_equal(stats(s).damaged, 11);
    kv_store_close(s);
    free(longer);
    free(good);
    free(b);
    rm_rf(dir);
    free(dir);
}

static void bit_flips(int level, int text)
{
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, level);
    uint8_t k[32];
    mkkey(11, k);
    size_t n = 20000;
    uint8_t *b = blob(n, 11, text);
    assert_int_equal(kv_store_put(s, k, 2, b, n, HOUR), 0);
    kv_store_flush(s);
    char p[512];
    fpath(dir, k, 2, p);
    size_t fn;
    uint8_t *good = slurp(p, &fn);
    assert_int_equal(good[13], level ? 1 : 0);
    uint8_t *f = malloc(fn);
    int tried = 0;
    for (size_t pos = 0; pos < fn; pos++) {
        /* every header and CRC byte, a sample of the payload */
        int sample = pos < 84 || pos >= fn - 4 || pos % 61 == 0 || pos == 84 || pos == fn - 5;
        if (!sample) continue;
        for (int bit = 0; bit < 8; bit++) {
            memcpy(f, good, fn);
            f[pos] ^= (uint8_t)(1u << bit);
            expect_damaged(s, p, k, 2, f, fn);
            tried++;
        }
    }
    assert_int_equal(stats(s).damaged, tried);
    assert_int_equal(stats(s).hits, 0);
    spit(p, good, fn);
    expect_hit(s, k, 2, b, n);
    kv_store_close(s);
    free(f);
    free(good);
    free(b);
    rm_rf(dir);
    free(dir);
}

static void test_bit_flips_raw(void **st)
{
    (void)st;
    bit_flips(0, 0);
}

static void test_bit_flips_compressed(void **st)
{
    (void)st;
    bit_flips(5, 1);
}

/* well-sealed files (correct CRC) that are still not ours to return */
static void test_foreign_and_wrong_key(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 3);
    uint8_t k1[32], k2[32];
    mkkey(21, k1), mkkey(22, k2);
    uint8_t *b1 = blob(3000, 21, 1), *b2 = blob(3000, 22, 1);
    assert_int_equal(kv_store_put(s, k1, 1, b1, 3000, HOUR), 0);
    assert_int_equal(kv_store_put(s, k2, 1, b2, 3000, HOUR), 0);
    kv_store_flush(s);
    char p1[512], p2[512], p1k2[512];
    fpath(dir, k1, 1, p1);
    fpath(dir, k2, 1, p2);
    fpath(dir, k1, 2, p1k2);
    size_t fn;
    uint8_t *good = slurp(p1, &fn);
    assert_int_equal(good[13], 1);
    uint8_t *f = malloc(fn);

    struct { size_t off; uint8_t val; } edits[] = {
        {8, 2},      /* format version 2 */
        {8, 0},      /* version 0 */
        {0, 'X'},    /* magic */
        {13, 3},     /* unknown flag bit */
        {13, 0},     /* says raw, is zstd: lengths disagree */
        {14, 1},     /* reserved */
        {52, 1},     /* reserved */
        {12, 2},     /* kind 2 in a .1 file */
        {16, 0xEE},  /* key */
        {64, 0x01},  /* raw length off by a little */
        {72, 0x01},  /* stored length */
        {84, 0x00},  /* the zstd frame itself (its magic) */
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(f, good, fn);
        if (f[edits[i].off] == edits[i].val) edits[i].val ^= 0x80;
        f[edits[i].off] = edits[i].val;
        reseal(f, fn);
        expect_damaged(s, p1, k1, 1, f, fn);
    }
    /* a zstd frame of the right size but a different declared content size */
    memcpy(f, good, fn);
    uint64_t raw = le64(f + 64) - 1;
    for (int i = 0; i < 8; i++) f[64 + i] = (uint8_t)(raw >> (8 * i));
    reseal(f, fn);
    expect_damaged(s, p1, k1, 1, f, fn);

    /* k1's file under k2's name, and under kind 2: a miss, removed */
    spit(p1, good, fn);
    assert_int_equal(rename(p1, p2), 0);
    expect_miss(s, k2, 1);
    assert_false(exists(p2));
    expect_miss(s, k1, 1); /* moved away: a plain miss */
    spit(p1k2, good, fn);
    expect_miss(s, k1, 2);
    assert_false(exists(p1k2));
    kv_store_stats t = stats(s);
    assert_int_equal(t.damaged, sizeof edits / sizeof edits[0] + 1 + 2);
    assert_int_equal(t.hits, 0);

    spit(p1, good, fn);
    expect_hit(s, k1, 1, b1, 3000);
    kv_store_close(s);
    free(f);
    free(good);
    free(b1), free(b2);
    rm_rf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- time and space */

static void test_expiry(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    uint8_t k1[32], k2[32], k3[32], k4[32];
    mkkey(31, k1), mkkey(32, k2), mkkey(33, k3), mkkey(34, k4);
    uint8_t *b = blob(2000, 31, 0);
    /* window states with a TTL of 30 s, aged past it by set_age below: with
     * 1 s they were already expired 1-2 s after the write (whole seconds), a
     * stall a loaded ASan run can take before "fresh: all there" */
    assert_int_equal(kv_store_put(s, k1, 2, b, 2000, 30), 0);       /* a window state, 30 s */
    assert_int_equal(kv_store_put(s, k2, 1, b, 2000, 0), 0);        /* never */
    assert_int_equal(kv_store_put(s, k3, 1, b, 2000, 72 * HOUR), 0);
    assert_int_equal(kv_store_put(s, k4, 2, b, 2000, 30), 0);
    kv_store_flush(s);
    char p1[512], p2[512], p3[512], p4[512];
    fpath(dir, k1, 2, p1), fpath(dir, k2, 1, p2), fpath(dir, k3, 1, p3), fpath(dir, k4, 2, p4);

    /* fresh: all there */
    for (int i = 0; i < 2; i++) assert_int_equal(kv_store_contains(s, i ? k4 : k1, 2), 1);
    set_age(p1, 100);
    set_age(p2, 10 * 365 * 24 * 3600);
    set_age(p3, 71 * 3600);
    assert_int_equal(kv_store_contains(s, k1, 2), 0);
    assert_int_equal(kv_store_contains(s, k3, 1), 1);
    expect_miss(s, k1, 2);
    assert_false(exists(p1));
    kv_store_stats t = stats(s);
    assert_int_equal(t.expired, 1);
    assert_int_equal(t.damaged, 0);
    assert_int_equal(t.files, 3);
    expect_hit(s, k2, 1, b, 2000);
    /* a hit moves mtime to now: 71 h old becomes fresh, TTL counts from last use */
    expect_hit(s, k3, 1, b, 2000);
    assert_true(fmtime(p3) >= time(NULL) - 5);
    assert_true(fmtime(p2) >= time(NULL) - 5);
    /* contains does not refresh */
    set_age(p3, 1000);
    assert_int_equal(kv_store_contains(s, k3, 1), 1);
    assert_true(fmtime(p3) <= time(NULL) - 999);

    /* the sweep deletes expired files too */
    set_age(p4, 100);
    kv_store_sweep(s);
    assert_false(exists(p4));
    t = stats(s);
    assert_int_equal(t.expired, 2);
    assert_int_equal(t.files, 2);
    assert_int_equal(t.bytes, 2 * 2084);
    assert_true(exists(p2) && exists(p3));
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

static void test_capacity_lru(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    enum { N = 10, SZ = 10000, F = SZ + 84 };
    uint8_t keys[N][32];
    char paths[N][512];
    uint8_t *b = blob(SZ, 41, 0);
    kv_store *a = open_store(dir, 0, 0);
    for (int i = 0; i < N; i++) {
        mkkey(40 + i, keys[i]);
        fpath(dir, keys[i], 1, paths[i]);
        assert_int_equal(kv_store_put(a, keys[i], 1, b, SZ, 0), 0);
    }
    kv_store_flush(a);
    /* ages: file i last used at t0 + rank[i] (a shuffled order) */
    static const int rank[N] = {5, 0, 8, 3, 9, 1, 7, 2, 6, 4};
    time_t t0 = time(NULL) - 10000;
    for (int i = 0; i < N; i++) set_mtime_abs(paths[i], t0 + rank[i]);
    /* using the oldest (i=1, rank 0) makes it the newest */
    expect_hit(a, keys[1], 1, b, SZ);
    kv_store_close(a);

    /* cap 7.5 files: above it, evict down to 90% = 6.75 files -> 6 remain;
     * the 4 least recently used go: ranks 1, 2, 3, 4 (i = 5, 7, 3, 9) */
    uint64_t cap = (uint64_t)F * 15 / 2;
    kv_store *s = open_store(dir, cap, 0);
    kv_store_stats t = stats(s);
    assert_int_equal(t.evicted, 4);
    assert_int_equal(t.files, 6);
    assert_int_equal(t.bytes, 6 * (uint64_t)F);
    static const int gone[N] = {0, 0, 0, 1, 0, 1, 0, 1, 0, 1};
    for (int i = 0; i < N; i++) assert_int_equal(exists(paths[i]), !gone[i]);
    /* under cap now: another sweep deletes nothing */
    kv_store_sweep(s);
    assert_int_equal(stats(s).evicted, 4);
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

static int wait_for(kv_store *s, int (*ok)(const kv_store_stats *), int ms)
{
    for (int waited = 0; waited < ms; waited += 5) {
        kv_store_stats t = stats(s);
        if (ok(&t)) return 1;
        usleep(5000);
    }
    return 0;
}

static int one_expired(const kv_store_stats *t) { return t->expired == 1; }
/* under cap (7 files of 10084 bytes or fewer), every file written so far
 * (sweep_written) either counted or accounted as evicted: no sweep pending */
enum { SWEEP_F = 10084 };
static uint64_t sweep_written;
static int under_cap(const kv_store_stats *t)
{
    return t->files <= 7 && t->evicted + t->files == sweep_written && t->bytes == t->files * (uint64_t)SWEEP_F;
}

static void test_background_sweeper(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    uint8_t k[32];
    mkkey(50, k);
    uint8_t *b = blob(10000, 50, 0);
    char p[512];
    fpath(dir, k, 2, p);

    /* the timer: a 20 ms period finds an expired file without being asked */
    kv_store_cfg c = {.dir = dir, .sweep_interval_ms = 20};
    kv_store *s = NULL;
    assert_int_equal(kv_store_open(&c, &s, NULL), 0);
    assert_int_equal(kv_store_put(s, k, 2, b, 10000, 30), 0); /* 30 s: the sweeper cannot expire it before set_age */
    kv_store_flush(s);
    set_age(p, 100);
    assert_true(wait_for(s, one_expired, 10000));
    assert_false(exists(p));
    kv_store_close(s);

    /* the kick: a write that takes bytes above cap wakes a sweeper whose
     * period is an hour; a sweep evicts down to 6.75 files of a cap of 7.5.
     * Each write waits for the sweep it kicked (if any) to finish before the
     * next one, so no write lands during a sweep's walk: whether a sweep came
     * after the 9th or the 10th write was up to the scheduler, and a write
     * racing the walk can leave files/bytes off by one file (sweep_run's
     * atomic_store of its totals vs the writer's inc).  So: the 8th write
     * kicks (8 > 7.5) -> 6 left, the 9th makes 7 (under cap, no kick), the
     * 10th kicks again -> 6 left, the four least recently used (0-3) gone. */
    enum { F = SWEEP_F };
    c = (kv_store_cfg){.dir = dir, .cap_bytes = (uint64_t)F * 15 / 2, .sweep_interval_ms = FOREVER_MS};
    assert_int_equal(kv_store_open(&c, &s, NULL), 0);
    char sp[10][512];
    for (int i = 0; i < 10; i++) {
        mkkey(60 + i, k);
        assert_int_equal(kv_store_put(s, k, 1, b, 10000, 0), 0);
        kv_store_flush(s); /* one at a time, so the mtimes order them */
        fpath(dir, k, 1, sp[i]);
        set_mtime_abs(sp[i], time(NULL) - 1000 + i);
        sweep_written = (uint64_t)i + 1;
        assert_true(wait_for(s, under_cap, 10000));
        assert_int_equal(stats(s).evicted, i < 7 ? 0 : i < 9 ? 2 : 4);
    }
    uint64_t left = stats(s).files;
    assert_int_equal(left, 6);
    for (int i = 0; i < 10; i++) assert_int_equal(exists(sp[i]), i >= 4);
    kv_store_close(s);
    s = open_store(dir, 0, 0);
    assert_int_equal(stats(s).files, left);
    assert_int_equal(stats(s).bytes, left * F);
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

/* A sweep's count vs this process's writes and deletes landing in the middle
 * of its walk.  store.c calls kv_store_test_walk_hook (a test-only hook, NULL
 * otherwise) before judging each file; at the hook_at-th call the hook writes
 * a new file into each of the 256 fan-out directories (some already walked,
 * some not, one being walked), rewrites files with another size (a longer
 * TTL forces it) and has get delete expired ones, then flushes.  Whatever the
 * walk had or had not seen, the totals after the sweep must equal what is on
 * disk (a sweep that simply stored its own count lost the writes into
 * directories already walked and kept the deletes there).  64 files, two in
 * each of 32 directories, so that calls 2j+1 and 2j+2 are one directory's
 * first and second file (names sorted): hook_at picks where the walk stands. */
extern void (*kv_store_test_walk_hook)(void);

enum { RW_N = 64 };
static struct {
    kv_store *s;
    const char *dir;
    int armed, calls, at, fired;
    uint8_t *b;
} rw;

static void rw_key(int i, uint8_t k[32])
{
    mkkey(3000 + (uint32_t)i, k);
    k[0] = (uint8_t)(i / 2 * 8); /* two files in each of 32 fan-out directories */
}

static void rw_hook(void)
{
    if (!rw.armed || ++rw.calls != rw.at) return;
    rw.fired = 1;
    uint8_t k[32];
    char p[512];
    for (int hh = 0; hh < 256; hh++) {
        mkkey(5000 + (uint32_t)hh, k);
        k[0] = (uint8_t)hh;
        assert_int_equal(kv_store_put(rw.s, k, 1, rw.b, 500 + (size_t)hh, HOUR), 0);
    }
    for (int i = 0; i < RW_N; i++) {
        rw_key(i, k);
        if (i % 4 < 2) { /* both files of every other directory: rewritten bigger */
            assert_int_equal(kv_store_put(rw.s, k, 1, rw.b, 3000 + 16 * (size_t)i, 2 * HOUR), 0);
        } else if (i % 4 == 3) { /* one file of the others: expired, get deletes it */
            fpath(rw.dir, k, 1, p);
            set_age(p, 100);
            expect_miss(rw.s, k, 1);
            assert_false(exists(p));
        }
    }
    kv_store_flush(rw.s);
}

/* fn(path, ctx) for each file under dir/v1/xx/ (names not starting with '.'); -1 when dir/v1 or a directory in it
 * cannot be opened (what it saw of the rest is still walked) */
static int walk_final(const char *dir, void (*fn)(const char *path, void *ctx), void *ctx)
{
    char v1[512];
    if (snprintf(v1, sizeof v1, "%s/v1", dir) >= (int)sizeof v1) return -1;
    DIR *d = opendir(v1);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strlen(e->d_name) != 2 || e->d_name[0] == '.') continue;
        char sub[600];
        DIR *x = snprintf(sub, sizeof sub, "%s/%s", v1, e->d_name) < (int)sizeof sub ? opendir(sub) : NULL;
        if (!x) {
            rc = -1;
            continue;
        }
        struct dirent *f;
        while ((f = readdir(x))) {
            char fp[900];
            if (f->d_name[0] != '.' && snprintf(fp, sizeof fp, "%s/%s", sub, f->d_name) < (int)sizeof fp) fn(fp, ctx);
        }
        closedir(x);
    }
    closedir(d);
    return rc;
}

static void add_file(const char *path, void *ctx)
{
    uint64_t *fb = ctx; /* files, bytes */
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    fb[0]++, fb[1] += (uint64_t)st.st_size;
}

/* files and bytes of the final files on disk */
static void disk_totals(const char *dir, uint64_t *files, uint64_t *bytes)
{
    uint64_t fb[2] = {0, 0};
    assert_int_equal(walk_final(dir, add_file, fb), 0);
    *files = fb[0], *bytes = fb[1];
}

static void test_sweep_races_writes(void **st)
{
    (void)st;
    static const int ats[] = {1, 2, 3, 33, 34, 35, 36, 63, 64};
    rw.b = blob(4096, 77, 0);
    kv_store_test_walk_hook = rw_hook; /* before open: the store's threads see it from their start */
    for (size_t t = 0; t < sizeof ats / sizeof *ats; t++) {
        char *dir = mkdir_tmp();
        kv_store *s = open_store(dir, 0, 0);
        uint8_t k[32];
        for (int i = 0; i < RW_N; i++) {
            rw_key(i, k);
            assert_int_equal(kv_store_put(s, k, 1, rw.b, 1000 + 16 * (size_t)i, i % 4 == 3 ? 30 : HOUR), 0);
        }
        kv_store_flush(s);
        rw.s = s, rw.dir = dir, rw.calls = 0, rw.at = ats[t], rw.fired = 0, rw.armed = 1;
        kv_store_sweep(s);
        rw.armed = 0;
        assert_true(rw.fired);
        uint64_t files, bytes;
        disk_totals(dir, &files, &bytes);
        assert_int_equal(files, RW_N - RW_N / 4 + 256);
        kv_store_stats t1 = stats(s);
        if (t1.files != files || t1.bytes != bytes)
            print_error("hook at %d: stats %llu files %llu bytes, disk %llu files %llu bytes\n", ats[t],
                        (unsigned long long)t1.files, (unsigned long long)t1.bytes, (unsigned long long)files,
                        (unsigned long long)bytes);
        assert_int_equal(t1.files, files);
        assert_int_equal(t1.bytes, bytes);
        assert_int_equal(t1.expired, RW_N / 4);
        assert_int_equal(t1.written, RW_N + 256 + RW_N / 2);
        /* and a sweep with nothing racing it agrees */
        kv_store_sweep(s);
        assert_int_equal(stats(s).files, files);
        assert_int_equal(stats(s).bytes, bytes);
        kv_store_close(s);
        rm_rf(dir);
        free(dir);
    }
    kv_store_test_walk_hook = NULL;
    free(rw.b);
}

static void test_queue_limit(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store_cfg c = {.dir = dir, .max_queue_bytes = 1000, .sweep_interval_ms = FOREVER_MS};
    kv_store *s = NULL;
    assert_int_equal(kv_store_open(&c, &s, NULL), 0);
    uint8_t k[32];
    mkkey(70, k);
    uint8_t *b = blob(2000, 70, 0);
    assert_int_equal(kv_store_put(s, k, 1, b, 1001, HOUR), KV_STORE_EBUSY);
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, HOUR), 0);
    kv_store_flush(s);
    kv_store_stats t = stats(s);
    assert_int_equal(t.dropped, 1);
    assert_int_equal(t.puts, 1);
    assert_int_equal(t.put_bytes, 1000);
    assert_int_equal(t.written, 1);
    expect_hit(s, k, 1, b, 1000);
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- faults */

/* In a child: a 64 KiB file size limit with SIGXFSZ ignored makes write()
 * fail with EFBIG part way through a 1 MiB file - the real failure path of a
 * full disk.  Exit code 0 or the number of the failed check. */
static int disk_full_child(const char *dir)
{
    struct rlimit rl = {65536, 65536};
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 1;
    kv_store_cfg c = {.dir = dir, .sweep_interval_ms = FOREVER_MS};
    kv_store *s = NULL;
    if (kv_store_open(&c, &s, NULL) != 0) return 2;
    uint8_t big[32], small[32];
    mkkey(80, big), mkkey(81, small);
    size_t nb = 1 << 20;
    uint8_t *b = malloc(nb);
    fill_rand(b, nb, 80);
    if (kv_store_put(s, big, 1, b, nb, HOUR) != 0) return 3;
    if (kv_store_put(s, small, 1, b, 1000, HOUR) != 0) return 4;
    kv_store_flush(s);
    kv_store_stats t;
    kv_store_get_stats(s, &t);
    if (t.write_errors != 1) return 5;
    if (t.written != 1) return 6;
    if (t.files != 1 || t.bytes != 1084) return 7;
    char p[512];
    fpath(dir, big, 1, p);
    if (exists(p)) return 8;
    snprintf(p, sizeof p, "%s/v1/tmp", dir);
    if (count_dir(p) != 0) return 9; /* the partial temp file was removed */
    void *d;
    size_t n;
    if (kv_store_get(s, big, 1, &d, &n) != KV_STORE_ENOENT) return 10;
    if (kv_store_get(s, small, 1, &d, &n) != 0 || n != 1000 || memcmp(d, b, 1000)) return 11;
    free(d);
    kv_store_close(s);
    free(b);
    return 0;
}

static void test_disk_full(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(disk_full_child(dir));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* seen from here too: no final file for the big blob, no temp file */
    uint8_t big[32];
    mkkey(80, big);
    char p[512];
    fpath(dir, big, 1, p);
    assert_false(exists(p));
    snprintf(p, sizeof p, "%s/v1/tmp", dir);
    assert_int_equal(count_dir(p), 0);
    rm_rf(dir);
    free(dir);
}

static void test_dir_removed_or_replaced(void **st)
{
    (void)st;
    for (int replace = 0; replace < 2; replace++) {
        char *dir = mkdir_tmp();
        kv_store *s = open_store(dir, 1 << 20, 1);
        uint8_t k1[32], k2[32];
        mkkey(90, k1), mkkey(91, k2);
        uint8_t *b = blob(4000, 90, 1);
        assert_int_equal(kv_store_put(s, k1, 1, b, 4000, HOUR), 0);
        kv_store_flush(s);
        expect_hit(s, k1, 1, b, 4000);

        rm_rf(dir);
        if (replace) spit(dir, "not a directory\n", 16);

        expect_miss(s, k1, 1);
        assert_int_equal(kv_store_contains(s, k1, 1), 0);
        assert_int_equal(kv_store_put(s, k2, 1, b, 4000, HOUR), 0); /* queued... */
        kv_store_flush(s);
        kv_store_sweep(s);
        kv_store_stats t = stats(s);
        assert_int_equal(t.write_errors, 1); /* ...and failed */
        assert_int_equal(t.written, 1);
        assert_int_equal(t.damaged, 0);
        assert_int_equal(t.misses, 1);
        assert_int_equal(t.files, 0);
        assert_int_equal(t.bytes, 0);
        expect_miss(s, k2, 1);
        /* the store never recreates its root (a vanished mount stays vanished) */
        struct stat sd;
        if (replace) {
            assert_int_equal(lstat(dir, &sd), 0);
            assert_true(S_ISREG(sd.st_mode));
            assert_int_equal(sd.st_size, 16);
        } else {
            assert_int_equal(lstat(dir, &sd), -1);
        }
        kv_store_close(s);
        free(b);
        rm_rf(dir);
        free(dir);
    }
}

static void test_stale_temps_and_foreign_files(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    uint8_t k[32];
    mkkey(95, k);
    uint8_t *b = blob(1000, 95, 0);
    assert_int_equal(kv_store_put(s, k, 1, b, 1000, HOUR), 0);
    kv_store_close(s);

    char stale[512], fresh[512], notmp[512], foreign[512], garbage[512], good[512], oddkind[600], upper[512];
    snprintf(stale, 512, "%s/v1/tmp/4242-4243-00000000deadbeef-1.tmp", dir);
    snprintf(fresh, 512, "%s/v1/tmp/4242-4243-00000000deadbeef-2.tmp", dir);
    snprintf(notmp, 512, "%s/v1/tmp/README", dir);
    fpath(dir, k, 1, good);
    /* next to a good file: a foreign file, a file named like ours with garbage
     * in it, names that are almost ours */
    snprintf(foreign, 512, "%.*s/notes.txt", (int)(strrchr(good, '/') - good), good);
    fpath(dir, k, 7, garbage);
    snprintf(oddkind, sizeof oddkind, "%s.bak", good);
    snprintf(upper, 512, "%s", good);
    for (char *c = strrchr(upper, '/') + 1; *c; c++)
        if (*c >= 'a' && *c <= 'f') *c = (char)(*c - 32);
    assert_string_not_equal(upper, good);
    spit(stale, "half", 4), spit(fresh, "half", 4), spit(notmp, "keep", 4), spit(foreign, "keep", 4);
    spit(garbage, "this is not a store file", 24), spit(oddkind, "keep", 4), spit(upper, "keep", 4);
    /* a FIFO under a name of ours: the sweep must neither block opening it
     * nor delete it */
    char fifo[512];
    fpath(dir, k, 9, fifo);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    set_age(stale, 11 * 60);
    set_age(fresh, 9 * 60);
    set_age(notmp, 3600);
    set_age(foreign, 100 * 24 * 3600);

    s = open_store(dir, 0, 0);
    assert_false(exists(stale));
    assert_true(exists(fresh));
    assert_true(exists(notmp));
    assert_true(exists(foreign));
    assert_true(exists(oddkind));
    assert_true(exists(upper));
    assert_false(exists(garbage));
    kv_store_stats t = stats(s);
    assert_int_equal(t.damaged, 1);
    assert_int_equal(t.files, 1);
    assert_int_equal(t.bytes, 1084);
    expect_hit(s, k, 1, b, 1000);
    /* and the sweeper, later */
    set_age(fresh, 11 * 60);
    kv_store_sweep(s);
    assert_false(exists(fresh));
    assert_true(exists(notmp) && exists(foreign) && exists(oddkind) && exists(upper) && exists(fifo));
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

/* A FIFO at the very path of a key (planted on a shared mount, by mistake or
 * not): get and contains must miss at once and leave it alone, and a put of
 * that key must not hang the writer (its check for an existing file opens the
 * path too).  Each call runs in a thread with a 5 s deadline, so a regression
 * fails instead of hanging the suite: past the deadline the test releases the
 * blocked open by opening the FIFO for writing, then joins. */
typedef struct {
    kv_store *s;
    const uint8_t *key;
    const uint8_t *b;
    int step; /* 0 get, 1 contains, 2 put + flush */
    int rc;
    void *d;
    size_t n;
    atomic_int done;
} fifo_call;

static void *fifo_call_main(void *arg)
{
    fifo_call *c = arg;
    if (c->step == 0) c->rc = kv_store_get(c->s, c->key, 1, &c->d, &c->n);
    else if (c->step == 1) c->rc = kv_store_contains(c->s, c->key, 1);
    else if ((c->rc = kv_store_put(c->s, c->key, 1, c->b, 1000, HOUR)) == 0) kv_store_flush(c->s);
    atomic_store(&c->done, 1);
    return NULL;
}

/* 1 if the call finished within 5 s */
static int fifo_call_run(fifo_call *c, const char *fifo)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fifo_call_main, c), 0);
    int ok = 0;
    for (int i = 0; i < 500 && !(ok = atomic_load(&c->done)); i++) usleep(10000);
    while (!atomic_load(&c->done)) {
        /* a writer's open wakes a reader blocked opening the FIFO */
        int w = open(fifo, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (w >= 0) close(w);
        usleep(10000);
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    return ok;
}

static void test_fifo_at_key_path(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *s = open_store(dir, 0, 0);
    uint8_t k[32];
    mkkey(97, k);
    uint8_t *b = blob(1000, 97, 0);
    char fifo[512], sub[512];
    fpath(dir, k, 1, fifo);
    snprintf(sub, sizeof sub, "%.*s", (int)(strrchr(fifo, '/') - fifo), fifo);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(mkfifo(fifo, 0644), 0);

    fifo_call get = {.s = s, .key = k, .step = 0, .d = (void *)1, .n = 12345};
    fifo_call has = {.s = s, .key = k, .step = 1, .rc = -1};
    fifo_call put = {.s = s, .key = k, .b = b, .step = 2, .rc = -1};
    int get_ok = fifo_call_run(&get, fifo);
    int has_ok = fifo_call_run(&has, fifo);
    struct stat sf;
    assert_int_equal(lstat(fifo, &sf), 0);
    int left_alone = S_ISFIFO(sf.st_mode);
    kv_store_stats t = stats(s);
    int put_ok = fifo_call_run(&put, fifo);
    if (!get_ok || !has_ok || !put_ok)
        fail_msg("blocked on a FIFO at the key's path:%s%s%s", get_ok ? "" : " get", has_ok ? "" : " contains",
                 put_ok ? "" : " put (writer)");

    assert_int_equal(get.rc, KV_STORE_ENOENT);
    assert_null(get.d);
    assert_int_equal(get.n, 0);
    assert_int_equal(has.rc, 0);
    assert_true(left_alone); /* not ours: neither blamed nor unlinked */
    assert_int_equal(t.misses, 1);
    assert_int_equal(t.hits, 0);
    assert_int_equal(t.damaged, 0);
    assert_int_equal(t.files, 0);

    /* the put renamed a real file over the FIFO */
    assert_int_equal(put.rc, 0);
    t = stats(s);
    assert_int_equal(t.written, 1);
    assert_int_equal(t.existing, 0);
    assert_int_equal(t.write_errors, 0);
    assert_int_equal(t.files, 1);
    assert_int_equal(lstat(fifo, &sf), 0);
    assert_true(S_ISREG(sf.st_mode));
    expect_hit(s, k, 1, b, 1000);
    assert_int_equal(kv_store_contains(s, k, 1), 1);
    kv_store_close(s);
    free(b);
    rm_rf(dir);
    free(dir);
}

/* A child writes big blobs as fast as it can; it is killed with SIGKILL.
 * Every final file it left must read back exactly; only temp files may be
 * incomplete, and a sweep removes them once stale. */
enum { KILL_BLOB = 384 * 1024 };

static uint8_t *kill_blob(uint32_t i)
{
    uint8_t *p = malloc(KILL_BLOB);
    fill_text(p, KILL_BLOB, i); /* compressible: the writer spends time in zstd too */
    fill_rand(p, KILL_BLOB / 3, i);
    return p;
}

static void count_one(const char *path, void *ctx)
{
    (void)path;
    (*(int *)ctx)++;
}

static int count_final(const char *dir)
{
    int c = 0;
    (void)walk_final(dir, count_one, &c); /* absent yet: 0 */
    return c;
}

static void test_kill9_mid_write(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kv_store_cfg c = {.dir = dir, .compress = 1, .sweep_interval_ms = FOREVER_MS};
        kv_store *s = NULL;
        if (kv_store_open(&c, &s, NULL) != 0) _exit(1);
        for (uint32_t i = 0;; i++) {
            uint8_t k[32];
            mkkey(i, k);
            uint8_t *p = kill_blob(i);
            while (kv_store_put(s, k, 1, p, KILL_BLOB, 0) == KV_STORE_EBUSY) usleep(1000);
            free(p);
        }
    }
    int n = 0;
    for (int waited = 0; waited < 30000 && (n = count_final(dir)) < 40; waited += 2) usleep(2000);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    n = count_final(dir);
    assert_true(n >= 40);

    kv_store *s = open_store(dir, 0, 0);
    kv_store_stats t = stats(s);
    assert_int_equal(t.damaged, 0);
    assert_int_equal(t.files, n);
    /* every final file holds exactly what its key says */
    int checked = 0;
    for (uint32_t i = 0; i < 100000 && checked < n; i++) {
        uint8_t k[32];
        mkkey(i, k);
        char p[512];
        fpath(dir, k, 1, p);
        if (!exists(p)) continue;
        uint8_t *want = kill_blob(i);
        expect_hit(s, k, 1, want, KILL_BLOB);
        free(want);
        checked++;
    }
    assert_int_equal(checked, n);
    assert_int_equal(stats(s).damaged, 0);
    /* whatever temp files it left go once stale */
    char tmpd[512];
    snprintf(tmpd, sizeof tmpd, "%s/v1/tmp", dir);
    DIR *d = opendir(tmpd);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", tmpd, e->d_name);
        set_age(p, 3600);
    }
    closedir(d);
    kv_store_sweep(s);
    assert_int_equal(count_dir(tmpd), 0);
    assert_int_equal(count_final(dir), n);
    kv_store_close(s);
    rm_rf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- concurrency */

enum { CR_N = 300 };

static size_t cr_size(int i) { return 1 + (size_t)(i * 2654435761u % 65536); }

typedef struct {
    kv_store *s;
    atomic_int done; /* the writer has flushed */
    long hits, misses, bad;
} hammer;

static void *hammer_main(void *arg)
{
    hammer *h = arg;
    uint64_t x = 12345;
    uint8_t *want = malloc(65536);
    int final_pass = -1;
    for (;;) {
        if (final_pass < 0 && atomic_load(&h->done)) final_pass = 0;
        int i = final_pass >= 0 ? final_pass++ : (int)(splitmix(&x) % CR_N);
        if (final_pass > CR_N) break;
        if (i >= CR_N) continue;
        uint8_t k[32];
        mkkey(i, k);
        void *d = NULL;
        size_t n = 0;
        int rc = kv_store_get(h->s, k, 1, &d, &n);
        if (rc == KV_STORE_ENOENT) {
            h->misses++;
            if (final_pass >= 0) h->bad++; /* after the flush every key is there */
            continue;
        }
        size_t sz = cr_size(i);
        fill_text(want, sz, i);
        fill_rand(want, sz / 2, i);
        if (rc != 0 || n != sz || memcmp(d, want, sz) != 0) h->bad++;
        else h->hits++;
        free(d);
    }
    free(want);
    return NULL;
}

static void test_concurrent_reader(void **st)
{
    (void)st;
    char *dir = mkdir_tmp();
    kv_store *w = open_store(dir, 0, 1);
    hammer h = {.s = open_store(dir, 0, 0)}; /* another instance: as another process would */
    atomic_init(&h.done, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hammer_main, &h), 0);
    uint8_t *b = malloc(65536);
    /* each key twice, the second time with a longer TTL: the file is
     * replaced under the reader's feet by rename */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < CR_N; i++) {
            uint8_t k[32];
            mkkey(i, k);
            size_t sz = cr_size(i);
            fill_text(b, sz, i);
            fill_rand(b, sz / 2, i);
            assert_int_equal(kv_store_put(w, k, 1, b, sz, round ? 2 * HOUR : HOUR), 0);
        }
    kv_store_flush(w);
    atomic_store(&h.done, 1);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(h.bad, 0);
    assert_true(h.hits >= CR_N);
    kv_store_stats tw = stats(w), tr = stats(h.s);
    assert_int_equal(tw.written, 2 * CR_N);
    assert_int_equal(tw.write_errors + tw.dropped, 0);
    assert_int_equal(tr.damaged, 0);
    assert_int_equal(tr.hits, h.hits);
    assert_int_equal(tr.misses, h.misses);
    kv_store_close(h.s);
    kv_store_close(w);
    free(b);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_raw),
        cmocka_unit_test(test_round_trip_compressed),
        cmocka_unit_test(test_duplicate_put),
        cmocka_unit_test(test_restart_recovery),
        cmocka_unit_test(test_two_instances),
        cmocka_unit_test(test_truncated_and_extended),
        cmocka_unit_test(test_bit_flips_raw),
        cmocka_unit_test(test_bit_flips_compressed),
        cmocka_unit_test(test_foreign_and_wrong_key),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_capacity_lru),
        cmocka_unit_test(test_background_sweeper),
        cmocka_unit_test(test_sweep_races_writes),
        cmocka_unit_test(test_queue_limit),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_dir_removed_or_replaced),
        cmocka_unit_test(test_stale_temps_and_foreign_files),
        cmocka_unit_test(test_fifo_at_key_path),
        cmocka_unit_test(test_kill9_mid_write),
        cmocka_unit_test(test_concurrent_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
