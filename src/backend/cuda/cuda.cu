/* cuda.cu - the CUDA backend (issue 7, foundation): be_linear, be_linear_rows
 * and be_rmsnorm on one GPU, over the host fp32 rows the graph works in.
 *
 * Each op copies its input rows to the device, computes there, and copies the
 * result back before it returns; everything else in the graph still runs on
 * the host (the backend embeds a CPU backend for that, so be_cpu_parallel
 * works on it unchanged).  Moving the activations and the remaining ops onto
 * the device is the next step of issue 7; bcu_linear_dev is its entry point.
 *
 * Weights: uploaded once, at first use, in their checkpoint format, into a
 * cache keyed by the be_weight's host data pointer.  The key is checked
 * against a fingerprint (shape, format, first and last 64 bytes, 16 words
 * between), so a weight freed and another mmapped at the same address is
 * uploaded again, not confused with the old one.  The fingerprint is a guard,
 * not a proof: give each model its own backend, and destroy them together.
 * Nothing is dequantised into a bf16 copy: FP8 and FP4 matrices are decoded in
 * registers by bcu_rowdot.  Only FP32 mode keeps fp32 copies of bf16/f16
 * matrices (it is a debug mode).
 *
 * Dense bf16 GEMMs go to cuBLAS, y^T = W . x^T in column-major terms
 * (W row-major [rows, cols] is cuBLAS's cols x rows, transposed).  How the
 * fp32 activations meet bf16 weights is the bcu_math mode (cuda_internal.h).
 *
 * Activations live in one growing device scratch, so after the first few
 * calls no op allocates.  One mutex serialises the ops (the graph calls them
 * from one thread at a time; the lock makes a second caller safe, not fast).
 *
 * Errors: the ops return void, so the first CUDA or cuBLAS failure is kept as
 * a message (be_cuda_error) and every op from then on writes NaN. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <type_traits>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/attn.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/fp8_tile.h"
#include "backend/cuda/graph.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_wg.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/profile.h"
#include "backend/cuda/sample.h"
#include "backend/f16x2.h"
#include "backend/kv_mirror.h"
#include "backend/part_slots.h"

typedef struct {
    const void *key; /* host pointer: be_weight.data, or an rmsnorm weight; NULL = free slot */
    uint64_t fp;     /* fingerprint; a mismatch uploads again */
    void *d;         /* device data: checkpoint bytes, or fp32 (f32 = 1) */
    void *ds;        /* device scales (FP8 / FP4) */
    float *ds32;     /* FP8 with ue8m0 scales in 128 x 128 blocks: the scales as fp32, inside ds's allocation (the
                      * FP8 GEMM's weight scales, fp8_gemm.cu) */
    int f32;
    int f16g;        /* FP8 / FP4 with ue8m0 scales: the shift that makes the weight exact in f16 (f16x2.h), or
                      * F16X2_NONE */
    size_t bytes;
} wentry;

/* device pointer tables of one MoE layer's experts (6 x E: w1, s1, w3, s3, w2, s2), keyed by w1's array */
typedef struct {
    const be_weight *key;
    int n;
    const void **host;  /* what the device table holds now */
    const void **src;   /* [3n] the host data pointers of w1, w3, w2 it was built from */
    void *dev;
} moe_tab;

/* device memory handed out in order from chunks that stay allocated (dv_alloc): ch[cur] is the chunk allocations
 * come from, earlier ones are full for this forward */
typedef struct {
    struct { char *p; size_t cap, used; } ch[32];
    int n, cur;
} arena_t;

/* a recorded region of the device graph (be_dev_ops.graph_begin): one CUDA graph, replayed when the region comes
 * again with the same tag from the same arena positions; key 0 = free way */
typedef struct {
    uint64_t key, use, gen; /* gen: c->g_gen when recorded (a reallocation since voids it) */
    cudaGraphExec_t exec;   /* NULL: not recorded yet */
    int clean;              /* its last eager run made no host-synchronous call: record it at the next */
    int a0, a1;             /* the arena's chunks at its start and end */
    size_t aused[32];       /* the used bytes of chunks [a0, a1] at its end */
} gregion;

enum { GR_SETS = 256, GR_WAYS = 4 };

/* a lane of the device graph (be_dev_ops.lane): a stream and what ops on it must not share with ops on another
 * (the scratch, a cuBLAS handle and its workspace, the cuBLASLt handle).  The active lane's are in cuda_be's own
 * fields (st, blas, ...); the others wait here */
typedef struct {
    cudaStream_t st;
    cublasHandle_t blas;
    void *blas_ws;
    char *scratch;
    size_t scratch_cap;
    bcu_fp8lt *f8;
    cudaEvent_t ev; /* its tail, recorded at a join */
    int made, used; /* used: ops issued on it since the last join */
} lane_t;

enum { NLANE = 3 };

/* one launch of the attention op: its rows [row, row + rows), its n sequence pieces from the staged list's base */
typedef struct {
    int n, rows, row, base;
    int64_t max_len;
} attn_launch;

/* one buffer of down_start / down_take: pinned host memory, the copy's completion */
typedef struct {
    char *h;
    size_t cap;
    cudaEvent_t ev;
    int have_ev, pending;
} dslot_t;

typedef struct {
    be_backend base; /* first: the ops get from be back to here */
    be_backend *host;
    int device;
    bcu_math math;
    cudaStream_t st;
    cublasHandle_t blas;
    int have_stream, have_blas;
    char *scratch;
    size_t scratch_cap;
    wentry *tab;
    size_t cap, used;
    size_t weight_bytes;
    pthread_mutex_t lock;
    moe_tab *mt;
    size_t nmt;
    /* attention: the KV mirror (full blocks by md_block id: kv_dev, its bookkeeping kvm), the kernels' workspace,
     * a pinned staging buffer */
    float *kv_dev;
    size_t kv_blk;
    kv_mirror kvm;
    uint64_t kv_call;
    int attn_x3;      /* DEEPINFER_CUDA_ATTN_X3 (0 in the fp32 maths): attention's q.k and p.v on the bf16 tensor
                       * cores in three planes where the keys' non-RoPE channels are exact in bf16
                       * (be_attn_args.kv_fp8), the fp32 kernel's products: bcu_attention_args.x3 (1, the default:
                       * batches whose blocks fill half the GPU; 2: always; 0: never); the bf16 maths' ATTN_MMA goes
                       * first */
    int ix_exact;     /* DEEPINFER_CUDA_IX_EXACT (default 1; 0 in the fp32 maths): the indexer's scores on the
                       * bf16 tensor cores where its inputs are exact in bf16 (be_attn_args.ix_fp4) */
    size_t kv_slots;  /* DEEPINFER_CUDA_KV_SLOTS (read at create; 0: unset): the mirror's size in blocks */
    /* per sequence, the mirror pointers of its full blocks (kvm_pc_find; DEEPINFER_CUDA_KV_PCACHE, default 1): a
     * decode step's compressed layers all read the same blocks, and a sequence's full blocks change only by
     * appending */
    int kvpc_on;
    bcu_attn_ws aws;
    size_t aws_bytes;
    /* the attention op's pinned staging (block rows, pointers, windows, launch tables): two buffers used in
     * turn, each with the event recorded after the copies that read it.  In the device graph nothing waits
     * between two layers' attention calls, so the host must not rewrite a buffer whose copies the stream has not
     * run yet (stage_take waits for that event: the stream is then at most one attention call behind) */
    char *stage[2];
    size_t stage_cap[2];
    cudaEvent_t stage_ev[2];
    int stage_rec[2], stage_k, have_stage_ev;
    int attn_rows; /* query rows per kernel launch (DEEPINFER_CUDA_ATTN_ROWS, default 1024) */
    int win_ring;  /* a decode step's attention reads the window ring itself (DEEPINFER_CUDA_WIN_RING, 1) */
    /* the device graph's attention: its staged descriptors go up on cp_st into astg[k] (staging buffer k's device
     * twin) as soon as the host has made them, and lane 0 waits for that copy alone (DEEPINFER_CUDA_ATTN_SIDE, 1),
     * instead of a copy queued behind the projections, which the kernels after it could not overlap */
    int attn_side, have_cp;
    cudaStream_t cp_st;
    cudaEvent_t cp_ev;
    char *astg[2];
    size_t astg_cap[2];
    size_t deq_T;  /* FP8 / FP4 GEMMs with at least this many rows dequantise to bf16 (DEEPINFER_CUDA_DEQUANT_T, 17) */
    size_t hc_gemm_R; /* device graph: mHC pre over at least this many rows does its dot products as one GEMM
                       * (DEEPINFER_CUDA_HC_GEMM_R, 128) */
    int fuse;         /* device graph: mHC pre and the norm after it, a norm and the RoPE after it, each in one
                       * kernel where they fit (bcu_hc_pre_norm, bcu_norm_rope; DEEPINFER_CUDA_FUSE, 1) */
    size_t gemv_T; /* bf16 matrices of <= 64M elements met by at most this many rows take the fp32 row-dot
                    * (DEEPINFER_CUDA_GEMV_T, 8; 0 turns it off) */
    size_t moe_loop_T; /* device graph: MoE batches of at least this many tokens go expert by expert through
                        * core() instead of the grouped kernel (DEEPINFER_CUDA_MOE_LOOP_T, 2048; 4x that when x and h are
                        * act_quant'd: dv_moe) */
    size_t moe_mmarows_max; /* MoE batches of at most this many (token, expert) pairs per expert take the mma
                               rows (bf16x3 / bf16 maths; DEEPINFER_CUDA_MOE_MMAROWS_MAX) */
    int moe_wg; /* those batches with act_quant'd x and h take wgmma (moe_wg.h) where the device can
                   (DEEPINFER_CUDA_MOE_WG, 1: f16 under bf16x3, e4m3 under bf16; 2: e4m3 under both; 0: the mma
                   rows) */
    size_t moe_gemv_T; /* of those, batches of at most this many tokens take the GEMV (bcu_wg_gemv;
                          DEEPINFER_CUDA_MOE_GEMV: 56 under bf16x3, 16 where the experts take e4m3; 0: never) */
    int aws_pending; /* device-graph attention ran: its error flags are read at the next download */
    int *flag_h;     /* pinned: where a download's wait reads those flags with its own bytes */
    attn_launch *lz; /* the attention op's launches (host) */
    size_t lz_cap;
    int x_fp8; /* during be_dev_ops.linear_x8: x is act_quant'd (e4m3 values times powers of two), exact in one
                * bf16 plane, so the dequantise + cuBLAS path splits it into one plane instead of three, and FP8
                * row-dots of up to 16 rows take codes against codes (bcu_rowdot_x8) */
    int x8_kernel; /* DEEPINFER_CUDA_X8 (default 1; 0: linear_x8 is plain linear: three planes, bf16 row-dots) */
    int aq_fuse; /* DEEPINFER_CUDA_AQ (default 1): be_dev_ops.linear_aq quantises inside the decode row-dot */
    int xq_dec; /* DEEPINFER_CUDA_XQ (default 1): act_quant'd rows of up to 16 on FP8 weights through the decode
                 * kernel's f16 form (bcu_rowdot_args.xq; 0: its bf16 planes, 5 rows a block) */
    int rowq8; /* DEEPINFER_CUDA_ROWQ8 (default 0): act_quant'd rows of up to 16 through bcu_rowdot_x8 (codes against
                * codes); off because it is slower than the bf16 decode kernel (H200, ncu, one batch-1 step of the
                * V4-Flash slice, 2026-11-30: 569 us in 29 calls against ~350 us; docs/CUDA.md) */
    int grouped_one; /* DEEPINFER_CUDA_GROUPED (default 1; 0: the grouped projection as a launch per group) */
    int fp8_gemm; /* DEEPINFER_CUDA_FP8GEMM: act_quant'd x on FP8 weights at prefill sizes through the FP8 tensor
                   * cores (fp8_gemm.cu; default on in the bf16 maths, off in bf16x3, never in fp32) */
    bcu_fp8lt *f8; /* its cuBLASLt handle and workspace, made at the first such GEMM */
    int attn_mma; /* DEEPINFER_CUDA_ATTN_MMA: attention's q.k and p.v (head_dim 512) and the indexer's q.k (index_dim
                   * a multiple of 16) on the bf16 tensor cores (default on in the bf16 maths, off in bf16x3, never
                   * in fp32) */
    size_t fp8_calls;
    int f16x2; /* DEEPINFER_CUDA_F16X2 (default 1): where bf16x3 would take three bf16 planes of x on a dequantised
                * weight exact in f16, two f16 planes (f16x2.h); 0: the three planes */
    size_t f16x2_calls;
    int aq_bf16; /* DEEPINFER_CUDA_AQ_BF16 (default 1): linear_aq at the dequantised GEMM's sizes act_quants x straight
                  * into its bf16 plane (bcu_aq_bf16), where it made a copy, quantised it in place and split it */
    size_t aq_bf16_calls;
    int ft;        /* DEEPINFER_CUDA_FT (default 1): linear_aq on FP8 weights from ft_min to ft_max tokens through the
                    * FP8 tiles (fp8_tile.cu: the weight read once as FP8, no bf16 copy) */
    int dev_sample; /* DEEPINFER_CUDA_SAMPLE (1): be_dev_ops.sample draws on the device; 0: every draw on the host */
    size_t ft_min; /* DEEPINFER_CUDA_FT_MIN (9: from 9 tokens the tiles beat the decode row-dot, 2x a call on wq_b / wo_b
                    * at 12-16, the slice's batch 9-16 steps 2-8% shorter in three rounds; docs/CUDA.md) */
    size_t ft_max; /* DEEPINFER_CUDA_FT_MAX (256: the tiles beat the dequantised GEMM on every V4 shape to 256 tokens) */
    size_t ft_calls;
    /* the device graph's copies of window rings, by (state key, layer): win_n slots of win_W x win_d floats */
    float *win_dev;
    struct winslot { uint64_t key; int layer; int64_t len; uint64_t call; } *win;
    size_t win_n, win_W, win_d;
    size_t win_hits, win_loads;
    /* device copies of partial KV blocks, by (md_block id, layer): this layer's rows of the block (entries, then
     * indexer keys) in slots of ps_sz floats; backend/part_slots.h keeps what each holds */
    float *ps_dev;
    bps_slot *ps;
    size_t ps_n, ps_sz, ps_hits, ps_rows;
    int ps_off; /* no slots: every partial block staged whole every call (DEEPINFER_CUDA_PART_MB=0) */
    /* the device graph (be_dev_ops): an arena of chunks for one forward's activations, a pinned upload ring */
    arena_t ar, ark; /* a forward's activations (be_dev_ops.alloc, released by layer) and what outlives its layer
                      * (alloc_keep) */
    char *up;
    size_t up_cap, up_used;
    char *up_old[4]; /* rings a forward outgrew: their copies may still be reading them; freed at the next reset */
    int up_nold;
    size_t up_grows, up_waits; /* the ring replaced by a larger one; an upload that waited for the stream */
    char *down; /* pinned bounce buffer of large downloads */
    size_t down_cap;
    /* decode regions as CUDA graphs (DEEPINFER_CUDA_GRAPHS, default 1): a region runs eagerly until it has run
     * once without a host-synchronous call (g_touch), is then captured and replayed after that */
    int graphs;
    gregion *gr;          /* GR_SETS x GR_WAYS */
    gregion *g_cur;       /* the region in progress (eager or being captured), NULL outside regions */
    int g_capturing, g_dirty;
    uint64_t g_gen, g_clock;
    size_t g_captures, g_replays, g_eager;
    void *blas_ws; /* cuBLAS's workspace, ours (a capture must not make cuBLAS allocate) */
    /* lanes (DEEPINFER_CUDA_LANES, default 1): independent chains of a region on their own streams */
    int lanes_on, lane;
    /* down_start's copies: their stream (after an event of the main one's), their buffers */
    cudaStream_t dn_st;
    cudaEvent_t dn_fork;
    int have_dn;
    dslot_t dslot[BE_DOWN_SLOTS];
    lane_t lanes[NLANE]; /* [lane] is stale while it is the active one */
    cudaEvent_t fork_ev;
    int have_fork_ev;
    int prof_on;
    bcu_profile prof;
    int failed;
    char err[512];
    char name[384];
} cuda_be;


static cuda_be *get(const be_backend *be) { return (cuda_be *)be; }

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* with profiling on: the time since t0 goes to class cls (ops are synchronous, so this is their whole cost) */
static void prof_add(cuda_be *c, int cls, double t0)
{
    if (!c->prof_on) return;
    c->prof.seconds[cls] += wall() - t0;
    c->prof.calls[cls]++;
}

static int fail(cuda_be *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(cuda_be *c, const char *fmt, ...)
{
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(c->err, sizeof c->err, "CUDA backend: ");
        vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
        va_end(ap);
        c->failed = 1;
    }
    return -1;
}

#define CU(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess)                                                                      \
            return fail(c, "%s failed: %s (%s) at %s:%d", #call, cudaGetErrorName(e_),              \
                        cudaGetErrorString(e_), __FILE__, __LINE__);                                \
    } while (0)
