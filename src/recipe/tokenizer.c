/* tokenizer.c - loading tokenizer.json, added-token matching, BPE, encode.
 *
 * Owns: the immutable rc_tokenizer (token bytes, byte->id, merge table, added
 * token tries), the per-thread BPE caches, serial and segmented-parallel
 * encoding.  Does not own: splitting text into pieces (pretok.c) or decoding
 * (decode.c).
 *
 * BPE works on raw bytes, not on the GPT-2 "byte-level" characters the JSON
 * stores: at load time every vocab string is mapped back to bytes, and each
 * merge "a b" becomes an entry (id_a, id_b) -> (rank, id_ab) in an open-
 * addressed table.  A piece then starts as one id per byte and repeatedly
 * merges its lowest-rank adjacent pair, leftmost first - the order HF uses.
 * Short pieces scan for the minimum; long ones use a heap, so a 1 MB word is
 * O(n log n), never quadratic. */
#include "recipe/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/pretok.h"
#include "recipe/unicode.h"
#include "recipe/tokenizer_internal.h"

/* ---------------------------------------------------------------- helpers */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = mix64(h ^ w) ;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    return mix64(h ^ w ^ ((uint64_t)n << 56));
}

/* GPT-2 byte<->char map: printable Latin-1 bytes map to themselves, the other
 * 68 bytes to U+0100.. in byte order. */
static void byte_level_map(uint32_t byte_to_cp[256]) {
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + k++);
    }
}

/* --------------------------------------------------------- merge table */

enum { ID_BITS = 21, RANK_BITS = 22 };
#define MERGE_EMPTY UINT64_MAX
#define MERGE_KEY_MASK ((1ull << (2 * ID_BITS)) - 1)

static inline uint64_t merge_key(int32_t a, int32_t b) {
    return ((uint64_t)(uint32_t)a << ID_BITS) | (uint32_t)b;
}

static inline uint32_t merge_slot(const rc_tokenizer *t, uint64_t key) {
    uint32_t i = (uint32_t)(mix64(key) & t->merge_mask);
    while (t->merges[i] != MERGE_EMPTY && (t->merges[i] & MERGE_KEY_MASK) != key)
        i = (i + 1) & t->merge_mask;
    return i;
}

/* rank of merging (a, b), or UINT32_MAX; *res gets the merged id */
static inline uint32_t merge_rank(const rc_tokenizer *t, int32_t a, int32_t b, int32_t *res) {
    uint64_t m = t->merges[merge_slot(t, merge_key(a, b))];
    if (m == MERGE_EMPTY) return UINT32_MAX;
    uint32_t rank = (uint32_t)(m >> (2 * ID_BITS));
    *res = t->merge_res[rank];
    return rank;
}

/* ------------------------------------------------------- added-token trie */

static int trie_add(rc_trie *tr, const uint8_t *s, size_t n, int32_t id) {
    uint32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t c = tr->nodes[node].child;
        while (c && tr->nodes[c].byte != s[k]) c = tr->nodes[c].sibling;
        if (!c) {
            if (tr->n == tr->cap) {
                size_t cap = tr->cap ? tr->cap * 2 : 256;
                rc_trie_node *nn = realloc(tr->nodes, cap * sizeof *nn);
                if (!nn) return RC_ENOMEM;
                tr->nodes = nn;
                tr->cap = cap;
            }
            c = (uint32_t)tr->n++;
            tr->nodes[c] = (rc_trie_node){.byte = s[k], .id = -1,
                                          .sibling = tr->nodes[node].child};
            tr->nodes[node].child = c;
        }
        node = c;
    }
    tr->nodes[node].id = id;
    tr->first[s[0]] = 1;
    return 0;
}

static int trie_init(rc_trie *tr) {
    memset(tr, 0, sizeof *tr);
    tr->cap = 256;
    tr->nodes = calloc(tr->cap, sizeof *tr->nodes);
    if (!tr->nodes) return RC_ENOMEM;
    tr->nodes[0].id = -1;
    tr->n = 1;
    return 0;
}

/* longest token starting at s[0..n): its length, id in *id; 0 if none */
static size_t trie_longest(const rc_trie *tr, const uint8_t *s, size_t n, int32_t *id) {
    uint32_t node = 0;
    size_t best = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t c = tr->nodes[node].child;
        while (c && tr->nodes[c].byte != s[k]) c = tr->nodes[c].sibling;
        if (!c) break;
        node = c;
        if (tr->nodes[node].id >= 0) {
            best = k + 1;
            *id = tr->nodes[node].id;
        }
    }
    return best;
}

/* ------------------------------------------------------------- loading */

