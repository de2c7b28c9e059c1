#!/bin/bash
# device check of the routed experts on wgmma (src/backend/cuda/moe_wg.cu), one call: the fragment probe and
# the correctness tests (test_cuda_moe), the kernel benchmark on act_quant'd inputs (bench_gpu_moe), the V4-Flash
# slice with the wgmma path off and on (two runs each, alternating), then test_cuda and test_cuda_graph.
# From the repo root on the GPU machine, after tools/gpu_check.sh pack here:
#   run(command="bash tools/wg_check.sh", carry=[".carry"])
# WG_CHECK_ONLY="probe moe bench slice logits plogits san unit" picks steps (default: all); WG_BENCH_T,
# WG_SLICE_RUNS, WG_SLICE_B, WG_PREFILL and WG_PL_N (plogits' tokens) set the sizes, WG_SAN_TESTS the tests
# compute-sanitizer runs (test_gpu_act_fp8_h).
cd "$(dirname "$0")/.." || exit 1
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export MODEL_FIXTURE_DIR=$PWD/tests/fixtures/model
OUT=${OUT:-/tmp/wg_out}
mkdir -p "$OUT"
B=.carry/bin
want() { [ -z "${WG_CHECK_ONLY:-}" ] || [[ " $WG_CHECK_ONLY " == *" $1 "* ]]; }
step() { echo "== $* ($(date -u +%T))"; }
cat .carry/BUILD_INFO 2>/dev/null
if want probe; then
    step probe
    TEST_CUDA_FILTER=test_gpu_wg_probe timeout 60 $B/test_cuda_moe 2>&1 | tail -6
fi
# moe_test TITLE TEST SECONDS FILE LINES: one test of test_cuda_moe, its report lines
moe_test() {
    step "$1"
    TEST_CUDA_FILTER=$2 timeout $3 $B/test_cuda_moe > "$OUT/$4" 2>&1
    grep -E "\[moe\]|wgmma|wg-tiles|FAIL|PASSED|fail|rror" "$OUT/$4" | tail -$5
}
if want moe; then
    moe_test "act_fp8_h (every path, small dims)" test_gpu_act_fp8_h 150 moe_act.txt 16
    moe_test "wgmma at V4 dims" test_gpu_wgmma_v4dims 200 moe_v4.txt 12
    moe_test "wgmma tiles, weight scales far from the usual range" test_gpu_wgtiles_scales 120 moe_scales.txt 8
    moe_test "wgmma tiles of every width (skewed routing)" test_gpu_wgtiles_sizes 120 moe_sizes.txt 14
    moe_test "device routing (one block, chunked)" test_gpu_route 300 moe_route.txt 6
fi
if want bench; then
    step "bench_gpu_moe, act_quant'd runs"
    BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${WG_BENCH_T:-1,8,64,256,1024} timeout 150 $B/bench_gpu_moe 2>&1 | grep "^| [0-9]"
fi
if want slice; then
    step slice
    S=/tmp/slice
    [ -d $S ] || $B/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
    for v in ${WG_SLICE_RUNS:-0 1 2 0 1 2}; do
        echo "-- DEEPINFER_CUDA_MOE_WG=$v"
        DEEPINFER_CUDA_MOE_WG=$v timeout 200 $B/bench_gpu_layers $S --batches ${WG_SLICE_B:-1,8,64,256} --contexts 4096 \
            --prefill ${WG_PREFILL:-4096} --top1 1 --reps 3 --budget-s 90 --out "$OUT/layers_wg$v.md" > "$OUT/layers_wg$v.log" 2>&1
        grep -E "ms per step|prefill [0-9]+ tokens" "$OUT/layers_wg$v.md"
    done
fi
if want logits; then
    step "logits of the slice: CPU, and the GPU with the mma rows / wgmma f16 / wgmma e4m3, token by token"
    S=/tmp/slice
    [ -d $S ] || $B/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
    IDS=$(python3 -c "import random; random.seed(7); print(','.join(str(random.randrange(1000, 120000)) for _ in range(24)))")
    timeout 240 $B/deepinfer logits --model $S --input-ids $IDS --out-f32 "$OUT/lg_cpu.f32" > /dev/null 2> "$OUT/lg_cpu.err"
    echo "cpu rc=$?"
    for v in 0 1 2; do
        DEEPINFER_CUDA_MOE_WG=$v timeout 120 $B/deepinfer logits --model $S --input-ids $IDS --backend cuda --chunk 1 \
            --out-f32 "$OUT/lg_wg$v.f32" > /dev/null 2> "$OUT/lg_wg$v.err"
        echo "wg=$v rc=$?"
    done
    python3 - "$OUT" <<'PY'
