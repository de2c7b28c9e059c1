/* graph.h - the V4 graph's non-GEMM ops on the device: the host loops of
 * src/model/v4.c (embedding, mHC, RoPE, the official QAT round trips, the
 * Hadamard transform, SwiGLU, routing) as kernels over device fp32 rows.
 *
 * Every function takes DEVICE pointers only, launches on stream st, never
 * allocates and never synchronises; it returns the launch status
 * (cudaErrorInvalidValue for sizes it cannot take).  Each is the math of the
 * v4.c function it names, to fp32 rounding (the order of a long sum may
 * differ; statistics the CPU keeps in double are kept in double here too).
 * Each row's result depends only on that row: batch-invariant. */
#ifndef BACKEND_CUDA_GRAPH_H
#define BACKEND_CUDA_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* embedding table element types */
enum { BCU_EMB_F32 = 0, BCU_EMB_BF16 = 1, BCU_EMB_F16 = 2 };

/* X[t, s, :] = table[ids[t], :] (decoded to fp32) for every stream s < n_streams.
 * X [R, n_streams, D]; table [vocab, D] of type emb; ids [R]. */
cudaError_t bcu_embed(float *X, const void *table, int emb, const int32_t *ids, size_t R, int D, int n_streams,
                      cudaStream_t st);

/* mHC parameters of one site (all device, fp32): fn [(2+n)n, n*D], base [(2+n)n], scale [3] */
typedef struct {
    int n, D, iters;   /* hc_mult (<= 16), hidden size, Sinkhorn iterations */
    float hc_eps, rms_eps;
    const float *fn, *base, *scale;
    int mixes_in_ws; /* 1: the workspace already holds the dot products fn . x, [R, mixes] at bcu_hc_ws_mixes (the
                      * caller ran them as one GEMM); only the sums of squares are computed */
} bcu_hc_site;

/* v4.c hc_pre_task for rows [0, R): X [R, n, D] -> coll [R, D], post [R, n],
 * comb [R, n, n].  rs = 1/sqrt(mean over n*D of x^2 (in double) + rms_eps);
 * mixes[k] = (fn[k] . x) * rs for k < (2+n)n; pre[i] = sigmoid(mixes[i]*scale[0]
 * + base[i]) + hc_eps; post[i] = 2 sigmoid(mixes[n+i]*scale[1] + base[n+i]);
 * comb = row softmax of (mixes[2n+i*n+k]*scale[2] + base[..]) + hc_eps, then
 * iters rounds of Sinkhorn (round 0: columns only; later rounds: rows, then
 * columns; each normalisation divides by (sum + hc_eps)); coll[d] = sum_i
 * pre[i] x[i, d]. */
/* Two kernels: the (2+n)n dot products and the sum of squares of every row, each as a fixed set of chunk partial
 * sums (so a single row spreads over the GPU and the order depends on n and D alone), into the workspace ws
 * (8-byte aligned, bcu_hc_ws_bytes(R, n)); then per row a few column blocks (pre and the collapse) and one block
 * for post and comb. */
size_t bcu_hc_ws_bytes(size_t R, int n);
float *bcu_hc_ws_mixes(void *ws, size_t R); /* where the workspace keeps the dot products [R, mixes] */
cudaError_t bcu_hc_pre(const bcu_hc_site *s, const float *X, size_t R, float *coll, float *post, float *comb,
                       void *ws, size_t ws_bytes, cudaStream_t st);
/* bcu_hc_pre (head 0) or bcu_hc_head (head 1), then coll = bcu_rmsnorm(coll) with weight w (device, NULL: ones) and
 * eps, as the calls one after the other give it, bit for bit: the second stage and the norm are one kernel (one
 * block a row for pre, the collapse and the norm, and one for post and comb).  xq (NULL: none): also v4.c's
 * act_quant of coll into xq [R, D], the bits of a copy and bcu_fq_fp8(xq, R, D, D, 128).  Rows of D <= 4096
 * columns at most (bcu_hc_pre_norm_fits; else cudaErrorNotSupported and nothing launched). */
