/* sample.cu - a sampled token drawn on the device (be_dev_ops.sample, bcu_sample): engine/sampler.c's rules, so
 * that a sampled row's logits need not cross to the host.
 *
 * One block of SP_NT threads a row.  What the host sampler's full computation does, and how the block does it:
 *   - lmax, amax: base/greedy.h's rule (first index of the largest value, NaN as -inf); a row without a finite
 *     lmax gives amax, as the host does.
 *   - the candidates: w = exp((l - lmax) / T) in double (1 / T from the host, as sampler.c computes it), kept where
 *     w > 0 and w >= min_p.  Thread t owns the ids [t C, (t + 1) C) and sums its candidates' weights in id order;
 *     a fixed-order scan over the threads gives every chunk's offset.  The plain draw (no top_k that takes
 *     anything, no top_p) is then the first id whose running sum passes u = u01 * total, found by the thread whose
 *     chunk passes it.
 *   - top_k (k below the candidates' count): the k best by (logit descending, id ascending) are the k smallest of
 *     a 64-bit key; a radix select on the logit's 32 bits finds the k-th one's logit, every token at or above it
 *     goes into shared memory, a bitonic sort orders them and the first k are kept.  They are all candidates: the
 *     candidates are an upper set of that order (w is monotone in the logit) of more than k tokens.
 *   - top_p: the nucleus is a prefix of that order; the weights' binades (as sampler.c's nucleus_bound) pick an
 *     upper set whose mass reaches top_p * total, which is gathered and sorted as above.
 *   - the draws over a sorted list go through one warp: each lane sums a contiguous piece, the lanes' offsets come
 *     from a fixed-order scan, and the lane whose piece passes the target finds the token.
 *   - lists past SP_CAP tokens (a top_k above it, a flat row's nucleus) are not sorted: the cut and the draw are
 *     searches in key order over the weights in 2^-44 fixed point (sp_cross), exact in any order of addition.
 * Every sum is taken in an order fixed by the row's length alone, so a row's token depends only on its logits and
 * its uniform, never on the other rows of the launch.  The sums associate differently from the host's running
 * sums (and the long lists' fixed point is ~1e-8 of the mass off them), so the two can differ where u01 * total or
 * the top_p cut falls that close to a boundary; test_cuda_sample draws both on the same rows and finds no
 * difference.  The kernel draws every row (be_dev_ops.sample's -1 is for backends that leave rows to the host). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sample.h"

#define SP_NT 1024
#define SP_WARPS (SP_NT / 32)
#define SP_CAP 8192 /* the most tokens sorted in shared memory: 8-byte keys and 8-byte weights, 128 KB */
#define SP_NB 64    /* binades of w (sampler.c nucleus_bound's NB) */

