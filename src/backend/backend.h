/* backend.h - the op set the V4 graph is written against.
 *
 * The graph (src/model/v4.c) owns control flow: which tokens, which positions,
 * which cache entries a query may see, which experts a token goes to.  The
 * backend owns arithmetic over fp32 activation rows.  Every op here is a pure
 * function of its inputs, row by row: the result for one row never depends on
 * which other rows share the call.  That property is what makes chunked
 * prefill, token-by-token decode and continuous batching give bit-identical
 * results, and every backend must keep it.
 *
 * Weights stay in their checkpoint format (bf16, f16, f32, FP8 e4m3 with block
 * scales, FP4 e2m1 with 1xN scales); be_linear dequantizes on the fly.
 *
 * The CPU backend (src/backend/cpu/) is the reference.  The CUDA backend
 * (issue 7) implements the same table over device memory. */
#ifndef BACKEND_BACKEND_H
#define BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model/dtype.h"

/* A weight matrix [rows, cols] (rows = output features) in checkpoint format. */
typedef enum { BE_W_DENSE = 0, BE_W_FP8 = 1, BE_W_FP4 = 2 } be_wfmt;

typedef struct be_weight {
    be_wfmt fmt;
    md_dtype dtype;        /* DENSE: BF16/F16/F32; FP8: F8_E4M3; FP4: I8/U8 packed */
    const void *data;
    int64_t rows, cols;    /* logical shape (FP4: cols counts elements, not bytes) */
    const void *scale;     /* FP8: [ceil(rows/bs), ceil(cols/bs)]; FP4: [rows, cols/bs] */
    md_dtype scale_dtype;  /* F8_E8M0 or F32 */
    int block;             /* bs */
} be_weight;

typedef struct be_backend be_backend;

/* be_ops.moe flags */
enum { BE_MOE_WEIGHT_BEFORE_W2 = 1, BE_MOE_ACT_FP8_H = 2, BE_MOE_ACT_FP8_X = 4 };

/* One sequence of an attention call (be_ops.attention).  Its query rows are
 * T consecutive rows of the call, at positions p0 .. p0+T-1. */
typedef struct be_attn_seq {
    int64_t p0;
    int64_t kstart;             /* first position in kwin: max(p0 - window + 1, win_lo, 0) */
    int32_t T;
    const float *kwin;          /* [p0 + T - kstart, head_dim] window keys (= values) */
    const float *const *blocks; /* nblk KV block data pointers (v4.h layout), block i = tokens 128i .. 128i+127 */
    const uint64_t *block_ids;  /* their md_block ids: equal ids, equal contents, while the block is full */
    size_t nblk;
    size_t nfull;               /* blocks [0, nfull) are complete for every layer and immutable; the rest may
                                 * still change (a block this forward completes gets later layers' rows later) */
    /* The device graph (be_dev_ops.attention) may pass kwin = NULL and instead: win_key, which names this state
     * (the same key and p0 always mean the same window), ring, the host window ring [window, head_dim] (slot
     * pos % window; valid for positions < p0), and krows, the segment's T keys in device memory.  A backend that
     * keeps its own copy of the ring (keyed by win_key and layer, brought up to date from ring when its copy is
     * not at p0) builds the window from it; one that cannot declines. */
    uint64_t win_key;
    const float *ring;
    const float *krows;
    /* The device graph's compressors may run on the device (be_dev_ops.comp_pool): then entries [ent0, ent0 +
     * nent) of this layer, which this call's tokens complete, are at ent_dev [nent, head_dim] and indexer keys
     * [key0, key0 + nkey) at key_dev [nkey, index_dim], device memory, and the blocks' host rows for them are not
     * written yet.  A backend takes those rows from there, or declines (nent = nkey = 0: nothing such). */
    const float *ent_dev, *key_dev;
    int64_t ent0, nent, key0, nkey;
} be_attn_seq;

/* One slot of an entry for be_dev_ops.comp_pool: its kv and gate rows (device memory, hd floats each) and the
 * offset in floats of the ape row added to the gate (-1: the gate has it already).  kv NULL: no slot there. */
typedef struct be_comp_slot {
    const float *kv, *g;
    int64_t ape;
} be_comp_slot;

/* One layer's attention for a batch of sequences: the math of v4.c's
 * indexer_task and attn_task (src/backend/cuda/attn.h states it), over the
 * rows of all sequences stacked in order. */
