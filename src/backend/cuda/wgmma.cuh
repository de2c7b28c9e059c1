/* wgmma.cuh - Hopper's warpgroup MMA and the shared-memory copies around it, for the kernels built for sm_90a
 * alone (moe_wg.cu, fp8_tile.cu): wgmma is an arch-specific feature, so these are real only where WG_ON is 1 (the
 * sm_90a device pass); elsewhere the kernels compile to empty bodies and their hosts ask bcu_wg_available().
 *
 * B operands live in shared memory under a descriptor: without swizzle (moe_wg.cu's wg_desc) or K-major with the
 * 128-byte swizzle (wt_desc: 1 KB atoms of 8 rows x 128 bytes, a k16 step 32 bytes into the atom).  A operands
 * come from registers.  The WT_D / WT_F8 macros spell an instruction's accumulator list: WT_Dn names the n / 2
 * registers of an m64nNk16 fp32 accumulator (n = 16 .. 128), WT_F8(i) binds eight of them to d[i .. i + 8). */
#ifndef BACKEND_CUDA_WGMMA_CUH
#define BACKEND_CUDA_WGMMA_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ON 1
#else
#define WG_ON 0
#endif

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

#if WG_ON
/* 16 bytes global -> shared, bypassing L1; L2 fetches the 256-byte segment around them (the weight streams ask for
 * the next pieces of the same rows next: on the H200 the routed experts' wgmma stages 2.5-4% faster at T = 8..256 in
 * f16, 4-13% on e4m3 codes, the same bits; the FP8 tiles unchanged) */
static __device__ __forceinline__ void cp16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
static __device__ __forceinline__ void cp4(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

/* generic-proxy stores to shared memory, made visible to wgmma's reads (the async proxy) */
static __device__ __forceinline__ void fence_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wg_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving reads of an accumulator across the wait that makes it valid */
static __device__ __forceinline__ void wg_hold(float (&d)[4])
{
    asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])::"memory");
}
/* the same for a whole accumulator set of N registers (N a multiple of 4), four at a time */
template <int N> static __device__ __forceinline__ void wg_hold_all(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i += 4) {
        float d4[4] = {d[i], d[i + 1], d[i + 2], d[i + 3]};
        wg_hold(d4);
        d[i] = d4[0];
        d[i + 1] = d4[1];
        d[i + 2] = d4[2];
        d[i + 3] = d4[3];
    }
}
/* f(token, row g's sum, row g + 8's sum) for each token below ntk of lane (g, q)'s part of an m64nNN fp32
 * accumulator set: d[4 j + i] is row g (i < 2) or g + 8, token 8 j + 2 q + (i & 1) */
template <int NN, int N, typename F>
static __device__ __forceinline__ void wg_each_token(const float (&d)[N], int q, int ntk, F f)
{
    static_assert(NN / 2 <= N, "NN / 2 accumulators");
#pragma unroll
    for (int j = 0; j < NN / 8; j++)
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int tk = 8 * j + 2 * q + u;
            if (tk < ntk) f(tk, d[4 * j + u], d[4 * j + 2 + u]);
        }
}
#endif

#define WT_D8(a, b, c, d, e, f, g, h) "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h
#define WT_D16 WT_D8(0, 1, 2, 3, 4, 5, 6, 7)
#define WT_D32 WT_D16 ", " WT_D8(8, 9, 10, 11, 12, 13, 14, 15)
#define WT_D48 WT_D32 ", " WT_D8(16, 17, 18, 19, 20, 21, 22, 23)
#define WT_D64 WT_D48 ", " WT_D8(24, 25, 26, 27, 28, 29, 30, 31)
#define WT_D80 WT_D64 ", " WT_D8(32, 33, 34, 35, 36, 37, 38, 39)
#define WT_D96 WT_D80 ", " WT_D8(40, 41, 42, 43, 44, 45, 46, 47)
#define WT_D112 WT_D96 ", " WT_D8(48, 49, 50, 51, 52, 53, 54, 55)
#define WT_D128 WT_D112 ", " WT_D8(56, 57, 58, 59, 60, 61, 62, 63)
#define WT_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])

/* K-major, 128-byte swizzle: start address (1 KB atoms; + 32 bytes a k16 step within one), SBO 1 KB between
 * 8-row groups, LBO unused */
static __device__ __forceinline__ uint64_t wt_desc(uint32_t saddr)
{
    return (uint64_t)((saddr & 0x3ffffu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

#endif
