#!/usr/bin/env bash
# Not run in session 26 (no device time left): the indexer's head weights on the early fork (b873142, reverted in
# 8c20675: git cherry-pick b873142, build, pack .plans/packs/s26j.tar.xz; s26j there already holds b873142's binaries)
# against s26i (aafbd42). Carry
# [".plans"]. Predicted: batch 1 -0.5 to -1% (one ~3 us product less after cq on the CSA branch), 16 / 64 noise.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26j.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26i.tar.xz build-base
L=$OUT/logs; mkdir -p $L
timeout 100 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
ab_bench 3 1,16
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
