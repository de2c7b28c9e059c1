/* safetensors.c - checkpoint files: header validation, shards, name table.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
 * {...}}), then the data section that the offsets index.  md_st_parse checks
 * everything a later reader would otherwise trust (sizes, ranges, overlaps),
 * so the engine can index tensor data without further bounds checks.
 *
 * A checkpoint is one file or an index (model.safetensors.index.json) whose
 * weight_map names the shard of every tensor; the index and the shards must
 * agree exactly (every listed tensor is in its shard, every shard tensor is
 * listed).  Files are mmapped read-only and never copied; the table of all
 * tensors is an array in file order plus an open-addressing hash of the
 * normalized names.  This file knows nothing about which tensors a model
 * needs: that check (unknown and missing names, shapes from the config)
 * belongs to the model loader, which calls md_ckpt_get. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- names */

int md_st_normalize(const char *raw, char *out, size_t cap) {
    static const struct {
        const char *from, *to;
    } map[] = {
        {"embed_tokens.weight", "embed.weight"}, {"hc_head.hc_fn", "hc_head_fn"},
        {"hc_head.hc_base", "hc_head_base"},     {"hc_head.hc_scale", "hc_head_scale"},
        {"lm_head.weight", "head.weight"},
    };
    const char *s = raw;
    if (strncmp(s, "model.", 6) == 0) s += 6;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i].from) == 0) {
            s = map[i].to;
            break;
        }
    size_t n = strlen(s);
    if (n + 1 > cap) return -1;
    memcpy(out, s, n + 1);
    return (int)n;
}

/* ---- one header */

static int get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* Fill t from one header entry.  data/data_len: the data section. */
static int parse_entry(const char *fname, const char *key, const json_t *e, const uint8_t *data,
                       uint64_t data_len, md_tensor *t, rc_err *err) {
    if (!json_is_object(e))
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': entry is not an object", fname, key);
    const json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
                 *off = json_object_get(e, "data_offsets");
    if (!dt) return rc_errf(err, RC_EINVAL, "%s: tensor '%s': missing dtype", fname, key);
    if (!sh) return rc_errf(err, RC_EINVAL, "%s: tensor '%s': missing shape", fname, key);
    if (!off) return rc_errf(err, RC_EINVAL, "%s: tensor '%s': missing data_offsets", fname, key);
    if (!json_is_string(dt))
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': dtype is not a string", fname, key);
    if (md_dtype_parse(json_string_value(dt), &t->dtype))
        return rc_errf(err, RC_EUNSUP, "%s: tensor '%s': unknown dtype '%s'", fname, key,
                       json_string_value(dt));
    if (!json_is_array(sh))
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': shape is not an array", fname, key);
    if (json_array_size(sh) > MD_MAX_DIMS)
        return rc_errf(err, RC_EUNSUP, "%s: tensor '%s': %zu dimensions (at most %d)", fname, key,
                       json_array_size(sh), MD_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t count = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (get_u64(json_array_get(sh, (size_t)i), &d))
            return rc_errf(err, RC_EINVAL,
                           "%s: tensor '%s': shape[%d] is not a non-negative integer", fname, key, i);
        if (d > INT64_MAX || __builtin_mul_overflow(count, d, &count))
            return rc_errf(err, RC_EINVAL, "%s: tensor '%s': shape is too large", fname, key);
        t->shape[i] = (int64_t)d;
    }
    for (int i = t->ndim; i < MD_MAX_DIMS; i++) t->shape[i] = 0;
    uint64_t bytes, begin, end;
    if (__builtin_mul_overflow(count, (uint64_t)md_dtype_size(t->dtype), &bytes))
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': shape is too large", fname, key);
    if (!json_is_array(off) || json_array_size(off) != 2)
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': data_offsets is not a [begin, end] pair",
                       fname, key);
    if (get_u64(json_array_get(off, 0), &begin) || get_u64(json_array_get(off, 1), &end))
        return rc_errf(err, RC_EINVAL,
                       "%s: tensor '%s': data_offsets are not non-negative integers", fname, key);
    if (begin > end)
        return rc_errf(err, RC_EINVAL, "%s: tensor '%s': data_offsets begin %llu > end %llu", fname,
                       key, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return rc_errf(err, RC_EINVAL,
                       "%s: tensor '%s': data_offsets [%llu, %llu) out of range of the %llu-byte data "
                       "section",
                       fname, key, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_len);
    if (end - begin != bytes) {
        char s[160];
        shape_str(s, sizeof s, t->ndim, t->shape);
        return rc_errf(err, RC_EINVAL,
                       "%s: tensor '%s': shape %s of %s needs %llu bytes, data_offsets give %llu",
                       fname, key, s, md_dtype_name(t->dtype), (unsigned long long)bytes,
                       (unsigned long long)(end - begin));
    }
    t->data = data + begin;
    t->nbytes = (size_t)bytes;
    return 0;
}

