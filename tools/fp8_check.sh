#!/bin/bash
# device check of the bf16-class paths of the bf16 maths (the FP8 tensor-core GEMMs, src/backend/cuda/fp8_gemm.cu;
# attention on bf16 tensor cores, attn.cu at_mma_kernel), one call: the probe of cuBLASLt's block scaling
# (tools/fp8lt_probe.cu: scale layouts against a double reference, times beside dequantise + bf16), test_cuda's FP8
# GEMM, op and model tests, test_cuda_attn, compute-sanitizer on both, the V4-Flash slice with each path off / on
# and in bf16x3, and the logits of a one-shot prefill against the CPU in each.  From the repo root on the GPU machine, after tools/gpu_check.sh pack here (which also builds
# the probe into .carry/bin):
#   run(command="bash tools/fp8_check.sh", carry=[".carry"])
# FP8_CHECK_ONLY="probe test san slice plogits" picks steps (default: all); FP8_PREFILL (4096,16384),
# FP8_BATCHES (1), FP8_PL_N (700) set the sizes; FP8_RUNS the configurations, each MATH:FP8GEMM:ATTN_MMA
# (DEEPINFER_CUDA_MATH, DEEPINFER_CUDA_FP8GEMM, DEEPINFER_CUDA_ATTN_MMA; default
# "bf16:0:0 bf16:1:0 bf16:1:1 bf16x3:0:0").
cd "$(dirname "$0")/.." || exit 1
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export MODEL_FIXTURE_DIR=$PWD/tests/fixtures/model
OUT=${OUT:-/tmp/fp8_out}
mkdir -p "$OUT"
B=.carry/bin
S=/tmp/slice
want() { [ -z "${FP8_CHECK_ONLY:-}" ] || [[ " $FP8_CHECK_ONLY " == *" $1 "* ]]; }
step() { echo "== $* ($(date -u +%T))"; }
RUNS=${FP8_RUNS:-bf16:0:0 bf16:1:0 bf16:1:1 bf16x3:0:0}
slice() { [ -d $S ] || $B/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1; }
cat .carry/BUILD_INFO 2>/dev/null
if want probe; then
    step "cuBLASLt block-scaled FP8: layouts and times"
    timeout 120 $B/fp8lt_probe
fi
if want test; then
    step "test_cuda: the FP8 GEMM, the ops, the model in the bf16 maths"
    TEST_CUDA_FILTER="test_linear_fp8_gemm" timeout 200 $B/test_cuda > "$OUT/t_fp8.txt" 2>&1
    echo "rc=$?"; grep -E "fp8 GEMM|PASSED|FAILED|rror" "$OUT/t_fp8.txt" | tail -8
    for t in test_ops_bf16 test_ops_bf16x3 test_model_bf16 test_model_bf16x3; do
        TEST_CUDA_FILTER=$t timeout 300 $B/test_cuda > "$OUT/t_$t.txt" 2>&1
        echo "$t rc=$?"; grep -E "\[  (PASSED|FAILED)|rror" "$OUT/t_$t.txt" | tail -3
    done
    step "test_cuda_attn (the fp32 and the bf16 tensor-core attention)"
    timeout 400 $B/test_cuda_attn > "$OUT/t_attn.txt" 2>&1
    echo "rc=$?"; grep -E "v4 |PASSED|FAILED|rror" "$OUT/t_attn.txt" | tail -16
