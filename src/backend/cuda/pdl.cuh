/* pdl.cuh - programmatic dependent launch (sm_90) for the backend's kernels.
 *
 * A kernel launched by pdl_launch may be put on the GPU while the kernel before
 * it in the stream is still running: once every block of that one has called
 * pdl_trigger (or finished), the new grid's blocks become resident and park in
 * pdl_wait, which returns when the kernel before has finished and its writes are
 * visible.  At batch 1 a decode step is ~35 short kernels a layer, each of which
 * otherwise pays its launch and its blocks' dispatch after the one before ends.
 *
 * The rule every kernel launched this way keeps: pdl_wait comes before it reads
 * anything an earlier kernel writes and before it writes anything at all, on
 * every path (no early return before it), so that its completion implies the
 * completion of the kernels before it.  What it does before the wait (the decode
 * row-dot's first weight loads) touches only memory no kernel writes.
 * pdl_enter() is the usual prologue: wait, then let the next kernel launch (the
 * trigger after the wait keeps at most one grid parked behind a running one).
 * The wait returns at once in a kernel launched without the attribute.
 *
 * DEEPINFER_CUDA_PDL=0 (read once a process) launches every kernel as an
 * ordinary one. */
#ifndef BACKEND_CUDA_PDL_CUH
#define BACKEND_CUDA_PDL_CUH

#include <cuda_runtime.h>
#include <stdlib.h>

#include <atomic>

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_enter()
{
    pdl_wait();
    pdl_trigger();
}

static inline bool pdl_on(void)
{
    static std::atomic<int> on(-1);
    int v = on.load(std::memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("DEEPINFER_CUDA_PDL");
        v = !(e && *e && atoi(e) == 0);
        on.store(v, std::memory_order_relaxed);
    }
    return v != 0;
}

/* cfg gets the programmatic-serialisation attribute in at[cfg->numAttrs] (the caller's room) when PDL is on */
static inline void pdl_attr(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at)
{
    if (!pdl_on()) return;
    cudaLaunchAttribute *p = &at[cfg->numAttrs];
    p->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    p->val.programmaticStreamSerializationAllowed = 1;
    cfg->attrs = at;
    cfg->numAttrs++;
}

/* the launch configuration of <<<grid, block, smem, st>>>, no attributes */
static inline cudaLaunchConfig_t launch_cfg(dim3 grid, dim3 block, size_t smem, cudaStream_t st)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    return cfg;
}

/* kern<<<grid, block, smem, st>>>(args...) with programmatic dependent launch; kern must begin with pdl_enter()
 * (or keep the rule above) */
template <typename... P, typename... A>
static cudaError_t pdl_launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args)
{
    cudaLaunchConfig_t cfg = launch_cfg(grid, block, smem, st);
    cudaLaunchAttribute at[1] = {};
    pdl_attr(&cfg, at);
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

#endif
