/* stream.c - the output state machine (spec recipe.md §5.3-§5.8).
 *
 * Owns: stages, marker matching, withholding, actions -> events, finish
 * reason.  Does not own: protocol events or JSON of responses (chat_out.c).
 *
 * Invariant: every input byte is either emitted (as part of a segment with
 * an action) or withheld in `buf` because some branch of the current stage
 * has matched it as the start of its marker.  `buf[0..done)` is emitted,
 * `buf[done..scan)` is withheld, `buf[scan..)` not yet looked at. */
#include "recipe/stream.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "base/vec.h"
#include "recipe/pyjson.h"

typedef enum {
    A_SKIP, A_BAD_THINK, A_BAD_AFTER, A_RAW, A_REASONING, A_TOSPACE, A_STOP, A_TC_BEGIN, A_TOOLNAME,
    A_TOOLNAME_END, A_LABEL, A_ARGS_STR, A_ARGS_RAW
} act;

typedef enum {
    S_COMMON, S_JSON, S_MATCHED_JSON, S_TOOLCALLS, S_TOOLNAME, S_TOOLARGS, S_PARAMNAME, S_PARAMTYPE,
    S_PARAMVALUE, S_REASONING, S_FINISHED
} stage_id;

enum { M_STR, M_NL_STR, M_LEAD_NL };
enum { MAXB = 24, MAXPAT = 64 };

typedef struct {
    int kind;
    const char *pat;
    size_t plen;
    stage_id next;
    int next_flag;
    act action;
    const char *label; /* for A_LABEL */
    int fail[MAXPAT];
} branch;

/* A segment (action over a byte range) cut at source-chunk boundaries; the
 * reference makes one delta per run of equal actions inside one source
 * chunk and releases a chunk only when all its bytes are resolved. */
typedef struct {
    act a;
    const char *label;
    int in_content; /* a label written in content (JSON mode "{" / "[") */
    int first;      /* first piece of its segment: labels and headers go out once */
    size_t off, len;
} piece;

typedef struct {
    size_t start, end;
    piece *p;
    size_t np, cap;
    int wait_next; /* empty chunk at the very start: takes the next segment */
} src;

/* a stage's branches, KMP tables and trigger bytes: built once per stream
 * for each (stage, flag) and shared by every entry into that stage */
typedef struct {
    branch br[MAXB];
    size_t nbr;
    act unmatched;
    uint8_t trig[256]; /* bytes that can start or extend a match from idle */
    uint8_t tb[4];     /* the same bytes as a list, when there are at most 4 */
    int ntb;           /* their count, or -1 if more */
} stage_tpl;

struct rc_stream {
    rc_stream_opts o;
    char **stop;
    /* current stage */
    stage_id st;
    int flag; /* lead (Common, Reasoning, ToolArgs) or string (ParamValue) */
    stage_tpl *cur;               /* branches of the current stage */
    stage_tpl *tpl[S_FINISHED + 1][2]; /* built once per (stage, flag) */
    size_t j[MAXB], nl[MAXB];
    size_t fed; /* bytes fed to this stage instance */
    size_t active; /* branches with a partial match (j or nl non-zero) */

    /* bytes: buf[0] is at global offset base */
    rc_bytes buf;
    size_t base, done, scan;
    /* source chunks not yet released, with the pieces of segments in them */
    src *q;
    size_t qhead, qn, qcap;
    unsigned seg;
    act last_act;             /* action of the last segment (for empty chunks) */
    const char *last_label;
    int last_in_content;
    /* outputs */
    rc_bytes name, stopseq, tmp;
    int finished, stopped, has_calls;
    /* token-id input (rc_stream_feed_ids) */
    size_t *id_end, nid_end, cap_id_end, id_next, id_counted_last, id_zero;
    long long reasoning_ids;
    size_t bad_think, bad_after;
    act last_label_act;
};

static void kmp(branch *b) {
    b->fail[0] = 0;
    for (size_t i = 1, k = 0; i < b->plen; i++) {
        while (k > 0 && b->pat[i] != b->pat[k]) k = (size_t)b->fail[k - 1];
        if (b->pat[i] == b->pat[k]) k++;
        b->fail[i] = (int)k;
    }
}

