/* chain.cu - a chain of dependent batch-1 FP8 GEMVs, as one launch a step or as one persistent launch.
 *
 * The question it answers (docs/CUDA.md, "A persistent chain of GEMVs"): a batch-1 decode layer is ~30 dependent
 * kernels, and a kernel that only streams a 4 MB weight takes ~4.3 us where the bandwidth floor is ~0.9.  Does one
 * persistent kernel whose blocks pass the chain's steps on through counters in global memory, and stream the next
 * steps' weights while they wait, get nearer the floor than a launch a step with programmatic dependent launch
 * (PDL: the next kernel's first weight loads before its wait)?  Both modes run the same code on the same data and
 * give the same bits; only the boundaries between steps differ.
 *
 * A step: y [n] = W [n, K] . x [K], W e4m3 codes with ue8m0 scales over 128 x 128 blocks, x fp32, sums in fp32.
 * G = SM-count blocks of 16 warps; global warp gw of GW = 16 G takes rows [n gw / GW, n (gw + 1) / GW) of every
 * step, whole.  A lane's part of a row is 16 bytes of each 512-byte segment.  Its pieces of the whole chain, step
 * after step, are one stream, copied by cp.async into the lane's own ring of CH_PD slots in shared memory (with
 * the word of the segment's four weight scales), CH_PD pieces ahead of the one it sums, across step boundaries: no
 * barrier between the lanes while they stream, and while a block waits for the step before to finish, its lanes'
 * next weights are already on their way.
 *
 * The sums, in either mode: a piece's 16 products in four chains of four (ch_dot16), added (c0 + c1) + (c2 + c3);
 * times its scale into the lane's fmaf chain over the row's segments in order; the warp's 32 lanes by a butterfly.
 * x is staged in shared memory once a step, after its input is complete.
 *
 * Persistent (modes 1 and 2): one cooperative launch (every block waits on every other, so all must be resident).
 * After step i a block's thread 0, after a barrier (so cumulative over the block's y stores), signals at gpu scope
 * with release: mode 1 adds 1 to cnt[i] and warp 0's lane 0 of every block polls it (acquire) until epoch G; mode
 * 2 stores epoch in flag[i][b] and warp 0 of every block polls all G flags.  epoch is the launch's number in its
 * mode (gen, read by every block at its start, set by block 0 once the last step is done everywhere), so nothing
 * is reset between launches and a CUDA graph replays them.  A launch a step (mode 0): the same code over one step a
 * kernel, the lanes' first pieces issued before the PDL wait.  Every block stamps the globaltimer at its start
 * and at the end of each step (no atomic on the path being timed); block 0 also stamps its way through a step.
 * Measured on the H200 (bench_gpu_chain, docs/BENCHMARKS.md): a step with no weight to speak of costs 2.7 us with
 * a counter, 4.2 with flags, 3.3 a launch a step, 3.0 on the backend's row-dots; on one V4-Flash layer's five
 * critical row-dots the counter is 18% faster than a launch a step with the same code, and this code's FMA sums
 * are slower than the backend's tensor-core GEMV on the 32 MB weights. */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mma_frag.cuh"
#include "pdl.cuh"
#include "sm_count.cuh"

#include "chain.h"

#define CH_THREADS 512
#define CH_WARPS (CH_THREADS / 32)
#define CH_PD 16 /* 16-byte pieces in flight a lane: 128 KB of weights an SM */
#define CH_SMEM ((size_t)CH_PD * CH_THREADS * 20 + (size_t)BCU_CHAIN_KMAX * 4)

struct ChStep {
    const uint8_t *w, *s;
    const float *x;
    float *y;
    int n, K;
};

