#!/usr/bin/env bash
# Session 26, call 5: post and comb apart from hc_pre, hc_comb on a side branch (pack s26e) against the base
# (650fe6a, pack s26). Carry [".plans"].
#   1. the mHC op tests (the apart form's bits against the one op) and every model test (graphs equal eager,
#      batch invariance, greedy, speculative with graphs);
#   2. bench-step base / new alternating, three rounds, batch 1 / 16 / 64 and prefill 1K;
#   3. the path at batch 1 on the new binary (side stream off: hc_pre_finish's exposed time; on: the step).
# Predicted: batch 1 -1 to -1.7% (86 x 1.7 us of the Sinkhorn off the path, less the fork's cost), batch 16 -0.3 to
# -0.7%, 64 within noise; prefill 1K within noise (one more short launch a sub-layer, eager).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26e.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuV4.Mhc*:*GpuLibrary.MhcAgainstCpu*:*GpuPdl*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 8
timeout 240 $G/tern_gpu_model_tests > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step base / new, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^(decode|prefill) |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
stamp "3. the path at batch 1 (new)"
for side in 0 1; do
  TERN_SIDE_STREAM=$side timeout 60 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1 \
    --steps 10 --warmup 3 --profile --profile-batches 1 --profile-top 40 > $L/path-side$side.log 2>&1; echo "rc $? (side $side)"
  grep -A14 "profile at batch 1," $L/path-side$side.log | grep -E "^\| (mhc|total) " | cut -c1-140
  grep -A60 "profile at batch 1," $L/path-side$side.log | grep -A45 "by exposed time" | grep -E "hc_" | cut -c1-170
  grep -hE "^decode " $L/path-side$side.log | cut -c1-110
done
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