fi
if want san; then
    step "compute-sanitizer memcheck on the FP8 GEMM test"
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/compute-sanitizer" ] && PATH=$PATH:$d && break; done
    TEST_CUDA_FILTER=test_linear_fp8_gemm timeout 300 compute-sanitizer --tool memcheck $B/test_cuda > "$OUT/san.txt" 2>&1
    echo "rc=$?: $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san.txt" | tr '\n' ' ')"
    TEST_CUDA_ATTN_FILTER=test_v4_window_only timeout 300 compute-sanitizer --tool memcheck $B/test_cuda_attn > "$OUT/san_attn.txt" 2>&1
    echo "attention (v4 window only) rc=$?: $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san_attn.txt" | tr '\n' ' ')"
    TEST_CUDA_ATTN_FILTER=test_v4_window_only timeout 300 compute-sanitizer --tool racecheck $B/test_cuda_attn > "$OUT/race_attn.txt" 2>&1
    echo "attention racecheck rc=$?: $(grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$OUT/race_attn.txt" | tr '\n' ' ')"
fi
if want slice; then
    step "slice prefill"
    slice
    for run in $RUNS; do
        IFS=: read -r m f a <<< "$run"
        echo "-- DEEPINFER_CUDA_MATH=$m DEEPINFER_CUDA_FP8GEMM=$f DEEPINFER_CUDA_ATTN_MMA=$a"
        DEEPINFER_CUDA_MATH=$m DEEPINFER_CUDA_FP8GEMM=$f DEEPINFER_CUDA_ATTN_MMA=$a timeout 250 $B/bench_gpu_layers $S \
            --batches ${FP8_BATCHES:-1} --contexts 4096 --prefill ${FP8_PREFILL:-4096,16384} --top1 1 --reps 3 \
            --budget-s 120 --out "$OUT/l_${m}_${f}_$a.md" > "$OUT/l_${m}_${f}_$a.log" 2>&1
        grep -E "^\| prefill \| 1 \| [0-9]+ \| [0-9.]+ \||GEMM time|prefill [0-9]+ tokens:|ms per step" "$OUT/l_${m}_${f}_$a.md"
    done
fi
if want plogits; then
    N=${FP8_PL_N:-700}
    step "logits of a $N-token one-shot prefill: CPU, GPU bf16 with the FP8 GEMMs off / on, bf16x3"
    slice
    P=/tmp/fp8_pl
    mkdir -p $P
    IDS=$(python3 -c "import random; random.seed(11); print(','.join(str(random.randrange(1000, 120000)) for _ in range($N)))")
    [ -f $P/cpu.f32 ] || timeout 400 $B/deepinfer logits --model $S --input-ids $IDS --out-f32 "$P/cpu.f32" > /dev/null 2> "$P/cpu.err"
    for run in $RUNS; do
        IFS=: read -r m f a <<< "$run"
        DEEPINFER_CUDA_MATH=$m DEEPINFER_CUDA_FP8GEMM=$f DEEPINFER_CUDA_ATTN_MMA=$a timeout 120 $B/deepinfer logits \
            --model $S --input-ids $IDS --backend cuda --out-f32 "$P/g_${m}_${f}_$a.f32" > /dev/null 2> "$P/g_${m}_${f}_$a.err"
        echo "$run rc=$?"
    done
    RUNS="$RUNS" python3 - "$P" "$N" <<'PY'
import os, sys, numpy as np
o, n = sys.argv[1], int(sys.argv[2])
def load(f):
    try: return np.fromfile(f"{o}/{f}.f32", dtype=np.float32).reshape(n, -1)
    except Exception as e: print(f, "missing", e); return None
c = load("cpu"); g = {k: load("g_" + k.replace(":", "_")) for k in os.environ["RUNS"].split()}
def cmp(a, b, what):
    if a is None or b is None: return
    rel = np.abs(a - b).max(1) / np.abs(b).max(1)
    cos = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    top = (a.argmax(1) == b.argmax(1)).sum()
    print(f"{what}: per-position max |diff| / max |ref| median {np.median(rel):.3g}, max {rel.max():.3g}; "
          f"cosine min {cos.min():.6f}; top-1 same at {top}/{n}")
for k in g: cmp(g[k], c, f"gpu {k} vs cpu")
ks = list(g)
for k in ks[1:]: cmp(g[k], g[ks[0]], f"gpu {k} vs gpu {ks[0]}")
PY
fi
step done
