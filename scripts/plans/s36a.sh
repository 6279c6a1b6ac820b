#!/usr/bin/env bash
# Session 36, call 2 (pack .plans/packs/s36a.tar.xz; carry [".plans/packs/s36a.tar.xz"]): the wgmma MoE's two rings
# on one machine, with the auto tile width mended (the fewest tiles: 8K 128 pairs, where call 1's auto picked 32).
# TERN_MOE_WGMMA_RING (temporary A/B knob, mxfp4): deep (the default since 1c1be3c: up to 6 stages, h staged in two
# halves) / shallow (session 35's: at most 4 stages, the whole h at once; 128-pair up tiles 3 stages). Both wait for
# the next stage at k-step 7.
#   1. the grouped wgmma tests under both rings, and the attention-prefill tests call 1's timeout cut off;
#   2. prefill 8K (auto 128), 4K (128), 2K (64), two rounds alternating the rings; 8K at 112 pairs both rings;
#   3. ncu of the 8K up kernel (128 pairs) under each ring: the consumers' wait for the next stage.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s36a.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
for ring in deep shallow; do
  TERN_MOE_WGMMA_RING=$ring timeout 150 $G/tern_gpu_tests \
    --gtest_filter='GpuMoeGroupedWgmma.*:Shapes/GpuMoeGrouped.AgainstCpuAndLibrary/*' > $P/t-$ring.log 2>&1
  echo "rc $? ($ring)"; pf $P/t-$ring.log 6; grep -c "^\[       OK" $P/t-$ring.log
done
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill.Op*/v4flash' > $P/t-att.log 2>&1
echo "rc $? (attention)"; pf $P/t-att.log 6; grep -c "^\[       OK" $P/t-att.log
stamp "2. prefill"
rx="moe_grouped_wgmma_kernel"
for r in 1 2; do
  for ring in deep shallow; do
    for n in 8192 4096 2048; do pf_rows $ring-$r $n "$rx" TERN_MOE_WGMMA_RING=$ring; done
  done
done
for ring in deep shallow; do pf_rows n112-$ring 8192 "$rx" TERN_MOE_WGMMA_N=112 TERN_MOE_WGMMA_RING=$ring; done
stamp "3. ncu of the 8K up kernel, each ring"
for ring in deep shallow; do
  TERN_MOE_WGMMA_RING=$ring timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_wgmma_kernel" \
    --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section SourceCounters --import-source no -o $P/moe-$ring $T bench-step \
    --device cuda --config full --contexts 1024 --prefill 8192 --batches 1 --steps 1 --warmup 0 > $P/ncu-$ring.log 2>&1
  echo "rc $? ($ring)"
  timeout 60 ncu -i $P/moe-$ring.ncu-rep --page details > $L/details-$ring.txt 2>&1
  timeout 60 ncu -i $P/moe-$ring.ncu-rep --page source --csv --print-source sass > $L/sass-$ring.csv 2>/dev/null
  grep -E "moe_grouped|Duration|Issued Warp|No Eligible" $L/details-$ring.txt | head -4 | cut -c1-120
done
cp $P/pf-8192-deep-1.log $P/pf-8192-shallow-1.log $L/
stamp done