static int by_offset(const void *a, const void *b) {
    const md_tensor *x = a, *y = b;
    const uint8_t *px = x->data, *py = y->data;
    if (px != py) return px < py ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const md_tensor *const *)a)->name, (*(const md_tensor *const *)b)->name);
}

/* Duplicate normalized names (the JSON layer already rejected duplicate raw ones). */
static int check_unique(md_tensor *t, size_t n, const char *fname, rc_err *err) {
    if (n < 2) return 0;
    const md_tensor **p = malloc(n * sizeof *p);
    if (!p) return rc_errf(err, RC_ENOMEM, "%s: out of memory", fname);
    for (size_t i = 0; i < n; i++) p[i] = &t[i];
    qsort(p, n, sizeof *p, by_name);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (strcmp(p[i - 1]->name, p[i]->name) == 0)
            rc = rc_errf(err, RC_EINVAL, "%s: tensors '%s' and '%s' both normalize to '%s'", fname,
                         p[i - 1]->raw_name, p[i]->raw_name, p[i]->name);
    free(p);
    return rc;
}

/* t sorted by offset; empty tensors overlap nothing. */
static int check_overlap(const md_tensor *t, size_t n, const uint8_t *data, const char *fname,
                         rc_err *err) {
    const md_tensor *last = NULL; /* non-empty tensor with the furthest end so far */
    for (size_t i = 0; i < n; i++) {
        if (!t[i].nbytes) continue;
        const uint8_t *b = t[i].data;
        if (last && b < (const uint8_t *)last->data + last->nbytes) {
            size_t lb = (size_t)((const uint8_t *)last->data - data), tb = (size_t)(b - data);
            return rc_errf(err, RC_EINVAL, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap",
                           fname, last->raw_name, lb, lb + last->nbytes, t[i].raw_name, tb,
                           tb + t[i].nbytes);
        }
        if (!last || b + t[i].nbytes > (const uint8_t *)last->data + last->nbytes) last = &t[i];
    }
    return 0;
}

static int check_metadata(const json_t *m, const char *fname, rc_err *err) {
    if (!json_is_object(m))
        return rc_errf(err, RC_EINVAL, "%s: __metadata__ is not an object", fname);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)m, k, v) {
        if (!json_is_string(v))
            return rc_errf(err, RC_EINVAL, "%s: __metadata__ value '%s' is not a string", fname, k);
    }
    return 0;
}

int md_st_parse(const uint8_t *buf, size_t len, const char *fname, md_tensor **tensors, size_t *n,
                rc_err *err) {
    *tensors = NULL;
    *n = 0;
    if (!fname) fname = "<buffer>";
    if (len < 8)
        return rc_errf(err, RC_EINVAL, "%s: file is %zu bytes, shorter than the 8-byte header length",
                       fname, len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen > len - 8)
        return rc_errf(err, RC_EINVAL, "%s: header length %llu is larger than the file (%zu bytes)",
                       fname, (unsigned long long)hlen, len);
    if (hlen > MD_ST_MAX_HEADER)
        return rc_errf(err, RC_EINVAL, "%s: header length %llu exceeds the limit of %u bytes", fname,
                       (unsigned long long)hlen, MD_ST_MAX_HEADER);
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;

    json_error_t je;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return rc_errf(err, RC_EINVAL, "%s: header is not valid JSON: %s (line %d, column %d)", fname,
                       je.text, je.line, je.column);
    int rc = 0;
    md_tensor *t = NULL;
    if (!json_is_object(root)) {
        rc = rc_errf(err, RC_EINVAL, "%s: header is not a JSON object", fname);
        goto out;
    }

    /* one allocation: entries, then fname, then raw and normalized names */
    size_t count = 0, strbytes = strlen(fname) + 1;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        count++;
        strbytes += 2 * (strlen(key) + 1);
    }
    t = malloc(count * sizeof *t + strbytes);
    if (!t) {
        rc = rc_errf(err, RC_ENOMEM, "%s: out of memory for %zu tensors", fname, count);
        goto out;
    }
    char *str = (char *)(t + count);
    size_t fl = strlen(fname) + 1;
    memcpy(str, fname, fl);
    const char *file = str;
    str += fl;

    size_t i = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = check_metadata(val, fname, err))) goto out;
            continue;
        }
        md_tensor *x = &t[i++];
        size_t kl = strlen(key) + 1;
        memcpy(str, key, kl);
        x->raw_name = str;
        str += kl;
        int nl = md_st_normalize(key, str, kl); /* normalizing never lengthens a name */
        x->name = str;
        str += nl + 1;
        x->file = file;
        if (nl == 0) {
            rc = rc_errf(err, RC_EINVAL, "%s: tensor '%s': empty name", fname, key);
            goto out;
        }
        if ((rc = parse_entry(fname, key, val, data, data_len, x, err))) goto out;
    }
    if ((rc = check_unique(t, count, fname, err))) goto out;
    if (count) qsort(t, count, sizeof *t, by_offset);
    if ((rc = check_overlap(t, count, data, fname, err))) goto out;
    *tensors = t;
    *n = count;
    t = NULL;
