#!/bin/bash
# one short device call: the kernel and unit tests, the slice at 4K, and the batch-1 kernel profile
cd "$(dirname "$0")/.."
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64 MODEL_FIXTURE_DIR=$PWD/tests/fixtures/model
B=.carry/bin; O=$OUT
( .carry/bin/deepinfer make-tiny-model /tmp/slice --preset v4-flash --layers 4 > $O/slice.txt 2>&1 ) &
timeout 60 $B/test_cuda_graph > $O/graph.txt 2>&1; echo "test_cuda_graph rc=$?"; grep -E "PASSED|FAILED|Failure" $O/graph.txt | head -5
timeout 100 $B/test_cuda > $O/unit.txt 2>&1; echo "test_cuda rc=$?"; grep -E "PASSED|FAILED|Failure|\[bf16x3, device graph\]" $O/unit.txt | head -16
wait; tail -1 $O/slice.txt
timeout 70 $B/bench_gpu_layers /tmp/slice --hf $PWD/.carry/hf_r3.json --batches 1,8,64,256 --contexts 4096 --prefill 4096 --reps 3 --budget-s 40 --out $O/layers.md > $O/layers.txt 2> $O/layers.err; echo "layers rc=$?"
grep -E "^\| decode|^\| prefill|  decode|  prefill" $O/layers.txt
BENCH_NCU_B=1 timeout 40 ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
  $B/bench_gpu_layers /tmp/slice --batches 1 --contexts 4096 --prefill 4096 --reps 2 --budget-s 30 > $O/ncu_b1.csv 2>/dev/null; echo "ncu rc=$?"