struct ChArgs {
    const ChStep *st;
    int nsteps, first, last; /* steps [first, last) of the chain in this launch */
    unsigned *cnt;          /* [nsteps]: blocks done with each step (mode 1), never reset */
    unsigned *flag;         /* [nsteps][G]: the launch count once block b is done with step i (mode 2) */
    unsigned *gen;          /* [2]: launches completed in mode 1, in mode 2 */
    unsigned long long *t0; /* [G]: each block's globaltimer at its start (launches of step 0) */
    unsigned long long *tp; /* [nsteps][G]: each block's globaltimer when it was done with step i */
    unsigned long long *tb; /* [nsteps][4], modes 1 and 2: block 0's globaltimer when it saw step i - 1 complete,
                               had x staged, had its rows summed, had its count or flag out */
    int persistent;         /* 0 a launch a step, 1 one counter a step, 2 a flag a block and step */
};

__device__ __forceinline__ unsigned long long ch_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned ch_ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* the rows [r, rb) of step i that global warp gw of GW takes, and where its next 512-byte segment is */
struct ChCur {
    int i, row, rb, seg, nseg;
};
/* the first warp-nonempty step from i on (c.i == last: none) */
__device__ __forceinline__ void ch_cur_at(const ChArgs &a, ChCur &c, int i, int gw, int GW)
{
    for (c.i = i; c.i < a.last; c.i++) {
        const int n = a.st[c.i].n;
        c.row = (int)((int64_t)n * gw / GW);
        c.rb = (int)((int64_t)n * (gw + 1) / GW);
        c.seg = 0;
        c.nseg = a.st[c.i].K / 512;
        if (c.row < c.rb) return;
    }
}
__device__ __forceinline__ void ch_cur_next(const ChArgs &a, ChCur &c, int gw, int GW)
{
    if (++c.seg == c.nseg) {
        c.seg = 0;
        if (++c.row == c.rb) ch_cur_at(a, c, c.i + 1, gw, GW);
    }
}

/* the lane's 16 bytes of the cursor's segment and the word of its four weight scales into ring slot sl, then a
 * commit group (empty past the last step) */
__device__ __forceinline__ void ch_issue(const ChArgs &a, ChCur &c, uint8_t *wr, uint32_t *sr, int sl, int gw, int GW)
{
    if (c.i < a.last) {
        const ChStep &s = a.st[c.i];
        const int lane = threadIdx.x & 31;
        rd_cp16(wr + ((size_t)sl * CH_THREADS + threadIdx.x) * 16,
                s.w + (int64_t)c.row * s.K + 512 * c.seg + 16 * lane);
        rd_cp4(sr + (size_t)sl * CH_THREADS + threadIdx.x, s.s + (int64_t)(c.row / 128) * (s.K / 128) + 4 * c.seg);
        ch_cur_next(a, c, gw, GW);
    }
    rd_cp_commit();
}

__device__ __forceinline__ float2 ch_dec2(uint32_t w16)
{
    const uint32_t h = rd_e4m3x2_h(w16);
    return __half22float2(*(const __half2 *)&h);
}

/* 16 e4m3 codes . 16 floats: four chains over the piece's four words, added as (c0 + c1) + (c2 + c3).  Chain i
 * takes word (i + r) % 4, r = (lane / 2) % 4: the eight lanes of a quarter warp then read eight different 16-byte
 * columns of x in each of the four steps (lanes 64 bytes apart in x would otherwise read four ways into the same
 * banks, and the kernel's shared-memory pipe, not HBM, set its pace) */
__device__ __forceinline__ float ch_dot16(uint4 w, const float *x, int r)
{
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int k = (i + r) & 3;
        const uint32_t wk = k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w;
        const float4 xv = *(const float4 *)(x + 4 * k);
        const float2 lo = ch_dec2(wk), hi = ch_dec2(wk >> 16);
        c[i] = fmaf(lo.x, xv.x, c[i]);
        c[i] = fmaf(lo.y, xv.y, c[i]);
        c[i] = fmaf(hi.x, xv.z, c[i]);
        c[i] = fmaf(hi.y, xv.w, c[i]);
    }
    return (c[0] + c[1]) + (c[2] + c[3]);
}