out:
    free(t);
    json_decref(root);
    return rc;
}

void md_st_free(md_tensor *tensors) { free(tensors); }

/* ---- checkpoints */

typedef struct {
    char *path;
    uint8_t *map;
    size_t len;
    md_tensor *t; /* md_st_parse's block: owns the name strings */
    size_t n;
} md_file;

struct md_ckpt {
    md_file *files;
    size_t nfiles;
    md_tensor *t; /* all tensors, copied from the files' blocks */
    size_t n;
    uint32_t *slot; /* open addressing: index + 1, 0 = empty; size mask + 1 */
    size_t mask;
    uint64_t total;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static const md_tensor *lookup(const md_ckpt *c, const char *name) {
    if (!c->slot) return NULL;
    for (size_t i = hash_name(name) & c->mask;; i = (i + 1) & c->mask) {
        uint32_t s = c->slot[i];
        if (!s) return NULL;
        if (strcmp(c->t[s - 1].name, name) == 0) return &c->t[s - 1];
    }
}

static int build_table(md_ckpt *c, rc_err *err) {
    size_t n = 0;
    for (size_t f = 0; f < c->nfiles; f++) n += c->files[f].n;
    if (n >= UINT32_MAX / 4) return rc_errf(err, RC_EUNSUP, "%zu tensors is too many", n);
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    c->t = malloc((n ? n : 1) * sizeof *c->t);
    c->slot = calloc(cap, sizeof *c->slot);
    if (!c->t || !c->slot) return rc_errf(err, RC_ENOMEM, "out of memory for %zu tensors", n);
    c->mask = cap - 1;
    for (size_t f = 0; f < c->nfiles; f++)
        for (size_t k = 0; k < c->files[f].n; k++) {
            const md_tensor *x = &c->files[f].t[k];
            size_t i = hash_name(x->name) & c->mask;
            for (; c->slot[i]; i = (i + 1) & c->mask) {
                const md_tensor *y = &c->t[c->slot[i] - 1];
                if (strcmp(y->name, x->name) == 0)
                    return rc_errf(err, RC_EINVAL,
                                   "tensor '%s' appears twice: '%s' in %s and '%s' in %s", x->name,
                                   y->raw_name, y->file, x->raw_name, x->file);
            }
            c->t[c->n] = *x;
            c->slot[i] = (uint32_t)++c->n;
            c->total += x->nbytes;
        }
    return 0;
}

/* Map and parse one file into c->files[c->nfiles++]. */
static int add_file(md_ckpt *c, const char *path, rc_err *err) {
    md_file *f = &c->files[c->nfiles];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return rc_errf(err, RC_ENOMEM, "out of memory");
    c->nfiles++;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rc_errf(err, RC_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return rc_errf(err, RC_EIO, "%s: not a regular file", path);
    }
    f->len = (size_t)st.st_size;
    if (f->len) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            f->len = 0;
            return rc_errf(err, RC_EIO, "%s: mmap failed: %s", path, strerror(e));
        }
        f->map = m;
    }
    close(fd);
    return md_st_parse(f->map, f->len, f->path, &f->t, &f->n, err);
}

static char *join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a && dir[a - 1] != '/') p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name must stay inside the checkpoint directory. */
static int bad_shard_name(const char *s) {
    if (!*s || *s == '/') return 1;
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '/');
        size_t l = q ? (size_t)(q - p) : strlen(p);
        if (l == 2 && p[0] == '.' && p[1] == '.') return 1;
        if (!q) break;
        p = q + 1;
    }
    return 0;
}

