/* attn.cu - attention over window + compressed entries with sinks, and the CSA
 * lightning indexer with an exact top-k, for a batch of sequences on the GPU.
 *
 * Five kernels, all fp32 on CUDA cores (no TF32: the top-k must pick what the
 * CPU picks, and attention must meet 1e-5), none of them allocating:
 *
 *   ix_score     one block per (row, group of 64-key tiles): the scores
 *                S[h, b] = q_h . key_b as a register-tiled 64x64 GEMM tile
 *                (both operands transposed in shared memory), then
 *                sum_h w[h] relu(S[h, b]) in a fixed order; written as
 *                order-preserving uint32 keys, one row per query.
 *   sel_groups   top-k stage A: the visible keys of a row are cut into groups
 *                of 4k; each block selects its group's exact top-k.  The
 *                row's top-k is a subset of the union of the groups' top-k.
 *   sel_final    stage B: one block per row selects the top-k of that union.
 *                Selection = a 4-pass 8-bit radix select for the k-th key,
 *                then an ordered compaction: everything above it, and the
 *                lowest-index ties at it.  The compaction keeps item order,
 *                which is index order, so the output is ascending as is.
 *   at_split     flash-decoding: one block per (row, split of the candidate
 *                list, group of 32 heads, or 8 where the grid would not
 *                fill the GPU: a decode step).  The candidates (window then
 *                compressed) are cut into S splits of whole 16-key tiles; a
 *                block keeps Q of its heads and one key tile in shared
 *                memory, computes the heads x 16 logits (split-K over lanes,
 *                then a butterfly), runs the online softmax, and accumulates
 *                O (its heads x d) in registers.  MQA: K = V, one tile load
 *                serves both products and all the block's heads.  S follows
 *                the 32-head groups either way, so both shapes give the
 *                same bits.
 *   at_merge     one block per (row, head): log-sum-exp merge of the splits
 *                in split order, with the sink in the denominator, then the
 *                inverse RoPE on the last rope_dim channels.
 *
 * Every reduction has a fixed order, so a call is deterministic.  The split
 * count depends on the batch shape (to fill the GPU at batch 1), so a row's
 * rounding may change between batches of different shapes. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/attn.h"
#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sm_count.cuh"

#define BLOCK_TOKENS 128 /* MD_BLOCK_TOKENS */

/* indexer scoring */
#define IX_HT 64 /* heads per tile (index_heads <= 64) */
#define IX_KT 64 /* keys per tile */
#define IX_NT 256
#define IX_LD 68 /* row stride of the transposed tiles: float4-aligned, fewer bank conflicts on the fill */
#define IX_MAX_ID 192

/* top-k */
#define SEL_RANGE 4 /* stage A groups hold SEL_RANGE * topk keys */
#define SEL_NT_A 512
#define SEL_CAP_A 4096
#define SEL_NT_B 1024
#define SEL_CAP_B 8192

/* attention */
#define AT_NW 8  /* warps of at_split_kernel, a quad of heads each: 32 heads a block (decode rows: AT_NW_FEW) */
#define AT_NW_FEW 2
#define AT_KT 16 /* keys per tile */
#define AT_MIN_SLOTS 512

#define FULL 0xffffffffu

/* ------------------------------------------------------------ workspace */

typedef struct {
    size_t flags, keys, cand_u, cand_i, ml, po, total;
    int64_t vis_cap; /* indexer keys per row */
    int64_t gcap;    /* stage A groups per row */
    int64_t slots;   /* attention partial slots (row x split) */
} ws_layout;

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

static ws_layout layout_of(const bcu_attn_limits *l)
{
    ws_layout w = {};
    size_t off = 0;
    const size_t rows = l->max_rows > 0 ? (size_t)l->max_rows : 0;
    w.flags = off;
    off += 256;
    if (l->index_topk > 0 && l->index_ratio > 0) {
        const int64_t k = l->index_topk, range = SEL_RANGE * k;
        w.vis_cap = l->max_len / l->index_ratio;
        w.gcap = (w.vis_cap + range - 1) / range;
        if (w.gcap < 1) w.gcap = 1;
        w.keys = off;
        off = al256(off + rows * (size_t)w.vis_cap * 4);
        w.cand_u = off;
        off = al256(off + rows * (size_t)(w.gcap * k) * 4);
        w.cand_i = off;
        off = al256(off + rows * (size_t)(w.gcap * k) * 4);
    }
    w.slots = (int64_t)rows > AT_MIN_SLOTS ? (int64_t)rows : AT_MIN_SLOTS;
    const size_t hd = (size_t)(l->n_heads > 0 ? l->n_heads : 0);
    w.ml = off;
    off = al256(off + (size_t)w.slots * hd * 8);
    w.po = off;
    off = al256(off + (size_t)w.slots * hd * (size_t)(l->head_dim > 0 ? l->head_dim : 0) * 4);
    w.total = off;
    return w;
}

extern "C" size_t bcu_attn_workspace_bytes(const bcu_attn_limits *lim) { return layout_of(lim).total; }

extern "C" cudaError_t bcu_attn_workspace_init(const bcu_attn_ws *ws, cudaStream_t st)
{
    return cudaMemsetAsync(ws->mem, 0, 256, st);
}

extern "C" int bcu_attn_workspace_flags(const bcu_attn_ws *ws, int clear, cudaStream_t st)
{
    int f = 0;
    if (cudaMemcpyAsync(&f, ws->mem, sizeof f, cudaMemcpyDeviceToHost, st) != cudaSuccess) return -1;
    if (cudaStreamSynchronize(st) != cudaSuccess) return -1;
    if (clear && f && cudaMemsetAsync(ws->mem, 0, 256, st) != cudaSuccess) return -1;
    return f;
}

extern "C" const uint32_t *bcu_attn_ws_index_keys(const bcu_attn_ws *ws, size_t *row_stride)
{
    ws_layout w = layout_of(&ws->lim);
    if (!w.vis_cap) return NULL;
    if (row_stride) *row_stride = (size_t)w.vis_cap;
    return (const uint32_t *)((const char *)ws->mem + w.keys);
}

/* cudaFuncSetAttribute once per kernel and device (bit k of done[dev]) */
template <typename K>
static cudaError_t opt_in_smem(K *kernel, int bit, size_t smem)
{
    static unsigned done[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = -1;
    if (dev >= 0 && (done[dev] >> bit & 1u)) return cudaSuccess;
    cudaError_t r = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (r == cudaSuccess)
        r = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (r == cudaSuccess && dev >= 0) done[dev] |= 1u << bit;
    return r;
}

static cudaError_t bad(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return cudaErrorInvalidValue;
}

/* ------------------------------------------------------------ shared device helpers */

/* The sequence that owns `row` (binary search on row0), checked. */
__device__ __forceinline__ bool load_row(const bcu_attn_seq *seqs, int nseq, int row, bcu_attn_seq *out, int *flags)
{
    int lo = 0, hi = nseq - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (seqs[mid].row0 <= row) lo = mid;
        else hi = mid - 1;
    }
    *out = seqs[lo];
    const bool ok = out->row0 <= row && row < out->row0 + out->T && out->kstart >= 0 && out->kstart <= out->p0;
    if (!ok && flags && threadIdx.x == 0) atomicOr(flags, BCU_ATTN_FLAG_ROW);
    return ok;
}

/* two floats as a bf16 pair (lo in the low half), nearest even */
__device__ __forceinline__ uint32_t am_pack(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

/* higher score -> higher key; -0 and +0 are one key (they compare equal) */
__device__ __forceinline__ uint32_t f2key(float s)
{
    const uint32_t u = s == 0.0f ? 0u : __float_as_uint(s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* ------------------------------------------------------------ indexer scores */

struct IxArgs {
    const bcu_attn_seq *seqs;
    int nseq;
    const float *iq, *iw;
    int IH, ID, epb, ratio;
    size_t key_off;
    uint32_t *keys;
    int64_t vis_cap;
    int *flags;
};

/* a row of the indexer's score kernels: its sequence and visible entries (capped at vis_cap, flagged), and the
 * number of key tiles it has (0 when the row is past the batch) */
__device__ __forceinline__ int64_t ix_row(const IxArgs &a, int row, bcu_attn_seq *s, int64_t *nv)
{
    if (!load_row(a.seqs, a.nseq, row, s, blockIdx.x == 0 ? a.flags : NULL)) return 0;
    const int64_t pos = s->p0 + (row - s->row0);
    *nv = (pos + 1) / a.ratio;
    if (*nv > a.vis_cap) {
        if (threadIdx.x == 0 && blockIdx.x == 0) atomicOr(a.flags, BCU_ATTN_FLAG_VIS);
        *nv = a.vis_cap;
    }
    return (*nv + IX_KT - 1) / IX_KT;
}

/* entry b's indexer key row, NULL past the visible ones */
__device__ __forceinline__ const float *ix_key(const IxArgs &a, const bcu_attn_seq &s, int64_t b, int64_t nv)
{
    return b < nv ? s.blocks[b / a.epb] + a.key_off + (size_t)(b % a.epb) * a.ID : NULL;
}

/* the row's Q transposed into Qt [ID][IX_LD] (Qt[c][h] = q_h[c], heads past IH zero) and its head weights into wsm */
__device__ __forceinline__ void ix_stage_q(const IxArgs &a, int row, float *Qt, float *wsm, int tid)
{
    const float *q = a.iq + (size_t)row * a.IH * a.ID;
    for (int i = tid; i < IX_HT * a.ID; i += IX_NT) {
        const int h = i / a.ID, c = i % a.ID;
        Qt[c * IX_LD + h] = h < a.IH ? q[(size_t)h * a.ID + c] : 0.0f;
    }
    if (tid < IX_HT) wsm[tid] = tid < a.IH ? a.iw[(size_t)row * a.IH + tid] : 0.0f;
}

/* the tile's KT key rows (kp[k], NULL: zeros) transposed into Kt [ID][LD] (Kt[c][k] = key_k[c]) */
template <int KT, int LD>
__device__ __forceinline__ void ix_stage_keys(const IxArgs &a, const float *const *kp, float *Kt, int tid)
{
    const int nc4 = a.ID / 4;
    for (int i = tid; i < KT * nc4; i += IX_NT) {
        const int k = i % KT, c4 = i / KT;
        const float *p = kp[k];
        const float4 v = p ? ((const float4 *)p)[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        Kt[(4 * c4 + 0) * LD + k] = v.x;
        Kt[(4 * c4 + 1) * LD + k] = v.y;
        Kt[(4 * c4 + 2) * LD + k] = v.z;
        Kt[(4 * c4 + 3) * LD + k] = v.w;
    }
}

__global__ void __launch_bounds__(IX_NT) ix_score_kernel(IxArgs a)
{
    pdl_enter();
    extern __shared__ float4 ix_sm4[];
    float *Qt = (float *)ix_sm4;       /* [ID][IX_LD]: Qt[c][h] = q_h[c] */
    float *Kt = Qt + a.ID * IX_LD;     /* [ID][IX_LD]: Kt[c][k] = key_k[c] */
    float *red = Kt + a.ID * IX_LD;    /* [16][IX_KT] per-head-quad partial scores */
    float *wsm = red + 16 * IX_KT;     /* [IX_HT] */
    __shared__ const float *kp[IX_KT]; /* the tile's key rows */

    const int tid = threadIdx.x, row = blockIdx.y;
    bcu_attn_seq s;
    int64_t nv;
    const int64_t ntiles = ix_row(a, row, &s, &nv);
    if ((int64_t)blockIdx.x >= ntiles) return;

    ix_stage_q(a, row, Qt, wsm, tid);

    const int ht = tid >> 4, kt = tid & 15; /* heads 4ht..4ht+3, keys 4kt..4kt+3 */
    uint32_t *keys = a.keys + (size_t)row * a.vis_cap;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t k0 = tile * IX_KT;
        __syncthreads(); /* Q is in; the previous tile's Kt, red and kp are consumed */
        if (tid < IX_KT) {
            const int64_t b = k0 + tid;
            kp[tid] = ix_key(a, s, b, nv);
        }
        __syncthreads();
        ix_stage_keys<IX_KT, IX_LD>(a, kp, Kt, tid);
        __syncthreads();
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll 4
        for (int c = 0; c < a.ID; c++) {
            const float4 qv = *(const float4 *)&Qt[c * IX_LD + 4 * ht];
            const float4 kv = *(const float4 *)&Kt[c * IX_LD + 4 * kt];
            const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(qa[i], ka[j], acc[i][j]);
        }
        float part[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) p += acc[i][j] > 0.0f ? acc[i][j] * wsm[4 * ht + i] : 0.0f;
            part[j] = p;
        }
        *(float4 *)&red[ht * IX_KT + 4 * kt] = make_float4(part[0], part[1], part[2], part[3]);
        __syncthreads();
        if (tid < IX_KT && k0 + tid < nv) {
            float sc = 0.0f;
            for (int i = 0; i < 16; i++) sc += red[i * IX_KT + tid];
            keys[k0 + tid] = f2key(sc);
        }
    }
}

/* The same scores for few rows (decode): IX_KT1 keys a tile, so a 4K context is 64 blocks a row, not 16.  Thread
 * (ht, k) takes heads 4 ht .. 4 ht + 3 of key k, where ix_score_kernel's thread takes them for four keys: each
 * q.k is the same chain of FMAs over the channels, each head quad's partial the same sum in head order, and the 16
 * partials of a key are added in the same order, so the keys are those of ix_score_kernel bit for bit
 * (test_cuda_attn compares the two). */
#define IX_KT1 16
__global__ void __launch_bounds__(IX_NT) ix_score1_kernel(IxArgs a)
{
    pdl_enter();
    extern __shared__ float4 ix_sm4[];
    float *Qt = (float *)ix_sm4;        /* [ID][IX_LD]: Qt[c][h] = q_h[c] */
    float *Kt = Qt + a.ID * IX_LD;      /* [ID][IX_KT1]: Kt[c][k] = key_k[c] */
    float *red = Kt + a.ID * IX_KT1;    /* [16][IX_KT1] per-head-quad partial scores */
    float *wsm = red + 16 * IX_KT1;     /* [IX_HT] */
    __shared__ const float *kp[IX_KT1]; /* the tile's key rows */
    static_assert(IX_NT == 16 * IX_KT1, "a thread per (head quad, key)");

    const int tid = threadIdx.x, row = blockIdx.y;
    bcu_attn_seq s;
    int64_t nv = 0;
    if (ix_row(a, row, &s, &nv) == 0) return;
    const int64_t ntiles = (nv + IX_KT1 - 1) / IX_KT1;
    if ((int64_t)blockIdx.x >= ntiles) return;

    ix_stage_q(a, row, Qt, wsm, tid);

    const int ht = tid / IX_KT1, k = tid % IX_KT1; /* heads 4ht..4ht+3 of key k */
    uint32_t *keys = a.keys + (size_t)row * a.vis_cap;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t k0 = tile * IX_KT1;
        __syncthreads(); /* Q is in; the previous tile's Kt, red and kp are consumed */
        if (tid < IX_KT1) kp[tid] = ix_key(a, s, k0 + tid, nv);
        __syncthreads();
        ix_stage_keys<IX_KT1, IX_KT1>(a, kp, Kt, tid);
        __syncthreads();
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int c = 0; c < a.ID; c++) {
            const float4 qv = *(const float4 *)&Qt[c * IX_LD + 4 * ht];
            const float kv = Kt[c * IX_KT1 + k];
            const float qa[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] = fmaf(qa[i], kv, acc[i]);
        }
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) p += acc[i] > 0.0f ? acc[i] * wsm[4 * ht + i] : 0.0f;
        red[ht * IX_KT1 + k] = p;
        __syncthreads();
        if (tid < IX_KT1 && k0 + tid < nv) {
            float sc = 0.0f;
            for (int i = 0; i < 16; i++) sc += red[i * IX_KT1 + tid];
            keys[k0 + tid] = f2key(sc);
        }
    }
}

