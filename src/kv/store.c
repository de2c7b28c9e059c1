/* store.c - the disk tier of the KV cache (store.h has the API, the layout
 * and the file format).
 *
 * The idea: every blob is one immutable file, written whole to v1/tmp/ and
 * rename()d into v1/<hh>/<hex>.<kind>.  rename is atomic on POSIX file systems
 * (NFS included, per server), so a reader in any process opens either a
 * complete file or none; two writers of the same key race harmlessly (equal
 * content, last rename wins).  A kill -9 leaves at most a temp file, which a
 * sweep deletes after 10 minutes.  Nothing else is trusted: every read checks
 * the whole file (header, lengths, key, CRC32C, zstd length) and treats any
 * failure as a miss that also unlinks the file.
 *
 * Threads.  The caller (the engine thread) only copies a blob into the queue
 * (s->mu guards the queue, q_bytes, busy, stop and kick); one writer thread
 * compresses and writes; one sweeper thread walks the tree every
 * sweep_interval_ms, or sooner when the writer sees bytes above cap.  Sweeps
 * (background or kv_store_sweep) are serialized by s->sweep_mu.  Counters are
 * relaxed atomics.  get/contains run in the caller's thread and take no lock,
 * except acct_mu around a get's unlink of a bad or expired file.  Lock order:
 * sweep_mu, then acct_mu, then mu (kick_sweeper is never called holding
 * acct_mu).
 *
 * Totals.  files/bytes are this process's view: a sweep counts the tree,
 * and this process's own writes (rename into place) and deletes (get of a bad
 * or expired file) adjust them in between.  So that a sweep's count is exact
 * whatever the writer does meanwhile, every such change and the sweep's own
 * look at a file are made under s->acct_mu (a few syscalls each, never the
 * whole walk).  The walk lists one fan-out directory at a time under the lock
 * (names sorted), then judges the names one by one, each under the lock.  A
 * change made during the walk goes into a per-directory delta (wd_*) unless
 * the walk is still to judge that name (it will see the change itself); a
 * directory's delta is cleared when its listing is taken.  The sweep stores
 * its count plus all deltas, so a write or delete is counted exactly once
 * (a directory made after the root was listed keeps its delta).  While a
 * sweep runs, a writer leaves the "above cap" kick to it: it re-checks the
 * exact total at its end, so writes during a sweep cost no second sweep
 * unless they really leave the store above cap.
 *
 * Deletes are "unlink this path if it is still the inode we judged": another
 * process may have renamed a fresh file over a damaged one in between, and a
 * good file should not pay for a bad one (the window left is a few syscalls,
 * and losing a cache file is harmless).
 *
 * Not here: which blobs to store, their encoding (the engine and
 * md_seq_snapshot decide), the host-RAM tier, or locking across processes
 * (none is needed: files are immutable, and each process sweeps alone - two
 * sweepers deleting the same expired file both get what they want). */
#define _GNU_SOURCE
#include "kv/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

#include "base/crc32c.h"
#include "base/le.h"

#define STORE_MAGIC "DIKVSTR1"
#define FLAG_ZSTD 1u
#define TMP_STALE_S 600 /* a temp file this old was left by a dead writer */
#define TRAILER 4       /* the CRC32C after the payload */

typedef struct item {
    struct item *next;
    uint8_t key[32];
    uint8_t kind;
    uint32_t ttl;
    size_t n;     /* raw bytes, at buf + KV_STORE_HDR_BYTES */
    uint8_t *buf; /* header room + blob + trailer room, so a raw file is written without a copy */
} item;

typedef struct {
    uint8_t kind, flags;
    uint32_t ttl;
    uint64_t created, raw, stored;
} hdr;

/* a name in the fan-out directory being walked */
typedef struct {
    uint8_t key[32];
    uint8_t kind;
} sweep_name;

/* one file seen by a sweep, kept for capacity eviction */
typedef struct {
    int64_t mt_s, mt_ns;
    uint64_t size;
    dev_t dev;
    ino_t ino;
    uint8_t key[32];
    uint8_t kind;
} sweep_ent;

struct kv_store {
    char root[PATH_MAX]; /* <dir>/v1 */
    char tmp[PATH_MAX];  /* <dir>/v1/tmp */
    uint64_t cap;
    int level, interval_ms, fsync;
    size_t max_q;
    uint64_t nonce;

    /* mu guards: head, tail, q_bytes, busy, stop, kick */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;  /* writer: queue not empty or stop */
    pthread_cond_t idle_cv;  /* flush: queue empty and writer idle */
    pthread_cond_t sweep_cv; /* sweeper: stop or kick (CLOCK_MONOTONIC) */
    item *head, *tail;
    size_t q_bytes; /* raw bytes queued or being written */
    int busy, stop, kick;
    pthread_t writer, sweeper;

    pthread_mutex_t sweep_mu; /* one sweep at a time */
    atomic_int stopping;      /* read by a sweep in progress, to cut a long walk short at close */

