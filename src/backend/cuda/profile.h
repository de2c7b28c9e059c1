/* profile.h - where a CUDA-backend forward spends its time, op by op.
 *
 * Every op of the backend is synchronous (host rows in, host rows out), so
 * its wall time is what the graph pays for it: copies, launches, kernels and
 * the synchronise.  With profiling on, each op adds its wall time and a count
 * to one of the classes below; bench_gpu_layers prints them beside the layer
 * times, and the rest of a step is the graph's own host work (mHC, RoPE,
 * compressors, routing, the window copies). */
#ifndef BACKEND_CUDA_PROFILE_H
#define BACKEND_CUDA_PROFILE_H

#include <stdio.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    BCU_PROF_LINEAR_BF16, /* dense bf16 / f16 / f32 weights (cuBLAS) */
    BCU_PROF_LINEAR_FP8,
    BCU_PROF_LINEAR_FP4,
    BCU_PROF_ROWS,        /* the grouped wo_a (linear_grouped), and linear_rows on a slice */
    BCU_PROF_RMSNORM,
    BCU_PROF_MOE,
    BCU_PROF_ATTENTION,
    BCU_PROF_GRAPH,       /* device graph: mHC, RoPE, QAT round trips, SwiGLU, routing, gathers */
    BCU_PROF_XFER,        /* device graph: uploads, and the downloads where the host waits for the device */
    BCU_PROF_COUNT
};

typedef struct {
    double seconds[BCU_PROF_COUNT];
    long calls[BCU_PROF_COUNT];
} bcu_profile;

/* on != 0: zero the counters and start counting; 0: stop */
void bcu_profile_enable(be_backend *be, int on);
void bcu_profile_get(const be_backend *be, bcu_profile *out);
const char *bcu_profile_name(int cls);

#ifdef __cplusplus
}
#endif

#endif