static void add(rc_stream *s, int kind, const char *pat, stage_id next, int nflag, act a, const char *label) {
    if (s->cur->nbr >= MAXB) return;
    branch *b = &s->cur->br[s->cur->nbr++];
    b->kind = kind;
    b->pat = pat;
    b->plen = pat ? strlen(pat) : 0;
    if (b->plen > MAXPAT) b->plen = MAXPAT; /* stop sequences are capped when created */
    b->next = next;
    b->next_flag = nflag;
    b->action = a;
    b->label = label;
    if (b->plen) kmp(b);
}

#define DSML_OPEN "<\xef\xbd\x9c" "DSML\xef\xbd\x9c"
#define DSML_CLOSE "</\xef\xbd\x9c" "DSML\xef\xbd\x9c"

static void build(rc_stream *s, stage_id st, int flag);

/* shared templates: [parse_tool_calls | json_output << 1][stage][flag] */
static stage_tpl *g_tpl[4][S_FINISHED + 1][2];
static pthread_mutex_t g_tpl_mu = PTHREAD_MUTEX_INITIALIZER;

static void enter(rc_stream *s, stage_id st, int flag) {
    s->st = st;
    s->flag = flag;
    s->fed = 0;
    s->active = 0;
    flag = !!flag;
    if (!(s->o.nstop && (st == S_COMMON || st == S_JSON))) {
        /* no stop sequences involved: the template depends only on the two
         * option bits, so it is built once per process and shared */
        int key = (s->o.parse_tool_calls ? 1 : 0) | (s->o.json_output ? 2 : 0);
        stage_tpl *t = __atomic_load_n(&g_tpl[key][st][flag], __ATOMIC_ACQUIRE);
        if (!t) {
            pthread_mutex_lock(&g_tpl_mu);
            t = g_tpl[key][st][flag];
            if (!t) {
                t = calloc(1, sizeof *t);
                if (!t) abort(); /* a few KiB, once */
                s->cur = t;
                build(s, st, flag);
                __atomic_store_n(&g_tpl[key][st][flag], t, __ATOMIC_RELEASE);
            }
            pthread_mutex_unlock(&g_tpl_mu);
        }
        s->cur = t;
    } else {
        if (!s->tpl[st][flag]) {
            s->tpl[st][flag] = calloc(1, sizeof(stage_tpl));
            if (!s->tpl[st][flag]) abort(); /* a few KiB at stream start */
            s->cur = s->tpl[st][flag];
            build(s, st, flag);
        }
        s->cur = s->tpl[st][flag];
    }
    memset(s->j, 0, s->cur->nbr * sizeof s->j[0]);
    memset(s->nl, 0, s->cur->nbr * sizeof s->nl[0]);
}

