#!/bin/bash
# device probe: ncu sections of the wgmma expert kernels (moe_wg.cu) at T = NCU_T (64), f16 then e4m3
#   run(command="bash tools/ncu_wg.sh", carry=[".carry"])
cd "$(dirname "$0")/.." 2>/dev/null || cd .
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
N="--clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats"
# the f16 kernels (bf16x3 runs first: launches 41-42 are one forward's G = 1, G = 2), then the e4m3 ones
BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-64} timeout 200 $NCU $N --kernel-name regex:wg_kernel --launch-skip 40 --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_wg16.txt 2>&1
BENCH_GPU_MOE_AQ=1 BENCH_GPU_MOE_T=${NCU_T:-64} timeout 200 $NCU $N --kernel-name regex:wg_kernel --launch-skip 360 --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_wg8.txt 2>&1
for f in $OUT/ncu_wg16.txt $OUT/ncu_wg8.txt; do echo "#### $f"; grep -E "wg_kernel|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps|Shared Memory Configuration Size|Dynamic Shared|Block Limit|L1/TEX Hit|Mem Busy|Max Bandwidth|Issue Slots|stalled" $f | cut -c1-400; done
