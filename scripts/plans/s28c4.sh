#!/usr/bin/env bash
# Session 28, call 4 (pack s28e = 0d04a42: resident windows at one token only, the layouts test (MoeLayoutsBitIdentical) and
# claimed runs (TERN_MOE_CLAIM_RUNS, off); carry [".plans"]). Logs straight to $OUT.
#   1. tests: the layouts test (resident / claims / claimed runs against fixed ranges, bits, at 1-4, 16, 64 tokens),
#      the act-fp8 MoE tests, GpuV4.Moe*, the graph / greedy / batch invariance / mixed / step-table model tests;
#   2. in-process A/B, three rounds at batch 1 and 16: TERN_MOE_RESIDENT=0 and TERN_MOE_EARLY_DOWN=1 (call 3: +0.65% and
#      -0.38% at batch 1), TERN_MOE_CLAIM_RUNS=1 (predicted -2 to -4% at 16: the up kernel's 15 us tail of ~280 us and
#      the down kernel's 6.6, each layer; nothing at 1);
#   3. the timeline with claimed runs at 16 tokens.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s28e.tar.xz
source scripts/plans/env.sh
L=$OUT
stamp "1. tests"
timeout 110 $G/tern_gpu_tests --gtest_filter='*MoeLayouts*:*GpuActFp8Linear.Moe*:*GpuV4.Moe*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 100 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_.ReplayEqualsEager*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. A/B"
timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 --steps 12 --warmup 3 \
  --ab TERN_MOE_RESIDENT=0 --ab TERN_MOE_EARLY_DOWN=1 --ab TERN_MOE_CLAIM_RUNS=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-160
stamp "3. timeline, claimed runs"
TERN_MOE_CLAIM_RUNS=1 timeout 40 $G/tern_gpu_bench --only moe_timeline > $L/timeline-runs.log 2>&1; echo "rc $?"
grep -E "^\| (up|down)|path" $L/timeline-runs.log
stamp done
