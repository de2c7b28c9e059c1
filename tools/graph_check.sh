#!/bin/bash
# device check of the decode regions replayed from CUDA graphs (be_dev_ops.graph_begin, cuda.cu dv_graph_begin;
# DEEPINFER_CUDA_GRAPHS) and of their chains on lanes (be_dev_ops.lane; DEEPINFER_CUDA_LANES), one call: test_cuda's test_decode_graphs (bit-identical decode with and without either,
# the regions recorded and replayed), the rest of test_cuda, test_cuda_graph and test_cuda_attn, compute-sanitizer
# memcheck on the graphs test, and the V4-Flash slice's decode steps with the graphs off and on in each maths.  From
# the repo root on the GPU machine, after tools/gpu_check.sh pack here:
#   run(command="bash tools/graph_check.sh", carry=[".carry"])
# GRAPH_CHECK_ONLY="graphs tests san slice" picks steps (default: all); GRAPH_BATCHES (1,64,256), GRAPH_PREFILL (4096),
# GRAPH_MATHS (bf16x3 bf16), GRAPH_ORDER (the runs in turn, each GRAPHS:LANES for DEEPINFER_CUDA_GRAPHS and
# DEEPINFER_CUDA_LANES; "0:0 1:1") and GRAPH_REPS (5) the slice's runs.
cd "$(dirname "$0")/.." || exit 1
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
export MODEL_FIXTURE_DIR=$PWD/tests/fixtures/model
OUT=${OUT:-/tmp/graph_out}
mkdir -p "$OUT"
B=.carry/bin
S=/tmp/slice
want() { [ -z "${GRAPH_CHECK_ONLY:-}" ] || [[ " $GRAPH_CHECK_ONLY " == *" $1 "* ]]; }
step() { echo "== $* ($(date -u +%T))"; }
cat .carry/BUILD_INFO 2>/dev/null
if want graphs; then
    step "test_cuda: test_decode_graphs"
    TEST_CUDA_FILTER=test_decode_graphs timeout 300 $B/test_cuda > "$OUT/t_graphs.txt" 2>&1
    echo "rc=$?"; grep -E "graphs:|PASSED|FAILED|rror" "$OUT/t_graphs.txt" | tail -12
fi
if want tests; then
    step "test_cuda (all but the graphs test), test_cuda_graph, test_cuda_attn"
    TEST_CUDA_SKIP=test_decode_graphs timeout 500 $B/test_cuda > "$OUT/t_cuda.txt" 2>&1
    echo "test_cuda rc=$?"; grep -E "\[  (PASSED|FAILED)|^\[  FAILED|rror" "$OUT/t_cuda.txt" | tail -6
    timeout 200 $B/test_cuda_graph > "$OUT/t_graph.txt" 2>&1
    echo "test_cuda_graph rc=$?"; grep -E "\[  (PASSED|FAILED)|rror" "$OUT/t_graph.txt" | tail -4
    timeout 300 $B/test_cuda_attn > "$OUT/t_attn.txt" 2>&1
    echo "test_cuda_attn rc=$?"; grep -E "\[  (PASSED|FAILED)|rror" "$OUT/t_attn.txt" | tail -4
fi
if want san; then
    step "compute-sanitizer memcheck on test_decode_graphs"
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/compute-sanitizer" ] && PATH=$PATH:$d && break; done
    TEST_CUDA_FILTER=test_decode_graphs timeout 400 compute-sanitizer --tool memcheck $B/test_cuda > "$OUT/san.txt" 2>&1
    echo "rc=$?: $(grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san.txt" | tr '\n' ' ')"
fi
if want slice; then
    step "slice decode, CUDA graphs off / on"
    [ -d $S ] || $B/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
    for m in ${GRAPH_MATHS:-bf16x3 bf16}; do
        k=0
        for gl in ${GRAPH_ORDER:-0:0 1:1}; do
            k=$((k + 1))
            IFS=: read -r g l <<< "$gl"
            echo "-- DEEPINFER_CUDA_MATH=$m DEEPINFER_CUDA_GRAPHS=$g DEEPINFER_CUDA_LANES=$l"
            DEEPINFER_CUDA_MATH=$m DEEPINFER_CUDA_GRAPHS=$g DEEPINFER_CUDA_LANES=$l timeout 200 $B/bench_gpu_layers $S \
                --batches ${GRAPH_BATCHES:-1,64,256} --contexts 4096 --prefill ${GRAPH_PREFILL:-4096} --top1 1 \
                --reps ${GRAPH_REPS:-5} --budget-s 150 --out "$OUT/l_${m}_${g}${l}_$k.md" > "$OUT/l_${m}_${g}${l}_$k.log" 2>&1
            echo "rc=$?"; grep -E "ms/step|prefill [0-9]+ tokens:" "$OUT/l_${m}_${g}${l}_$k.log" | sed 's/^.*decode/decode/'
            grep -E "^\| decode \| [0-9]+ \| 4096 \| (SWA|CSA|HCA)" "$OUT/l_${m}_${g}${l}_$k.md" |
                awk -F'|' '{printf "%s/%s:%s ", $3,$5,$6} END {print ""}'
        done
    done
fi
step done
