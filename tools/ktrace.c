/* ktrace.c - a kernel timeline for the GPU machine (no nsys there): LD_PRELOAD it and every kernel, memcpy and
 * memset between the program's cudaProfilerStart and cudaProfilerStop is written, with its stream and its start and
 * end on the GPU's clock, to $KTRACE_OUT (default ktrace.csv) when the profiler stops.  Unlike ncu it does not
 * serialise the kernels, so the lanes' overlap and the gaps PDL leaves are what the step really had.
 *   ninja -C /tmp/cub ktrace                              (here: the CMake target libktrace.so; tools/gpu_check.sh
 *                                                          pack carries it and libcupti.so.13 in .carry/lib)
 *   BENCH_NCU_B=1 KTRACE_OUT=$OUT/t.csv LD_PRELOAD=$PWD/.carry/lib/libktrace.so bench_gpu_layers ...  (there)
 *   python3 tools/ktrace.py t.csv                         (here: the step's critical chain, by kernel)
 * Columns: kind (K kernel, C memcpy, S memset; R a runtime API call, with KTRACE_API=1: its host thread in the
 * stream column, its start and end on the host), stream, start_ns, end_ns (relative to the profiler start, one
 * clock for the host and the GPU), graph node (0 outside graphs), grid, block, name (mangled).  The API records
 * cost the host time of their own: time the step without them.  A kernel under programmatic dependent launch
 * starts before its predecessor ends (its prologue runs before the wait), so its own span overstates its work:
 * ktrace.py reads the chain from the ends. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)

typedef struct {
    char kind;
    uint32_t stream;
    uint64_t start, end, node;
    int grid, block;
    char name[160];
} rec;

static rec *recs;
static size_t nrec, caprec;
static uint64_t t_on, t_off; /* the profiler range on CUPTI's clock; t_off 0 while open */
static int ranges;

#define CUPTI_OK(call)                                                                                             \
    do {                                                                                                           \
        CUptiResult r_ = (call);                                                                                   \
        if (r_ != CUPTI_SUCCESS) {                                                                                 \
            const char *s_ = NULL;                                                                                 \
            cuptiGetResultString(r_, &s_);                                                                         \
            fprintf(stderr, "ktrace: %s: %s\n", #call, s_ ? s_ : "?");                                            \
        }                                                                                                          \
    } while (0)

static void keep(char kind, uint32_t stream, uint64_t s, uint64_t e, uint64_t node, int grid, int block,
                 const char *name)
{
    if (!t_on || s < t_on || (t_off && s > t_off)) return;
    if (nrec == caprec) {
        size_t c = caprec ? 2 * caprec : 4096;
        rec *r = realloc(recs, c * sizeof *r);
        if (!r) return;
        recs = r;
        caprec = c;
    }
    rec *r = &recs[nrec++];
    r->kind = kind;
    r->stream = stream;
    r->start = s;
    r->end = e;
    r->node = node;
    r->grid = grid;
    r->block = block;
    snprintf(r->name, sizeof r->name, "%s", name ? name : "?");
}

static void CUPTIAPI buf_request(uint8_t **buf, size_t *size, size_t *maxrec)
{
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *maxrec = 0;
}

static void CUPTIAPI buf_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) {
        if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
            keep('K', k->streamId, k->start, k->end, k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, k->name);
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)a;
            char nm[64];
            snprintf(nm, sizeof nm, "memcpy kind %u, %llu bytes", (unsigned)m->copyKind,
                     (unsigned long long)m->bytes);
            keep('C', m->streamId, m->start, m->end, m->graphNodeId, 0, 0, nm);
        } else if (a->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *r = (const CUpti_ActivityAPI *)a;
            const char *nm = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, r->cbid, &nm);
            keep('R', r->threadId, r->start, r->end, 0, 0, 0, nm ? nm : "runtime call");
        } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)a;
            char nm[64];
            snprintf(nm, sizeof nm, "memset %llu bytes", (unsigned long long)m->bytes);
            keep('S', m->streamId, m->start, m->end, m->graphNodeId, 0, 0, nm);
        }
    }
    free(buf);
}

static void finish(void);

static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data)
{
    (void)ud;
    const CUpti_CallbackData *cb = data;
    if (dom != CUPTI_CB_DOMAIN_RUNTIME_API || cb->callbackSite != CUPTI_API_EXIT) return;
    uint64_t t;
    cuptiGetTimestamp(&t);
    if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && !ranges) {
        t_on = t;
        ranges = 1;
    } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && ranges == 1 && !t_off) {
        t_off = t; /* the program synchronised before it stopped the profiler: every record is complete */
        finish();
    }
}

static void finish(void)
{
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char *p = getenv("KTRACE_OUT");
    FILE *f = fopen(p && *p ? p : "ktrace.csv", "w");
    if (!f) {
        perror("ktrace: output");
        return;
    }
    fprintf(f, "kind,stream,start_ns,end_ns,node,grid,block,name\n");
    for (size_t i = 0; i < nrec; i++) {
        const rec *r = &recs[i];
        fprintf(f, "%c,%u,%llu,%llu,%llu,%d,%d,%s\n", r->kind, r->stream, (unsigned long long)(r->start - t_on),
                (unsigned long long)(r->end - t_on), (unsigned long long)r->node, r->grid, r->block, r->name);
    }
    fclose(f);
    fprintf(stderr, "ktrace: %zu records in the profiler range (%.1f us)\n", nrec,
            t_off ? (double)(t_off - t_on) / 1e3 : 0.0);
}

__attribute__((constructor)) static void ktrace_start(void)
{
    CUpti_SubscriberHandle sub;
    CUPTI_OK(cuptiActivityRegisterCallbacks(buf_request, buf_done));
    CUPTI_OK(cuptiSubscribe(&sub, on_api, NULL));
    const CUpti_CallbackDomain rt = CUPTI_CB_DOMAIN_RUNTIME_API;
    CUPTI_OK(cuptiEnableCallback(1, sub, rt, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
    CUPTI_OK(cuptiEnableCallback(1, sub, rt, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    const char *api = getenv("KTRACE_API");
    if (api && *api && *api != '0') CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
}