/* The same scores on bf16 tensor cores (bcu_indexer_args.bf16; index_dim a multiple of 16).  Same grid and output
 * as ix_score_kernel; 8 warps, warp w: heads 16 (w % 4) .. + 15, keys 32 (w / 4) .. + 31 of the 64-key tile.  Q and
 * the tile sit in shared memory as bf16 [row][channel] (rows 4 banks apart); q.k as m16n8k16 MMAs over the
 * channels; then w relu(.) of a lane's two heads, summed over the 16 heads of the warp by a butterfly across g, and
 * the four head tiles' sums added in order.  Under official semantics q and the keys went through fq_fp4 (e2m1
 * times a power of two): bf16 holds them exactly and only the order of the fp32 sums differs from ix_score_kernel. */
__global__ void __launch_bounds__(IX_NT) ix_mma_kernel(IxArgs a)
{
    pdl_enter();
    extern __shared__ float4 im_sm4[];
    const int LD = a.ID + 8;                /* bf16 row stride */
    uint16_t *Qs = (uint16_t *)im_sm4;      /* [IX_HT][LD] */
    uint16_t *Ks = Qs + IX_HT * LD;         /* [IX_KT][LD] */
    float *red = (float *)(Ks + IX_KT * LD); /* [4][IX_KT]: the head tiles' sums */
    float *wsm = red + 4 * IX_KT;           /* [IX_HT] */
    __shared__ const float *kp[IX_KT];

    const int tid = threadIdx.x, row = blockIdx.y, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, qq = lane & 3, mt = warp & 3, nh = warp >> 2;
    bcu_attn_seq s;
    int64_t nv;
    const int64_t ntiles = ix_row(a, row, &s, &nv);
    if ((int64_t)blockIdx.x >= ntiles) return;

    const int nc4 = a.ID / 4;
    const float4 *q4 = (const float4 *)(a.iq + (size_t)row * a.IH * a.ID);
    for (int i = tid; i < IX_HT * nc4; i += IX_NT) {
        const int h = i / nc4, c4 = i % nc4;
        const float4 v = h < a.IH ? q4[(size_t)h * nc4 + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(uint2 *)&Qs[h * LD + 4 * c4] = make_uint2(am_pack(v.x, v.y), am_pack(v.z, v.w));
    }
    if (tid < IX_HT) wsm[tid] = tid < a.IH ? a.iw[(size_t)row * a.IH + tid] : 0.0f;

    uint32_t *keys = a.keys + (size_t)row * a.vis_cap;
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const int64_t k0 = tile * IX_KT;
        __syncthreads(); /* Q and w are in; the previous tile's Ks, red and kp are consumed */
        if (tid < IX_KT) {
            const int64_t b = k0 + tid;
            kp[tid] = ix_key(a, s, b, nv);
        }
        __syncthreads();
        {
            /* every load of the tile in flight before the first is packed: one round trip a tile, not eight */
            constexpr int NL = IX_KT * (IX_MAX_ID / 4) / IX_NT;
            float4 v[NL];
#pragma unroll
            for (int r = 0; r < NL; r++) {
                const int i = tid + r * IX_NT, k = i / nc4, c4 = i % nc4;
                const float *p = i < IX_KT * nc4 ? kp[k] : NULL;
                v[r] = p ? ((const float4 *)p)[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int r = 0; r < NL; r++) {
                const int i = tid + r * IX_NT, k = i / nc4, c4 = i % nc4;
                if (i < IX_KT * nc4)
                    *(uint2 *)&Ks[k * LD + 4 * c4] = make_uint2(am_pack(v[r].x, v[r].y), am_pack(v[r].z, v[r].w));
            }
        }
        __syncthreads();
        float acc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        const uint16_t *qa = Qs + (16 * mt + g) * LD + 2 * qq;
        for (int ks = 0; ks < a.ID / 16; ks++) {
            uint32_t af[4];
            rd_afrag(af, qa + 16 * ks, LD);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t *kb = Ks + (32 * nh + 8 * j + g) * LD + 16 * ks + 2 * qq;
                rd_mma(acc[j], af, *(const uint32_t *)kb, *(const uint32_t *)(kb + 8));
            }
        }
        const float wa = wsm[16 * mt + g], wb = wsm[16 * mt + g + 8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float p0 = (acc[j][0] > 0.0f ? acc[j][0] * wa : 0.0f) + (acc[j][2] > 0.0f ? acc[j][2] * wb : 0.0f);
            float p1 = (acc[j][1] > 0.0f ? acc[j][1] * wa : 0.0f) + (acc[j][3] > 0.0f ? acc[j][3] * wb : 0.0f);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                p0 += __shfl_xor_sync(FULL, p0, o);
                p1 += __shfl_xor_sync(FULL, p1, o);
            }
            if (g == 0) *(float2 *)&red[mt * IX_KT + 32 * nh + 8 * j + 2 * qq] = make_float2(p0, p1);
        }
        __syncthreads();
        if (tid < IX_KT && k0 + tid < nv)
            keys[k0 + tid] = f2key(red[tid] + red[IX_KT + tid] + red[2 * IX_KT + tid] + red[3 * IX_KT + tid]);
    }
}

/* ------------------------------------------------------------ top-k */

template <int NT, int CAP>
struct SelShared {
    uint32_t hist[256];
    uint32_t cache[CAP]; /* the keys, after the first pass, when n <= CAP */
    int wsum[NT / 32];
    int digit, remain;
};

/* exclusive prefix count of f over the block in thread order; *total = all */
template <int NT>
__device__ __forceinline__ int block_scan(bool f, int *wsum, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned b = __ballot_sync(FULL, f);
    if (lane == 0) wsum[warp] = __popc(b);
    __syncthreads();
    int before = 0, tot = 0;
    for (int w = 0; w < NT / 32; w++) {
        const int c = wsum[w];
        before += w < warp ? c : 0;
        tot += c;
    }
    __syncthreads(); /* wsum is reused by the next scan */
    *total = tot;
    return before + __popc(b & ((1u << lane) - 1u));
}

/* The top k of items 0..n-1 (key keys[i], index idx ? idx[i] : base + i) by
 * higher key, then earlier item; written in item order to oi (and ou).
 * Returns min(n, k) (the same in every thread).  blockDim.x == NT. */
template <int NT, int CAP>
__device__ int block_select(const uint32_t *keys, const int32_t *idx, int base, int n, int k, uint32_t *ou,
                            int32_t *oi, SelShared<NT, CAP> &sh)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bool all = n <= k;
    const uint32_t *src = keys;
    uint32_t thr = 0;
    int remain = 0;
    if (!all) {
        const bool cache = n <= CAP;
        uint32_t prefix = 0, mask = 0;
        remain = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = tid; i < 256; i += NT) sh.hist[i] = 0;
            __syncthreads();
            for (int i0 = 0; i0 < n; i0 += NT) {
                const int i = i0 + tid;
                uint32_t dg = 256; /* "not counted" */
                if (i < n) {
                    const uint32_t u = src[i];
                    if (shift == 24 && cache) sh.cache[i] = u;
                    if ((u & mask) == prefix) dg = (u >> shift) & 255u;
                }
                const unsigned peers = __match_any_sync(FULL, dg);
                if (dg < 256 && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[dg], (uint32_t)__popc(peers));
            }
            __syncthreads();
            /* the digit d* where the count of keys above, from the top, reaches
             * remain: lane L owns digits 8L..8L+7; suffix sums over lanes */
            if (warp == 0) {
                uint32_t own = 0;
                for (int e = 0; e < 8; e++) own += sh.hist[8 * lane + e];
                uint32_t suf = own;
                for (int off = 1; off < 32; off <<= 1) {
                    const uint32_t v = __shfl_down_sync(FULL, suf, off);
                    if (lane + off < 32) suf += v;
                }
                /* suf is non-increasing in lane and suf(0) = keys matching the prefix >= remain */
                const unsigned ball = __ballot_sync(FULL, suf >= (uint32_t)remain);
                const int L = ball ? 31 - __clz((int)ball) : 0;
                if (lane == L) {
                    uint32_t cum = suf - own; /* keys in digits above lane L's */
                    int dd = 8 * L + 7;
                    for (; dd > 8 * L; dd--) {
                        if (cum + sh.hist[dd] >= (uint32_t)remain) break;
                        cum += sh.hist[dd];
                    }
                    sh.digit = dd;
                    sh.remain = remain - (int)cum;
                }
            }
            __syncthreads();
            prefix |= (uint32_t)sh.digit << shift;
            mask |= 255u << shift;
            remain = sh.remain;
            if (cache) src = sh.cache;
        }
        thr = prefix; /* the k-th key; take every key above it and the first `remain` equal to it */
    }
    int taken = 0, eqs = 0;
    for (int i0 = 0; i0 < n; i0 += NT) {
        const int i = i0 + tid;
        const uint32_t u = i < n ? src[i] : 0u;
        const bool gt = i < n && (all || u > thr);
        const bool eq = i < n && !all && u == thr;
        int eq_tot, take_tot;
        const int eq_rank = eqs + block_scan<NT>(eq, sh.wsum, &eq_tot);
        const bool take = gt || (eq && eq_rank < remain);
        const int at = taken + block_scan<NT>(take, sh.wsum, &take_tot);
        if (take) {
            oi[at] = idx ? idx[i] : base + i;
            if (ou) ou[at] = u;
        }
        eqs += eq_tot;
        taken += take_tot;
    }
    return taken;
}