typedef struct be_attn_args {
    int n_heads, head_dim, rope_dim, window;
    int ratio;                  /* 0: window only */
    int csa;                    /* ratio > 0: 1 = the indexer's top-k (CSA), 0 = every visible entry (HCA) */
    size_t blk_floats;          /* floats per KV block */
    size_t ent_off, key_off;    /* this layer's entries / indexer keys in a block */
    int index_heads, index_dim, topk;
    const float *q;             /* [ntok, n_heads, head_dim] roped queries */
    const float *iq, *iw;       /* CSA: [ntok, index_heads, index_dim] indexer queries, [ntok, index_heads] weights */
    const float *sink;          /* [n_heads] */
    const float *inv_freq;      /* [rope_dim / 2] */
    float *out;                 /* [ntok, n_heads, head_dim] */
    int layer;                  /* the model layer (keys the backend's ring copies) */
    int ix_fp4;                 /* CSA: iq and the blocks' indexer keys went through fq_fp4 (official semantics):
                                 * each an e2m1 code times a power of two, exact in bf16 */
    int kv_fp8;                 /* the keys' (window and entries') first head_dim - rope_dim channels went through
                                 * fq_fp8 (official semantics): e4m3 codes times powers of two, exact in bf16 */
} be_attn_args;

struct be_dev_ops;

typedef struct be_ops {
    const char *name;
    /* y[t, 0:w->rows] = x[t, 0:w->cols] . W^T for t in [0, T). */
    void (*linear)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w);
    /* Same, for a row-slice of W: output features [r0, r0+n). Used by the
     * grouped output projection (wo_a viewed [g, o_l, in/g]). */
    void (*linear_rows)(be_backend *be, float *y, size_t ldy, const float *x, size_t ldx,
                        size_t T, const be_weight *w, int64_t r0, int64_t n, int64_t c0);
    /* Per-row RMSNorm over dim; w may be NULL (unweighted).  In place allowed. */
    void (*rmsnorm)(be_backend *be, float *y, const float *x, size_t rows, size_t dim,
                    const float *w, float eps);
    /* frees the backend (be_destroy dispatches here) */
    void (*destroy)(be_backend *be);
    /* Optional (NULL: the graph loops over experts with linear).  The routed
     * experts of a MoE layer in one call: y[t] = sum over k of token t's
     * experts ids[t, k] (ascending id) of W2 h, h = swiglu(W1 x, W3 x), the
     * weight w[t, k] applied to h before W2 (flag BE_MOE_WEIGHT_BEFORE_W2,
     * official semantics) or to W2 h; with BE_MOE_ACT_FP8_H, h (after the
     * weight) goes through v4.c's fq_fp8 in blocks of 128 columns before W2
     * (the official act_quant of an FP8 / FP4 GEMM's input); BE_MOE_ACT_FP8_X
     * says x already went through it (a hint: the backend may use that every
     * value is an e4m3 code times a power of two).  w1/w3/w2 are
     * arrays of n_experts weights.  Returns 0 when y holds the result, > 0
     * when this backend does not take these weights or flags (the caller
     * loops instead), < 0 on a backend error (y is NaN). */
    int (*moe)(be_backend *be, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
               const be_weight *w1, const be_weight *w3, const be_weight *w2, int n_experts, float swiglu_limit,
               int flags);
    /* Optional (NULL: the graph runs its host loops).  One layer's attention
     * (with the CSA indexer) for nseq sequences; ntok = sum of their T.
     * Returns 0 when out holds the result, > 0 when this backend declines
     * (the caller computes it), < 0 on a backend error (out is NaN). */
    int (*attention)(be_backend *be, const be_attn_seq *seqs, int nseq, int ntok, const be_attn_args *a);
    /* Optional (NULL: the graph calls linear_rows per group).  The grouped
     * projection (wo_a): for g in [0, groups), with n = w->rows / groups and
     * K = w->cols, y[t, g*n : (g+1)*n] = x[t, g*K : (g+1)*K] . W[g*n : (g+1)*n, :]^T;
     * x is [T, groups*K], y [T, groups*n].  Each group's result must equal
     * linear_rows on that slice. */
    void (*linear_grouped)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w, int groups);
    /* Optional (NULL: the graph keeps its activations in host memory).  The
     * device-resident graph: md_forward then keeps every activation in this
     * backend's memory and calls these ops instead (below). */
    const struct be_dev_ops *dev;
} be_ops;

