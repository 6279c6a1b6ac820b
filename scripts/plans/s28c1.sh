#!/usr/bin/env bash
# Session 28, call 1 (pack s28a = 254d256: session 27's code + the bulk MoE timeline instrument; carry [".plans"]).
#   1. the tests session 27's review fixes never ran on a GPU: routing / MoE op tests (GpuV4.MoeRoutingInThePlanKernel
#      over 256 experts and 3 tokens), linear / exact / PDL op tests; the graph / greedy / batch invariance / step
#      table model tests;
#   2. tern_gpu_bench --only moe_timeline: the bulk kernels' block timelines at 1 / 4 / 16 tokens, cold, and one cold
#      read of the same bytes by the read probes (the ceiling of one kernel that size);
#   3. bench-step at 1 / 16 / 64 (where the code stands on this card);
#   4. the batch-1 timeline and profile (trace_b1).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s28a.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuV4.Routing*:*GpuV4.Moe*:*ActFp8*Moe*:*GpuBasic.Linear*:*GpuExactTc*:*GpuPdl*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 10; grep -c "^\[       OK" $L/ops.log
timeout 120 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. moe_timeline"
timeout 120 $G/tern_gpu_bench --only moe_timeline > $L/timeline.log 2>&1; echo "rc $?"
grep -vE "^\s*$" $L/timeline.log | tail -22
stamp "3. bench-step"
timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 \
  --warmup 3 > $L/bs.log 2>&1; echo "rc $?"
grep -hE "^(decode|copy) |error|GB/s" $L/bs.log | cut -c1-150 | head -8
stamp "4. trace at batch 1"
trace_b1 trace
grep -A30 "exposed" $L/trace.log | head -40
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