struct SelArgs {
    const bcu_attn_seq *seqs;
    int nseq, ratio, topk;
    const uint32_t *keys;
    int64_t vis_cap;
    uint32_t *cu;
    int32_t *ci;
    int64_t gcap;
    int32_t *sel, *nsel;
    int direct; /* no row has more than one group: sel_groups writes the selection, and sel_final is not run */
};

__device__ __forceinline__ int64_t visible(const SelArgs &a, const bcu_attn_seq &s, int row)
{
    const int64_t pos = s.p0 + (row - s.row0);
    const int64_t nv = (pos + 1) / a.ratio;
    return nv < a.vis_cap ? nv : a.vis_cap;
}

__global__ void __launch_bounds__(SEL_NT_A) sel_groups_kernel(SelArgs a)
{
    pdl_enter();
    __shared__ SelShared<SEL_NT_A, SEL_CAP_A> sh;
    const int row = blockIdx.y;
    bcu_attn_seq s;
    if (!load_row(a.seqs, a.nseq, row, &s, NULL)) return;
    const int64_t nv = visible(a, s, row), range = (int64_t)SEL_RANGE * a.topk;
    const int64_t ng = (nv + range - 1) / range;
    const size_t cbase = (size_t)row * (size_t)(a.gcap * a.topk);
    if (a.direct) {
        /* one group at most (nv <= range): its top-k, in index order, is the row's (what sel_final would select
         * from it, all of it, in the same order) */
        int32_t *sel = a.sel + (size_t)row * a.topk;
        const int cnt = block_select<SEL_NT_A, SEL_CAP_A>(a.keys + (size_t)row * a.vis_cap, NULL, 0, (int)nv, a.topk,
                                                          NULL, sel, sh);
        for (int j = cnt + threadIdx.x; j < a.topk; j += SEL_NT_A) sel[j] = -1;
        if (threadIdx.x == 0) a.nsel[row] = cnt;
        return;
    }
    for (int64_t g = blockIdx.x; g < ng; g += gridDim.x) {
        const int64_t start = g * range;
        const int len = (int)(nv - start < range ? nv - start : range);
        block_select<SEL_NT_A, SEL_CAP_A>(a.keys + (size_t)row * a.vis_cap + start, NULL, (int)start, len, a.topk,
                                          a.cu + cbase + (size_t)g * a.topk, a.ci + cbase + (size_t)g * a.topk, sh);
        __syncthreads();
    }
}

__global__ void __launch_bounds__(SEL_NT_B) sel_final_kernel(SelArgs a)
{
    pdl_enter();
    __shared__ SelShared<SEL_NT_B, SEL_CAP_B> sh;
    const int row = blockIdx.x;
    bcu_attn_seq s;
    if (!load_row(a.seqs, a.nseq, row, &s, NULL)) return;
    const int64_t nv = visible(a, s, row), range = (int64_t)SEL_RANGE * a.topk;
    const int64_t ng = (nv + range - 1) / range;
    /* every group but the last holds range >= k keys and gave exactly k */
    int64_t nu = 0;
    if (ng > 0) {
        const int64_t last = nv - (ng - 1) * range;
        nu = (ng - 1) * a.topk + (last < a.topk ? last : a.topk);
    }
    const size_t cbase = (size_t)row * (size_t)(a.gcap * a.topk);
    int32_t *sel = a.sel + (size_t)row * a.topk;
    const int cnt = block_select<SEL_NT_B, SEL_CAP_B>(a.cu + cbase, a.ci + cbase, 0, (int)nu, a.topk, NULL, sel, sh);
    for (int j = cnt + threadIdx.x; j < a.topk; j += SEL_NT_B) sel[j] = -1;
    if (threadIdx.x == 0) a.nsel[row] = cnt;
}

static std::atomic<size_t> ix_launch_mma, ix_launch_fp32;
extern "C" void bcu_indexer_launches(size_t *mma, size_t *fp32)
{
    *mma = ix_launch_mma.load();
    *fp32 = ix_launch_fp32.load();
}

extern "C" cudaError_t bcu_indexer_topk(const bcu_attn_ws *ws, const bcu_attn_batch *b, const bcu_indexer_args *a,
                                        cudaStream_t st, char *err, size_t errlen)
{
    const bcu_attn_limits *l = &ws->lim;
    if (!ws->mem) return bad(err, errlen, "indexer: no workspace");
    if (l->index_topk <= 0 || a->topk != l->index_topk || a->ratio != l->index_ratio)
        return bad(err, errlen, "indexer: topk %d / ratio %d, the workspace was sized for topk %d / ratio %d",
                   a->topk, a->ratio, l->index_topk, l->index_ratio);
    if (a->ratio <= 0 || BLOCK_TOKENS % a->ratio)
        return bad(err, errlen, "indexer: ratio %d does not divide the %d-token block", a->ratio, BLOCK_TOKENS);
    if (a->index_heads < 1 || a->index_heads > IX_HT)
        return bad(err, errlen, "indexer: %d index heads (1..%d supported)", a->index_heads, IX_HT);
    if (a->index_dim < 4 || a->index_dim % 4 || a->index_dim > IX_MAX_ID)
        return bad(err, errlen, "indexer: index_head_dim %d (a multiple of 4 up to %d)", a->index_dim, IX_MAX_ID);
    if (a->key_off % 4) return bad(err, errlen, "indexer: key_off %zu is not a multiple of 4 floats", a->key_off);
    if (a->tile != 0 && a->tile != IX_KT1 && a->tile != IX_KT)
        return bad(err, errlen, "indexer: tile %d (0, %d or %d keys)", a->tile, IX_KT1, IX_KT);
    if (b->ntok < 0 || b->ntok > l->max_rows || b->ntok > 65535)
        return bad(err, errlen, "indexer: %d rows, the workspace holds %d", b->ntok, l->max_rows);
    if (b->max_len > l->max_len)
        return bad(err, errlen, "indexer: max_len %lld, the workspace holds %lld", (long long)b->max_len,
                   (long long)l->max_len);
    if (b->nseq < 1 || !b->seqs || !a->iq || !a->iw || !a->sel || !a->nsel)
        return bad(err, errlen, "indexer: missing argument");
    if (b->ntok == 0) return cudaSuccess;
    const ws_layout w = layout_of(l);
    char *base = (char *)ws->mem;
    const int sms = bcu_sm_count();

    IxArgs ia;
    ia.seqs = b->seqs;
    ia.nseq = b->nseq;
    ia.iq = a->iq;
    ia.iw = a->iw;
    ia.IH = a->index_heads;
    ia.ID = a->index_dim;
    ia.epb = BLOCK_TOKENS / a->ratio;
    ia.ratio = a->ratio;
    ia.key_off = a->key_off;
    ia.keys = (uint32_t *)(base + w.keys);
    ia.vis_cap = w.vis_cap;
    ia.flags = (int *)(base + w.flags);
    const int64_t vis = b->max_len / a->ratio;
    const int64_t tiles = (vis + IX_KT - 1) / IX_KT;
    int64_t gx = (4 * (int64_t)sms + b->ntok - 1) / b->ntok;
    if (gx > tiles) gx = tiles;
    if (gx < 1) gx = 1;
    cudaError_t r;
    if ((a->bf16 || a->exact) && a->index_dim % 16 == 0) {
        /* Q [IX_HT] and the key tile [IX_KT] rows of index_dim + 8 bf16, then red [4][IX_KT] and w [IX_HT] */
        const size_t smem = (size_t)(IX_HT + IX_KT) * (a->index_dim + 8) * 2 + (size_t)(4 * IX_KT + IX_HT) * sizeof(float);
        const size_t smem_max = (size_t)(IX_HT + IX_KT) * (IX_MAX_ID + 8) * 2 + (size_t)(4 * IX_KT + IX_HT) * sizeof(float);
        if ((r = opt_in_smem(ix_mma_kernel, 9, smem_max)) != cudaSuccess) return r;
        pdl_launch(ix_mma_kernel, dim3((unsigned)gx, (unsigned)b->ntok), IX_NT, smem, st, ia);
        ix_launch_mma++;
    } else if (a->tile == IX_KT1 || (a->tile == 0 && tiles * b->ntok < 2 * (int64_t)sms)) {
        /* few rows: the wide tiles would leave most of the GPU idle (a decode step's 4K context: 16 blocks) */
        const int64_t tiles1 = (vis + IX_KT1 - 1) / IX_KT1;
        int64_t gx1 = (4 * (int64_t)sms + b->ntok - 1) / b->ntok;
        if (gx1 > tiles1) gx1 = tiles1;
        if (gx1 < 1) gx1 = 1;
        const size_t smem = (size_t)(a->index_dim * (IX_LD + IX_KT1) + 16 * IX_KT1 + IX_HT) * sizeof(float);
        const size_t smem_max = (size_t)(IX_MAX_ID * (IX_LD + IX_KT1) + 16 * IX_KT1 + IX_HT) * sizeof(float);
        if ((r = opt_in_smem(ix_score1_kernel, 10, smem_max)) != cudaSuccess) return r;
        pdl_launch(ix_score1_kernel, dim3((unsigned)gx1, (unsigned)b->ntok), IX_NT, smem, st, ia);
        ix_launch_fp32++;
    } else {
        const size_t smem = (size_t)(2 * a->index_dim * IX_LD + 16 * IX_KT + IX_HT) * sizeof(float);
        const size_t smem_max = (size_t)(2 * IX_MAX_ID * IX_LD + 16 * IX_KT + IX_HT) * sizeof(float);
        if ((r = opt_in_smem(ix_score_kernel, 0, smem_max)) != cudaSuccess) return r;
        pdl_launch(ix_score_kernel, dim3((unsigned)gx, (unsigned)b->ntok), IX_NT, smem, st, ia);
        ix_launch_fp32++;
    }
    if ((r = cudaGetLastError()) != cudaSuccess) return r;

    SelArgs sa;
    sa.seqs = b->seqs;
    sa.nseq = b->nseq;
    sa.ratio = a->ratio;
    sa.topk = a->topk;
    sa.keys = ia.keys;
    sa.vis_cap = w.vis_cap;
    sa.cu = (uint32_t *)(base + w.cand_u);
    sa.ci = (int32_t *)(base + w.cand_i);
    sa.gcap = w.gcap;
    sa.sel = a->sel;
    sa.nsel = a->nsel;
    const int64_t range = (int64_t)SEL_RANGE * a->topk;
    int64_t ga = (vis + range - 1) / range;
    if (ga < 1) ga = 1;
    if (ga > 65535) ga = 65535;
    /* every row's visible keys are at most vis (b->max_len bounds the rows' positions) */
    sa.direct = vis <= range;
    pdl_launch(sel_groups_kernel, dim3((unsigned)ga, (unsigned)b->ntok), SEL_NT_A, 0, st, sa);
    if ((r = cudaGetLastError()) != cudaSuccess || sa.direct) return r;
    pdl_launch(sel_final_kernel, (unsigned)b->ntok, SEL_NT_B, 0, st, sa);
    return cudaGetLastError();
}

/* ------------------------------------------------------------ attention */

struct AtArgs {
    const bcu_attn_seq *seqs;
    int nseq;
    const float *q;
    const int32_t *sel, *nsel;
    int topk;
    int H, W, ratio, csa, epb;
    size_t ent_off;
    float scale;
    int S, HG;
    float2 *ml; /* [slot = row * S + split][H]: running max, running sum */
    float *po;  /* [slot][H][D]: unnormalised output */
    int *flags;
    /* with S = 1 the split kernels finish the rows themselves (at_merge's sink, normalisation and inverse RoPE) */
    const float *sink, *inv_freq;
    int rd;
    float *out;
};