static int check_pretokenizer(json_t *pt, const char **why) {
    /* The only pre-tokenizer we implement is DeepSeek's exact sequence. */
    if (!json_is_object(pt) || strcmp(json_string_value(json_object_get(pt, "type")) ?: "", "Sequence")) {
        *why = "pre_tokenizer must be a Sequence";
        return -1;
    }
    json_t *arr = json_object_get(pt, "pretokenizers");
    if (!json_is_array(arr) || json_array_size(arr) != 4) {
        *why = "pre_tokenizer must be 3 Split regexes + ByteLevel (DeepSeek V3/V4 layout)";
        return -1;
    }
    for (size_t i = 0; i < 3; i++) {
        json_t *sp = json_array_get(arr, i);
        const char *ty = json_string_value(json_object_get(sp, "type"));
        const char *beh = json_string_value(json_object_get(sp, "behavior"));
        const char *rx = json_string_value(json_object_get(json_object_get(sp, "pattern"), "Regex"));
        if (!ty || strcmp(ty, "Split") || !beh || strcmp(beh, "Isolated") ||
            json_is_true(json_object_get(sp, "invert"))) {
            *why = "pre_tokenizer Split must be Isolated and not inverted";
            return -1;
        }
        if (!rx || strcmp(rx, rc_pretok_patterns[i])) {
            *why = "pre_tokenizer regex differs from the DeepSeek V3/V4 patterns (other regexes are "
                   "not implemented)";
            return -1;
        }
    }
    json_t *bl = json_array_get(arr, 3);
    const char *ty = json_string_value(json_object_get(bl, "type"));
    if (!ty || strcmp(ty, "ByteLevel") || json_is_true(json_object_get(bl, "add_prefix_space")) ||
        json_is_true(json_object_get(bl, "use_regex"))) {
        *why = "last pre_tokenizer must be ByteLevel(add_prefix_space=false, use_regex=false)";
        return -1;
    }
    return 0;
}

static int bpe(const rc_tokenizer *t, rc_bpe_cache *c, const uint8_t *p, size_t n, rc_ids *out);
static void cache_destroy(void *p);
enum { WHOLE_MAX_PIECE = 64 };

static inline uint32_t whole_tag(uint64_t h) { return (uint32_t)(h >> 32) | 1; }

/* id of the single token BPE turns piece p into, or -1 */
static inline int32_t whole_lookup(const rc_tokenizer *t, const uint8_t *p, size_t n, uint64_t h) {
    uint32_t tag = whole_tag(h);
    for (uint32_t i = (uint32_t)h & t->whole_mask;; i = (i + 1) & t->whole_mask) {
        uint64_t e = t->whole[i];
        if (!e) return -1;
        if ((uint32_t)(e >> 32) == tag) {
            int32_t id = (int32_t)(uint32_t)e;
            if (t->tok_len[id] == n && !memcmp(t->bytes + t->tok_off[id], p, n)) return id;
        }
    }
}