#define BL(call)                                                                                    \
    do {                                                                                            \
        cublasStatus_t s_ = (call);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
            return fail(c, "%s failed: %s at %s:%d", #call, cublasGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)

const char *bcu_math_name(bcu_math m)
{
    switch (m) {
    case BCU_MATH_BF16X3: return "bf16x3";
    case BCU_MATH_BF16: return "bf16";
    case BCU_MATH_FP32: return "fp32";
    }
    return "?";
}

int bcu_math_from_env(void)
{
    const char *f = getenv("DEEPINFER_CUDA_FP32");
    const char *m = getenv("DEEPINFER_CUDA_MATH");
    if (m && *m) {
        if (!strcmp(m, "bf16x3")) return BCU_MATH_BF16X3;
        if (!strcmp(m, "bf16")) return BCU_MATH_BF16;
        if (!strcmp(m, "fp32")) return BCU_MATH_FP32;
        return -1;
    }
    if (f && *f && strcmp(f, "0")) return BCU_MATH_FP32;
    return BCU_MATH_BF16X3;
}

/* ---- weight bookkeeping */

/* a host-synchronous call (an upload, a download, an allocation, a first use): a region that makes one is not
 * recorded, and one being captured fails (its stream cannot wait or copy from pageable memory) */
static void g_touch(cuda_be *c, const char *what)
{
    c->g_dirty = 1;
    if (c->g_capturing)
        fail(c, "%s inside a region being captured as a CUDA graph (DEEPINFER_CUDA_GRAPHS=0 turns capture off)", what);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t scale_elem(md_dtype d)
{
    return d == MD_F8_E8M0 ? 1 : d == MD_F32 ? 4 : d == MD_BF16 ? 2 : 0;
}

/* Bytes of W and of its scales; 0 with a message for what we do not take. */
static size_t weight_bytes(cuda_be *c, const be_weight *w, size_t *sbytes)
{
    *sbytes = 0;
    const size_t R = (size_t)w->rows, C = (size_t)w->cols;
    if (w->rows <= 0 || w->cols <= 0) {
        fail(c, "weight with shape [%lld, %lld]", (long long)w->rows, (long long)w->cols);
        return 0;
    }
    switch (w->fmt) {
    case BE_W_DENSE:
        if (w->dtype == MD_BF16 || w->dtype == MD_F16) return R * C * 2;
        if (w->dtype == MD_F32) return R * C * 4;
        fail(c, "dense weight of dtype %s is not supported", md_dtype_name(w->dtype));
        return 0;
    case BE_W_FP8: {
        size_t es = scale_elem(w->scale_dtype);
        if (!es || w->block <= 0 || !w->scale) {
            fail(c, "FP8 weight with scale dtype %s, block %d", md_dtype_name(w->scale_dtype), w->block);
            return 0;
        }
        size_t bs = (size_t)w->block;
        *sbytes = ((R + bs - 1) / bs) * ((C + bs - 1) / bs) * es;
        return R * C;
    }
    case BE_W_FP4:
        if (w->scale_dtype != MD_F8_E8M0 || w->block <= 0 || C % 2 || C % (size_t)w->block || !w->scale) {
            fail(c, "FP4 weight [%zu, %zu] with scale dtype %s, block %d (want E8M0 and cols a multiple of block)",
                 R, C, md_dtype_name(w->scale_dtype), w->block);
            return 0;
        }
        *sbytes = R * (C / (size_t)w->block);
        return R * C / 2;
    }
    fail(c, "weight format %d is not supported", (int)w->fmt);
    return 0;
}

static uint64_t fingerprint(const be_weight *w, size_t bytes, size_t sbytes, int math)
{
    uint64_t h = 1469598103934665603ull;
    int64_t meta[7] = {w->fmt, w->dtype, w->rows, w->cols, w->scale_dtype, w->block, math};
    h = fnv(h, meta, sizeof meta);
    h = fnv(h, &w->scale, sizeof w->scale);
    size_t k = bytes < 64 ? bytes : 64;
    h = fnv(h, w->data, k);
    h = fnv(h, (const char *)w->data + bytes - k, k);
    if (bytes >= 4096) /* and 16 words spread over the middle */
        for (size_t i = 1; i <= 16; i++) h = fnv(h, (const char *)w->data + (bytes / 17) * i, 8);
    if (sbytes) h = fnv(h, w->scale, sbytes < 32 ? sbytes : 32);
    return h;
}

static size_t slot_of(const cuda_be *c, const void *key)
{
    uint64_t h = (uint64_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (c->cap - 1);
}

static void entry_free(cuda_be *c, wentry *e)
{
    c->g_gen++; /* recorded regions may read it */
    if (e->d) cudaFree(e->d);
    if (e->ds) cudaFree(e->ds);
    c->weight_bytes -= e->bytes;
    e->d = e->ds = NULL;
    e->ds32 = NULL;
    e->bytes = 0;
}

static int grow_table(cuda_be *c)
{
    size_t ncap = c->cap ? c->cap * 2 : 1024;
    wentry *old = c->tab;
    size_t ocap = c->cap;
    wentry *t = (wentry *)calloc(ncap, sizeof *t);
    if (!t) return fail(c, "out of host memory for the weight table");
    c->tab = t;
    c->cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].key) {
            size_t s = slot_of(c, old[i].key);
            while (c->tab[s].key) s = (s + 1) & (c->cap - 1);
            c->tab[s] = old[i];
        }
    free(old);
    return 0;
}

/* The slot for key: its entry, or an empty one (key set, d NULL). */
static wentry *slot(cuda_be *c, const void *key)
{
    if ((c->used + 1) * 2 > c->cap && grow_table(c)) return NULL;
    size_t s = slot_of(c, key);
    while (c->tab[s].key && c->tab[s].key != key) s = (s + 1) & (c->cap - 1);
    if (!c->tab[s].key) {
        c->tab[s].key = key;
        c->used++;
    }
    return &c->tab[s];
}

/* At least n bytes of device scratch.  Grows by doubling, so a steady
 * workload stops allocating after its first steps. */
/* a buffer that grows by doubling (device memory, or pinned host memory), waiting for the stream before a
 * reallocation frees what it may still be using */
static int grow(cuda_be *c, char **buf, size_t *cap, size_t n, int pinned)
{
    if (n <= *cap) return 0;
    g_touch(c, "a buffer reallocation");
    c->g_gen++; /* recorded regions may hold the old address */
    size_t nc = *cap ? *cap : (size_t)1 << 20;
    while (nc < n) nc *= 2;
    if (*buf) {
        CU(cudaStreamSynchronize(c->st));
        CU(pinned ? cudaFreeHost(*buf) : cudaFree(*buf));
        *buf = NULL;
        *cap = 0;
    }
    CU(pinned ? cudaMallocHost((void **)buf, nc) : cudaMalloc((void **)buf, nc));
    *cap = nc;
    return 0;
}

static int scratch(cuda_be *c, size_t n) { return grow(c, &c->scratch, &c->scratch_cap, n, 0); }

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The device copy of w, uploaded on first use. */
static const wentry *weight(cuda_be *c, const be_weight *w)
{
    size_t sb, b = weight_bytes(c, w, &sb);
    if (!b) return NULL;
    const int widen = c->math == BCU_MATH_FP32 && w->fmt == BE_W_DENSE && w->dtype != MD_F32;
    uint64_t fp = fingerprint(w, b, sb, (int)c->math);
    wentry *e = slot(c, w->data);
    if (!e) return NULL;
    if (e->d && e->fp == fp) return e;
    g_touch(c, "a weight upload");
    if (e->d) entry_free(c, e); /* same address, other contents */
    e->fp = fp;
    e->f32 = widen || (w->fmt == BE_W_DENSE && w->dtype == MD_F32);
    e->f16g = (w->fmt == BE_W_FP8 || w->fmt == BE_W_FP4) && w->scale_dtype == MD_F8_E8M0 && sb
                  ? f16x2_shift(w->fmt == BE_W_FP4, (const uint8_t *)w->scale, sb) : F16X2_NONE;
    if (widen) {
        /* stage the 16-bit matrix in scratch, widen into the entry */
        size_t n = (size_t)w->rows * (size_t)w->cols;
        if (scratch(c, b)) return NULL;
        if (cudaMalloc(&e->d, n * 4) != cudaSuccess) {
            e->d = NULL;
            fail(c, "cudaMalloc of %zu bytes for a [%lld, %lld] weight failed (device memory full?)", n * 4,
                 (long long)w->rows, (long long)w->cols);
            return NULL;
        }
        e->bytes = n * 4;
        c->weight_bytes += e->bytes;
        if (cudaMemcpyAsync(c->scratch, w->data, b, cudaMemcpyHostToDevice, c->st) != cudaSuccess ||
            bcu_widen((float *)e->d, (const uint16_t *)c->scratch, n, w->dtype == MD_F16, c->st) != cudaSuccess ||
            cudaStreamSynchronize(c->st) != cudaSuccess) {
            fail(c, "uploading a [%lld, %lld] weight: %s", (long long)w->rows, (long long)w->cols,
                 cudaGetErrorString(cudaGetLastError()));
            entry_free(c, e);
            return NULL;
        }
        return e;
    }
    /* FP8 in 128 x 128 blocks of ue8m0 scales: the scales also as fp32, after the bytes (the FP8 GEMM's) */
    const int64_t nb = (w->rows + 127) / 128, kb = (w->cols + 127) / 128;
    const size_t s32 = w->fmt == BE_W_FP8 && w->scale_dtype == MD_F8_E8M0 && w->block == 128 && w->cols % 128 == 0
                           ? (size_t)nb * (size_t)bcu_fp8lt_sw_ld(w->cols) * 4 : 0;
    cudaError_t r = cudaMalloc(&e->d, b);
    if (r == cudaSuccess && sb) r = cudaMalloc(&e->ds, s32 ? up256(sb) + s32 : sb);
    if (r != cudaSuccess) {
        fail(c, "cudaMalloc of %zu + %zu bytes for a [%lld, %lld] weight failed: %s (device memory full?)", b, sb,
             (long long)w->rows, (long long)w->cols, cudaGetErrorString(r));
        if (e->d) cudaFree(e->d);
        e->d = NULL;
        return NULL;
    }
    e->bytes = b + (s32 ? up256(sb) + s32 : sb);
    c->weight_bytes += e->bytes;
    /* on our stream: a pageable cudaMemcpy on the legacy stream may return
     * before its DMA lands, and our non-blocking stream would not wait for it */
    r = cudaMemcpyAsync(e->d, w->data, b, cudaMemcpyHostToDevice, c->st);
    if (r == cudaSuccess && sb) r = cudaMemcpyAsync(e->ds, w->scale, sb, cudaMemcpyHostToDevice, c->st);
    if (r == cudaSuccess && s32) {
        e->ds32 = (float *)((char *)e->ds + up256(sb));
        r = bcu_e8m0_to_f32(e->ds32, bcu_fp8lt_sw_ld(w->cols), (const uint8_t *)e->ds, nb, kb, c->st);
    }
    if (r == cudaSuccess) r = cudaStreamSynchronize(c->st); /* ops on other lanes may read it */
    if (r != cudaSuccess) {
        fail(c, "uploading a [%lld, %lld] weight: %s", (long long)w->rows, (long long)w->cols, cudaGetErrorString(r));
        entry_free(c, e);
        return NULL;
    }
    return e;
}

/* An rmsnorm weight vector (host f32) on the device. */
static const float *norm_weight(cuda_be *c, const float *w, size_t dim)
{
    const size_t k = dim < 16 ? dim : 16; /* first and last 16 floats */
    uint64_t fp = fnv(1469598103934665603ull, &dim, sizeof dim);
    fp = fnv(fnv(fp, w, k * 4), w + dim - k, k * 4);
    wentry *e = slot(c, w);
    if (!e) return NULL;
    if (e->d && e->fp == fp) return (const float *)e->d;
    g_touch(c, "a parameter upload");
    if (e->d) entry_free(c, e);
    e->fp = fp;
    e->f32 = 1;
    if (cudaMalloc(&e->d, dim * 4) != cudaSuccess) {
        e->d = NULL;
        fail(c, "cudaMalloc of an rmsnorm weight (%zu floats) failed", dim);
        return NULL;
    }
    e->bytes = dim * 4;
    c->weight_bytes += e->bytes;
    /* waits: a parameter may be read by ops on other lanes (a RoPE table) */
    if (cudaMemcpyAsync(e->d, w, dim * 4, cudaMemcpyHostToDevice, c->st) != cudaSuccess ||
        cudaStreamSynchronize(c->st) != cudaSuccess) {
        fail(c, "uploading an rmsnorm weight failed");
        entry_free(c, e);
        return NULL;
    }
    return (const float *)e->d;
}

/* ---- the GEMM core, on device pointers: dy [T, n] = dx [T, K] . W[r0:r0+n, c0:c0+K]^T.
 * tmp: scratch for the bf16 planes and the bf16x3 partial products. */
/* FP8 / FP4 weights with ue8m0 scales at T >= deq_T (and whole rows) take a transient bf16 copy of their rows
 * (exact: every e4m3 / e2m1 value times a power of two is a bf16) and the dense bf16 GEMM; below it the row-dot */
static int dequant_gemm(const cuda_be *c, const be_weight *w, size_t T, int64_t c0, int64_t K)
{
    return (w->fmt == BE_W_FP8 || w->fmt == BE_W_FP4) && w->scale_dtype == MD_F8_E8M0 && c->math != BCU_MATH_FP32 &&
           T >= c->deq_T && c0 == 0 && K == w->cols && K % 32 == 0 && w->block >= 16 &&
           !(w->block & (w->block - 1)) && (w->fmt == BE_W_FP8 || (w->block <= 64 && K % w->block == 0));
}

/* linear_aq on the FP8 tiles (fp8_tile.cu): FP8 weights with ue8m0 128 x 128 scales, ft_min to ft_max tokens, outside
 * the fp32 maths (whose linears stay on the fp32 row-dot), x 16-byte aligned */
static int ft_ok(const cuda_be *c, const be_weight *w, size_t T, const float *x)
{
    return c->ft && c->x8_kernel && T >= c->ft_min && T <= c->ft_max && w->fmt == BE_W_FP8 &&
           w->scale_dtype == MD_F8_E8M0 && c->math != BCU_MATH_FP32 && w->block == 128 && w->cols % 128 == 0 &&
           !((uintptr_t)x & 15u) && bcu_wg_available();
}

/* the FP8 tensor-core GEMM (fp8_gemm.cu) for act_quant'd x on rows [r0, r0 + n), whole rows, of an FP8 weight
 * with ue8m0 scales in 128 x 128 blocks, at the sizes that take the dequantised GEMM; T a multiple of 4 (cuBLASLt
 * has no algorithm for others: the dequantised GEMM) */
static int fp8_gemm_ok(const cuda_be *c, const be_weight *w, size_t T, int64_t r0, int64_t c0, int64_t K)
{
    return c->fp8_gemm && w->fmt == BE_W_FP8 && w->block == 128 && K % 128 == 0 && r0 % 128 == 0 && T % 4 == 0 &&
           dequant_gemm(c, w, T, c0, K);
}

static size_t fp8_tmp_bytes(size_t T, int64_t K) { return up256(T * (size_t)K) + up256(T * (size_t)(K / 128) * 4); }

/* f16x2_gemm's scratch: two f16 planes of x, the rows' shifts, two planes of products */
static size_t f16x2_tmp_bytes(size_t T, int64_t n, int64_t K)
{
    return up256(2 * T * (size_t)K * 2) + up256(T * 4) + up256(2 * T * (size_t)n * 4);
}

/* the weight goes over as f16 with two f16 planes of x: where bf16x3 would take three bf16 planes (x not act_quant'd)
 * and the weight's scales allow it */
static int f16x2_ok(const cuda_be *c, const wentry *e)
{
    return c->f16x2 && c->math == BCU_MATH_BF16X3 && !c->x_fp8 && e->f16g != F16X2_NONE;
}

static size_t core_tmp_bytes(const cuda_be *c, const be_weight *w, size_t T, int64_t n, int64_t K)
{
    const int deq = dequant_gemm(c, w, T, w->cols - K, K);
    if (!deq && (w->fmt != BE_W_DENSE || w->dtype != MD_BF16 || c->math == BCU_MATH_FP32)) return 0;
    const size_t wb = deq ? up256((size_t)n * (size_t)K * 2) : 0;
    size_t b = c->math == BCU_MATH_BF16 ? wb + up256(T * (size_t)K * 2)
                                        : wb + up256(3 * T * (size_t)K * 2) + up256(3 * T * (size_t)n * 4);
    if (deq && wb + f16x2_tmp_bytes(T, n, K) > b) b = wb + f16x2_tmp_bytes(T, n, K);
    if (fp8_gemm_ok(c, w, T, 0, w->cols - K, K) && fp8_tmp_bytes(T, K) > b) b = fp8_tmp_bytes(T, K);
    return b;
}

/* dy [T, n] = act_quant(dx) . W[r0 : r0 + n]^T on the FP8 tensor cores, where fp8_gemm_ok: 0 done, -1 failed, 1 not
 * taken (cuBLASLt has no algorithm for the shape; nothing launched).  dx may be raw or already act_quant'd: the
 * codes are the same values either way (bcu_code_e4m3) */
static int fp8_try(cuda_be *c, const wentry *e, const be_weight *w, float *dy, const float *dx, size_t T, int64_t r0,
                   int64_t n, int64_t K, char *tmp)
{
    if (!e->ds32) return 1;
    if (!c->f8) g_touch(c, "creating the cuBLASLt handle");
    if (!c->f8 && !(c->f8 = bcu_fp8lt_create())) {
        c->fp8_gemm = 0; /* no cuBLASLt handle or workspace: the dequantised GEMM from now on */
        (void)cudaGetLastError();
        return 1;
    }
    uint8_t *xc = (uint8_t *)tmp;
    float *sx = (float *)(tmp + up256(T * (size_t)K));
    CU(bcu_code_e4m3(xc, sx, dx, (int64_t)T, K, K, c->st));
    const cudaError_t r = bcu_fp8lt_gemm(c->f8, dy, (const uint8_t *)e->d + r0 * w->cols,
                                         e->ds32 + (r0 / 128) * bcu_fp8lt_sw_ld(w->cols), xc, sx, n, (int64_t)T, K,
                                         c->st);
    if (r == cudaErrorNotSupported) return 1;
    CU(r);
    c->fp8_calls++;
    return 0;
}

/* dy [T, n] = dx [T, K] . A^T for a bf16 A [n, K] (leading dimension lda) in the math mode's planes */
static int bf16_gemm(cuda_be *c, const uint16_t *A, int lda, float *dy, const float *dx, size_t T, int64_t n, int64_t K,
                     char *tmp)
{
    const int planes = c->math == BCU_MATH_BF16 || c->x_fp8 ? 1 : 3;
    uint16_t *xb = (uint16_t *)tmp;
    float *part = planes == 1 ? dy : (float *)(tmp + up256(3 * T * (size_t)K * 2));
    const float one = 1.0f, zero = 0.0f;
    CU(bcu_split_bf16(xb, dx, T * (size_t)K, planes, c->st));
    BL(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T * planes, (int)K, &one, A, CUDA_R_16BF, lda, xb,
                    CUDA_R_16BF, (int)K, &zero, part, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (planes == 3) CU(bcu_sum3(dy, part, T * (size_t)n, c->st));
    return 0;
}

/* dy [T, n] = dx [T, K] . (A 2^-g)^T for an f16 A [n, K] (leading dimension lda): the weight times 2^g, exact
 * (f16x2.h), against two f16 planes of x, each row shifted into f16's range and shifted back after the sum */
static int f16x2_gemm(cuda_be *c, const uint16_t *A, int lda, int g, float *dy, const float *dx, size_t T, int64_t n,
                      int64_t K, char *tmp)
{
    uint16_t *xh = (uint16_t *)tmp;
    int *rsh = (int *)(tmp + up256(2 * T * (size_t)K * 2));
    float *part = (float *)(tmp + up256(2 * T * (size_t)K * 2) + up256(T * 4));
    const float one = 1.0f, zero = 0.0f;
    CU(bcu_split_f16x2(xh, rsh, dx, T, (size_t)K, c->st));
    BL(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T * 2, (int)K, &one, A, CUDA_R_16F, lda, xh,
                    CUDA_R_16F, (int)K, &zero, part, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CU(bcu_sum2_unscale(dy, part, rsh, T, (size_t)n, g, c->st));
    c->f16x2_calls++;
    return 0;
}

static int core(cuda_be *c, const wentry *e, const be_weight *w, float *dy, const float *dx, size_t T, int64_t r0,
                int64_t n, int64_t c0, int64_t K, char *tmp)
{
    if (!T || n <= 0) return 0;
    if (T > 0x7fffffff / 3 || n > 0x7fffffff || K > 0x7fffffff) return fail(c, "GEMM too large for 32-bit cuBLAS sizes");
    const int ld = (int)w->cols;
    if (w->fmt == BE_W_DENSE && e->f32) {
        const float one = 1.0f, zero = 0.0f;
        BL(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T, (int)K, &one,
                       (const float *)e->d + r0 * w->cols + c0, ld, dx, (int)K, &zero, dy, (int)n));
        return 0;
    }
    if (w->fmt == BE_W_DENSE && w->dtype == MD_BF16 && T <= c->gemv_T && (int64_t)w->rows * w->cols <= ((int64_t)1 << 26)) {
        /* a few rows on a small bf16 matrix (the router, the compressors, the indexer): one row-dot launch in
         * fp32 beats split + GEMM + sum (three launches, W read as three planes' worth of columns) */
        bcu_rowdot_args a = bcu_rowdot_for(w, e->d, NULL, r0, n, c0, dx, (int64_t)T, dy);
        a.fmt = BCU_RW_BF16;
        CU(bcu_rowdot(&a, c->st));
        return 0;
    }
    if (w->fmt == BE_W_DENSE && w->dtype == MD_BF16)
        return bf16_gemm(c, (const uint16_t *)e->d + r0 * w->cols + c0, ld, dy, dx, T, n, K, tmp);
    if (c->x_fp8 && fp8_gemm_ok(c, w, T, r0, c0, K)) {
        const int r = fp8_try(c, e, w, dy, dx, T, r0, n, K, tmp);
        if (r <= 0) return r;
    }
    if (dequant_gemm(c, w, T, c0, K)) {
        uint16_t *wb = (uint16_t *)tmp;
        if (f16x2_ok(c, e)) {
            CU(bcu_dequant_f16(wb, w->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4, e->d, e->ds, BCU_SC_E8M0, w->rows,
                               w->cols, w->block, r0, n, e->f16g, c->st));
            return f16x2_gemm(c, wb, (int)K, e->f16g, dy, dx, T, n, K, tmp + up256((size_t)n * (size_t)K * 2));
        }
        CU(bcu_dequant_bf16(wb, w->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4, e->d, e->ds, BCU_SC_E8M0, w->rows, w->cols,
                            w->block, r0, n, c->st));
        return bf16_gemm(c, wb, (int)K, dy, dx, T, n, K, tmp + up256((size_t)n * (size_t)K * 2));
    }
    if (K != w->cols - c0) return fail(c, "row-dot: K %lld is not cols - c0", (long long)K);
    bcu_rowdot_args a = bcu_rowdot_for(w, e->d, e->ds, r0, n, c0, dx, (int64_t)T, dy);
    a.xq = c->x_fp8 && c->xq_dec && w->fmt == BE_W_FP8; /* the decode kernel on f16 codes, up to 16 rows */
    if (c->x_fp8 && c->rowq8 && w->fmt == BE_W_FP8) {
        const cudaError_t r = bcu_rowdot_x8(&a, c->st);
        if (r == cudaSuccess) return 0;
        if (r != cudaErrorNotSupported) CU(r);
    }
    CU(bcu_rowdot(&a, c->st));
    return 0;
}

/* ---- the ops */

static void nan_fill(float *y, size_t ldy, size_t T, size_t n)
{
    for (size_t t = 0; t < T; t++)
        for (size_t i = 0; i < n; i++) y[t * ldy + i] = NAN;
}

static int linear_rows_locked(cuda_be *c, float *y, size_t ldy, const float *x, size_t ldx, size_t T,
                              const be_weight *w, int64_t r0, int64_t n, int64_t c0)
{
    if (c->failed) return -1;
    if (r0 < 0 || n < 0 || c0 < 0 || r0 + n > w->rows || c0 >= w->cols)
        return fail(c, "linear_rows: rows [%lld, +%lld) cols from %lld outside a [%lld, %lld] weight", (long long)r0,
                    (long long)n, (long long)c0, (long long)w->rows, (long long)w->cols);
    if (!T || !n) return 0;
    CU(cudaSetDevice(c->device));
    const int64_t K = w->cols - c0;
    const wentry *e = weight(c, w);
    if (!e) return -1;
    const size_t xb = up256(T * (size_t)K * 4), yb = up256(T * (size_t)n * 4);
    if (scratch(c, xb + yb + core_tmp_bytes(c, w, T, n, K))) return -1;
    float *dx = (float *)c->scratch, *dy = (float *)(c->scratch + xb);
    CU(cudaMemcpy2DAsync(dx, (size_t)K * 4, x, ldx * 4, (size_t)K * 4, T, cudaMemcpyHostToDevice, c->st));
    if (core(c, e, w, dy, dx, T, r0, n, c0, K, c->scratch + xb + yb)) return -1;
    CU(cudaMemcpy2DAsync(y, ldy * 4, dy, (size_t)n * 4, (size_t)n * 4, T, cudaMemcpyDeviceToHost, c->st));
    CU(cudaStreamSynchronize(c->st));
    return 0;
}

static void cu_linear_rows(be_backend *be, float *y, size_t ldy, const float *x, size_t ldx, size_t T,
                           const be_weight *w, int64_t r0, int64_t n, int64_t c0)
{
    cuda_be *c = get(be);
    const double t0 = c->prof_on ? wall() : 0;
    pthread_mutex_lock(&c->lock);
    int rc = linear_rows_locked(c, y, ldy, x, ldx, T, w, r0, n, c0);
    pthread_mutex_unlock(&c->lock);
    if (rc && n > 0) nan_fill(y, ldy, T, (size_t)n);
    const int whole = r0 == 0 && n == w->rows && c0 == 0;
    prof_add(c, !whole ? BCU_PROF_ROWS : w->fmt == BE_W_FP8 ? BCU_PROF_LINEAR_FP8
                                       : w->fmt == BE_W_FP4 ? BCU_PROF_LINEAR_FP4 : BCU_PROF_LINEAR_BF16, t0);
}

/* the grouped projection in one round trip: x up once, each group's slice of it made dense on the device, the
 * same core() as linear_rows per group (so the same bits), y down once */
static int grouped_locked(cuda_be *c, float *y, const float *x, size_t T, const be_weight *w, int groups, int dev)
{
    if (c->failed) return -1;
    if (groups < 1 || w->rows % groups) return fail(c, "linear_grouped: %lld rows in %d groups", (long long)w->rows, groups);
    if (!T) return 0;
    CU(cudaSetDevice(c->device));
    const int64_t n = w->rows / groups, K = w->cols;
    const wentry *e = weight(c, w);
    if (!e) return -1;
    const size_t xall = dev ? 0 : up256(T * (size_t)K * groups * 4), yall = dev ? 0 : up256(T * (size_t)n * groups * 4),
                 xb = up256(T * (size_t)K * 4), yb = up256(T * (size_t)n * 4);
    /* a batch that takes the dequantised GEMM: the whole weight to bf16 once, x split into its planes once, and one
     * strided-batched cuBLAS GEMM over the groups (a loop of 8 groups was ~50 launches: copies in and out, a
     * dequantise, a split, a GEMM and a sum each) */
    const int batched = groups > 1 && c->grouped_one && w->fmt != BE_W_DENSE && dequant_gemm(c, w, T, 0, K) &&
                        T <= 0x7fffffff / 3 && K * groups <= 0x7fffffff;
    const int f16 = batched && c->math != BCU_MATH_BF16 && f16x2_ok(c, e); /* two f16 planes for bf16x3's three */
    const int planes = c->math == BCU_MATH_BF16 ? 1 : f16 ? 2 : 3;
    const size_t wbb = up256((size_t)w->rows * (size_t)K * 2),
                 xpb = up256((size_t)planes * T * (size_t)K * groups * 2) + (f16 ? up256(T * (size_t)groups * 4) : 0),
                 ptb = planes > 1 ? up256((size_t)planes * T * (size_t)w->rows * 4) : 0;
    size_t need = xall + yall + xb + yb + core_tmp_bytes(c, w, T, n, K);
    if (batched && xall + yall + wbb + xpb + ptb > need) need = xall + yall + wbb + xpb + ptb;
    if (scratch(c, need)) return -1;
    float *dxa = dev ? (float *)x : (float *)c->scratch, *dya = dev ? y : (float *)(c->scratch + xall);
    float *dx = (float *)(c->scratch + xall + yall), *dy = (float *)(c->scratch + xall + yall + xb);
    if (!dev) CU(cudaMemcpyAsync(dxa, x, T * (size_t)K * groups * 4, cudaMemcpyHostToDevice, c->st));
    /* the row-dot reads and writes strided rows: at decode every group in one launch of the decode kernel (the
     * same bits as a launch per group), else each group in its own launch, straight from x and into y */
    const int strided = w->fmt != BE_W_DENSE && !dequant_gemm(c, w, T, 0, K);
    int done = 0;
    if (batched) {
        char *t = c->scratch + xall + yall;
        uint16_t *wb = (uint16_t *)t, *xp = (uint16_t *)(t + wbb);
        int *rsh = (int *)(t + wbb + up256((size_t)planes * T * (size_t)K * groups * 2)); /* f16: the rows' shifts */
        float *part = planes > 1 ? (float *)(t + wbb + xpb) : dya;
        const int64_t R = w->rows, Kg = K * groups;
        const float one = 1.0f, zero = 0.0f;
        const int fmt = w->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4;
        if (f16) {
            /* x [T][groups][K] as T groups rows of K: a shift a token and group ([plane][T][Kg] all the same) */
            CU(bcu_dequant_f16(wb, fmt, e->d, e->ds, BCU_SC_E8M0, w->rows, w->cols, w->block, 0, R, e->f16g, c->st));
            CU(bcu_split_f16x2(xp, rsh, dxa, T * (size_t)groups, (size_t)K, c->st));
        } else {
            CU(bcu_dequant_bf16(wb, fmt, e->d, e->ds, BCU_SC_E8M0, w->rows, w->cols, w->block, 0, R, c->st));
            CU(bcu_split_bf16(xp, dxa, T * (size_t)Kg, planes, c->st)); /* [plane][T][Kg] */
        }
        /* group g: rows [g n, +n) of the weight, columns [g K, +K) of x's plane rows, columns [g n, +n) of y */
        const cudaDataType_t ty = f16 ? CUDA_R_16F : CUDA_R_16BF;
        BL(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T * planes, (int)K, &one, wb, ty,
                                      (int)K, (long long)n * K, xp, ty, (int)Kg, (long long)K, &zero, part,
                                      CUDA_R_32F, (int)R, (long long)n, groups, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
        if (planes == 3) CU(bcu_sum3(dya, part, T * (size_t)R, c->st));
        if (f16) {
            CU(bcu_sum2_unscale(dya, part, rsh, T * (size_t)groups, (size_t)n, e->f16g, c->st)); /* [T][groups][n] */
            c->f16x2_calls++;
        }
        done = 1;
    }
    if (strided && groups > 1 && c->grouped_one) {
        bcu_rowdot_args ra = bcu_rowdot_for(w, e->d, e->ds, 0, n, 0, dxa, (int64_t)T, dya);
        ra.ldx = K * groups;
        ra.ldy = n * groups;
        ra.groups = groups;
        ra.xg = K;
        ra.yg = n;
        const cudaError_t r = bcu_rowdot(&ra, c->st);
        if (r == cudaSuccess) done = 1;
        else if (r != cudaErrorNotSupported) CU(r);
    }
    for (int g = 0; strided && !done && g < groups; g++) {
        bcu_rowdot_args ra = bcu_rowdot_for(w, e->d, e->ds, (int64_t)g * n, n, 0, dxa + (size_t)g * K, (int64_t)T,
                                            dya + (size_t)g * n);
        ra.ldx = K * groups;
        ra.ldy = n * groups;
        CU(bcu_rowdot(&ra, c->st));
    }
    for (int g = 0; !strided && !done && g < groups; g++) {
        CU(cudaMemcpy2DAsync(dx, (size_t)K * 4, dxa + (size_t)g * K, (size_t)K * groups * 4, (size_t)K * 4, T,
                             cudaMemcpyDeviceToDevice, c->st));
        if (core(c, e, w, dy, dx, T, (int64_t)g * n, n, 0, K, c->scratch + xall + yall + xb + yb)) return -1;
        CU(cudaMemcpy2DAsync(dya + (size_t)g * n, (size_t)n * groups * 4, dy, (size_t)n * 4, (size_t)n * 4, T,
                             cudaMemcpyDeviceToDevice, c->st));
    }
    if (dev) return 0;
    CU(cudaMemcpyAsync(y, dya, T * (size_t)n * groups * 4, cudaMemcpyDeviceToHost, c->st));
    CU(cudaStreamSynchronize(c->st));
    return 0;
}

static void cu_linear_grouped(be_backend *be, float *y, const float *x, size_t T, const be_weight *w, int groups)
{
    cuda_be *c = get(be);
    const double t0 = c->prof_on ? wall() : 0;
    pthread_mutex_lock(&c->lock);
    int rc = grouped_locked(c, y, x, T, w, groups, 0);
    pthread_mutex_unlock(&c->lock);
    if (rc) nan_fill(y, (size_t)w->rows, T, (size_t)w->rows);
    prof_add(c, BCU_PROF_ROWS, t0);
}

static void cu_linear(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    cu_linear_rows(be, y, (size_t)w->rows, x, (size_t)w->cols, T, w, 0, w->rows, 0);
}

static int rmsnorm_locked(cuda_be *c, float *y, const float *x, size_t rows, size_t dim, const float *w, float eps)
{
    if (c->failed) return -1;
    if (!rows || !dim) return 0;
    CU(cudaSetDevice(c->device));
    const float *dw = NULL;
    if (w && !(dw = norm_weight(c, w, dim))) return -1;
    const size_t bytes = rows * dim * 4;
    if (scratch(c, bytes)) return -1;
    float *d = (float *)c->scratch;
    CU(cudaMemcpyAsync(d, x, bytes, cudaMemcpyHostToDevice, c->st));
    CU(bcu_rmsnorm(d, d, rows, dim, dw, eps, c->st));
    CU(cudaMemcpyAsync(y, d, bytes, cudaMemcpyDeviceToHost, c->st));
    CU(cudaStreamSynchronize(c->st));
    return 0;
}

static void cu_rmsnorm(be_backend *be, float *y, const float *x, size_t rows, size_t dim, const float *w, float eps)
{
    cuda_be *c = get(be);
    const double t0 = c->prof_on ? wall() : 0;
    pthread_mutex_lock(&c->lock);
    int rc = rmsnorm_locked(c, y, x, rows, dim, w, eps);
    pthread_mutex_unlock(&c->lock);
    if (rc) nan_fill(y, dim, rows, dim);
    prof_add(c, BCU_PROF_RMSNORM, t0);
}

/* ---- the routed experts in one grouped call (moe.cu) */

static int fp4_expert(const be_weight *w, int64_t rows, int64_t cols)
{
    return w->fmt == BE_W_FP4 && w->block == 32 && w->scale_dtype == MD_F8_E8M0 && w->rows == rows && w->cols == cols;
}

/* the routed experts may take moe_wg.cu's kernels (x and h act_quant'd is the caller's part) */
static int wg_ok(const cuda_be *c, int64_t D, int64_t I)
{
    return c->moe_wg && D % 128 == 0 && I % 128 == 0 && bcu_wg_available();
}

static int moe_locked(cuda_be *c, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
                      const be_weight *w1, const be_weight *w3, const be_weight *w2, int E, float limit, int flags,
                      int dev)
{
    if (c->failed) return -1;
    const int64_t D = w1[0].cols, I = w1[0].rows;
    if (E < 1 || D % 32 || I % 32) return 1;
    for (int e = 0; e < E; e++)
        if (!fp4_expert(&w1[e], I, D) || !fp4_expert(&w3[e], I, D) || !fp4_expert(&w2[e], D, I)) return 1;
    const size_t wsb = bcu_moe_workspace_bytes((int64_t)T, topk, E, D, I);
    if (!wsb) return 1;
    CU(cudaSetDevice(c->device));
    moe_tab *t = NULL;
    for (size_t i = 0; i < c->nmt; i++)
        if (c->mt[i].key == w1) t = &c->mt[i];
    /* A table built from the same host weights is used as it is: fingerprinting 3 x E weights on every call
     * is host work that grows with E.  (The weight cache's own guard ran when the table was built; a new
     * weight at the same host addresses is not noticed here.) */
    int same = t && t->n == E && t->src;
    for (int e = 0; same && e < E; e++)
        same = t->src[e] == w1[e].data && t->src[E + e] == w3[e].data && t->src[2 * E + e] == w2[e].data;
    if (same) goto run;
    g_touch(c, "building the expert tables");
    c->g_gen++;
    {
    /* the device pointers of every expert (uploaded on first use) */
    const void **hp = (const void **)malloc(6 * (size_t)E * sizeof *hp);
    if (!hp) return fail(c, "out of memory");
    for (int e = 0; e < E; e++) {
        const be_weight *ws[3] = {&w1[e], &w3[e], &w2[e]};
        for (int k = 0; k < 3; k++) {
            const wentry *we = weight(c, ws[k]);
            if (!we) { free(hp); return -1; }
            hp[(2 * k) * E + e] = we->d;
            hp[(2 * k + 1) * E + e] = we->ds;
        }
    }
    if (!t) {
        moe_tab *n = (moe_tab *)realloc(c->mt, (c->nmt + 1) * sizeof *n);
        if (!n) { free(hp); return fail(c, "out of memory"); }
        c->mt = n;
        t = &c->mt[c->nmt++];
        memset(t, 0, sizeof *t);
        t->key = w1;
    }
    if (t->n != E || !t->host || memcmp(t->host, hp, 6 * (size_t)E * sizeof *hp)) {
        if (t->n != E) {
            if (t->dev) cudaFree(t->dev);
            free(t->host);
            free(t->src);
            t->dev = NULL;
            t->host = NULL;
            t->src = NULL;
            t->n = 0;
            if (cudaMalloc(&t->dev, 6 * (size_t)E * sizeof(void *)) != cudaSuccess) {
                t->dev = NULL;
                free(hp);
                return fail(c, "cudaMalloc of the expert tables failed");
            }
            t->n = E;
        }
        free(t->host);
        t->host = hp;
        hp = NULL;
        CU(cudaMemcpyAsync(t->dev, t->host, 6 * (size_t)E * sizeof(void *), cudaMemcpyHostToDevice, c->st));
    }
    free(hp);
    if (!t->src && !(t->src = (const void **)malloc(3 * (size_t)E * sizeof *t->src))) return fail(c, "out of memory");
    for (int e = 0; e < E; e++) {
        t->src[e] = w1[e].data;
        t->src[E + e] = w3[e].data;
        t->src[2 * E + e] = w2[e].data;
    }
    }
run:
    const uint8_t *const *tab = (const uint8_t *const *)t->dev;
    bcu_moe_experts ex;
    ex.n_experts = E;
    ex.dim = D;
    ex.inter = I;
    ex.swiglu_limit = limit;
    ex.weight_before_w2 = (flags & BE_MOE_WEIGHT_BEFORE_W2) != 0;
    ex.act_fp8_h = (flags & BE_MOE_ACT_FP8_H) != 0;
    ex.w1 = tab;
    ex.s1 = tab + E;
    ex.w3 = tab + 2 * E;
    ex.s3 = tab + 3 * E;
    ex.w2 = tab + 4 * E;
    ex.s2 = tab + 5 * E;
    const size_t xb = dev ? 0 : up256(T * (size_t)D * 4), ib = dev ? 0 : up256(T * (size_t)topk * 4);
    if (scratch(c, up256(wsb) + 2 * xb + 2 * ib + 256)) return -1;
    char *base = c->scratch;
    void *dws = base;
    float *dx = (float *)(base + up256(wsb)), *dy = (float *)((char *)dx + xb);
    int32_t *dids = (int32_t *)((char *)dy + xb);
    float *dw = (float *)((char *)dids + ib);
    if (dev) { /* device activations: nothing travels */
        dx = (float *)x;
        dy = y;
        dids = (int32_t *)ids;
        dw = (float *)w;
    } else {
        CU(cudaMemcpyAsync(dx, x, T * (size_t)D * 4, cudaMemcpyHostToDevice, c->st));
        CU(cudaMemcpyAsync(dids, ids, T * (size_t)topk * 4, cudaMemcpyHostToDevice, c->st));
        CU(cudaMemcpyAsync(dw, w, T * (size_t)topk * 4, cudaMemcpyHostToDevice, c->st));
    }
    /* bf16x3 / bf16: the tensor-core kernels (three bf16 planes, ~1e-6); fp32: FFMA.  When x and h both went
     * through act_quant (official semantics) one bf16 plane holds them exactly: bf16x3 takes the one-plane
     * kernels, the same values for a third of the tensor-core work (the mma rows take the hi plane alone) */
    const int x8 = c->x8_kernel && (flags & BE_MOE_ACT_FP8_X) && (flags & BE_MOE_ACT_FP8_H);
    bcu_moe_math mm = c->math == BCU_MATH_BF16 || (x8 && c->math == BCU_MATH_BF16X3) ? BCU_MOE_BF16
                            : c->math == BCU_MATH_BF16X3                                  ? BCU_MOE_BF16X3
                                                                                          : BCU_MOE_FP32;
    bcu_moe_path mp = bcu_moe_auto_path((int64_t)T, topk, E, mm, (int)c->moe_mmarows_max);
    /* act_quant'd x and h go to wgmma where the device runs sm_90a: small batches to the decode kernel (bf16x3 on
     * f16 values, fp32-exact products like the planes; the bf16 maths on the e4m3 codes, faster, FP8 tensor-core
     * sums), larger ones to the tiles.  Where they cross (H200, bench_gpu_moe, V4-Flash dims, ninth session): f16
     * 1.77 ms against the tiles' 1.91 at 4.5 pairs per expert, 2.02 against 1.94 at 6, 2.50 against 1.98 at 8;
     * e4m3 1.83 against 1.98 at 8, so up to 5 pairs per expert for f16, 8 for e4m3 (its passes of 8 rows re-read
     * the weights: at most one per expert on average) */
    if (x8 && mm != BCU_MOE_FP32 && wg_ok(c, D, I)) {
        const int f16 = c->math == BCU_MATH_BF16X3 && c->moe_wg != 2;
        if (T <= c->moe_gemv_T) {
            /* up to 56 tokens (16 in the bf16 maths): the GEMV, exact products under either maths.  Its passes of
             * two tokens read an expert's weights once a pass, yet on the H200 (bench_gpu_moe, V4-Flash dims) it
             * beat the f16 wgmma kernel up to T = 32 (657 against 790 us; tied at 64) and the e4m3 one up to 8
             * (216 against 232; 657 against 640 at 32); in the slice's whole step it is ahead to 56 (moe_gemv_T) */
            mp = BCU_MOE_WGGEMV;
            mm = BCU_MOE_BF16X3;
        } else if ((int64_t)T * topk <= (f16 ? 5 : 8) * (int64_t)E) {
            mp = BCU_MOE_WGMMA;
            mm = f16 ? BCU_MOE_BF16X3 : BCU_MOE_BF16;
        } else if (D % 256 == 0) {
            mp = BCU_MOE_WGTILES; /* bf16 values with their scales: exact products under either maths */
        }
    }
    CU(bcu_moe_forward(&ex, dy, dx, dids, dw, (int64_t)T, topk, mm, mp, dws, wsb, c->st));
    if (dev) return 0;
    CU(cudaMemcpyAsync(y, dy, T * (size_t)D * 4, cudaMemcpyDeviceToHost, c->st));
    CU(cudaStreamSynchronize(c->st));
    return 0;
}

static int cu_moe(be_backend *be, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
                  const be_weight *w1, const be_weight *w3, const be_weight *w2, int n_experts, float swiglu_limit,
                  int flags)
{
    cuda_be *c = get(be);
    if (!T) return 0;
    const double t0 = c->prof_on ? wall() : 0;
    pthread_mutex_lock(&c->lock);
    int rc = moe_locked(c, y, x, T, ids, w, topk, w1, w3, w2, n_experts, swiglu_limit, flags, 0);
    pthread_mutex_unlock(&c->lock);
    if (rc < 0) nan_fill(y, (size_t)w1[0].cols, T, (size_t)w1[0].cols);
    prof_add(c, BCU_PROF_MOE, t0);
    return rc;
}

/* ---- attention over the KV blocks (attn.cu)
 *
 * The graph keeps the KV blocks in host memory.  Full blocks never change, so
 * each is uploaded once into the KV mirror, a pool of block-sized device slots
 * keyed by md_block id (LRU by clock, never evicting a block the current call
 * uses); the blocks that may still change are uploaded every call, only this
 * layer's rows of them.  Window keys, queries and outputs travel per call.
 * Rows go to the kernels in launches of at most attn_rows rows (a long
 * segment is cut into pieces that each see the right window), which bounds
 * the workspace. */

/* the size of a device pool: env (MB) when set, else 1/div of the free device memory */
static int pool_bytes(cuda_be *c, const char *env, size_t div, size_t *bytes)
{
    size_t fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot));
    *bytes = fr / div;
    const char *e = getenv(env);
    if (e && *e) *bytes = (size_t)strtoull(e, NULL, 10) << 20;
    return 0;
}

/* a size from the environment, or def when unset */
static size_t env_size(const char *name, size_t def)
{
    const char *e = getenv(name);
    return e && *e ? (size_t)strtoull(e, NULL, 10) : def;
}

static void kv_reset(cuda_be *c)
{
    if (c->kv_dev) cudaFree(c->kv_dev);
    c->kv_dev = NULL;
    c->kv_blk = 0;
    kvm_free(&c->kvm);
}

/* the mirror for blocks of blk floats: DEEPINFER_CUDA_KV_MB, or a fifth of the free device memory */
static int kv_init(cuda_be *c, size_t blk)
{
    if (c->kv_blk == blk && c->kv_dev) return 0;
    CU(cudaStreamSynchronize(c->st));
    kv_reset(c);
    size_t bytes;
    if (pool_bytes(c, "DEEPINFER_CUDA_KV_MB", 5, &bytes)) return -1;
    size_t n = bytes / (blk * 4);
    if (n < 16) n = 16;
    if (c->kv_slots) n = c->kv_slots; /* DEEPINFER_CUDA_KV_SLOTS, a test's knob: the mirror in blocks */
    if (cudaMalloc((void **)&c->kv_dev, n * blk * 4) != cudaSuccess) {
        c->kv_dev = NULL;
        return fail(c, "cudaMalloc of the KV mirror (%zu blocks of %zu KB) failed: out of memory (set DEEPINFER_CUDA_KV_MB)",
                    n, blk * 4 / 1024);
    }
    if (kvm_init(&c->kvm, n, (uintptr_t)c->kv_dev, blk * 4)) {
        cudaFree(c->kv_dev);
        c->kv_dev = NULL;
        return fail(c, "out of host memory for the KV mirror");
    }
    c->kv_blk = blk;
    return 0;
}

/* the device copy of full block id (host data src), uploading it on a miss; NULL when every slot is taken
 * by this call (the caller declines) or on a CUDA error (c->failed) */
static const float *kv_get(cuda_be *c, uint64_t id, const float *src)
{
    int miss;
    const long v = kvm_get(&c->kvm, id, &miss);
    if (v < 0) return NULL;
    float *d = c->kv_dev + (size_t)v * c->kv_blk;
    if (miss && cudaMemcpyAsync(d, src, c->kv_blk * 4, cudaMemcpyHostToDevice, c->st) != cudaSuccess) {
        kvm_forget(&c->kvm, v);
        fail(c, "uploading a KV block failed");
        return NULL;
    }
    return d;
}

/* the next staging buffer with room for n bytes, once the copies that last read it have run; NULL on failure */
static char *stage_take(cuda_be *c, size_t n, int *k)
{
    *k = c->stage_k;
    c->stage_k ^= 1;
    if (c->stage_rec[*k]) {
        const cudaError_t r = cudaEventSynchronize(c->stage_ev[*k]);
        if (r != cudaSuccess) {
            fail(c, "waiting for the attention staging copies failed: %s", cudaGetErrorString(r));
            return NULL;
        }
        c->stage_rec[*k] = 0;
    }
    return grow(c, &c->stage[*k], &c->stage_cap[*k], n, 1) ? NULL : c->stage[*k];
}

/* the copies from staging buffer k are queued: mark it */
static int stage_done(cuda_be *c, int k)
{
    CU(cudaEventRecord(c->stage_ev[k], c->st));
    c->stage_rec[k] = 1;
    return 0;
}

static int aws_room(cuda_be *c, const bcu_attn_limits *need)
{
    bcu_attn_limits l = c->aws.lim;
    int grow = !c->aws.mem || need->n_heads != l.n_heads || need->head_dim != l.head_dim ||
               (need->index_topk && (need->index_topk != l.index_topk || need->index_ratio != l.index_ratio)) ||
               need->max_rows > l.max_rows || need->max_len > l.max_len;
    if (!grow) return 0;
    if (need->n_heads != l.n_heads || need->head_dim != l.head_dim) l.index_topk = 0; /* another model */
    l.n_heads = need->n_heads;
    l.head_dim = need->head_dim;
    if (need->index_topk) {
        l.index_topk = need->index_topk;
        l.index_ratio = need->index_ratio;
    }
    if (need->max_rows > l.max_rows) l.max_rows = need->max_rows;
    if (need->max_len > l.max_len) l.max_len = need->max_len + need->max_len / 4; /* room to grow */
    size_t bytes = bcu_attn_workspace_bytes(&l);
    CU(cudaStreamSynchronize(c->st));
    if (c->aws.mem) CU(cudaFree(c->aws.mem));
    c->aws.mem = NULL;
    CU(cudaMalloc(&c->aws.mem, bytes));
    c->aws.lim = l;
    c->aws_bytes = bytes;
    CU(bcu_attn_workspace_init(&c->aws, c->st));
    return 0;
}

/* ---- window rings on the device (the device graph)
 *
 * A state's ring of a layer is copied to a slot once (from the host ring, when the slot's copy is not at p0) and
 * from then on kept up to date here from the keys the graph computed on the device, so a decode step moves no
 * window over PCIe.  Slots are found by hashing (key, layer) over 8 probes; a victim is the oldest slot the
 * current call does not use; when all 8 are in use, the call declines. */

typedef struct {
    const float *rows; /* the segment's T keys (device) */
    float *ring;       /* its ring slot (device) */
    float *dst;        /* where the window for positions kstart .. p0+T-1 goes (device) */
    int64_t kstart, p0;
    int32_t T;
} win_desc;

/* V floats at a time (V = 4: d % 4 == 0 and every pointer 16-byte aligned, as the arena's are) */
template <int V>
__global__ void win_build_kernel(const win_desc *ds, int W, int d)
{
    pdl_enter();
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const win_desc D = ds[blockIdx.y];
    const int dv = d / V;
    const int64_t n = (D.p0 + D.T - D.kstart) * (int64_t)dv;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pos = D.kstart + q / dv, ch = q % dv;
        ((vec *)D.dst)[q] = pos < D.p0 ? ((const vec *)D.ring)[(pos % W) * dv + ch] : ((const vec *)D.rows)[(pos - D.p0) * dv + ch];
    }
}

template <int V>
__global__ void win_put_kernel(const win_desc *ds, int W, int d)
{
    pdl_enter();
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const win_desc D = ds[blockIdx.y];
    const int keep = D.T < W ? D.T : W, dv = d / V;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < (int64_t)keep * dv;
         q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = D.T - keep + q / dv, ch = q % dv;
        ((vec *)D.ring)[((D.p0 + r) % W) * dv + ch] = ((const vec *)D.rows)[r * dv + ch];
    }
}