static int open_index(md_ckpt *c, const char *dir, const char *ipath, rc_err *err) {
    json_error_t je;
    json_t *root = json_load_file(ipath, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return rc_errf(err, RC_EINVAL, "%s: not valid JSON: %s (line %d, column %d)", ipath, je.text,
                       je.line, je.column);
    int rc = 0;
    const char **shards = NULL;
    char *path = NULL;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        rc = rc_errf(err, RC_EINVAL, "%s: missing \"weight_map\" object", ipath);
        goto out;
    }
    size_t nmap = json_object_size(wm), nsh = 0;
    if (!nmap) {
        rc = rc_errf(err, RC_EINVAL, "%s: weight_map is empty", ipath);
        goto out;
    }
    shards = malloc(nmap * sizeof *shards);
    if (!shards) {
        rc = rc_errf(err, RC_ENOMEM, "out of memory");
        goto out;
    }
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v) {
        if (!json_is_string(v)) {
            rc = rc_errf(err, RC_EINVAL, "%s: weight_map entry '%s' is not a file name", ipath, name);
            goto out;
        }
        if (bad_shard_name(json_string_value(v))) {
            rc = rc_errf(err, RC_EINVAL, "%s: tensor '%s' maps to '%s', not a file in %s", ipath, name,
                         json_string_value(v), dir);
            goto out;
        }
        shards[nsh++] = json_string_value(v);
    }
    qsort(shards, nsh, sizeof *shards, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < nsh; i++)
        if (!u || strcmp(shards[u - 1], shards[i])) shards[u++] = shards[i];
    nsh = u;
    c->files = calloc(nsh, sizeof *c->files);
    if (!c->files) {
        rc = rc_errf(err, RC_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nsh; i++) {
        free(path);
        path = join(dir, shards[i]);
        if (!path) {
            rc = rc_errf(err, RC_ENOMEM, "out of memory");
            goto out;
        }
        if (!is_file(path)) {
            const char *who = "?";
            json_object_foreach(wm, name, v) {
                if (strcmp(json_string_value(v), shards[i]) == 0) {
                    who = name;
                    break;
                }
            }
            rc = rc_errf(err, RC_EIO, "%s: tensor '%s' maps to shard '%s', which does not exist (%s)",
                         ipath, who, shards[i], path);
            goto out;
        }
        if ((rc = add_file(c, path, err))) goto out;
    }
    if ((rc = build_table(c, err))) goto out;

    /* the index and the shards must agree in both directions */
    json_object_foreach(wm, name, v) {
        char norm[1024];
        const char *shard = json_string_value(v);
        const md_tensor *t = md_st_normalize(name, norm, sizeof norm) < 0 ? NULL : lookup(c, norm);
        if (t && strcmp(t->raw_name, name) != 0) t = NULL;
        /* c->files[k] was opened from shards[k] */
        const char **k = bsearch(&shard, shards, nsh, sizeof *shards, cmp_str);
        int held = t && k && strcmp(t->file, c->files[k - shards].path) == 0;
        if (!held) {
            if (t)
                rc = rc_errf(err, RC_EINVAL,
                             "%s: tensor '%s' maps to shard '%s', but that shard does not hold it "
                             "(it is in %s)",
                             ipath, name, shard, t->file);
            else
                rc = rc_errf(err, RC_EINVAL,
                             "%s: tensor '%s' maps to shard '%s', but that shard does not hold it",
                             ipath, name, shard);
            goto out;
        }
    }
    for (size_t i = 0; i < c->n; i++)
        if (!json_object_get(wm, c->t[i].raw_name)) {
            rc = rc_errf(err, RC_EINVAL, "%s: tensor '%s' is not listed in the weight_map of %s",
                         c->t[i].file, c->t[i].raw_name, ipath);
            goto out;
        }
out:
    free(path);
    free(shards);
    json_decref(root);
    return rc;
}