    /* acct_mu guards what follows and orders this process's changes to the
     * tree against a sweep's look at it (see Totals above) */
    pthread_mutex_t acct_mu;
    int walking;            /* a sweep is counting: from its start to its store */
    int walk_hh;            /* the fan-out directory being judged (0..255), -1 none */
    size_t walk_n, walk_pos; /* walk_names[0..walk_n): its names, sorted; [0..walk_pos) judged */
    size_t walk_cap;
    sweep_name *walk_names;
    int walk_wrote;                         /* a write landed during this sweep (its kick is the sweep's) */
    int64_t wd_files[256], wd_bytes[256];   /* changes the walk will not see, per fan-out directory */
    int64_t wd_sum_files, wd_sum_bytes;     /* their sums */

    /* writer thread only */
    uint64_t tmp_counter;
    ZSTD_CCtx *cctx;
    uint8_t *zbuf;
    size_t zcap;

    atomic_uint_least64_t puts, put_bytes, dropped, write_errors, hits, misses, damaged, expired, evicted, files,
        bytes, written, existing;
};

/* ------------------------------------------------------------ small helpers */

static void inc(atomic_uint_least64_t *c, uint64_t v) { atomic_fetch_add_explicit(c, v, memory_order_relaxed); }

/* saturating: another process's file we never counted may be deleted by us */
static void dec(atomic_uint_least64_t *c, uint64_t v)
{
    uint64_t cur = atomic_load_explicit(c, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(c, &cur, cur > v ? cur - v : 0, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

static int64_t now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec;
}


static const char hexd[] = "0123456789abcdef";

static void key_hex(const uint8_t key[32], char out[65])
{
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hexd[key[i] >> 4];
        out[2 * i + 1] = hexd[key[i] & 15];
    }
    out[64] = 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1; /* we write lowercase only; anything else is not ours */
}

/* "<64 lowercase hex>.<kind 1..255, no leading zero>" -> 0, else -1 */
static int parse_name(const char *name, uint8_t key[32], uint8_t *kind)
{
    for (int i = 0; i < 32; i++) {
        int hi = hexval(name[2 * i]), lo = hi < 0 ? -1 : hexval(name[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        key[i] = (uint8_t)(hi << 4 | lo);
    }
    const char *p = name + 64;
    if (*p++ != '.' || *p < '1' || *p > '9') return -1;
    unsigned v = 0;
    for (int d = 0; *p; p++, d++) {
        if (d == 3 || *p < '0' || *p > '9') return -1;
        v = v * 10 + (unsigned)(*p - '0');
    }
    if (v > 255) return -1;
    *kind = (uint8_t)v;
    return 0;
}

static int file_path(const kv_store *s, const uint8_t key[32], uint8_t kind, char out[PATH_MAX])
{
    char hx[65];
    key_hex(key, hx);
    int k = snprintf(out, PATH_MAX, "%s/%c%c/%s.%u", s->root, hx[0], hx[1], hx, (unsigned)kind);
    return k > 0 && k < PATH_MAX ? 0 : -1;
}

static void hdr_fill(uint8_t *h, const uint8_t key[32], uint8_t kind, uint8_t flags, uint32_t ttl, uint64_t created,
                     uint64_t raw, uint64_t stored)
{
    memset(h, 0, KV_STORE_HDR_BYTES);
    memcpy(h, STORE_MAGIC, 8);
    rc_put_le32(h + 8, KV_STORE_FILE_VERSION);
    h[12] = kind;
    h[13] = flags;
    memcpy(h + 16, key, 32);
    rc_put_le32(h + 48, ttl);
    rc_put_le64(h + 56, created);
    rc_put_le64(h + 64, raw);
    rc_put_le64(h + 72, stored);
}

/* Everything the header says that can be checked without the payload:
 * ours, this version, this (key, kind), sane lengths matching fsize. */
static int hdr_check(const uint8_t *h, const uint8_t key[32], uint8_t kind, uint64_t fsize, hdr *out)
{
    if (memcmp(h, STORE_MAGIC, 8) != 0) return -1;
    if (rc_get_le32(h + 8) != KV_STORE_FILE_VERSION) return -1;
    if (h[12] != kind || (h[13] & ~FLAG_ZSTD) != 0) return -1;
    if (h[14] || h[15] || rc_get_le32(h + 52) != 0) return -1;
    if (memcmp(h + 16, key, 32) != 0) return -1;
    hdr d = {.kind = h[12], .flags = h[13], .ttl = rc_get_le32(h + 48), .created = rc_get_le64(h + 56),
             .raw = rc_get_le64(h + 64), .stored = rc_get_le64(h + 72)};
    if (d.raw > KV_STORE_MAX_BLOB || d.stored > KV_STORE_MAX_BLOB) return -1;
    if (!(d.flags & FLAG_ZSTD) && d.raw != d.stored) return -1;
    if ((d.flags & FLAG_ZSTD) && d.stored == 0) return -1;
    if (fsize != KV_STORE_HDR_BYTES + d.stored + TRAILER) return -1;
    if (out) *out = d;
    return 0;
}

static bool is_expired(uint32_t ttl, const struct stat *st, int64_t now)
{
    return ttl != 0 && (int64_t)st->st_mtim.tv_sec + (int64_t)ttl < now;
}

/* the old file's TTL is at least the new put's: no rewrite needed */
static bool ttl_covers(uint32_t old_ttl, uint32_t new_ttl)
{
    return old_ttl == 0 || (new_ttl != 0 && old_ttl >= new_ttl);
}

static int pread_full(int fd, void *buf, size_t n, off_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1; /* error or the file is shorter than it said */
        p += r, n -= (size_t)r, off += r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1; /* ENOSPC, EFBIG, EIO, ... */
        p += r, n -= (size_t)r;
    }
    return 0;
}

/* unlink dirfd/name if it is still the inode `was`; 1 when unlinked */
static int unlink_same(int dirfd, const char *name, const struct stat *was)
{
    struct stat cur;
    if (fstatat(dirfd, name, &cur, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    if (cur.st_dev != was->st_dev || cur.st_ino != was->st_ino) return 0;
    return unlinkat(dirfd, name, 0) == 0;
}

static void kick_sweeper(kv_store *s)
{
    pthread_mutex_lock(&s->mu);
    s->kick = 1;
    pthread_cond_signal(&s->sweep_cv);
    pthread_mutex_unlock(&s->mu);
}

static int cmp_name(const void *a, const void *b)
{
    const sweep_name *x = a, *y = b;
    int c = memcmp(x->key, y->key, 32);
    return c ? c : (int)x->kind - (int)y->kind;
}

/* This process changed the tree at (key, kind) by df files and db bytes (a
 * rename into place: df 1, or 0 over an old file; an unlink: -1).  Called
 * with acct_mu held, right after the change: adjusts the live totals and,
 * during a sweep, the delta its count will not see (see Totals above). */
static void account(kv_store *s, const uint8_t key[32], uint8_t kind, int64_t df, int64_t db)
{
    if (df > 0) inc(&s->files, (uint64_t)df);
    else if (df < 0) dec(&s->files, (uint64_t)-df);
    if (db > 0) inc(&s->bytes, (uint64_t)db);
    else if (db < 0) dec(&s->bytes, (uint64_t)-db);
    if (!s->walking) return;
    int hh = key[0]; /* = the fan-out directory: the name's first two hex digits */
    if (hh == s->walk_hh && s->walk_pos < s->walk_n) {
        sweep_name n;
        memcpy(n.key, key, 32);
        n.kind = kind;
        if (bsearch(&n, s->walk_names + s->walk_pos, s->walk_n - s->walk_pos, sizeof n, cmp_name))
            return; /* still to be judged: the walk sees this change itself */
    }
    s->wd_files[hh] += df, s->wd_sum_files += df;
    s->wd_bytes[hh] += db, s->wd_sum_bytes += db;
}

/* unlink a bad or expired file if it is still the inode judged, and count it
 * out; 1 when unlinked */
static int drop(kv_store *s, const uint8_t key[32], uint8_t kind, const char *path, const struct stat *st)
{
    pthread_mutex_lock(&s->acct_mu);
    int gone = unlink_same(AT_FDCWD, path, st);
    if (gone) account(s, key, kind, -1, -(int64_t)st->st_size);
    pthread_mutex_unlock(&s->acct_mu);
    return gone;
}

/* Tests only (tests/unit/test_kv_store.c): when set, a sweep calls it before
 * judging each file of its walk, holding sweep_mu only, so that a test can
 * land writes and deletes in the middle of a walk.  NULL otherwise. */
void (*kv_store_test_walk_hook)(void);

/* ---------------------------------------------------------------- reading */

/* Open a final file for reading: its fd (and *st), or -1 when it is absent or
 * not a regular file.  O_NONBLOCK as in sweep_file: a FIFO under a name of
 * ours must not hang a get, a contains or the writer (it means nothing for a
 * regular file); a FIFO or device there is not ours, so it is a miss that is
 * neither blamed nor unlinked. */
static int open_final(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return -1;
    }
    return fd;
}

int kv_store_get(kv_store *s, const uint8_t key[32], uint8_t kind, void **data, size_t *n)
{
    if (data) *data = NULL;
    if (n) *n = 0;
    if (!s || !key || !kind || !data || !n) return RC_EINVAL;
    char path[PATH_MAX];
    if (file_path(s, key, kind, path) != 0) return RC_EINVAL;

    struct stat st;
    /* absent, directory gone, fd limit, not a regular file, ...: a miss, the
     * file (if any) is not blamed */
    int fd = open_final(path, &st);
    if (fd < 0) goto miss;
    uint8_t *buf = NULL, *out = NULL;
    uint64_t fsize = (uint64_t)st.st_size;
    hdr h;
    if (fsize < KV_STORE_HDR_BYTES + TRAILER || fsize > KV_STORE_HDR_BYTES + KV_STORE_MAX_BLOB + TRAILER)
        goto damaged;
    buf = malloc(fsize);
    if (!buf) {
        close(fd);
        goto miss;
    }
    /* files are immutable once renamed in, so a short read is damage too */
    if (pread_full(fd, buf, fsize, 0) != 0) goto damaged;
    if (hdr_check(buf, key, kind, fsize, &h) != 0) goto damaged;
    size_t body = KV_STORE_HDR_BYTES + (size_t)h.stored;
    if (rc_crc32c(buf, body) != rc_get_le32(buf + body)) goto damaged;
    if (h.flags & FLAG_ZSTD) {
        const uint8_t *z = buf + KV_STORE_HDR_BYTES;
        if (ZSTD_findFrameCompressedSize(z, h.stored) != h.stored) goto damaged; /* one frame, nothing after */
        if (ZSTD_getFrameContentSize(z, h.stored) != h.raw) goto damaged;
        out = malloc(h.raw ? h.raw : 1);
        if (!out) {
            free(buf);
            close(fd);
            goto miss;
        }
        size_t r = ZSTD_decompress(out, h.raw, z, h.stored);
        if (ZSTD_isError(r) || r != h.raw) goto damaged;
        free(buf);
    } else {
        memmove(buf, buf + KV_STORE_HDR_BYTES, h.raw);
        out = buf;
    }
    buf = NULL;
    /* expiry is judged on a verified header only, so a damaged TTL field
     * counts as damage, not as expiry */
    if (is_expired(h.ttl, &st, now_s())) {
        free(out);
        close(fd);
        (void)drop(s, key, kind, path, &st);
        inc(&s->expired, 1);
        goto miss;
    }
    (void)futimens(fd, NULL); /* TTL and LRU count from last use; best effort */
    close(fd);
    inc(&s->hits, 1);
    *data = out;
    *n = h.raw;
    return 0;

damaged:
    free(buf);
    free(out);
    close(fd);
    (void)drop(s, key, kind, path, &st);
    inc(&s->damaged, 1);
miss:
    inc(&s->misses, 1);
    return KV_STORE_ENOENT;
}

int kv_store_contains(kv_store *s, const uint8_t key[32], uint8_t kind)
{
    if (!s || !key || !kind) return 0;
    char path[PATH_MAX];
    if (file_path(s, key, kind, path) != 0) return 0;
    struct stat st;
    int fd = open_final(path, &st);
    if (fd < 0) return 0;
    uint8_t h[KV_STORE_HDR_BYTES];
    hdr d;
    int yes = pread_full(fd, h, sizeof h, 0) == 0 && hdr_check(h, key, kind, (uint64_t)st.st_size, &d) == 0 &&
              !is_expired(d.ttl, &st, now_s());
    close(fd);
    return yes;
}

/* ---------------------------------------------------------------- writing */

int kv_store_put(kv_store *s, const uint8_t key[32], uint8_t kind, const void *data, size_t n, uint32_t ttl_s)
{
    if (!s || !key || !kind || (!data && n) || n > KV_STORE_MAX_BLOB) return RC_EINVAL;
    /* reserve queue room first, so a refused put costs no copy */
    pthread_mutex_lock(&s->mu);
    int full = s->stop || n > s->max_q || s->q_bytes > s->max_q - n;
    if (!full) s->q_bytes += n;
    pthread_mutex_unlock(&s->mu);
    if (full) {
        inc(&s->dropped, 1);
        return KV_STORE_EBUSY;
    }
    item *it = malloc(sizeof *it + KV_STORE_HDR_BYTES + n + TRAILER);
    if (!it) {
        pthread_mutex_lock(&s->mu);
        s->q_bytes -= n;
        pthread_mutex_unlock(&s->mu);
        inc(&s->dropped, 1);
        return RC_ENOMEM;
    }
    it->next = NULL;
    memcpy(it->key, key, 32);
    it->kind = kind;
    it->ttl = ttl_s;
    it->n = n;
    it->buf = (uint8_t *)(it + 1);
    if (n) memcpy(it->buf + KV_STORE_HDR_BYTES, data, n);

    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    inc(&s->puts, 1);
    inc(&s->put_bytes, n);
    return 0;
}

/* If a good, unexpired file with a TTL covering the new one is already there,
 * refresh its mtime and return 1. */
static int already_there(const char *path, const item *it)
{
    struct stat st;
    int fd = open_final(path, &st);
    if (fd < 0) return 0;
    uint8_t h[KV_STORE_HDR_BYTES];
    hdr d;
    int yes = pread_full(fd, h, sizeof h, 0) == 0 && hdr_check(h, it->key, it->kind, (uint64_t)st.st_size, &d) == 0 &&
              !is_expired(d.ttl, &st, now_s()) && ttl_covers(d.ttl, it->ttl);
    if (yes) (void)futimens(fd, NULL);
    close(fd);
    return yes;
}

/* mkdir the last component of path (its parent must exist: we never
 * recreate dir/ or dir/v1, see store.h); EEXIST is fine */
static int mkdir_leaf(const char *path)
{
    return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* Rename the finished temp file into place and count it, as one step under
 * acct_mu (see Totals above); the old file's size is taken there too, since
 * a sweep or a get may have deleted it since already_there.  0 = done;
 * *kick = the totals are now above cap and no sweep is running. */
static int publish(kv_store *s, const item *it, const char *tmp, const char *final, uint64_t total, int *kick)
{
    pthread_mutex_lock(&s->acct_mu);
    struct stat old;
    int had = lstat(final, &old) == 0 && S_ISREG(old.st_mode);
    int rc = rename(tmp, final);
    if (rc != 0 && errno == ENOENT) {
        /* the fan-out directory v1/<hh> is made on first use */
        char sub[PATH_MAX];
        size_t cut = strlen(s->root) + 3;
        memcpy(sub, final, cut);
        sub[cut] = 0;
        if (mkdir_leaf(sub) == 0) rc = rename(tmp, final);
    }
    if (rc == 0) {
        account(s, it->key, it->kind, had ? 0 : 1, (int64_t)total - (had ? (int64_t)old.st_size : 0));
        if (s->walking) s->walk_wrote = 1; /* the sweep re-checks the cap with its exact total */
        else *kick = s->cap && atomic_load_explicit(&s->bytes, memory_order_relaxed) > s->cap;
    }
    pthread_mutex_unlock(&s->acct_mu);
    return rc;
}

static void write_item(kv_store *s, item *it)
{
    char final[PATH_MAX], tmp[PATH_MAX];
    if (file_path(s, it->key, it->kind, final) != 0) goto fail;
    if (already_there(final, it)) {
        inc(&s->existing, 1);
        return;
    }

    uint8_t *file = it->buf;
    size_t stored = it->n;
    uint8_t flags = 0;
    if (s->level > 0 && it->n > 0) {
        size_t bound = ZSTD_compressBound(it->n);
        size_t need = KV_STORE_HDR_BYTES + bound + TRAILER;
        if (need > s->zcap) {
            uint8_t *nb = realloc(s->zbuf, need);
            if (nb) s->zbuf = nb, s->zcap = need;
        }
        if (need <= s->zcap) {
            size_t r = ZSTD_compressCCtx(s->cctx, s->zbuf + KV_STORE_HDR_BYTES, bound, it->buf + KV_STORE_HDR_BYTES,
                                         it->n, s->level);
            if (!ZSTD_isError(r) && r < it->n) file = s->zbuf, stored = r, flags = FLAG_ZSTD;
        }
        /* no memory for the buffer or no gain: store raw */
    }
    hdr_fill(file, it->key, it->kind, flags, it->ttl, (uint64_t)now_s(), it->n, stored);
    size_t body = KV_STORE_HDR_BYTES + stored, total = body + TRAILER;
    rc_put_le32(file + body, rc_crc32c(file, body));

    int k = snprintf(tmp, sizeof tmp, "%s/%ld-%ld-%016llx-%llu.tmp", s->tmp, (long)getpid(), (long)syscall(SYS_gettid),
                     (unsigned long long)s->nonce, (unsigned long long)++s->tmp_counter);
    if (k <= 0 || k >= (int)sizeof tmp) goto fail;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT && mkdir_leaf(s->tmp) == 0) fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) goto fail;
    int bad = write_full(fd, file, total) != 0 || (s->fsync && fsync(fd) != 0);
    /* close reports deferred write errors on NFS */
    if (close(fd) != 0) bad = 1;
    int kick = 0;
    if (!bad && publish(s, it, tmp, final, total, &kick) != 0) bad = 1;
    if (bad) {
        (void)unlink(tmp);
        goto fail;
    }
    inc(&s->written, 1);
    if (kick) kick_sweeper(s);
    return;
fail:
    inc(&s->write_errors, 1);
}

static void *writer_main(void *arg)
{
    kv_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
        if (!s->head) break; /* stop, and the queue is drained */
        item *it = s->head;
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);

        write_item(s, it);

        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        s->q_bytes -= it->n;
        free(it);
        if (!s->head) pthread_cond_broadcast(&s->idle_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void kv_store_flush(kv_store *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* ---------------------------------------------------------------- sweeping */

static int cmp_mtime(const void *a, const void *b)
{
    const sweep_ent *x = a, *y = b;
    if (x->mt_s != y->mt_s) return x->mt_s < y->mt_s ? -1 : 1;
    if (x->mt_ns != y->mt_ns) return x->mt_ns < y->mt_ns ? -1 : 1;
    return 0;
}

/* temp files of dead writers (kill -9, power loss); anything else in tmp/ is left alone */
static void sweep_tmp(kv_store *s, int64_t now)
{
    DIR *d = opendir(s->tmp);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && !atomic_load(&s->stopping)) {
        size_t l = strlen(e->d_name);
        if (l <= 4 || strcmp(e->d_name + l - 4, ".tmp") != 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        if ((int64_t)st.st_mtim.tv_sec + TMP_STALE_S < now) (void)unlink_same(dirfd(d), e->d_name, &st);
    }
    closedir(d);
}

/* what a sweep has counted so far */
typedef struct {
    uint64_t files, bytes;
    sweep_ent *v; /* with a cap: the files counted, for eviction */
    size_t nv, cv;
} sweep_acc;

/* Judge one name of the fan-out directory sfd, with acct_mu held: damaged or
 * expired -> unlinked, else counted (and kept for eviction). */
static void sweep_file(kv_store *s, int sfd, const sweep_name *n, int64_t now, sweep_acc *a)
{
    char name[72];
    key_hex(n->key, name);
    snprintf(name + 64, sizeof name - 64, ".%u", (unsigned)n->kind); /* = the name listed (parse_name: canonical) */
    /* O_NONBLOCK: a FIFO under a name of ours must not hang the sweep (and
     * the writer, on acct_mu); it means nothing for a regular file */
    int fd = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return; /* gone meanwhile, or a symlink: not ours */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    uint8_t h[KV_STORE_HDR_BYTES];
    hdr d;
    int ok = pread_full(fd, h, sizeof h, 0) == 0 && hdr_check(h, n->key, n->kind, (uint64_t)st.st_size, &d) == 0;
    close(fd);
    if (!ok) {
        /* a final file is complete by construction, so a bad
         * header is damage (the CRC is left to get) */
        if (unlink_same(sfd, name, &st)) inc(&s->damaged, 1);
        return;
    }
    if (is_expired(d.ttl, &st, now)) {
        if (unlink_same(sfd, name, &st)) inc(&s->expired, 1);
        return;
    }
    a->files++;
    a->bytes += (uint64_t)st.st_size;
    if (!s->cap) return;
    if (a->nv == a->cv) {
        size_t nc = a->cv ? 2 * a->cv : 1024;
        sweep_ent *nvp = realloc(a->v, nc * sizeof *a->v);
        if (!nvp) return; /* this file just escapes eviction this round */
        a->v = nvp, a->cv = nc;
    }
    sweep_ent *x = &a->v[a->nv++];
    x->mt_s = st.st_mtim.tv_sec;
    x->mt_ns = st.st_mtim.tv_nsec;
    x->size = (uint64_t)st.st_size;
    x->dev = st.st_dev;
    x->ino = st.st_ino;
    memcpy(x->key, n->key, 32);
    x->kind = n->kind;
}

/* the next name of our layout in fan-out directory hh, or 0 at the end */
static int next_name(DIR *sd, const char *hh, sweep_name *n)
{
    struct dirent *f;
    while ((f = readdir(sd))) {
        /* only names of our layout, in the directory their key says */
        if (parse_name(f->d_name, n->key, &n->kind) == 0 && f->d_name[0] == hh[0] && f->d_name[1] == hh[1])
            return 1;
    }
    return 0;
}

/* One fan-out directory: its listing is taken (and its delta cleared) under
 * acct_mu, then its names are judged one at a time, each under acct_mu. */
static void sweep_dir(kv_store *s, int rfd, const char *hh, int64_t now, sweep_acc *a)
{
    int sfd = openat(rfd, hh, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sfd < 0) return;
    DIR *sd = fdopendir(sfd);
    if (!sd) {
        close(sfd);
        return;
    }
    int ix = hexval(hh[0]) << 4 | hexval(hh[1]);
    sweep_name n;
    int whole = 0; /* no memory for the listing: judge the rest with acct_mu held throughout */
    pthread_mutex_lock(&s->acct_mu);
    s->wd_sum_files -= s->wd_files[ix], s->wd_files[ix] = 0;
    s->wd_sum_bytes -= s->wd_bytes[ix], s->wd_bytes[ix] = 0;
    s->walk_hh = ix;
    s->walk_n = s->walk_pos = 0;
    while (!whole && next_name(sd, hh, &n)) {
        if (s->walk_n == s->walk_cap) {
            size_t nc = s->walk_cap ? 2 * s->walk_cap : 256;
            sweep_name *p = realloc(s->walk_names, nc * sizeof *p);
            if (!p) whole = 1;
            else s->walk_names = p, s->walk_cap = nc;
        }
        if (!whole) s->walk_names[s->walk_n++] = n;
    }
    size_t i = 0;
    if (whole) {
        for (; i < s->walk_n && !atomic_load(&s->stopping); i++) sweep_file(s, sfd, &s->walk_names[i], now, a);
        if (!atomic_load(&s->stopping)) sweep_file(s, sfd, &n, now, a); /* the name that found no room */
        while (!atomic_load(&s->stopping) && next_name(sd, hh, &n)) sweep_file(s, sfd, &n, now, a);
    } else {
        if (s->walk_n > 1) qsort(s->walk_names, s->walk_n, sizeof *s->walk_names, cmp_name);
        pthread_mutex_unlock(&s->acct_mu);
        /* walk_names and walk_n change only here, in the one sweep (sweep_mu) */
        for (; i < s->walk_n && !atomic_load(&s->stopping); i++) {
            if (kv_store_test_walk_hook) kv_store_test_walk_hook();
            pthread_mutex_lock(&s->acct_mu);
            sweep_file(s, sfd, &s->walk_names[i], now, a);
            s->walk_pos = i + 1;
            pthread_mutex_unlock(&s->acct_mu);
        }
        pthread_mutex_lock(&s->acct_mu);
    }
    s->walk_hh = -1; /* from here this directory's changes go to its delta */
    s->walk_n = s->walk_pos = 0;
    pthread_mutex_unlock(&s->acct_mu);
    closedir(sd);
}

static void sweep_run(kv_store *s)
{
    pthread_mutex_lock(&s->sweep_mu);
    int64_t now = now_s();
    sweep_tmp(s, now);

    pthread_mutex_lock(&s->acct_mu);
    s->walking = 1, s->walk_wrote = 0, s->walk_hh = -1;
    memset(s->wd_files, 0, sizeof s->wd_files);
    memset(s->wd_bytes, 0, sizeof s->wd_bytes);
    s->wd_sum_files = s->wd_sum_bytes = 0;
    pthread_mutex_unlock(&s->acct_mu);

    sweep_acc a = {0};
    DIR *r = opendir(s->root);
    if (r) {
        struct dirent *e;
        while ((e = readdir(r)) && !atomic_load(&s->stopping)) {
            const char *hh = e->d_name;
            if (hexval(hh[0]) < 0 || hexval(hh[1]) < 0 || hh[2]) continue;
            sweep_dir(s, dirfd(r), hh, now, &a);
        }
        closedir(r);
    }

    /* capacity: least recently used (oldest mtime) first, down to the low
     * watermark, so that a store at capacity sweeps once per cap/10 bytes
     * written, not once per write.  The total judged is the count plus this
     * process's changes since (writes and deletes during the sweep).  A file
     * whose mtime moved since the walk was just used (here or by another
     * process): skipped, not deleted.  One gone meanwhile stays counted if
     * another process deleted it (the next sweep sees it, like any other
     * process's change); if we did, its delta has it already. */
    uint64_t low = s->cap - s->cap / 10;
    pthread_mutex_lock(&s->acct_mu);
    int64_t total = (int64_t)a.bytes + s->wd_sum_bytes;
    pthread_mutex_unlock(&s->acct_mu);
    if (s->cap && total > (int64_t)s->cap && a.nv) {
        qsort(a.v, a.nv, sizeof *a.v, cmp_mtime);
        for (size_t i = 0; i < a.nv && !atomic_load(&s->stopping); i++) {
            char path[PATH_MAX];
            if (file_path(s, a.v[i].key, a.v[i].kind, path) != 0) continue;
            pthread_mutex_lock(&s->acct_mu);
            int done = (int64_t)a.bytes + s->wd_sum_bytes <= (int64_t)low;
            struct stat cur;
            if (!done && lstat(path, &cur) == 0 && cur.st_dev == a.v[i].dev && cur.st_ino == a.v[i].ino &&
                cur.st_mtim.tv_sec == a.v[i].mt_s && cur.st_mtim.tv_nsec == a.v[i].mt_ns && unlink(path) == 0) {
                a.files--, a.bytes -= a.v[i].size;
                inc(&s->evicted, 1);
            }
            pthread_mutex_unlock(&s->acct_mu);
            if (done) break;
        }
    }
    free(a.v);

    /* the count plus the changes it did not see: exact for this process */
    pthread_mutex_lock(&s->acct_mu);
    int64_t files = (int64_t)a.files + s->wd_sum_files, bytes = (int64_t)a.bytes + s->wd_sum_bytes;
    if (files < 0) files = 0; /* we deleted another process's file our count never had */
    if (bytes < 0) bytes = 0;
    int stopped = atomic_load(&s->stopping); /* a walk cut short counted only part: keep the running totals */
    if (!stopped) {
        atomic_store(&s->files, (uint64_t)files);
        atomic_store(&s->bytes, (uint64_t)bytes);
    }
    /* writes during the sweep left their kick to us */
    int again = s->cap && s->walk_wrote && (uint64_t)bytes > s->cap && !stopped;
    s->walking = 0;
    pthread_mutex_unlock(&s->acct_mu);
    pthread_mutex_unlock(&s->sweep_mu);
    if (again) kick_sweeper(s);
}

void kv_store_sweep(kv_store *s)
{
    if (s) sweep_run(s);
}

static void *sweeper_main(void *arg)
{
    kv_store *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        dl.tv_sec += s->interval_ms / 1000;
        dl.tv_nsec += (long)(s->interval_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        while (!s->stop && !s->kick)
            if (pthread_cond_timedwait(&s->sweep_cv, &s->mu, &dl) == ETIMEDOUT) break;
        if (s->stop) break;
        s->kick = 0;
        pthread_mutex_unlock(&s->mu);
        sweep_run(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

static int mkdir_p(const char *dir)
{
    char p[PATH_MAX];
    size_t l = strlen(dir);
    if (l == 0 || l >= sizeof p) return -1;
    memcpy(p, dir, l + 1);
    for (size_t i = 1; i <= l; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
        p[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int kv_store_open(const kv_store_cfg *cfg, kv_store **out, rc_err *err)
{
    if (out) *out = NULL;
    if (!cfg || !out || !cfg->dir || !cfg->dir[0]) return rc_errf(err, RC_EINVAL, "kv store: no directory given");
    if (cfg->compress < 0 || cfg->compress > ZSTD_maxCLevel())
        return rc_errf(err, RC_EINVAL, "kv store: compression level %d out of range 0..%d", cfg->compress,
                       ZSTD_maxCLevel());
    if (cfg->sweep_interval_ms < 0)
        return rc_errf(err, RC_EINVAL, "kv store: sweep interval %d ms is negative", cfg->sweep_interval_ms);
    /* a file-size limit (RLIMIT_FSIZE) must fail a write with EFBIG, counted
     * like a full disk, not kill the process with SIGXFSZ */
    signal(SIGXFSZ, SIG_IGN);
    /* room for /v1/<hh>/<64 hex>.<kind> and the temp names */
    if (strlen(cfg->dir) > PATH_MAX - 160)
        return rc_errf(err, RC_EINVAL, "kv store: directory path too long (%zu bytes)", strlen(cfg->dir));

    kv_store *s = calloc(1, sizeof *s);
    if (!s) return rc_errf(err, RC_ENOMEM, "kv store: out of memory");
    snprintf(s->root, sizeof s->root, "%s/v1", cfg->dir);
    snprintf(s->tmp, sizeof s->tmp, "%s/v1/tmp", cfg->dir);
    if (mkdir_p(s->tmp) != 0) {
        int e = errno;
        free(s);
        return rc_errf(err, RC_EIO, "kv store: cannot create %s/v1/tmp: %s", cfg->dir, strerror(e));
    }
    s->cap = cfg->cap_bytes;
    s->level = cfg->compress;
    s->interval_ms = cfg->sweep_interval_ms ? cfg->sweep_interval_ms : 30000;
    s->max_q = cfg->max_queue_bytes ? cfg->max_queue_bytes : (size_t)256 << 20;
    s->fsync = cfg->fsync;
    if (getrandom(&s->nonce, sizeof s->nonce, GRND_NONBLOCK) != (ssize_t)sizeof s->nonce) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        s->nonce = (uint64_t)t.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)t.tv_sec ^ (uint64_t)(uintptr_t)s ^
                   (uint64_t)getpid() << 32;
    }
    if (s->level > 0 && !(s->cctx = ZSTD_createCCtx())) {
        free(s);
        return rc_errf(err, RC_ENOMEM, "kv store: out of memory (zstd context)");
    }

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->sweep_mu, NULL);
    pthread_mutex_init(&s->acct_mu, NULL);
    s->walk_hh = -1;
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    pthread_cond_init(&s->sweep_cv, &ca);
    pthread_condattr_destroy(&ca);

    sweep_run(s); /* restart recovery: counts, stale temps, expired and damaged files, capacity */

    if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        s->stop = 1;
        goto fail_threads;
    }
    if (pthread_create(&s->sweeper, NULL, sweeper_main, s) != 0) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_broadcast(&s->work_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
        goto fail_threads;
    }
    *out = s;
    return 0;

fail_threads:
    pthread_cond_destroy(&s->sweep_cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->acct_mu);
    pthread_mutex_destroy(&s->sweep_mu);
    pthread_mutex_destroy(&s->mu);
    ZSTD_freeCCtx(s->cctx);
    free(s->walk_names);
    free(s);
    return rc_errf(err, RC_EIO, "kv store: cannot start its threads");
}

void kv_store_close(kv_store *s)
{
    if (!s) return;
    atomic_store(&s->stopping, 1);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->work_cv);
    pthread_cond_broadcast(&s->sweep_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL); /* returns once the queue is drained */
    pthread_join(s->sweeper, NULL);
    pthread_cond_destroy(&s->sweep_cv);
    pthread_cond_destroy(&s->idle_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->acct_mu);
    pthread_mutex_destroy(&s->sweep_mu);
    pthread_mutex_destroy(&s->mu);
    ZSTD_freeCCtx(s->cctx);
    free(s->zbuf);
    free(s->walk_names);
    free(s);
}

void kv_store_get_stats(kv_store *s, kv_store_stats *o)
{
    if (!o) return;
    memset(o, 0, sizeof *o);
    if (!s) return;
#define LD(f) o->f = atomic_load_explicit(&s->f, memory_order_relaxed)
    LD(puts); LD(put_bytes); LD(dropped); LD(write_errors); LD(hits); LD(misses); LD(damaged); LD(expired);
    LD(evicted); LD(files); LD(bytes); LD(written); LD(existing);
#undef LD
}
