#!/bin/bash
# device probe (issue 7): the V4-Flash slice's decode and prefill under each of PROBE_VARIANTS (env settings, ";"
# between variants; default: the MoE expert loop from 2048 tokens against the grouped kernel at every T), then ncu
# kernel durations of one batch-1 decode step.  From the repo root on the GPU
# machine with .carry/ carried (tools/gpu_check.sh pack):
#   run(command="bash tools/moe_loop_probe.sh", carry=[".carry"])
cd "$(dirname "$0")/.." || exit 1
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
OUT=${OUT:-/tmp/probe_out}; mkdir -p "$OUT"
S=/tmp/slice
.carry/bin/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
IFS=';' read -r -a variants <<< "${PROBE_VARIANTS:-DEEPINFER_CUDA_MOE_LOOP_T=2048;DEEPINFER_CUDA_MOE_LOOP_T=1000000000}"
i=0
[ "${PROBE_VARIANTS:-}" = none ] && variants=()
for v in "${variants[@]}"; do
  i=$((i + 1))
  echo "== ${v:-defaults}"
  env $v timeout 200 .carry/bin/bench_gpu_layers $S --batches ${PROBE_BATCHES:-1} --contexts 4096 \
    --prefill ${PROBE_PREFILL:-4096,16384} --reps 2 --budget-s 60 --out "$OUT/layers_$i.md" 2>&1 | grep -E "prefill|decode B|^\| (prefill|decode)"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ -z "${PROBE_NO_NCU:-}" ]; then
  for nb in ${PROBE_NCU_B:-1}; do
  t=$(date +%s)
  BENCH_NCU_B=$nb timeout 200 $NCU --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv .carry/bin/bench_gpu_layers $S --batches $nb --contexts 4096 --prefill 4096 \
    --reps 2 --budget-s 60 ${PROBE_NCU_ARGS:-} > "$OUT/ncu_b$nb.csv" 2> "$OUT/ncu_b$nb.err"
  echo "ncu B=$nb rc=$? $(( $(date +%s)-t )) s, $(grep -c '"gpu__time_duration.sum"' "$OUT/ncu_b$nb.csv") kernels"
  python3 - "$OUT/ncu_b$nb.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    if r[ui] == "Metric Unit": continue
    v = float(r[vi].replace(",", "")); v = v / 1000 if r[ui] in ("ns", "nsecond") else v
    name = r[ki][:70]; tot[name] += v; cnt[name] += 1
print(f"GPU time of the profiled step: {sum(tot.values()):.0f} us in {sum(cnt.values())} kernels")
for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:25]: print(f"  {v:8.1f} us {cnt[k]:4d}x  {k}")
PY
  done
fi
rm -rf $S