static int build_whole_table(rc_tokenizer *t, rc_err *err) {
    size_t slots = 1;
    while (slots < (size_t)t->n_ids * 2) slots <<= 1;
    t->whole = calloc(slots, sizeof *t->whole);
    rc_bpe_cache *c = calloc(1, sizeof *c);
    if (!t->whole || !c) {
        free(c);
        return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    t->whole_mask = (uint32_t)(slots - 1);
    rc_ids out = {0};
    int rc = 0;
    for (int32_t id = 0; id < t->n_ids && !rc; id++) {
        uint32_t n = t->tok_len[id];
        if (t->is_added[id] || n == UINT32_MAX || n < 2 || n > WHOLE_MAX_PIECE) continue;
        const uint8_t *p = (const uint8_t *)t->bytes + t->tok_off[id];
        out.n = 0;
        if ((rc = bpe(t, c, p, n, &out))) break;
        if (out.n != 1 || out.v[0] != id) continue; /* BPE never reaches this token whole */
        uint64_t h = hash_bytes(p, n);
        uint32_t i = (uint32_t)h & t->whole_mask;
        while (t->whole[i]) i = (i + 1) & t->whole_mask;
        t->whole[i] = ((uint64_t)whole_tag(h) << 32) | (uint32_t)id;
    }
    rc_ids_free(&out);
    cache_destroy(c);
    return rc ? rc_errf(err, RC_ENOMEM, "out of memory") : 0;
}

static int parse_tokenizer(rc_tokenizer *t, json_t *root, rc_err *err) {
    const char *why = NULL;
    json_t *model = json_object_get(root, "model");
    const char *mty = json_string_value(json_object_get(model, "type"));
    if (!mty || strcmp(mty, "BPE"))
        return rc_errf(err, RC_EUNSUP, "tokenizer.json: model type %s is not supported (need BPE)",
                       mty ? mty : "(missing)");
    if (json_is_true(json_object_get(model, "byte_fallback")) ||
        json_is_true(json_object_get(model, "ignore_merges")) ||
        json_is_string(json_object_get(model, "continuing_subword_prefix")) ||
        json_is_string(json_object_get(model, "end_of_word_suffix")) ||
        (json_object_get(model, "dropout") && !json_is_null(json_object_get(model, "dropout"))))
        return rc_errf(err, RC_EUNSUP,
                       "tokenizer.json: BPE options byte_fallback/ignore_merges/"
                       "continuing_subword_prefix/end_of_word_suffix/dropout are not supported");
    json_t *norm = json_object_get(root, "normalizer");
    if (norm && !json_is_null(norm)) {
        const char *nty = json_string_value(json_object_get(norm, "type"));
        json_t *list = json_object_get(norm, "normalizers");
        if (!nty || strcmp(nty, "Sequence") || json_array_size(list) != 0)
            return rc_errf(err, RC_EUNSUP,
                           "tokenizer.json: normalizer %s is not implemented (only none or an empty "
                           "Sequence)",
                           nty ? nty : "?");
    }
    if (check_pretokenizer(json_object_get(root, "pre_tokenizer"), &why))
        return rc_errf(err, RC_EUNSUP, "tokenizer.json: %s", why);
    json_t *dec = json_object_get(root, "decoder");
    const char *dty = json_string_value(json_object_get(dec, "type"));
    if (!dty || strcmp(dty, "ByteLevel"))
        return rc_errf(err, RC_EUNSUP, "tokenizer.json: decoder %s is not supported (need ByteLevel)",
                       dty ? dty : "(missing)");
    json_t *pp = json_object_get(root, "post_processor");
    const char *pty = json_string_value(json_object_get(pp, "type"));
    if (pp && !json_is_null(pp) && (!pty || strcmp(pty, "ByteLevel")))
        return rc_errf(err, RC_EUNSUP,
                       "tokenizer.json: post_processor %s is not supported (BOS/EOS are written by "
                       "the prompt renderer, not the tokenizer)",
                       pty ? pty : "?");

    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return rc_errf(err, RC_EINVAL, "tokenizer.json: model.vocab / model.merges missing");

    /* id space */
    int64_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) > 0x3FFFFFFF)
            return rc_errf(err, RC_EINVAL, "tokenizer.json: vocab id of \"%.64s\" is not a valid id", key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t ai;
    json_t *at;
    json_array_foreach(added, ai, at) {
        json_t *id = json_object_get(at, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) > 0x3FFFFFFF)
            return rc_errf(err, RC_EINVAL, "tokenizer.json: added_tokens[%zu].id invalid", ai);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    t->n_ids = (int32_t)(max_id + 1);
    t->tok_off = calloc((size_t)t->n_ids + 1, sizeof *t->tok_off);
    t->tok_len = calloc((size_t)t->n_ids, sizeof *t->tok_len);
    t->is_added = calloc((size_t)t->n_ids, 1);
    if (!t->tok_off || !t->tok_len || !t->is_added) return rc_errf(err, RC_ENOMEM, "out of memory");
    for (int32_t i = 0; i < t->n_ids; i++) t->tok_len[i] = UINT32_MAX; /* "no such id" */

    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[512];
    byte_level_map(byte_to_cp);
    memset(cp_to_byte, -1, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;

    json_array_foreach(added, ai, at) t->is_added[json_integer_value(json_object_get(at, "id"))] = 1;

    /* vocab strings -> raw bytes, in one arena; ids that are also added tokens
     * (BOS/EOS/pad) take their added content instead */
    rc_bytes arena = {0};
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        if (t->is_added[id]) continue;
        if (t->tok_len[id] != UINT32_MAX) {
            rc_bytes_free(&arena);
            return rc_errf(err, RC_EINVAL, "tokenizer.json: vocab id %d used twice", id);
        }
        size_t off = arena.n, klen = strlen(key);
        for (size_t k = 0; k < klen;) {
            int step = rc_utf8_step((const uint8_t *)key + k, klen - k);
            uint32_t cp;
            if (step <= 0) {
                rc_bytes_free(&arena);
                return rc_errf(err, RC_EINVAL, "tokenizer.json: vocab entry is not UTF-8");
            }
            rc_utf8_next((const uint8_t *)key + k, &cp);
            if (cp >= 512 || cp_to_byte[cp] < 0) {
                rc_bytes_free(&arena);
                return rc_errf(err, RC_EUNSUP,
                               "tokenizer.json: vocab entry \"%.64s\" (id %d) is not byte-level "
                               "encoded",
                               key, id);
            }
            uint8_t b = (uint8_t)cp_to_byte[cp];
            if (rc_bytes_append(&arena, &b, 1)) return rc_errf(err, RC_ENOMEM, "out of memory");
            k += (size_t)step;
        }
        t->tok_off[id] = (uint32_t)off;
        t->tok_len[id] = (uint32_t)(arena.n - off);
        if (arena.n - off == 1) t->byte_id[(uint8_t)arena.v[off]] = id;
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0) {
            rc_bytes_free(&arena);
            return rc_errf(err, RC_EUNSUP, "tokenizer.json: no vocab entry for byte 0x%02X", b);
        }

    /* added tokens: their content is their text; they override vocab ids */
    if (trie_init(&t->trie_raw) || trie_init(&t->trie_norm)) {
        rc_bytes_free(&arena);
        return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    json_array_foreach(added, ai, at) {
        int32_t id = (int32_t)json_integer_value(json_object_get(at, "id"));
        const char *content = json_string_value(json_object_get(at, "content"));
        if (!content || !*content) {
            rc_bytes_free(&arena);
            return rc_errf(err, RC_EINVAL, "tokenizer.json: added_tokens[%zu] has no content", ai);
        }
        if (json_is_true(json_object_get(at, "lstrip")) || json_is_true(json_object_get(at, "rstrip")) ||
            json_is_true(json_object_get(at, "single_word"))) {
            rc_bytes_free(&arena);
            return rc_errf(err, RC_EUNSUP,
                           "tokenizer.json: added token \"%.64s\" uses lstrip/rstrip/single_word, "
                           "which is not implemented",
                           content);
        }
        size_t off = arena.n, clen = strlen(content);
        if (rc_bytes_append(&arena, content, clen)) return rc_errf(err, RC_ENOMEM, "out of memory");
        t->tok_off[id] = (uint32_t)off;
        t->tok_len[id] = (uint32_t)clen;
        t->is_added[id] = 1;
        /* HF extracts non-normalized tokens first, then normalized ones from
         * what is left; with an empty normalizer only the order differs. */
        rc_trie *tr = json_is_true(json_object_get(at, "normalized")) ? &t->trie_norm : &t->trie_raw;
        if (trie_add(tr, (const uint8_t *)content, clen, id)) {
            rc_bytes_free(&arena);
            return rc_errf(err, RC_ENOMEM, "out of memory");
        }
        t->n_added++;
    }
    t->bytes = arena.v;
    t->bytes_len = arena.n;
    if (!t->bytes) t->bytes = calloc(1, 1);

    /* content -> id index over the vocab strings (raw bytes) for merges */
    size_t nslots = 1;
    while (nslots < (size_t)t->n_ids * 2) nslots <<= 1;
    int32_t *vindex = malloc(nslots * sizeof *vindex);
    if (!vindex) return rc_errf(err, RC_ENOMEM, "out of memory");
    memset(vindex, -1, nslots * sizeof *vindex);
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        const uint8_t *p = (const uint8_t *)t->bytes + t->tok_off[id];
        if (t->is_added[id]) continue;
        size_t h = hash_bytes(p, t->tok_len[id]) & (nslots - 1);
        while (vindex[h] >= 0) h = (h + 1) & (nslots - 1);
        vindex[h] = id;
    }

    size_t nm = json_array_size(merges);
    size_t mslots = 1;
    while (mslots < nm * 2 + 2) mslots <<= 1;
    t->merge_mask = (uint32_t)(mslots - 1);
    if (t->n_ids > (1 << ID_BITS) || nm >= (1u << RANK_BITS) - 1) {
        free(vindex);
        return rc_errf(err, RC_EUNSUP, "tokenizer.json: more than %d ids or %d merges is not supported",
                       1 << ID_BITS, (1 << RANK_BITS) - 2);
    }
    t->merges = malloc(mslots * sizeof *t->merges);
    t->merge_res = malloc((nm + 1) * sizeof *t->merge_res);
    if (!t->merges || !t->merge_res) {
        free(vindex);
        return rc_errf(err, RC_ENOMEM, "out of memory");
    }
    memset(t->merges, 0xFF, mslots * sizeof *t->merges);

    /* map a byte-level string (JSON form) to an id via the raw-bytes index */
    uint8_t buf[1024];
    for (size_t r = 0; r < nm; r++) {
        json_t *m = json_array_get(merges, r);
        const char *parts[2] = {NULL, NULL};
        size_t plen[2] = {0, 0};
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (sp) {
                parts[0] = s;
                plen[0] = (size_t)(sp - s);
                parts[1] = sp + 1;
                plen[1] = strlen(sp + 1);
            }
        } else if (json_is_array(m) && json_array_size(m) == 2) {
            for (int k = 0; k < 2; k++) {
                parts[k] = json_string_value(json_array_get(m, (size_t)k));
                plen[k] = parts[k] ? strlen(parts[k]) : 0;
            }
        }
        if (!parts[0] || !parts[1]) {
            free(vindex);
            return rc_errf(err, RC_EINVAL, "tokenizer.json: merges[%zu] is malformed", r);
        }
        int32_t ids[3];
        size_t blen = 0;
        for (int k = 0; k < 2; k++) {
            size_t start = blen;
            for (size_t q = 0; q < plen[k];) {
                uint32_t cp;
                int step = rc_utf8_step((const uint8_t *)parts[k] + q, plen[k] - q);
                if (step <= 0) break;
                rc_utf8_next((const uint8_t *)parts[k] + q, &cp);
                if (cp >= 512 || cp_to_byte[cp] < 0 || blen >= sizeof buf) {
                    blen = SIZE_MAX;
                    break;
                }
                buf[blen++] = (uint8_t)cp_to_byte[cp];
                q += (size_t)step;
            }
            if (blen == SIZE_MAX) break;
            ids[k] = -1;
            size_t h = hash_bytes(buf + start, blen - start) & (nslots - 1);
            for (; vindex[h] >= 0; h = (h + 1) & (nslots - 1)) {
                int32_t id = vindex[h];
                if (t->tok_len[id] == blen - start &&
                    !memcmp(t->bytes + t->tok_off[id], buf + start, blen - start)) {
                    ids[k] = id;
                    break;
                }
            }
        }
        ids[2] = -1;
        if (blen != SIZE_MAX) {
            size_t h = hash_bytes(buf, blen) & (nslots - 1);
            for (; vindex[h] >= 0; h = (h + 1) & (nslots - 1)) {
                int32_t id = vindex[h];
                if (t->tok_len[id] == blen && !memcmp(t->bytes + t->tok_off[id], buf, blen)) {
                    ids[2] = id;
                    break;
                }
            }
        }
        if (blen == SIZE_MAX || ids[0] < 0 || ids[1] < 0 || ids[2] < 0) {
            free(vindex);
            return rc_errf(err, RC_EINVAL,
                           "tokenizer.json: merges[%zu] refers to a token not in the vocab", r);
        }
        uint64_t key = merge_key(ids[0], ids[1]);
        uint64_t *mg = &t->merges[merge_slot(t, key)];
        t->merge_res[r] = ids[2];
        if (*mg != MERGE_EMPTY) continue; /* duplicate: first rank wins */
        *mg = key | ((uint64_t)r << (2 * ID_BITS));
    }
    free(vindex);
    t->n_merges = nm;
    return build_whole_table(t, err);
}

