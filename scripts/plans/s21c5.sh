#!/usr/bin/env bash
# Session 21, last device minutes: the bulk MoE ring past 64 tokens (kMoeBulkMaxTokens 256; the grouped kernels stay
# the default from 65, so TERN_MOE_GROUPED_MIN_TOKENS=257 sends 65-256 to the bulk kernels). Predicted from the ncu
# of call 8 (grouped at 46% DRAM, latency-bound) and the bulk ring's 88% at 64: at batch 128 (~3 pairs an expert,
# ~1.3 jobs of 4) the MoE -250 to -380 us a layer (-10 to -16 ms a step), at 256 (~6 pairs, ~2 jobs of 4) less,
# maybe nothing with jobs of 4; variant 1 (jobs of 8, 16 warps) may do better there. Ordered by value (short budget).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s21c.tar.xz}
source scripts/plans/env.sh
for run in "65 0" "257 0" "257 1"; do
  set -- $run
  TERN_MOE_GROUPED_MIN_TOKENS=$1 TERN_MOE_VARIANT=$2 timeout 40 $T bench-step --device cuda --config full \
    --batches 128,256 --contexts 1024 --prefill 1024 --steps 5 --warmup 2 > $OUT/bulk-$1-$2.log 2>&1
  echo "rc $? (grouped from $1, variant $2)"; grep -E "^decode " $OUT/bulk-$1-$2.log | cut -d'|' -f2-5
done
timeout 40 $G/tern_gpu_tests --gtest_filter='Shapes/GpuV4.MoeExperts/fixture:Shapes/GpuV4.MoeVariantsBitIdentical/fixture' > $OUT/moe-tests.log 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/moe-tests.log
stamp done
