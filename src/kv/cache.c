/* cache.c - see cache.h.
 *
 * Three maps of the same shape (key -> entry, chained hash table, plus an
 * LRU list whose head is the most recently used): the memory tier (entries
 * hold an md_block and one reference to it), the host tier (entries hold
 * block bytes) and the window-state RAM (entries hold boundary bytes and an
 * expiry time).  Every map has a byte capacity; eviction walks from the LRU
 * tail.  A memory-tier block that a sequence still references is skipped by
 * eviction (the tier may then sit above its capacity until sequences end);
 * an evicted block's bytes move to the host tier when there is one. */
#include "kv/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/vec.h"
#include "kv/store.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "KV block bytes are host floats: little-endian hosts only"
#endif

enum { KIND_BLOCK = 1, KIND_SWA = 2 };
enum { TIER_MEM, TIER_HOST, TIER_DISK };
#define TAG_ON_DISK 1u   /* md_block.tag: the block's bytes are in the disk tier */

/* ------------------------------------------------------------------ maps */

typedef struct ent {
    kv_key key;
    struct ent *hnext, *prev, *next;
    md_block *blk;        /* memory tier */
    uint8_t *bytes;       /* host tier, window states */
    size_t nbytes;
    double expiry;        /* window states (CLOCK_MONOTONIC seconds) */
} ent;

typedef struct {
    ent **tab;
    size_t cap, n;
    ent lru;              /* sentinel: lru.next = most recent, lru.prev = least */
    uint64_t bytes, cap_bytes;
} map;

static int map_init(map *m, uint64_t cap_bytes)
{
    m->cap = 1024;
    m->tab = calloc(m->cap, sizeof *m->tab);
    m->lru.next = m->lru.prev = &m->lru;
    m->cap_bytes = cap_bytes;
    return m->tab ? 0 : RC_ENOMEM;
}

static size_t hslot(const map *m, const kv_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, 8);   /* SHA-256 output: any 8 bytes are uniform */
    return (size_t)(h & (m->cap - 1));
}

static ent *map_find(const map *m, const kv_key *k)
{
    for (ent *e = m->tab[hslot(m, k)]; e; e = e->hnext)
        if (!memcmp(e->key.b, k->b, KV_KEY_BYTES)) return e;
    return NULL;
}