/* the candidate list of a row: nw window keys, then nc compressed entries */
struct Cands {
    int64_t pos, w0, nvis;
    int nw, nc;
};

__device__ __forceinline__ Cands cands_of(const AtArgs &a, const bcu_attn_seq &s, int row, bool flag)
{
    Cands c;
    c.pos = s.p0 + (row - s.row0);
    c.w0 = c.pos - a.W + 1;
    if (c.w0 < s.kstart) c.w0 = s.kstart;
    c.nw = (int)(c.pos - c.w0 + 1);
    c.nc = 0;
    c.nvis = 0;
    if (a.ratio) {
        c.nvis = (c.pos + 1) / a.ratio;
        if (a.csa) {
            int n = a.nsel[row];
            if (n < 0 || n > a.topk || n > c.nvis) {
                if (flag) atomicOr(a.flags, BCU_ATTN_FLAG_SEL);
                n = n < 0 ? 0 : n > a.topk ? a.topk : n;
            }
            c.nc = n;
        } else {
            c.nc = (int)c.nvis;
        }
    }
    return c;
}

/* where a row's candidates come from, kept in shared memory by the attention kernels (rather than registers) */
struct RowKeys {
    const float *kw;            /* window key of candidate 0 (no ring) */
    const float *ring, *knew;   /* the sequence's ring and its new key (bcu_attn_seq.kring) */
    const float *const *blks;
    const int32_t *selr;        /* CSA: this row's selection */
    int64_t nvis, w0, p0;
    int nw, W;
};

__device__ __forceinline__ void row_keys(RowKeys &rk, const AtArgs &a, const bcu_attn_seq &s, const Cands &cd, int row,
                                         int D)
{
    rk.ring = s.kring;
    rk.knew = s.knew;
    rk.kw = s.kring ? NULL : s.kwin + (size_t)(cd.w0 - s.kstart) * D;
    rk.w0 = cd.w0;
    rk.p0 = s.p0;
    rk.W = a.W;
    rk.blks = s.blocks;
    rk.selr = a.csa ? a.sel + (size_t)row * a.topk : NULL;
    rk.nvis = cd.nvis;
    rk.nw = cd.nw;
}

/* candidate c of n's key (= value) row; NULL past n and for a selected index out of range (flagged) */
__device__ __forceinline__ const float *key_of(const RowKeys &rk, const AtArgs &a, int c, int n, int D)
{
    if (c < rk.nw) {
        if (!rk.ring) return rk.kw + (size_t)c * D;
        const int64_t p = rk.w0 + c;
        return p >= rk.p0 ? rk.knew + (size_t)(p - rk.p0) * D : rk.ring + (size_t)(p % rk.W) * D;
    }
    if (c >= n) return NULL;
    const int64_t e = rk.selr ? (int64_t)rk.selr[c - rk.nw] : (int64_t)(c - rk.nw);
    if (e < 0 || e >= rk.nvis) {
        atomicOr(a.flags, BCU_ATTN_FLAG_SEL); /* masked by the caller */
        return NULL;
    }
    return rk.blks[e / a.epb] + a.ent_off + (size_t)(e % a.epb) * D;
}

/* what a block of the split kernels works on (blockIdx.x = split * HG + head group, blockIdx.y = row): the row,
 * its n candidates, and the split's tiles [t_lo, t_hi) of AT_KT of them */
struct SplitJob {
    bcu_attn_seq s;
    Cands cd;
    int n, t_lo, t_hi, hg, split, row;
    size_t slot;
};

/* false: a row outside every sequence (flagged; the block has nothing to do) */
__device__ __forceinline__ bool split_job(const AtArgs &a, SplitJob &j)
{
    j.hg = blockIdx.x % a.HG;
    j.split = blockIdx.x / a.HG;
    j.row = blockIdx.y;
    if (!load_row(a.seqs, a.nseq, j.row, &j.s, blockIdx.x == 0 ? a.flags : NULL)) return false;
    j.cd = cands_of(a, j.s, j.row, blockIdx.x == 0 && threadIdx.x == 0);
    j.n = j.cd.nw + j.cd.nc;
    const int ntile = (j.n + AT_KT - 1) / AT_KT, tps = (ntile + a.S - 1) / a.S;
    j.t_lo = j.split * tps;
    j.t_hi = j.t_lo + tps < ntile ? j.t_lo + tps : ntile;
    j.slot = (size_t)j.row * a.S + j.split;
    return true;
}

/* a ring sequence's new key into its ring (bcu_attn_seq.kring), by one block of its row: blockIdx.x == 0 */
__device__ __forceinline__ void ring_put(const bcu_attn_seq &s, int row, int W, int D, int nt)
{
    if (!s.kring || blockIdx.x != 0 || row != s.row0) return;
    float4 *dst = (float4 *)(s.kring + (size_t)(s.p0 % W) * D);
    const float4 *src = (const float4 *)s.knew;
    for (int i = threadIdx.x; i < D / 4; i += nt) dst[i] = src[i];
}

template <int NG, int NW>
__global__ void __launch_bounds__(32 * NW, 16 / NW) at_split_kernel(AtArgs a)
{
    pdl_enter();
    constexpr int D = 128 * NG, NT = 32 * NW, HB = 4 * NW; /* a warp is a quad of heads */
    static_assert((HB * D / 4) % NT == 0 && (AT_KT * D / 4) % NT == 0, "whole rounds of loads");
    extern __shared__ float4 at_sm4[];
    float *Qs = (float *)at_sm4;    /* [HB][D] */
    float *Ks = Qs + HB * D;        /* [AT_KT][D] */
    float *Ss = Ks + AT_KT * D;     /* [HB][AT_KT] logits */
    float *Pt = Ss + HB * AT_KT;    /* [AT_KT][HB] probabilities */
    float *alpha = Pt + AT_KT * HB; /* [HB] rescale of O for this tile */
    float *mrun = alpha + HB;       /* [HB] running max */
    float *lrun = mrun + HB;        /* [HB] running sum of exp */
    __shared__ const float *kp[AT_KT];
    __shared__ RowKeys rs; /* here rather than in registers: the O accumulators take 16 * NG of them */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    {
        /* Q of the block's heads into shared memory first (its address is the grid's alone), its copies in flight
         * while the row's sequence and candidates are looked up; the first tile's wait covers them */
        const int hq = (int)(blockIdx.x % (unsigned)a.HG) * HB;
        const float4 *q4 = (const float4 *)(a.q + ((size_t)blockIdx.y * a.H + hq) * D);
#pragma unroll
        for (int r = 0; r < HB * D / 4 / NT; r++) {
            const int i = tid + r * NT, h = i / (D / 4);
            rd_cp16z(&((float4 *)Qs)[i], hq + h < a.H ? (const void *)(q4 + i) : (const void *)a.q, hq + h < a.H);
        }
    }
    SplitJob jb;
    if (!split_job(a, jb)) {
        rd_cp_wait();
        return;
    }
    const bcu_attn_seq &s = jb.s;
    const int n = jb.n, t_lo = jb.t_lo, t_hi = jb.t_hi, row = jb.row;
    const size_t slot = jb.slot;
    const int h0 = jb.hg * HB;
    ring_put(s, row, a.W, D, NT);
    if (t_lo >= t_hi) { /* an empty split: the merge skips it (one split a row: the row's output is 0, as merged) */
        rd_cp_wait();
        if (a.S == 1) {
            for (int i = tid; i < HB * D; i += NT)
                if (h0 + i / D < a.H) a.out[((size_t)row * a.H + h0) * D + i] = 0.0f;
        } else if (tid < HB && h0 + tid < a.H) {
            a.ml[slot * a.H + h0 + tid] = make_float2(-INFINITY, 0.0f);
        }
        return;
    }

    if (tid < HB) {
        mrun[tid] = -INFINITY;
        lrun[tid] = 0.0f;
    }
    if (tid == 0) row_keys(rs, a, s, jb.cd, row, D);
    float4 o[4][NG];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int g = 0; g < NG; g++) o[i][g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    const int cs = lane & 7, jt = lane >> 3; /* QK: channel slice, key quad; warp = head quad */
    for (int t = t_lo; t < t_hi; t++) {
        __syncthreads(); /* Q and the stats are in; the previous tile's Ks, Pt and kp are consumed */
        if (tid < AT_KT) kp[tid] = key_of(rs, a, t * AT_KT + tid, n, D); /* NULL: masked below */
        __syncthreads();
        /* the tile's keys straight into shared memory, every copy in flight at once (no registers held: with
         * two warps a block that is 32 copies a thread); a masked key is zeros */
#pragma unroll 8
        for (int r = 0; r < AT_KT * D / 4 / NT; r++) {
            const int i = tid + r * NT, j = i / (D / 4), c4 = i % (D / 4);
            const float *p = kp[j];
            rd_cp16z(&((float4 *)Ks)[i], p ? (const void *)((const float4 *)p + c4) : (const void *)a.q, p != NULL);
        }
        rd_cp_wait();
        __syncthreads();

        /* logits: heads 4warp+ii, keys 4jt+jj, channels 32i+4cs..+3, summed over cs by a butterfly */
        float acc[4][4];
#pragma unroll
        for (int ii = 0; ii < 4; ii++)
#pragma unroll
            for (int jj = 0; jj < 4; jj++) acc[ii][jj] = 0.0f;
#pragma unroll 1
        for (int i = 0; i < D / 32; i++) {
            const int c = 32 * i + 4 * cs;
            float4 kv[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) kv[jj] = *(const float4 *)&Ks[(4 * jt + jj) * D + c];
#pragma unroll
            for (int ii = 0; ii < 4; ii++) {
                const float4 qv = *(const float4 *)&Qs[(4 * warp + ii) * D + c];
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    float x = acc[ii][jj];
                    x = fmaf(qv.x, kv[jj].x, x);
                    x = fmaf(qv.y, kv[jj].y, x);
                    x = fmaf(qv.z, kv[jj].z, x);
                    x = fmaf(qv.w, kv[jj].w, x);
                    acc[ii][jj] = x;
                }
            }
        }
#pragma unroll
        for (int off = 4; off; off >>= 1)
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) acc[ii][jj] += __shfl_xor_sync(FULL, acc[ii][jj], off);
        /* all 8 lanes of a slice group hold the same sums; lane cs stores pairs 2cs, 2cs+1 */