import sys, numpy as np
o = sys.argv[1]
def load(n):
    try: return np.fromfile(f"{o}/{n}.f32", dtype=np.float32).reshape(24, -1)
    except Exception as e: print(n, "missing", e); return None
c = load("lg_cpu"); g = {v: load(f"lg_wg{v}") for v in (0, 1, 2)}
def cmp(a, b, what):
    if a is None or b is None: return
    rel = np.abs(a - b).max() / np.abs(b).max()
    top = (a.argmax(1) == b.argmax(1)).sum()
    print(f"{what}: max |diff| / max |ref| {rel:.3g}, top-1 same at {top}/24 positions")
for v in (0, 1, 2): cmp(g[v], c, f"gpu wg={v} vs cpu")
cmp(g[1], g[0], "gpu wg=1 vs wg=0"); cmp(g[2], g[0], "gpu wg=2 vs wg=0")
PY
fi
if want plogits; then
    step "logits of a ${WG_PL_N:-400}-token prefill in one shot (the wgmma tiles from 342 tokens): CPU, GPU with the path off / on"
    S=/tmp/slice
    [ -d $S ] || $B/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
    P=/tmp/wg_pl
    mkdir -p $P
    IDS=$(python3 -c "import random; random.seed(11); print(','.join(str(random.randrange(1000, 120000)) for _ in range(${WG_PL_N:-400})))")
    timeout 300 $B/deepinfer logits --model $S --input-ids $IDS --out-f32 "$P/cpu.f32" > /dev/null 2> "$P/cpu.err"
    echo "cpu rc=$?"
    for v in 0 1; do
        DEEPINFER_CUDA_MOE_WG=$v timeout 120 $B/deepinfer logits --model $S --input-ids $IDS --backend cuda \
            --out-f32 "$P/wg$v.f32" > /dev/null 2> "$P/wg$v.err"
        echo "wg=$v rc=$?"
    done
    python3 - "$P" "${WG_PL_N:-400}" <<'PY'
import sys, numpy as np
o, n = sys.argv[1], int(sys.argv[2])
def load(f):
    try: return np.fromfile(f"{o}/{f}.f32", dtype=np.float32).reshape(n, -1)
    except Exception as e: print(f, "missing", e); return None
c, g0, g1 = load("cpu"), load("wg0"), load("wg1")
def cmp(a, b, what):
    if a is None or b is None: return
    rel = np.abs(a - b).max(1) / np.abs(b).max(1)
    top = (a.argmax(1) == b.argmax(1)).sum()
    print(f"{what}: per-position max |diff| / max |ref| median {np.median(rel):.3g}, max {rel.max():.3g}; top-1 same at {top}/{n}")
cmp(g0, c, "gpu wg=0 vs cpu"); cmp(g1, c, "gpu wg=1 (tiles) vs cpu"); cmp(g1, g0, "gpu wg=1 vs wg=0")
PY
fi
if want san; then
    step "compute-sanitizer memcheck and racecheck on the wgmma tests (small dims)"
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/compute-sanitizer" ] && PATH=$PATH:$d && break; done
    for t in ${WG_SAN_TESTS:-test_gpu_act_fp8_h}; do
        for tool in memcheck racecheck; do
            TEST_CUDA_FILTER=$t timeout 240 compute-sanitizer --tool $tool $B/test_cuda_moe > "$OUT/san_${tool}_$t.txt" 2>&1
            echo "$t $tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/san_${tool}_$t.txt" | tr '\n' ' ')"
        done
    done
fi
if want unit; then
    step test_cuda
    timeout 420 $B/test_cuda > "$OUT/test_cuda.txt" 2>&1
    echo "rc=$?"
    grep -E "^\[  (PASSED|FAILED|  SKIPPED)|FAILED|rror" "$OUT/test_cuda.txt" | tail -12
    step test_cuda_graph
    timeout 120 $B/test_cuda_graph > "$OUT/test_cuda_graph.txt" 2>&1
    echo "rc=$?"
    tail -3 "$OUT/test_cuda_graph.txt"
fi
step done
