#!/usr/bin/env bash
# Session 34, call 3 (pack .plans/packs/s34b.tar.xz = 0576ba6; carry [".plans/packs/s34b.tar.xz"]):
#   1. prefill attention version 5 (the launch's keys decoded once to bf16, version 4's producer only copying):
#      `*GpuAttentionPrefill*` (v5 must give version 4's bits), then the kernel bench (one layer at 8 192 queries,
#      versions 0-5), then the 1K / 8K prefill at TERN_ATTENTION_PREFILL 3 / 5 with the attention rows.
#      Predicted: version 4's producer was its limit (an L2 round trip a 32-key tile, ~500 decodes of each key at 8K);
#      with copies only, CSA at 8K 4 845 (v3) -> ~2 000-2 500 us a layer; the q load (128 KB of f32 a query, one block
#      an SM) is then exposed: ~5 us of each query's ~15-20.
#   2. ncu of the 8K grouped MoE up kernel on wgmma (source counters + pipe figures): where its ~50% of the tensor
#      rate goes;
#   3. the full prefill profiles at 1K and 8K (profile-top 45), kept in $OUT.
# STEPS (default "1 2 3") picks the steps.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s34b.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
step1() {
  stamp "1. version 5: tests, the kernel bench, the prefill at 3 / 5"
  timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $L/ap-tests.log 2>&1; rc=$?
  echo "rc $rc"; pf $L/ap-tests.log 12; grep -c "^\[       OK" $L/ap-tests.log
  if [[ $rc -eq 0 ]]; then
    timeout 200 $G/tern_gpu_bench --only attention_prefill > $L/ap-bench.log 2>&1; echo "rc $? (bench)"
    grep -E "^ceiling|^\| (csa|hca) " $L/ap-bench.log | cut -c1-170
    for p in 1024 8192; do
      for v in 3 5; do
        TERN_ATTENTION_PREFILL=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
          --batches 1 --steps 2 --warmup 1 --profile --profile-top 45 > $L/pf-$p-v$v.log 2>&1; echo "rc $? ($p v$v)"
        grep -hE "^prefill \||error" $L/pf-$p-v$v.log | head -1 | cut -c1-100
        grep -hE "^\| (attention_prefill|attention_kv_bf16)" $L/pf-$p-v$v.log | head -3 | cut -c1-140
      done
    done
  fi
}
step2() {
  stamp "2. ncu of the 8K wgmma up kernel"
  timeout 200 ncu --clock-control none --kernel-name regex:"moe_grouped_wgmma_kernel" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section SourceCounters --import-source no -o $P/wg \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --steps 1 --warmup 0 \
    > $P/ncu-wg.log 2>&1; echo "rc $?"
  timeout 60 ncu -i $P/wg.ncu-rep --page source --csv --print-source sass > $L/sass-wg.csv 2>/dev/null
  timeout 60 ncu -i $P/wg.ncu-rep --page details > $L/details-wg.txt 2>&1
  grep -E "moe_grouped_wgmma|Duration|DRAM Throughput|Issued Warp|Eligible Warps|No Eligible|Registers Per|Achieved Occ" \
    $L/details-wg.txt | head -10 | cut -c1-150
}
step3() {
  stamp "3. the default's full prefill profiles"
  for p in 1024 8192; do
    timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 --steps 2 \
      --warmup 1 --profile --profile-top 45 > $L/profile-$p.log 2>&1; echo "rc $? ($p)"
    grep -hE "^prefill \|" $L/profile-$p.log | head -1 | cut -c1-100
  done
}
for s in ${STEPS:-1 2 3}; do step$s; done
stamp done