int md_ckpt_open(const char *dir, md_ckpt **out, rc_err *err) {
    *out = NULL;
    md_ckpt *c = calloc(1, sizeof *c);
    if (!c) return rc_errf(err, RC_ENOMEM, "out of memory");
    int rc;
    char *single = NULL, *index = NULL;
    struct stat st;
    if (stat(dir, &st) != 0) {
        rc = rc_errf(err, RC_EIO, "%s: %s", dir, strerror(errno));
        goto out;
    }
    if (S_ISREG(st.st_mode)) {
        c->files = calloc(1, sizeof *c->files);
        rc = c->files ? add_file(c, dir, err) : rc_errf(err, RC_ENOMEM, "out of memory");
        if (!rc) rc = build_table(c, err);
        goto out;
    }
    single = join(dir, "model.safetensors");
    index = join(dir, "model.safetensors.index.json");
    if (!single || !index) {
        rc = rc_errf(err, RC_ENOMEM, "out of memory");
        goto out;
    }
    if (is_file(single)) {
        c->files = calloc(1, sizeof *c->files);
        rc = c->files ? add_file(c, single, err) : rc_errf(err, RC_ENOMEM, "out of memory");
        if (!rc) rc = build_table(c, err);
    } else if (is_file(index)) {
        rc = open_index(c, dir, index, err);
    } else {
        rc = rc_errf(err, RC_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
out:
    free(single);
    free(index);
    if (rc) {
        md_ckpt_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void md_ckpt_close(md_ckpt *c) {
    if (!c) return;
    for (size_t f = 0; f < c->nfiles; f++) {
        if (c->files[f].map) munmap(c->files[f].map, c->files[f].len);
        md_st_free(c->files[f].t);
        free(c->files[f].path);
    }
    free(c->files);
    free(c->t);
    free(c->slot);
    free(c);
}

size_t md_ckpt_count(const md_ckpt *c) { return c->n; }

const md_tensor *md_ckpt_at(const md_ckpt *c, size_t i) { return i < c->n ? &c->t[i] : NULL; }

const md_tensor *md_ckpt_find(const md_ckpt *c, const char *name) { return lookup(c, name); }

uint64_t md_ckpt_total_bytes(const md_ckpt *c) { return c->total; }

int md_ckpt_get(const md_ckpt *c, const char *name, unsigned allowed, int ndim, const int64_t *shape,
                const md_tensor **out, rc_err *err) {
    if (out) *out = NULL;
    const md_tensor *t = lookup(c, name);
    if (!t) {
        const char *where = c->nfiles ? c->files[0].path : "?";
        return rc_errf(err, RC_EINVAL, "tensor '%s' is missing from the checkpoint (%s%s)", name,
                       where, c->nfiles > 1 ? " and its other shards" : "");
    }
    if (allowed && !(allowed & MD_DT(t->dtype))) {
        char want[160] = "";
        size_t at = 0;
        for (int d = 0; d < MD_DTYPE_COUNT && at < sizeof want; d++)
            if (allowed & MD_DT(d))
                at += (size_t)snprintf(want + at, sizeof want - at, at ? " or %s" : "%s",
                                       md_dtype_name((md_dtype)d));
        return rc_errf(err, RC_EINVAL, "tensor '%s' (%s in %s): dtype %s, expected %s", name,
                       t->raw_name, t->file, md_dtype_name(t->dtype), want);
    }
    if (ndim >= 0) {
        int ok = ndim == t->ndim;
        for (int i = 0; ok && i < ndim; i++) ok = shape[i] == t->shape[i];
        if (!ok) {
            char got[160], want[160];
            shape_str(got, sizeof got, t->ndim, t->shape);
            shape_str(want, sizeof want, ndim > MD_MAX_DIMS ? MD_MAX_DIMS : ndim, shape);
            return rc_errf(err, RC_EINVAL, "tensor '%s' (%s in %s): shape %s, expected %s", name,
                           t->raw_name, t->file, got, want);
        }
    }
    if (out) *out = t;
    return 0;
}

void md_ckpt_touch(const md_ckpt *c, void (*progress)(void *arg, uint64_t done, uint64_t total),
                   void *arg) {
    uint64_t total = 0, done = 0, next = 1ull << 30;
    for (size_t f = 0; f < c->nfiles; f++) total += c->files[f].len;
    volatile uint8_t sink = 0;
    for (size_t f = 0; f < c->nfiles; f++) {
        const volatile uint8_t *m = c->files[f].map;
        size_t len = c->files[f].len;
        for (size_t off = 0; off < len; off += 4096) {
            sink ^= m[off];
            size_t step = len - off < 4096 ? len - off : 4096;
            done += step;
            if (progress && done >= next) {
                progress(arg, done, total);
                next = (done & ~((1ull << 30) - 1)) + (1ull << 30);
            }
        }
    }
    (void)sink;
    if (progress) progress(arg, done, total);
}