__device__ __forceinline__ void ch_add_release(unsigned *p, unsigned v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void ch_st_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* warp 0 of a block: until step i is done in every block (mode 1: its counter at e G; mode 2: every block's flag
 * at e), acquire */
__device__ __forceinline__ void ch_wait_step(const ChArgs &a, int i, unsigned e, int G, int lane)
{
    if (a.persistent == 1) {
        if (lane == 0)
            while ((int)(ch_ld_acquire(&a.cnt[i]) - e * (unsigned)G) < 0) { /* wrap-safe */
            }
        __syncwarp();
        return;
    }
    for (;;) {
        bool ok = true;
        for (int k = lane; k < G; k += 32) ok &= (int)(ch_ld_acquire(&a.flag[(size_t)i * G + k]) - e) >= 0;
        if (__all_sync(0xffffffffu, ok)) return;
    }
}

__global__ void __launch_bounds__(CH_THREADS, 1) chain_kernel(ChArgs a)
{
    extern __shared__ __align__(16) uint8_t ch_smem[];
    uint8_t *wr = ch_smem;                                               /* [CH_PD][threads] 16 bytes */
    uint32_t *sr = (uint32_t *)(ch_smem + (size_t)CH_PD * CH_THREADS * 16); /* [CH_PD][threads] scale words */
    float *xs = (float *)(ch_smem + (size_t)CH_PD * CH_THREADS * 20);
    __shared__ unsigned s_gen;
    const int b = blockIdx.x, G = gridDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int GW = G * CH_WARPS, gw = b * CH_WARPS + warp;

    if (a.first == 0 && tid == 0) a.t0[b] = ch_now();
    /* the lane's first pieces: weights only, before the wait for the grid before (PDL) */
    ChCur lc;
    ch_cur_at(a, lc, a.first, gw, GW);
#pragma unroll 1
    for (int k = 0; k < CH_PD; k++) ch_issue(a, lc, wr, sr, k, gw, GW);
    pdl_wait();
    pdl_trigger();
    if (a.persistent && tid == 0) s_gen = *(volatile unsigned *)&a.gen[a.persistent - 1];
    __syncthreads();
    const unsigned epoch = a.persistent ? s_gen + 1u : 0u; /* this launch's count (modes 1 and 2) */

    unsigned q = 0; /* pieces consumed by this lane */
    for (int i = a.first; i < a.last; i++) {
        const ChStep s = a.st[i];
        if (a.persistent && i > a.first) { /* step i - 1 complete in every block */
            if (warp == 0) {
                ch_wait_step(a, i - 1, epoch, G, lane);
                if (b == 0 && lane == 0) a.tb[4 * i] = ch_now();
            }
            __syncthreads();
        }
        for (int k = tid; 4 * k < s.K; k += CH_THREADS) ((float4 *)xs)[k] = __ldcg((const float4 *)s.x + k);
        __syncthreads();
        if (a.persistent && b == 0 && tid == 0) a.tb[4 * i + 1] = ch_now();
        const int r0 = (int)((int64_t)s.n * gw / GW), r1 = (int)((int64_t)s.n * (gw + 1) / GW), nseg = s.K / 512;
        for (int row = r0; row < r1; row++) {
            float acc = 0.0f;
            for (int seg = 0; seg < nseg; seg++, q++) {
                const int sl = (int)(q % CH_PD);
                rd_cp_wait_group<CH_PD - 1>();
                const uint4 w = *(const uint4 *)(wr + ((size_t)sl * CH_THREADS + tid) * 16);
                const uint32_t sw = sr[(size_t)sl * CH_THREADS + tid];
                const float d = ch_dot16(w, xs + 512 * seg + 16 * lane, (lane >> 1) & 3);
                acc = fmaf(d, __uint_as_float(((sw >> (8 * (lane >> 3))) & 255u) << 23), acc);
                ch_issue(a, lc, wr, sr, sl, gw, GW); /* the slot's next piece, after its value was used */
            }
#pragma unroll
            for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane == 0) s.y[row] = acc;
        }
        /* step i done in this block: its y stores before the count or flag (the barrier orders them before thread
         * 0's release at gpu scope, which is cumulative), and xs free for the next step */
        __syncthreads();
        if (tid == 0) {
            if (a.persistent && b == 0) a.tb[4 * i + 2] = ch_now();
            if (a.persistent == 1) ch_add_release(&a.cnt[i], 1u);
            else if (a.persistent == 2) ch_st_release(&a.flag[(size_t)i * G + b], epoch);
            const unsigned long long now = ch_now();
            if (a.persistent && b == 0) a.tb[4 * i + 3] = now;
            a.tp[(size_t)i * G + b] = now;
        }
    }
    /* the launch count, once every block is done with the last step (block 0; read by the next launch) */
    if (a.persistent && b == 0 && warp == 0) {
        ch_wait_step(a, a.last - 1, epoch, G, lane);
        if (lane == 0) *(volatile unsigned *)&a.gen[a.persistent - 1] = epoch;
    }
    rd_cp_wait_group<0>();
}

