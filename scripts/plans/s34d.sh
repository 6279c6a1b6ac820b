#!/usr/bin/env bash
# Session 34, call 6 (pack .plans/packs/s34d.tar.xz; carry [".plans/packs/s34d.tar.xz"]): version 5's fixed cost a
# query. Calls 3-5 fitted CSA / HCA at 8 192 queries as ~13.6 us a query of fixed cost (q's load and norm, the first
# tiles, the epilogue) + ~2.5 us a 64-key pair. This pack reads the epilogue's sinks and rope sines in the prologue
# (shared memory), loads q 4 heads a warp at once, and makes version 5's grid persistent (a block a multiprocessor
# walking queries b, b + grid, ...: the producer runs on into the next query's tiles, no block start or end between
# queries). Predicted together: the fixed cost -4 to -7 us, CSA 2 405 -> ~1 900-2 100 us, HCA 1 463 -> ~1 000-1 200.
#   1. `*GpuAttentionPrefill*`, the GPU model tests;
#   2. the kernel bench, the prefill at TERN_ATTENTION_PREFILL 3 / 5;
#   3. ncu of a CSA launch of the 8K prefill (source counters), for the next step (a persistent kernel whose producer
#      loads the next query's q, or not).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s34d.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
step1() {
  stamp "1. tests"
  timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $L/ap-tests.log 2>&1; echo "rc $?"
  pf $L/ap-tests.log 12; grep -c "^\[       OK" $L/ap-tests.log
  timeout 300 $G/tern_gpu_model_tests > $P/model-tests.log 2>&1; echo "rc $? (model)"
  pf $P/model-tests.log 12; grep -c "^\[       OK" $P/model-tests.log
}
step2() {
  stamp "2. the kernel bench, the prefill 3 / 5"
  timeout 200 $G/tern_gpu_bench --only attention_prefill > $L/ap-bench.log 2>&1; echo "rc $? (bench)"
  grep -E "^ceiling|^\| (csa|hca) " $L/ap-bench.log | grep -E "ceiling|overlapped|ws_kernel" | cut -c1-170
  for p in 1024 8192; do
    for v in 3 5; do
      TERN_ATTENTION_PREFILL=$v timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
        --batches 1 --steps 2 --warmup 1 --profile --profile-top 45 > $P/pf-$p-v$v.log 2>&1; echo "rc $? ($p v$v)"
      grep -hE "^prefill \||error" $P/pf-$p-v$v.log | head -1 | cut -c1-100
      grep -hE "^\| (attention_prefill|attention_kv_bf16)" $P/pf-$p-v$v.log | head -2 | cut -c1-140
    done
  done
  cp $P/pf-8192-v5.log $L/profile-8192-v5.log
}
step3() {
  stamp "3. ncu of a CSA launch of the 8K prefill"
  timeout 200 ncu --clock-control none --kernel-name regex:"attention_prefill_ws_kernel" --launch-skip 46 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section Occupancy --section SourceCounters --import-source no -o $P/ap \
    $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --steps 1 --warmup 0 \
    > $P/ncu-ap.log 2>&1; echo "rc $?"
  timeout 60 ncu -i $P/ap.ncu-rep --page source --csv --print-source sass > $L/sass-ap.csv 2>/dev/null
  timeout 60 ncu -i $P/ap.ncu-rep --page details > $L/details-ap.txt 2>&1
  grep -E "attention_prefill_ws|Duration|Grid Size|Issued Warp|Eligible Warps|No Eligible" $L/details-ap.txt | head -14 | cut -c1-150
}
for s in ${STEPS:-1 2 3}; do step$s; done
stamp done
