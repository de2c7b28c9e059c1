/* mma_frag.cuh - the tensor-core fragment primitives shared by the row-dot
 * (kernels.cu) and the grouped expert kernels (moe.cu): the m16n8k16 bf16
 * mma, exact e4m3 / e2m1 -> bf16 decoders, the ue8m0 scale as a bf16 pair,
 * and the exact split of an fp32 value into three bf16 planes.  Everything
 * is in an anonymous namespace: internal to each file that includes it. */
#ifndef DEEPINFER_CUDA_MMA_FRAG_CUH
#define DEEPINFER_CUDA_MMA_FRAG_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

/* D += A.B, m16n8k16, bf16 inputs, fp32 accumulate.  PTX ISA fragment layout,
 * g = lane / 4, q = lane % 4, the lower half of a register holding the lower
 * index: a[0] = A[g][2q, 2q+1], a[1] = A[g+8][2q, 2q+1], a[2] = A[g][2q+8, 2q+9],
 * a[3] = A[g+8][2q+8, 2q+9]; b0 = B[2q, 2q+1][g], b1 = B[2q+8, 2q+9][g];
 * d[0], d[1] = D[g][2q, 2q+1]; d[2], d[3] = D[g+8][2q, 2q+1]. */
__device__ __forceinline__ void rd_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* the m16n8k16 A fragment of a bf16 / f16 tile in shared memory: p = the tile's row g (lane / 4), column 2 (lane % 4)
 * of the 16-column step, rows ld elements apart */
__device__ __forceinline__ void rd_afrag(uint32_t a[4], const uint16_t *p, int ld)
{
    a[0] = *(const uint32_t *)p;
    a[1] = *(const uint32_t *)(p + 8 * ld);
    a[2] = *(const uint32_t *)(p + 8);
    a[3] = *(const uint32_t *)(p + 8 * ld + 8);
}

/* four 8x8 b16 matrices from shared memory (ldmatrix): lanes 8i..8i+7 give the row addresses of matrix i (16
 * bytes each, 16-byte aligned), r[i] gets its fragment (lane l: row l / 4, elements 2 (l % 4), + 1); _t transposed
 * (lane l: column l / 4, rows 2 (l % 4), + 1) */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* the same product with f16 inputs (the decode row-dot on act_quant'd x: codes against codes) */
__device__ __forceinline__ void rd_mma_h(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* global -> shared, 16 bytes, asynchronous; rd_cp_wait waits for every copy this thread issued */
__device__ __forceinline__ void rd_cp16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
/* the same, zero-filled when !full (gmem is then not read, but must be a valid address) */
__device__ __forceinline__ void rd_cp16z(void *smem, const void *gmem, bool full)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(full ? 16 : 0) : "memory");
}
__device__ __forceinline__ void rd_cp_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
/* global -> shared, 4 bytes, asynchronous (through L1) */
__device__ __forceinline__ void rd_cp4(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
/* the copies this thread issued since the last commit as one group; rd_cp_wait_group<N>: until at most N of its
 * groups are in flight */
__device__ __forceinline__ void rd_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void rd_cp_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* two e4m3 codes (bits 0-7, 8-15) -> two f16 (low half, high half), exact for every code: one instruction */
__device__ __forceinline__ uint32_t rd_e4m3x2_h(uint32_t v)
{
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v & 0xffffu)));
    return h;
}

/* two e4m3 codes (bits 0-7, 8-15) -> two bf16 (low half, high half).  Exact:
 * e4m3 -> f16 is exact for every code (NaN stays NaN), f16 -> f32 is exact,
 * and the f32 has at most 4 significant bits, so its top half is the bf16. */
__device__ __forceinline__ uint32_t rd_e4m3x2(uint32_t v)
{
    uint32_t h;
    float lo, hi;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v & 0xffffu)));
    asm("{.reg .f16 l, u;\n\tmov.b32 {l, u}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, u;}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

/* bf16x2 product, round to nearest (only ever exact here: a power of two times
 * an e2m1 value) */
__device__ __forceinline__ uint32_t rd_hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* byte i of the result = byte (s >> 4i) & 7 of {b, a} (selector nibbles < 8) */
__device__ __forceinline__ uint32_t rd_prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }

/* 16 bytes of a weight row that is read once: not kept in L1, and L2 fetches the 256-byte segment around it
 * (the lane asks for the next chunks of the same row right after) */
