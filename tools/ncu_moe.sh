#!/bin/bash
# device probe: ncu sections for the mma-rows MoE kernels at T = 1 and 256 (bench_gpu_moe)
cd "$(dirname "$0")/.."
[ -d .carry/bin ] || tar xf .carry/bin.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
N="--clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis"
BENCH_GPU_MOE_T=1,256 timeout 200 ncu $N --kernel-name regex:mr_kernel --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_moe_t1.txt 2>&1
BENCH_GPU_MOE_T=1,256 timeout 200 ncu $N --kernel-name regex:mr_kernel --launch-skip 320 --launch-count 2 .carry/bin/bench_gpu_moe > $OUT/ncu_moe_t256.txt 2>&1
grep -E "mr_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|One or More|Active Warps" $OUT/ncu_moe_t1.txt $OUT/ncu_moe_t256.txt | cut -c1-200