namespace {

__device__ __forceinline__ float sp_logit(const float *row, size_t i)
{
    const float v = __ldg(row + i);
    return isnan(v) ? -INFINITY : v;
}

/* (logit descending, id ascending) as an ascending 64-bit key: the logit's bits made order-preserving and inverted,
 * -0 as +0 (sampler.c's cand_key) */
__device__ __forceinline__ uint32_t sp_hi(float l)
{
    const uint32_t u = __float_as_uint(l == 0.0f ? 0.0f : l);
    return ~(u & 0x80000000u ? ~u : u | 0x80000000u);
}
__device__ __forceinline__ float sp_hi_logit(uint32_t hi)
{
    const uint32_t asc = ~hi;
    return __uint_as_float(asc & 0x80000000u ? asc & 0x7fffffffu : ~asc);
}

__device__ __forceinline__ double sp_w(float l, float lmax, double inv_t)
{
    return exp(((double)l - (double)lmax) * inv_t);
}

/* 1 - the binary exponent of w in (0, 1] (sampler.c's binade) */
__device__ __forceinline__ int sp_binade(double w)
{
    return 1023 - (int)((__double_as_longlong(w) >> 52) & 0x7ff);
}

/* Histogram adds through a thread's run: consecutive adds to the same bin are summed in a register and added once
 * when the bin changes (and at the end: flush).  A flat row puts most of its tokens in one or two bins of a pass,
 * where one atomic a token serialised ~129k adds on one address (a top_p draw took 3.9 ms at batch 1). */
template <typename T> struct sp_run {
    unsigned bin = 0xffffffffu;
    T acc = 0;
    __device__ __forceinline__ void add(T *h, unsigned b, T v)
    {
        if (b != bin) {
            flush(h);
            bin = b;
        }
        acc += v;
    }
    __device__ __forceinline__ void flush(T *h)
    {
        if (acc) atomicAdd(h + bin, acc);
        acc = 0;
    }
};

/* A pass's histogram of NB bins as a copy a warp (ph [SP_WARPS][NB], in the dynamic shared memory the sorted lists
 * use later), so that only a warp's own lanes ever contend for a bin; sum() adds the copies into out (integers: the
 * same sums in any order).  The caller puts barriers between zero(), the adds and sum(). */
template <typename T, int NB> struct sp_hist {
    T *ph;
    __device__ __forceinline__ void zero() const
    {
        for (int i = threadIdx.x; i < SP_WARPS * NB; i += SP_NT) ph[i] = 0;
    }
    __device__ __forceinline__ T *mine() const { return ph + (threadIdx.x >> 5) * NB; }
    __device__ __forceinline__ void sum(T *out) const
    {
        for (int b = threadIdx.x; b < NB; b += SP_NT) {
            T t = 0;
            for (int w = 0; w < SP_WARPS; w++) t += ph[w * NB + b];
            out[b] = t;
        }
    }
};

struct sp_shared {
    double wsum[SP_WARPS];
    int wcnt[SP_WARPS];
    unsigned long long mass[SP_NB]; /* fixed point (sp_fx) */
    unsigned cnt[SP_NB];
    unsigned hist[256];
    unsigned long long hw[256];     /* fixed point */
    unsigned long long before, acc;
    float bv[SP_WARPS];
    unsigned bi[SP_WARPS];
    int n_keys, pick, top, result;
    unsigned prefix, need_k;
};

/* a scan over the block in a fixed order: the sum of threads 0..t - 1 for thread t, and (*all) of every thread */
__device__ double sp_scan_d(double v, sp_shared &s, double *all)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    double ex = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 31) s.wsum[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        double t = s.wsum[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const double u = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += u;
        }
        s.wsum[lane] = t; /* inclusive over warps */
    }
    __syncthreads();
    const double before = warp ? s.wsum[warp - 1] : 0.0;
    ex = lane ? (warp ? before + ex : ex) : before;
    *all = s.wsum[SP_WARPS - 1];
    __syncthreads();
    return ex;
}
__device__ int sp_sum_i(int v, sp_shared &s)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) s.wcnt[warp] = v;
    __syncthreads();
    int t = 0;
    for (int w = 0; w < SP_WARPS; w++) t += s.wcnt[w];
    __syncthreads();
    return t;
}

/* the k-th (1-based) smallest key's high word among the row's tokens: four passes of 8 bits */
__device__ uint32_t sp_select_hi(const float *row, size_t V, unsigned k, sp_shared &s, void *scratch)
{
    unsigned prefix = 0, need = k;
    const sp_hist<unsigned, 256> H = {(unsigned *)scratch};
    for (int d = 3; d >= 0; d--) {
        H.zero();
        __syncthreads();
        const uint32_t mask = d == 3 ? 0u : ~0u << (8 * (d + 1));
        sp_run<unsigned> run;
        unsigned *mh = H.mine();
        for (size_t i = threadIdx.x; i < V; i += SP_NT) {
            const uint32_t h = sp_hi(sp_logit(row, i));
            if ((h & mask) == (prefix & mask)) run.add(mh, (h >> (8 * d)) & 255u, 1u);
        }
        run.flush(mh);
        __syncthreads();
        H.sum(s.hist);
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned b = 0, c = 0;
            while (c + s.hist[b] < need) c += s.hist[b++];
            s.prefix = prefix | (b << (8 * d));
            s.need_k = need - c;
        }
        __syncthreads();
        prefix = s.prefix;
        need = s.need_k;
        __syncthreads();
    }
    return prefix;
}