/* both of the above in one kernel, for descriptors of one key each (T = 1, a decode step): the ring slot the new
 * key takes, (p0 % W), held position p0 - W, which is before the window's start (p0 - W + 1), so no thread reads
 * what another writes */
template <int V>
__global__ void win_step_kernel(const win_desc *ds, int W, int d)
{
    pdl_enter();
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const win_desc D = ds[blockIdx.y];
    const int dv = d / V;
    const int64_t n = (D.p0 + 1 - D.kstart) * (int64_t)dv;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n + dv; q += (int64_t)gridDim.x * blockDim.x) {
        if (q >= n) { /* the new key into the ring */
            ((vec *)D.ring)[(D.p0 % W) * dv + (q - n)] = ((const vec *)D.rows)[q - n];
            continue;
        }
        const int64_t pos = D.kstart + q / dv, ch = q % dv;
        ((vec *)D.dst)[q] = pos < D.p0 ? ((const vec *)D.ring)[(pos % W) * dv + ch] : ((const vec *)D.rows)[ch];
    }
}

static void win_reset(cuda_be *c)
{
    if (c->win_dev) cudaFree(c->win_dev);
    free(c->win);
    c->win_dev = NULL;
    c->win = NULL;
    c->win_n = c->win_W = c->win_d = 0;
}