static void build(rc_stream *s, stage_id st, int flag) {
    s->cur->nbr = 0;
    switch (st) {
    case S_COMMON:
        if (s->o.json_output) {
            add(s, M_STR, "```json\n", S_JSON, 0, A_SKIP, NULL);
            add(s, M_STR, "```\n", S_JSON, 0, A_SKIP, NULL);
            add(s, M_STR, "{", S_JSON, 0, A_LABEL, "{");
            add(s, M_STR, "[", S_JSON, 0, A_LABEL, "[");
            if (s->o.parse_tool_calls) add(s, M_NL_STR, DSML_OPEN, S_TOOLCALLS, 0, A_SKIP, NULL);
            if (flag) add(s, M_LEAD_NL, NULL, S_COMMON, 1, A_SKIP, NULL);
            s->cur->unmatched = A_TOSPACE;
        } else {
            for (size_t k = 0; k < s->o.nstop; k++) add(s, M_STR, s->stop[k], S_FINISHED, 0, A_STOP, NULL);
            if (s->o.parse_tool_calls) add(s, M_NL_STR, DSML_OPEN, S_TOOLCALLS, 0, A_SKIP, NULL);
            if (flag) add(s, M_LEAD_NL, NULL, S_COMMON, 1, A_SKIP, NULL);
            add(s, M_STR, "</think>", S_COMMON, 0, A_BAD_THINK, NULL);
            s->cur->unmatched = A_RAW;
        }
        break;
    case S_JSON:
        for (size_t k = 0; k < s->o.nstop; k++) add(s, M_STR, s->stop[k], S_FINISHED, 0, A_STOP, NULL);
        add(s, M_STR, "\n```", S_MATCHED_JSON, 0, A_SKIP, NULL);
        s->cur->unmatched = A_RAW;
        break;
    case S_MATCHED_JSON:
        if (s->o.parse_tool_calls) add(s, M_NL_STR, DSML_OPEN, S_TOOLCALLS, 0, A_SKIP, NULL);
        s->cur->unmatched = A_TOSPACE;
        break;
    case S_TOOLCALLS:
        add(s, M_STR, "invoke name=\"", S_TOOLNAME, 0, A_TC_BEGIN, NULL);
        add(s, M_STR, DSML_CLOSE "tool_calls>", S_FINISHED, 0, A_SKIP, NULL);
        add(s, M_STR, DSML_CLOSE " calls>", S_FINISHED, 0, A_SKIP, NULL);
        s->cur->unmatched = A_SKIP;
        break;
    case S_TOOLNAME:
        add(s, M_STR, "\"", S_TOOLARGS, 1, A_TOOLNAME_END, NULL);
        s->cur->unmatched = A_TOOLNAME;
        break;
    case S_TOOLARGS:
        /* the name is copied raw, quotes included, up to the first space */
        add(s, M_STR, "parameter name=", S_PARAMNAME, 0, A_LABEL, flag ? "{" : ", ");
        add(s, M_STR, DSML_CLOSE, S_TOOLCALLS, 0, A_LABEL, flag ? "{}" : "}");
        s->cur->unmatched = A_SKIP;
        break;
    case S_PARAMNAME:
        add(s, M_STR, " ", S_PARAMTYPE, 0, A_LABEL, ": ");
        s->cur->unmatched = A_ARGS_RAW;
        break;
    case S_PARAMTYPE:
        add(s, M_STR, "true\">", S_PARAMVALUE, 1, A_LABEL, "\"");
        add(s, M_STR, "false\">", S_PARAMVALUE, 0, A_SKIP, NULL);
        s->cur->unmatched = A_SKIP;
        break;
    case S_PARAMVALUE:
        add(s, M_STR, DSML_CLOSE, S_TOOLARGS, 0, flag ? A_LABEL : A_SKIP, flag ? "\"" : NULL);
        s->cur->unmatched = flag ? A_ARGS_STR : A_ARGS_RAW;
        break;
    case S_REASONING:
        if (s->o.parse_tool_calls) add(s, M_NL_STR, DSML_OPEN, S_TOOLCALLS, 0, A_SKIP, NULL);
        if (flag) add(s, M_LEAD_NL, NULL, S_REASONING, 1, A_SKIP, NULL);
        add(s, M_NL_STR, "</think>", S_COMMON, 1, A_SKIP, NULL);
        s->cur->unmatched = A_REASONING;
        break;
    case S_FINISHED:
        s->cur->unmatched = A_BAD_AFTER;
        break;
    }
    memset(s->cur->trig, 0, sizeof s->cur->trig);
    for (size_t k = 0; k < s->cur->nbr; k++) {
        if (s->cur->br[k].plen) s->cur->trig[(unsigned char)s->cur->br[k].pat[0]] = 1;
        if (s->cur->br[k].kind == M_NL_STR) s->cur->trig['\n'] = 1;
    }
    s->cur->ntb = 0;
    for (int c = 0; c < 256 && s->cur->ntb >= 0; c++)
        if (s->cur->trig[c]) {
            if (s->cur->ntb == 4) s->cur->ntb = -1;
            else s->cur->tb[s->cur->ntb++] = (uint8_t)c;
        }
}

/* first index >= p in b[0..end) holding a trigger byte, or end */
static size_t next_trigger(const rc_stream *s, const unsigned char *b, size_t p, size_t end) {
#ifdef __SSE2__
    if (s->cur->ntb > 0) {
        __m128i t[4];
        for (int k = 0; k < 4; k++) t[k] = _mm_set1_epi8((char)s->cur->tb[k < s->cur->ntb ? k : 0]);
        while (p + 16 <= end) {
            __m128i v = _mm_loadu_si128((const __m128i *)(b + p));
            __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, t[0]), _mm_cmpeq_epi8(v, t[1])),
                                     _mm_or_si128(_mm_cmpeq_epi8(v, t[2]), _mm_cmpeq_epi8(v, t[3])));
            int bits = _mm_movemask_epi8(m);
            if (bits) return p + (size_t)__builtin_ctz((unsigned)bits);
            p += 16;
        }
    }
#endif
    while (p < end && !s->cur->trig[b[p]]) p++;
    return p;
}

