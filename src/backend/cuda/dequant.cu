/* dequant.cu - block-scaled FP8 (e4m3) and packed FP4 (e2m1) weights with
 * ue8m0 scales, expanded on the device to a dense bf16 matrix, so that a
 * prefill GEMM (large T) can run through cuBLAS's bf16 tensor-core GEMM on a
 * transient copy instead of through the row-dot (kernels.cu).  This file only
 * expands; the GEMM and the scratch belong to the caller.
 *
 * The result is bit for bit what the CPU computes: element for element
 * md_f32_to_bf16(decode(code) * scale) with dtype.c's decoders.  Why the
 * kernel gets there:
 *  - every e4m3 code is an f16 value (cvt e4m3x2 -> f16x2 is exact, f16 ->
 *    f32 is exact), and every e2m1 code c is 2^6 times the e4m3 code
 *    (sign << 7) | (exponent-mantissa << 2) (the subnormals line up too,
 *    because both formats' subnormal exponent is their lowest normal one),
 *    so an f16 multiply by 64 (exact) gives the e2m1 value;
 *  - the fp32 product with the power-of-two scale is the IEEE product of the
 *    same two fp32 numbers the CPU multiplies (subnormals kept: nothing here
 *    is built with fast-math), and cvt.rn.bf16x2.f32 rounds it to nearest
 *    even as md_f32_to_bf16 does.
 * So the bits agree for every code and every scale byte but the NaNs (code
 * 0x7f / 0xff, scale 255), which give a NaN whose bits may differ from the
 * CPU's.  A product whose magnitude lies in bf16's normal range is exact
 * (e4m3 has 4 significant bits, e2m1 2, bf16 8); outside it (extreme scales)
 * the result is the rounded product, still equal to the CPU's.
 *
 * Speed: the kernel is bandwidth-bound (FP8 reads 1 byte and writes 2 per
 * element, FP4 0.5 and 2).  Its unit is 8 elements of a row (inside one
 * scale block: block >= 16): 8 code bytes (FP8) or 4 (FP4) in, one 16-byte
 * store out, so a warp's load covers 256 / 128 contiguous bytes and its
 * store 512, every sector whole.  Each thread takes DQ_UNROLL units a pass,
 * all loads (codes and scale bytes) issued before the first store, in a
 * grid-stride loop over a grid that just fills the GPU.  A unit's row and
 * column are carried along the loop (the stride is a fixed number of rows
 * and units), not divided out per unit.
 *
 * The inline PTX and the launch sit between the "dequant primitives"
 * markers; the code after them was also compiled as C++ and run on the build
 * machine with host versions of those primitives (threads as a loop) against
 * dtype.c, before any device time. */
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/moe_ops.cuh"

#define DQ_THREADS 256
#define DQ_UNROLL 8 /* units (8 elements) per thread per pass, loaded together */

/* ==== dequant primitives (begin) ==== */
namespace {

/* two e4m3 codes (bits 0-7, 8-15 of v) -> f16x2 (low half: bits 0-7); exact */
__device__ __forceinline__ uint32_t dq_e4m3x2_f16x2(uint32_t v)
{
    uint32_t h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)(v & 0xffffu)));
    return h;
}

/* f16x2 -> two f32 (lo from the low half); exact */
__device__ __forceinline__ void dq_f16x2_f32(uint32_t h, float *lo, float *hi)
{
    asm("{.reg .f16 l, u;\n\tmov.b32 {l, u}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, u;}"
        : "=f"(*lo), "=f"(*hi)
        : "r"(h));
}