/* slots for rings of W x d floats: DEEPINFER_CUDA_WIN_MB, or a tenth of the free device memory */
static int win_init(cuda_be *c, int W, int d)
{
    if (c->win_dev && c->win_W == (size_t)W && c->win_d == (size_t)d) return 0;
    CU(cudaStreamSynchronize(c->st));
    win_reset(c);
    size_t bytes;
    if (pool_bytes(c, "DEEPINFER_CUDA_WIN_MB", 10, &bytes)) return -1;
    size_t n = bytes / ((size_t)W * d * 4);
    if (n < 16) n = 16;
    c->win = (struct cuda_be::winslot *)calloc(n, sizeof *c->win);
    if (!c->win) return fail(c, "out of host memory for the window slots");
    if (cudaMalloc((void **)&c->win_dev, n * (size_t)W * d * 4) != cudaSuccess) {
        c->win_dev = NULL;
        return fail(c, "cudaMalloc of %zu window slots failed (set DEEPINFER_CUDA_WIN_MB)", n);
    }
    c->win_n = n;
    c->win_W = (size_t)W;
    c->win_d = (size_t)d;
    return 0;
}

/* the slot of (key, layer) brought to position p0 (from the host ring when needed); NULL: every probed slot is
 * in use by this call, or a CUDA error */
static float *win_get(cuda_be *c, uint64_t key, int layer, int64_t p0, const float *ring)
{
    const size_t h = (size_t)bps_mix(key * 0x9E3779B97F4A7C15ull + (uint64_t)layer) % c->win_n;
    size_t v = c->win_n;
    for (size_t k = 0; k < 8 && k < c->win_n; k++) {
        const size_t i = (h + k) % c->win_n;
        if (c->win[i].key == key && c->win[i].layer == layer) {
            v = i;
            break;
        }
        if (c->win[i].call != c->kv_call && (v == c->win_n || !c->win[i].key || c->win[i].call < c->win[v].call)) v = i;
    }
    if (v == c->win_n) return NULL;
    float *slot = c->win_dev + v * c->win_W * c->win_d;
    if (c->win[v].key != key || c->win[v].layer != layer || c->win[v].len != p0) {
        if (cudaMemcpyAsync(slot, ring, c->win_W * c->win_d * 4, cudaMemcpyHostToDevice, c->st) != cudaSuccess) {
            fail(c, "uploading a window ring failed");
            return NULL;
        }
        c->win[v].key = key;
        c->win[v].layer = layer;
        c->win[v].len = p0; /* what the slot holds once the copy lands (stream order) */
        c->win_loads++;
    } else {
        c->win_hits++;
    }
    c->win[v].call = c->kv_call;
    return slot;
}

/* after the kernels: the slot of (key, layer) holds the ring at position len */
static void win_mark(cuda_be *c, uint64_t key, int layer, int64_t len)
{
    const size_t h = (size_t)bps_mix(key * 0x9E3779B97F4A7C15ull + (uint64_t)layer) % c->win_n;
    for (size_t k = 0; k < 8 && k < c->win_n; k++) {
        const size_t i = (h + k) % c->win_n;
        if (c->win[i].key == key && c->win[i].layer == layer) {
            c->win[i].len = len;
            return;
        }
    }
}

/* ---- partial KV blocks on the device
 *
 * backend/part_slots.h has the rules (what a slot holds, what a call brings over: nothing in a steady decode,
 * where last step's device-made rows went into the slot by their patches); the host-dev graph's tests check them
 * (test_model, test_kv).  A block that finds no slot is staged whole, as before.
 * On by default (DEEPINFER_CUDA_PART_MB=N: N MB of slots, 0: off; unset: 1/16 of the free device memory).
 * First run on the H200 2026-11-30 (sixth session): test_cuda's model tests pass with 64 MB and with 1 MB
 * (evictions); bench_gpu_layers at B = 256: the attention op's own time in the profiled step 5.6 -> 2.8 ms (it
 * staged ~20 MB of partial CSA blocks a step), the timed step unchanged (19.3 ms: that staging overlapped the
 * GPU's work, which bounds the step). */
static void ps_reset(cuda_be *c)
{
    if (c->ps_dev) cudaFree(c->ps_dev);
    free(c->ps);
    c->ps_dev = NULL;
    c->ps = NULL;
    c->ps_n = c->ps_sz = 0;
}

/* slots of at least sz floats in DEEPINFER_CUDA_PART_MB MB; no pool (every block staged) when that holds fewer
 * than 8 or the allocation fails */
static int ps_init(cuda_be *c, size_t sz)
{
    if (c->ps_off || (c->ps_dev && c->ps_sz >= sz)) return 0;
    CU(cudaStreamSynchronize(c->st));
    ps_reset(c);
    size_t bytes;
    if (pool_bytes(c, "DEEPINFER_CUDA_PART_MB", 16, &bytes)) return -1;
    const size_t n = bytes / (sz * 4);
    if (n < 8) {
        c->ps_off = 1;
        return 0;
    }
    c->ps = (bps_slot *)calloc(n, sizeof *c->ps);
    if (!c->ps || cudaMalloc((void **)&c->ps_dev, n * sz * 4) != cudaSuccess) {
        (void)cudaGetLastError();
        free(c->ps);
        c->ps = NULL;
        c->ps_dev = NULL;
        c->ps_off = 1; /* staging still works */
        return 0;
    }
    c->ps_n = n;
    c->ps_sz = sz;
    return 0;
}

/* one row the device graph's compressors made (be_attn_seq.ent_dev / key_dev) into the staged copy of its block */
struct ent_patch {
    float *dst;
    const float *src;
    int64_t n;
};

__global__ void ent_patch_kernel(const ent_patch *p)
{
    pdl_enter();
    const ent_patch q = p[blockIdx.x];
    for (int64_t j = threadIdx.x; j < q.n; j += blockDim.x) q.dst[j] = q.src[j];
}

/* the attention's copy stream and its event, made at first use */
static int cp_make(cuda_be *c)
{
    if (c->have_cp) return 0;
    g_touch(c, "making the attention's copy stream");
    CU(cudaStreamCreateWithFlags(&c->cp_st, cudaStreamNonBlocking));
    if (cudaEventCreateWithFlags(&c->cp_ev, cudaEventDisableTiming) != cudaSuccess) {
        cudaStreamDestroy(c->cp_st);
        return fail(c, "cudaEventCreate for the attention's copy stream failed");
    }
    c->have_cp = 1;
    return 0;
}

