#!/bin/bash
# device probe: ncu sections of the wgmma expert kernels (moe_wg.cu)
#   run(command="bash tools/ncu_wg.sh", carry=[".carry"])
# default: wg_kernel at T = NCU_T (64), f16 then e4m3; NCU_KERNEL=wt_kernel: the wgmma tiles at T = NCU_T (set it
# to a prefill size, e.g. 4096), one forward's two stages, with the stall reasons; NCU_KERNEL=forward: the GPU time
# of each kernel of a wg-tiles forward (routing, codes, both stages, combine)
cd "$(dirname "$0")/.." 2>/dev/null || cd .
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
N="--clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats"
KEYS="wg_kernel|wt_kernel|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps|Shared Memory Configuration Size|Dynamic Shared|Block Limit|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Issue Slots|stalled|L2 Cache Throughput|Memory Throughput"
if [ "${NCU_KERNEL:-wg_kernel}" = forward ]; then
    # every kernel of the wg-tiles forwards (the last rows of the aq runs): GPU time each, the last forward's
    BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-4096} timeout 400 $NCU --clock-control none --metrics gpu__time_duration.sum \
        --kernel-name regex:"route|rm_|wg_code|wt_kernel|combine" .carry/bin/bench_gpu_moe > $OUT/ncu_fwd.txt 2>&1
    echo "#### ncu_fwd (the last forward's kernels)"
    grep -E "^  [a-zA-Z_].*\(|gpu__time_duration" $OUT/ncu_fwd.txt | sed -E 's/^  (void )?//; s/\(.*//; s/ +gpu__time_duration.sum +/ /' |
        paste -d' ' - - | tail -${NCU_FWD_N:-9}
    exit 0
fi
if [ "${NCU_KERNEL:-wg_kernel}" = wt_kernel ]; then
    # the tiles run last in the aq rows: skip the first forwards of the other paths by kernel name alone
    BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-4096} timeout 300 $NCU $N --section ComputeWorkloadAnalysis \
        --metrics regex:smsp__warp_issue_stalled_.*_per_warp_active.pct --kernel-name regex:wt_kernel --launch-skip 4 \
        --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_wt.txt 2>&1
    echo "#### ncu_wt"
    grep -E "$KEYS|Pipe" $OUT/ncu_wt.txt | grep -v "^    [a-z_]*stalled.*  0[.,]" | cut -c1-200
    exit 0
fi
# the f16 kernels (bf16x3 runs first: launches 41-42 are one forward's G = 1, G = 2), then the e4m3 ones
BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-64} timeout 200 $NCU $N --kernel-name regex:wg_kernel --launch-skip 40 --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_wg16.txt 2>&1
BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-64} timeout 200 $NCU $N --kernel-name regex:wg_kernel --launch-skip 360 --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_wg8.txt 2>&1
for f in $OUT/ncu_wg16.txt $OUT/ncu_wg8.txt; do echo "#### $f"; grep -E "$KEYS" $f | cut -c1-400; done