#pragma unroll
        for (int e = 0; e < 16; e++) {
            if ((e >> 1) == cs) {
                const int ii = e >> 2, jj = e & 3, j = 4 * jt + jj;
                const bool ok = t * AT_KT + j < n && kp[j] != NULL;
                Ss[(4 * warp + ii) * AT_KT + j] = ok ? acc[ii][jj] * a.scale : -INFINITY;
            }
        }
        __syncthreads();

        /* online softmax: 8 threads per head, 2 keys each */
        {
            const int h = tid >> 3, j0 = 2 * (tid & 7);
            const float s0 = Ss[h * AT_KT + j0], s1 = Ss[h * AT_KT + j0 + 1];
            float mt = fmaxf(s0, s1);
#pragma unroll
            for (int off = 4; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(FULL, mt, off));
            const float mold = mrun[h];
            const float mnew = fmaxf(mold, mt);
            float p0 = 0.0f, p1 = 0.0f, al = 1.0f;
            if (mnew != -INFINITY) {
                p0 = expf(s0 - mnew);
                p1 = expf(s1 - mnew);
                al = expf(mold - mnew);
            }
            float ps = p0 + p1;
#pragma unroll
            for (int off = 4; off; off >>= 1) ps += __shfl_xor_sync(FULL, ps, off);
            Pt[j0 * HB + h] = p0;
            Pt[(j0 + 1) * HB + h] = p1;
            __syncwarp(); /* every lane has read mrun[h] */
            if ((tid & 7) == 0) {
                alpha[h] = al;
                lrun[h] = lrun[h] * al + ps;
                mrun[h] = mnew;
            }
        }
        __syncthreads();

        /* O = alpha O + P V: warp = head quad, lane = channels 128g + 4lane..+3 */
        {
            const float4 al4 = *(const float4 *)&alpha[4 * warp];
            const float al[4] = {al4.x, al4.y, al4.z, al4.w};
#pragma unroll
            for (int ii = 0; ii < 4; ii++)
#pragma unroll
                for (int g = 0; g < NG; g++) {
                    o[ii][g].x *= al[ii];
                    o[ii][g].y *= al[ii];
                    o[ii][g].z *= al[ii];
                    o[ii][g].w *= al[ii];
                }
#pragma unroll 2
            for (int j = 0; j < AT_KT; j++) {
                const float4 p4 = *(const float4 *)&Pt[j * HB + 4 * warp];
                const float p[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int g = 0; g < NG; g++) {
                    const float4 v = *(const float4 *)&Ks[j * D + 128 * g + 4 * lane];
#pragma unroll
                    for (int ii = 0; ii < 4; ii++) {
                        o[ii][g].x = fmaf(p[ii], v.x, o[ii][g].x);
                        o[ii][g].y = fmaf(p[ii], v.y, o[ii][g].y);
                        o[ii][g].z = fmaf(p[ii], v.z, o[ii][g].z);
                        o[ii][g].w = fmaf(p[ii], v.w, o[ii][g].w);
                    }
                }
            }
        }
    }

    if (a.S == 1) {
        /* the whole row is here (prefill, large batches): at_merge's arithmetic for one split, then the inverse
         * RoPE, straight to out, as at_mma_kernel does; no at_merge launch, and no partial output through memory */
        const int64_t pos = s.p0 + (row - s.row0);
        const int t0 = D - a.rd;
#pragma unroll
        for (int ii = 0; ii < 4; ii++) {
            const int h = h0 + 4 * warp + ii;
            if (h >= a.H) continue;
            const float sink = a.sink[h], m = mrun[4 * warp + ii], M = fmaxf(sink, m);
            float L = expf(sink - M), w = 0.0f;
            if (m != -INFINITY) {
                w = expf(m - M);
                L += lrun[4 * warp + ii] * w;
            }
#pragma unroll
            for (int g = 0; g < NG; g++) {
                const int c = 128 * g + 4 * lane;
                float x[4] = {w * o[ii][g].x, w * o[ii][g].y, w * o[ii][g].z, w * o[ii][g].w};
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    x[e] /= L;
                    x[e + 1] /= L;
                    if (c + e >= t0) { /* inverse RoPE: rotate the pair by -pos * theta */
                        const float ang = (float)pos * a.inv_freq[(c + e - t0) / 2];
                        const float cs = cosf(ang), sn = -sinf(ang);
                        const float y0 = x[e] * cs - x[e + 1] * sn, y1 = x[e + 1] * cs + x[e] * sn;
                        x[e] = y0;
                        x[e + 1] = y1;
                    }
                }
                *(float4 *)&a.out[((size_t)row * a.H + h) * D + c] = make_float4(x[0], x[1], x[2], x[3]);
            }
        }
        return;
    }
#pragma unroll
    for (int ii = 0; ii < 4; ii++) {
        const int h = h0 + 4 * warp + ii;
        if (h < a.H) {
            float *dst = a.po + (slot * a.H + h) * D;
#pragma unroll
            for (int g = 0; g < NG; g++) *(float4 *)&dst[128 * g + 4 * lane] = o[ii][g];
        }
    }
    /* mrun / lrun were last written before the final PV's __syncthreads */
    if (tid < HB && h0 + tid < a.H) a.ml[slot * a.H + h0 + tid] = make_float2(mrun[tid], lrun[tid]);
}

/* ---- what the tensor-core split kernels share: a warp owns 16 head rows (g = lane / 4 and g + 8) of the mma
 * accumulator layout */

/* A block's start: its job, the ring's new key, and an empty split's (-inf, 0) for the merge (with S = 1 the row is
 * finished at the end instead); false: the block has nothing more to do. */
template <int HB, int NT>
__device__ __forceinline__ bool mma_split_begin(const AtArgs &a, SplitJob &jb, int D)
{
    if (!split_job(a, jb)) return false;
    ring_put(jb.s, jb.row, a.W, D, NT);
    if (jb.t_lo >= jb.t_hi && a.S > 1) {
        const int h = jb.hg * HB + (int)threadIdx.x;
        if (threadIdx.x < HB && h < a.H) a.ml[jb.slot * a.H + h] = make_float2(-INFINITY, 0.0f);
        return false;
    }
    return true;
}

/* The online softmax over a round of NK n-tiles of 8 keys: x holds the lane's whole logit sums (x[nt][e] and
 * x[nt][2 + e]: rows g and g + 8, key 8 nt + 2 (lane % 4) + e); ok(j) says whether key j is real.  Scales and
 * masks them, updates the rows' running max (m) and sum (l), leaves the probabilities in x and the rescale of O
 * in al. */
template <int NK, typename Ok>
__device__ __forceinline__ void mma_softmax(float (&x)[NK][4], Ok ok, float scale, float &m0, float &m1, float &l0,
                                            float &l1, float &al0, float &al1)
{
    const int qq = threadIdx.x & 3;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NK; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const bool k = ok(8 * nt + 2 * qq + e);
            x[nt][e] = k ? x[nt][e] * scale : -INFINITY;
            x[nt][2 + e] = k ? x[nt][2 + e] * scale : -INFINITY;
            mx0 = fmaxf(mx0, x[nt][e]);
            mx1 = fmaxf(mx1, x[nt][2 + e]);
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    al0 = n0 == -INFINITY ? 1.0f : expf(m0 - n0);
    al1 = n1 == -INFINITY ? 1.0f : expf(m1 - n1);
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NK; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            x[nt][e] = n0 == -INFINITY ? 0.0f : expf(x[nt][e] - n0);
            x[nt][2 + e] = n1 == -INFINITY ? 0.0f : expf(x[nt][2 + e] - n1);
            ps0 += x[nt][e];
            ps1 += x[nt][2 + e];
        }
    ps0 += __shfl_xor_sync(FULL, ps0, 1);
    ps0 += __shfl_xor_sync(FULL, ps0, 2);
    ps1 += __shfl_xor_sync(FULL, ps1, 1);
    ps1 += __shfl_xor_sync(FULL, ps1, 2);
    l0 = l0 * al0 + ps0;
    l1 = l1 * al1 + ps1;
    m0 = n0;
    m1 = n1;
}

/* The end of a row's split: O of rows ha and ha + 8 over the warp's NTW n-tiles of 8 channels (chan(nt): the lane's
 * first channel of n-tile nt) with the rows' max and sum.  With one split a row (S = 1) at_merge's arithmetic for
 * it and the inverse RoPE, straight into out; else the split's partials for at_merge (po, and ml from the lanes
 * where ml_lane). */
template <int D, int NTW, typename Chan>
__device__ __forceinline__ void mma_rows_end(const AtArgs &a, const bcu_attn_seq &s, int row, size_t slot, int ha,
                                             float m0, float m1, float l0, float l1, const float (&o)[NTW][4],
                                             Chan chan, bool ml_lane)
{
    const int hb = ha + 8;
    if (a.S == 1) {
        const int64_t pos = s.p0 + (row - s.row0);
        float w[2] = {0.0f, 0.0f}, L[2] = {1.0f, 1.0f};
        const float mm[2] = {m0, m1}, ll[2] = {l0, l1};
        const int hh[2] = {ha, hb};
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (hh[r] < a.H) {
                const float sink = a.sink[hh[r]], M = fmaxf(sink, mm[r]);
                L[r] = expf(sink - M);
                if (mm[r] != -INFINITY) {
                    w[r] = expf(mm[r] - M);
                    L[r] += ll[r] * w[r];
                }
            }
        const int t0 = D - a.rd;
#pragma unroll
        for (int nt = 0; nt < NTW; nt++) {
            const int c = chan(nt);
            float cs = 1.0f, sn = 0.0f;
            if (c >= t0) {
                const float ang = (float)pos * a.inv_freq[(c - t0) / 2];
                cs = cosf(ang);
                sn = -sinf(ang);
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                if (hh[r] >= a.H) continue;
                float x0 = w[r] * o[nt][2 * r], x1 = w[r] * o[nt][2 * r + 1];
                x0 /= L[r];
                x1 /= L[r];
                if (c >= t0) {
                    const float y0 = x0 * cs - x1 * sn, y1 = x1 * cs + x0 * sn;
                    x0 = y0;
                    x1 = y1;
                }
                *(float2 *)&a.out[((size_t)row * a.H + hh[r]) * D + c] = make_float2(x0, x1);
            }
        }
        return;
    }
#pragma unroll
    for (int nt = 0; nt < NTW; nt++) {
        const int c = chan(nt);
        if (ha < a.H) *(float2 *)&a.po[(slot * a.H + ha) * D + c] = make_float2(o[nt][0], o[nt][1]);
        if (hb < a.H) *(float2 *)&a.po[(slot * a.H + hb) * D + c] = make_float2(o[nt][2], o[nt][3]);
    }
    if (ml_lane) {
        if (ha < a.H) a.ml[slot * a.H + ha] = make_float2(m0, l0);
        if (hb < a.H) a.ml[slot * a.H + hb] = make_float2(m1, l1);
    }
}

/* ---- the same split attention on bf16 tensor cores (bcu_attention_args.bf16; head_dim 512)
 *
 * Block = (row, split, group of 64 heads), 16 warps: warp w owns heads 16 (w % 4) .. + 15 of the group and
 * channels 128 (w / 4) .. + 127.  Q (64 heads x 512) sits in shared memory as bf16, and each 16-key tile as bf16
 * twice: K [key][channel] (the B operand of Q.K^T) and V^T [channel][key] (the B operand of P.V; K = V).  Per
 * tile a warp computes its heads' logits over its 128 channels (m16n8k16, 2 n-tiles x 8 k-steps), the four
 * partials of a head row are summed through shared memory in channel order (every warp of the row gets the same
 * sums), the online softmax runs in registers (row max and sum over the quad), and P goes straight from the
 * logits' accumulator layout into the A operand of P.V (its 16 channels x 8 n-tiles).  O stays in registers, 64
 * floats a thread.  The next tile's keys come in with cp.async (fp32, two staging buffers) while this tile's
 * products run.  The partials (ml, po) are at_split's, so at_merge finishes both; with one split a row (S = 1,
 * prefill) the kernel finishes the row itself. */
#define AM_HB 64   /* heads per block */
#define AM_NT 512  /* 16 warps */
#define AM_QLD 520 /* bf16 row stride of Q and K: 260 words, rows 4 banks apart (conflict-free fragment loads) */
#define AM_VLD 24  /* bf16 row stride of V^T: 12 words */
#define AM_SLD 516  /* fp32 row stride of the staged tiles: 4 banks between keys */
#define AM_SMEM                                                                                                    \
    ((size_t)(AM_HB * AM_QLD + AT_KT * AM_QLD + 512 * AM_VLD) * 2 + (size_t)16 * 32 * 8 * 4 +                       \
     (size_t)2 * AT_KT * AM_SLD * 4)