static int attn_locked(cuda_be *c, const be_attn_seq *sq, int nseq, int ntok, const be_attn_args *a, int devio)
{
    if (c->failed) return -1;
    const int H = a->n_heads, d = a->head_dim, IH = a->index_heads, ID = a->index_dim;
    if ((d != 128 && d != 256 && d != 384 && d != 512) || a->rope_dim % 2 || a->rope_dim > d ||
        (a->ratio && (a->ratio < 0 || 128 % a->ratio)) || a->ent_off % 4 || a->key_off % 4 || nseq < 1)
        return 1;
    if (a->csa && (!a->ratio || IH < 1 || IH > 64 || ID % 4 || ID > 192 || a->topk < 1)) return 1;
    CU(cudaSetDevice(c->device));
    const size_t blk = a->blk_floats;
    if (a->ratio && kv_init(c, blk)) return -1;
    c->kv_call++;
    kvm_begin(&c->kvm, c->kv_call);
    /* windows from the device rings: every sequence without host window keys must have one */
    int nring = 0;
    for (int s = 0; s < nseq; s++)
        if (!sq[s].kwin) {
            if (!devio || !sq[s].win_key || !sq[s].krows || !sq[s].ring) return 1;
            nring++;
        }
    if (nring > 65535) return 1;
    if (nring && win_init(c, a->window, d)) return -1;
    const int epb = a->ratio ? 128 / a->ratio : 0;
    /* what travels: per sequence its window keys and the changing blocks' rows of this layer (and the rows the
     * device made for them: patches) */
    size_t nb = 0, npart = 0, nwin = 0, npatch = 0;
    for (int s = 0; s < nseq; s++) {
        if (sq[s].T < 1 || sq[s].kstart > sq[s].p0 || sq[s].nfull > sq[s].nblk) return fail(c, "attention: bad sequence %d", s);
        nb += sq[s].nblk;
        npart += sq[s].nblk - sq[s].nfull;
        nwin += (size_t)(sq[s].p0 + sq[s].T - sq[s].kstart) * (size_t)d;
        for (int k = 0; k < 2; k++) {
            const int64_t e0 = k ? sq[s].key0 : sq[s].ent0, ne = k ? sq[s].nkey : sq[s].nent;
            if (ne <= 0) continue;
            /* the rows belong to blocks this call may still change: staged ones, which are then patched */
            if (!a->ratio || (k && !a->csa) || !(k ? sq[s].key_dev : sq[s].ent_dev) || e0 < 0 ||
                (size_t)(e0 / epb) < sq[s].nfull || (size_t)((e0 + ne - 1) / epb) >= sq[s].nblk)
                return 1;
            npatch += (size_t)ne;
        }
    }
    if (!a->ratio) nb = npart = 0;
    /* a staged block holds only this layer's rows: its entries and, right after them in the block layout (v4.c's
     * blk_geometry), its indexer keys; the kernels address block + ent_off / key_off, so the block pointer they get
     * is the staged rows less ent_off (an address the kernels only ever add ent_off or more to) */
    const size_t ent_rows = (size_t)epb * d, key_rows = a->csa ? (size_t)epb * ID : 0;
    if (a->ratio && key_rows && a->key_off != a->ent_off + ent_rows) return 1;
    const size_t pstride = ent_rows + key_rows;
    const int rows_max = c->attn_rows;
    const size_t o_part = 0, o_win = up256(npart * pstride * 4), o_ptr = o_win + up256(nwin * 4),
                 o_seq = o_ptr + up256((nb ? nb : 1) * sizeof(float *)),
                 o_wd = o_seq + up256((size_t)(nseq + ntok / rows_max + 2) * sizeof(bcu_attn_seq)),
                 o_patch = o_wd + up256((size_t)(nring ? nring : 1) * sizeof(win_desc)),
                 staged = o_patch + up256((npatch + 2 * npart + 1) * sizeof(ent_patch));
    if (npart && ps_init(c, pstride)) return -1;
    /* per partial block, in call order: the slot it has and the rows the slot will hold after this call (applied
     * once the call's copies are queued), or none.  Full blocks have no entry: at 256 x 128K an entry a block was a
     * 4 MB allocation, written and read again, on every compressed layer's call */
    struct pend_t { bps_slot *p; int32_t after[2]; };
    pend_t *pend = NULL;
    size_t npd = 0;
    if (npart && !(pend = (pend_t *)malloc(npart * sizeof *pend))) return fail(c, "out of host memory");
    /* device: the staged part, then per launch q, out, iq, iw, sel, nsel */
    const size_t qb = devio ? 0 : up256((size_t)rows_max * H * d * 4),
                 iqb = a->csa && !devio ? up256((size_t)rows_max * IH * ID * 4) : 0,
                 iwb = a->csa && !devio ? up256((size_t)rows_max * IH * 4) : 0,
                 selb = a->csa ? up256((size_t)rows_max * a->topk * 4) : 0, nselb = a->csa ? up256((size_t)rows_max * 4) : 0;
    const int side = devio && c->attn_side && !cp_make(c);
    if (scratch(c, (side ? 0 : staged) + 2 * qb + iqb + iwb + selb + nselb + 256)) return -1;
    int sk;
    char *hst = stage_take(c, staged, &sk); /* (its wait also frees astg[sk]: the kernels that read it have run) */
    if (!hst || (side && grow(c, &c->astg[sk], &c->astg_cap[sk], staged, 0))) {
        free(pend);
        return -1;
    }
    char *dev = side ? c->astg[sk] : c->scratch;
    cudaStream_t ust = side ? c->cp_st : c->st; /* the staged copies' stream */
    float *dq = (float *)(side ? c->scratch : dev + staged), *dout = (float *)((char *)dq + qb), *diq = (float *)((char *)dout + qb);
    float *diw = (float *)((char *)diq + iqb);
    int32_t *dsel = (int32_t *)((char *)diw + iwb), *dnsel = (int32_t *)((char *)dsel + selb);
    const float *dsink = norm_weight(c, a->sink, (size_t)H);
    const float *dfreq = norm_weight(c, a->inv_freq, (size_t)(a->rope_dim / 2));
    if (!dsink || !dfreq) {
        free(pend);
        return -1;
    }
    /* block pointers: the mirror for full blocks; for the others a slot (ps_get) when one is free, brought up to
     * the rows the host has, else the staged area */
    const float **hptr = (const float **)(hst + o_ptr);
    float *hpart = (float *)(hst + o_part), *hwin = (float *)(hst + o_win);
    size_t kb = 0, kpf = 0, kw = 0, nwd = 0, np = 0;
    int host_win = 0; /* some sequence brought its window keys from the host */
    ent_patch *hpat = (ent_patch *)(hst + o_patch);
    /* the kernels' pointer for a block whose layer rows start at rows (an address they only add ent_off or more to) */
    auto kbase = [&](const float *rows) { return (const float *)((uintptr_t)rows - a->ent_off * sizeof(float)); };
    int rc = 0;
    for (int s = 0; s < nseq && !rc; s++) {
        const size_t kb0 = kb;
        size_t i0 = 0;
        kvm_entry *pe = NULL;
        int pfill = 0;
        if (c->kvpc_on && a->ratio && sq[s].nfull >= 8) {
            pe = kvm_pc_find(&c->kvm, sq[s].block_ids[0], sq[s].block_ids[sq[s].nfull - 1], sq[s].nfull, &pfill);
            if (pe && !pfill) { /* served: kvm_pc_served stamps its blocks when an eviction in this call needs it */
                const size_t n = sq[s].nfull;
                memcpy(hptr + kb, pe->p, n * sizeof *hptr);
                if (kvm_pc_served(&c->kvm, pe)) {
                    free(pend);
                    return fail(c, "out of host memory for the KV pointer cache");
                }
                kb += n;
                i0 = n;
                pe = NULL;
            }
        }
        for (size_t i = i0; a->ratio && i < sq[s].nblk; i++, kb++) {
            if (i < sq[s].nfull) {
                const float *p = kv_get(c, sq[s].block_ids[i], sq[s].blocks[i]);
                if (!p) { /* the mirror is full of this call's blocks: the host does it */
                    rc = c->failed ? -1 : 1;
                    break;
                }
                hptr[kb] = p;
                continue;
            }
            const long si = c->ps_off ? -1 : bps_get(c->ps, c->ps_n, sq[s].block_ids[i], a->layer, c->kv_call);
            bps_slot *ps = si < 0 ? NULL : &c->ps[si];
            pend_t *pd = &pend[npd++];
            pd->p = ps;
            if (!ps) {
                memcpy(hpart + kpf, sq[s].blocks[i] + a->ent_off, pstride * 4);
                hptr[kb] = kbase((const float *)(dev + o_part) + kpf);
                kpf += pstride;
                continue;
            }
            int32_t host[2];
            bps_host_rows(&sq[s], i, epb, a->ratio, key_rows != 0, host);
            bps_begin(ps, host);
            bps_after(&sq[s], i, epb, host, pd->after);
            float *rows = c->ps_dev + (size_t)si * c->ps_sz;
            if (ps->have[0] == host[0] && ps->have[1] == host[1]) c->ps_hits++;
            for (int k = 0; k < 2; k++) { /* rows [slot's, host's) up through the staged area */
                const int32_t from = ps->have[k], to = host[k];
                if (to <= from) continue;
                const size_t w = k ? (size_t)ID : (size_t)d, n = (size_t)(to - from) * w;
                memcpy(hpart + kpf, sq[s].blocks[i] + (k ? a->key_off : a->ent_off) + (size_t)from * w, n * 4);
                hpat[np++] = ent_patch{rows + (k ? ent_rows : 0) + (size_t)from * w, (const float *)(dev + o_part) + kpf,
                                       (int64_t)n};
                kpf += n;
                c->ps_rows += (size_t)(to - from);
            }
            hptr[kb] = kbase(rows);
        }
        if (rc) break;
        if (pe && pfill) /* its full blocks resolved (and stamped): cached for the next layers and steps */
            kvm_pc_store(&c->kvm, pe, hptr + kb0);
        for (int k = 0; k < 2 && a->ratio; k++) { /* the rows the device made, into their blocks */
            const int64_t e0 = k ? sq[s].key0 : sq[s].ent0, ne = k ? sq[s].nkey : sq[s].nent;
            const size_t w = k ? (size_t)ID : (size_t)d, off = k ? a->key_off : a->ent_off;
            for (int64_t j = 0; j < ne; j++) {
                const int64_t e = e0 + j;
                const size_t bk = kb0 + (size_t)(e / epb);
                hpat[np++] = ent_patch{(float *)hptr[bk] + off + (size_t)(e % epb) * w,
                                       (k ? sq[s].key_dev : sq[s].ent_dev) + (size_t)j * w, (int64_t)w};
            }
        }
        const size_t w = (size_t)(sq[s].p0 + sq[s].T - sq[s].kstart) * (size_t)d;
        if (sq[s].kwin) {
            memcpy(hwin + kw, sq[s].kwin, w * 4);
            host_win = 1;
        } else {
            float *slot = win_get(c, sq[s].win_key, a->layer, sq[s].p0, sq[s].ring);
            if (!slot) {
                rc = c->failed ? -1 : 1;
                break;
            }
            win_desc *wd = (win_desc *)(hst + o_wd) + nwd++;
            *wd = (win_desc){sq[s].krows, slot, (float *)(dev + o_win) + kw, sq[s].kstart, sq[s].p0, sq[s].T};
        }
        kw += w;
    }
    if (!rc) /* the slots hold what this call's copies and patches put there (in stream order) */
        for (size_t i = 0; i < npd; i++)
            if (pend[i].p) {
                pend[i].p->have[0] = pend[i].after[0];
                pend[i].p->have[1] = pend[i].after[1];
            }
    free(pend);
    if (rc) return rc;
    /* the launches, of at most rows_max rows each: their sequence lists staged first, so that one copy takes the
     * block pointers, the lists, the window descriptors and the patches up together (at decode each copy of its
     * own was a round of the copy engine between two kernels); a segment may be cut (each launch adds at most one
     * piece, so the staged area holds nseq + launches entries) */
    const int nlmax = ntok / rows_max + 2;
    if ((size_t)nlmax > c->lz_cap) {
        attn_launch *nz = (attn_launch *)realloc(c->lz, (size_t)nlmax * sizeof *nz);
        if (!nz) return fail(c, "out of host memory");
        c->lz = nz;
        c->lz_cap = (size_t)nlmax;
    }
    attn_launch *lz = c->lz;
    bcu_attn_seq *hs = (bcu_attn_seq *)(hst + o_seq);
    int nl = 0, nls = 0;
    /* the ring sequences' window descriptors: every one a key whose window starts W - 1 before it (a decode step)
     * takes one kernel for both halves of the window's update (one); and then, where the rows are 16-byte
     * aligned (v4), the attention kernels read the ring itself and put the new key in (ring: no window copy,
     * DEEPINFER_CUDA_WIN_RING, 1) */
    const win_desc *hwd = (const win_desc *)(hst + o_wd);
    int v4 = d % 4 == 0 && (uintptr_t)(dev + o_win) % 16 == 0 && (uintptr_t)c->win_dev % 16 == 0;
    for (size_t i = 0; v4 && i < nwd; i++) v4 = (uintptr_t)hwd[i].rows % 16 == 0;
    int one = 1;
    for (size_t i = 0; one && i < nwd; i++) one = hwd[i].T == 1 && hwd[i].kstart >= hwd[i].p0 - a->window + 1;
    const int ring = nwd && one && v4 && c->win_ring;
    {
        int s = 0, done_in_s = 0, row = 0;
        size_t wi = 0; /* the ring sequences passed */
        size_t blk0 = 0, win0 = 0;
        while (row < ntok) {
            int n = 0, rows = 0;
            int64_t max_len = 0;
            bcu_attn_seq *ls = hs + nls;
            while (s < nseq && rows < rows_max) {
                const be_attn_seq *q = &sq[s];
                int take = q->T - done_in_s;
                if (take > rows_max - rows) take = rows_max - rows;
                const int64_t p0 = q->p0 + done_in_s;
                int64_t ks = p0 - a->window + 1;
                if (ks < q->kstart) ks = q->kstart;
                bcu_attn_seq *o = &ls[n++];
                o->p0 = p0;
                o->kstart = ks;
                o->kwin = (const float *)(dev + o_win) + win0 + (size_t)(ks - q->kstart) * d;
                o->blocks = (const float *const *)(dev + o_ptr) + blk0;
                o->row0 = rows;
                o->T = take;
                o->kring = ring && !q->kwin ? hwd[wi].ring : NULL;
                o->knew = ring && !q->kwin ? hwd[wi].rows : NULL;
                if (p0 + take > max_len) max_len = p0 + take;
                rows += take;
                done_in_s += take;
                if (done_in_s == q->T) {
                    if (!q->kwin) wi++;
                    blk0 += a->ratio ? q->nblk : 0;
                    win0 += (size_t)(q->p0 + q->T - q->kstart) * d;
                    s++;
                    done_in_s = 0;
                }
            }
            if (!rows || nl == nlmax) return fail(c, "attention: %d rows asked, the sequences hold %d", ntok, row);
            lz[nl++] = attn_launch{n, rows, row, nls, max_len};
            nls += n;
            row += rows;
        }
    }
    /* up: the staged rows and the window keys only if some came from the host (win_build_kernel writes the ring
     * sequences' windows there on the device: V4-Flash, 256 KB a sequence a layer); then the block pointers, the
     * launches' lists, the window descriptors and the patches in one copy, from the pointers to the last of them */
    if (kpf) CU(cudaMemcpyAsync(dev + o_part, hst + o_part, kpf * 4, cudaMemcpyHostToDevice, ust));
    if (host_win) CU(cudaMemcpyAsync(dev + o_win, hst + o_win, kw * 4, cudaMemcpyHostToDevice, ust));
    const size_t up_end = np ? o_patch + np * sizeof(ent_patch) : nwd ? o_wd + nwd * sizeof(win_desc)
                                                                      : o_seq + (size_t)nls * sizeof(bcu_attn_seq);
    CU(cudaMemcpyAsync(dev + o_ptr, hst + o_ptr, up_end - o_ptr, cudaMemcpyHostToDevice, ust));
    if (side) {
        CU(cudaEventRecord(c->cp_ev, ust));
        CU(cudaStreamWaitEvent(c->st, c->cp_ev, 0));
    }
    if (np) { /* the rows the slots lacked, and the rows the device made, into their blocks */
        pdl_launch(ent_patch_kernel, (unsigned)np, 128, 0, c->st, (const ent_patch *)(dev + o_patch));
        CU(cudaGetLastError());
    }
    if (nwd && !ring) {
        /* the windows of the ring sequences, then their rings advanced past this call's keys */
        /* a window is W x d floats (V4-Flash: 256 KB): enough blocks that each thread moves one or two vectors,
         * fewer when many sequences fill the GPU anyway */
        const int64_t per = (int64_t)a->window * d / (v4 ? 4 : 1);
        unsigned gx = (unsigned)((per + 511) / 512);
        if (gx > 64) gx = 64;
        if (nwd >= 64 && gx > 4) gx = 4;
        const dim3 grid(gx ? gx : 1, (unsigned)nwd);
        const win_desc *wd = (const win_desc *)(dev + o_wd);
        if (one && v4) pdl_launch(win_step_kernel<4>, grid, 256, 0, c->st, wd, a->window, d);
        else if (one) pdl_launch(win_step_kernel<1>, grid, 256, 0, c->st, wd, a->window, d);
        else if (v4) pdl_launch(win_build_kernel<4>, grid, 256, 0, c->st, wd, a->window, d);
        else pdl_launch(win_build_kernel<1>, grid, 256, 0, c->st, wd, a->window, d);
        CU(cudaGetLastError());
        if (!one) {
            if (v4) pdl_launch(win_put_kernel<4>, grid, 256, 0, c->st, wd, a->window, d);
            else pdl_launch(win_put_kernel<1>, grid, 256, 0, c->st, wd, a->window, d);
            CU(cudaGetLastError());
        }
    }
    if (nwd) /* the slots are at p0 + T now (ring: once the attention kernels below have put the keys in) */
        for (int s = 0; s < nseq; s++)
            if (!sq[s].kwin) win_mark(c, sq[s].win_key, a->layer, sq[s].p0 + sq[s].T);
    for (int li = 0; li < nl; li++) {
        const int n = lz[li].n, rows = lz[li].rows, row = lz[li].row;
        const int64_t max_len = lz[li].max_len;
        bcu_attn_limits need = {rows, max_len, H, d, a->csa ? a->topk : 0, a->csa ? a->ratio : 0};
        if (aws_room(c, &need)) return -1;
        bcu_attn_batch bt = {(const bcu_attn_seq *)(dev + o_seq) + lz[li].base, n, rows, max_len};
        if (devio) { /* device activations: q, iq, iw and out are read and written where they are */
            dq = (float *)a->q + (size_t)row * H * d;
            dout = a->out + (size_t)row * H * d;
            if (a->csa) {
                diq = (float *)a->iq + (size_t)row * IH * ID;
                diw = (float *)a->iw + (size_t)row * IH;
            }
        } else {
            CU(cudaMemcpyAsync(dq, a->q + (size_t)row * H * d, (size_t)rows * H * d * 4, cudaMemcpyHostToDevice, c->st));
        }
        char msg[256] = "";
        if (a->csa) {
            if (!devio) {
                CU(cudaMemcpyAsync(diq, a->iq + (size_t)row * IH * ID, (size_t)rows * IH * ID * 4,
                                   cudaMemcpyHostToDevice, c->st));
                CU(cudaMemcpyAsync(diw, a->iw + (size_t)row * IH, (size_t)rows * IH * 4, cudaMemcpyHostToDevice, c->st));
            }
            bcu_indexer_args ia = {IH, ID, a->ratio, a->topk, a->key_off, diq, diw, dsel, dnsel, c->attn_mma, 0,
                                   a->ix_fp4 ? c->ix_exact : 0};
            if (bcu_indexer_topk(&c->aws, &bt, &ia, c->st, msg, sizeof msg) != cudaSuccess)
                return fail(c, "indexer: %s", msg[0] ? msg : "launch failed");
        }
        bcu_attention_args aa = {H, d, a->rope_dim, a->window, a->ratio, a->csa, a->ent_off, dq, dsink, dfreq,
                                 a->csa ? dsel : NULL, a->csa ? dnsel : NULL, a->csa ? a->topk : 0, dout,
                                 c->attn_mma, a->kv_fp8 ? c->attn_x3 : 0, 0};
        if (bcu_attention(&c->aws, &bt, &aa, c->st, msg, sizeof msg) != cudaSuccess)
            return fail(c, "attention: %s", msg[0] ? msg : "launch failed");
        if (!devio)
            CU(cudaMemcpyAsync(a->out + (size_t)row * H * d, dout, (size_t)rows * H * d * 4, cudaMemcpyDeviceToHost,
                               c->st));
    }
    if (stage_done(c, sk)) return -1;
    if (devio) { /* the error flags are read at the next download, which waits for the device anyway */
        c->aws_pending = 1;
        return 0;
    }
    int fl = bcu_attn_workspace_flags(&c->aws, 1, c->st); /* synchronises */
    if (fl < 0) return fail(c, "reading the attention error flags failed");
    if (fl) return fail(c, "attention kernels flagged bad input (flags %d)", fl);
    return 0;
}

static int cu_attention(be_backend *be, const be_attn_seq *seqs, int nseq, int ntok, const be_attn_args *a)
{
    cuda_be *c = get(be);
    if (ntok < 1) return 0;
    const double t0 = c->prof_on ? wall() : 0;
    pthread_mutex_lock(&c->lock);
    int rc = attn_locked(c, seqs, nseq, ntok, a, 0);
    pthread_mutex_unlock(&c->lock);
    if (rc < 0) nan_fill(a->out, (size_t)a->n_heads * a->head_dim, (size_t)ntok, (size_t)a->n_heads * a->head_dim);
    prof_add(c, BCU_PROF_ATTENTION, t0);
    return rc;
}

/* ---- the device-resident graph (be_dev_ops; src/model/v4.c forward_dev)
 *
 * Activations come from an arena of device chunks that reset() empties; when a
 * forward needed more than one chunk, reset() replaces them with one chunk of
 * the total, so a steady workload allocates nothing.  Uploads go through a
 * pinned ring (the host copy is made at once; the ring wraps only after the
 * stream has drained).  The math ops are asynchronous: a failure is sticky and
 * every later op does nothing; download() is where the graph waits and sees
 * it.  With profiling on, each op waits for the device so that its class gets
 * its own time. */

static double prof_t0(cuda_be *c)
{
    if (!c->prof_on) return 0;
    cudaStreamSynchronize(c->st);
    return wall();
}

static void prof_dev(cuda_be *c, int cls, double t0)
{
    if (!c->prof_on) return;
    cudaStreamSynchronize(c->st);
    prof_add(c, cls, t0);
}

#define DV_ENTER(cls)                      \
    cuda_be *c = get(be);                  \
    const int cls_ = (cls);                \
    pthread_mutex_lock(&c->lock);          \
    const double t0_ = prof_t0(c);         \
    if (!c->failed) {
#define DV_LEAVE                           \
    }                                      \
    prof_dev(c, cls_, t0_);                \
    pthread_mutex_unlock(&c->lock)