/* keys[0..m) ascending (bitonic over the next power of two; the pad is ~0) */
__device__ void sp_sort(uint64_t *keys, int m)
{
    int p = 1;
    while (p < m) p <<= 1;
    for (int i = m + threadIdx.x; i < p; i += SP_NT) keys[i] = ~(uint64_t)0;
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += SP_NT) {
                const int o = i ^ j;
                if (o > i) {
                    const uint64_t a = keys[i], b = keys[o];
                    if ((a > b) == !(i & k)) {
                        keys[i] = b;
                        keys[o] = a;
                    }
                }
            }
            __syncthreads();
        }
}

/* warp 0 over w[0..m): the first index whose running sum passes the target (strict: sum > target, else sum >=
 * target), or -1; *total: the sum of all m.  Lane j sums a contiguous piece p_j; its running sums are off_j + (the
 * piece's sum so far), off_j the fixed-order scan of the pieces before it, so they never decrease and the lane
 * whose piece's end passes the target holds the index. */
__device__ int sp_walk(const double *w, int m, double target, bool strict, double *total)
{
    const int lane = threadIdx.x & 31;
    const int per = (m + 31) / 32, a = min(m, lane * per), e = min(m, a + per);
    double part = 0;
    for (int i = a; i < e; i++) part += w[i];
    double inc = part;
    for (int o = 1; o < 32; o <<= 1) {
        const double u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    double off = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) off = 0;
    *total = __shfl_sync(0xffffffffu, inc, 31);
    const double endv = off + part;
    const bool pass = a < e && (strict ? endv > target : endv >= target);
    const unsigned ballot = __ballot_sync(0xffffffffu, pass);
    if (!ballot) return -1;
    const int l0 = __ffs(ballot) - 1;
    int idx = e - 1;
    if (lane == l0) {
        double p = 0;
        for (int i = a; i < e; i++) {
            p += w[i];
            const double c = off + p;
            if (strict ? c > target : c >= target) { idx = i; break; }
        }
    }
    return __shfl_sync(0xffffffffu, idx, l0);
}

/* The long lists (a top_k above SP_CAP, a nucleus past it): no sort, but searches in key order on weights in fixed
 * point, w as a whole multiple of 2^-44 (sums of up to 2^18 tokens fit 64 bits, and add exactly in any order).  They
 * can differ from the host's double sums by up to V 2^-45 (about 1e-8 of the mass at 129k), so a token can differ
 * from the host's where the uniform or the top_p cut falls that close to a boundary. */
__device__ __forceinline__ unsigned long long sp_fx(float l, float lmax, double inv_t, double min_p)
{
    const double w = sp_w(l, lmax, inv_t);
    return w > 0 && w >= min_p ? (unsigned long long)(w * 0x1.0p44 + 0.5) : 0ull;
}

/* the block's sum of v (fixed point; exact in any order) */
__device__ unsigned long long sp_sum_fx(unsigned long long v, sp_shared &s)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) s.acc = 0;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) atomicAdd(&s.acc, v);
    __syncthreads();
    const unsigned long long t = s.acc;
    __syncthreads();
    return t;
}

/* In key order, the first token at which the running mass passes target (strict: > target, else >= target): its
 * key's high word (*hi), the mass of the tokens before its class of equal logits (*before), and its weight (the
 * class's: equal logits, equal weights).  Four passes of 8 bits over the high word. */
__device__ unsigned long long sp_cross(const float *row, size_t V, float lmax, double inv_t, double min_p,
                                       unsigned long long target, bool strict, sp_shared &s, void *scratch,
                                       uint32_t *hi, unsigned long long *before)
{
    uint32_t prefix = 0;
    unsigned long long bef = 0;
    const sp_hist<unsigned long long, 256> H = {(unsigned long long *)scratch};
    unsigned long long *mh = H.mine();
    for (int d = 3; d >= 0; d--) {
        H.zero();
        __syncthreads();
        const uint32_t mask = d == 3 ? 0u : ~0u << (8 * (d + 1));
        sp_run<unsigned long long> run;
        for (size_t i = threadIdx.x; i < V; i += SP_NT) {
            const float l = sp_logit(row, i);
            const uint32_t h = sp_hi(l);
            if ((h & mask) != (prefix & mask)) continue;
            const unsigned long long W = sp_fx(l, lmax, inv_t, min_p);
            if (W) run.add(mh, (h >> (8 * d)) & 255u, W);
        }
        run.flush(mh);
        __syncthreads();
        H.sum(s.hw);
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long c = bef;
            unsigned b = 0;
            for (; b < 255; b++) {
                const unsigned long long nx = c + s.hw[b];
                if (strict ? nx > target : nx >= target) break;
                c = nx;
            }
            s.prefix = prefix | (b << (8 * d));
            s.before = c;
        }
        __syncthreads();
        prefix = s.prefix;
        bef = s.before;
        __syncthreads();
    }
    *hi = prefix;
    *before = bef;
    return sp_fx(sp_hi_logit(prefix), lmax, inv_t, min_p);
}