static int tokenizer_init(rc_tokenizer **out, rc_tokenizer **t) {
    *out = NULL;
    *t = calloc(1, sizeof **t);
    if (!*t) return RC_ENOMEM;
    if (pthread_key_create(&(*t)->cache_key, cache_destroy)) {
        free(*t);
        *t = NULL;
        return RC_ENOMEM;
    }
    pthread_mutex_init(&(*t)->cache_mu, NULL);
    return 0;
}

int rc_tokenizer_load_mem(const char *json, size_t len, rc_tokenizer **out, rc_err *err) {
    rc_tokenizer *t;
    if (tokenizer_init(out, &t)) return rc_errf(err, RC_ENOMEM, "out of memory");
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) {
        rc_tokenizer_free(t);
        return rc_errf(err, RC_EINVAL, "tokenizer.json: JSON error at line %d: %s", je.line, je.text);
    }
    int rc = parse_tokenizer(t, root, err);
    json_decref(root);
    if (rc) {
        rc_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

int rc_tokenizer_load(const char *path, rc_tokenizer **out, rc_err *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return rc_errf(err, RC_EIO, "cannot open tokenizer file %s", path);
    rc_bytes b = {0};
    char chunk[1 << 16];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (rc_bytes_append(&b, chunk, n)) {
            fclose(f);
            rc_bytes_free(&b);
            return rc_errf(err, RC_ENOMEM, "out of memory reading %s", path);
        }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        rc_bytes_free(&b);
        return rc_errf(err, RC_EIO, "read error on %s", path);
    }
    int rc = rc_tokenizer_load_mem(b.v ? b.v : "", b.n, out, err);
    rc_bytes_free(&b);
    if (rc && err) {
        size_t used = strlen(err->msg);
        snprintf(err->msg + used, sizeof err->msg - used, " (%.200s)", path);
    }
    return rc;
}