#define DV_CU(call)                                                                                    \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess)                                                                         \
            fail(c, "%s failed: %s (%s) at %s:%d", #call, cudaGetErrorName(e_), cudaGetErrorString(e_), \
                 __FILE__, __LINE__);                                                                  \
    } while (0)

static void ar_free(arena_t *a)
{
    for (int i = 0; i < a->n; i++) cudaFree(a->ch[i].p);
    a->n = a->cur = 0;
}

/* every chunk empty.  The chunks stay: a forward that allocates what an earlier one did finds its space again,
 * chunk by chunk (merging them into one allocation here cost a cudaFree + cudaMalloc of the whole arena, 66 GB
 * after a 16384-token prefill of the V4-Flash slice, on the next forward: ~110 ms, 2026-11-30) */
static void ar_clear(arena_t *a)
{
    for (int i = 0; i < a->n; i++) a->ch[i].used = 0;
    a->cur = 0;
}

/* bytes (a multiple of 256) from a: the current chunk or a later one with room, else a new chunk twice the last */
static void *ar_alloc(cuda_be *c, arena_t *a, size_t bytes)
{
    while (a->cur < a->n && a->ch[a->cur].used + bytes > a->ch[a->cur].cap) a->cur++;
    if (a->cur < a->n) {
        void *p = a->ch[a->cur].p + a->ch[a->cur].used;
        a->ch[a->cur].used += bytes;
        return p;
    }
    if (a->n == (int)(sizeof a->ch / sizeof a->ch[0])) {
        fail(c, "the activation arena has too many chunks");
        return NULL;
    }
    g_touch(c, "a new activation chunk");
    size_t cap = a->n ? 2 * a->ch[a->n - 1].cap : (size_t)64 << 20;
    if (cap < bytes) cap = bytes;
    char *q = NULL;
    if (cudaMalloc((void **)&q, cap) != cudaSuccess) {
        fail(c, "cudaMalloc of %zu MB of activations failed (device memory full?)", cap >> 20);
        return NULL;
    }
    a->ch[a->n].p = q;
    a->ch[a->n].cap = cap;
    a->ch[a->n].used = bytes;
    a->cur = a->n++;
    return q;
}

static void lane_join(cuda_be *c);

/* the rings dv_upload retired, once nothing reads them (the stream idle) */
static void up_free_old(cuda_be *c)
{
    for (int k = 0; k < c->up_nold; k++) cudaFreeHost(c->up_old[k]);
    c->up_nold = 0;
}

static void dv_reset(be_backend *be)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    lane_join(c);
    if (!c->failed) {
        g_touch(c, "reset");
        DV_CU(cudaSetDevice(c->device));
        DV_CU(cudaStreamSynchronize(c->st)); /* the ring and the arena are free again */
        if (c->have_dn) DV_CU(cudaStreamSynchronize(c->dn_st)); /* no copy left reading the arena */
        for (int k = 0; k < BE_DOWN_SLOTS; k++) c->dslot[k].pending = 0;
        c->up_used = 0;
        up_free_old(c);
        ar_clear(&c->ar);
        ar_clear(&c->ark);
    }
    pthread_mutex_unlock(&c->lock);
}

static void *dv_alloc_in(be_backend *be, size_t bytes, int keep)
{
    cuda_be *c = get(be);
    void *p = NULL;
    bytes = up256(bytes ? bytes : 1);
    pthread_mutex_lock(&c->lock);
    if (keep) g_touch(c, "alloc_keep"); /* a recording could not move the keep arena as the region did */
    if (!c->failed) p = ar_alloc(c, keep ? &c->ark : &c->ar, bytes);
    pthread_mutex_unlock(&c->lock);
    return p;
}

static void *dv_alloc(be_backend *be, size_t bytes) { return dv_alloc_in(be, bytes, 0); }
static void *dv_alloc_keep(be_backend *be, size_t bytes) { return dv_alloc_in(be, bytes, 1); }

/* the arena's position: its chunk in the top 16 bits, the bytes used there below */
static size_t dv_mark(be_backend *be)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    const size_t m = c->ar.n ? ((size_t)c->ar.cur << 48) | c->ar.ch[c->ar.cur].used : 0;
    pthread_mutex_unlock(&c->lock);
    return m;
}

/* back to mark m: the memory allocated since is reused by later allocs, whose ops run after the ops already on the
 * stream (lane 0, which every lane has joined by then: the graph releases outside its regions), so nothing is
 * overwritten before it is read */
static void dv_release(be_backend *be, size_t m)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    const int cur = (int)(m >> 48);
    if (cur < c->ar.n) {
        c->ar.ch[cur].used = m & (((size_t)1 << 48) - 1);
        for (int i = cur + 1; i < c->ar.n; i++) c->ar.ch[i].used = 0;
        c->ar.cur = cur;
    }
    pthread_mutex_unlock(&c->lock);
}

static void dv_upload(be_backend *be, void *dst, const void *src, size_t bytes)
{
    if (!bytes) return;
    DV_ENTER(BCU_PROF_XFER);
    lane_join(c); /* the pinned ring's copies are on lane 0 (its wrap waits for lane 0) */
    g_touch(c, "an upload");
    const size_t need = up256(bytes);
    if (c->up_used + need > c->up_cap) {
        /* The forward's uploads outgrew the ring (at batch 256 a CSA layer's compressor state is ~15 MB, every
         * 4th step).  Reusing it means waiting for the stream, which stalls the host (whose launches run ahead of
         * the GPU) behind everything queued; and grow() also voided every recorded region (it bumps g_gen, which
         * the ring does not need: an upload keeps its region from being recorded), so they were recorded again.
         * So a ring twice the size of what this forward has uploaded so far, the old one retired (its copies may
         * still read it) and freed at the next reset, after its wait; a steady workload stops growing after a
         * step or two.  Only where that fails, the wait. */
        size_t nc = c->up_cap ? 2 * c->up_cap : (size_t)1 << 20;
        while (nc < 2 * (c->up_used + need)) nc *= 2;
        char *nb = NULL;
        if (c->up_nold < (int)(sizeof c->up_old / sizeof c->up_old[0]) &&
            cudaMallocHost((void **)&nb, nc) == cudaSuccess) {
            if (c->up) c->up_old[c->up_nold++] = c->up;
            c->up = nb;
            c->up_cap = nc;
            c->up_grows++;
        } else {
            (void)cudaGetLastError();
            c->up_waits++;
            if (need > c->up_cap) {
                size_t gc = c->up_cap ? c->up_cap : (size_t)1 << 20;
                while (gc < need) gc *= 2;
                grow(c, &c->up, &c->up_cap, gc, 1); /* waits for the stream */
            } else {
                DV_CU(cudaStreamSynchronize(c->st));
            }
        }
        c->up_used = 0;
    }
    if (!c->failed) {
        char *h = c->up + c->up_used;
        memcpy(h, src, bytes);
        c->up_used += need;
        DV_CU(cudaMemcpyAsync(dst, h, bytes, cudaMemcpyHostToDevice, c->st));
    }
    DV_LEAVE;
}

/* the device graph's attention ran since the last wait: read its error flags now (the stream is idle) */
static void attn_flags_check(cuda_be *c)
{
    if (c->failed || !c->aws_pending) return;
    c->aws_pending = 0;
    int fl = bcu_attn_workspace_flags(&c->aws, 1, c->st);
    if (fl < 0) fail(c, "reading the attention error flags failed");
    else if (fl) fail(c, "attention kernels flagged bad input (flags %d)", fl);
}

/* the attention error flags into flag_h behind the ops issued so far, so that one wait brings them with a download's
 * bytes (flags_read after it): 1, or 0 where nothing is pending or there is no pinned word (attn_flags_check reads
 * them then, with a wait of its own) */
static int flags_enqueue(cuda_be *c)
{
    if (c->failed || !c->aws_pending) return 0;
    if (!c->flag_h && cudaMallocHost((void **)&c->flag_h, 256) != cudaSuccess) {
        c->flag_h = NULL;
        cudaGetLastError();
        return 0;
    }
    DV_CU(cudaMemcpyAsync(c->flag_h, c->aws.mem, sizeof(int), cudaMemcpyDeviceToHost, c->st));
    return !c->failed;
}

/* after the wait: what flags_enqueue brought (attn_flags_check's verdict, without its round trip) */
static void flags_read(cuda_be *c)
{
    c->aws_pending = 0;
    const int fl = *c->flag_h;
    if (!c->failed && fl) {
        cudaMemsetAsync(c->aws.mem, 0, 256, c->st);
        fail(c, "attention kernels flagged bad input (flags %d)", fl);
    }
}

static int dv_download(be_backend *be, void *dst, const void *src, size_t bytes)
{
    DV_ENTER(BCU_PROF_XFER);
    lane_join(c); /* a download waits for everything */
    g_touch(c, "a download");
    /* through pinned memory: a pageable copy of 100+ MB runs at a fraction of the link's speed, and a small one
     * returns only when it has landed, so that the flags' copy behind it would be a second round trip */
    const int pin = !grow(c, &c->down, &c->down_cap, bytes ? bytes : 1, 1);
    if (bytes && !c->failed) DV_CU(cudaMemcpyAsync(pin ? c->down : dst, src, bytes, cudaMemcpyDeviceToHost, c->st));
    const int fq = flags_enqueue(c);
    DV_CU(cudaStreamSynchronize(c->st));
    if (pin && bytes && !c->failed) memcpy(dst, c->down, bytes);
    if (fq) flags_read(c);
    else attn_flags_check(c);
    DV_LEAVE;
    return c->failed ? -1 : 0;
}

static const void *dv_view(be_backend *be, const void *src, size_t bytes)
{
    DV_ENTER(BCU_PROF_XFER);
    lane_join(c);
    g_touch(c, "a download");
    if (!grow(c, &c->down, &c->down_cap, bytes ? bytes : 1, 1) && bytes)
        DV_CU(cudaMemcpyAsync(c->down, src, bytes, cudaMemcpyDeviceToHost, c->st));
    const int fq = flags_enqueue(c);
    DV_CU(cudaStreamSynchronize(c->st));
    if (fq) flags_read(c);
    else attn_flags_check(c);
    DV_LEAVE;
    return c->failed ? NULL : c->down;
}

/* Larger copies take the synchronous download: a pinned buffer a slot of such size is not worth keeping */
#define DOWN_SLOT_MAX ((size_t)64 << 20)

static int dv_down_start(be_backend *be, int k, const void *src, size_t bytes)
{
    int rc = -1;
    DV_ENTER(BCU_PROF_XFER);
    if (k >= 0 && k < BE_DOWN_SLOTS && bytes && bytes <= DOWN_SLOT_MAX && !c->g_cur) {
        dslot_t *s = &c->dslot[k];
        lane_join(c);
        if (!c->have_dn) {
            DV_CU(cudaStreamCreateWithFlags(&c->dn_st, cudaStreamNonBlocking));
            if (!c->failed) DV_CU(cudaEventCreateWithFlags(&c->dn_fork, cudaEventDisableTiming));
            c->have_dn = !c->failed;
        }
        if (!c->failed && !s->have_ev) {
            DV_CU(cudaEventCreateWithFlags(&s->ev, cudaEventDisableTiming));
            s->have_ev = !c->failed;
        }
        if (!c->failed && s->cap < bytes) {
            if (s->h) { /* its last copy may still be landing */
                DV_CU(cudaEventSynchronize(s->ev));
                cudaFreeHost(s->h);
                s->h = NULL;
                s->cap = 0;
            }
            const size_t nc = up256(bytes) < 4096 ? 4096 : up256(bytes);
            DV_CU(cudaMallocHost((void **)&s->h, nc));
            if (!c->failed) s->cap = nc;
        }
        if (!c->failed) {
            DV_CU(cudaEventRecord(c->dn_fork, c->st));
            DV_CU(cudaStreamWaitEvent(c->dn_st, c->dn_fork, 0));
            DV_CU(cudaMemcpyAsync(s->h, src, bytes, cudaMemcpyDeviceToHost, c->dn_st));
            DV_CU(cudaEventRecord(s->ev, c->dn_st));
            s->pending = !c->failed;
            rc = c->failed ? -1 : 0;
        }
    }
    DV_LEAVE;
    return rc;
}

static const void *dv_down_take(be_backend *be, int k)
{
    const void *p = NULL;
    DV_ENTER(BCU_PROF_XFER);
    if (k >= 0 && k < BE_DOWN_SLOTS && c->dslot[k].pending) {
        dslot_t *s = &c->dslot[k];
        s->pending = 0;
        DV_CU(cudaEventSynchronize(s->ev));
        if (!c->failed) p = s->h;
    }
    DV_LEAVE;
    return p;
}

static int dv_failed(be_backend *be) { return get(be)->failed; }

static void dv_zero(be_backend *be, void *p, size_t bytes)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(cudaMemsetAsync(p, 0, bytes, c->st));
    DV_LEAVE;
}

static void dv_copy(be_backend *be, void *dst, const void *src, size_t bytes)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->st));
    DV_LEAVE;
}

static int linear_dev_locked(cuda_be *c, float *y, const float *x, size_t T, const be_weight *w)
{
    const wentry *e = weight(c, w);
    if (!e || scratch(c, core_tmp_bytes(c, w, T, w->rows, w->cols) + 256)) return -1;
    return core(c, e, w, y, x, T, 0, w->rows, 0, w->cols, c->scratch);
}

static void dv_linear(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    DV_ENTER(w->fmt == BE_W_FP8 ? BCU_PROF_LINEAR_FP8 : w->fmt == BE_W_FP4 ? BCU_PROF_LINEAR_FP4 : BCU_PROF_LINEAR_BF16);
    if (T) linear_dev_locked(c, y, x, T, w);
    DV_LEAVE;
}

/* the same product, for x that holds act_quant'd rows: every value an e4m3 code times a power of two, which one
 * bf16 plane holds exactly, so the three-plane split would add two planes of zeros (a third of the GEMM work each)
 * and the one-plane GEMM gives the same values (not necessarily the same bits: cuBLAS may pick another kernel for
 * a third of the columns) */
static void dv_linear_x8(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    DV_ENTER(w->fmt == BE_W_FP8 ? BCU_PROF_LINEAR_FP8 : w->fmt == BE_W_FP4 ? BCU_PROF_LINEAR_FP4 : BCU_PROF_LINEAR_BF16);
    c->x_fp8 = c->x8_kernel;
    if (T) linear_dev_locked(c, y, x, T, w);
    c->x_fp8 = 0;
    DV_LEAVE;
}

/* linear of act_quant(x): on FP8 weights at decode sizes the decode row-dot quantises x as it stages it
 * (bcu_rowdot_args.xq = 2: no copy, no fq launch; the product of linear_x8 on fq_fp8(x)); else a quantised copy in
 * the scratch and linear_x8's path.  DEEPINFER_CUDA_AQ=0: always the copy. */
static void dv_linear_aq(be_backend *be, float *y, const float *x, size_t T, const be_weight *w)
{
    DV_ENTER(w->fmt == BE_W_FP8 ? BCU_PROF_LINEAR_FP8 : w->fmt == BE_W_FP4 ? BCU_PROF_LINEAR_FP4 : BCU_PROF_LINEAR_BF16);
    const wentry *e = T ? weight(c, w) : NULL;
    int done = !T;
    if (e && c->aq_fuse && c->x8_kernel && c->xq_dec && w->fmt == BE_W_FP8 && !dequant_gemm(c, w, T, 0, w->cols) &&
        !ft_ok(c, w, T, x)) {
        bcu_rowdot_args a = bcu_rowdot_for(w, e->d, e->ds, 0, w->rows, 0, x, (int64_t)T, y);
        a.xq = 2;
        if (bcu_rowdot_aq_ok(&a)) {
            const cudaError_t r = bcu_rowdot(&a, c->st);
            if (r == cudaSuccess) done = 1;
            else if (r == cudaErrorNotSupported) (void)cudaGetLastError();
            else DV_CU(r);
        }
    }
    if (e && !done && !c->failed && fp8_gemm_ok(c, w, T, 0, 0, w->cols)) {
        /* prefill sizes on the FP8 tensor cores: the code kernel act_quants x itself (no copy, no fq) */
        if (!scratch(c, core_tmp_bytes(c, w, T, w->rows, w->cols) + 256))
            done = fp8_try(c, e, w, y, x, T, 0, w->rows, w->cols, c->scratch) <= 0;
    }
    if (e && !done && !c->failed && ft_ok(c, w, T, x)) {
        /* decode batches on the FP8 tiles: x act_quant'd into f16 codes, the weight's codes straight into wgmma
         * (after the FP8 tensor cores, which only the bf16 maths takes by default, at the dequantised GEMM's sizes;
         * below those, ahead of the decode row-dot) */
        if (!scratch(c, bcu_ft_scratch((int64_t)T, w->cols) + 256)) {
            const cudaError_t r = bcu_ft_linear(y, w->rows, x, (int64_t)T, w->cols, (const uint8_t *)e->d,
                                                (const uint8_t *)e->ds, w->rows, c->scratch, c->st);
            if (r == cudaSuccess) {
                c->ft_calls++;
                done = 1;
            } else if (r == cudaErrorNotSupported || r == cudaErrorInvalidValue) {
                (void)cudaGetLastError();
            } else {
                DV_CU(r);
            }
        }
    }
    if (e && !done && !c->failed && c->aq_bf16 && c->x8_kernel && w->cols % 128 == 0 && !((uintptr_t)x & 15u) &&
        dequant_gemm(c, w, T, 0, w->cols)) {
        /* the same bits as the copy + bcu_fq_fp8 + core() below (one bf16 plane of the act_quant'd x) in one pass
         * over x: the weight dequantised, x act_quant'd into its plane, one GEMM */
        const int64_t K = w->cols, n = w->rows;
        const size_t wbb = up256((size_t)n * (size_t)K * 2);
        if (T <= 0x7fffffff && !scratch(c, wbb + up256(T * (size_t)K * 2) + 256)) {
            uint16_t *wb = (uint16_t *)c->scratch, *xb = (uint16_t *)(c->scratch + wbb);
            const float one = 1.0f, zero = 0.0f;
            DV_CU(bcu_dequant_bf16(wb, w->fmt == BE_W_FP8 ? BCU_RW_FP8 : BCU_RW_FP4, e->d, e->ds, BCU_SC_E8M0, w->rows,
                                   w->cols, w->block, 0, n, c->st));
            DV_CU(bcu_aq_bf16(xb, x, T, (size_t)K, (size_t)K, c->st));
            const cublasStatus_t b = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T, (int)K, &one, wb,
                                                  CUDA_R_16BF, (int)K, xb, CUDA_R_16BF, (int)K, &zero, y, CUDA_R_32F,
                                                  (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (b != CUBLAS_STATUS_SUCCESS) fail(c, "cublasGemmEx (act_quant'd bf16 plane): status %d", (int)b);
            c->aq_bf16_calls++;
            done = 1;
        }
    }
    if (e && !done && !c->failed) {
        const size_t K = (size_t)w->cols, qb = up256(T * K * 4);
        if (!scratch(c, qb + core_tmp_bytes(c, w, T, w->rows, w->cols) + 256)) {
            float *q = (float *)c->scratch;
            DV_CU(cudaMemcpyAsync(q, x, T * K * 4, cudaMemcpyDeviceToDevice, c->st));
            DV_CU(bcu_fq_fp8(q, T, K, K, 128, c->st));
            c->x_fp8 = c->x8_kernel;
            core(c, e, w, y, q, T, 0, w->rows, 0, w->cols, c->scratch + qb);
            c->x_fp8 = 0;
        }
    }
    DV_LEAVE;
}

static void dv_linear_grouped(be_backend *be, float *y, const float *x, size_t T, const be_weight *w, int groups)
{
    DV_ENTER(BCU_PROF_ROWS);
    grouped_locked(c, y, x, T, w, groups, 1);
    DV_LEAVE;
}

static void dv_rmsnorm(be_backend *be, float *y, const float *x, size_t rows, size_t dim, const float *w, float eps)
{
    DV_ENTER(BCU_PROF_RMSNORM);
    const float *dw = NULL;
    if (rows && dim && (!w || (dw = norm_weight(c, w, dim)))) DV_CU(bcu_rmsnorm(y, x, rows, dim, dw, eps, c->st));
    DV_LEAVE;
}

static void dv_embed(be_backend *be, float *X, const int32_t *ids, size_t R, const be_weight *e, int ns)
{
    DV_ENTER(BCU_PROF_GRAPH);
    const wentry *we = weight(c, e);
    if (we && e->fmt == BE_W_DENSE) {
        const int emb = we->f32 ? BCU_EMB_F32 : e->dtype == MD_BF16 ? BCU_EMB_BF16 : BCU_EMB_F16;
        DV_CU(bcu_embed(X, we->d, emb, ids, R, (int)e->cols, ns, c->st));
    } else if (we) {
        fail(c, "the embedding must be a dense matrix");
    }
    DV_LEAVE;
}

/* an mHC site's parameters on the device; rows = mixes and 3 scales (hc_pre), or n and 1 (hc_head) */
static int hc_site(cuda_be *c, const be_hc *h, int rows, int nscale, bcu_hc_site *s)
{
    s->n = h->n;
    s->D = h->D;
    s->iters = h->iters;
    s->hc_eps = h->hc_eps;
    s->rms_eps = h->rms_eps;
    s->mixes_in_ws = 0;
    s->fn = norm_weight(c, h->fn, (size_t)rows * h->n * h->D);
    s->base = norm_weight(c, h->base, (size_t)rows);
    s->scale = norm_weight(c, h->scale, (size_t)nscale);
    return s->fn && s->base && s->scale ? 0 : -1;
}

static void dv_hc_pre(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll, float *post, float *comb)
{
    DV_ENTER(BCU_PROF_GRAPH);
    bcu_hc_site s;
    const size_t wb = bcu_hc_ws_bytes(R, h->n);
    const int mix = (2 + h->n) * h->n, N = h->n * h->D;
    if (!hc_site(c, h, mix, 3, &s) && !scratch(c, wb)) {
        if (R >= c->hc_gemm_R && R <= 0x7fffffff) {
            /* many rows: the (2+n)n dot products of every row as one fp32 GEMM (no TF32) instead of a block each,
             * which would read the site's weights once per row */
            const float one = 1.0f, zero = 0.0f;
            const cublasStatus_t bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, mix, (int)R, N, &one, s.fn, N, X,
                                                  N, &zero, bcu_hc_ws_mixes(c->scratch, R), mix);
            if (bs != CUBLAS_STATUS_SUCCESS) fail(c, "mHC mixes GEMM: %s", cublasGetStatusString(bs));
            s.mixes_in_ws = 1;
        }
        if (!c->failed) DV_CU(bcu_hc_pre(&s, X, R, coll, post, comb, c->scratch, wb, c->st));
    }
    DV_LEAVE;
}

