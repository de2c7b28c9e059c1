/* attn.h - attention over window + compressed entries, and the CSA lightning
 * indexer with its top-k, on device-resident fp32 data (issue 7).
 *
 * The math is v4.c's indexer_task / attn_task (docs/CUDA.md, "Attention and
 * indexer kernels"): for the query at position pos,
 *   window      positions max(pos - W + 1, kstart) .. pos, from kwin (or, at
 *               a decode step, from the sequence's ring: bcu_attn_seq.kring);
 *   compressed  entry b is visible iff b < (pos + 1) / ratio; a CSA layer
 *               attends the indexer's top-k of them, an HCA layer all;
 *   softmax     over the candidates' q.k / sqrt(d) plus the head's sink
 *               logit in the denominator; output = sum p v (K = V), then
 *               the inverse RoPE on its last rope_dim channels at pos;
 *   indexer     score(b) = sum_h w[h] relu(q_h . key_b), the top-k by higher
 *               score then lower index, handed over in ascending order.
 *
 * Several independent sequences go in one call (a batch): their query rows
 * are stacked, sequence s owning rows row0 .. row0+T-1 at positions
 * p0 .. p0+T-1.  Compressed entries live in the sequence's 128-token KV
 * blocks as v4.c lays them out (ent_row): layer entries at float offset
 * ent_off of a block, indexer keys at key_off, entry b in block b / epb,
 * row b % epb, with epb = 128 / ratio.
 *
 * Everything is asynchronous on the given stream; nothing allocates.  A
 * workspace of bcu_attn_workspace_bytes(limits) bytes (device memory, the
 * caller's) holds the scores, the top-k candidates and the split partials;
 * bcu_attn_workspace_init zeroes its error flags once.  Results are
 * deterministic for a given batch; the split count depends on the batch
 * shape, so a row's rounding may differ between batches (docs/CUDA.md). */
#ifndef BACKEND_CUDA_ATTN_H
#define BACKEND_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One sequence of a batch.  The array of these lives in device memory,
 * ordered by row0: row0 of the first is 0 and each next one starts where the
 * previous ends (row0 + T), so the rows 0 .. ntok-1 are covered once. */
typedef struct {
    int64_t p0;                 /* position of the sequence's first query row */
    int64_t kstart;             /* first position in kwin: max(p0 - window + 1, win_lo, 0) */
    const float *kwin;          /* [p0 + T - kstart, head_dim] window keys (= values) of kstart .. p0+T-1 */
    const float *const *blocks; /* device array: the sequence's KV blocks, block i = tokens 128i .. 128i+127 */
    int32_t row0;               /* first query row */
    int32_t T;                  /* query rows */
    /* kring non-NULL (T = 1: a decode step, kstart >= p0 - window + 1, 16-byte aligned rows): kwin is not read; the
     * window keys of positions p < p0 are rows p % window of kring, p0's is knew, and the kernel writes knew into
     * row p0 % window (which held p0 - window, outside the window): the ring is then at p0 + 1 */
    float *kring;
    const float *knew;
} bcu_attn_seq;

typedef struct {
    const bcu_attn_seq *seqs;   /* device, nseq entries */
    int nseq;
    int ntok;                   /* rows in this call = sum of T */
    int64_t max_len;            /* host bound: max over sequences of p0 + T; sizes the grids */
} bcu_attn_batch;

/* What one workspace serves: at most max_rows rows per call, positions below
 * max_len, one head geometry, and (index_topk > 0) one indexer geometry. */
typedef struct {
    int max_rows;               /* <= 65535 */
    int64_t max_len;
    int n_heads, head_dim;
    int index_topk;             /* 0: this workspace never runs the indexer */
    int index_ratio;            /* the CSA compress ratio the indexer runs at */
} bcu_attn_limits;

typedef struct {
    void *mem;                  /* device, bcu_attn_workspace_bytes(&lim) bytes, 256-byte aligned */
    bcu_attn_limits lim;
} bcu_attn_ws;

size_t bcu_attn_workspace_bytes(const bcu_attn_limits *lim);
/* zero the error flags; once after allocating the workspace */
cudaError_t bcu_attn_workspace_init(const bcu_attn_ws *ws, cudaStream_t st);
/* The error flags the kernels raised (synchronises the stream): bit 1 a row
 * outside every sequence or a bad kstart, bit 2 more visible indexer keys
 * than the workspace holds (max_len too small), bit 4 a selected index out of
 * range or nsel > topk.  clear != 0 zeroes them.  Returns -1 on a CUDA error. */
int bcu_attn_workspace_flags(const bcu_attn_ws *ws, int clear, cudaStream_t st);
enum { BCU_ATTN_FLAG_ROW = 1, BCU_ATTN_FLAG_VIS = 2, BCU_ATTN_FLAG_SEL = 4 };

