/* tokenizer_parallel.c - segmented parallel encoding.
 *
 * A long text is cut at "safe" positions (rc_pretok_safe_cut: places where
 * the pre-tokenizer is known to start a fresh piece whatever surrounds it),
 * the segments are encoded on a thread pool, and the id lists are joined in
 * order.  The result is identical to serial encoding by construction; the
 * fuzz harness and tests/unit check it anyway.  In template mode the added
 * tokens are extracted first (cheap, serial) and only text spans are cut. */
#include <stdlib.h>

#include "recipe/pretok.h"
#include "recipe/tokenizer_internal.h"
#include "recipe/unicode.h"

enum {
    SEG_TARGET = 16 * 1024, /* bytes per segment when the pool is busy enough */
    SEG_MIN = 4 * 1024,     /* below this a text is not worth splitting */
    SEG_SEARCH = 4 * 1024,  /* how far to look for a safe cut */
};

typedef struct {
    size_t off, len;
    int32_t id; /* >= 0: an added token, emitted as is */
    rc_ids ids;
    int rc;
} seg;

typedef struct {
    const rc_tokenizer *t;
    const uint8_t *s;
    seg *segs;
} job;

static void run_seg(void *vp, size_t i) {
    job *j = vp;
    seg *g = &j->segs[i];
    if (g->id >= 0) g->rc = rc_ids_push(&g->ids, g->id);
    else g->rc = rc_encode_content_span(j->t, j->s + g->off, g->len, &g->ids);
}

static int add_seg(seg **v, size_t *n, size_t *cap, size_t off, size_t len, int32_t id) {
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        seg *nv = realloc(*v, c * sizeof *nv);
        if (!nv) return RC_ENOMEM;
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = (seg){.off = off, .len = len, .id = id};
    return 0;
}

/* cut text span [b, e) into segments of about `target` bytes */
static int cut_span(const uint8_t *s, size_t b, size_t e, size_t target, seg **v, size_t *n,
                    size_t *cap) {
    size_t start = b;
    while (e - start > target + SEG_MIN) {
        size_t want = start + target;
        size_t p = rc_pretok_safe_cut(s, e, want, want + SEG_SEARCH < e ? want + SEG_SEARCH : e);
        if (p >= e || p >= want + SEG_SEARCH) break; /* no safe cut nearby: keep the rest whole */
        if (add_seg(v, n, cap, start, p - start, -1)) return RC_ENOMEM;
        start = p;
    }
    return add_seg(v, n, cap, start, e - start, -1);
}

int rc_tokenizer_encode_parallel(const rc_tokenizer *t, rc_pool *pool, const char *text, size_t len,
                                 enum rc_encode_mode mode, rc_ids *out, rc_err *err) {
    int nth = rc_pool_threads(pool);
    if (nth <= 1 || len < 2 * SEG_MIN) return rc_tokenizer_encode(t, text, len, mode, out, err);
    const uint8_t *s = (const uint8_t *)text;
    int rc = rc_check_utf8(text, len, err);
    if (rc) return rc;
    /* several segments per thread so uneven segments still balance */
    size_t target = len / ((size_t)nth * 4);
    if (target < SEG_MIN) target = SEG_MIN;
    if (target > SEG_TARGET * 4) target = SEG_TARGET * 4;

    seg *segs = NULL;
    size_t nseg = 0, cap = 0;
    if (mode == RC_ENCODE_CONTENT) {
        rc = cut_span(s, 0, len, target, &segs, &nseg, &cap);
    } else {
        rc_span *sp;
        size_t nsp;
        rc = rc_split_added(t, s, len, &sp, &nsp);
        for (size_t k = 0; !rc && k < nsp; k++)
            rc = sp[k].id >= 0 ? add_seg(&segs, &nseg, &cap, sp[k].off, sp[k].len, sp[k].id)
                               : cut_span(s, sp[k].off, sp[k].off + sp[k].len, target, &segs, &nseg, &cap);
        if (!rc) free(sp);
    }
    if (!rc) {
        job j = {.t = t, .s = s, .segs = segs};
        rc_pool_run(pool, nseg, run_seg, &j);
        size_t total = 0;
        for (size_t k = 0; k < nseg; k++) {
            if (segs[k].rc) rc = segs[k].rc;
            total += segs[k].ids.n;
        }
        if (!rc) rc = rc_ids_reserve(out, total);
        for (size_t k = 0; !rc && k < nseg; k++) rc = rc_ids_append(out, segs[k].ids.v, segs[k].ids.n);
    }
    for (size_t k = 0; k < nseg; k++) rc_ids_free(&segs[k].ids);
    free(segs);
    return rc ? rc_errf(err, rc, "tokenizer: out of memory") : 0;
}
