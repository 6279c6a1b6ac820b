#!/usr/bin/env bash
# Session 26, call 3: act_quant alone signalling before its wait (4555071, pack s26c) against the base (650fe6a,
# pack s26). Carry [".plans"].
#   1. PDL tests and the graph / invariance model tests on the new binary;
#   2. bench-step base / new alternating, three rounds, batch 1 / 16 / 64;
#   3. ncu (no clock control) on the new binary: hc_pre_finish, moe_bulk and act_quant at batch 1 and 16, and
#      act_quant at the 8K prefill (141 us a call for 160 MB: 1.1 TB/s, why?).
# Predicted: batch 16 -1 to -2% (the products after act_quant gain its predecessor's run time of head start; no
# cascade into the MoE chain), batch 1 and 64 within noise.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26c.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuPdl*:*QuantisingKernel*:*ActFp8Linear.BatchInvariant*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 8
timeout 200 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*BatchInvariance*:*MixedSteps*' > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step base / new, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^decode |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
stamp "3. ncu"
NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
for bt in 1 16; do
  (( $(date +%s) - T0 > 420 )) && { echo "skipped: time"; break; }
  timeout 120 $NCU --kernel-name regex:"hc_pre_finish|hc_mix|moe_bulk|act_quant_kernel|moe_plan|route_scored" --launch-skip 1700 --launch-count 12 \
    $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches $bt --steps 4 --warmup 2 > $L/ncu-b$bt.log 2>&1; echo "rc $? (b$bt)"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit Shared|Grid Size" $L/ncu-b$bt.log | head -80 | cut -c1-120
done
(( $(date +%s) - T0 < 480 )) && { timeout 110 $NCU --kernel-name regex:"act_quant_kernel" --launch-skip 400 --launch-count 2 \
  $T bench-step --device cuda --config full --contexts 1024 --prefill 8192 --batches 1 --steps 1 --warmup 0 > $L/ncu-prefill.log 2>&1
  echo "rc $?"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Memory Throughput|L2 Hit|Grid Size" $L/ncu-prefill.log | head -30 | cut -c1-120; }
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