__global__ void __launch_bounds__(AM_NT, 1) at_mma_kernel(AtArgs a)
{
    pdl_enter();
    constexpr int D = 512;
    extern __shared__ float4 am_sm4[];
    uint16_t *Qs = (uint16_t *)am_sm4;         /* [AM_HB][AM_QLD] */
    uint16_t *Ks = Qs + AM_HB * AM_QLD;        /* [AT_KT][AM_QLD] */
    uint16_t *Vt = Ks + AT_KT * AM_QLD;        /* [D][AM_VLD] */
    float *Sp = (float *)(Vt + D * AM_VLD);    /* [warp][lane][8]: the logits' partials */
    float *Stg = Sp + 16 * 32 * 8;             /* [2][AT_KT][AM_SLD]: tiles in flight, fp32 */
    __shared__ const float *kpb[2][AT_KT];
    __shared__ RowKeys rs;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, mt = warp & 3, dq = warp >> 2;
    const int g = lane >> 2, qq = lane & 3;
    SplitJob jb;
    if (!mma_split_begin<AM_HB, AM_NT>(a, jb, D)) return;
    const bcu_attn_seq &s = jb.s;
    const int n = jb.n, t_lo = jb.t_lo, t_hi = jb.t_hi, row = jb.row;
    const size_t slot = jb.slot;
    const int h0 = jb.hg * AM_HB;
    const float4 *q4 = (const float4 *)(a.q + (size_t)row * a.H * D);
    for (int i = tid; i < AM_HB * D / 4; i += AM_NT) {
        const int h = i / (D / 4), c4 = i % (D / 4);
        const float4 v = h0 + h < a.H ? q4[(size_t)(h0 + h) * (D / 4) + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(uint2 *)&Qs[h * AM_QLD + 4 * c4] = make_uint2(am_pack(v.x, v.y), am_pack(v.z, v.w));
    }
    if (tid == 0) row_keys(rs, a, s, jb.cd, row, D);
    float o[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* head rows g and g + 8 of the warp's 16 */
    /* tile t's key pointers (threads < AT_KT; NULL: masked) and its copies into staging buffer t & 1 (a warp
     * takes 512 contiguous bytes of one key) */
    auto key_ptrs = [&](int t) {
        if (tid < AT_KT) kpb[t & 1][tid] = key_of(rs, a, t * AT_KT + tid, n, D); /* NULL: masked below */
    };
    auto key_copies = [&](int t) {
        float *st = Stg + (size_t)(t & 1) * AT_KT * AM_SLD;
        for (int i = tid; i < AT_KT * D / 4; i += AM_NT) {
            const int j = i / (D / 4), c4 = i % (D / 4);
            const float *p = kpb[t & 1][j];
            rd_cp16z(st + j * AM_SLD + 4 * c4, p ? p + 4 * c4 : a.q, p != NULL);
        }
    };
    __syncthreads(); /* rs */
    if (t_lo < t_hi) {
        key_ptrs(t_lo);
        __syncthreads();
        key_copies(t_lo);
    }

    for (int t = t_lo; t < t_hi; t++) {
        rd_cp_wait();
        __syncthreads(); /* tile t staged; the previous tile's K, V^T and partials are consumed */
        /* the tile as bf16: keys fastest across a warp, so the V^T stores of a warp are 32 contiguous bytes */
        const float *st = Stg + (size_t)(t & 1) * AT_KT * AM_SLD;
        for (int i = tid; i < AT_KT * D / 4; i += AM_NT) {
            const int j = i % AT_KT, c4 = i / AT_KT;
            const float4 v = *(const float4 *)(st + j * AM_SLD + 4 * c4);
            const uint32_t lo = am_pack(v.x, v.y), hi = am_pack(v.z, v.w);
            *(uint2 *)&Ks[j * AM_QLD + 4 * c4] = make_uint2(lo, hi);
            Vt[(4 * c4 + 0) * AM_VLD + j] = (uint16_t)lo;
            Vt[(4 * c4 + 1) * AM_VLD + j] = (uint16_t)(lo >> 16);
            Vt[(4 * c4 + 2) * AM_VLD + j] = (uint16_t)hi;
            Vt[(4 * c4 + 3) * AM_VLD + j] = (uint16_t)(hi >> 16);
        }
        if (t + 1 < t_hi) key_ptrs(t + 1);
        __syncthreads();
        if (t + 1 < t_hi) key_copies(t + 1); /* lands while this tile's products run */
        const float *const *kp = kpb[t & 1];
        /* this warp's part of the logits: its 16 heads x the tile's 16 keys over channels 128 dq .. + 127 */
        float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        {
            const uint16_t *qa = Qs + (16 * mt + g) * AM_QLD + 128 * dq + 2 * qq;
#pragma unroll
            for (int ks = 0; ks < 8; ks++) {
                uint32_t af[4];
                rd_afrag(af, qa + 16 * ks, AM_QLD);
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    const uint16_t *kb = Ks + (8 * nt + g) * AM_QLD + 128 * dq + 16 * ks + 2 * qq;
                    rd_mma(sc[nt], af, *(const uint32_t *)kb, *(const uint32_t *)(kb + 8));
                }
            }
        }
        float4 *sp = (float4 *)(Sp + ((size_t)warp * 32 + lane) * 8);
        sp[0] = make_float4(sc[0][0], sc[0][1], sc[0][2], sc[0][3]);
        sp[1] = make_float4(sc[1][0], sc[1][1], sc[1][2], sc[1][3]);
        __syncthreads();
        /* the whole logits of the warp's rows: the four channel quarters' partials in order */
        float x[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 *pp = (const float4 *)(Sp + ((size_t)(mt + 4 * k) * 32 + lane) * 8);
            const float4 u0 = pp[0], u1 = pp[1];
            x[0][0] += u0.x; x[0][1] += u0.y; x[0][2] += u0.z; x[0][3] += u0.w;
            x[1][0] += u1.x; x[1][1] += u1.y; x[1][2] += u1.z; x[1][3] += u1.w;
        }
        float al0, al1;
        mma_softmax(x, [&](int j) { return t * AT_KT + j < n && kp[j] != NULL; }, a.scale, m0, m1, l0, l1, al0, al1);
        uint32_t pf[4];
        pf[0] = am_pack(x[0][0], x[0][1]);
        pf[1] = am_pack(x[0][2], x[0][3]);
        pf[2] = am_pack(x[1][0], x[1][1]);
        pf[3] = am_pack(x[1][2], x[1][3]);
        const uint16_t *vb = Vt + (128 * dq + g) * AM_VLD + 2 * qq;
#pragma unroll
        for (int nt = 0; nt < 16; nt++) {
            o[nt][0] *= al0;
            o[nt][1] *= al0;
            o[nt][2] *= al1;
            o[nt][3] *= al1;
            const uint16_t *v = vb + 8 * nt * AM_VLD;
            rd_mma(o[nt], pf, *(const uint32_t *)v, *(const uint32_t *)(v + 8));
        }
    }
    /* channels 128 dq .. + 127 of rows h0 + 16 mt + g and + 8 */
    mma_rows_end<D>(a, s, row, slot, h0 + 16 * mt + g, m0, m1, l0, l1, o,
                    [&](int nt) { return 128 * dq + 8 * nt + 2 * qq; }, dq == 0 && qq == 0);
}

/* ---- the same split attention on bf16 tensor cores at fp32's accuracy (bcu_attention_args.x3; rope_dim 64)
 *
 * Official semantics rounds the first D - 64 channels of every key (window keys and compressed entries) to FP8: a
 * power-of-two scale times an e4m3 code, exact in bf16.  There the keys need no rounding: q and p go to the tensor
 * cores as three bf16 planes each (rd_split3: hi + mid + lo is the fp32 value), against the keys' one plane.  The
 * 64 RoPE channels are fp32 in the keys as well, so there the keys take three planes too, and q.k and p.v take the
 * six products down to 2^-24 of the largest (hi.hi; hi.mid, mid.hi; hi.lo, mid.mid, lo.hi).  Every product
 * at_split_kernel forms is formed (the RoPE channels' to 2^-24) and summed in fp32: at_split's output up to the
 * order of the sums.  About 3.4x at_mma's tensor-core work.  Two things keep the sums at fp32's accuracy: q.k's
 * products go into three accumulators by size, and each tile's p.v into an accumulator of its own that is added to
 * O by an fma (the tensor cores' additions round toward zero: the 3-6 of them a tile, straight into O, biased a
 * 1,144-key row's output by 1e-5).
 *
 * Block = (row, split, group of 32 heads), 8 warps, one block an SM (the Q planes take 100 KB): warp w owns heads
 * 16 (w & 1) .. + 15 of the group and a quarter of the channels, (D - 64) / 4 exact ones from (D - 64) / 4 (w >> 1)
 * and the RoPE channels D - 64 + 16 (w >> 1) .. + 15, so every warp has the same products to do.  Per round of R
 * 16-key tiles (the split's tiles, a round past its last one masked): the staged fp32 keys become the bf16 key tile
 * (and the RoPE channels' mid / lo planes); the fragments come by ldmatrix, p.v's B operand transposed from the
 * same key tile (V = K); the four channel quarters' partial logits are summed through shared memory in one order;
 * the online softmax runs in registers; P goes from the logits' accumulators into the A operand of p.v; O stays in
 * registers; the next round's keys land (cp.async) while this one's products run.  The partials (ml, po) are at_split's for at_merge, or with one split the block finishes
 * its rows. */
#define AX_HB 32  /* heads per block */
#define AX_NT 256 /* 8 warps */
#define AX_RD 64  /* the RoPE channels (rope_dim) */
template <int D, int R> struct AxLayout { /* R: 16-key tiles a round */
    static constexpr int QLD = D + 8;     /* bf16 row stride of the Q planes and the key tile: ldmatrix rows 16 B apart
                                             in the banks */
    static constexpr int RLD = AX_RD + 8; /* of the keys' RoPE mid / lo planes */
    static constexpr int SLD = D + 4;     /* fp32 row stride of the staged round */
    static constexpr size_t SMEM = (size_t)(3 * AX_HB * QLD + R * AT_KT * QLD + 2 * R * AT_KT * RLD) * 2 +
                                   (size_t)8 * 32 * 8 * R * 4 + (size_t)R * AT_KT * SLD * 4;
};

/* plane p of two floats' three-plane splits as a bf16 pair (lo in the low half) */
__device__ __forceinline__ void ax_split2(float lo, float hi, uint32_t out[3])
{
    uint32_t a[3], b[3];
    rd_split3(lo, a);
    rd_split3(hi, b);
#pragma unroll
    for (int p = 0; p < 3; p++) out[p] = a[p] | b[p] << 16;
}

template <int D, int R>
__global__ void __launch_bounds__(AX_NT, 1) at_x3_kernel(AtArgs a)
{
    pdl_enter();
    typedef AxLayout<D, R> L;
    constexpr int E = D - AX_RD;  /* the exact channels */
    constexpr int EW = E / 4;     /* a warp's exact channels */
    constexpr int KE = EW / 16;   /* its exact k-steps of q.k */
    constexpr int NE = EW / 8;    /* its exact n-tiles of p.v (an even number) */
    constexpr int NTW = NE + 2;   /* its n-tiles: the exact ones, then its 16 RoPE channels */
    constexpr int KR = AT_KT * R; /* keys a round: R tiles */
    constexpr int NK = 2 * R;     /* the round's n-tiles of 8 keys in q.k */
    constexpr int QP = AX_HB * L::QLD, QLD = L::QLD, RLD = L::RLD, RP = KR * RLD;
    static_assert(E % 64 == 0 && NTW * 8 * 4 == D, "a warp takes a quarter of the exact and of the RoPE channels");
    extern __shared__ float4 ax_sm4[];
    uint16_t *Qs = (uint16_t *)ax_sm4;        /* [3][AX_HB][QLD]: q's hi, mid, lo planes */
    uint16_t *Ks = Qs + 3 * QP;               /* [KR][QLD]: the keys' hi plane (all of an exact channel) */
    uint16_t *Kr = Ks + KR * QLD;             /* [2][KR][RLD]: the RoPE channels' mid, lo planes */
    float *Sp = (float *)(Kr + 2 * RP);       /* [warp][lane][4 NK]: the logits' partials */
    float *Stg = Sp + 8 * 32 * 4 * NK;        /* [KR][SLD]: the next round in flight, fp32 */
    __shared__ const float *kpb[2][KR];
    __shared__ RowKeys rs;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, mt = warp & 1, dq = warp >> 1;
    const int g = lane >> 2, qq = lane & 3;
    SplitJob jb;
    if (!mma_split_begin<AX_HB, AX_NT>(a, jb, D)) return;
    const bcu_attn_seq &s = jb.s;
    const int n = jb.n, t_lo = jb.t_lo, t_hi = jb.t_hi, row = jb.row;
    const size_t slot = jb.slot;
    const int h0 = jb.hg * AX_HB;
    if (tid == 0) row_keys(rs, a, s, jb.cd, row, D);
    /* the lanes' ldmatrix rows: A (q, 16 heads x 16 channels), B of q.k (2 x 8 keys x 16 channels), B of p.v
     * (transposed: 16 keys x 2 x 8 channels) */
    const uint16_t *qrow = Qs + (16 * mt + (lane & 7) + ((lane >> 3) & 1) * 8) * QLD + (lane >> 4) * 8;
    const int kr_ = (lane & 7) + (lane >> 4) * 8, kc_ = ((lane >> 3) & 1) * 8;
    const uint16_t *kb = Ks + kr_ * QLD + kc_, *kbr = Kr + kr_ * RLD + kc_;
    const int vr_ = (lane & 7) + ((lane >> 3) & 1) * 8, vc_ = (lane >> 4) * 8;
    const uint16_t *vb = Ks + vr_ * QLD + vc_, *vbr = Kr + vr_ * RLD + vc_;
    float o[NTW][4];
#pragma unroll
    for (int i = 0; i < NTW; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* head rows g and g + 8 of the warp's 16 */
    /* round u (tiles t_lo + R u ..): its key pointers (threads < KR; NULL: masked, past the split too) and copies */
    auto key_ptrs = [&](int u) {
        const int t = t_lo + R * u;
        if (tid < KR) kpb[u & 1][tid] = t + tid / AT_KT < t_hi ? key_of(rs, a, t * AT_KT + tid, n, D) : NULL;
    };
    auto key_copies = [&](int u) {
        for (int i = tid; i < KR * D / 4; i += AX_NT) {
            const int j = i / (D / 4), c4 = i % (D / 4);
            const float *p = kpb[u & 1][j];
            rd_cp16z(Stg + j * L::SLD + 4 * c4, p ? p + 4 * c4 : a.q, p != NULL);
        }
    };
    const int nr = (t_hi - t_lo + R - 1) / R;
    __syncthreads(); /* rs */
    if (nr > 0) {
        key_ptrs(0);
        __syncthreads();
        key_copies(0);
    }
    /* q's planes while the first round lands (its barrier covers them) */
    const float4 *q4 = (const float4 *)(a.q + (size_t)row * a.H * D);
    for (int i = tid; i < AX_HB * D / 4; i += AX_NT) {
        const int h = i / (D / 4), c4 = i % (D / 4);
        const float4 v = h0 + h < a.H ? q4[(size_t)(h0 + h) * (D / 4) + c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        uint32_t lo[3], hi[3];
        ax_split2(v.x, v.y, lo);
        ax_split2(v.z, v.w, hi);
#pragma unroll
        for (int p = 0; p < 3; p++) *(uint2 *)&Qs[p * QP + h * QLD + 4 * c4] = make_uint2(lo[p], hi[p]);
    }

    for (int u = 0; u < nr; u++) {
        rd_cp_wait();
        __syncthreads(); /* round u staged; the previous round's key planes and partials are consumed */
        /* the round's planes: the exact channels rounded (exact: bf16 values), the RoPE channels split */
        for (int i = tid; i < KR * (E / 4); i += AX_NT) {
            const int j = i / (E / 4), c4 = i % (E / 4);
            const float4 v = *(const float4 *)(Stg + j * L::SLD + 4 * c4);
            *(uint2 *)&Ks[j * QLD + 4 * c4] = make_uint2(am_pack(v.x, v.y), am_pack(v.z, v.w));
        }
        for (int i = tid; i < KR * (AX_RD / 4); i += AX_NT) {
            const int j = i / (AX_RD / 4), c4 = i % (AX_RD / 4);
            const float4 v = *(const float4 *)(Stg + j * L::SLD + E + 4 * c4);
            uint32_t lo[3], hi[3];
            ax_split2(v.x, v.y, lo);
            ax_split2(v.z, v.w, hi);
            *(uint2 *)&Ks[j * QLD + E + 4 * c4] = make_uint2(lo[0], hi[0]);
            *(uint2 *)&Kr[j * RLD + 4 * c4] = make_uint2(lo[1], hi[1]);
            *(uint2 *)&Kr[RP + j * RLD + 4 * c4] = make_uint2(lo[2], hi[2]);
        }
        if (u + 1 < nr) key_ptrs(u + 1);
        __syncthreads();
        if (u + 1 < nr) key_copies(u + 1); /* into the staging just read: lands while this round's products run */
        const float *const *kp = kpb[u & 1];
        /* this warp's part of the logits: its 16 heads x the round's keys over its channels, the products by size
         * (hi.hi; the mid terms; the lo terms) in three accumulators */
        float sh[NK][4], sm[NK][4], sl[NK][4];
#pragma unroll
        for (int nt = 0; nt < NK; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) sh[nt][e] = sm[nt][e] = sl[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks <= KE; ks++) {
            const int k0 = ks < KE ? EW * dq + 16 * ks : E + 16 * dq; /* the last step: the RoPE channels */
            uint32_t a0[4], a1[4], a2[4];
            ldsm_x4(a0, qrow + k0);
            ldsm_x4(a1, qrow + QP + k0);
            ldsm_x4(a2, qrow + 2 * QP + k0);
#pragma unroll
            for (int h16 = 0; h16 < R; h16++) { /* keys 16 h16 .. + 15: n-tiles 2 h16, 2 h16 + 1 */
                uint32_t b[4];
                ldsm_x4(b, kb + 16 * h16 * QLD + k0);
                float(*zh)[4] = sh + 2 * h16, (*zm)[4] = sm + 2 * h16, (*zl)[4] = sl + 2 * h16;
                if (ks < KE) {
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        rd_mma(zh[nt], a0, b[2 * nt], b[2 * nt + 1]);
                        rd_mma(zm[nt], a1, b[2 * nt], b[2 * nt + 1]);
                        rd_mma(zl[nt], a2, b[2 * nt], b[2 * nt + 1]);
                    }
                } else {
                    uint32_t bm[4], bl[4];
                    ldsm_x4(bm, kbr + 16 * h16 * RLD + 16 * dq);
                    ldsm_x4(bl, kbr + RP + 16 * h16 * RLD + 16 * dq);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        rd_mma(zh[nt], a0, b[2 * nt], b[2 * nt + 1]);
                        rd_mma(zm[nt], a0, bm[2 * nt], bm[2 * nt + 1]);
                        rd_mma(zm[nt], a1, b[2 * nt], b[2 * nt + 1]);
                        rd_mma(zl[nt], a0, bl[2 * nt], bl[2 * nt + 1]);
                        rd_mma(zl[nt], a1, bm[2 * nt], bm[2 * nt + 1]);
                        rd_mma(zl[nt], a2, b[2 * nt], b[2 * nt + 1]);
                    }
                }
            }
        }
        float4 *sp = (float4 *)(Sp + ((size_t)warp * 32 + lane) * 4 * NK);
#pragma unroll
        for (int nt = 0; nt < NK; nt++)
            sp[nt] = make_float4(sh[nt][0] + (sm[nt][0] + sl[nt][0]), sh[nt][1] + (sm[nt][1] + sl[nt][1]),
                                 sh[nt][2] + (sm[nt][2] + sl[nt][2]), sh[nt][3] + (sm[nt][3] + sl[nt][3]));
        __syncthreads();
        /* the whole logits of the warp's rows: the four channel quarters' partials in order */
        float x[NK][4];
#pragma unroll
        for (int nt = 0; nt < NK; nt++) x[nt][0] = x[nt][1] = x[nt][2] = x[nt][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float4 *pp = (const float4 *)(Sp + ((size_t)(mt + 2 * k) * 32 + lane) * 4 * NK);
#pragma unroll
            for (int nt = 0; nt < NK; nt++) {
                const float4 w = pp[nt];
                x[nt][0] += w.x; x[nt][1] += w.y; x[nt][2] += w.z; x[nt][3] += w.w;
            }
        }
        float al0, al1; /* kp[j]: NULL past n and past the split */
        mma_softmax(x, [&](int j) { return kp[j] != NULL; }, a.scale, m0, m1, l0, l1, al0, al1);
        /* P's three planes in the A operand's layout (as at_mma_kernel's one), a k-step of 16 keys each */
        uint32_t pf[R][3][4];
#pragma unroll
        for (int h16 = 0; h16 < R; h16++) {
            uint32_t w[3];
#pragma unroll
            for (int r4 = 0; r4 < 4; r4++) {
                const float *xn = x[2 * h16 + (r4 >> 1)];
                ax_split2(xn[2 * (r4 & 1)], xn[2 * (r4 & 1) + 1], w);
                pf[h16][0][r4] = w[0], pf[h16][1][r4] = w[1], pf[h16][2][r4] = w[2];
            }
        }
        /* p.v by pairs of n-tiles (one transposed ldmatrix a k-step), the small products first, into the round's
         * own accumulators */
#pragma unroll
        for (int pr = 0; pr < NTW / 2; pr++) {
            float pv[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int h16 = 0; h16 < R; h16++) {
                uint32_t b[4];
                const uint32_t(*pk)[4] = pf[h16];
                if (pr < NE / 2) {
                    ldsm_x4_t(b, vb + 16 * h16 * QLD + EW * dq + 16 * pr);
#pragma unroll
                    for (int p = 2; p >= 0; p--)
#pragma unroll
                        for (int v = 0; v < 2; v++) rd_mma(pv[v], pk[p], b[2 * v], b[2 * v + 1]);
                } else {
                    uint32_t bm[4], bl[4];
                    ldsm_x4_t(b, vb + 16 * h16 * QLD + E + 16 * dq);
                    ldsm_x4_t(bm, vbr + 16 * h16 * RLD + 16 * dq);
                    ldsm_x4_t(bl, vbr + RP + 16 * h16 * RLD + 16 * dq);
#pragma unroll
                    for (int v = 0; v < 2; v++) {
                        rd_mma(pv[v], pk[0], bl[2 * v], bl[2 * v + 1]);
                        rd_mma(pv[v], pk[1], bm[2 * v], bm[2 * v + 1]);
                        rd_mma(pv[v], pk[2], b[2 * v], b[2 * v + 1]);
                    }
#pragma unroll
                    for (int v = 0; v < 2; v++) {
                        rd_mma(pv[v], pk[0], bm[2 * v], bm[2 * v + 1]);
                        rd_mma(pv[v], pk[1], b[2 * v], b[2 * v + 1]);
                    }
#pragma unroll
                    for (int v = 0; v < 2; v++) rd_mma(pv[v], pk[0], b[2 * v], b[2 * v + 1]);
                }
            }
#pragma unroll
            for (int v = 0; v < 2; v++) {
                float *on = o[2 * pr + v];
                on[0] = fmaf(on[0], al0, pv[v][0]);
                on[1] = fmaf(on[1], al0, pv[v][1]);
                on[2] = fmaf(on[2], al1, pv[v][2]);
                on[3] = fmaf(on[3], al1, pv[v][3]);
            }
        }
    }
    /* n-tile nt's first channel of this lane: the exact ones, then the RoPE ones */
    mma_rows_end<D>(a, s, row, slot, h0 + 16 * mt + g, m0, m1, l0, l1, o,
                    [&](int nt) { return (nt < NE ? EW * dq + 8 * nt : E + 16 * dq + 8 * (nt - NE)) + 2 * qq; },
                    dq == 0 && qq == 0);
}

struct MgArgs {
    const bcu_attn_seq *seqs;
    int nseq;
    const float *sink, *inv_freq;
    int H, D, rd, S;
    const float2 *ml;
    const float *po;
    float *out;
};

/* block (head, row), thread i = channel pair 2i, 2i+1.  The splits' (max, sum) pairs come into shared memory in
 * one round of loads (S of them, dynamic shared memory), then the partial outputs in rounds of MG_U independent
 * loads; the sums run in split order as they always did (a loop of dependent loads per split cost 8-12 us at batch
 * 1, where S is 8-132). */
#define MG_U 16
__global__ void at_merge_kernel(MgArgs a)
{
    const int h = blockIdx.x, row = blockIdx.y, i = threadIdx.x;
    const int t0 = a.D - a.rd;
    /* the sink and the pair's RoPE frequency, asked for before the wait (constants: no kernel writes them) */
    const float sink = a.sink[h], fr = 2 * i >= t0 ? a.inv_freq[(2 * i - t0) / 2] : 0.0f;
    pdl_enter();
    extern __shared__ float2 mg_ml[]; /* [S + MG_U]: the pairs, then MG_U of (-inf, 0) */
    const size_t base = (size_t)row * a.S;
    /* the first MG_U splits' partial outputs, asked for with the pairs and the row's sequence: one round trip (an
     * empty split's slot is read but not used) */
    float2 p0[MG_U];
#pragma unroll
    for (int u = 0; u < MG_U; u++)
        p0[u] = u < a.S ? *(const float2 *)&a.po[((base + u) * a.H + h) * a.D + 2 * i] : make_float2(0.0f, 0.0f);
    for (int sp = i; sp < a.S; sp += (int)blockDim.x) mg_ml[sp] = a.ml[(base + sp) * a.H + h];
    bcu_attn_seq s;
    if (!load_row(a.seqs, a.nseq, row, &s, NULL)) return;
    const int64_t pos = s.p0 + (row - s.row0);
    /* the pad: nvcc merges the unrolled loops' guarded reads of neighbouring pairs into wider shared loads that
     * may reach past pair S - 1 (compute-sanitizer memcheck: invalid 12-byte __shared__ reads); they land here */
    for (int sp = i; sp < MG_U; sp += (int)blockDim.x) mg_ml[a.S + sp] = make_float2(-INFINITY, 0.0f);
    __syncthreads();
    float M = sink;
    for (int sp = 0; sp < a.S; sp++) M = fmaxf(M, mg_ml[sp].x);
    float L = expf(sink - M), o0 = 0.0f, o1 = 0.0f;
    for (int c = 0; c < a.S; c += MG_U) {
        float2 p[MG_U];
#pragma unroll
        for (int u = 0; u < MG_U; u++) {
            const int sp = c + u;
            p[u] = c == 0 ? p0[u]
                   : sp < a.S && mg_ml[sp].x != -INFINITY
                       ? *(const float2 *)&a.po[((base + sp) * a.H + h) * a.D + 2 * i]
                       : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < MG_U; u++) {
            const int sp = c + u;
            if (sp >= a.S) break;
            const float2 v = mg_ml[sp];
            if (v.x == -INFINITY) continue;
            const float w = expf(v.x - M);
            L += v.y * w;
            o0 = fmaf(w, p[u].x, o0);
            o1 = fmaf(w, p[u].y, o1);
        }
    }
    o0 /= L;
    o1 /= L;
    if (2 * i >= t0) { /* inverse RoPE: rotate the pair by -pos * theta */
        const float ang = (float)pos * fr;
        const float c = cosf(ang), sn = -sinf(ang);
        const float x0 = o0, x1 = o1;
        o0 = x0 * c - x1 * sn;
        o1 = x1 * c + x0 * sn;
    }
    *(float2 *)&a.out[((size_t)row * a.H + h) * a.D + 2 * i] = make_float2(o0, o1);
}

/* at_split_kernel's warps a block when the caller leaves it open: AT_NW_FEW where AT_NW's head groups times the
 * longest row's tiles would not give every SM a block (a decode step: a SWA row's 128 window keys are 8 tiles, and
 * 64 heads in groups of 32 made 16 blocks, each summing 32 heads x 16 keys x 512 channels twice on 8 warps);
 * DEEPINFER_CUDA_ATTN_NW (2 or 8, read once) forces one */
static int at_warps(int ntok, int H, int64_t tiles)
{
    static std::atomic<int> env(-1);
    int v = env.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("DEEPINFER_CUDA_ATTN_NW");
        v = e && (atoi(e) == AT_NW || atoi(e) == AT_NW_FEW) ? atoi(e) : 0;
        env.store(v, std::memory_order_relaxed);
    }
    if (v) return v;
    const int64_t groups = (int64_t)ntok * ((H + 4 * AT_NW - 1) / (4 * AT_NW));
    return groups * tiles < (int64_t)bcu_sm_count() ? AT_NW_FEW : AT_NW;
}