/* One sampled row's draw on the device (be_dev_ops.sample): engine/sampler.h's rules, with the uniform given */
typedef struct be_draw {
    uint32_t row;    /* the row of the logits */
    int32_t top_k;   /* <= 0: off */
    double inv_t;    /* 1 / temperature (> 0), as the host sampler computes it */
    double top_p;    /* off unless in (0, 1) */
    double min_p;    /* <= 0: off */
    double u01;      /* the draw's uniform, [0, 1) */
} be_draw;

/* mHC parameters of one site (v4.c hc_pre_task); fn, base, scale are the model's host arrays */
typedef struct be_hc {
    int n, D, iters;
    float hc_eps, rms_eps;
    const float *fn, *base, *scale; /* [(2+n)n, n*D], [(2+n)n], [3] (the head: [n, n*D], [n], [1]) */
} be_hc;

/* MoE routing of one layer (v4.c moe()); bias / tid2eid are the model's host arrays */
typedef struct be_route {
    int E, K, score_func, official, vocab;
    float route_scale;
    const float *bias;      /* [E], NULL on hash layers */
    const int32_t *tid2eid; /* [vocab, K] on hash layers, else NULL */
} be_route;

/* The device-resident graph (src/model/v4.c forward_dev).  Activation
 * pointers ("device") come from alloc and stay valid until the next reset;
 * parameter arrays (norm weights, mHC, RoPE frequencies, routing bias, hash
 * table, sinks) are the model's host arrays, which the backend mirrors once.
 * The math ops are asynchronous and return nothing: a failure is sticky
 * (failed() != 0, be_cuda_error says why) and later ops do nothing.  Each op
 * is the math of the v4.c host code or be_ops entry it is named after. */
