#!/bin/bash
# device probe: the GPU time of the attention op's kernels in a prefill of the V4-Flash slice (ncu kernel durations,
# summed per kernel name over the bench's prefills: warm-up, timed, profiled).  From the repo root on the GPU
# machine after tools/gpu_check.sh pack here:
#   run(command="bash tools/ncu_prefill.sh", carry=[".carry"])
# NCU_P (4096): prefill tokens; NCU_REGEX: the kernels (default the indexer, selection and attention kernels);
# NCU_ENV: extra environment for the run (e.g. "DEEPINFER_CUDA_MATH=bf16").
cd "$(dirname "$0")/.." || exit 1
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
S=/tmp/slice
[ -d $S ] || .carry/bin/deepinfer make-tiny-model $S --preset v4-flash --layers 4 2>&1 | tail -1
OUT=${OUT:-/tmp/ncu_prefill}
mkdir -p "$OUT"
env ${NCU_ENV:-} timeout 300 $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
    --kernel-name "regex:${NCU_REGEX:-ix_score|sel_groups|sel_final|at_mma|at_split|at_merge}" \
    .carry/bin/bench_gpu_layers $S --batches 1 --contexts 4096 --prefill ${NCU_P:-4096} --reps 1 --budget-s 60 \
    > "$OUT/ncu_prefill.csv" 2> "$OUT/ncu_prefill.err"
echo "ncu rc=$?"
python3 - "$OUT/ncu_prefill.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.Counter(); cnt = collections.Counter()
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); v = v / 1e3 if r[ui] in ("ns", "nsecond") else v if r[ui] in ("us", "usecond") else v * 1e3
    name = r[ki].split("(")[0].split("<")[0]
    tot[name] += v; cnt[name] += 1
for k, v in tot.most_common(): print(f"{k:40s} {cnt[k]:5d} launches {v / 1e3:9.2f} ms")
PY