void rc_tokenizer_free(rc_tokenizer *t) {
    if (!t) return;
    /* caches of threads still alive are owned through the list */
    pthread_key_delete(t->cache_key);
    rc_bpe_cache *c = t->caches;
    while (c) {
        rc_bpe_cache *nx = c->next_cache;
        c->owner = NULL;
        cache_destroy(c);
        c = nx;
    }
    pthread_mutex_destroy(&t->cache_mu);
    free(t->tok_off);
    free(t->tok_len);
    free(t->is_added);
    free(t->bytes);
    free(t->merges);
    free(t->merge_res);
    free(t->whole);
    free(t->trie_raw.nodes);
    free(t->trie_norm.nodes);
    free(t);
}

int32_t rc_tokenizer_n_ids(const rc_tokenizer *t) { return t->n_ids; }

int rc_tokenizer_is_added(const rc_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->is_added[id];
}

const char *rc_tokenizer_token_bytes(const rc_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] == UINT32_MAX) return NULL;
    *len = t->tok_len[id];
    return t->bytes + t->tok_off[id];
}

int32_t rc_tokenizer_added_id(const rc_tokenizer *t, const char *content) {
    size_t n = strlen(content);
    int32_t id = -1;
    for (int pass = 0; pass < 2; pass++) {
        const rc_trie *tr = pass ? &t->trie_norm : &t->trie_raw;
        if (tr->n && trie_longest(tr, (const uint8_t *)content, n, &id) == n) return id;
    }
    return -1;
}

