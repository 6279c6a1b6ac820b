#!/usr/bin/env bash
# Session 27, call 4 (pack s27g: bd53b0d + TERN_MOE_L2_FIRST, carry [".plans"]). Call 3's batch-1 trace: the MoE's down kernel takes ~20 us
# after h's quantisation for 25 MB (41% of copy), the up kernel ~31 us for 50 MB beside the shared expert's 24 MB.
#   0. GpuV4.MoeRoutingInThePlanKernel (with the L2 prefetch's case);
#   1. in-process A/B at 1 / 16 / 64, two rounds: TERN_MOE_L2_FIRST=1 (the prep kernel prefetches each bulk block's
#      first item into L2; predicted -1 to -2% at batch 1), TERN_MOE_EARLY_DOWN=1 (w2's first stages copied before the down
#      kernel's PDL wait), TERN_MOE_VARIANT=1 (16 consumer warps, jobs of 8) and =2 (down items of 16 rows: twice the
#      items, 8 stages);
#   2. ncu on the bulk kernels alone at T = 1 (tern_gpu_bench --only moe --quick: the first up and down launches):
#      DRAM throughput, occupancy, warp stalls.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27g.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "0. test"
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuV4.MoeRouting*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 6
stamp "1. in-process A/B"
timeout 240 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_L2_FIRST=1 --ab TERN_MOE_EARLY_DOWN=1 --ab TERN_MOE_VARIANT=1 --ab TERN_MOE_VARIANT=2 --ab-rounds 2 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | cut -c1-150
stamp "2. ncu on moe_bulk at T = 1"
timeout 100 ncu --clock-control none --kernel-name regex:moe_bulk --launch-count 2 --section SpeedOfLight \
  --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats \
  $G/tern_gpu_bench --only moe --quick > $L/ncu.log 2>&1; echo "rc $?"
grep -E "moe_bulk|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Grid Size|Stall|Dynamic Shared" $L/ncu.log | head -60 | cut -c1-130
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
