#!/usr/bin/env bash
# Session 27, call 3. Packs: s27d (base: call 2's new) and s27f (new: the router gate's weights, linear_exact_rows_kernel,
# and the routing's bias loaded before the PDL wait; call 2's trace: the gate took 8 us for 2 MB at batch 1 beside the
# shared expert's product, and the prep kernel ended only after that product; and the decode attention's keys a split
# as a knob, TERN_ATTENTION_SPLIT_KEYS, default 128 as before: at batch 1 an SWA layer's attention is 4 blocks of two
# tiles each, 25 us in call 2's trace). Carry [".plans"].
#   1. tests on new: GpuBasic.Linear* / ExactOnTensorCores (the exact rows kernel), routing and MoE, GpuExactTc, PDL;
#      GpuAttention.* at split keys 128, 64 and 32; the graph / greedy / batch-invariance / step-table model tests at
#      128 and 64;
#   2. bench-step base / new, three rounds at 1 / 16 / 64 (predicted -1 to -2% at batch 1 from the gate's ~5 us a
#      layer; less at 16, noise at 64);
#   3. in-process A/B on new: TERN_ATTENTION_SPLIT_KEYS=64 and =32 (predicted -3 to -6% at batch 1: ~10 us a layer of
#      the attention's 25; +-1% at 16 / 64);
#   4. the batch-1 timeline on new.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27f.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s27d.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Linear*:*GpuBasic.ExactOnTensorCores*:*GpuV4.Routing*:*GpuV4.MoeRouting*:*GpuExactTc*:*GpuPdl*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 10; grep -c "^\[       OK" $L/ops.log
for sk in 128 64 32; do
  TERN_ATTENTION_SPLIT_KEYS=$sk timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuAttention*' > $L/att-$sk.log 2>&1
  echo "rc $? (attention, split keys $sk)"; pf $L/att-$sk.log 6; grep -c "^\[       OK" $L/att-$sk.log
done
for sk in 128 64; do
  TERN_ATTENTION_SPLIT_KEYS=$sk timeout 120 $G/tern_gpu_model_tests \
    --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' > $L/model-$sk.log 2>&1
  echo "rc $? (model, split keys $sk)"; pf $L/model-$sk.log 6; grep -c "^\[       OK" $L/model-$sk.log
done
stamp "2. bench-step base / new"
ab_bench 3 1,16,64
stamp "3. in-process A/B on new"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_ATTENTION_SPLIT_KEYS=64 --ab TERN_ATTENTION_SPLIT_KEYS=32 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | cut -c1-150
stamp "4. trace at batch 1 (new)"
trace_b1 trace-new
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
