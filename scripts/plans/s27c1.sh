#!/usr/bin/env bash
# Session 27, call 1. Packs: s27 (base, d82a945: session 26's code) and s27c (new: b873142, the indexer's head weights
# on the early fork, re-applied; and the MoE's routing, x quantisation and plan in one launch, moe_prep_kernel,
# TERN_MOE_FUSED_PLAN). Carry [".plans"].
#   1. tests on new: the MoE / routing / act-fp8 / profiler / mHC / PDL op tests, every model test;
#   2. bench-step base / new alternating, three rounds at 1 / 16 / 64 (predicted: -2 to -4% at batch 1 from the two
#      launches a layer less on the MoE's path, ~5 us a layer, and -0.5 to -1% from the head weights; -0.5 to -1.5% at
#      16; noise at 64);
#   3. in-process A/B on new: --ab TERN_MOE_FUSED_PLAN=0 (the fusion alone);
#   4. the batch-1 timeline on new (TERN_PROFILE_TRACE) for scripts/trace-joins.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s27c.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s27.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuV4.Routing*:*GpuV4.Moe*:*ActFp8*Moe*:*GpuProfiler*:*GpuV4.Mhc*:*GpuPdl*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 10; grep -c "^\[       OK" $L/ops.log
timeout 200 $G/tern_gpu_model_tests > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step base / new"
ab_bench 3 1,16,64
stamp "3. in-process A/B on new"
timeout 150 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_MOE_FUSED_PLAN=0 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"; grep -hE "^(decode|ab) |error" $L/ab.log | cut -c1-150
stamp "4. trace at batch 1 (new)"
trace_b1 trace-new
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