/* ------------------------------------------------------------ BPE cache */

/* Per-thread memo of piece -> ids (pieces BPE splits into several tokens;
 * single-token pieces are in the shared `whole` table).  It starts small and
 * doubles, so a new thread does not fault in megabytes before its first
 * answer; at its cap it is cleared when full, which keeps adversarial input
 * (all-unique pieces) from growing memory. */
enum {
    CACHE_SLOTS_MIN = 1 << 12,
    CACHE_SLOTS = 1 << 17,
    CACHE_MAX_PIECE = 64,
    CACHE_MAX_ENTRIES = CACHE_SLOTS * 5 / 8
};

static void cache_destroy(void *p) {
    rc_bpe_cache *c = p;
    if (!c) return;
    rc_tokenizer *t = c->owner;
    if (t) { /* thread exit: unlink from the owner's list */
        pthread_mutex_lock(&t->cache_mu);
        for (rc_bpe_cache **pp = &t->caches; *pp; pp = &(*pp)->next_cache)
            if (*pp == c) {
                *pp = c->next_cache;
                break;
            }
        pthread_mutex_unlock(&t->cache_mu);
    }
    free(c->slots);
    free(c->keys);
    free(c->vals);
    free(c->w_id);
    free(c->w_prev);
    free(c->w_next);
    free(c->w_rank);
    free(c->w_res);
    free(c->heap);
    free(c);
}

static rc_bpe_cache *cache_get(const rc_tokenizer *tc) {
    rc_tokenizer *t = (rc_tokenizer *)tc; /* caches are the one mutable part */
    rc_bpe_cache *c = pthread_getspecific(t->cache_key);
    if (c) return c;
    c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nslots = CACHE_SLOTS_MIN;
    c->slots = calloc(c->nslots, sizeof *c->slots);
    if (!c->slots) {
        free(c);
        return NULL;
    }
    c->owner = t;
    pthread_mutex_lock(&t->cache_mu);
    c->next_cache = t->caches;
    t->caches = c;
    pthread_mutex_unlock(&t->cache_mu);
    pthread_setspecific(t->cache_key, c);
    return c;
}

static void cache_clear(rc_bpe_cache *c) {
    memset(c->slots, 0, c->nslots * sizeof *c->slots);
    c->nkeys = c->nvals = c->nentries = 0;
}

void rc_tokenizer_drop_caches(rc_tokenizer *t) {
    pthread_mutex_lock(&t->cache_mu);
    for (rc_bpe_cache *c = t->caches; c; c = c->next_cache) cache_clear(c);
    pthread_mutex_unlock(&t->cache_mu);
}

static size_t cache_probe(const rc_bpe_cache *c, uint64_t h) {
    size_t s = h & (c->nslots - 1);
    while (c->slots[s].tag) s = (s + 1) & (c->nslots - 1);
    return s;
}

/* make room for one more entry: double the table, or clear it at the cap */
static void cache_make_room(rc_bpe_cache *c) {
    if (c->nentries + 1 <= c->nslots * 5 / 8) return;
    if (c->nslots >= CACHE_SLOTS) {
        cache_clear(c);
        return;
    }
    rc_cache_slot *old = c->slots;
    size_t oldn = c->nslots;
    rc_cache_slot *ns = calloc(oldn * 2, sizeof *ns);
    if (!ns) {
        cache_clear(c); /* cannot grow: forget instead, still correct */
        return;
    }
    c->slots = ns;
    c->nslots = oldn * 2;
    for (size_t i = 0; i < oldn; i++)
        if (old[i].tag) c->slots[cache_probe(c, hash_bytes(c->keys + old[i].koff, old[i].klen))] = old[i];
    free(old);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 256;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np) return RC_ENOMEM;
    *p = np;
    *cap = nc;
    return 0;
}

/* ------------------------------------------------------------------ BPE */

static int work_reserve(rc_bpe_cache *c, size_t n) {
    if (n <= c->w_cap) return 0;
    size_t cap = c->w_cap ? c->w_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(c->w_id, cap * sizeof *a);
    if (!a) return RC_ENOMEM;
    c->w_id = a;
    if (!(a = realloc(c->w_prev, cap * sizeof *a))) return RC_ENOMEM;
    c->w_prev = a;
    if (!(a = realloc(c->w_next, cap * sizeof *a))) return RC_ENOMEM;
    c->w_next = a;
    if (!(a = realloc(c->w_res, cap * sizeof *a))) return RC_ENOMEM;
    c->w_res = a;
    uint32_t *r = realloc(c->w_rank, cap * sizeof *r);
    if (!r) return RC_ENOMEM;
    c->w_rank = r;
    uint64_t *h = realloc(c->heap, cap * 2 * sizeof *h);
    if (!h) return RC_ENOMEM;
    c->heap = h;
    c->w_cap = cap;
    return 0;
}