struct bcu_chain {
    int nsteps, G;
    ChStep *dst;
    unsigned *cnt, *flag, *gen;
    unsigned long long *t0, *tp, *tb;
};

static bool ch_attr(void)
{
    static int done;
    if (done) return done > 0;
    const cudaError_t r = cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)CH_SMEM);
    done = r == cudaSuccess ? 1 : -1;
    return done > 0;
}

extern "C" cudaError_t bcu_chain_create(const bcu_chain_step *steps, int nsteps, bcu_chain **out)
{
    *out = NULL;
    if (nsteps <= 0) return cudaErrorInvalidValue;
    for (int i = 0; i < nsteps; i++) {
        const bcu_chain_step *s = &steps[i];
        if (s->K <= 0 || s->K % 512 || s->K > BCU_CHAIN_KMAX || s->n <= 0 || !s->w || !s->s || !s->x || !s->y)
            return cudaErrorInvalidValue;
    }
    if (!ch_attr()) return cudaErrorInvalidConfiguration;
    bcu_chain *c = (bcu_chain *)calloc(1, sizeof *c);
    if (!c) return cudaErrorMemoryAllocation;
    c->nsteps = nsteps;
    c->G = bcu_sm_count();
    ChStep *h = (ChStep *)malloc((size_t)nsteps * sizeof *h);
    cudaError_t r = h ? cudaSuccess : cudaErrorMemoryAllocation;
    for (int i = 0; h && i < nsteps; i++)
        h[i] = ChStep{(const uint8_t *)steps[i].w, (const uint8_t *)steps[i].s, steps[i].x, steps[i].y, steps[i].n,
                      steps[i].K};
    if (!r) r = cudaMalloc((void **)&c->dst, (size_t)nsteps * sizeof(ChStep));
    if (!r) r = cudaMemcpy(c->dst, h, (size_t)nsteps * sizeof(ChStep), cudaMemcpyHostToDevice);
    /* cnt [nsteps], flag [nsteps][G], gen [2]; t0 [G], tp [nsteps][G], tb [nsteps][4] */
    const size_t nu = (size_t)nsteps * (1 + (size_t)c->G) + 2, nt = (size_t)c->G * (1 + (size_t)nsteps) + 4 * (size_t)nsteps;
    if (!r) r = cudaMalloc((void **)&c->cnt, nu * sizeof(unsigned));
    if (!r) r = cudaMemset(c->cnt, 0, nu * sizeof(unsigned));
    if (!r) r = cudaMalloc((void **)&c->t0, nt * sizeof(unsigned long long));
    if (!r) r = cudaMemset(c->t0, 0, nt * sizeof(unsigned long long));
    free(h);
    if (r) {
        bcu_chain_destroy(c);
        return r;
    }
    c->flag = c->cnt + nsteps;
    c->gen = c->flag + (size_t)nsteps * c->G;
    c->tp = c->t0 + c->G;
    c->tb = c->tp + (size_t)nsteps * c->G;
    *out = c;
    return cudaSuccess;
}

