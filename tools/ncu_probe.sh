#!/bin/bash
# device probe: where a decode step's GPU time goes (ncu kernel durations) + baseline table
cd "$(dirname "$0")/.." 2>/dev/null || true
tar xf .carry/bin.txz -C .carry
CUB=$(ls -d /usr/local/cuda/lib64 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$CUB
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
S=/tmp/slice; t=$(date +%s)
.carry/bin/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1; echo "slice $(( $(date +%s)-t )) s"
for B in ${NCU_BS:-1 64 256}; do
  t=$(date +%s)
  BENCH_NCU_B=$B timeout 200 $NCU --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    .carry/bin/bench_gpu_layers $S --batches $B --contexts 4096 --prefill 4096 --reps 2 --budget-s 60 > $OUT/ncu_b$B.csv 2> $OUT/ncu_b$B.err
  echo "ncu B=$B rc=$? $(( $(date +%s)-t )) s, $(grep -c '"gpu__time_duration.sum"' $OUT/ncu_b$B.csv) kernels"
done