static inline void set_rank(const rc_tokenizer *t, rc_bpe_cache *c, int32_t i) {
    int32_t j = c->w_next[i];
    c->w_rank[i] = j < 0 ? UINT32_MAX : merge_rank(t, c->w_id[i], c->w_id[j], &c->w_res[i]);
}

static inline void merge_at(const rc_tokenizer *t, rc_bpe_cache *c, int32_t i) {
    int32_t j = c->w_next[i];
    c->w_id[i] = c->w_res[i];
    c->w_next[i] = c->w_next[j];
    if (c->w_next[j] >= 0) c->w_prev[c->w_next[j]] = i;
    c->w_id[j] = -1; /* dead */
    set_rank(t, c, i);
    if (c->w_prev[i] >= 0) set_rank(t, c, c->w_prev[i]);
}

/* heap of (rank << 32 | pos): pops lowest rank, then leftmost position */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l >= *n) break;
        m = (l + 1 < *n && h[l + 1] < h[l]) ? l + 1 : l;
        if (h[m] >= v) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = v;
    return top;
}

/* BPE one piece, append ids to out */
static int bpe(const rc_tokenizer *t, rc_bpe_cache *c, const uint8_t *p, size_t n, rc_ids *out) {
    if (work_reserve(c, n)) return RC_ENOMEM;
    int32_t *id = c->w_id;
    for (size_t i = 0; i < n; i++) {
        id[i] = t->byte_id[p[i]];
        c->w_prev[i] = (int32_t)i - 1;
        c->w_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i < n; i++) set_rank(t, c, (int32_t)i);
    if (n <= 48) {
        for (;;) { /* scan for the lowest rank; ties go to the leftmost */
            uint32_t best = UINT32_MAX;
            int32_t bi = -1;
            for (int32_t i = 0; i >= 0; i = c->w_next[i])
                if (c->w_rank[i] < best) {
                    best = c->w_rank[i];
                    bi = i;
                }
            if (bi < 0) break;
            merge_at(t, c, bi);
        }
    } else {
        size_t hn = 0;
        for (size_t i = 0; i < n; i++)
            if (c->w_rank[i] != UINT32_MAX)
                heap_push(c->heap, &hn, ((uint64_t)c->w_rank[i] << 32) | i);
        while (hn) {
            uint64_t top = heap_pop(c->heap, &hn);
            int32_t i = (int32_t)(top & 0xFFFFFFFFu);
            uint32_t r = (uint32_t)(top >> 32);
            /* stale entry: position merged away or its pair changed */
            if (c->w_id[i] < 0 || c->w_rank[i] != r) continue;
            merge_at(t, c, i);
            if (c->w_rank[i] != UINT32_MAX) heap_push(c->heap, &hn, ((uint64_t)c->w_rank[i] << 32) | (uint32_t)i);
            int32_t pv = c->w_prev[i];
            if (pv >= 0 && c->w_rank[pv] != UINT32_MAX)
                heap_push(c->heap, &hn, ((uint64_t)c->w_rank[pv] << 32) | (uint32_t)pv);
        }
    }
    for (int32_t i = 0; i >= 0; i = c->w_next[i])
        if (rc_ids_push(out, id[i])) return RC_ENOMEM;
    return 0;
}

/* ------------------------------------------------------------- encoding */

typedef struct {
    const rc_tokenizer *t;
    rc_bpe_cache *c;
    rc_ids *out;
    int rc;
} enc_ctx;

static void on_piece(void *vp, const uint8_t *p, size_t n) {
    enc_ctx *x = vp;
    if (x->rc) return;
    if (n == 1) {
        if (rc_ids_push(x->out, x->t->byte_id[p[0]])) x->rc = RC_ENOMEM;
        return;
    }
    rc_bpe_cache *c = x->c;
    if (n > CACHE_MAX_PIECE) {
        x->rc = bpe(x->t, c, p, n, x->out);
        return;
    }
    uint64_t h = hash_bytes(p, n);
    int32_t one = whole_lookup(x->t, p, n, h);
    if (one >= 0) {
        if (rc_ids_push(x->out, one)) x->rc = RC_ENOMEM;
        return;
    }
    uint32_t tag = (uint32_t)(h >> 32) | 1; /* 0 marks an empty slot */
    for (size_t s = h & (c->nslots - 1);; s = (s + 1) & (c->nslots - 1)) {
        rc_cache_slot *sl = &c->slots[s];
        if (!sl->tag) break;
        if (sl->tag == tag && sl->klen == n && !memcmp(c->keys + sl->koff, p, n)) {
            if (rc_ids_append(x->out, c->vals + sl->voff, sl->vlen)) x->rc = RC_ENOMEM;
            return;
        }
    }
    size_t before = x->out->n;
    if ((x->rc = bpe(x->t, c, p, n, x->out))) return;
    size_t nv = x->out->n - before;
    cache_make_room(c);
    size_t s = cache_probe(c, h);
    if (grow((void **)&c->keys, &c->kcap, c->nkeys + n, 1) ||
        grow((void **)&c->vals, &c->vcap, c->nvals + nv, sizeof *c->vals))
        return; /* no room to memoise: the result is still correct */
    memcpy(c->keys + c->nkeys, p, n);
    memcpy(c->vals + c->nvals, x->out->v + before, nv * sizeof *c->vals);
    c->slots[s] = (rc_cache_slot){.tag = tag, .koff = (uint32_t)c->nkeys, .klen = (uint16_t)n,
                                  .voff = (uint32_t)c->nvals, .vlen = (uint16_t)nv};
    c->nkeys += n;
    c->nvals += nv;
    c->nentries++;
}