int bcu_hc_pre_norm_fits(int n, int D, size_t R);
cudaError_t bcu_hc_pre_norm(const bcu_hc_site *s, int head, const float *X, size_t R, float *coll, float *post,
                            float *comb, const float *w, float eps, float *xq, void *ws, size_t ws_bytes,
                            cudaStream_t st);
/* v4.c hc_head_task: only pre (n mixes from fn's first n rows), coll [R, D]; the same workspace */
cudaError_t bcu_hc_head(const bcu_hc_site *s, const float *X, size_t R, float *coll, void *ws, size_t ws_bytes,
                        cudaStream_t st);
/* v4.c hc_post_task, in place: X[t, k, d] = post[t, k] f[t, d] + sum_i comb[t, i, k] X[t, i, d]
 * (the sum over i in ascending order, starting from post*f) */
cudaError_t bcu_hc_post(float *X, const float *f, const float *post, const float *comb, int n, int D, size_t R,
                        cudaStream_t st);
/* bcu_add(f, f2, R * D) then bcu_hc_post with f: the same bits in one kernel, f itself unchanged (f2 NULL: none) */
cudaError_t bcu_hc_post_add(float *X, const float *f, const float *f2, const float *post, const float *comb, int n,
                            int D, size_t R, cudaStream_t st);

/* v4.c rope() on rows: for row r in [0, rows), x + r*stride + off holds rd
 * channels (interleaved pairs 2i, 2i+1), rotated by angle = (float)pos * inv_freq[i]
 * (fp32 product, then cosf/sinf) with pos = pos[r / per]; inverse negates sin. */
cudaError_t bcu_rope(float *x, size_t rows, size_t stride, size_t off, int rd, const float *inv_freq,
                     const int64_t *pos, int per, int inverse, cudaStream_t st);
/* bcu_rmsnorm of each row of x [rows, dim] in place (weight w, device, NULL: ones), then bcu_rope on its last rd
 * channels (off = dim - rd, stride = dim) at pos[r / per]: the bits of the two calls, in one kernel (a block a row).
 * Rows of dim <= 4096 with an even rd and dim - rd (bcu_norm_rope_fits; else cudaErrorNotSupported, nothing
 * launched). */
int bcu_norm_rope_fits(size_t dim, int rd);
cudaError_t bcu_norm_rope(float *x, size_t rows, size_t dim, const float *w, float eps, int rd, const float *inv_freq,
                          const int64_t *pos, int per, cudaStream_t st);

/* v4.c fq_fp8 / fq_fp4 on the first n floats of each row (row r at x + r*stride), in blocks of `block`:
 * scale = pow2_ceil(max(amax, floor) / max) (floor 1e-4 and max 448 for FP8; 6*2^-126 and 6 for FP4),
 * x = decode(encode(x / scale)) * scale with dtype.c's round-to-nearest-even, saturating encoders. */
cudaError_t bcu_fq_fp8(float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st);
cudaError_t bcu_fq_fp4(float *x, size_t rows, size_t stride, size_t n, int block, cudaStream_t st);
/* dst [rows, n] (dense bf16) = bcu_fq_fp8(copy of x, rows, stride, n, 128) as bf16, every element exact (an e4m3
 * value times a power of two): the one activation plane of an FP8 linear's dequantised GEMM, x left as it is.
 * n a multiple of 128, stride of 4, x 16-byte and dst 8-byte aligned. */
cudaError_t bcu_aq_bf16(uint16_t *dst, const float *x, size_t rows, size_t stride, size_t n, cudaStream_t st);
/* v4.c hadamard() on each row of n floats (n a power of two <= 1024; rows dense): Sylvester order, * n^-1/2 */
cudaError_t bcu_hadamard(float *x, size_t rows, size_t n, cudaStream_t st);