/* the id of the t-th (0-based) token in id order whose key's high word is hi (thread chunks [a, e) of the ids) */
__device__ int sp_nth_of(const float *row, size_t a, size_t e, uint32_t hi, unsigned long long t, sp_shared &s)
{
    int c = 0;
    for (size_t i = a; i < e; i++) c += sp_hi(sp_logit(row, i)) == hi;
    /* exclusive scan of the counts in thread order */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = c;
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) s.wcnt[warp] = inc;
    if (threadIdx.x == 0) s.result = -1;
    __syncthreads();
    int base = 0;
    for (int w = 0; w < warp; w++) base += s.wcnt[w];
    const unsigned long long ex = (unsigned long long)(base + inc - c);
    if (c && t >= ex && t < ex + (unsigned long long)c) {
        unsigned long long k = t - ex;
        for (size_t i = a; i < e; i++)
            if (sp_hi(sp_logit(row, i)) == hi && !k--) { s.result = (int)i; break; }
    }
    __syncthreads();
    const int id = s.result;
    __syncthreads();
    return id;
}

__global__ void __launch_bounds__(SP_NT, 1) sp_kernel(int32_t *ids, const float *x, size_t V, const be_draw *draws)
{
    pdl_enter();
    extern __shared__ __align__(16) uint8_t smem[];
    uint64_t *keys = (uint64_t *)smem;
    double *ws = (double *)(smem + SP_CAP * sizeof(uint64_t));
    __shared__ sp_shared s;
    const be_draw d = draws[blockIdx.x];
    const float *row = x + (size_t)d.row * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    /* lmax, amax: the first index of the largest value */
    float bv = -INFINITY;
    unsigned bi = 0xffffffffu;
    for (size_t i = tid; i < V; i += SP_NT) {
        const float v = sp_logit(row, i);
        if (v > bv) { bv = v; bi = (unsigned)i; }
    }
    for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { s.bv[warp] = bv; s.bi[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = s.bv[lane];
        bi = s.bi[lane];
        for (int o = 16; o; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const unsigned oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { s.bv[0] = bv; s.bi[0] = bi == 0xffffffffu ? 0u : bi; }
    }
    __syncthreads();
    const float lmax = s.bv[0];
    const int amax = (int)s.bi[0];
    if (!isfinite(lmax)) { /* all -inf, or +inf present: nothing to weigh (sampler.c) */
        if (tid == 0) ids[blockIdx.x] = amax;
        return;
    }
    const double inv_t = d.inv_t, min_p = d.min_p > 0 ? d.min_p : 0.0;

    /* the candidates in id order: thread t's chunk [a, e) */
    const size_t C = (V + SP_NT - 1) / SP_NT, a = tid * C < V ? tid * C : V, e = a + C < V ? a + C : V;
    double part = 0;
    int cnt = 0, last = -1;
    for (size_t i = a; i < e; i++) {
        const double w = sp_w(sp_logit(row, i), lmax, inv_t);
        if (w > 0 && w >= min_p) { part += w; cnt++; last = (int)i; }
    }
    double total;
    const double off = sp_scan_d(part, s, &total); /* the chunk's offset */
    const int n = sp_sum_i(cnt, s);

    const bool k_on = d.top_k > 0 && (size_t)d.top_k < (size_t)n;
    const bool p_on = d.top_p > 0 && d.top_p < 1;
    if (!k_on && !(p_on && n > 1)) {
        /* the plain draw in id order: the running sum at id i is off + (the chunk's sum up to i), so the first chunk
         * whose end off + part passes u holds the token */
        const double u = d.u01 * total;
        if (tid == 0) { s.pick = SP_NT; s.top = -1; }
        __syncthreads();
        if (cnt && u < off + part) atomicMin(&s.pick, tid);
        if (cnt) atomicMax(&s.top, last);
        __syncthreads();
        if (s.pick == SP_NT) { /* u rounded up to the total: the last candidate */
            if (tid == 0) ids[blockIdx.x] = s.top;
            return;
        }
        if (tid == s.pick) {
            double p = 0;
            int id = last;
            for (size_t i = a; i < e; i++) {
                const double w = sp_w(sp_logit(row, i), lmax, inv_t);
                if (w > 0 && w >= min_p) {
                    p += w;
                    if (u < off + p) { id = (int)i; break; }
                }
            }
            ids[blockIdx.x] = id;
        }
        return;
    }

    /* a sorted list: the top_k set, or an upper set holding the nucleus; past SP_CAP tokens, the long lists' path */
    if (tid == 0) { s.n_keys = 0; s.result = -3; }
    __syncthreads();
    bool big = false;
    unsigned long long M_all = 0; /* top_p alone: the candidates' mass in fixed point */
    uint32_t hi_cut = 0; /* top_k: every token whose key's high word is at most this */
    int B = SP_NB - 1;   /* top_p: the candidates of binades 0..B */
    if (k_on) {
        if (d.top_k > SP_CAP) big = true;
        else hi_cut = sp_select_hi(row, V, (unsigned)d.top_k, s, keys);
    } else {
        /* the mass by binade of w (fixed point); the smallest set of binades 0..B that reaches need, with a margin for
         * the fixed point: it only picks the set, and the nucleus is then found on the sorted set itself */
        unsigned long long mall = 0; /* every candidate's weight, for the long lists' path */
        const sp_hist<unsigned long long, SP_NB> HM = {(unsigned long long *)keys};
        const sp_hist<unsigned, SP_NB> HC = {(unsigned *)ws};
        HM.zero();
        HC.zero();
        __syncthreads();
        unsigned long long *mm = HM.mine();
        unsigned *mc = HC.mine();
        sp_run<unsigned long long> rm;
        sp_run<unsigned> rc;
        for (size_t i = tid; i < V; i += SP_NT) {
            const double w = sp_w(sp_logit(row, i), lmax, inv_t);
            if (!(w > 0 && w >= min_p)) continue;
            const unsigned long long W = (unsigned long long)(w * 0x1.0p44 + 0.5); /* sp_fx's */
            mall += W;
            const int b = sp_binade(w);
            if (b < SP_NB - 1) {
                rm.add(mm, (unsigned)b, W);
                rc.add(mc, (unsigned)b, 1u);
            }
        }
        rm.flush(mm);
        rc.flush(mc);
        M_all = sp_sum_fx(mall, s); /* its barriers put the copies in */
        HM.sum(s.mass);
        HC.sum(s.cnt);
        __syncthreads();
        if (tid == 0) {
            const double need = d.top_p * total * 0x1.0p44 * (1 + 0x1.0p-20) + (double)V;
            unsigned long long cm = 0;
            int b = 0, m = 0;
            for (; b < SP_NB - 1; b++) {
                cm += s.mass[b];
                m += s.cnt[b];
                if ((double)cm >= need) break;
            }
            if (b == SP_NB - 1) m = n; /* every candidate */
            s.pick = b;
            s.n_keys = m;
        }
        __syncthreads();
        big = s.n_keys > SP_CAP;
        B = s.pick;
    }
    __syncthreads();
    if (!big) {
        if (tid == 0) s.n_keys = 0;
        __syncthreads();
        /* gather: the top_k set's tokens (high word at most hi_cut), or the candidates of binades 0..B */
        for (size_t i = tid; i < V; i += SP_NT) {
            const float l = sp_logit(row, i);
            bool in;
            if (k_on) {
                in = sp_hi(l) <= hi_cut;
            } else {
                const double w = sp_w(l, lmax, inv_t);
                in = w > 0 && w >= min_p && (B == SP_NB - 1 || sp_binade(w) <= B);
            }
            if (in) {
                const int slot = atomicAdd(&s.n_keys, 1);
                if (slot < SP_CAP) keys[slot] = (uint64_t)sp_hi(l) << 32 | (uint32_t)i;
            }
        }
        __syncthreads();
        int m = s.n_keys;
        if (m <= SP_CAP) { /* else ties at the top_k cut past the capacity: the long lists' path */
            sp_sort(keys, m);
            if (k_on) m = d.top_k; /* the k best; all candidates (see the header) */
            for (int i = tid; i < m; i += SP_NT) ws[i] = sp_w(sp_hi_logit((uint32_t)(keys[i] >> 32)), lmax, inv_t);
            __syncthreads();
            if (warp == 0) {
                int keep = m;
                double tot;
                if (p_on && m > 1) {
                    double ktot;
                    (void)sp_walk(ws, m, INFINITY, true, &ktot); /* the k best's total (top_k's renormalisation) */
                    const int j = sp_walk(ws, m, d.top_p * (k_on ? ktot : total), false, &tot);
                    keep = j < 0 ? (k_on ? m : -1) : j + 1; /* the set short of the nucleus (rounding): below */
                }
                int id = -3;
                if (keep > 0) {
                    (void)sp_walk(ws, keep, INFINITY, true, &tot);
                    const int j = sp_walk(ws, keep, d.u01 * tot, true, &tot);
                    id = (int)(uint32_t)keys[j < 0 ? keep - 1 : j];
                }
                if (lane == 0) s.result = id;
            }
            __syncthreads();
            if (s.result != -3) {
                if (tid == 0) ids[blockIdx.x] = s.result;
                return;
            }
        }
    }

    /* the long lists: the list is a prefix of key order (the first k tokens, or all candidates) of mass M; top_p cuts
     * it at the first token where the running mass reaches top_p M; the draw is the first token past u01 times the
     * kept mass */
    unsigned long long M;
    if (k_on) {
        const uint32_t hk = sp_select_hi(row, V, (unsigned)d.top_k, s, keys);
        unsigned long long below = 0;
        int nbelow = 0;
        for (size_t i = a; i < e; i++) {
            const float l = sp_logit(row, i);
            if (sp_hi(l) < hk) { below += sp_fx(l, lmax, inv_t, min_p); nbelow++; }
        }
        below = sp_sum_fx(below, s);
        nbelow = sp_sum_i(nbelow, s);
        M = below + (unsigned long long)(d.top_k - nbelow) * sp_fx(sp_hi_logit(hk), lmax, inv_t, min_p);
    } else {
        M = M_all;
    }
    uint32_t h;
    unsigned long long bef, W, keep = M;
    if (p_on && (k_on ? d.top_k : n) > 1) {
        const unsigned long long need = (unsigned long long)ceil(d.top_p * (double)M);
        W = sp_cross(row, V, lmax, inv_t, min_p, need, false, s, keys, &h, &bef);
        /* the first tie t (0-based) with bef + (t + 1) W >= need */
        const unsigned long long t = (need - bef + W - 1) / W - 1;
        keep = bef + (t + 1) * W;
    }
    const unsigned long long k53 = (unsigned long long)(d.u01 * 0x1.0p53); /* u01 = k53 2^-53, exactly */
    const unsigned long long uh = __umul64hi(k53, keep), ul = k53 * keep;
    const unsigned long long uI = (uh << 11) | (ul >> 53); /* floor(u01 keep) */
    W = sp_cross(row, V, lmax, inv_t, min_p, uI, true, s, keys, &h, &bef);
    const int id = sp_nth_of(row, a, e, h, (uI - bef) / W, s);
    if (tid == 0) ids[blockIdx.x] = id;
}

} // namespace

extern "C" cudaError_t bcu_sample(int32_t *ids, const float *x, size_t V, const be_draw *draws, size_t n,
                                  cudaStream_t st)
{
    if (!n) return cudaSuccess;
    if (V > 0x7fffffffu) return cudaErrorInvalidValue;
    static int attr_done;
    const size_t smem = SP_CAP * (sizeof(uint64_t) + sizeof(double));
    if (!attr_done) {
        const cudaError_t r = cudaFuncSetAttribute(sp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (r != cudaSuccess) return r;
        attr_done = 1;
    }
    pdl_launch(sp_kernel, (unsigned)n, SP_NT, smem, st, ids, x, V, draws);
    return cudaGetLastError();
}
