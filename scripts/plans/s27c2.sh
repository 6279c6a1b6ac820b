#!/usr/bin/env bash
# Session 27, call 2. Packs: s27 (base, d82a945) and s27d (new: b873142 re-applied + the MoE prep kernel now in 256
# threads and only up to 8 tokens; the plan alone in 256 threads at 9-64 tokens; TERN_MOE_STAGE_QUANT_H). Call 1 found
# the 1024-thread prep kernel waiting for the side branch's shared-expert product to free a multiprocessor (+1.1% at
# batch 1). Carry [".plans"].
#   1. tests on new: GpuV4.MoeRoutingInThePlanKernel and the MoE / routing op tests, the graph / greedy / batch
#      invariance / step-table model tests;
#   2. in-process A/B on new at 1 / 16 / 64, three rounds: TERN_MOE_FUSED_PLAN=0 (predicted: the default 2-4% faster at
#      batch 1, 0.5-1% at 16 / 64 from the small plan), TERN_MOE_STAGE_QUANT_H=1 (predicted -0.5 to -1.5% at 1);
#   3. bench-step base / new, two rounds at 1 / 16;
#   4. the batch-1 timeline on new.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27d.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s27.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuV4.Routing*:*GpuV4.Moe*:*ActFp8*Moe*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 10; grep -c "^\[       OK" $L/ops.log
timeout 120 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. in-process A/B on new"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_FUSED_PLAN=0 --ab TERN_MOE_STAGE_QUANT_H=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | cut -c1-150
stamp "3. bench-step base / new"
ab_bench 2 1,16
stamp "4. trace at batch 1 (new)"
trace_b1 trace-new
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