/* v4.c swiglu(): g[i] = min(g, limit) / (1 + exp(-min(g, limit))) * clamp(up, -limit, limit) (no clamp when
 * limit <= 0), over rows*I elements; rw != NULL multiplies row r by rw[r] afterwards. */
cudaError_t bcu_swiglu(float *g, const float *up, size_t rows, int I, float limit, const float *rw, cudaStream_t st);
/* ids[r] = base/greedy.h's rc_greedy of row r of x [rows, V]: the first index of the largest value, NaN as -inf, 0 when
 * nothing beats -inf (the engine's greedy token) */
cudaError_t bcu_argmax(int32_t *ids, const float *x, size_t rows, size_t V, cudaStream_t st);
/* x[i] *= s */
cudaError_t bcu_scale(float *x, size_t n, float s, cudaStream_t st);
/* y[i] += x[i] */
cudaError_t bcu_add(float *y, const float *x, size_t n, cudaStream_t st);

/* v4.c moe() routing for rows [0, R): logits [R, E] (the gate's output) ->
 * idx [R, K], wt [R, K].  score = sigmoid(v) (score_func 1) or sqrt(softplus(v))
 * (softplus(v) = v > 20 ? v : log1p(exp(v))).  Experts: tid2eid != NULL (hash
 * layer): idx[t] = tid2eid[ids[t] * K ...]; else the K best of score + bias[e],
 * picked one at a time (strictly greater wins, so ties go to the lower e).
 * Weights: wt = score[idx] / (sum of the K scores (+ 1e-20 unless official)) * route_scale,
 * the sum taken in k order. */
typedef struct {
    int E, K, score_func, official;
    float route_scale;
    const float *bias;      /* [E] or NULL on hash layers */
    const int32_t *tid2eid; /* [vocab, K] or NULL */
    const int32_t *ids;     /* [R] token ids (hash layers) */
} bcu_route_args;
cudaError_t bcu_route(const bcu_route_args *a, const float *logits, size_t R, int32_t *idx, float *wt,
                      cudaStream_t st);

/* v4.c comp_pool_slots for n entries of hd channels: per channel c, over the ns slots s of entry i (slots[i ns +
 * s]; kv NULL: absent) in order, mx = max of g_s[c] (+ ape[off_s + c] when off_s >= 0), w_s = expf(g - mx),
 * den = sum of w_s, out[i, c] = sum of kv_s[c] * (w_s / den), fp32 in slot order (CUDA's expf: a few ulp from
 * glibc's).  slots [n, ns] device; ape device (NULL when no slot has an offset).  ns <= BCU_COMP_MAX_SLOTS. */
#define BCU_COMP_MAX_SLOTS 256
typedef struct {
    const float *kv, *g;
    int64_t ape;
} bcu_comp_slot; /* the layout of backend.h's be_comp_slot */
cudaError_t bcu_comp_pool(float *out, size_t n, int ns, int hd, const bcu_comp_slot *slots, const float *ape,
                          cudaStream_t st);

/* dst[i, :] = src[rows[i], :] for i < n; rows of `width` floats */
cudaError_t bcu_gather_rows(float *dst, const float *src, const int32_t *rows, size_t n, size_t width,
                            cudaStream_t st);

/* The check of programmatic dependent launch (pdl.cuh) the tests run: two one-thread kernels launched as every
 * kernel of the backend is; the first lets the second launch, spins for spin_us, then sets ws[0] = 1 and writes the
 * time it did into t[0]; the second writes the time it started (before its wait) into t[1] and what it read of
 * ws[0] after its wait into ws[1].  ws[1] must be 1 (the wait orders it after the first); with PDL on (the default:
 * DEEPINFER_CUDA_PDL) t[1] < t[0] shows the second was on the GPU while the first ran.  ws: 2 ints, t: 2, device. */
cudaError_t bcu_pdl_probe(int *ws, unsigned long long *t, double spin_us, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
