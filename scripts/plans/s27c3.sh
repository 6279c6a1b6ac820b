#!/usr/bin/env bash
# Session 27, call 3. Packs: s27d (base: call 2's new) and s27e (new: the router gate's weights, linear_exact_rows_kernel,
# and the routing's bias loaded before the PDL wait; call 2's trace: the gate took 8 us for 2 MB at batch 1 beside the
# shared expert's product, and the prep kernel ended only after that product). Carry [".plans"].
#   1. tests on new: GpuBasic.Linear* / ExactOnTensorCores (the exact rows kernel), routing and MoE, GpuExactTc, the
#      PDL tests, the graph / greedy / batch invariance / step-table model tests;
#   2. bench-step base / new, three rounds at 1 / 16 / 64 (predicted -1 to -2% at batch 1: the gate's ~5 us a layer;
#      less at 16, noise at 64);
#   3. the batch-1 timeline on new.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27e.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s27d.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Linear*:*GpuBasic.ExactOnTensorCores*:*GpuV4.Routing*:*GpuV4.MoeRouting*:*GpuExactTc*:*GpuPdl*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 10; grep -c "^\[       OK" $L/ops.log
timeout 120 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step base / new"
ab_bench 3 1,16,64
stamp "3. trace at batch 1 (new)"
TERN_PROFILE_TRACE=$OUT/trace-new.tsv timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
  --batches 1 --steps 4 --warmup 3 --profile --profile-batches 1 --profile-top 12 > $L/trace.log 2>&1; echo "rc $?"
gzip $OUT/trace-new.tsv
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
