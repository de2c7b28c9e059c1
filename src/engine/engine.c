/* engine.c - the request queue and the continuous-batching loop.
 *
 * One thread (loop) owns the backend, the running sequences and every
 * callback.  Other threads only touch the shared part of struct engine, behind
 * e->mu: the waiting FIFO, the "dead" list (requests cancelled while waiting,
 * whose on_done is still owed), the live list (every request between submit
 * and on_done, so eng_cancel can tell a live request from a finished one
 * without dereferencing it), the counters and the shutdown state.
 *
 * A step, in order:
 *   1. deliver ENG_CANCELLED to the dead list and to running requests whose
 *      cancel flag is set (freeing their sequences) - so a cancelled request
 *      never reaches another forward;
 *   2. every decoding sequence contributes its last sampled token (1 each);
 *   3. sequences still in prefill, in admission order, take the next chunk of
 *      their prompt from the remaining token budget (max_batch_tokens);
 *   4. while budget and max_running allow, the oldest waiting request is
 *      admitted and gets its first chunk;
 *   5. one backend forward over all of it; logits are requested only for
 *      decodes and for the chunk that completes a prompt;
 *   6. sample, report, stop checks, on_done for whatever finished.
 * max_running is clamped to max_batch_tokens, so step 2 always fits and a
 * sequence in prefill always gets at least one token: nothing starves.
 *
 * Reporting: EOS ends a request without an on_token, but it was generated,
 * so it counts in completion_tokens (on_done's and the stats', as vLLM's
 * usage does); a stop id is reported, then ends it.  t_first_token is the time
 * of the first sampled token (the first on_token, or that EOS).  Counters are
 * published before a step's callbacks, so whoever sees an on_done also sees
 * them; the state_bytes gauge and the running count drop before on_done.
 *
 * Shutdown: new submits get ENG_EBUSY at once; requests already accepted
 * (running or waiting) keep being served until the deadline, then whatever is
 * left gets ENG_CANCELLED.  deadline_ms < 0 waits for all of them.
 *
 * Callbacks run without e->mu held, so they may call eng_submit, eng_cancel
 * and eng_get_stats (not eng_shutdown / eng_destroy, which join this thread).
 *
 * Prefix cache: at admission the backend's prefix_attach (optional) may fill
 * the fresh state with a cached prefix; prefill starts after it.
 *
 * Not here: the model (model_backend.c), sampling math (sampler.c), the
 * cache itself (kv/cache.h) or preemption - a running sequence holds its
 * state to the end. */
#include "engine/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/pool.h"
#include "engine/sampler.h"

enum { SLOT_WAITING, SLOT_DEAD, SLOT_RUNNING };

typedef struct eng_slot {
    eng_request *req;
    int32_t *prompt;        /* our copy */
    size_t n_prompt;
    eng_sampling sp;        /* our copy; sp.stop_ids points at our copy too */
    void *seq;              /* backend state, from admission on */
    size_t n_fed;           /* prompt tokens the state holds */
    size_t n_out;           /* tokens sampled, EOS included */
    int32_t last;           /* newest sampled token = the next decode input */
    uint64_t rng;
    size_t bytes;           /* its share of st.state_bytes (loop thread only) */
    atomic_int cancel;      /* set by eng_cancel, read at the start of a step */
    /* under e->mu */
    int where;              /* SLOT_* */
    struct eng_slot *lprev, *lnext;  /* live list */
    struct eng_slot *qprev, *qnext;  /* waiting FIFO, or the dead list (qnext only) */
} eng_slot;

struct engine {
    eng_backend be;
    int max_batch_tokens, max_running, max_waiting;

    pthread_mutex_t mu;
    pthread_cond_t work;     /* the loop sleeps here when idle */
    pthread_cond_t joined_cv;
    /* --- under mu */
    eng_slot *live;
    eng_slot *wq_head, *wq_tail;
    int n_waiting;
    eng_slot *dead;
    int n_run;               /* written by the loop under mu; the loop may read it bare */
    int stopping, join_claimed, joined;
    double deadline;         /* CLOCK_MONOTONIC seconds; INFINITY = none */
    uint64_t n_submitted;    /* seeds for requests without one */
    eng_stats st;
    size_t (*state_fn)(void *impl, void *seq);