rc_stream *rc_stream_new(const rc_stream_opts *o) {
    rc_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->o = *o;
    s->stop = calloc(o->nstop + 1, sizeof *s->stop);
    size_t n = 0;
    for (size_t k = 0; k < o->nstop; k++)
        if (o->stop[k] && *o->stop[k] && strlen(o->stop[k]) <= MAXPAT) s->stop[n++] = strdup(o->stop[k]);
    s->o.nstop = n;
    s->last_label_act = A_SKIP;
    s->last_act = A_SKIP;
    s->id_counted_last = SIZE_MAX;
    if (o->tool_call_initial) enter(s, S_TOOLCALLS, 0);
    else switch (o->reasoning) {
        case RC_REASONING_START: enter(s, S_REASONING, 1); break;
        case RC_REASONING_REASONING: enter(s, S_REASONING, 0); break;
        case RC_REASONING_CONTENT: enter(s, S_COMMON, 0); break;
        default: enter(s, S_COMMON, 1); break;
        }
    return s;
}

void rc_stream_free(rc_stream *s) {
    if (!s) return;
    for (size_t k = 0; k < s->o.nstop; k++) free(s->stop[k]);
    free(s->stop);
    rc_bytes_free(&s->buf);
    rc_bytes_free(&s->name);
    rc_bytes_free(&s->stopseq);
    rc_bytes_free(&s->tmp);
    for (int a = 0; a <= S_FINISHED; a++)
        for (int b = 0; b < 2; b++) free(s->tpl[a][b]);
    for (size_t k = s->qhead; k < s->qn; k++) free(s->q[k].p);
    free(s->q);
    free(s->id_end);
    free(s);
}

static int joinable(act a) {
    return a != A_LABEL && a != A_TC_BEGIN && a != A_TOOLNAME_END && a != A_STOP;
}

static void add_piece(src *c, act a, const char *label, int in_content, int first, size_t off, size_t len) {
    if (c->np && joinable(a) && c->p[c->np - 1].a == a && c->p[c->np - 1].off + c->p[c->np - 1].len == off &&
        len) {
        c->p[c->np - 1].len += len;
        return;
    }
    if (c->np == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        piece *v = realloc(c->p, cap * sizeof *v);
        if (!v) return;
        c->p = v;
        c->cap = cap;
    }
    c->p[c->np++] = (piece){a, label, in_content, first, off, len};
}

/* record segment `a` over the next n bytes, cut at source-chunk boundaries */
static void emit(rc_stream *s, act a, const char *label, size_t n) {
    size_t g = s->base + s->done, e = g + n;
    int in_content = s->st == S_COMMON;
    s->done += n;
    s->seg++;
    if (a == A_BAD_THINK) s->bad_think++;
    if (a == A_BAD_AFTER && n) s->bad_after++;
    for (size_t k = s->qhead; k < s->qn; k++) {
        src *c = &s->q[k];
        if (c->start == c->end) { /* an empty chunk: a zero-length piece of the segment covering it */
            if ((c->wait_next && g == c->start) || (!c->wait_next && g < c->start && c->start <= e)) {
                if (!c->np) add_piece(c, a, label, in_content, 0, c->start, 0);
                c->wait_next = 0;
            }
            continue;
        }
        size_t a0 = g > c->start ? g : c->start, a1 = e < c->end ? e : c->end;
        if (a0 < a1) add_piece(c, a, label, in_content, a0 == g, a0, a1 - a0);
    }
    s->last_act = a;
    s->last_label = label;
    s->last_in_content = in_content;
}

/* token-id input: an id counts as a reasoning token when some of its text
 * comes out as reasoning, together with the ids before it that produced no
 * text of their own (the first bytes of a character).  id_end[] holds the
 * global end offset of each id's text, in order; ids are visited in order. */
static void count_reasoning_ids(rc_stream *s, size_t off, size_t len) {
    size_t end = off + len;
    while (s->id_next < s->nid_end) {
        size_t start = s->id_next ? s->id_end[s->id_next - 1] : 0, e = s->id_end[s->id_next];
        if (e == start) { /* no text of its own: counted with the id that completes it */
            if (start >= end) break;
            s->id_zero++;
            s->id_next++;
            continue;
        }
        if (e <= off) { /* entirely before this reasoning piece */
            s->id_zero = 0;
            s->id_next++;
            continue;
        }
        if (start >= end) break;
        if (s->id_next != s->id_counted_last) {
            s->reasoning_ids += 1 + (long long)s->id_zero;
            s->id_counted_last = s->id_next;
        }
        s->id_zero = 0;
        if (e > end) break; /* continues into a later piece */
        s->id_next++;
    }
}

