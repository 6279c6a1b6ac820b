#!/usr/bin/env bash
# Written in session 34 for the next session's first call (session 34's device time ran out; pack
# .plans/packs/s34e.tar.xz = 1290c36's code; carry [".plans/packs/s34e.tar.xz"]): call 6 measured version 5
# with four changes together (the next S early, the epilogue tables, q 4 heads at once, a persistent grid) slower in the
# prefill (8K attention 2 578 -> 2 746 us a layer). Each alone, by TERN_ATTENTION_WS_STEPS (bits 1 / 2 / 4 / 8):
#   1. `*GpuAttentionPrefill*` under steps 0 (the default, not yet run in this form) and 15 (TEST_STEPS; version 5 =
#      version 4's bits);
#   2. the 8K prefill at steps 0, 1, 2, 4, 8, 15 and the 1K at 0, 15 (the attention rows);
#   3. ncu of version 5 on the bench's CSA layer at 8 192 queries (its first `attention_prefill_ws_kernel<512, true>`
#      launch; session 34's `--launch-skip` on bench-step caught the context's launches instead): warp states and
#      source counters, for the per-pair chain (both warpgroups in lockstep through two named barriers a pair).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s34e.tar.xz
source scripts/plans/env.sh
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
for st in ${TEST_STEPS:-0 15}; do
  TERN_ATTENTION_WS_STEPS=$st timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*' > $L/ap-tests-$st.log 2>&1
  echo "rc $? (steps $st)"; pf $L/ap-tests-$st.log 6; grep -c "^\[       OK" $L/ap-tests-$st.log
done
timeout 300 $G/tern_gpu_model_tests > $P/model-tests.log 2>&1; echo "rc $? (model, the default steps)"
pf $P/model-tests.log 6; grep -c "^\[       OK" $P/model-tests.log
stamp "2. prefill by steps"
for p in 8192 1024; do
  sts="0 1 2 4 8 15"; [[ $p == 1024 ]] && sts="0 15"
  for st in $sts; do
    TERN_ATTENTION_WS_STEPS=$st timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill $p \
      --batches 1 --steps 2 --warmup 1 --profile --profile-top 45 > $P/pf-$p-$st.log 2>&1; echo "rc $? ($p steps $st)"
    grep -hE "^prefill \||error" $P/pf-$p-$st.log | head -1 | cut -c1-100
    grep -hE "^\| attention_prefill_ws" $P/pf-$p-$st.log | head -1 | cut -c1-140
  done
done
stamp "3. ncu of version 5 on the bench's CSA layer"
timeout 240 ncu --clock-control none --kernel-name-base demangled --kernel-name regex:"attention_prefill_ws_kernel<512, true>" \
  --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section SourceCounters --import-source no -o $P/csa \
  $G/tern_gpu_bench --only attention_prefill > $P/ncu-csa.log 2>&1; echo "rc $?"
timeout 60 ncu -i $P/csa.ncu-rep --page source --csv --print-source sass > $L/sass-csa.csv 2>/dev/null
timeout 60 ncu -i $P/csa.ncu-rep --page details > $L/details-csa.txt 2>&1
grep -E "attention_prefill_ws|Duration|Grid Size|Issued Warp|Eligible Warps|No Eligible" $L/details-csa.txt | head -8 | cut -c1-150
stamp done
