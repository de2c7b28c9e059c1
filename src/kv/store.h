/* store.h - the disk tier of the KV cache: opaque blobs under --kv-dir.
 *
 * A content store keyed by (32-byte block key, kind).  kind is opaque to the
 * store (1..255; the engine uses 1 = KV block, 2 = window/boundary state).
 * The directory may be a local disk or a shared mount (NFS, 3FS) that several
 * server processes use at once: every write is a whole file renamed into
 * place, so readers in any process see a complete file or none.
 *
 *   kv_store_open      mkdir -p dir; one sweep (restart recovery: rebuilds
 *                      the file/byte counts, deletes temp files older than
 *                      10 min, expired and damaged files, evicts above cap);
 *                      starts the writer and sweeper threads
 *   kv_store_put       copies the blob into the write queue and returns at
 *                      once: 0, KV_STORE_EBUSY when the queue is full (the put
 *                      is dropped and counted), RC_EINVAL (kind 0, blob above
 *                      KV_STORE_MAX_BLOB), RC_ENOMEM.  The writer skips a key
 *                      already on disk with a TTL at least as long (refreshing
 *                      its mtime instead).  A put becomes visible to get when
 *                      the writer has renamed its file into place (flush).
 *   kv_store_get       synchronous read with full verification: 0 = hit
 *                      (*data is malloc'd, the caller frees it; a 0-byte blob
 *                      gives a non-NULL pointer), KV_STORE_ENOENT = miss.
 *                      Damaged files (any check below fails) and expired ones
 *                      are misses and are unlinked.  A hit refreshes mtime.
 *                      Anything there that is not a regular file (a FIFO, a
 *                      device) is a miss, left alone; no read path of the
 *                      store (get, contains, the writer) blocks opening it.
 *   kv_store_contains  1 if a file for (key, kind) exists, has our header and
 *                      has not expired (open + fstat + one 80-byte pread; no
 *                      CRC), else 0.  Does not refresh mtime.
 *   kv_store_flush     waits until every queued put is written (or failed)
 *   kv_store_sweep     one sweep now, in the caller's thread
 *   kv_store_close     drains the queue, joins the threads, frees
 *
 * TTL: ttl_s is per put; a file expires when mtime + ttl_s < now, and hits
 * (and duplicate puts) set mtime to now, so the TTL counts from last use.
 * ttl_s 0 = never expires (only capacity eviction removes it).
 *
 * Layout under dir:
 *   v1/<hh>/<64 lowercase hex of key>.<kind in decimal>   hh = first 2 hex
 *   v1/tmp/<pid>-<tid>-<16 hex nonce>-<counter>.tmp        writes in flight
 * The random per-open nonce keeps temp names unique across hosts sharing a
 * mount (pids collide there).  The store never creates dir/ or dir/v1 after
 * open (only v1/tmp and the v1/<hh> fan-out), so if a shared mount vanishes it
 * fails instead of filling the mount point on the local disk.
 *
 * File format (version 1), all integers little-endian, 80-byte header:
 *   off  size  field
 *     0     8  magic "DIKVSTR1"
 *     8     4  format version = 1
 *    12     1  kind (1..255, = the file name's suffix)
 *    13     1  flags: bit 0 = payload is one zstd frame; other bits 0
 *    14     2  reserved, 0
 *    16    32  key (= the file name's hex)
 *    48     4  ttl seconds (0 = none)
 *    52     4  reserved, 0
 *    56     8  creation time, unix seconds (informational)
 *    64     8  raw length (bytes get returns; <= KV_STORE_MAX_BLOB)
 *    72     8  stored length (= raw length when not compressed)
 *    80     -  payload (stored length bytes)
 *  80+s     4  CRC32C (base/crc32c.h) of bytes [0, 80+s)
 * File size = 84 + stored length, exactly.  A reader checks magic, version,
 * kind, flags, reserved bytes, key, both lengths against each other and the
 * file size, the CRC, and that the zstd frame declares and decompresses to
 * exactly the raw length.  Compression (zstd at cfg.compress) is used only
 * when it shrinks the blob.
 *
 * Threads: put/get/contains/flush/sweep/get_stats may be called from any
 * thread concurrently.  Counters are atomics; files/bytes are exact after a
 * sweep (and at open), this process's own writes and deletes made during the
 * sweep included, and adjusted by them in between; other processes' changes
 * show up at the next sweep. */
#ifndef KV_STORE_H
#define KV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* store-specific results (base/err.h has no "busy" or "not found") */
enum { KV_STORE_EBUSY = -30, KV_STORE_ENOENT = -31 };

#define KV_STORE_MAX_BLOB (1ull << 30) /* 1 GiB: a sanity bound on raw and stored lengths */
#define KV_STORE_HDR_BYTES 80
#define KV_STORE_FILE_VERSION 1

typedef struct kv_store kv_store;

typedef struct {
    const char *dir;          /* created if missing (mkdir -p) */
    uint64_t cap_bytes;       /* disk capacity; 0 = unlimited; above it the sweeper deletes least-recently-used
                                 files (oldest mtime first) down to 90% of it (a low watermark, so a full store
                                 does not walk the tree on every write); a write that crosses it wakes the sweeper */
    int compress;             /* 0 off; >0 zstd level (libzstd); stored raw when compression does not shrink */
    int sweep_interval_ms;    /* background sweeper period; default 30000 when 0 */
    size_t max_queue_bytes;   /* pending async writes; puts beyond it are dropped (counted); default 256 MiB when 0 */
    int fsync;                /* fsync file before rename (default 0) */
} kv_store_cfg;

typedef struct {
    uint64_t puts;         /* puts accepted into the queue */
    uint64_t put_bytes;    /* their raw bytes */
    uint64_t dropped;      /* puts refused: queue full (or out of memory) */
    uint64_t write_errors; /* queued puts whose file could not be written (disk full, directory gone, ...) */
    uint64_t hits, misses; /* get results */
    uint64_t damaged;      /* files found bad (get, sweep) and unlinked */
    uint64_t expired;      /* files found past mtime + ttl (get, sweep) and unlinked */
    uint64_t evicted;      /* files the sweeper deleted for capacity */
    uint64_t files, bytes; /* files of ours in dir and their total size (see Threads above) */
    uint64_t written;      /* files this process renamed into place */
    uint64_t existing;     /* queued puts skipped because the file was already there (mtime refreshed) */
} kv_store_stats;

int kv_store_open(const kv_store_cfg *cfg, kv_store **out, rc_err *err);
void kv_store_close(kv_store *s);
int kv_store_put(kv_store *s, const uint8_t key[32], uint8_t kind, const void *data, size_t n, uint32_t ttl_s);
int kv_store_get(kv_store *s, const uint8_t key[32], uint8_t kind, void **data, size_t *n);
int kv_store_contains(kv_store *s, const uint8_t key[32], uint8_t kind);
void kv_store_flush(kv_store *s);
void kv_store_sweep(kv_store *s);
void kv_store_get_stats(kv_store *s, kv_store_stats *out);

#endif