__device__ __forceinline__ uint4 rd_ldg16_stream(const void *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int k)
{
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* x = hi + mid + lo, three bf16 (the top 16 bits of x, of the rest, of the
 * rest), exact for finite x; inf and NaN go to hi alone */
__device__ __forceinline__ void rd_split3(float v, uint32_t s[3])
{
    const uint32_t u = __float_as_uint(v);
    const float r = v - __uint_as_float(u & 0xffff0000u);
    const uint32_t ru = __float_as_uint(r);
    const float r2 = r - __uint_as_float(ru & 0xffff0000u);
    const bool fin = (u & 0x7f800000u) != 0x7f800000u;
    s[0] = fin ? u >> 16 : (u >> 16) | ((u & 0x007fffffu) ? 0x40u : 0u);
    s[1] = fin ? ru >> 16 : 0u;
    s[2] = fin ? __float_as_uint(r2) >> 16 : 0u;
}

/* 8 e2m1 codes (element j in bits 4j..4j+3) -> bf16 pairs (e0,e4), (e2,e6),
 * (e1,e5), (e3,e7), exactly: the magnitudes' low and high bytes from two
 * 8-entry byte tables (prmt), the signs or-ed into the high bytes */
__device__ __forceinline__ void rd_fp4x8(uint32_t w, uint32_t r[4])
{
    const uint32_t TL0 = 0xC0800000u, TL1 = 0xC0804000u; /* low bytes of bf16 0, .5, 1, 1.5 | 2, 3, 4, 6 */
    const uint32_t TH0 = 0x3F3F3F00u, TH1 = 0x40404040u; /* high bytes */
    const uint32_t t = w & 0x07070707u, u = (w >> 4) & 0x07070707u;
    const uint32_t se = t | (t >> 12), so = u | (u >> 12); /* selector nibbles: e0 e4 e2 e6 | e1 e5 e3 e7 */
    const uint32_t le = rd_prmt(TL0, TL1, se), lo = rd_prmt(TL0, TL1, so);
    uint32_t he = rd_prmt(TH0, TH1, se), ho = rd_prmt(TH0, TH1, so);
    he |= rd_prmt(w << 4, 0u, 0x3120u) & 0x80808080u; /* sign of element 2k: bit 8k+3 */
    ho |= rd_prmt(w, 0u, 0x3120u) & 0x80808080u;      /* sign of element 2k+1: bit 8k+7 */
    r[0] = rd_prmt(le, he, 0x5140u);
    r[1] = rd_prmt(le, he, 0x7362u);
    r[2] = rd_prmt(lo, ho, 0x5140u);
    r[3] = rd_prmt(lo, ho, 0x7362u);
}

/* 2^(b-127) as a bf16 pair (dtype.c's ue8m0: 0 -> 2^-127, 255 -> NaN) */
__device__ __forceinline__ uint32_t ue8m0_bf16x2(uint32_t b)
{
    uint32_t p = b << 7;
    if (b == 0) p = 0x0040u;
    if (b == 255) p = 0x7fc0u;
    return p | (p << 16);
}

/* The B operands of the k16 step pair h from one lane's 16 bytes of weights: b[0], b[1] for step 2h, b[2], b[3]
 * for step 2h + 1.  FP4: the 8 e2m1 codes of word h, times the scale pair s2 (exact); FP8: the 4 + 4 e4m3 codes of
 * words 2h and 2h + 1 (s2 unused: FP8 scales are applied to the chunk's sums). */
template <bool FP4>
__device__ __forceinline__ void rd_bfrag(const uint4 &wv, int h, uint32_t s2, uint32_t b[4])
{
    if (FP4) {
        uint32_t r[4];
        rd_fp4x8(word_of(wv, h), r);
        b[0] = rd_hmul2(r[0], s2);
        b[1] = rd_hmul2(r[2], s2);
        b[2] = rd_hmul2(r[1], s2);
        b[3] = rd_hmul2(r[3], s2);
    } else {
        const uint32_t w0 = word_of(wv, 2 * h), w1 = word_of(wv, 2 * h + 1);
        b[0] = rd_e4m3x2(w0);
        b[1] = rd_e4m3x2(w0 >> 16);
        b[2] = rd_e4m3x2(w1);
        b[3] = rd_e4m3x2(w1 >> 16);
    }
}

} /* namespace */

#endif
