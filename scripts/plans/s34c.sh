#!/usr/bin/env bash
# Session 34, call 5 (pack .plans/packs/s34c.tar.xz = 03cef09; carry [".plans/packs/s34c.tar.xz"]): version 5 the
# default, and versions 4 / 5 issuing the next pair's S right after P V (predicted -5 to -10% on the kernel, the same
# bits).
#   1. `*GpuAttentionPrefill*` (v5 = v4 bits, the default 5), the GPU model tests under the new default (the
#      PyTorch fixtures, graphs = eager, batch invariance);
#   2. the kernel bench (versions 0-5), the prefill at TERN_ATTENTION_PREFILL 3 / 5, two rounds;
#   3. ncu of the v5 kernel at 8K (source counters, warp states): what the next step is.
# STEPS (default "1 2 3") picks the steps.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s34c.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
step1() {
  stamp "1. tests"
  timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $L/ap-tests.log 2>&1; echo "rc $?"
  pf $L/ap-tests.log 12; grep -c "^\[       OK" $L/ap-tests.log
  timeout 300 $G/tern_gpu_model_tests > $L/model-tests.log 2>&1; echo "rc $? (model)"
  pf $L/model-tests.log 12; grep -c "^\[       OK" $L/model-tests.log
}
step2() {
  stamp "2. the kernel bench, the prefill 3 / 5"
  timeout 200 $G/tern_gpu_bench --only attention_prefill > $L/ap-bench.log 2>&1; echo "rc $? (bench)"
  grep -E "^ceiling|^\| (csa|hca) " $L/ap-bench.log | grep -E "ceiling|overlapped|ws_kernel" | cut -c1-170
  for r in 1 2; do
    for p in 1024 8192; do
      for v in 3 5; do
        TERN_ATTENTION_PREFILL=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
          --batches 1 --steps 2 --warmup 1 --profile --profile-top 45 > $P/pf-$r-$p-v$v.log 2>&1; echo "rc $? ($r $p v$v)"
        grep -hE "^prefill \||error" $P/pf-$r-$p-v$v.log | head -1 | cut -c1-100
        grep -hE "^\| (attention_prefill|attention_kv_bf16)" $P/pf-$r-$p-v$v.log | head -2 | cut -c1-140
      done
    done
  done
  cp $P/pf-2-8192-v5.log $L/profile-8192-v5.log
}
step3() {
  stamp "3. ncu of version 5 at 8K"
  timeout 200 ncu --clock-control none --kernel-name regex:"attention_prefill_ws_kernel" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats \
    --section ComputeWorkloadAnalysis --section Occupancy --section SourceCounters --import-source no -o $P/ap \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --steps 1 --warmup 0 \
    > $P/ncu-ap.log 2>&1; echo "rc $?"
  timeout 60 ncu -i $P/ap.ncu-rep --page source --csv --print-source sass > $L/sass-ap.csv 2>/dev/null
  timeout 60 ncu -i $P/ap.ncu-rep --page details > $L/details-ap.txt 2>&1
  grep -E "attention_prefill_ws|Duration|DRAM Throughput|Issued Warp|Eligible Warps|No Eligible|Registers Per|Achieved Occ|highest-utilized" \
    $L/details-ap.txt | head -10 | cut -c1-150
}
for s in ${STEPS:-1 2 3}; do step$s; done
stamp done
