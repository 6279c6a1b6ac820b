#!/usr/bin/env bash
# Session 25's sixth call (pack s25e = 2bf2da8: linear_x8's two in-kernel x prologues as one, a refactor): the tests
# of both forms' bits, the products' batch invariance, the model tests' greedy and graphs.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s25e.tar.xz}
source scripts/plans/env.sh
stamp "the in-kernel x forms against act_quant / round_bf16 + linear_x8"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Bf16Rounding*:*GpuActFp8Linear.QuantisingKernel*:*GpuBasic.LinearBatchInvariant*:*GpuActFp8Linear.ClusterSplit*' \
  > $OUT/ops.log 2>&1; echo "rc $?"; pf $OUT/ops.log 12; grep -c "^\[       OK" $OUT/ops.log
timeout 60 $G/tern_gpu_model_tests --gtest_filter='*GreedyDecode*:*BatchInvariance*:*ReplayEqualsEager*' > $OUT/model.log 2>&1
echo "rc $?"; pf $OUT/model.log 8
stamp done