typedef struct be_dev_ops {
    void (*reset)(be_backend *be);                 /* start of a forward: every earlier alloc is void */
    void *(*alloc)(be_backend *be, size_t bytes);  /* NULL when out of device memory */
    void (*upload)(be_backend *be, void *dst, const void *src, size_t bytes);   /* host -> device; src reusable */
    int (*download)(be_backend *be, void *dst, const void *src, size_t bytes);  /* device -> host, waits; 0 or -1 */
    /* device -> host, waits; a host view of the bytes (the backend's buffer), valid until the next op; NULL on
     * error.  For results the caller scatters itself (logits): one copy fewer, and no fresh pages. */
    const void *(*view)(be_backend *be, const void *src, size_t bytes);
    int (*failed)(be_backend *be);
    void (*zero)(be_backend *be, void *p, size_t bytes);
    void (*copy)(be_backend *be, void *dst, const void *src, size_t bytes); /* device -> device */
    void (*linear)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w);
    /* linear for x whose rows went through v4.c's act_quant (every value an e4m3 code times a power of two): the
     * same product, which the backend may compute with that knowledge (one bf16 plane holds such x exactly) */
    void (*linear_x8)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w);
    void (*linear_grouped)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w, int groups);
    void (*rmsnorm)(be_backend *be, float *y, const float *x, size_t rows, size_t dim, const float *w, float eps);
    /* X[t, s] = embedding row ids[t] for each of n_streams streams; ids device */
    void (*embed)(be_backend *be, float *X, const int32_t *ids, size_t R, const be_weight *e, int n_streams);
    void (*hc_pre)(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll, float *post, float *comb);
    void (*hc_head)(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll);
    void (*hc_post)(be_backend *be, float *X, const float *f, const float *post, const float *comb, int n, int D,
                    size_t R);
    /* v4.c rope() on x + r*stride + off, r < rows, at position pos[r / per] (pos device) */
    void (*rope)(be_backend *be, float *x, size_t rows, size_t stride, size_t off, int rd, const float *inv_freq,
                 const int64_t *pos, int per);
    /* v4.c fq_fp8 (fp4 = 0) / fq_fp4 (fp4 = 1) on the first n floats of each row */
    void (*fq)(be_backend *be, float *x, size_t rows, size_t stride, size_t n, int block, int fp4);
    void (*hadamard)(be_backend *be, float *x, size_t rows, size_t n);
    /* v4.c swiglu() on rows x I; rw (device, may be NULL) scales row r afterwards */
    void (*swiglu)(be_backend *be, float *g, const float *up, size_t rows, int I, float limit, const float *rw);
    void (*scale)(be_backend *be, float *x, size_t n, float s);
    void (*add)(be_backend *be, float *y, const float *x, size_t n);
    /* ids[r] = rc_greedy (base/greedy.h) of row r of x [rows, V] (ties to the lowest index, NaN as -inf, 0 when nothing beats
     * -inf); ids device */
    void (*argmax)(be_backend *be, int32_t *ids, const float *x, size_t rows, size_t V);
    /* idx [R, K], wt [R, K] from the gate's logits [R, E]; ids [R] device */
    void (*route)(be_backend *be, const be_route *r, const float *logits, const int32_t *ids, size_t R, int32_t *idx,
                  float *wt);
    void (*gather)(be_backend *be, float *dst, const float *src, const int32_t *rows, size_t n, size_t width);
    /* y[rows[r]] += src[r] * (rw ? rw[r] : 1) for r < n (rows distinct; all device) */
    void (*scatter_add)(be_backend *be, float *y, const float *src, const int32_t *rows, const float *rw, size_t n,
                        size_t width);
    /* be_ops.moe and be_ops.attention over device activations (attention: q, iq, iw, out device; the
     * sequences' window keys and blocks are host memory, as there) */
    int (*moe)(be_backend *be, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
               const be_weight *w1, const be_weight *w3, const be_weight *w2, int n_experts, float swiglu_limit,
               int flags);
    int (*attention)(be_backend *be, const be_attn_seq *seqs, int nseq, int ntok, const be_attn_args *a);
    /* Optional (NULL: the compressors run on the host, and a layer where an entry completes waits for its rows).
     * v4.c's compressor pooling (comp_pool_slots) for n entries of hd channels: per channel, a softmax over the
     * ns slots of entry i (slots[i ns .. i ns + ns), device, in that order) of g + ape weighs their kv; into out
     * [n, hd].  ape is host memory, the model's constant [ratio, width] array of ape_n floats (a backend may keep
     * a copy by address). */
    void (*comp_pool)(be_backend *be, float *out, size_t n, int ns, int hd, const be_comp_slot *slots,
                      const float *ape, size_t ape_n);
    /* Optional (NULL: the graph makes a quantised copy with fq and calls linear_x8).  linear of v4.c's act_quant
     * (fq_fp8, blocks of 128 columns) of x, x itself unchanged: for a backend that quantises as it reads x (the
     * CUDA decode row-dot), without the copy and the fq launch. */
    void (*linear_aq)(be_backend *be, float *y, const float *x, size_t T, const be_weight *w);
    /* Optional (all three NULL: nothing is void before reset).  mark: the allocation state now; release(mark):
     * every alloc made after that mark is void, its memory reused by later allocs (ops already issued on it come
     * first: the backend orders them before later ops).  alloc_keep: as alloc, but release leaves it; reset voids
     * it.  The graph releases each layer's activations at the end of the layer. */
    size_t (*mark)(be_backend *be);
    void (*release)(be_backend *be, size_t mark);
    void *(*alloc_keep)(be_backend *be, size_t bytes);
    /* Optional (both NULL: every op runs as called).  A region of the graph whose ops are launches and allocs
     * alone (no upload, download, alloc_keep or host work whose result outlives it; nothing it allocates is read
     * after it), named by tag, which must change whenever the ops the region would issue, or the addresses it
     * reads that were allocated before it, could (the graph hashes the model, its semantics, the layer, the
     * region and the batch's rows into it, and allocates what its regions read in the same order every forward).
     * graph_begin returns 1 when the backend replayed the region from a recording (the caller skips its ops: the
     * arena moves as their allocs would have), else 0, and the caller issues the ops and then calls graph_end
     * (which the backend may use to record them).  The backend keys a recording by tag and the arena's position,
     * so a replay writes where the ops would. */
    int (*graph_begin)(be_backend *be, uint64_t tag);
    void (*graph_end)(be_backend *be);
    /* Optional (both NULL: one stream of ops).  lane(k): the ops issued after it run on lane k (0: the main one;
     * k < 3), after everything issued on lane 0 before it, and beside what other lanes run; join: back to lane 0,
     * whose later ops come after everything every lane ran.  For independent chains of ops (each reads what lane
     * 0 made before the fork and writes its own outputs); a region ends joined. */
    void (*lane)(be_backend *be, int k);
    void (*join)(be_backend *be);
    /* The three below fuse a chain of the ops above, for a backend that does it in fewer launches.  Each returns 0
     * when it did the chain (the values the ops give), > 0 when it declines (nothing done: the caller issues the
     * ops one by one); NULL: always declines.
     * hc_pre_norm: hc_pre (head 0) or hc_head (head 1: post and comb unused), then rmsnorm of coll in place with w
     * (the model's host array, NULL: ones) and eps, and (xq != NULL) xq = v4.c's act_quant of coll (a copy, then fq:
     * FP8, blocks of 128 columns). */
    int (*hc_pre_norm)(be_backend *be, const be_hc *h, int head, const float *X, size_t R, float *coll, float *post,
                        float *comb, const float *w, float eps, float *xq);
    /* norm_rope: rmsnorm of each row of x [rows, dim] in place with w (host, NULL: ones) and eps, then rope on its
     * last rd channels (off dim - rd, stride dim) at pos[r / per] (pos device). */
    int (*norm_rope)(be_backend *be, float *x, size_t rows, size_t dim, const float *w, float eps, int rd,
                      const float *inv_freq, const int64_t *pos, int per);
    /* hc_post_add: add(f, f2) (f2 [R, D]), then hc_post with f; f itself may stay as it was. */
    int (*hc_post_add)(be_backend *be, float *X, const float *f, const float *f2, const float *post,
                        const float *comb, int n, int D, size_t R);
    /* Optional (both NULL: the caller downloads, waiting).  down_start: start copying bytes at src (device) into
     * the backend's host buffer k (0 <= k < BE_DOWN_SLOTS) once everything issued before it has run, and return
     * at once: 0, or -1 where it does not (nothing started; the caller downloads).  down_take: wait for buffer k's
     * copy alone and return its bytes (the backend's memory, valid until k's next down_start or the next reset),
     * NULL on failure or when nothing was started.  The device graph starts the downloads of the state rows before
     * the head, so that they and the host's state updates run while the device computes the logits. */
    int (*down_start)(be_backend *be, int k, const void *src, size_t bytes);
    const void *(*down_take)(be_backend *be, int k);
    /* Optional (NULL: the caller draws on the host).  ids[i] = the token engine/sampler.h's rules draw from row
     * d[i].row of x [.., V] with d[i]'s parameters and uniform, or -1 where the backend leaves that draw to the host
     * (the caller then needs the row's logits); ids, x and d device. */
    void (*sample)(be_backend *be, int32_t *ids, const float *x, size_t V, const be_draw *d, size_t n);
} be_dev_ops;