/* content-mode encoding of valid UTF-8 */
int rc_encode_content_span(const rc_tokenizer *t, const uint8_t *s, size_t n, rc_ids *out) {
    enc_ctx x = {.t = t, .c = cache_get(t), .out = out};
    if (!x.c) return RC_ENOMEM;
    rc_pretok_split(s, n, on_piece, &x);
    return x.rc;
}

/* Split template text into spans: added tokens (id >= 0) and text (id < 0),
 * the way HF does - leftmost-longest over non-normalized tokens, then the
 * same over normalized tokens inside what is left. */
static int split_pass(const rc_trie *tr, const uint8_t *s, size_t b, size_t e, rc_span **sp,
                      size_t *nsp, size_t *cap) {
    size_t i = b, gap = b;
    while (i < e) {
        int32_t id;
        size_t m = tr->first[s[i]] ? trie_longest(tr, s + i, e - i, &id) : 0;
        if (!m) {
            i++;
            continue;
        }
        if (grow((void **)sp, cap, *nsp + 2, sizeof **sp)) return RC_ENOMEM;
        if (gap < i) (*sp)[(*nsp)++] = (rc_span){.off = gap, .len = i - gap, .id = -1};
        (*sp)[(*nsp)++] = (rc_span){.off = i, .len = m, .id = id};
        i = gap = i + m;
    }
    if (gap < e) {
        if (grow((void **)sp, cap, *nsp + 1, sizeof **sp)) return RC_ENOMEM;
        (*sp)[(*nsp)++] = (rc_span){.off = gap, .len = e - gap, .id = -1};
    }
    return 0;
}

int rc_split_added(const rc_tokenizer *t, const uint8_t *s, size_t n, rc_span **out, size_t *nout) {
    rc_span *a = NULL, *b = NULL;
    size_t na = 0, ca = 0, nb = 0, cb = 0;
    int rc = split_pass(&t->trie_raw, s, 0, n, &a, &na, &ca);
    for (size_t k = 0; !rc && k < na; k++) {
        if (a[k].id >= 0) {
            if ((rc = grow((void **)&b, &cb, nb + 1, sizeof *b))) break;
            b[nb++] = a[k];
        } else {
            rc = split_pass(&t->trie_norm, s, a[k].off, a[k].off + a[k].len, &b, &nb, &cb);
        }
    }
    free(a);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    *nout = nb;
    return 0;
}

int rc_check_utf8(const char *text, size_t len, rc_err *err) {
    size_t ok = rc_utf8_valid_prefix((const uint8_t *)text, len);
    if (ok != len)
        return rc_errf(err, RC_EINVAL, "input is not valid UTF-8 (ill-formed byte 0x%02X at offset %zu)",
                       (uint8_t)text[ok], ok);
    return 0;
}

int rc_tokenizer_encode(const rc_tokenizer *t, const char *text, size_t len, enum rc_encode_mode mode,
                        rc_ids *out, rc_err *err) {
    int rc = rc_check_utf8(text, len, err);
    if (rc) return rc;
    const uint8_t *s = (const uint8_t *)text;
    if (mode == RC_ENCODE_CONTENT) {
        rc = rc_encode_content_span(t, s, len, out);
        return rc ? rc_errf(err, rc, "tokenizer: out of memory") : 0;
    }
    rc_span *sp;
    size_t nsp;
    if ((rc = rc_split_added(t, s, len, &sp, &nsp))) return rc_errf(err, rc, "tokenizer: out of memory");
    for (size_t k = 0; !rc && k < nsp; k++)
        rc = sp[k].id >= 0 ? rc_ids_push(out, sp[k].id)
                           : rc_encode_content_span(t, s + sp[k].off, sp[k].len, out);
    free(sp);
    return rc ? rc_errf(err, rc, "tokenizer: out of memory") : 0;
}