/* ---- the lightning indexer: scores and top-k */
typedef struct {
    int index_heads;            /* <= 64 */
    int index_dim;              /* multiple of 4, <= 192 */
    int ratio;                  /* the CSA compress ratio; divides 128 */
    int topk;
    size_t key_off;             /* float offset of this layer's indexer keys in a KV block; multiple of 4 */
    const float *iq;            /* [ntok, index_heads, index_dim] roped indexer queries */
    const float *iw;            /* [ntok, index_heads] head weights (already scaled) */
    int32_t *sel;               /* [ntok, topk] out: chosen entries ascending, then -1 */
    int32_t *nsel;              /* [ntok] out: min(topk, visible) */
    int bf16;                   /* 1 (index_dim a multiple of 16): the scores' q.k on bf16 tensor cores (q and keys
                                   rounded to bf16: exact for official semantics' fq_fp4 values), fp32 sums */
    int tile;                   /* fp32 scores: keys a block takes, 0 = automatic (16 when 64-key tiles would not
                                   fill the GPU, else 64); the scores are the same bits either way (for tests) */
    int exact;                  /* 1: q and the keys are exact in bf16 (official semantics' fq_fp4), so the scores
                                   take the bf16 tensor cores as for bf16: the same products, fp32 sums in another
                                   order (at any batch: a decode step's CSA attention half 4-5% faster at batch 1
                                   than on the fp32 16-key tiles) */
} bcu_indexer_args;

cudaError_t bcu_indexer_topk(const bcu_attn_ws *ws, const bcu_attn_batch *b, const bcu_indexer_args *a,
                             cudaStream_t st, char *err, size_t errlen);

/* ---- attention */
typedef struct {
    int n_heads;
    int head_dim;               /* 128, 256, 384 or 512 */
    int rope_dim;               /* even, <= head_dim */
    int window;                 /* W */
    int ratio;                  /* 0: window only; else divides 128 */
    int csa;                    /* ratio > 0: 1 attends sel/nsel (CSA), 0 every visible entry (HCA) */
    size_t ent_off;             /* float offset of this layer's entries in a KV block; multiple of 4 */
    const float *q;             /* [ntok, n_heads, head_dim] roped queries */
    const float *sink;          /* [n_heads] */
    const float *inv_freq;      /* [rope_dim / 2] of this layer (compressed-layer or main frequencies) */
    const int32_t *sel;         /* CSA: [ntok, topk] from bcu_indexer_topk */
    const int32_t *nsel;        /* CSA: [ntok] */
    int topk;                   /* CSA: row stride of sel */
    float *out;                 /* [ntok, n_heads, head_dim] */
    int bf16;                   /* 1 (head_dim 512): q.k and p.v on the bf16 tensor cores, q, keys and p rounded to
                                   bf16, fp32 sums (~1e-2 of the output against fp32); 0 or other head_dims: fp32 */
    int x3;                     /* (rope_dim 64; bf16 0) every key's first head_dim - 64 channels are exact in bf16
                                   (official semantics' FP8 round trip), so q.k and p.v may take the bf16 tensor
                                   cores with q and p in three planes and the RoPE channels' keys in three: the
                                   fp32 kernel's products, fp32 sums in another order.  1: where the rows' 32-head
                                   blocks fill half the GPU (2 x rows x ceil(heads / 32) >= SMs), 2: always; 0 or
                                   other shapes: the fp32 kernel */
    int warps;                  /* the fp32 kernel's warps a block, a quad of heads each: 2 or 8; 0 = automatic (2
                                   where 8's blocks would not fill the GPU, a decode step); the same bits either way */
} bcu_attention_args;

cudaError_t bcu_attention(const bcu_attn_ws *ws, const bcu_attn_batch *b, const bcu_attention_args *a,
                          cudaStream_t st, char *err, size_t errlen);

/* Debugging and tests: the indexer scores of the last bcu_indexer_topk, as
 * order-preserving keys (key = bits ^ (sign ? 0xffffffff : 0x80000000), with
 * -0 stored as +0); row r's entry b at [r * *row_stride + b].  NULL if the
 * workspace has no indexer part. */
const uint32_t *bcu_attn_ws_index_keys(const bcu_attn_ws *ws, size_t *row_stride);

/* the attention launches so far in this process: on the three-plane tensor-core kernel (x3), on the others */
void bcu_attention_launches(size_t *x3, size_t *other);

/* the indexer's score launches so far in this process: on the bf16 tensor cores, on fp32 CUDA cores */
void bcu_indexer_launches(size_t *mma, size_t *fp32);

#ifdef __cplusplus
}
#endif

#endif