template <int NG, int NW>
static cudaError_t launch_split(const AtArgs &aa, int ntok, cudaStream_t st)
{
    constexpr int D = 128 * NG, HB = 4 * NW;
    const size_t smem = (size_t)(HB * D + AT_KT * D + 2 * HB * AT_KT + 3 * HB) * sizeof(float);
    cudaError_t r = opt_in_smem(at_split_kernel<NG, NW>, NW == AT_NW ? NG : 16 + NG, smem);
    if (r != cudaSuccess) return r;
    pdl_launch(at_split_kernel<NG, NW>, dim3((unsigned)(aa.S * aa.HG), (unsigned)ntok), 32 * NW, smem, st, aa);
    return cudaGetLastError();
}

/* rounds of AX_R = 2 16-key tiles: on the H200's V4-Flash slice one tile a round was 1-4% slower in each layer's
 * attention (the 16K prefill's CSA layer 74.1 against 70.8 ms) */
#define AX_R 2
template <int D>
static cudaError_t launch_x3(const AtArgs &aa, int ntok, cudaStream_t st)
{
    const size_t smem = AxLayout<D, AX_R>::SMEM;
    cudaError_t r = opt_in_smem(at_x3_kernel<D, AX_R>, 21 + D / 128, smem); /* bits 22-25 */
    if (r != cudaSuccess) return r;
    pdl_launch(at_x3_kernel<D, AX_R>, dim3((unsigned)(aa.S * aa.HG), (unsigned)ntok), AX_NT, smem, st, aa);
    return cudaGetLastError();
}