/* turn one piece into events */
static void fire(rc_stream *s, const piece *p, rc_event_fn fn, void *ctx) {
    const char *t = s->buf.v + (p->off - s->base);
    size_t n = p->len;
    switch (p->a) {
    case A_RAW: fn(ctx, RC_EV_CONTENT, t, n); break;
    case A_REASONING:
        count_reasoning_ids(s, p->off, p->len);
        fn(ctx, RC_EV_REASONING, t, n);
        break;
    case A_TOSPACE: fn(ctx, RC_EV_CONTENT, " ", 1); break;
    case A_STOP:
        rc_bytes_append(&s->stopseq, t, n);
        s->stopped = 1;
        break;
    case A_TOOLNAME: rc_bytes_append(&s->name, t, n); break;
    case A_TOOLNAME_END:
        if (!p->first) break;
        s->has_calls = 1;
        fn(ctx, RC_EV_TOOL_CALL, s->name.v ? s->name.v : "", s->name.n);
        s->name.n = 0;
        break;
    case A_LABEL:
        if (p->first) fn(ctx, p->in_content ? RC_EV_CONTENT : RC_EV_TOOL_ARGS, p->label, strlen(p->label));
        break;
    case A_ARGS_RAW: fn(ctx, RC_EV_TOOL_ARGS, t, n); break;
    case A_ARGS_STR:
        /* JSON string escaping of just this fragment, without quotes */
        s->tmp.n = 0;
        rc_pyjson_string(t, n, &s->tmp);
        fn(ctx, RC_EV_TOOL_ARGS, s->tmp.v + 1, s->tmp.n - 2);
        break;
    default: break;
    }
}

/* release every source chunk whose bytes are all resolved, in order */
static void release(rc_stream *s, int all, rc_event_fn fn, void *ctx) {
    while (s->qhead < s->qn) {
        src *c = &s->q[s->qhead];
        if (!all && (c->end > s->base + s->done || c->wait_next)) break;
        for (size_t k = 0; k < c->np; k++) fire(s, &c->p[k], fn, ctx);
        free(c->p);
        s->qhead++;
    }
    if (s->qhead == s->qn) s->qhead = s->qn = 0;
    /* drop bytes no unreleased chunk needs */
    size_t keep_from = s->qhead < s->qn ? s->q[s->qhead].start : s->base + s->done;
    if (keep_from > s->base + s->done) keep_from = s->base + s->done;
    size_t drop = keep_from - s->base;
    if (drop) {
        memmove(s->buf.v, s->buf.v + drop, s->buf.n - drop);
        s->buf.n -= drop;
        s->done -= drop;
        s->scan -= drop;
        s->base += drop;
    }
}

/* advance branch k with byte c; returns 1 when it completes */
static int step(rc_stream *s, size_t k, unsigned char c) {
    branch *b = &s->cur->br[k];
    if (b->kind == M_LEAD_NL) return s->fed == 1 && c == '\n';
    size_t j = s->j[k];
    if (b->kind == M_NL_STR && j == 0 && c == '\n') {
        s->nl[k]++;
        return 0;
    }
    size_t j0 = j;
    while (j > 0 && (unsigned char)b->pat[j] != c) j = (size_t)b->fail[j - 1];
    if ((unsigned char)b->pat[j] == c) j++;
    /* the newlines count only right before the current partial match: a
     * fallback to a shorter border starts a new one after them */
    if (b->kind == M_NL_STR && j != j0 + 1) s->nl[k] = 0;
    s->j[k] = j;
    return j == b->plen;
}

static size_t matching_len(const rc_stream *s, size_t k) {
    const branch *b = &s->cur->br[k];
    if (b->kind == M_LEAD_NL) return 0;
    return s->j[k] + (b->kind == M_NL_STR ? s->nl[k] : 0);
}