enum { BE_DOWN_SLOTS = 256 };

struct be_backend {
    const be_ops *ops;
    int threads;
    void *impl;
};

/* CPU backend: threads >= 1 (the caller counts as one). */
be_backend *be_cpu_create(int threads);
void be_destroy(be_backend *be);

/* Host fp32 helpers shared by the CPU backend and the graph's host-side ops,
 * so that one summation order serves everywhere: an 8-lane dot product, and
 * row-wise RMSNorm (w may be NULL; statistics in double; in place allowed). */
float be_dot_f32(const float *a, const float *b, size_t n);
void be_rmsnorm_rows(float *y, const float *x, size_t rows, size_t dim, const float *w, float eps);

/* Run fn(arg, i) for i in [0, n) on the backend's threads (CPU only). */
typedef void (*be_task_fn)(void *arg, size_t i);
void be_cpu_parallel(be_backend *be, size_t n, be_task_fn fn, void *arg);

/* CUDA backend (src/backend/cuda/, issue 7; compiled only when CMake finds
 * nvcc, which defines DEEPINFER_HAVE_CUDA for the code that links it).
 * linear, linear_rows and rmsnorm run on GPU `device` over the same host fp32
 * rows as the CPU backend (copied in and out per call); weights are uploaded
 * once, in checkpoint format, at first use.  Every other op of the graph runs
 * on `threads` host threads: be_cpu_parallel works on this backend too.
 * Precision of dense bf16 GEMMs: env DEEPINFER_CUDA_MATH = bf16x3 (default:
 * activations split into three bf16 planes, ~fp32 accuracy on tensor cores),
 * bf16 (activations rounded to bf16), or fp32 (also DEEPINFER_CUDA_FP32=1:
 * fp32 weight copies, cublasSgemm, no TF32); docs/CUDA.md has the numbers.
 * Returns NULL and fills err (no device, no driver, bad index, ...).
 * Free it with be_destroy (or be_cuda_destroy). */
be_backend *be_cuda_create(int device, int threads, char *err, size_t errlen);
void be_cuda_destroy(be_backend *be);
/* The ops return void, so a CUDA failure is sticky: the failing op and every
 * later one fill their outputs with NaN, and this returns the first error
 * message.  NULL while all is well, and for any other backend. */
const char *be_cuda_error(const be_backend *be);

#endif
