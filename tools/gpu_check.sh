#!/usr/bin/env bash
# gpu_check.sh - the whole GPU check of the CUDA backend (issue 7) in one call.
#
#   tools/gpu_check.sh pack       here, on the build machine (no GPU needed;
#                                 PACK_KEEP / PACK_ADD trim or extend the
#                                 binaries, see pack()):
#                                 build test_cuda, bench_cuda_linear and deepinfer
#                                 with the local nvcc (sm_90) into $BUILD_DIR
#                                 (default /tmp/cub), and copy them, the Debian
#                                 shared libraries the GPU machine lacks (jansson,
#                                 cmocka, http-parser, cudart) and the headers a
#                                 rebuild there would need into .carry/ (ignored
#                                 through .git/info/exclude)
#   tools/gpu_check.sh [OUTDIR]   on the GPU machine, from the repo root, with
#                                 .carry/ carried: the kernel tests (graph,
#                                 dequant), unit_cuda (device graph and host
#                                 graph, and re-runs with 5-row attention launches
#                                 and with every FP8/FP4 GEMM dequantised), the CLI
#                                 and serve on the fixtures (--backend cuda vs
#                                 cpu), the kernel benchmarks, compute-sanitizer
#                                 (op tests, model tests, the device graph) and the
#                                 V4-Flash slice benchmark beside transformers;
#                                 everything goes to OUTDIR (default $OUT), the
#                                 summary to OUTDIR/gpu_check.txt.  Sections:
#                                 GPU_CHECK_ONLY (below).
#
# The GPU machine has its own CUDA 13.0 (libcublas is too big to carry); the
# script finds it.  If the carried binaries cannot start there (another glibc),
# it rebuilds test_cuda and the benchmark from source with that machine's gcc
# and nvcc against the carried headers and libraries.
# The device tool invocation used for docs/CUDA.md:
#   run(command="bash tools/gpu_check.sh", carry=[".carry"], timeout_s=540)
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