/* f16x2 product, round to nearest even (only ever exact here) */
__device__ __forceinline__ uint32_t dq_hmul2(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

/* (bf16(lo), bf16(hi)) rounded to nearest even, lo in the low half */
__device__ __forceinline__ uint32_t dq_bf16x2(float lo, float hi)
{
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* (f16(lo), f16(hi)) rounded to nearest even, lo in the low half (exact where f16x2.h's rule holds) */
__device__ __forceinline__ uint32_t dq_f16x2(float lo, float hi)
{
    uint32_t d;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* two products as the output type's pair: bf16 (F16 = 0) or f16 */
template <int F16>
__device__ __forceinline__ uint32_t dq_out2(float lo, float hi)
{
    return F16 ? dq_f16x2(lo, hi) : dq_bf16x2(lo, hi);
}

/* byte i of the result = byte (s >> 4i) & 7 of {b, a} (selector nibbles < 8) */
__device__ __forceinline__ uint32_t dq_prmt(uint32_t a, uint32_t b, uint32_t s) { return __byte_perm(a, b, s); }

__device__ __forceinline__ uint2 dq_ld_u2(const uint2 *p) { return __ldg(p); }
__device__ __forceinline__ uint32_t dq_ld_u1(const uint32_t *p) { return __ldg(p); }
__device__ __forceinline__ uint32_t dq_ld_b(const uint8_t *p) { return __ldg(p); }
__device__ __forceinline__ void dq_st16(uint4 *p, uint4 v) { *p = v; }

/* blocks of kern that fill the current device (SMs x resident blocks per SM), cached per device and kernel slot */
template <typename... P>
int dq_fill_blocks(void (*kern)(P...), int slot)
{
    static std::atomic<int> cache[64][4];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) dev = -1;
    int v = dev >= 0 ? cache[dev][slot].load(std::memory_order_relaxed) : 0;
    if (v > 0) return v;
    int sms = 0, per = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev < 0 ? 0 : dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* not the caller's error: guess an H200 */
        sms = 0;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, DQ_THREADS, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        per = 0;
    }
    v = (sms > 0 ? sms : 132) * (per > 0 ? per : 4);
    if (dev >= 0) cache[dev][slot].store(v, std::memory_order_relaxed);
    return v;
}

template <typename... P, typename... A>
cudaError_t dq_launch(void (*kern)(P...), unsigned grid, cudaStream_t st, A... args)
{
    kern<<<grid, DQ_THREADS, 0, st>>>(args...);
    return cudaGetLastError();
}

} /* namespace */
/* ==== dequant primitives (end) ==== */

namespace {

/* four e4m3 codes (bytes of v, element 0 in the low byte) times s -> four bf16 (F16: f16) in two words */
template <int F16>
__device__ __forceinline__ void dq_e4m3x4(uint32_t v, float s, uint32_t *o0, uint32_t *o1)
{
    float a, b, c, d;
    dq_f16x2_f32(dq_e4m3x2_f16x2(v), &a, &b);
    dq_f16x2_f32(dq_e4m3x2_f16x2(v >> 16), &c, &d);
    *o0 = dq_out2<F16>(a * s, b * s);
    *o1 = dq_out2<F16>(c * s, d * s);
}

/* eight e4m3 codes (bytes of q, element 0 in the low byte of q.x) times s -> eight bf16 (F16: f16) */
template <int F16>
__device__ __forceinline__ uint4 dq_e4m3x8(uint2 q, float s)
{
    uint4 o;
    dq_e4m3x4<F16>(q.x, s, &o.x, &o.y);
    dq_e4m3x4<F16>(q.y, s, &o.z, &o.w);
    return o;
}

/* eight e2m1 codes (nibbles of v, element 0 in the low nibble) times s -> eight bf16 (F16: f16).
 * e2m1 s|e|e|m is 2^6 times e4m3 s|0|0|0|e|e|m|0|0: the even elements' codes
 * (low nibbles) and the odd ones' (high nibbles) are built byte-parallel, put
 * back in element order (prmt), widened to f16, and multiplied by 64 there. */
template <int F16>
__device__ __forceinline__ uint4 dq_e2m1x8(uint32_t v, float s)
{
    const uint32_t ev = ((v << 4) & 0x80808080u) | ((v << 2) & 0x1c1c1c1cu); /* elements 0, 2, 4, 6 */
    const uint32_t od = (v & 0x80808080u) | ((v >> 2) & 0x1c1c1c1cu);        /* elements 1, 3, 5, 7 */
    const uint32_t c03 = dq_prmt(ev, od, 0x5140), c47 = dq_prmt(ev, od, 0x7362);
    const uint32_t k64 = 0x54005400u; /* f16x2 (64, 64) */
    const uint32_t h[4] = {dq_e4m3x2_f16x2(c03), dq_e4m3x2_f16x2(c03 >> 16), dq_e4m3x2_f16x2(c47),
                           dq_e4m3x2_f16x2(c47 >> 16)};
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float a, b;
        dq_f16x2_f32(dq_hmul2(h[k], k64), &a, &b);
        o[k] = dq_out2<F16>(a * s, b * s);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

struct DqArgs {
    uint4 *dst;           /* [n, cols] bf16: unit i (8 elements) is dst[i] */
    const uint8_t *w;     /* the codes of row r0 */
    const uint8_t *scale; /* the whole weight's scales */
    int64_t nu;           /* units in rows [r0, r0 + n) */
    int64_t upr;          /* units per row, cols / 8 */
    int64_t r0, nsb;      /* first weight row; scales per scale row */
    int lbs;              /* log2(block) */
    int g;                /* added to every scale byte: the f16 copy's shift G (f16x2.h), 0 for bf16 */
    int64_t sq, sr;       /* the grid stride in units = sq rows + sr units, sr < upr */
};

/* FMT BCU_RW_FP8 or BCU_RW_FP4, F16 the output type (0 bf16, 1 f16); a pass
 * loads DQ_UNROLL units and their scale bytes, then decodes and stores them */
template <int FMT, int F16>
__global__ void __launch_bounds__(DQ_THREADS) dequant_kernel(DqArgs a)
{
    const int64_t stride = (int64_t)gridDim.x * DQ_THREADS;
    int64_t i = (int64_t)blockIdx.x * DQ_THREADS + threadIdx.x;
    int64_t row = i / a.upr, col = i - row * a.upr; /* of unit i, within the slice */
    while (i < a.nu) {
        const int64_t i0 = i;
        uint2 q[DQ_UNROLL];
        uint32_t sb[DQ_UNROLL];
#pragma unroll
        for (int u = 0; u < DQ_UNROLL; u++) {
            q[u] = make_uint2(0, 0);
            sb[u] = 0;
            if (i < a.nu) {
                const int64_t r = a.r0 + row;
                if (FMT == BCU_RW_FP8) {
                    q[u] = dq_ld_u2((const uint2 *)(a.w + 8 * i));
                    sb[u] = dq_ld_b(a.scale + (r >> a.lbs) * a.nsb + ((col << 3) >> a.lbs));
                } else {
                    q[u].x = dq_ld_u1((const uint32_t *)(a.w + 4 * i));
                    sb[u] = dq_ld_b(a.scale + r * a.nsb + ((col << 3) >> a.lbs));
                }
            }
            i += stride;
            row += a.sq;
            col += a.sr;
            if (col >= a.upr) {
                col -= a.upr;
                row++;
            }
        }
#pragma unroll
        for (int u = 0; u < DQ_UNROLL; u++) {
            const int64_t iu = i0 + u * stride;
            if (iu >= a.nu) break;
            const float s = ue8m0(sb[u] + a.g);
            dq_st16(a.dst + iu, FMT == BCU_RW_FP8 ? dq_e4m3x8<F16>(q[u], s) : dq_e2m1x8<F16>(q[u].x, s));
        }
    }
}

int dq_log2(int64_t v)
{
    int l = 0;
    while (((int64_t)1 << l) < v) l++;
    return l;
}

} /* namespace */

static cudaError_t dequant(uint16_t *dst, int fmt, const void *w, const void *scale, int sc_dtype, int64_t rows,
                           int64_t cols, int block, int64_t r0, int64_t n, int f16, int g, cudaStream_t st)
{
    if (fmt != BCU_RW_FP8 && fmt != BCU_RW_FP4) return cudaErrorInvalidValue;
    if (sc_dtype != BCU_SC_E8M0) return cudaErrorInvalidValue;
    if (rows < 0 || cols <= 0 || r0 < 0 || n < 0 || r0 > rows || n > rows - r0) return cudaErrorInvalidValue;
    if (rows > 0 && cols > (INT64_MAX / 8) / rows) return cudaErrorInvalidValue; /* byte offsets stay in int64 */
    if (block < 16 || (block & (block - 1))) return cudaErrorInvalidValue;
    if (cols % (fmt == BCU_RW_FP8 ? 16 : 32)) return cudaErrorInvalidValue; /* whole 16-byte rows of codes */
    if (fmt == BCU_RW_FP4 && cols % block) return cudaErrorInvalidValue; /* scales [rows, cols / block] */
    if (g < -254 || g > 254) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (!dst || !w || !scale || ((uintptr_t)dst & 15u) || ((uintptr_t)w & 15u)) return cudaErrorInvalidValue;

    DqArgs a;
    a.dst = (uint4 *)dst;
    a.upr = cols / 8;
    a.w = (const uint8_t *)w + (fmt == BCU_RW_FP8 ? r0 * cols : r0 * (cols / 2));
    a.scale = (const uint8_t *)scale;
    a.nu = n * a.upr;
    a.r0 = r0;
    a.nsb = fmt == BCU_RW_FP8 ? (cols + block - 1) / block : cols / block;
    a.lbs = dq_log2(block);
    a.g = g;
    void (*kern)(DqArgs) = fmt == BCU_RW_FP8 ? (f16 ? dequant_kernel<BCU_RW_FP8, 1> : dequant_kernel<BCU_RW_FP8, 0>)
                                             : (f16 ? dequant_kernel<BCU_RW_FP4, 1> : dequant_kernel<BCU_RW_FP4, 0>);
    const int fill = dq_fill_blocks(kern, (fmt == BCU_RW_FP8 ? 0 : 2) + f16);
    const int64_t per_block = (int64_t)DQ_THREADS * DQ_UNROLL;
    const int64_t need = (a.nu + per_block - 1) / per_block;
    const unsigned grid = (unsigned)(need < fill ? need : fill);
    const int64_t stride = (int64_t)grid * DQ_THREADS;
    a.sq = stride / a.upr;
    a.sr = stride % a.upr;
    return dq_launch(kern, grid, st, a);
}

extern "C" cudaError_t bcu_dequant_bf16(uint16_t *dst, int fmt, const void *w, const void *scale, int sc_dtype,
                                        int64_t rows, int64_t cols, int block, int64_t r0, int64_t n,
                                        cudaStream_t st)
{
    return dequant(dst, fmt, w, scale, sc_dtype, rows, cols, block, r0, n, 0, 0, st);
}

extern "C" cudaError_t bcu_dequant_f16(uint16_t *dst, int fmt, const void *w, const void *scale, int sc_dtype,
                                       int64_t rows, int64_t cols, int block, int64_t r0, int64_t n, int g,
                                       cudaStream_t st)
{
    return dequant(dst, fmt, w, scale, sc_dtype, rows, cols, block, r0, n, 1, g, st);
}