int rc_stream_feed(rc_stream *s, const char *text, size_t n, rc_event_fn fn, void *ctx) {
    if (rc_bytes_append(&s->buf, text, n)) return s->finished;
    if (s->qn == s->qcap) {
        size_t cap = s->qcap ? s->qcap * 2 : 16;
        src *v = realloc(s->q, cap * sizeof *v);
        if (!v) return s->finished;
        s->q = v;
        s->qcap = cap;
    }
    size_t start = s->base + s->buf.n - n;
    src *c = &s->q[s->qn++];
    *c = (src){.start = start, .end = start + n};
    if (n == 0 && s->base + s->done == start) {
        /* nothing pending: the previous segment covers it; at the start, the next */
        if (s->seg) add_piece(c, s->last_act, s->last_label, s->last_in_content, 0, start, 0);
        else c->wait_next = 1;
    }
    while (s->scan < s->buf.n) {
        /* fast path: with every matcher idle, bytes that cannot start a marker
         * are plain unmatched text (the leading-newline check needs byte 1) */
        if (!s->active && s->fed) {
            const unsigned char *b = (const unsigned char *)s->buf.v;
            size_t p = s->scan, end = s->buf.n;
            p = next_trigger(s, b, p, end);
            s->fed += p - s->scan;
            s->scan = p;
            if (p == end) break;
        }
        unsigned char c = (unsigned char)s->buf.v[s->scan++];
        s->fed++;
        size_t hit = SIZE_MAX;
        for (size_t k = 0; k < s->cur->nbr; k++)
            if (step(s, k, c)) {
                hit = k;
                break;
            }
        if (hit == SIZE_MAX) {
            size_t act = 0;
            for (size_t k = 0; k < s->cur->nbr; k++) act += s->j[k] || s->nl[k];
            s->active = act;
            continue;
        }
        branch b = s->cur->br[hit];
        size_t mlen = b.kind == M_LEAD_NL ? 1 : b.plen + (b.kind == M_NL_STR ? s->nl[hit] : 0);
        size_t stashed = s->scan - s->done;
        if (stashed > mlen) emit(s, s->cur->unmatched, NULL, stashed - mlen);
        emit(s, b.action, b.label, mlen);
        enter(s, b.next, b.next_flag);
        if (b.next == S_FINISHED) s->finished = 1;
    }
    /* emit what no marker can still claim */
    size_t keep = 0;
    for (size_t k = 0; k < s->cur->nbr; k++)
        if (matching_len(s, k) > keep) keep = matching_len(s, k);
    size_t stashed = s->scan - s->done;
    if (stashed > keep) emit(s, s->cur->unmatched, NULL, stashed - keep);
    release(s, 0, fn, ctx);
    return s->stopped; /* a stop sequence ends reading; a closed tool block does not */
}

rc_finish rc_stream_finish(rc_stream *s, rc_finish backend, rc_event_fn fn, void *ctx) {
    size_t stashed = s->scan - s->done;
    if (stashed) emit(s, s->cur->unmatched, NULL, stashed);
    release(s, 1, fn, ctx);
    if (s->stopped) return RC_FINISH_STOP_SEQUENCE;
    if (backend == RC_FINISH_STOP && s->has_calls) return RC_FINISH_TOOL_CALLS;
    return backend;
}

const char *rc_stream_stop_sequence(const rc_stream *s) {
    return s->stopped ? (s->stopseq.v ? s->stopseq.v : "") : NULL;
}

int rc_stream_has_tool_calls(const rc_stream *s) { return s->has_calls; }

void rc_stream_invalid_counts(const rc_stream *s, size_t *a, size_t *b) {
    *a = s->bad_think;
    *b = s->bad_after;
}

int rc_stream_feed_ids(rc_stream *s, const char *text, size_t n, const size_t *ends, size_t nids, rc_event_fn fn,
                       void *ctx) {
    size_t base = s->base + s->buf.n; /* global offset of text[0] */
    if (s->nid_end + nids > s->cap_id_end) {
        size_t cap = s->cap_id_end ? s->cap_id_end * 2 : 64;
        while (cap < s->nid_end + nids) cap *= 2;
        size_t *v = realloc(s->id_end, cap * sizeof *v);
        if (!v) return rc_stream_feed(s, text, n, fn, ctx);
        s->id_end = v;
        s->cap_id_end = cap;
    }
    for (size_t k = 0; k < nids; k++) s->id_end[s->nid_end++] = base + ends[k];
    /* ids without text (a character still incomplete) are only noted: an
     * empty text is not an empty source chunk here */
    return n ? rc_stream_feed(s, text, n, fn, ctx) : s->stopped;
}

long long rc_stream_reasoning_tokens(const rc_stream *s) { return s->reasoning_ids; }