pack() {
    set -e
    local b=${BUILD_DIR:-/tmp/cub}
    cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
    ninja -C "$b" test_cuda test_cuda_graph test_cuda_dequant bench_cuda_linear deepinfer deepinfer_cuda
    rm -rf .carry
    mkdir -p .carry/bin .carry/lib .carry/include
    cp "$b/test_cuda" "$b/test_cuda_graph" "$b/test_cuda_dequant" "$b/bench_cuda_linear" "$b/deepinfer" "$b/libdeepinfer_cuda.so" .carry/bin/
    # attention and indexer kernels (attn.cu): their test and benchmark
    ninja -C "$b" test_cuda_attn bench_gpu_attn
    cp "$b/test_cuda_attn" "$b/bench_gpu_attn" .carry/bin/
    # the grouped FP4 routed-expert FFN (moe.cu): its test and benchmark
    ninja -C "$b" test_cuda_moe bench_gpu_moe
    cp "$b/test_cuda_moe" "$b/bench_gpu_moe" .carry/bin/
    # sampled tokens drawn on the device (sample.cu) against the host sampler
    ninja -C "$b" test_cuda_sample bench_gpu_sample
    cp "$b/test_cuda_sample" "$b/bench_gpu_sample" .carry/bin/
    # the FP8 tiles for decode batches' FP8 linears (fp8_tile.cu) against the dequantised GEMM
    ninja -C "$b" bench_gpu_fp8_tiles
    cp "$b/bench_gpu_fp8_tiles" .carry/bin/
    # the V4-Flash slice benchmark (bench/gpu_layers.c; the slice is made there by deepinfer make-tiny-model)
    ninja -C "$b" bench_gpu_layers
    cp "$b/bench_gpu_layers" .carry/bin/
    # a chain of batch-1 FP8 GEMVs, a launch a step against one persistent launch (bench/gpu_chain.c)
    ninja -C "$b" bench_gpu_chain
    cp "$b/bench_gpu_chain" .carry/bin/
    # the probe of cuBLASLt's block-scaled FP8 GEMM (tools/fp8lt_probe.cu, run by tools/fp8_check.sh)
    ninja -C "$b" fp8lt_probe
    cp "$b/fp8lt_probe" .carry/bin/
    # the kernel timeline (tools/ktrace.c) and the CUPTI it needs, where the toolkit has it
    if ninja -C "$b" ktrace >/dev/null 2>&1; then
        cp "$b/libktrace.so" .carry/lib/
        cp -L "$(ldd "$b/libktrace.so" | awk '/libcupti/ {print $3}')" .carry/lib/ 2>/dev/null || true
    fi
    ldd .carry/bin/* | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
        case $(basename "$lib") in
        libjansson.so*|libcmocka.so*|libhttp_parser.so*|libcudart.so*) cp -L "$lib" .carry/lib/ ;;
        esac
    done
    for h in jansson.h jansson_config.h cmocka.h http_parser.h; do
        cp "/usr/include/$h" .carry/include/ 2>/dev/null || cp "/usr/include/x86_64-linux-gnu/$h" .carry/include/
    done
    # the cuda target cannot see .git there: record what was built
    { echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src tests tools CMakeLists.txt || echo '+local changes')";
      echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release; echo "$PRETTY_NAME"), $(nvcc --version | tail -1)"; } > .carry/BUILD_INFO
    grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
    ls -l .carry/bin .carry/lib
    # a short device call needs only a few binaries: PACK_KEEP="test_cuda bench_gpu_layers" keeps those (and the
    # deepinfer CLI with its CUDA module, which makes the slice), PACK_ADD="bench_gpu_layers0=/tmp/old/bench_gpu_layers"
    # adds other builds under a name (an A/B in one call); the kept ones are stripped
    if [ -n "${PACK_KEEP:-}" ]; then
        for f in .carry/bin/*; do
            n=$(basename "$f")
            [[ " $PACK_KEEP deepinfer libdeepinfer_cuda.so " == *" $n "* ]] || rm -f "$f"
        done
    fi
    for a in ${PACK_ADD:-}; do cp "${a#*=}" ".carry/bin/${a%%=*}"; done
    [ -n "${PACK_KEEP:-}${PACK_ADD:-}" ] && strip .carry/bin/* 2>/dev/null
    # the device tool carries at most 64 MiB with the tree; each binary holds the whole device code, which packs
    # about 5:1 alone, and the binaries share most of it: one xz stream with a window larger than the tar (one
    # thread, 192 MiB) packs six ~21 MB binaries into 5.4 MB where -6T0 (8 MiB windows) made 20 MB
    tar cf - -C .carry bin | xz -T1 --lzma2=preset=6,dict=192MiB -c > .carry/bin.txz && rm -rf .carry/bin
    du -sh .carry
}

if [ "${1:-}" = pack ]; then pack; exit $?; fi

OUTDIR=${1:-${OUT:-/tmp/gpu_check_out}}
mkdir -p "$OUTDIR"
SUM=$OUTDIR/gpu_check.txt
: > "$SUM"
say() { echo "$*" | tee -a "$SUM"; }
section() { say ""; say "== $*"; }
# a test binary's exit status in words (77: the skip code, never a pass)
verdict() { case $1 in 0) echo PASS ;; 77) echo SKIPPED ;; *) echo FAIL ;; esac; }

# GPU_CHECK_ONLY="kernels unit cli serve linear sample attn moe chain sanitizer sanmodel sangraph layers" picks sections (default: all;
# unit includes kernels: test_cuda_graph and test_cuda_dequant)
want() { [ -z "${GPU_CHECK_ONLY:-}" ] || [[ " $GPU_CHECK_ONLY " == *" $1 "* ]]; }

say "# tools/gpu_check.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
[ -f .carry/BUILD_INFO ] && sed 's/^/# /' .carry/BUILD_INFO | tee -a "$SUM"
say "# $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
say "# $(nvcc --version 2>/dev/null | tail -1), $(uname -r)"

# libcublas from the machine's CUDA; the carried libraries first
CUBLAS_DIR=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libcublas.so.13" ] && { CUBLAS_DIR=$d; break; }
done
if [ -z "$CUBLAS_DIR" ]; then
    f=$(find / -xdev -name 'libcublas.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)
    [ -n "$f" ] && CUBLAS_DIR=$(dirname "$f")
fi
say "# libcublas.so.13 from: ${CUBLAS_DIR:-NOT FOUND}"
export LD_LIBRARY_PATH="$ROOT/.carry/lib${CUBLAS_DIR:+:$CUBLAS_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MODEL_FIXTURE_DIR=$ROOT/tests/fixtures/model
BIN=$ROOT/.carry/bin
[ -f "$ROOT/.carry/bin.txz" ] && [ ! -d "$BIN" ] && tar xf "$ROOT/.carry/bin.txz" -C "$ROOT/.carry"
# compute-sanitizer ships in the toolkit's bin/, which is not always on PATH
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/compute-sanitizer" ] && PATH=$PATH:$d && break; done

rebuild() {
    section "rebuilding from source on this machine (the carried binaries did not start)"
    local b=/tmp/gpu_check_build cuda=${CUDA_HOME:-/usr/local/cuda}
    mkdir -p "$b"
    local cf="-O2 -g -std=gnu11 -I$ROOT/src -I$ROOT/.carry/include -DNDEBUG"
    local objs=()
    for s in src/base/err.c src/base/pool.c src/base/scratch.c src/model/dtype.c src/model/safetensors.c \
             src/model/config.c src/model/v4.c src/model/v4_load.c src/backend/cpu/cpu.c; do
        gcc $cf -O3 -c "$s" -o "$b/$(basename "$s").o" || return 1
        objs+=("$b/$(basename "$s").o")
    done
    for s in src/backend/cuda/cuda.cu src/backend/cuda/kernels.cu src/backend/cuda/attn.cu src/backend/cuda/moe.cu \
             src/backend/cuda/graph.cu src/backend/cuda/dequant.cu; do
        nvcc -O3 -arch=sm_90 -I"$ROOT/src" -c "$s" -o "$b/$(basename "$s").o" || return 1
        objs+=("$b/$(basename "$s").o")
    done
    # the wgmma expert stages: sm_90a alone (moe.cu calls them)
    nvcc -O3 --generate-code=arch=compute_90a,code=sm_90a -I"$ROOT/src" -c src/backend/cuda/moe_wg.cu -o "$b/moe_wg.cu.o" || return 1
    objs+=("$b/moe_wg.cu.o")
    local libs=(-L"$ROOT/.carry/lib" -l:libjansson.so.4 -L"$cuda/lib64" ${CUBLAS_DIR:+-L$CUBLAS_DIR} -lcudart -lcublas -lstdc++ -lm -lpthread)
    gcc $cf -DMODEL_FIXTURE_DIR="\"$MODEL_FIXTURE_DIR\"" tests/unit/test_cuda.c "${objs[@]}" -l:libcmocka.so.0 "${libs[@]}" -o "$b/test_cuda" || return 1
    gcc $cf src/backend/cuda/bench_linear.c "${objs[@]}" "${libs[@]}" -o "$b/bench_cuda_linear" || return 1
    # attention and indexer kernels (attn.cu): their test and benchmark need only attn.cu
    gcc $cf -I"$cuda/include" -DMODEL_FIXTURE_DIR="\"$MODEL_FIXTURE_DIR\"" tests/unit/test_cuda_graph.c "${objs[@]}" \
        -l:libcmocka.so.0 "${libs[@]}" -o "$b/test_cuda_graph" || say "test_cuda_graph rebuild failed"
    { gcc $cf -I"$cuda/include" tests/unit/test_cuda_attn.c "$b/attn.cu.o" -l:libcmocka.so.0 "${libs[@]}" -o "$b/test_cuda_attn" &&
      gcc $cf -I"$cuda/include" bench/gpu_attn.c "$b/attn.cu.o" "${libs[@]}" -o "$b/bench_gpu_attn"; } || say "attn rebuild failed"
    # the grouped FP4 routed-expert FFN (moe.cu): the test decodes with dtype.c (in objs), the benchmark times cuBLAS
    { gcc $cf -I"$cuda/include" tests/unit/test_cuda_moe.c "$b/moe.cu.o" "$b/moe_wg.cu.o" "$b/graph.cu.o" "$b/dtype.c.o" -l:libcmocka.so.0 "${libs[@]}" -o "$b/test_cuda_moe" &&
      gcc $cf -I"$cuda/include" bench/gpu_moe.c "$b/moe.cu.o" "$b/moe_wg.cu.o" "$b/graph.cu.o" "${libs[@]}" -o "$b/bench_gpu_moe"; } || say "moe rebuild failed"
    BIN=$b
    say "rebuilt test_cuda and bench_cuda_linear in $b (no deepinfer CLI in this mode)"
}

# a missing library or a glibc symbol version this machine lacks shows as "not found"
if [ -n "${FORCE_REBUILD:-}" ] || [ ! -x "$BIN/test_cuda" ] || ! ldd "$BIN/test_cuda" >/dev/null 2>&1 || ldd "$BIN/test_cuda" 2>&1 | grep -q "not found"; then
    ldd "$BIN/test_cuda" 2>&1 | grep "not found" | tee -a "$SUM"
    rebuild || say "REBUILD FAILED"
fi

if want unit || want kernels; then
section "unit_cuda_graph (test_cuda_graph: the graph's non-GEMM kernels vs host references)"
timeout 200 "$BIN/test_cuda_graph" > "$OUTDIR/unit_cuda_graph.txt" 2>&1
rc=$?
grep -E "^  |PASSED|FAILED|SKIPPED|Failure|ERROR" "$OUTDIR/unit_cuda_graph.txt" | head -60 | tee -a "$SUM"
say "test_cuda_graph exit status: $rc ($(verdict $rc))"
section "unit_cuda_dequant (test_cuda_dequant: FP8 / FP4 -> bf16, bit-exact vs dtype.c)"
timeout 200 "$BIN/test_cuda_dequant" > "$OUTDIR/unit_cuda_dequant.txt" 2>&1
rc=$?
grep -E "^  |PASSED|FAILED|SKIPPED|Failure|ERROR" "$OUTDIR/unit_cuda_dequant.txt" | head -40 | tee -a "$SUM"
say "test_cuda_dequant exit status: $rc ($(verdict $rc))"
fi
if want unit; then
section "unit_cuda (test_cuda)"
timeout 300 "$BIN/test_cuda" > "$OUTDIR/unit_cuda.txt" 2>&1
rc=$?
grep -E "^\s+\[|bad device|unsupported weight|PASSED|FAILED|OK \]|ERROR|Failure|SKIPPED|rel error|differs|agreement|rowdot_x8|rowdot grouped" "$OUTDIR/unit_cuda.txt" | tee -a "$SUM"
say "test_cuda exit status: $rc ($(verdict $rc))"
section "unit_cuda model tests again with 5-row attention launches (segments cut across launches)"
DEEPINFER_CUDA_ATTN_ROWS=5 TEST_CUDA_FILTER='test_model_bf16x3*' timeout 300 "$BIN/test_cuda" > "$OUTDIR/unit_cuda_rows5.txt" 2>&1
rc=$?
grep -E "PASSED|FAILED|Failure|ERROR|max rel|differs|agreement" "$OUTDIR/unit_cuda_rows5.txt" | tee -a "$SUM"
say "test_cuda (5-row launches) exit status: $rc"
section "unit_cuda model tests again with every FP8 / FP4 GEMM through dequantise + cuBLAS (DEEPINFER_CUDA_DEQUANT_T=1)"
DEEPINFER_CUDA_DEQUANT_T=1 TEST_CUDA_FILTER='test_model_bf16x3*' timeout 300 "$BIN/test_cuda" > "$OUTDIR/unit_cuda_deq1.txt" 2>&1
rc=$?
grep -E "PASSED|FAILED|Failure|ERROR|max rel|differs|agreement" "$OUTDIR/unit_cuda_deq1.txt" | tee -a "$SUM"
say "test_cuda (dequant GEMMs) exit status: $rc"
section "unit_cuda model tests again with the compressors on the host (DEEPINFER_DEV_COMP=0: waits where an entry completes)"
DEEPINFER_DEV_COMP=0 TEST_CUDA_FILTER='test_model_bf16x3*' timeout 300 "$BIN/test_cuda" > "$OUTDIR/unit_cuda_hostcomp.txt" 2>&1
rc=$?
grep -E "PASSED|FAILED|Failure|ERROR|max rel|differs|agreement" "$OUTDIR/unit_cuda_hostcomp.txt" | tee -a "$SUM"
say "test_cuda (host compressors) exit status: $rc"
for mb in 0 1; do
section "unit_cuda model tests again with $mb MB of partial-block slots (DEEPINFER_CUDA_PART_MB=$mb; 0: off, every partial block staged; 1: evictions)"
DEEPINFER_CUDA_PART_MB=$mb TEST_CUDA_FILTER='test_model_bf16x3*' timeout 300 "$BIN/test_cuda" > "$OUTDIR/unit_cuda_part$mb.txt" 2>&1
rc=$?
DEEPINFER_CUDA_PART_MB=$mb TEST_CUDA_FILTER='test_device_ring*' timeout 300 "$BIN/test_cuda" >> "$OUTDIR/unit_cuda_part$mb.txt" 2>&1
rc=$((rc + $?))
grep -E "PASSED|FAILED|Failure|ERROR|max rel|differs|agreement" "$OUTDIR/unit_cuda_part$mb.txt" | tee -a "$SUM"
say "test_cuda ($mb MB of partial-block slots) exit status: $rc"
done

fi
if want cli; then
if [ -x "$BIN/deepinfer" ]; then
    section "deepinfer CLI: --backend cuda vs cpu (tiny-mixed, transformers semantics, 48 tokens)"
    ids=$(python3 -c 'import random; r=random.Random(5); print(",".join(str(r.randrange(512)) for _ in range(48)))')
    prompt=$(echo "$ids" | cut -d, -f1-40)
    for fx in tiny-mixed tiny-mixed-fp8fp4; do
        m=$MODEL_FIXTURE_DIR/$fx
        rm -f "$OUTDIR/cpu.f32" "$OUTDIR/cuda.f32"
        "$BIN/deepinfer" logits --model "$m" --semantics transformers --input-ids "$ids" --out-f32 "$OUTDIR/cpu.f32" >/dev/null 2>>"$OUTDIR/cli_err.txt"
        a=$?
        timeout 120 "$BIN/deepinfer" logits --backend cuda --model "$m" --semantics transformers --input-ids "$ids" --out-f32 "$OUTDIR/cuda.f32" >/dev/null 2>>"$OUTDIR/cli_err.txt"
        b=$?
        [ $b = 0 ] || { say "$fx: deepinfer logits --backend cuda failed (exit $b)"; continue; }
        cmp=$(python3 - "$OUTDIR/cpu.f32" "$OUTDIR/cuda.f32" <<'PY' 2>&1
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open(sys.argv[2], 'rb').read())
V = 512; worst = 0.0
for p in range(len(a) // V):
    ra, rb = a[p*V:(p+1)*V], b[p*V:(p+1)*V]
    worst = max(worst, max(abs(x - y) for x, y in zip(ra, rb)) / max(abs(x) for x in ra))
print(f"max rel error per position {worst:.2e} over {len(a)//V} positions")
PY
)
        g1=$("$BIN/deepinfer" generate --json --model "$m" --semantics transformers --input-ids "$prompt" --max-tokens 16 2>>"$OUTDIR/cli_err.txt")
        g2=$(timeout 120 "$BIN/deepinfer" generate --json --backend cuda --model "$m" --semantics transformers --input-ids "$prompt" --max-tokens 16 2>>"$OUTDIR/cli_err.txt")
        say "$fx: logits exit cpu=$a cuda=$b; $cmp; generate 16: $([ -n "$g1" ] && [ "$g1" = "$g2" ] && echo identical || echo "DIFFERS: cpu=$g1 cuda=$g2")"
    done
    rm -f "$OUTDIR/cpu.f32" "$OUTDIR/cuda.f32"
    DEEPINFER_CUDA_MATH=nonsense "$BIN/deepinfer" logits --backend cuda --model "$MODEL_FIXTURE_DIR/tiny-mixed" --input-ids 1,2 >/dev/null 2>"$OUTDIR/cli_bad.txt"
    say "bad DEEPINFER_CUDA_MATH: exit $? -- $(head -1 "$OUTDIR/cli_bad.txt")"
    [ -s "$OUTDIR/cli_err.txt" ] && { say "CLI stderr:"; head -5 "$OUTDIR/cli_err.txt" | tee -a "$SUM"; }
fi

fi
if want serve; then
if [ -x "$BIN/deepinfer" ]; then
    section "deepinfer serve --backend cuda vs cpu (e2e-v4vocab, transformers semantics, greedy chat, 16 tokens)"
    export DEEPINFER_TOKENIZER=$ROOT/assets/tokenizers/deepseek-v4/tokenizer.json
    for be in cpu cuda; do
        "$BIN/deepinfer" serve --backend $be --model "$MODEL_FIXTURE_DIR/e2e-v4vocab" --semantics transformers \
            --port 0 2>"$OUTDIR/serve_$be.log" &
        pid=$!
        python3 - "$OUTDIR/serve_$be.log" > "$OUTDIR/serve_$be.json" 2>>"$OUTDIR/serve_err.txt" <<'PY'
import json, re, sys, time, urllib.request
port = None
for _ in range(300):
    m = re.search(r"on http://[\d.]+:(\d+)", open(sys.argv[1]).read())
    if m:
        port = m.group(1); break
    time.sleep(0.1)
body = {"model": "e2e-v4vocab", "messages": [{"role": "user", "content": "Hello from the GPU check"}],
        "max_tokens": 16, "temperature": 0, "thinking": {"type": "disabled"}}
rq = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                            headers={"Content-Type": "application/json"})
r = json.loads(urllib.request.urlopen(rq, timeout=120).read())
print(json.dumps({"content": r["choices"][0]["message"]["content"], "usage": r["usage"]}))
PY
        kill $pid 2>/dev/null; wait $pid 2>/dev/null
    done
    if [ -s "$OUTDIR/serve_cpu.json" ] && cmp -s "$OUTDIR/serve_cpu.json" "$OUTDIR/serve_cuda.json"; then
        say "serve: cpu and cuda answers identical: $(head -c 200 "$OUTDIR/serve_cuda.json")"
    else
        say "serve: DIFFER or failed: cpu=$(head -c 200 "$OUTDIR/serve_cpu.json" 2>/dev/null) cuda=$(head -c 200 "$OUTDIR/serve_cuda.json" 2>/dev/null)"
        head -3 "$OUTDIR/serve_cuda.log" "$OUTDIR/serve_err.txt" 2>/dev/null | tee -a "$SUM"
    fi
fi

fi
if want linear; then
section "bench_cuda_linear"
timeout 200 "$BIN/bench_cuda_linear" 2>&1 | tee "$OUTDIR/bench.txt" | tee -a "$SUM"
say "bench exit status: $?"

fi
if want sample; then
section "unit_cuda_sample (test_cuda_sample: draws on the device vs the host sampler), memcheck and racecheck"
if [ -x "$BIN/test_cuda_sample" ]; then
    timeout 300 "$BIN/test_cuda_sample" > "$OUTDIR/unit_cuda_sample.txt" 2>&1
    rc=$?
    grep -E "^  |PASSED|FAILED|SKIPPED|Failure|ERROR" "$OUTDIR/unit_cuda_sample.txt" | tee -a "$SUM"
    say "test_cuda_sample exit status: $rc ($(verdict $rc))"
    if [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
        for tool in memcheck racecheck; do
            timeout 300 compute-sanitizer --tool $tool --error-exitcode 99 "$BIN/test_cuda_sample" \
                > "$OUTDIR/${tool}_sample.txt" 2>&1
            say "$tool exit status: $? -- $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUTDIR/${tool}_sample.txt" | tail -1)"
        done
    fi
    section "bench_gpu_sample"
    timeout 200 "$BIN/bench_gpu_sample" 2>&1 | tee "$OUTDIR/bench_sample.txt" | tee -a "$SUM"
    say "bench_gpu_sample exit status: $?"
else
    say "test_cuda_sample: not built"
fi

fi
if want attn; then
section "unit_cuda_attn (test_cuda_attn: attention + indexer kernels vs the double CPU reference)"
if [ -x "$BIN/test_cuda_attn" ]; then
    timeout 400 "$BIN/test_cuda_attn" > "$OUTDIR/unit_cuda_attn.txt" 2>&1
    rc=$?
    grep -E "^\s+\[|^  |PASSED|FAILED|SKIPPED|Failure|ERROR" "$OUTDIR/unit_cuda_attn.txt" | tee -a "$SUM"
    say "test_cuda_attn exit status: $rc ($(verdict $rc))"
    section "bench_gpu_attn"
    timeout 300 "$BIN/bench_gpu_attn" 2>&1 | tee "$OUTDIR/bench_attn.txt" | tee -a "$SUM"
    say "bench_gpu_attn exit status: $?"
    if [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
        section "compute-sanitizer memcheck (small cases) and racecheck (small CSA) on test_cuda_attn"
        TEST_CUDA_ATTN_FILTER='test_small_*' timeout 240 compute-sanitizer --tool memcheck --error-exitcode 99 \
            "$BIN/test_cuda_attn" > "$OUTDIR/sanitizer_attn.txt" 2>&1
        say "memcheck exit status: $? -- $(grep -E "ERROR SUMMARY" "$OUTDIR/sanitizer_attn.txt" | tail -1)"
        TEST_CUDA_ATTN_FILTER='test_small_csa' timeout 240 compute-sanitizer --tool racecheck --error-exitcode 99 \
            "$BIN/test_cuda_attn" > "$OUTDIR/racecheck_attn.txt" 2>&1
        say "racecheck exit status: $? -- $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUTDIR/racecheck_attn.txt" | tail -1)"
    fi
else
    say "test_cuda_attn not built"
fi

fi
if want moe; then
section "unit_cuda_moe (test_cuda_moe: grouped FP4 routed-expert FFN vs the double CPU reference)"
if [ -x "$BIN/test_cuda_moe" ]; then
    timeout 240 "$BIN/test_cuda_moe" > "$OUTDIR/unit_cuda_moe.txt" 2>&1
    rc=$?
    grep -E "^  |PASSED|FAILED|SKIPPED|Failure|ERROR" "$OUTDIR/unit_cuda_moe.txt" | tee -a "$SUM"
    say "test_cuda_moe exit status: $rc ($(verdict $rc))"
    section "bench_gpu_moe"
    timeout 240 "$BIN/bench_gpu_moe" 2>&1 | tee "$OUTDIR/bench_moe.txt" | tee -a "$SUM"
    say "bench_gpu_moe exit status: $?"
    if [ -x "$BIN/bench_gpu_fp8_tiles" ]; then
        section "bench_gpu_fp8_tiles (FP8 linears at decode batches: the FP8 tiles vs the dequantised GEMM)"
        timeout 240 "$BIN/bench_gpu_fp8_tiles" 2>&1 | tee "$OUTDIR/bench_fp8_tiles.txt" | tee -a "$SUM"
        say "bench_gpu_fp8_tiles exit status: $?"
    fi
    if [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
        section "compute-sanitizer memcheck and racecheck on test_cuda_moe (small dims, a few cases)"
        TEST_CUDA_MOE_QUICK=1 TEST_CUDA_SKIP='test_gpu_v4dims' timeout 180 compute-sanitizer --tool memcheck \
            --error-exitcode 99 "$BIN/test_cuda_moe" > "$OUTDIR/sanitizer_moe.txt" 2>&1
        say "memcheck exit status: $? -- $(grep -E "ERROR SUMMARY" "$OUTDIR/sanitizer_moe.txt" | tail -1)"
        TEST_CUDA_MOE_QUICK=1 TEST_CUDA_SKIP='test_gpu_v4dims' timeout 180 compute-sanitizer --tool racecheck \
            --error-exitcode 99 "$BIN/test_cuda_moe" > "$OUTDIR/racecheck_moe.txt" 2>&1
        say "racecheck exit status: $? -- $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUTDIR/racecheck_moe.txt" | tail -1)"
    fi
else
    say "test_cuda_moe not built"
fi

fi
if want chain; then
section "bench_gpu_chain (batch-1 FP8 GEMVs: the backend's row-dots, chain.cu a launch a step, chain.cu persistent)"
if [ -x "$BIN/bench_gpu_chain" ]; then
    timeout 240 "$BIN/bench_gpu_chain" 2>&1 | tee "$OUTDIR/bench_chain.txt" | tee -a "$SUM"
    say "bench_gpu_chain exit status: ${PIPESTATUS[0]}"
fi
fi

if want sanitizer; then
section "compute-sanitizer memcheck on test_cuda (ops tests; the model tests are skipped here)"
if [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
    TEST_CUDA_SKIP='test_model_*' timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 "$BIN/test_cuda" > "$OUTDIR/sanitizer.txt" 2>&1
    src=$?
    grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUTDIR/sanitizer.txt" | head -8 | tee -a "$SUM"
    say "compute-sanitizer exit status: $src"
    TEST_CUDA_FILTER='test_rowdot*' timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 "$BIN/test_cuda" > "$OUTDIR/racecheck_rowdot.txt" 2>&1
    say "racecheck on the row-dot tests (mma path, clusters): exit $? -- $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUTDIR/racecheck_rowdot.txt" | tail -1)"
else
    say "compute-sanitizer not found"
fi
fi
if want sanmodel && [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
    section "compute-sanitizer memcheck on the model tests (test_model_bf16x3: the graph with GPU attention and MoE)"
    TEST_CUDA_FILTER='test_model_bf16x3' timeout 300 compute-sanitizer --tool memcheck --error-exitcode 99 \
        "$BIN/test_cuda" > "$OUTDIR/sanitizer_model.txt" 2>&1
    src=$?
    grep -E "ERROR SUMMARY|Invalid|PASSED|FAILED" "$OUTDIR/sanitizer_model.txt" | head -8 | tee -a "$SUM"
    say "compute-sanitizer (model tests) exit status: $src"
fi

if want sangraph && [ -z "${GPU_CHECK_NO_SANITIZER:-}" ] && command -v compute-sanitizer >/dev/null; then
    section "compute-sanitizer memcheck, initcheck and racecheck on the device graph (test_device_ring_copies_follow_the_state)"
    for tool in memcheck initcheck racecheck; do
        TEST_CUDA_FILTER='test_device_ring_copies_follow_the_state' timeout 240 compute-sanitizer --tool $tool \
            --error-exitcode 99 "$BIN/test_cuda" > "$OUTDIR/sanitizer_graph_$tool.txt" 2>&1
        say "$tool exit status: $? -- $(grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$OUTDIR/sanitizer_graph_$tool.txt" | tail -1)"
    done
fi

if want layers; then
    section "V4-Flash slice: deepinfer make-tiny-model --preset v4-flash, bench/gpu_layers_hf.py, bench_gpu_layers"
    SLICE=${GPU_LAYERS_DIR:-/tmp/v4flash-slice}
    if [ -x "$BIN/deepinfer" ] && [ -x "$BIN/bench_gpu_layers" ]; then
        t=$(date +%s)
        "$BIN/deepinfer" make-tiny-model "$SLICE" --preset v4-flash --layers "${GPU_LAYERS_N:-4}" 2>&1 | tail -1 | tee -a "$SUM"
        say "slice written in $(( $(date +%s) - t )) s; $(df -h "$SLICE" | tail -1)"
        hfargs=()
        if [ -f bench/gpu_layers_hf.py ] && [ -z "${GPU_LAYERS_NO_HF:-}" ]; then
            t=$(date +%s)
            timeout "${GPU_LAYERS_HF_TIMEOUT:-420}" python3 bench/gpu_layers_hf.py "$SLICE" --device cuda \
                --out "$OUTDIR/gpu_layers_hf.json" ${GPU_LAYERS_HF_ARGS:-} > "$OUTDIR/gpu_layers_hf.txt" 2> "$OUTDIR/gpu_layers_hf.err"
            say "gpu_layers_hf.py exit status: $? after $(( $(date +%s) - t )) s"
            cat "$OUTDIR/gpu_layers_hf.txt" | tee -a "$SUM"
            tail -5 "$OUTDIR/gpu_layers_hf.err" | tee -a "$SUM"
            [ -s "$OUTDIR/gpu_layers_hf.json" ] && hfargs=(--hf "$OUTDIR/gpu_layers_hf.json")
        elif [ -s bench/ref/gpu_layers_hf_h200.json ]; then
            # transformers not run here: the checked-in reference of the default slice on an H200
            # (bench/gpu_layers_hf.py's output; bench_gpu_layers refuses it for a model of another shape)
            hfargs=(--hf bench/ref/gpu_layers_hf_h200.json)
            say "transformers' times from bench/ref/gpu_layers_hf_h200.json (not run here)"
        fi
        t=$(date +%s)
        timeout "${GPU_LAYERS_TIMEOUT:-500}" "$BIN/bench_gpu_layers" "$SLICE" "${hfargs[@]}" --out "$OUTDIR/gpu_layers.md" \
            ${GPU_LAYERS_ARGS:-} 2> "$OUTDIR/gpu_layers.err" | tee -a "$SUM"
        say "bench_gpu_layers exit status: $? after $(( $(date +%s) - t )) s"
        tail -20 "$OUTDIR/gpu_layers.err" | tee -a "$SUM"
        # one batch-1 step's kernel timeline (tools/ktrace.c; python3 tools/ktrace.py ktrace_b1.csv reads it)
        if [ -f .carry/lib/libktrace.so ]; then
            BENCH_NCU_B=1 KTRACE_OUT="$OUTDIR/ktrace_b1.csv" LD_PRELOAD="$PWD/.carry/lib/libktrace.so" timeout 120 \
                "$BIN/bench_gpu_layers" "$SLICE" --batches 1 --contexts 4096 --prefill 512 --top1 1 --reps 15 \
                > "$OUTDIR/ktrace_b1.txt" 2>&1
            python3 tools/ktrace.py "$OUTDIR/ktrace_b1.csv" --top 12 --gaps 5 2>&1 | tee -a "$SUM"
        fi
        rm -rf "$SLICE"
    else
        say "deepinfer or bench_gpu_layers not carried"
    fi
fi

say ""
say "summary in $SUM"
# the device tool returns at most 8 files: the summary, the layer tables, and the rest in one archive
( cd "$OUTDIR" && ls | grep -vxE 'gpu_check.txt|gpu_layers.md|gpu_layers_hf.json|details.tgz' > /tmp/gpu_check_rest.txt &&
  [ -s /tmp/gpu_check_rest.txt ] && tar czf details.tgz -T /tmp/gpu_check_rest.txt && xargs rm -f < /tmp/gpu_check_rest.txt ) 2>/dev/null
true