    /* --- loop thread only */
    eng_slot **run;          /* running sequences, admission order */
    void **b_seqs;
    const int32_t **b_ids;
    size_t *b_n;
    float **b_logits;
    eng_slot **b_slot;
    int *b_prefill;          /* item i is a prompt chunk (else a decode) */
    int *b_want;             /* item i asks for logits */
    int *b_tok;              /* item i's sampled token (< 0: sampling failed) */
    int32_t **b_top1;        /* item i's greedy token only (forward_top1): &b_top1v[i], else NULL */
    int32_t *b_top1v;
    rc_draw **b_draw;        /* item i's draw offered to the backend (forward_draw): &b_drawv[i], else NULL */
    rc_draw *b_drawv;
    float *lbuf;             /* logits rows of one step */
    size_t lbuf_rows;
    eng_sample_scratch *ws;  /* one a sampling task */
    rc_pool *spool;          /* the sampling threads (NULL: the engine thread alone) */
    int s_threads;
    size_t *s_rows;          /* the step's items that draw on the host */
    size_t s_n, s_nt;        /* their count; the step's sampling tasks */
    pthread_t thread;
};

/* sampling task t of a step: the host-drawn rows t, t + s_nt, .. with scratch t */
static void sample_task(void *arg, size_t t)
{
    engine *e = arg;
    for (size_t r = t; r < e->s_n; r += e->s_nt) {
        const size_t i = e->s_rows[r];
        eng_slot *s = e->b_slot[i];
        e->b_tok[i] = e->b_draw[i] ? eng_sample_u01(e->b_logits[i], e->be.vocab, &s->sp, e->b_draw[i]->u01, &e->ws[t])
                                   : eng_sample_ws(e->b_logits[i], e->be.vocab, &s->sp, &s->rng, &e->ws[t]);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void slot_free(eng_slot *s)
{
    if (!s) return;
    free(s->prompt);
    free((void *)s->sp.stop_ids);
    free(s);
}

/* ------------------------------------------------------------ lists (mu) */

static void live_unlink(engine *e, eng_slot *s)
{
    if (s->lprev) s->lprev->lnext = s->lnext; else e->live = s->lnext;
    if (s->lnext) s->lnext->lprev = s->lprev;
    s->lprev = s->lnext = NULL;
}

static eng_slot *live_find(engine *e, const eng_request *req)
{
    for (eng_slot *s = e->live; s; s = s->lnext)
        if (s->req == req) return s;
    return NULL;
}

static void wq_unlink(engine *e, eng_slot *s)
{
    if (s->qprev) s->qprev->qnext = s->qnext; else e->wq_head = s->qnext;
    if (s->qnext) s->qnext->qprev = s->qprev; else e->wq_tail = s->qprev;
    s->qprev = s->qnext = NULL;
    e->n_waiting--;
}

static void dead_push(engine *e, eng_slot *s)
{
    s->where = SLOT_DEAD;
    s->qprev = NULL;
    s->qnext = e->dead;
    e->dead = s;
}

/* past the shutdown deadline: everything still here is cancelled */
static void cancel_all_locked(engine *e)
{
    while (e->wq_head) {
        eng_slot *s = e->wq_head;
        wq_unlink(e, s);
        dead_push(e, s);
    }
    for (int i = 0; i < e->n_run; i++) atomic_store(&e->run[i]->cancel, 1);
}

/* ------------------------------------------------------------ loop side */

/* The one exit of a request: free the state, forget it, then on_done.  After
 * the unlink under mu, eng_cancel no longer finds it. */
static void finish(engine *e, eng_slot *s, eng_reason why, const char *msg)
{
    if (s->seq) e->be.seq_free(e->be.impl, s->seq);
    s->seq = NULL;
    pthread_mutex_lock(&e->mu);
    live_unlink(e, s);
    e->st.state_bytes -= s->bytes;  /* the gauge drops with the running count */
    if (s->where == SLOT_RUNNING) {
        for (int i = 0; i < e->n_run; i++)
            if (e->run[i] == s) {
                memmove(&e->run[i], &e->run[i + 1], (size_t)(e->n_run - i - 1) * sizeof *e->run);
                e->n_run--;
                break;
            }
    }
    pthread_mutex_unlock(&e->mu);
    eng_request *r = s->req;
    size_t n = s->n_out;
    slot_free(s);
    r->t_done = now_s();
    r->on_done(r->ctx, why, n, msg);
}

typedef struct {
    size_t items, budget;
    uint64_t prompt_tokens;
} step_plan;

static void plan_add(engine *e, step_plan *p, eng_slot *s, const int32_t *ids, size_t n, int want_logits,
                     int prefill)
{
    size_t i = p->items++;
    e->b_seqs[i] = s->seq;
    e->b_ids[i] = ids;
    e->b_n[i] = n;
    e->b_logits[i] = NULL;   /* placed in lbuf once the step's rows are known */
    e->b_want[i] = want_logits;
    e->b_slot[i] = s;
    e->b_prefill[i] = prefill;
    p->budget -= n;
}

static void plan_prefill(engine *e, step_plan *p, eng_slot *s)
{
    size_t rest = s->n_prompt - s->n_fed;
    size_t k = rest < p->budget ? rest : p->budget;
    if (k) plan_add(e, p, s, s->prompt + s->n_fed, k, k == rest, 1);
}

/* after a forward: report s's sampled token id, decide whether s ends */
static void after_sample(engine *e, eng_slot *s, int id)
{
    eng_request *r = s->req;
    if (id < 0) { finish(e, s, ENG_ERROR, "sampling failed: out of memory"); return; }
    s->n_out++;
    if (s->n_out == 1) r->t_first_token = now_s();
    if (id == e->be.eos_id && !s->sp.ignore_eos) { finish(e, s, ENG_STOP_EOS, NULL); return; }
    if (r->on_token) r->on_token(r->ctx, id);
    for (size_t j = 0; j < s->sp.n_stop_ids; j++)
        if (s->sp.stop_ids[j] == id) { finish(e, s, ENG_STOP_ID, NULL); return; }
    if (s->n_out >= (size_t)s->sp.max_tokens) { finish(e, s, ENG_STOP_LENGTH, NULL); return; }
    if (s->n_prompt + s->n_out >= (size_t)e->be.max_context) { finish(e, s, ENG_STOP_CONTEXT, NULL); return; }
    s->last = id;
}

static void *loop(void *arg)
{
    engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stopping && !e->wq_head && !e->n_run && !e->dead) pthread_cond_wait(&e->work, &e->mu);
        const int past_deadline = e->stopping && now_s() >= e->deadline;
        if (past_deadline) cancel_all_locked(e);
        if (e->stopping && !e->wq_head && !e->n_run && !e->dead) break;
        eng_slot *dead = e->dead;
        e->dead = NULL;
        size_t (*state_fn)(void *, void *) = e->state_fn;
        pthread_mutex_unlock(&e->mu);

        /* 1. cancellations */
        while (dead) {
            eng_slot *nx = dead->qnext;
            finish(e, dead, ENG_CANCELLED, NULL);
            dead = nx;
        }
        for (int i = e->n_run - 1; i >= 0; i--)
            if (atomic_load(&e->run[i]->cancel)) finish(e, e->run[i], ENG_CANCELLED, NULL);

        /* 2-4. plan the batch */
        step_plan p = {.budget = (size_t)e->max_batch_tokens};
        for (int i = 0; i < e->n_run; i++) {
            eng_slot *s = e->run[i];
            if (s->n_fed == s->n_prompt) plan_add(e, &p, s, &s->last, 1, 1, 0);
        }
        for (int i = 0; i < e->n_run && p.budget; i++)
            if (e->run[i]->n_fed < e->run[i]->n_prompt) plan_prefill(e, &p, e->run[i]);
        while (p.budget && !past_deadline) {
            pthread_mutex_lock(&e->mu);
            eng_slot *s = e->n_run < e->max_running ? e->wq_head : NULL;
            if (s) {
                wq_unlink(e, s);
                s->where = SLOT_RUNNING;
                e->run[e->n_run++] = s;
            }
            pthread_mutex_unlock(&e->mu);
            if (!s) break;
            s->seq = e->be.seq_new(e->be.impl);
            if (!s->seq) { finish(e, s, ENG_ERROR, "could not allocate a sequence state (out of memory)"); continue; }
            if (e->be.prefix_attach) {
                size_t have = e->be.prefix_attach(e->be.impl, s->seq, s->prompt, s->n_prompt, s->req);
                s->n_fed = have < s->n_prompt ? have : 0;
            }
            plan_prefill(e, &p, s);
        }
        if (!p.items) { pthread_mutex_lock(&e->mu); continue; }

        /* 5. one forward; a greedy item needs only its token, when the backend can give just that */
        size_t rows = 0;
        for (size_t i = 0; i < p.items; i++) {
            const int top1 =
                e->b_want[i] && e->be.forward_top1 && !e->be.forced && eng_sampling_greedy(&e->b_slot[i]->sp);
            e->b_top1[i] = top1 ? &e->b_top1v[i] : NULL;
            rows += (size_t)(e->b_want[i] && !top1);
            /* a sampled item offers its draw to the backend: its uniform is taken now, once, as the host draw would */
            e->b_draw[i] = NULL;
            if (e->b_want[i] && !top1 && e->be.forward_draw && !e->be.forced &&
                !eng_sampling_greedy(&e->b_slot[i]->sp)) {
                const eng_sampling *sp = &e->b_slot[i]->sp;
                e->b_drawv[i] = (rc_draw){.temperature = sp->temperature, .top_p = sp->top_p, .min_p = sp->min_p,
                                          .top_k = sp->top_k, .u01 = eng_sample_uniform(&e->b_slot[i]->rng),
                                          .token = -1};
                e->b_draw[i] = &e->b_drawv[i];
            }
        }
        rc_err err = {0};
        int rc = 0;
        if (rows > e->lbuf_rows) {
            float *nb = realloc(e->lbuf, rows * (size_t)e->be.vocab * sizeof(float));
            if (nb) { e->lbuf = nb; e->lbuf_rows = rows; }
            else rc = rc_errf(&err, RC_ENOMEM, "out of memory for the logits of %zu sequences", rows);
        }
        if (!rc) {
            for (size_t i = 0, r = 0; i < p.items; i++)
                if (e->b_want[i] && !e->b_top1[i]) e->b_logits[i] = e->lbuf + (r++) * (size_t)e->be.vocab;
            rc = e->be.forward_draw ? e->be.forward_draw(e->be.impl, e->b_seqs, e->b_ids, e->b_n, e->b_logits,
                                                          e->b_top1, e->b_draw, p.items, &err)
                 : e->be.forward_top1 ? e->be.forward_top1(e->be.impl, e->b_seqs, e->b_ids, e->b_n, e->b_logits,
                                                          e->b_top1, p.items, &err)
                                    : e->be.forward(e->be.impl, e->b_seqs, e->b_ids, e->b_n, e->b_logits, p.items,
                                                    &err);
            if (rc && !err.msg[0]) rc_errf(&err, rc, "forward failed (%s)", rc_strerror(rc));
        }
        if (rc) {
            for (size_t i = 0; i < p.items; i++) finish(e, e->b_slot[i], ENG_ERROR, err.msg);
            pthread_mutex_lock(&e->mu);
            continue;
        }

        /* 6. sample all (the rows that draw on the host over the sampling threads: each row's rng is its own, so
         * the tokens do not depend on the split), publish the counters, then report: whoever sees an on_token /
         * on_done of this step already sees its counts */
        uint64_t completion = 0;
        e->s_n = 0;
        for (size_t i = 0; i < p.items; i++) {
            eng_slot *s = e->b_slot[i];
            if (e->b_prefill[i]) { s->n_fed += e->b_n[i]; p.prompt_tokens += e->b_n[i]; }
            if (!e->b_want[i]) continue;
            int32_t f = e->be.forced ? e->be.forced(e->be.impl, e->b_seqs[i]) : -1;
            if (f >= 0) e->b_tok[i] = f;
            else if (e->b_top1[i]) e->b_tok[i] = *e->b_top1[i];
            else if (e->b_draw[i] && e->b_draw[i]->token >= 0) e->b_tok[i] = e->b_draw[i]->token;
            else e->s_rows[e->s_n++] = i;
        }
        if (e->s_n) {
            e->s_nt = e->spool && e->s_n > 1 ? (e->s_n < (size_t)e->s_threads ? e->s_n : (size_t)e->s_threads) : 1;
            if (e->s_nt > 1) rc_pool_run(e->spool, e->s_nt, sample_task, e);
            else sample_task(e, 0);
        }
        for (size_t i = 0; i < p.items; i++) completion += e->b_want[i] && e->b_tok[i] >= 0;
        pthread_mutex_lock(&e->mu);
        e->st.steps++;
        e->st.prompt_tokens += p.prompt_tokens;
        e->st.completion_tokens += completion;
        pthread_mutex_unlock(&e->mu);
        for (size_t i = 0; i < p.items; i++)
            if (e->b_want[i]) after_sample(e, e->b_slot[i], e->b_tok[i]);
        size_t bytes = 0;
        if (state_fn)
            for (int i = 0; i < e->n_run; i++) {
                eng_slot *s = e->run[i];
                s->bytes = s->seq ? state_fn(e->be.impl, s->seq) : 0;
                bytes += s->bytes;
            }
        pthread_mutex_lock(&e->mu);
        if (state_fn) e->st.state_bytes = bytes;
    }
    e->st.state_bytes = 0;
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ------------------------------------------------------------ public */

engine *eng_create(const eng_backend *be, const eng_cfg *cfg, rc_err *err)
{
    if (!be || !be->seq_new || !be->seq_free || !be->forward) {
        rc_errf(err, RC_EINVAL, "engine backend is missing seq_new, seq_free or forward");
        return NULL;
    }
    if (be->vocab <= 0 || be->max_context <= 0 || be->eos_id >= be->vocab) {
        rc_errf(err, RC_EINVAL, "engine backend: vocab %d, max_context %d, eos_id %d are not usable", be->vocab,
                be->max_context, be->eos_id);
        return NULL;
    }
    eng_cfg c = cfg ? *cfg : (eng_cfg){0};
    if (c.max_batch_tokens <= 0) c.max_batch_tokens = 2048;
    if (c.max_running <= 0) c.max_running = 256;
    if (c.max_waiting <= 0) c.max_waiting = 256;
    if (c.max_running > c.max_batch_tokens) c.max_running = c.max_batch_tokens; /* decodes always fit a step */

    engine *e = calloc(1, sizeof *e);
    if (!e) { rc_errf(err, RC_ENOMEM, "out of memory"); return NULL; }
    e->be = *be;
    e->max_batch_tokens = c.max_batch_tokens;
    e->max_running = c.max_running;
    e->max_waiting = c.max_waiting;
    e->deadline = INFINITY;
    size_t n = (size_t)c.max_running;
    e->run = calloc(n, sizeof *e->run);
    e->b_seqs = calloc(n, sizeof *e->b_seqs);
    e->b_ids = calloc(n, sizeof *e->b_ids);
    e->b_n = calloc(n, sizeof *e->b_n);
    e->b_logits = calloc(n, sizeof *e->b_logits);
    e->b_slot = calloc(n, sizeof *e->b_slot);
    e->b_prefill = calloc(n, sizeof *e->b_prefill);
    e->b_want = calloc(n, sizeof *e->b_want);
    e->b_tok = calloc(n, sizeof *e->b_tok);
    e->b_top1 = calloc(n, sizeof *e->b_top1);
    e->b_top1v = calloc(n, sizeof *e->b_top1v);
    e->b_draw = calloc(n, sizeof *e->b_draw);
    e->b_drawv = calloc(n, sizeof *e->b_drawv);
    e->s_rows = calloc(n, sizeof *e->s_rows);
    int st = c.sample_threads;
    if (st <= 0) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        st = cpus < 1 ? 1 : cpus > 16 ? 16 : (int)cpus;
    }
    if (st > c.max_running) st = c.max_running;
    e->s_threads = st;
    e->ws = calloc((size_t)st, sizeof *e->ws);
    if (st > 1) e->spool = rc_pool_create(st);
    if (!e->run || !e->b_seqs || !e->b_ids || !e->b_n || !e->b_logits || !e->b_slot || !e->b_prefill ||
        !e->b_want || !e->b_tok || !e->b_top1 || !e->b_top1v || !e->b_draw || !e->b_drawv || !e->s_rows || !e->ws ||
        (st > 1 && !e->spool)) {
        rc_errf(err, RC_ENOMEM, "out of memory for %d running sequences", c.max_running);
        goto fail;
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->joined_cv, NULL);
    if (pthread_create(&e->thread, NULL, loop, e)) {
        rc_errf(err, RC_ENOMEM, "could not start the engine thread");
        pthread_cond_destroy(&e->joined_cv);
        pthread_cond_destroy(&e->work);
        pthread_mutex_destroy(&e->mu);
        goto fail;
    }
    return e;
fail:
    rc_pool_destroy(e->spool);
    free(e->ws); free(e->s_rows);
    free(e->run); free(e->b_seqs); free(e->b_ids); free(e->b_n); free(e->b_logits); free(e->b_slot);
    free(e->b_prefill); free(e->b_want); free(e->b_tok); free(e->b_top1); free(e->b_top1v);
    free(e->b_draw); free(e->b_drawv);
    free(e);
    return NULL;
}

