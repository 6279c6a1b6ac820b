#!/usr/bin/env bash
# Session 19, call 1 (ordered by value, so a short call still brings the first items back): the decode probe's
# test and rates (#14), the MoE grouped tests, the model tests (session 17-18 GPU code first run), MTP rounds at
# 1/16/64 with the arena line (#18), the MoE crossover at kernel level (#14 item 6).
set -u
cd "$(dirname "$0")/../.."
source scripts/plans/env.sh
stamp "op tests: DecodeProbe, MoeGrouped, Sampling"
timeout 60 $G/tern_gpu_tests --gtest_filter='*DecodeProbe*:*MoeGrouped*:*Sampling*' > $OUT/op-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|Failure|Expected|Which is|natural|moved" $OUT/op-tests.log | head -24
stamp "tern_gpu_bench --only decode_probe"
timeout 60 $G/tern_gpu_bench --only decode_probe > $OUT/bench-decode-probe.log 2>&1; echo "rc $?"
grep -E "copy|decode|^\|" $OUT/bench-decode-probe.log | head -24
stamp "model tests (whole)"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|tests ran|Failure|rror" $OUT/model-tests.log | head -30
stamp "bench-step 1,16,64 @1024, speculative 3"
timeout 170 $T bench-step --device cuda --config full --batches 1,16,64 --contexts 1024 --prefill 1024 --speculative 3 \
  --steps 8 --warmup 2 --json $OUT/bs1.json > $OUT/bs1.log 2>&1; echo "rc $?"
grep -E "arena|round|verify|^\|" $OUT/bs1.log | tail -40
stamp "tern_gpu_bench --only moe"
timeout 90 $G/tern_gpu_bench --only moe > $OUT/bench-moe.log 2>&1; echo "rc $?"
grep -E "^\| moe_experts (\(mxfp4\) \| |\(mxfp4\) v0|grouped \(mxfp4)|copy" $OUT/bench-moe.log | head -40
stamp done
