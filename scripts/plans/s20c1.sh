#!/usr/bin/env bash
# Next session's first call (written in session 19; build the pack from the HEAD first: ninja -C build-cuda,
# scripts/gpu-pack build-cuda, cp build-cuda/gpu-pack.tar.xz .plans/packs/s20.tar.xz; carry [".plans", ".whl"]):
# the mends of 9930483 first (the decode probe's test and rates, GpuSpeculative with graphs), then the model tests and the op tests the changes touch,
# then bench-step at the defaults (H200 regression against session 16: 8.322 / 23.685 / 53.395 ms, 8K 0.815 s) with
# the MTP rounds (long contexts moved to s20c2.sh: the call's 600 s). Ordered by value: a short call still brings the first items back.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s20.tar.xz}
source scripts/plans/env.sh
stamp "decode probe: test, then rates"
timeout 30 $G/tern_gpu_tests --gtest_filter='*DecodeProbe*' > $OUT/probe-test.log 2>&1; echo "rc $?"
grep -E "OK \]|FAILED|Failure|Expected|Which is|natural|moved" $OUT/probe-test.log | head -12
timeout 60 $G/tern_gpu_bench --only decode_probe > $OUT/bench-decode-probe.log 2>&1; echo "rc $?"
grep -E "copy|^\|" $OUT/bench-decode-probe.log | head -24
stamp "model tests (whole): GpuSpeculative with graphs after the arena mends"
timeout 150 $G/tern_gpu_model_tests > $OUT/model-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|exception|too small" $OUT/model-tests.log | head -20
stamp "op tests the session-19 changes touch (the MoE paths, PDL's kernel-path lines, the decode probe)"
timeout 120 $G/tern_gpu_tests --gtest_filter='*MoeExperts*:*MoeGrouped*:*ActFp8Linear*:*GpuPdl*:*DecodeProbe*' \
  > $OUT/op-tests.log 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/op-tests.log | head -20
stamp "bench-step defaults 1,16,64 @1024,8192 + prefill 1K/8K, speculative 3"
timeout 200 $T bench-step --device cuda --config full --batches 1,16,64,128 --contexts 1024 --prefill 1024,8192 \
  --speculative 3 --json $OUT/bs.json > $OUT/bs.log 2>&1; echo "rc $?"
grep -E "arena|^(decode|verify|round|prefill) " $OUT/bs.log | head -24
stamp done