static std::atomic<size_t> at_launch_x3, at_launch_other;
extern "C" void bcu_attention_launches(size_t *x3, size_t *other)
{
    *x3 = at_launch_x3.load();
    *other = at_launch_other.load();
}

template <int NW>
static cudaError_t launch_split_nw(const AtArgs &aa, int ntok, int D, cudaStream_t st)
{
    switch (D / 128) {
    case 1: return launch_split<1, NW>(aa, ntok, st);
    case 2: return launch_split<2, NW>(aa, ntok, st);
    case 3: return launch_split<3, NW>(aa, ntok, st);
    default: return launch_split<4, NW>(aa, ntok, st);
    }
}

extern "C" cudaError_t bcu_attention(const bcu_attn_ws *ws, const bcu_attn_batch *b, const bcu_attention_args *a,
                                     cudaStream_t st, char *err, size_t errlen)
{
    const bcu_attn_limits *l = &ws->lim;
    if (!ws->mem) return bad(err, errlen, "attention: no workspace");
    if (a->n_heads != l->n_heads || a->head_dim != l->head_dim)
        return bad(err, errlen, "attention: %d heads x %d, the workspace was sized for %d x %d", a->n_heads,
                   a->head_dim, l->n_heads, l->head_dim);
    const int D = a->head_dim;
    if (D % 128 || D < 128 || D > 512)
        return bad(err, errlen, "attention: head_dim %d (128, 256, 384 or 512 supported)", D);
    if (a->n_heads < 1) return bad(err, errlen, "attention: %d heads", a->n_heads);
    if (a->rope_dim < 0 || a->rope_dim % 2 || a->rope_dim > D)
        return bad(err, errlen, "attention: rope_dim %d with head_dim %d", a->rope_dim, D);
    if (a->window < 1) return bad(err, errlen, "attention: window %d", a->window);
    if (a->ratio < 0 || (a->ratio && BLOCK_TOKENS % a->ratio))
        return bad(err, errlen, "attention: ratio %d does not divide the %d-token block", a->ratio, BLOCK_TOKENS);
    if (a->ratio && a->csa && (!a->sel || !a->nsel || a->topk < 1))
        return bad(err, errlen, "attention: a CSA layer needs sel, nsel and topk");
    if (a->ent_off % 4) return bad(err, errlen, "attention: ent_off %zu is not a multiple of 4 floats", a->ent_off);
    if (b->ntok < 0 || b->ntok > l->max_rows || b->ntok > 65535)
        return bad(err, errlen, "attention: %d rows, the workspace holds %d", b->ntok, l->max_rows);
    if (b->nseq < 1 || !b->seqs || !a->q || !a->sink || !a->out || (a->rope_dim && !a->inv_freq))
        return bad(err, errlen, "attention: missing argument");
    if (b->ntok == 0) return cudaSuccess;
    const ws_layout w = layout_of(l);
    char *base = (char *)ws->mem;

    AtArgs aa;
    aa.seqs = b->seqs;
    aa.nseq = b->nseq;
    aa.q = a->q;
    aa.sel = a->sel;
    aa.nsel = a->nsel;
    aa.topk = a->topk;
    aa.H = a->n_heads;
    aa.W = a->window;
    aa.ratio = a->ratio;
    aa.csa = a->ratio && a->csa;
    aa.epb = a->ratio ? BLOCK_TOKENS / a->ratio : 1;
    aa.ent_off = a->ent_off;
    aa.scale = 1.0f / sqrtf((float)D); /* as v4.c */
    const int mma = a->bf16 && D == 512;
    /* x3 = 1: where its 32-head blocks, one a row, fill half the SMs or more (H200, V4-Flash slice, each layer's
     * time: 2-6% faster from batch 64 on, the same at batches 8-32, 1-3% slower at batch 1, where the fp32 kernel's
     * 8-head blocks split the rows over more SMs); 2: always */
    const int x3 = !mma && a->x3 && a->rope_dim == AX_RD &&
                   (a->x3 == 2 || 2 * (int64_t)b->ntok * ((a->n_heads + AX_HB - 1) / AX_HB) >= bcu_sm_count());
    if (a->warps && a->warps != AT_NW && a->warps != AT_NW_FEW)
        return bad(err, errlen, "attention: %d warps a block (%d or %d)", a->warps, AT_NW_FEW, AT_NW);
    /* splits: enough blocks for two per SM, never more than the longest row has tiles */
    int64_t len = b->max_len > 0 ? b->max_len : 1;
    int64_t maxc = (len < a->window ? len : a->window);
    if (a->ratio) {
        const int64_t vis = len / a->ratio;
        maxc += a->csa ? (vis < a->topk ? vis : a->topk) : vis;
    }
    const int64_t tiles = (maxc + AT_KT - 1) / AT_KT;
    const int nw = a->warps ? a->warps : at_warps(b->ntok, a->n_heads, tiles);
    const int hb = mma ? AM_HB : x3 ? AX_HB : 4 * nw;
    aa.HG = (a->n_heads + hb - 1) / hb;
    aa.ml = (float2 *)(base + w.ml);
    aa.po = (float *)(base + w.po);
    aa.flags = (int *)(base + w.flags);
    aa.sink = a->sink;
    aa.inv_freq = a->inv_freq;
    aa.rd = a->rope_dim;
    aa.out = a->out;
    /* (the fp32 kernel's splits follow its 8-warp head groups whatever its shape: each head's sums then meet in the
     * same order, the same bits with 2 warps a block) */
    const int64_t per = (int64_t)b->ntok * (mma || x3 ? aa.HG : (a->n_heads + 4 * AT_NW - 1) / (4 * AT_NW));
    int64_t S = ((mma || x3 ? 1 : 2) * (int64_t)bcu_sm_count() + per - 1) / per;
    if (S > tiles) S = tiles;
    if (S > w.slots / b->ntok) S = w.slots / b->ntok;
    if (S < 1) S = 1;
    if (S * aa.HG > 0x7fffffff) return bad(err, errlen, "attention: grid too large");
    aa.S = (int)S;

    cudaError_t r;
    if (mma) {
        r = opt_in_smem(at_mma_kernel, 8, AM_SMEM);
        if (r == cudaSuccess) {
            pdl_launch(at_mma_kernel, dim3((unsigned)(aa.S * aa.HG), (unsigned)b->ntok), AM_NT, AM_SMEM, st, aa);
            r = cudaGetLastError();
        }
    } else if (x3) {
        switch (D / 128) {
        case 1: r = launch_x3<128>(aa, b->ntok, st); break;
        case 2: r = launch_x3<256>(aa, b->ntok, st); break;
        case 3: r = launch_x3<384>(aa, b->ntok, st); break;
        default: r = launch_x3<512>(aa, b->ntok, st); break;
        }
        at_launch_x3++;
    } else {
        r = nw == AT_NW ? launch_split_nw<AT_NW>(aa, b->ntok, D, st) : launch_split_nw<AT_NW_FEW>(aa, b->ntok, D, st);
    }
    if (!x3) at_launch_other++;
    if (r != cudaSuccess) return r;
    if (aa.S == 1) return cudaSuccess; /* the split kernel finished the rows */

    MgArgs ma;
    ma.seqs = b->seqs;
    ma.nseq = b->nseq;
    ma.sink = a->sink;
    ma.inv_freq = a->inv_freq;
    ma.H = a->n_heads;
    ma.D = D;
    ma.rd = a->rope_dim;
    ma.S = aa.S;
    ma.ml = aa.ml;
    ma.po = aa.po;
    ma.out = a->out;
    const size_t msm = (size_t)(aa.S + MG_U) * sizeof(float2); /* S <= 2 x the SM count (above): a few KB */
    pdl_launch(at_merge_kernel, dim3((unsigned)a->n_heads, (unsigned)b->ntok), (unsigned)(D / 2), msm, st, ma);
    return cudaGetLastError();
}