extern "C" void bcu_chain_destroy(bcu_chain *c)
{
    if (!c) return;
    cudaFree(c->dst);
    cudaFree(c->cnt);
    cudaFree(c->t0);
    free(c);
}

extern "C" cudaError_t bcu_chain_launch(bcu_chain *c, int persistent, cudaStream_t st)
{
    if (persistent < 0 || persistent > 2) return cudaErrorInvalidValue;
    ChArgs a = {c->dst, c->nsteps, 0, c->nsteps, c->cnt, c->flag, c->gen, c->t0, c->tp, c->tb, persistent};
    if (persistent) {
        /* every block waits on every other: all must be resident at once (a cooperative launch says so, or fails) */
        cudaLaunchConfig_t cfg = launch_cfg(dim3(c->G), dim3(CH_THREADS), CH_SMEM, st);
        cudaLaunchAttribute at[2] = {};
        at[0].id = cudaLaunchAttributeCooperative;
        at[0].val.cooperative = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, chain_kernel, a);
    }
    for (int i = 0; i < c->nsteps; i++) {
        a.first = i;
        a.last = i + 1;
        const cudaError_t r = pdl_launch(chain_kernel, dim3(c->G), dim3(CH_THREADS), CH_SMEM, st, a);
        if (r) return r;
    }
    return cudaSuccess;
}

/* the last launch's clocks on the host: te[i] the end of step i (the last block's), te[-1] the start (the first
 * block's); tb as the device has it */
static cudaError_t ch_clocks(bcu_chain *c, double *te, unsigned long long *tb)
{
    const size_t n = (size_t)c->nsteps, G = (size_t)c->G, nt = G * (1 + n) + 4 * n;
    unsigned long long *h = (unsigned long long *)malloc(nt * sizeof *h);
    if (!h) return cudaErrorMemoryAllocation;
    cudaError_t r = cudaDeviceSynchronize();
    if (!r) r = cudaMemcpy(h, c->t0, nt * sizeof *h, cudaMemcpyDeviceToHost);
    if (!r) {
        unsigned long long m = h[0];
        for (size_t b = 1; b < G; b++) m = h[b] < m ? h[b] : m;
        te[-1] = (double)m;
        for (size_t i = 0; i < n; i++) {
            unsigned long long e = 0;
            for (size_t b = 0; b < G; b++) e = h[G + i * G + b] > e ? h[G + i * G + b] : e;
            te[i] = (double)e;
        }
        if (tb) memcpy(tb, h + G * (1 + n), 4 * n * sizeof *h);
    }
    free(h);
    return r;
}

extern "C" cudaError_t bcu_chain_times(bcu_chain *c, double *us)
{
    double *te = (double *)malloc(((size_t)c->nsteps + 1) * sizeof *te);
    if (!te) return cudaErrorMemoryAllocation;
    const cudaError_t r = ch_clocks(c, te + 1, NULL);
    for (int i = 0; !r && i < c->nsteps; i++) us[i] = 1e-3 * (te[i + 1] - te[i]);
    free(te);
    return r;
}

extern "C" cudaError_t bcu_chain_hops(bcu_chain *c, double (*us)[4])
{
    const size_t n = (size_t)c->nsteps;
    double *te = (double *)malloc((n + 1) * sizeof *te);
    unsigned long long *tb = (unsigned long long *)malloc(4 * n * sizeof *tb);
    cudaError_t r = te && tb ? ch_clocks(c, te + 1, tb) : cudaErrorMemoryAllocation;
    for (size_t i = 1; !r && i < n; i++) {
        const double p[5] = {te[i], (double)tb[4 * i], (double)tb[4 * i + 1], (double)tb[4 * i + 2], (double)tb[4 * i + 3]};
        for (int k = 0; k < 4; k++) us[i][k] = 1e-3 * (p[k + 1] - p[k]);
    }
    if (!r) us[0][0] = us[0][1] = us[0][2] = us[0][3] = 0.0;
    free(te);
    free(tb);
    return r;
}
