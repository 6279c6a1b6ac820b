#!/usr/bin/env bash
# Session 36, call 4 (pack .plans/packs/s36c.tar.xz; carry [".plans/packs/s36c.tar.xz"]): call 3 again with the
# clusters' barrier semantics at CTA scope (call 3's .release.cluster arrive and .acquire.cluster wait cost a fence
# and an L1 invalidation each: 36% of the multicast up kernel's samples; it ran 21% slower than single blocks).
#   1. the grouped wgmma tests under the clusters; GPU model tests with them;
#   2. prefill 8K, 4K, 2K, two rounds alternating TERN_MOE_WGMMA_CLUSTER 1 / 2;
#   3. ncu of the 8K up kernel with the clusters.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s36c.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
TERN_MOE_WGMMA_CLUSTER=2 timeout 60 $G/tern_gpu_tests --gtest_filter='GpuMoeGroupedWgmma.*' > $P/t-2e.log 2>&1
echo "rc $? (cluster, edge shapes)"; pf $P/t-2e.log 6; grep -c "^\[       OK" $P/t-2e.log
TERN_MOE_WGMMA_CLUSTER=2 timeout 150 $G/tern_gpu_tests --gtest_filter='Shapes/GpuMoeGrouped.AgainstCpuAndLibrary/*' \
  > $P/t-2.log 2>&1
echo "rc $? (cluster)"; pf $P/t-2.log 6; grep -c "^\[       OK" $P/t-2.log
TERN_MOE_WGMMA_CLUSTER=2 timeout 150 $G/tern_gpu_model_tests > $P/model.log 2>&1; echo "rc $? (model, cluster)"
pf $P/model.log 4; grep -c "^\[       OK" $P/model.log
stamp "2. prefill"
rx="moe_grouped_wgmma_kernel"
for r in 1 2; do
  for mc in 1 2; do
    for n in 8192 4096 2048; do pf_rows c$mc-$r $n "$rx" TERN_MOE_WGMMA_CLUSTER=$mc; done
  done
done
stamp "3. ncu of the 8K up kernel, clusters"
TERN_MOE_WGMMA_CLUSTER=2 timeout 150 ncu --clock-control none --kernel-name regex:"moe_grouped_wgmma_kernel" \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section SourceCounters --section MemoryWorkloadAnalysis --import-source no \
  -o $P/moe-c2 $T bench-step --device cuda --config full --contexts 1024 --prefill 8192 --batches 1 --steps 1 \
  --warmup 0 > $P/ncu.log 2>&1
echo "rc $?"
timeout 60 ncu -i $P/moe-c2.ncu-rep --page details > $L/details-c2.txt 2>&1
timeout 60 ncu -i $P/moe-c2.ncu-rep --page source --csv --print-source sass > $L/sass-c2.csv 2>/dev/null
grep -E "moe_grouped|Duration|Issued Warp|No Eligible|L2 Cache Throughput" $L/details-c2.txt | head -5 | cut -c1-120
cp $P/pf-8192-c2-1.log $P/t-2e.log $P/model.log $L/ 2>/dev/null
stamp done