static void dv_hc_head(be_backend *be, const be_hc *h, const float *X, size_t R, float *coll)
{
    DV_ENTER(BCU_PROF_GRAPH);
    bcu_hc_site s;
    const size_t wb = bcu_hc_ws_bytes(R, h->n);
    if (!hc_site(c, h, h->n, 1, &s) && !scratch(c, wb)) DV_CU(bcu_hc_head(&s, X, R, coll, c->scratch, wb, c->st));
    DV_LEAVE;
}

/* hc_pre or hc_head, then the norm (and act_quant's copy): one kernel for them after the dot products where the rows
 * are few (no GEMM for them) and fit it; else declined (v4.c issues the ops) */
static int dv_hc_pre_norm(be_backend *be, const be_hc *h, int head, const float *X, size_t R, float *coll, float *post,
                          float *comb, const float *w, float eps, float *xq)
{
    int declined = 1;
    DV_ENTER(BCU_PROF_GRAPH);
    bcu_hc_site s;
    const size_t wb = bcu_hc_ws_bytes(R, h->n);
    const int mix = head ? h->n : (2 + h->n) * h->n;
    const float *dw = NULL;
    if (c->fuse && R && R < c->hc_gemm_R && bcu_hc_pre_norm_fits(h->n, h->D, R)) {
        declined = 0;
        if (!hc_site(c, h, mix, head ? 1 : 3, &s) && !scratch(c, wb) && (!w || (dw = norm_weight(c, w, h->D))))
            DV_CU(bcu_hc_pre_norm(&s, head, X, R, coll, post, comb, dw, eps, xq, c->scratch, wb, c->st));
    }
    DV_LEAVE;
    return declined;
}

static void dv_hc_post(be_backend *be, float *X, const float *f, const float *post, const float *comb, int n, int D,
                       size_t R)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_hc_post(X, f, post, comb, n, D, R, c->st));
    DV_LEAVE;
}

/* hc_post of f + f2: the add inside its kernel (DEEPINFER_CUDA_FUSE=0: declined) */
static int dv_hc_post_add(be_backend *be, float *X, const float *f, const float *f2, const float *post,
                          const float *comb, int n, int D, size_t R)
{
    int declined = 1;
    DV_ENTER(BCU_PROF_GRAPH);
    if (c->fuse) {
        declined = 0;
        DV_CU(bcu_hc_post_add(X, f, f2, post, comb, n, D, R, c->st));
    }
    DV_LEAVE;
    return declined;
}

static void dv_rope(be_backend *be, float *x, size_t rows, size_t stride, size_t off, int rd, const float *inv,
                    const int64_t *pos, int per)
{
    DV_ENTER(BCU_PROF_GRAPH);
    const float *di = norm_weight(c, inv, (size_t)(rd / 2 > 0 ? rd / 2 : 1));
    if (di) DV_CU(bcu_rope(x, rows, stride, off, rd, di, pos, per, 0, c->st));
    DV_LEAVE;
}

/* rmsnorm then rope, in one kernel where the rows fit it; else declined */
static int dv_norm_rope(be_backend *be, float *x, size_t rows, size_t dim, const float *w, float eps, int rd,
                        const float *inv, const int64_t *pos, int per)
{
    int declined = 1;
    DV_ENTER(BCU_PROF_GRAPH);
    if (c->fuse && bcu_norm_rope_fits(dim, rd) && per > 0) {
        declined = 0;
        const float *dw = NULL, *di = NULL;
        if (rows && (!w || (dw = norm_weight(c, w, dim))) &&
            (!rd || (di = norm_weight(c, inv, (size_t)(rd / 2 > 0 ? rd / 2 : 1)))))
            DV_CU(bcu_norm_rope(x, rows, dim, dw, eps, rd, di, pos, per, c->st));
    }
    DV_LEAVE;
    return declined;
}

static_assert(sizeof(be_comp_slot) == sizeof(bcu_comp_slot) && offsetof(be_comp_slot, g) == offsetof(bcu_comp_slot, g) &&
                  offsetof(be_comp_slot, ape) == offsetof(bcu_comp_slot, ape),
              "be_comp_slot and bcu_comp_slot share a layout");

static void dv_comp_pool(be_backend *be, float *out, size_t n, int ns, int hd, const be_comp_slot *slots,
                         const float *ape, size_t ape_n)
{
    DV_ENTER(BCU_PROF_GRAPH);
    const float *da = ape && ape_n ? norm_weight(c, ape, ape_n) : NULL;
    if (!ape || !ape_n || da) DV_CU(bcu_comp_pool(out, n, ns, hd, (const bcu_comp_slot *)slots, da, c->st));
    DV_LEAVE;
}

static void dv_fq(be_backend *be, float *x, size_t rows, size_t stride, size_t n, int block, int fp4)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(fp4 ? bcu_fq_fp4(x, rows, stride, n, block, c->st) : bcu_fq_fp8(x, rows, stride, n, block, c->st));
    DV_LEAVE;
}

static void dv_hadamard(be_backend *be, float *x, size_t rows, size_t n)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_hadamard(x, rows, n, c->st));
    DV_LEAVE;
}

static void dv_swiglu(be_backend *be, float *g, const float *up, size_t rows, int I, float limit, const float *rw)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_swiglu(g, up, rows, I, limit, rw, c->st));
    DV_LEAVE;
}

static void dv_scale(be_backend *be, float *x, size_t n, float sc)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_scale(x, n, sc, c->st));
    DV_LEAVE;
}

static void dv_add(be_backend *be, float *y, const float *x, size_t n)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_add(y, x, n, c->st));
    DV_LEAVE;
}

static void dv_argmax(be_backend *be, int32_t *ids, const float *x, size_t rows, size_t V)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_argmax(ids, x, rows, V, c->st));
    DV_LEAVE;
}

static void dv_route(be_backend *be, const be_route *r, const float *logits, const int32_t *ids, size_t R,
                     int32_t *idx, float *wt)
{
    DV_ENTER(BCU_PROF_GRAPH);
    bcu_route_args a = {r->E, r->K, r->score_func, r->official, r->route_scale, NULL, NULL, ids};
    int ok = 1;
    if (r->bias) ok = (a.bias = norm_weight(c, r->bias, (size_t)r->E)) != NULL;
    /* the hash table travels like a parameter vector: 4-byte elements, cached by its host address */
    if (ok && r->tid2eid)
        ok = (a.tid2eid = (const int32_t *)norm_weight(c, (const float *)r->tid2eid, (size_t)r->vocab * r->K)) != NULL;
    if (ok) DV_CU(bcu_route(&a, logits, R, idx, wt, c->st));
    DV_LEAVE;
}

static void dv_gather(be_backend *be, float *dst, const float *src, const int32_t *rows, size_t n, size_t width)
{
    DV_ENTER(BCU_PROF_GRAPH);
    DV_CU(bcu_gather_rows(dst, src, rows, n, width, c->st));
    DV_LEAVE;
}

__global__ void scatter_add_kernel(float *y, const float *src, const int32_t *rows, const float *rw, size_t width)
{
    pdl_enter();
    const size_t r = blockIdx.x;
    const float f = rw ? rw[r] : 1.0f;
    float *yr = y + (size_t)rows[r] * width;
    const float *sr = src + r * width;
    for (size_t i = threadIdx.x; i < width; i += blockDim.x) yr[i] += rw ? sr[i] * f : sr[i];
}

static void dv_scatter_add(be_backend *be, float *y, const float *src, const int32_t *rows, const float *rw, size_t n,
                           size_t width)
{
    DV_ENTER(BCU_PROF_GRAPH);
    if (n > 0x7fffffff) fail(c, "scatter_add of %zu rows", n);
    else if (n) {
        pdl_launch(scatter_add_kernel, (unsigned)n, 256, 0, c->st, y, src, rows, rw, width);
        DV_CU(cudaGetLastError());
    }
    DV_LEAVE;
}

static int dv_moe(be_backend *be, float *y, const float *x, size_t T, const int32_t *ids, const float *w, int topk,
                  const be_weight *w1, const be_weight *w3, const be_weight *w2, int n_experts, float swiglu_limit,
                  int flags)
{
    int rc = -1;
    /* a prefill-sized batch gives each expert enough rows for cuBLAS: decline, and the graph runs the experts one
     * by one through dequantise + cuBLAS (core()); the grouped kernel keeps decode.  With x and h act_quant'd the
     * grouped kernel takes one bf16 plane (moe_locked) and stays ahead longer: 4x the threshold (the V4-Flash
     * slice, official semantics, H200: prefill 4096 tokens 119 ms grouped vs 171 ms by the loop; 16384 tokens 560
     * vs 519 ms; docs/BENCHMARKS.md), and where the wgmma tiles run (sm_90a) it keeps every size */
    const cuda_be *cb = get(be);
    const int one_plane = cb->x8_kernel && (flags & BE_MOE_ACT_FP8_X) && (flags & BE_MOE_ACT_FP8_H);
    if (T >= cb->moe_loop_T * (one_plane ? 4 : 1) && cb->math != BCU_MATH_FP32 &&
        !(one_plane && w1[0].cols % 256 == 0 && wg_ok(cb, w1[0].cols, w1[0].rows)))
        return 1;
    DV_ENTER(BCU_PROF_MOE);
    rc = T ? moe_locked(c, y, x, T, ids, w, topk, w1, w3, w2, n_experts, swiglu_limit, flags, 1) : 0;
    DV_LEAVE;
    return rc;
}

static int dv_attention(be_backend *be, const be_attn_seq *seqs, int nseq, int ntok, const be_attn_args *a)
{
    int rc = -1;
    DV_ENTER(BCU_PROF_ATTENTION);
    lane_join(c); /* its staging and workspace are lane 0's */
    g_touch(c, "the attention op");
    rc = ntok < 1 ? 0 : attn_locked(c, seqs, nseq, ntok, a, 1);
    DV_LEAVE;
    return rc;
}

/* ---- regions of the device graph as CUDA graphs (be_dev_ops.graph_begin / graph_end)
 *
 * A region (v4.c: a layer's projections, its output projection, its FFN half) is launches and allocs only.
 * Keyed by the graph's tag and the arena's position (so its allocs land where they did), it runs eagerly until one
 * run made no host-synchronous call (g_touch: first uses upload weights, a new arena chunk, a download in the
 * experts' fallback); the next run is captured (its launches recorded, not run), instantiated and launched; later
 * runs launch the recording and move the arenas to where the region's allocs left them.  A reallocation of
 * anything a recording may point into (the scratch, a weight, the expert tables) voids every recording (g_gen). */

/* ---- lanes (be_dev_ops.lane / join) */

/* a cuBLAS handle's stream, math mode (fp32: no TF32, no reduced-precision reductions) and workspace, ours (32 MiB,
 * its Hopper size: a region being captured must not make cuBLAS allocate one); *ws NULL on a failed cudaMalloc */
static cublasStatus_t blas_setup(cublasHandle_t h, cudaStream_t st, bcu_math math, void **ws)
{
    cublasStatus_t bs;
    if ((bs = cublasSetStream(h, st)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetMathMode(h, math == BCU_MATH_FP32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH)) !=
            CUBLAS_STATUS_SUCCESS)
        return bs;
    if (cudaMalloc(ws, (size_t)32 << 20) != cudaSuccess) {
        *ws = NULL;
        return CUBLAS_STATUS_ALLOC_FAILED;
    }
    return cublasSetWorkspace(h, *ws, (size_t)32 << 20);
}

/* lane k's stream, handle and workspace, made at its first use */
static int lane_make(cuda_be *c, lane_t *L)
{
    if (L->made) return 0;
    g_touch(c, "making a lane");
    if (!c->have_fork_ev) {
        CU(cudaEventCreateWithFlags(&c->fork_ev, cudaEventDisableTiming));
        c->have_fork_ev = 1;
    }
    CU(cudaStreamCreateWithFlags(&L->st, cudaStreamNonBlocking));
    L->made = 1; /* teardown frees what exists from here on */
    CU(cudaEventCreateWithFlags(&L->ev, cudaEventDisableTiming));
    if (cublasCreate(&L->blas) != CUBLAS_STATUS_SUCCESS) {
        L->blas = NULL;
        return fail(c, "cublasCreate for a lane failed");
    }
    const cublasStatus_t bs = blas_setup(L->blas, L->st, c->math, &L->blas_ws);
    if (bs != CUBLAS_STATUS_SUCCESS) return fail(c, "cuBLAS setup for a lane failed: %s", cublasGetStatusString(bs));
    return 0;
}

/* what a lane owns, in cuda_be's fields while it is the active one */
#define LANE_FIELDS(X) X(st) X(blas) X(blas_ws) X(scratch) X(scratch_cap) X(f8)
#define LANE_SAVE(f) o->f = c->f;
#define LANE_LOAD(f) c->f = n->f;

/* the active lane's resources into lanes[c->lane], lane k's out */
static void lane_swap(cuda_be *c, int k)
{
    lane_t *o = &c->lanes[c->lane];
    const lane_t *n = &c->lanes[k];
    LANE_FIELDS(LANE_SAVE)
    LANE_FIELDS(LANE_LOAD)
    c->lane = k;
}

/* back to lane 0, which waits for every lane used since the last join */
static void lane_join(cuda_be *c)
{
    if (c->lane) lane_swap(c, 0);
    for (int k = 1; k < NLANE; k++) {
        lane_t *L = &c->lanes[k];
        if (!L->used) continue;
        L->used = 0;
        if (c->failed) continue;
        DV_CU(cudaEventRecord(L->ev, L->st));
        DV_CU(cudaStreamWaitEvent(c->st, L->ev, 0));
    }
}

/* the ops after this run on lane k (0: the main one), which first waits for everything issued on lane 0 so far */
static void dv_lane(be_backend *be, int k)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    if (c->lanes_on && !c->prof_on && !c->failed && k >= 0 && k < NLANE && k != c->lane) {
        if (k && !lane_make(c, &c->lanes[k])) {
            cudaStream_t main_st = c->lane ? c->lanes[0].st : c->st;
            DV_CU(cudaEventRecord(c->fork_ev, main_st));
            DV_CU(cudaStreamWaitEvent(c->lanes[k].st, c->fork_ev, 0));
            c->lanes[k].used = 1;
        }
        if (!c->failed) lane_swap(c, k);
    }
    pthread_mutex_unlock(&c->lock);
}

static void dv_join(be_backend *be)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    lane_join(c);
    pthread_mutex_unlock(&c->lock);
}

static void gr_drop(gregion *e)
{
    if (e->exec) cudaGraphExecDestroy(e->exec);
    memset(e, 0, sizeof *e);
}