static void lru_unlink(ent *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_front(map *m, ent *e)
{
    e->next = m->lru.next;
    e->prev = &m->lru;
    m->lru.next->prev = e;
    m->lru.next = e;
}

static void map_touch(map *m, ent *e)
{
    lru_unlink(e);
    lru_front(m, e);
}

static void map_grow(map *m)
{
    size_t nc = m->cap * 2;
    ent **nt = calloc(nc, sizeof *nt);
    if (!nt) return;   /* stay at this size: longer chains, still correct */
    ent **old = m->tab;
    size_t oc = m->cap;
    m->tab = nt;
    m->cap = nc;
    for (size_t i = 0; i < oc; i++)
        for (ent *e = old[i], *nx; e; e = nx) {
            nx = e->hnext;
            size_t s = hslot(m, &e->key);
            e->hnext = m->tab[s];
            m->tab[s] = e;
        }
    free(old);
}

static void map_insert(map *m, ent *e, size_t bytes)
{
    if (m->n + 1 > m->cap / 2) map_grow(m);
    size_t s = hslot(m, &e->key);
    e->hnext = m->tab[s];
    m->tab[s] = e;
    lru_front(m, e);
    m->n++;
    m->bytes += bytes;
}

static void map_remove(map *m, ent *e, size_t bytes)
{
    ent **pp = &m->tab[hslot(m, &e->key)];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(e);
    m->n--;
    m->bytes -= bytes;
}

/* ----------------------------------------------------------------- cache */

struct kv_cache {
    md_model *m;
    kv_cache_cfg cfg;
    uint8_t fp[KV_KEY_BYTES];
    size_t blk_bytes, bnd_bytes;
    int cone;             /* replay length that is exact: W + (L-1)(W-1) */
    map mem, host, swa;
    kv_store *store;
    uint8_t *bnd_buf;     /* scratch for one boundary state */
    pthread_mutex_t smu;  /* guards st (read by the metrics thread) */
    kv_cache_stats st;
};

struct kv_track {
    kv_cache *c;
    char *salt;
    int cls;
    rc_ids tok;           /* every token the state absorbed */
    kv_key *keys;         /* keys[i] of block i, for i < nkeys */
    size_t nkeys, kcap;
    size_t published;     /* blocks published (or found in the cache) */
    int64_t last_bnd;     /* length of the last boundary state published */
    int quiet;            /* approximate replay: publish nothing */
};

void kv_cache_cfg_defaults(kv_cache_cfg *c)
{
    memset(c, 0, sizeof *c);
    c->mem_bytes = 1ull << 30;
    c->ttl_s[KV_CLASS_AGENT] = 72 * 3600;
    c->ttl_s[KV_CLASS_CHAT] = 168 * 3600;
    c->swa_ttl_s = 180;
    c->swa_bytes = 1ull << 30;
    c->replay = 128;
    c->window_every = 4;
    c->publish_replayed = 1;
}

int kv_cache_window_every(const kv_cache *c) { return c->cfg.window_every > 0 ? c->cfg.window_every : 4; }

const char *kv_path_name(kv_path p)
{
    static const char *const n[] = {"miss", "short", "exact", "replay"};
    return (unsigned)p < 4 ? n[p] : "?";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define STAT(c, field, v) do { pthread_mutex_lock(&(c)->smu); (c)->st.field += (v); pthread_mutex_unlock(&(c)->smu); } while (0)

static void stat_levels(kv_cache *c)
{
    pthread_mutex_lock(&c->smu);
    c->st.mem_blocks = c->mem.n;
    c->st.mem_bytes = c->mem.bytes;
    c->st.host_bytes = c->host.bytes;
    c->st.swa_bytes = c->swa.bytes;
    pthread_mutex_unlock(&c->smu);
}

int kv_cache_create(md_model *m, const kv_cache_cfg *cfg, const uint8_t fingerprint[KV_KEY_BYTES], kv_cache **out,
                    rc_err *err)
{
    *out = NULL;
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return rc_errf(err, RC_ENOMEM, "out of memory");
    c->m = m;
    c->cfg = *cfg;
    memcpy(c->fp, fingerprint, KV_KEY_BYTES);
    c->blk_bytes = md_block_floats(m) * sizeof(float);
    c->bnd_bytes = md_seq_boundary_size(m);
    const md_config *mc = md_model_config(m);
    c->cone = mc->window + (mc->n_layers - 1) * (mc->window - 1);
    pthread_mutex_init(&c->smu, NULL);
    c->bnd_buf = malloc(c->bnd_bytes);
    if (!c->bnd_buf || map_init(&c->mem, cfg->mem_bytes) || map_init(&c->host, cfg->host_bytes) ||
        map_init(&c->swa, cfg->swa_bytes)) {
        kv_cache_destroy(c);
        return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    if (cfg->dir && cfg->dir[0]) {
        kv_store_cfg sc = {.dir = cfg->dir, .cap_bytes = cfg->disk_bytes, .compress = cfg->compress};
        int rc = kv_store_open(&sc, &c->store, err);
        if (rc) {
            kv_cache_destroy(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

static void ent_free(ent *e)
{
    free(e->bytes);
    free(e);
}

void kv_cache_destroy(kv_cache *c)
{
    if (!c) return;
    if (c->store) kv_store_close(c->store);
    map *ms[3] = {&c->mem, &c->host, &c->swa};
    for (int i = 0; i < 3; i++) {
        if (!ms[i]->tab) continue;
        for (ent *e = ms[i]->lru.next, *nx; e != &ms[i]->lru; e = nx) {
            nx = e->next;
            if (e->blk) md_block_unref(c->m, e->blk);
            ent_free(e);
        }
        free(ms[i]->tab);
    }
    free(c->bnd_buf);
    pthread_mutex_destroy(&c->smu);
    free(c);
}

void kv_cache_flush(kv_cache *c)
{
    if (c->store) kv_store_flush(c->store);
}

/* ------------------------------------------------------------ host tier */

static void host_evict(kv_cache *c)
{
    while (c->host.bytes > c->host.cap_bytes && c->host.lru.prev != &c->host.lru) {
        ent *e = c->host.lru.prev;
        map_remove(&c->host, e, e->nbytes);
        ent_free(e);
        STAT(c, evicted_host, 1);
    }
}

static void host_put(kv_cache *c, const kv_key *k, const float *data)
{
    if (!c->host.cap_bytes || c->blk_bytes > c->host.cap_bytes) return;
    ent *e = map_find(&c->host, k);
    if (e) { map_touch(&c->host, e); return; }
    e = calloc(1, sizeof *e);
    if (!e || !(e->bytes = malloc(c->blk_bytes))) { free(e); return; }
    e->key = *k;
    memcpy(e->bytes, data, c->blk_bytes);
    e->nbytes = c->blk_bytes;
    map_insert(&c->host, e, e->nbytes);
    host_evict(c);
}

/* ---------------------------------------------------------- memory tier */

/* evict unreferenced blocks from the LRU tail while over capacity */
static void mem_evict(kv_cache *c)
{
    ent *e = c->mem.lru.prev;
    while (c->mem.bytes > c->mem.cap_bytes && e != &c->mem.lru) {
        ent *pv = e->prev;
        if (e->blk->refs == 1) {
            host_put(c, &e->key, e->blk->data);
            map_remove(&c->mem, e, c->blk_bytes);
            md_block_unref(c->m, e->blk);
            ent_free(e);
            STAT(c, evicted_mem, 1);
        }
        e = pv;
    }
}

/* index b under k (one reference for the index); b stays the caller's too */
static void mem_put(kv_cache *c, const kv_key *k, md_block *b)
{
    ent *e = calloc(1, sizeof *e);
    if (!e) return;
    e->key = *k;
    e->blk = b;
    md_block_ref(b);
    map_insert(&c->mem, e, c->blk_bytes);
    mem_evict(c);
}

/* the block under k from any tier, with one reference for the caller; NULL = miss */
static md_block *block_get(kv_cache *c, const kv_key *k, int *tier)
{
    ent *e = map_find(&c->mem, k);
    if (e) {
        map_touch(&c->mem, e);
        md_block_ref(e->blk);
        *tier = TIER_MEM;
        return e->blk;
    }
    md_block *b = NULL;
    e = map_find(&c->host, k);
    if (e) {
        if (!(b = md_block_new(c->m))) return NULL;
        memcpy(b->data, e->bytes, c->blk_bytes);
        map_remove(&c->host, e, e->nbytes);
        ent_free(e);
        *tier = TIER_HOST;
    } else if (c->store) {
        void *data = NULL;
        size_t n = 0;
        if (kv_store_get(c->store, k->b, KIND_BLOCK, &data, &n)) return NULL;
        if (n != c->blk_bytes || !(b = md_block_new(c->m))) {
            free(data);
            return NULL;
        }
        memcpy(b->data, data, n);
        free(data);
        b->tag |= TAG_ON_DISK;
        *tier = TIER_DISK;
    } else {
        return NULL;
    }
    mem_put(c, k, b);
    return b;
}

/* ------------------------------------------------------- window states */

static void swa_drop(kv_cache *c, ent *e)
{
    map_remove(&c->swa, e, e->nbytes);
    ent_free(e);
}

static void swa_put(kv_cache *c, const kv_key *k, const uint8_t *bnd, size_t n)
{
    /* swa_ttl_s 0: window states expire at once.  Kept nowhere: in RAM one
     * would be dead on arrival, and on disk the store's TTL 0 means "never
     * expires" (a window state from another server sharing the directory,
     * with its own TTL, is still read by swa_get) */
    if (c->cfg.swa_ttl_s == 0) return;
    const double now = now_s();
    /* expired ones first, then LRU over capacity */
    for (ent *e = c->swa.lru.prev, *pv; e != &c->swa.lru; e = pv) {
        pv = e->prev;
        if (e->expiry <= now) swa_drop(c, e);
    }
    ent *e = map_find(&c->swa, k);
    if (e) swa_drop(c, e);
    if (n > c->swa.cap_bytes) return;
    e = calloc(1, sizeof *e);
    if (!e || !(e->bytes = malloc(n))) { free(e); return; }
    e->key = *k;
    memcpy(e->bytes, bnd, n);
    e->nbytes = n;
    e->expiry = now + c->cfg.swa_ttl_s;
    map_insert(&c->swa, e, n);
    while (c->swa.bytes > c->swa.cap_bytes && c->swa.lru.prev != &c->swa.lru) {
        swa_drop(c, c->swa.lru.prev);
        STAT(c, evicted_swa, 1);
    }
    if (c->store) kv_store_put(c->store, k->b, KIND_SWA, bnd, n, c->cfg.swa_ttl_s);
}

/* the window state ending at block k: RAM, then disk; *owned = malloc'd copy */
static const uint8_t *swa_get(kv_cache *c, const kv_key *k, size_t *n, void **owned)
{
    *owned = NULL;
    ent *e = map_find(&c->swa, k);
    if (e) {
        if (e->expiry > now_s()) {
            map_touch(&c->swa, e);
            *n = e->nbytes;
            STAT(c, swa_hits_ram, 1);
            return e->bytes;
        }
        swa_drop(c, e);
    }
    if (c->store && !kv_store_get(c->store, k->b, KIND_SWA, owned, n)) {
        STAT(c, swa_hits_disk, 1);
        return *owned;
    }
    return NULL;
}

/* ------------------------------------------------------------- tracking */

kv_track *kv_track_new(kv_cache *c, const char *salt, int cls)
{
    kv_track *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->c = c;
    t->cls = cls >= 0 && cls < KV_CLASS_COUNT ? cls : KV_CLASS_CHAT;
    if (salt && salt[0] && !(t->salt = strdup(salt))) {
        free(t);
        return NULL;
    }
    return t;
}

void kv_track_free(kv_track *t)
{
    if (!t) return;
    free(t->salt);
    free(t->tok.v);
    free(t->keys);
    free(t);
}

int kv_track_tokens(kv_track *t, const int32_t *ids, size_t n)
{
    if (rc_ids_reserve(&t->tok, n)) return RC_ENOMEM;
    memcpy(t->tok.v + t->tok.n, ids, n * sizeof *ids);
    t->tok.n += n;
    return 0;
}

static kv_ns track_ns(const kv_track *t)
{
    kv_ns ns = {.semantics = kv_semantics_byte((int)md_model_semantics(t->c->m)), .salt = t->salt};
    memcpy(ns.model, t->c->fp, KV_KEY_BYTES);
    return ns;
}

/* keys of blocks [nkeys, upto) from ids (the tracked tokens or a prompt) */
static int track_keys(kv_track *t, const int32_t *ids, size_t upto)
{
    if (upto > t->kcap) {
        size_t nc = t->kcap ? t->kcap : 16;
        while (nc < upto) nc *= 2;
        kv_key *p = realloc(t->keys, nc * sizeof *p);
        if (!p) return RC_ENOMEM;
        t->keys = p;
        t->kcap = nc;
    }
    kv_ns ns = track_ns(t);
    for (; t->nkeys < upto; t->nkeys++)
        kv_key_chain(t->nkeys ? &t->keys[t->nkeys - 1] : NULL, ids + t->nkeys * KV_BLOCK_TOKENS, KV_BLOCK_TOKENS, &ns,
                     &t->keys[t->nkeys]);
    return 0;
}

void kv_track_commit(kv_track *t, md_seq *s)
{
    kv_cache *c = t->c;
    if (t->quiet) return;
    const size_t full = md_seq_full_blocks(s);
    if (full > t->published) {
        if (t->tok.n < full * KV_BLOCK_TOKENS || track_keys(t, t->tok.v, full)) return;
        for (size_t i = t->published; i < full; i++) {
            md_block *b = md_seq_block(s, i);
            ent *e = map_find(&c->mem, &t->keys[i]);
            if (e) {
                map_touch(&c->mem, e);
                continue;
            }
            mem_put(c, &t->keys[i], b);
            if (c->store && !(b->tag & TAG_ON_DISK)) {
                if (!kv_store_put(c->store, t->keys[i].b, KIND_BLOCK, b->data, c->blk_bytes, c->cfg.ttl_s[t->cls]))
                    b->tag |= TAG_ON_DISK;
            }
            STAT(c, published_blocks, 1);
        }
        t->published = full;
    }
    const int64_t len = md_seq_len(s);
    if (len > 0 && len % KV_BLOCK_TOKENS == 0 && len != t->last_bnd && (size_t)(len / KV_BLOCK_TOKENS) == full) {
        rc_err err = {0};
        if (!md_seq_boundary_save(s, c->bnd_buf, c->bnd_bytes, &err)) {
            swa_put(c, &t->keys[full - 1], c->bnd_buf, c->bnd_bytes);
            t->last_bnd = len;
            STAT(c, published_swa, 1);
        }
    }
    stat_levels(c);
}

/* --------------------------------------------------------------- attach */

void kv_cache_attach(kv_cache *c, kv_track *t, md_seq *s, const int32_t *prompt, size_t n, kv_attach_result *res)
{
    memset(res, 0, sizeof *res);
    mem_evict(c);   /* sequences that ended since the last publish left blocks to evict */
    STAT(c, lookups, 1);
    STAT(c, lookup_tokens, n);
    const size_t nmax = n ? (n - 1) / KV_BLOCK_TOKENS : 0;  /* the last prompt token is always computed */
    if (!nmax) {
        res->path = KV_PATH_SHORT;
        STAT(c, path[KV_PATH_SHORT], 1);
        return;
    }
    if (track_keys(t, prompt, nmax)) { STAT(c, path[KV_PATH_MISS], 1); return; }
    md_block **blk = malloc(nmax * sizeof *blk);
    uint8_t *tiers = malloc(nmax);
    size_t h = 0;
    if (blk && tiers)
        for (; h < nmax; h++) {
            int tier = 0;
            if (!(blk[h] = block_get(c, &t->keys[h], &tier))) break;
            tiers[h] = (uint8_t)tier;
        }
    t->nkeys = h;   /* keys past the hit are recomputed as the state grows */

    /* the window state at the hit point, or one block before it, or a replay */
    const md_config *mc = md_model_config(c->m);
    size_t at = 0;
    const uint8_t *bnd = NULL;
    void *owned = NULL;
    size_t bl = 0;
    int64_t replay = 0;
    if (h) {
        /* window states exist at least every window_every blocks of a prefill */
        const size_t back = c->cfg.replay ? (size_t)kv_cache_window_every(c) : 64;
        size_t lo = h > back ? h - back : 1;
        for (size_t j = h; j >= lo && !bnd; j--) {
            bnd = swa_get(c, &t->keys[j - 1], &bl, &owned);
            if (bnd) at = j;
        }
        if (!bnd && c->cfg.replay) {
            replay = c->cfg.replay < mc->window ? mc->window : c->cfg.replay;
            if (replay > (int64_t)(h * KV_BLOCK_TOKENS)) replay = (int64_t)(h * KV_BLOCK_TOKENS);
            if (replay >= mc->window) at = h;
        }
    }
    rc_err err = {0};
    if (at && !md_seq_attach(s, blk, at, bnd, bl, bnd ? 0 : replay, &err)) {
        res->path = bnd ? KV_PATH_EXACT : KV_PATH_REPLAY;
        for (size_t i = 0; i < at; i++) res->blocks[tiers[i]]++;
        res->state_tokens = (size_t)md_seq_len(s);
        res->hit_tokens = res->state_tokens;
        if (!bnd && replay < c->cone && !c->cfg.publish_replayed) t->quiet = 1;
        /* the state holds prompt[0..state_tokens): the tracker knows them, and
         * the blocks up to `at` are in the cache already */
        kv_track_tokens(t, prompt, res->state_tokens);
        t->nkeys = at;
        t->published = at;
        /* exact: that window state is in the cache; replay: the replay
         * recomputes it, and an exact replay publishes it */
        t->last_bnd = bnd ? (int64_t)at * KV_BLOCK_TOKENS : -1;
    } else {
        res->path = KV_PATH_MISS;
        t->nkeys = 0;
    }
    free(owned);
    for (size_t i = 0; i < h; i++) md_block_unref(c->m, blk[i]);
    free(blk);
    free(tiers);
    pthread_mutex_lock(&c->smu);
    c->st.path[res->path]++;
    c->st.hit_tokens += res->hit_tokens;
    if (res->path == KV_PATH_REPLAY) c->st.replayed_tokens += (size_t)replay;
    for (int i = 0; i < 3; i++) c->st.block_hits[i] += res->blocks[i];
    pthread_mutex_unlock(&c->smu);
    stat_levels(c);
}

void kv_cache_get_stats(kv_cache *c, kv_cache_stats *out)
{
    pthread_mutex_lock(&c->smu);
    *out = c->st;
    pthread_mutex_unlock(&c->smu);
    if (c->store) {
        kv_store_stats ss;
        kv_store_get_stats(c->store, &ss);
        out->disk_files = ss.files;
        out->disk_bytes = ss.bytes;
        out->disk_write_errors = ss.write_errors;
        out->disk_damaged = ss.damaged;
        out->disk_dropped = ss.dropped;
    }
}