static int check_sampling(const eng_sampling *s, rc_err *err)
{
    if (!(s->temperature >= 0) || isinf(s->temperature))
        return rc_errf(err, RC_EINVAL, "temperature must be a finite number >= 0 (got %g)", s->temperature);
    if (!(s->top_p >= 0 && s->top_p <= 1))
        return rc_errf(err, RC_EINVAL, "top_p must be in [0, 1], 0 and 1 meaning off (got %g)", s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1))
        return rc_errf(err, RC_EINVAL, "min_p must be in [0, 1] (got %g)", s->min_p);
    if (s->max_tokens <= 0) return rc_errf(err, RC_EINVAL, "max_tokens must be > 0 (got %d)", s->max_tokens);
    if (s->n_stop_ids && !s->stop_ids) return rc_errf(err, RC_EINVAL, "n_stop_ids is %zu but stop_ids is NULL", s->n_stop_ids);
    return 0;
}

int eng_submit(engine *e, eng_request *req, rc_err *err)
{
    if (!e || !req || !req->on_done) return rc_errf(err, RC_EINVAL, "a request needs on_done");
    if (!req->n_prompt || !req->prompt) return rc_errf(err, RC_EINVAL, "empty prompt");
    int rc = check_sampling(&req->sampling, err);
    if (rc) return rc;
    const size_t V = (size_t)e->be.vocab, C = (size_t)e->be.max_context;
    if (req->n_prompt > C || (size_t)req->sampling.max_tokens > C - req->n_prompt)
        return rc_errf(err, RC_EINVAL,
                       "prompt (%zu tokens) + max_tokens (%d) = %zu tokens exceeds the context of %zu tokens",
                       req->n_prompt, req->sampling.max_tokens, req->n_prompt + (size_t)req->sampling.max_tokens, C);
    for (size_t i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || (size_t)req->prompt[i] >= V)
            return rc_errf(err, RC_EINVAL, "prompt token %zu is %d, outside the vocabulary (0..%zu)", i,
                           req->prompt[i], V - 1);

    eng_slot *s = calloc(1, sizeof *s);
    int32_t *stop = NULL;
    if (s) s->prompt = malloc(req->n_prompt * sizeof *s->prompt);
    if (s && req->sampling.n_stop_ids) stop = malloc(req->sampling.n_stop_ids * sizeof *stop);
    if (!s || !s->prompt || (req->sampling.n_stop_ids && !stop)) {
        free(stop);
        slot_free(s);
        return rc_errf(err, RC_ENOMEM, "out of memory for a request of %zu tokens", req->n_prompt);
    }
    memcpy(s->prompt, req->prompt, req->n_prompt * sizeof *s->prompt);
    if (stop) memcpy(stop, req->sampling.stop_ids, req->sampling.n_stop_ids * sizeof *stop);
    s->req = req;
    s->n_prompt = req->n_prompt;
    s->sp = req->sampling;
    s->sp.stop_ids = stop;
    atomic_init(&s->cancel, 0);

    pthread_mutex_lock(&e->mu);
    if (e->stopping) rc = rc_errf(err, ENG_EBUSY, "the engine is shutting down");
    else if (e->n_waiting >= e->max_waiting)
        rc = rc_errf(err, ENG_EBUSY, "the waiting queue is full (%d requests)", e->max_waiting);
    else if (live_find(e, req)) rc = rc_errf(err, RC_EINVAL, "this request is already submitted");
    if (rc) {
        pthread_mutex_unlock(&e->mu);
        slot_free(s);
        return rc;
    }
    if (s->sp.has_seed) s->rng = eng_rng_init(s->sp.seed);
    else {
        uint64_t k = e->n_submitted;
        s->rng = eng_rng_init(eng_rng_next(&k));
    }
    e->n_submitted++;
    req->t_submit = now_s();
    req->cached_tokens = 0;
    req->cache_path = 0;
    req->t_first_token = req->t_done = 0;
    s->where = SLOT_WAITING;
    s->lnext = e->live;
    if (e->live) e->live->lprev = s;
    e->live = s;
    s->qprev = e->wq_tail;
    if (e->wq_tail) e->wq_tail->qnext = s; else e->wq_head = s;
    e->wq_tail = s;
    e->n_waiting++;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void eng_cancel(engine *e, eng_request *req)
{
    if (!e || !req) return;
    pthread_mutex_lock(&e->mu);
    eng_slot *s = live_find(e, req);  /* NULL once on_done has begun: a no-op */
    if (s && s->where == SLOT_WAITING) {
        wq_unlink(e, s);
        dead_push(e, s);
    } else if (s) {
        atomic_store(&s->cancel, 1);
    }
    if (s) pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void eng_shutdown(engine *e, int deadline_ms)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    double dl = deadline_ms < 0 ? INFINITY : now_s() + deadline_ms / 1000.0;
    if (!e->stopping || dl < e->deadline) e->deadline = dl;
    e->stopping = 1;
    pthread_cond_signal(&e->work);
    if (pthread_equal(pthread_self(), e->thread)) {
        /* from a callback: the loop cannot join itself; it stops on its own */
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (e->join_claimed) {
        while (!e->joined) pthread_cond_wait(&e->joined_cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->join_claimed = 1;
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    pthread_mutex_lock(&e->mu);
    e->joined = 1;
    pthread_cond_broadcast(&e->joined_cv);
    pthread_mutex_unlock(&e->mu);
}

void eng_destroy(engine *e)
{
    if (!e) return;
    eng_shutdown(e, 0);
    /* the loop exits only with nothing waiting, running or dead */
    pthread_cond_destroy(&e->joined_cv);
    pthread_cond_destroy(&e->work);
    pthread_mutex_destroy(&e->mu);
    for (int t = 0; t < e->s_threads; t++) eng_sample_scratch_free(&e->ws[t]);
    rc_pool_destroy(e->spool);
    free(e->ws); free(e->s_rows);
    free(e->lbuf);
    free(e->run); free(e->b_seqs); free(e->b_ids); free(e->b_n); free(e->b_logits); free(e->b_slot);
    free(e->b_prefill); free(e->b_want); free(e->b_tok); free(e->b_top1); free(e->b_top1v);
    free(e->b_draw); free(e->b_drawv);
    free(e);
}

void eng_get_stats(engine *e, eng_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->running = e->n_run;
    out->waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

void eng_set_state_bytes_fn(engine *e, size_t (*fn)(void *impl, void *seq))
{
    pthread_mutex_lock(&e->mu);
    e->state_fn = fn;
    pthread_mutex_unlock(&e->mu);
}