/* fnv-1a over the words */
static uint64_t gr_mix(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

static uint64_t ar_key(uint64_t h, const arena_t *a)
{
    h = gr_mix(h, (uint64_t)a->cur);
    if (a->cur < a->n) h = gr_mix(gr_mix(h, (uint64_t)(uintptr_t)a->ch[a->cur].p), a->ch[a->cur].used);
    return h;
}

static void ar_save(const arena_t *a, int from, int *to, size_t *used)
{
    *to = a->cur;
    for (int i = from; i <= a->cur && i < a->n; i++) used[i] = a->ch[i].used;
}

static void ar_restore(arena_t *a, int from, int to, const size_t *used)
{
    for (int i = from; i <= to && i < a->n; i++) a->ch[i].used = used[i];
    a->cur = to;
}

static int dv_graph_begin(be_backend *be, uint64_t tag)
{
    cuda_be *c = get(be);
    int replayed = 0;
    pthread_mutex_lock(&c->lock);
    if (c->graphs && c->gr && !c->prof_on && !c->failed && !c->g_cur) {
        uint64_t key = ar_key(gr_mix(1469598103934665603ull, tag), &c->ar);
        if (!key) key = 1;
        gregion *set = c->gr + (key % GR_SETS) * GR_WAYS, *e = NULL;
        for (int w = 0; w < GR_WAYS && !e; w++)
            if (set[w].key == key) e = &set[w];
        if (e && e->exec && e->gen != c->g_gen) gr_drop(e), e = NULL;
        if (!e) { /* a free way, else the least recently used */
            e = &set[0];
            for (int w = 1; w < GR_WAYS; w++)
                if (set[w].key == 0 ? e->key != 0 : e->key != 0 && set[w].use < e->use) e = &set[w];
            gr_drop(e);
            e->key = key;
            e->a0 = c->ar.cur;
        }
        e->use = ++c->g_clock;
        if (e->exec) {
            DV_CU(cudaGraphLaunch(e->exec, c->st));
            ar_restore(&c->ar, e->a0, e->a1, e->aused);
            c->g_replays++;
            replayed = !c->failed;
        } else {
            c->g_cur = e;
            c->g_dirty = 0;
            if (e->clean) {
                DV_CU(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeRelaxed));
                c->g_capturing = !c->failed;
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    return replayed;
}

static void dv_graph_end(be_backend *be)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    gregion *e = c->g_cur;
    c->g_cur = NULL;
    lane_join(c); /* a capture ends with every lane joined */
    if (e && c->g_capturing) {
        c->g_capturing = 0;
        cudaGraph_t g = NULL;
        cudaError_t r = cudaStreamEndCapture(c->st, &g);
        if (r == cudaSuccess && !c->failed) r = cudaGraphInstantiate(&e->exec, g, 0);
        if (g) cudaGraphDestroy(g);
        if (r != cudaSuccess || c->failed) {
            e->exec = NULL;
            e->clean = 0;
            fail(c, "capturing a region as a CUDA graph: %s (DEEPINFER_CUDA_GRAPHS=0 turns capture off)",
                 cudaGetErrorString(r));
        } else {
            ar_save(&c->ar, e->a0, &e->a1, e->aused);
            e->gen = c->g_gen;
            c->g_captures++;
            DV_CU(cudaGraphLaunch(e->exec, c->st)); /* the captured ops have not run yet */
        }
    } else if (e) {
        e->clean = !c->g_dirty && !c->failed;
        c->g_eager++;
    }
    pthread_mutex_unlock(&c->lock);
}

/* sampled rows drawn on the device (sample.cu); DEEPINFER_CUDA_SAMPLE=0 leaves every draw to the host (all -1) */
static void dv_sample(be_backend *be, int32_t *ids, const float *x, size_t V, const be_draw *d, size_t n)
{
    DV_ENTER(BCU_PROF_GRAPH);
    if (c->dev_sample) DV_CU(bcu_sample(ids, x, V, d, n, c->st));
    else DV_CU(cudaMemsetAsync(ids, 0xff, n * sizeof(int32_t), c->st));
    DV_LEAVE;
}

static const be_dev_ops cuda_dev_ops = {
    /* .reset = */ dv_reset,
    /* .alloc = */ dv_alloc,
    /* .upload = */ dv_upload,
    /* .download = */ dv_download,
    /* .view = */ dv_view,
    /* .failed = */ dv_failed,
    /* .zero = */ dv_zero,
    /* .copy = */ dv_copy,
    /* .linear = */ dv_linear,
    /* .linear_x8 = */ dv_linear_x8,
    /* .linear_grouped = */ dv_linear_grouped,
    /* .rmsnorm = */ dv_rmsnorm,
    /* .embed = */ dv_embed,
    /* .hc_pre = */ dv_hc_pre,
    /* .hc_head = */ dv_hc_head,
    /* .hc_post = */ dv_hc_post,
    /* .rope = */ dv_rope,
    /* .fq = */ dv_fq,
    /* .hadamard = */ dv_hadamard,
    /* .swiglu = */ dv_swiglu,
    /* .scale = */ dv_scale,
    /* .add = */ dv_add,
    /* .argmax = */ dv_argmax,
    /* .route = */ dv_route,
    /* .gather = */ dv_gather,
    /* .scatter_add = */ dv_scatter_add,
    /* .moe = */ dv_moe,
    /* .attention = */ dv_attention,
    /* .comp_pool = */ dv_comp_pool,
    /* .linear_aq = */ dv_linear_aq,
    /* .mark = */ dv_mark,
    /* .release = */ dv_release,
    /* .alloc_keep = */ dv_alloc_keep,
    /* .graph_begin = */ dv_graph_begin,
    /* .graph_end = */ dv_graph_end,
    /* .lane = */ dv_lane,
    /* .join = */ dv_join,
    /* .hc_pre_norm = */ dv_hc_pre_norm,
    /* .norm_rope = */ dv_norm_rope,
    /* .hc_post_add = */ dv_hc_post_add,
    /* .down_start = */ dv_down_start,
    /* .down_take = */ dv_down_take,
    /* .sample = */ dv_sample,
};

extern "C" void be_cuda_destroy(be_backend *be);

/* two tables: the device-resident graph (default), and the per-op host round trips (DEEPINFER_CUDA_GRAPH=host) */
static const be_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .linear = */ cu_linear,
    /* .linear_rows = */ cu_linear_rows,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .destroy = */ be_cuda_destroy,
    /* .moe = */ cu_moe,
    /* .attention = */ cu_attention,
    /* .linear_grouped = */ cu_linear_grouped,
    /* .dev = */ &cuda_dev_ops,
};

static const be_ops cuda_ops_host = {
    /* .name = */ "cuda",
    /* .linear = */ cu_linear,
    /* .linear_rows = */ cu_linear_rows,
    /* .rmsnorm = */ cu_rmsnorm,
    /* .destroy = */ be_cuda_destroy,
    /* .moe = */ cu_moe,
    /* .attention = */ cu_attention,
    /* .linear_grouped = */ cu_linear_grouped,
    /* .dev = */ NULL,
};

static int is_cuda(const be_backend *be) { return be && (be->ops == &cuda_ops || be->ops == &cuda_ops_host); }

/* ---- device-pointer entry point (benchmark; the future device-resident graph) */

extern "C" int bcu_linear_dev(be_backend *be, float *dy, const float *dx, size_t T, const be_weight *w)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    int rc = -1;
    if (!c->failed && cudaSetDevice(c->device) == cudaSuccess) {
        const wentry *e = weight(c, w);
        if (e && !scratch(c, core_tmp_bytes(c, w, T, w->rows, w->cols) + 256))
            rc = core(c, e, w, dy, dx, T, 0, w->rows, 0, w->cols, c->scratch);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- lifecycle */

static void teardown(cuda_be *c)
{
    if (!c) return;
    cudaSetDevice(c->device);
    if (c->lane) lane_swap(c, 0);
    for (int k = 1; k < NLANE; k++) {
        lane_t *L = &c->lanes[k];
        if (!L->made) continue;
        cudaStreamSynchronize(L->st);
        if (L->blas) cublasDestroy(L->blas);
        if (L->blas_ws) cudaFree(L->blas_ws);
        if (L->scratch) cudaFree(L->scratch);
        bcu_fp8lt_destroy(L->f8);
        cudaEventDestroy(L->ev);
        cudaStreamDestroy(L->st);
    }
    if (c->have_fork_ev) cudaEventDestroy(c->fork_ev);
    if (c->have_dn) {
        cudaStreamSynchronize(c->dn_st);
        cudaStreamDestroy(c->dn_st);
        cudaEventDestroy(c->dn_fork);
    }
    for (int k = 0; k < BE_DOWN_SLOTS; k++) {
        if (c->dslot[k].h) cudaFreeHost(c->dslot[k].h);
        if (c->dslot[k].have_ev) cudaEventDestroy(c->dslot[k].ev);
    }
    if (c->gr)
        for (int i = 0; i < GR_SETS * GR_WAYS; i++) gr_drop(&c->gr[i]);
    free(c->gr);
    for (size_t i = 0; i < c->cap; i++)
        if (c->tab[i].key) entry_free(c, &c->tab[i]);
    for (size_t i = 0; i < c->nmt; i++) {
        if (c->mt[i].dev) cudaFree(c->mt[i].dev);
        free(c->mt[i].host);
        free(c->mt[i].src);
    }
    free(c->mt);
    c->mt = NULL;
    c->nmt = 0;
    kv_reset(c);
    win_reset(c);
    ps_reset(c);
    ar_free(&c->ar);
    ar_free(&c->ark);
    if (c->up) cudaFreeHost(c->up);
    up_free_old(c);
    if (c->down) cudaFreeHost(c->down);
    if (c->flag_h) cudaFreeHost(c->flag_h);
    free(c->lz);
    if (c->aws.mem) cudaFree(c->aws.mem);
    for (int k = 0; k < 2; k++) {
        if (c->stage[k]) cudaFreeHost(c->stage[k]);
        if (c->have_stage_ev) cudaEventDestroy(c->stage_ev[k]);
    }
    free(c->tab);
    if (c->scratch) cudaFree(c->scratch);
    if (c->have_cp) {
        cudaStreamSynchronize(c->cp_st);
        cudaStreamDestroy(c->cp_st);
        cudaEventDestroy(c->cp_ev);
    }
    for (int k = 0; k < 2; k++)
        if (c->astg[k]) cudaFree(c->astg[k]);
    if (c->have_blas) cublasDestroy(c->blas);
    if (c->blas_ws) cudaFree(c->blas_ws);
    bcu_fp8lt_destroy(c->f8);
    if (c->have_stream) cudaStreamDestroy(c->st);
    if (c->host) be_destroy(c->host);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* a path whose sums are of the bf16 class (the FP8 tensor cores, bf16 attention): env name "0" off, anything else
 * on, unset: on in the bf16 maths; never in fp32 */
static int bf16_class_path(const char *name, bcu_math math)
{
    const char *v = getenv(name);
    return math != BCU_MATH_FP32 && (v && *v ? strcmp(v, "0") != 0 : math == BCU_MATH_BF16);
}

extern "C" be_backend *bcu_create(int device, int threads, bcu_math math, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        errlen = sizeof dummy;
    }
    int n = 0;
    cudaError_t r = cudaGetDeviceCount(&n);
    if (r != cudaSuccess) {
        snprintf(err, errlen, "no CUDA device: %s (%s)", cudaGetErrorString(r), cudaGetErrorName(r));
        return NULL;
    }
    if (n <= 0) {
        snprintf(err, errlen, "no CUDA device (the driver reports none)");
        return NULL;
    }
    if (device < 0 || device >= n) {
        snprintf(err, errlen, "CUDA device %d does not exist (%d present)", device, n);
        return NULL;
    }
    cuda_be *c = (cuda_be *)calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->device = device;
    c->math = math;
    c->attn_rows = 1024;
    if (getenv("DEEPINFER_CUDA_ATTN_ROWS") && atoi(getenv("DEEPINFER_CUDA_ATTN_ROWS")) > 0)
        c->attn_rows = atoi(getenv("DEEPINFER_CUDA_ATTN_ROWS"));
    if (c->attn_rows > 65535) c->attn_rows = 65535;
    /* 0: always; huge: never.  17: on the H200's V4-Flash slice the transient bf16 copy and one cuBLAS GEMM beat the
     * GEMV's launches of 16 from 17 tokens on (twenty-first session: batch 24 -5%, 32 -9%, 48 -14%, 56 -16%; it was
     * 64, where batch 48 took 7.4 ms against batch 64's 7.1).  Below it a token's result does not depend on the
     * batch, bit for bit (the row-dots); from it, by rounding (cuBLAS) */
    c->deq_T = env_size("DEEPINFER_CUDA_DEQUANT_T", 17);
    c->gemv_T = env_size("DEEPINFER_CUDA_GEMV_T", 8);
    c->x8_kernel = env_size("DEEPINFER_CUDA_X8", 1) != 0;
    c->grouped_one = env_size("DEEPINFER_CUDA_GROUPED", 1) != 0;
    c->rowq8 = env_size("DEEPINFER_CUDA_ROWQ8", 0) != 0;
    c->xq_dec = env_size("DEEPINFER_CUDA_XQ", 1) != 0;
    c->aq_fuse = env_size("DEEPINFER_CUDA_AQ", 1) != 0;
    c->ps_off = getenv("DEEPINFER_CUDA_PART_MB") && *getenv("DEEPINFER_CUDA_PART_MB") &&
                env_size("DEEPINFER_CUDA_PART_MB", 0) == 0;
    c->hc_gemm_R = env_size("DEEPINFER_CUDA_HC_GEMM_R", 128);
    c->fuse = env_size("DEEPINFER_CUDA_FUSE", 1) != 0;
    c->moe_loop_T = env_size("DEEPINFER_CUDA_MOE_LOOP_T", 2048);
    c->moe_mmarows_max = env_size("DEEPINFER_CUDA_MOE_MMAROWS_MAX", BCU_MOE_MMAROWS_MAX);
    c->moe_wg = (int)env_size("DEEPINFER_CUDA_MOE_WG", 1);
    /* 56 under bf16x3: on the H200's V4-Flash slice (twenty-first session) the GEMV beat the f16 wgmma kernel in the
     * whole step at batch 40 (5.84 -> 5.56 ms), 48 (6.39 -> 6.23) and 56 (6.87 -> 6.74), and lost at 64 (7.35 ->
     * 7.52); it was 32 */
    c->moe_gemv_T = env_size("DEEPINFER_CUDA_MOE_GEMV", math == BCU_MATH_BF16 || c->moe_wg == 2 ? 16 : 56);
    c->fp8_gemm = bf16_class_path("DEEPINFER_CUDA_FP8GEMM", math);
    c->f16x2 = env_size("DEEPINFER_CUDA_F16X2", 1) != 0;
    c->aq_bf16 = env_size("DEEPINFER_CUDA_AQ_BF16", 1) != 0;
    c->ft = env_size("DEEPINFER_CUDA_FT", 1) != 0;
    c->ft_min = env_size("DEEPINFER_CUDA_FT_MIN", 9);
    c->dev_sample = env_size("DEEPINFER_CUDA_SAMPLE", 1) != 0;
    c->ft_max = env_size("DEEPINFER_CUDA_FT_MAX", 256);
    c->attn_mma = bf16_class_path("DEEPINFER_CUDA_ATTN_MMA", math);
    c->graphs = env_size("DEEPINFER_CUDA_GRAPHS", 1) != 0;
    c->lanes_on = env_size("DEEPINFER_CUDA_LANES", 1) != 0;
    c->kvpc_on = env_size("DEEPINFER_CUDA_KV_PCACHE", 1) != 0;
    c->kv_slots = env_size("DEEPINFER_CUDA_KV_SLOTS", 0);
    c->ix_exact = math != BCU_MATH_FP32 && env_size("DEEPINFER_CUDA_IX_EXACT", 1) != 0;
    const size_t x3 = env_size("DEEPINFER_CUDA_ATTN_X3", 1);
    c->attn_x3 = math == BCU_MATH_FP32 ? 0 : x3 > 2 ? 2 : (int)x3;
    c->win_ring = env_size("DEEPINFER_CUDA_WIN_RING", 1) != 0;
    c->attn_side = env_size("DEEPINFER_CUDA_ATTN_SIDE", 1) != 0;
    if (c->graphs && !(c->gr = (gregion *)calloc((size_t)GR_SETS * GR_WAYS, sizeof *c->gr))) c->graphs = 0;
    const char *what = "";
    cudaDeviceProp prop;
    cublasStatus_t bs;
    if ((r = cudaSetDevice(device)) != cudaSuccess) { what = "cudaSetDevice"; goto cuda_fail; }
    if ((r = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) { what = "cudaGetDeviceProperties"; goto cuda_fail; }
    snprintf(c->name, sizeof c->name, "%.255s, sm_%d%d, %d SMs, %.1f GiB", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    if ((r = cudaStreamCreateWithFlags(&c->st, cudaStreamNonBlocking)) != cudaSuccess) {
        what = "cudaStreamCreate";
        goto cuda_fail;
    }
    c->have_stream = 1;
    if ((r = cudaEventCreateWithFlags(&c->stage_ev[0], cudaEventDisableTiming)) != cudaSuccess) {
        what = "cudaEventCreate";
        goto cuda_fail;
    }
    if ((r = cudaEventCreateWithFlags(&c->stage_ev[1], cudaEventDisableTiming)) != cudaSuccess) {
        cudaEventDestroy(c->stage_ev[0]);
        what = "cudaEventCreate";
        goto cuda_fail;
    }
    c->have_stage_ev = 1;
    if ((bs = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublasCreate failed: %s", cublasGetStatusString(bs));
        goto fail;
    }
    c->have_blas = 1;
    if ((bs = blas_setup(c->blas, c->st, math, &c->blas_ws)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuBLAS setup failed: %s", cublasGetStatusString(bs));
        goto fail;
    }
    c->host = be_cpu_create(threads);
    if (!c->host) {
        snprintf(err, errlen, "cannot create the host thread pool");
        goto fail;
    }
    /* the host ops (be_cpu_parallel) see the embedded CPU backend's pool */
    {
        const char *g = getenv("DEEPINFER_CUDA_GRAPH");
        if (g && *g && strcmp(g, "host") && strcmp(g, "device")) {
            snprintf(err, errlen, "DEEPINFER_CUDA_GRAPH must be device or host, not '%s'", g);
            goto fail;
        }
        c->base.ops = g && !strcmp(g, "host") ? &cuda_ops_host : &cuda_ops;
    }
    c->base.threads = c->host->threads;
    c->base.impl = c->host->impl;
    return &c->base;
cuda_fail:
    snprintf(err, errlen, "%s(%d) failed: %s (%s)", what, device, cudaGetErrorString(r), cudaGetErrorName(r));
fail:
    teardown(c);
    return NULL;
}

extern "C" be_backend *be_cuda_create(int device, int threads, char *err, size_t errlen)
{
    int m = bcu_math_from_env();
    if (m < 0) {
        if (err) snprintf(err, errlen, "DEEPINFER_CUDA_MATH must be bf16x3, bf16 or fp32, not '%s'", getenv("DEEPINFER_CUDA_MATH"));
        return NULL;
    }
    return bcu_create(device, threads, (bcu_math)m, err, errlen);
}

extern "C" void be_cuda_destroy(be_backend *be)
{
    if (!be) return;
    teardown(get(be));
}

extern "C" const char *be_cuda_error(const be_backend *be)
{
    if (!is_cuda(be)) return NULL;
    const cuda_be *c = get(be);
    return c->failed ? c->err : NULL;
}

extern "C" void bcu_profile_enable(be_backend *be, int on)
{
    cuda_be *c = get(be);
    if (on) memset(&c->prof, 0, sizeof c->prof);
    c->prof_on = on != 0;
}

extern "C" void bcu_profile_get(const be_backend *be, bcu_profile *out) { *out = get(be)->prof; }

extern "C" const char *bcu_profile_name(int cls)
{
    static const char *const names[BCU_PROF_COUNT] = {"linear bf16 (cuBLAS)", "linear FP8", "linear FP4",
                                                      "grouped wo_a", "rmsnorm", "moe (grouped FP4)",
                                                      "attention + indexer", "graph ops (mHC, RoPE, routing, ...)",
                                                      "uploads + downloads (waits)"};
    return cls >= 0 && cls < BCU_PROF_COUNT ? names[cls] : "?";
}

extern "C" bcu_math bcu_get_math(const be_backend *be) { return get(be)->math; }
extern "C" cudaStream_t bcu_stream(const be_backend *be) { return get(be)->st; }
extern "C" const char *bcu_device_name(const be_backend *be) { return get(be)->name; }
extern "C" size_t bcu_weight_bytes(const be_backend *be) { return get(be)->weight_bytes; }
extern "C" size_t bcu_fp8_gemm_calls(const be_backend *be) { return get(be)->fp8_calls; }
extern "C" size_t bcu_f16x2_calls(const be_backend *be) { return get(be)->f16x2_calls; }
extern "C" size_t bcu_aq_bf16_calls(const be_backend *be) { return get(be)->aq_bf16_calls; }
extern "C" size_t bcu_ft_calls(const be_backend *be) { return get(be)->ft_calls; }
extern "C" void bcu_graph_stats(const be_backend *be, size_t *captured, size_t *replayed, size_t *eager)
{
    const cuda_be *c = get(be);
    *captured = c->g_captures;
    *replayed = c->g_replays;
    *eager = c->g_eager;
}
extern "C" void bcu_kv_stats(const be_backend *be, size_t *hits, size_t *uploads, size_t *pc_hits, size_t *pc_fills)
{
    const cuda_be *c = get(be);
    *hits = c->kvm.hits;
    *uploads = c->kvm.uploads;
    *pc_hits = c->kvm.pc_hits;
    *pc_fills = c->kvm.pc_fills;
}
extern "C" void bcu_upload_stats(const be_backend *be, size_t *cap, size_t *grows, size_t *waits)
{
    const cuda_be *c = get(be);
    *cap = c->up_cap;
    *grows = c->up_grows;
    *waits = c->up_waits;
}
extern "C" int bcu_attn_flags_set(be_backend *be, int fl)
{
    cuda_be *c = get(be);
    pthread_mutex_lock(&c->lock);
    int rc = -1;
    if (!c->failed && c->aws.mem && cudaStreamSynchronize(c->st) == cudaSuccess &&
        cudaMemcpy(c->aws.mem, &fl, sizeof fl, cudaMemcpyHostToDevice) == cudaSuccess) {
        c->aws_pending = 1;
        rc = 0;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

extern "C" size_t bcu_arena_bytes(const be_backend *be)
{
    const cuda_be *c = get(be);
    size_t b = 0;
    for (int i = 0; i < c->ar.n; i++) b += c->ar.ch[i].cap;
    for (int i = 0; i < c->ark.n; i++) b += c->ark.ch[i].cap;
    return b;
}
