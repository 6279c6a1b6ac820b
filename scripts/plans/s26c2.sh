#!/usr/bin/env bash
# Session 26, call 2: short kernels signalling before their PDL wait (909f97c, pack s26b) against the session's
# base (650fe6a, pack s26: the same code but the signal after the wait). Carry [".plans"].
#   1. the PDL and graph tests on the new binary (graphs bit-identical to eager, batch invariance);
#   2. bench-step base / new alternating, three rounds, batch 1 / 16 / 64 and prefill 1K;
#   3. the path (exposed times, side stream off and on) at batch 1 and 16 on the new binary;
#   4. the 8K prefill's profile (#15: what the 0.82 s is made of).
# Predicted: batch 16 -2 to -5% (258 products a step after act_quant gain 1-3 us of head start each), batch 1
# -1 to -3%, batch 64 -1 to -2%; the same bits.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26b.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. PDL, graph and invariance tests (new)"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuPdl*:*GpuProfiler*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 8
timeout 200 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*BatchInvariance*:*MixedSteps*:*Greedy*' > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. bench-step base / new, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^(decode|prefill) |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
stamp "3. the path on the new binary (side stream off, then on)"
for side in 0 1; do
  TERN_SIDE_STREAM=$side timeout 60 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16 \
    --steps 10 --warmup 3 --profile --profile-batches 1,16 --profile-top 45 > $L/path-side$side.log 2>&1; echo "rc $? (side $side)"
  for bt in 1 16; do
    echo "-- side $side batch $bt"; grep -A14 "profile at batch $bt," $L/path-side$side.log | grep -E "^\| (moe|dense|mhc|total) |GPU busy" | cut -c1-140
  done
done
for bt in 1 16; do echo "-- by exposed, side 0, batch $bt"; grep -A120 "profile at batch $bt," $L/path-side0.log | grep -A22 "by exposed time" | cut -c1-170; done
stamp "4. the 8K prefill's profile (new)"
(( $(date +%s) - T0 < 470 )) && { timeout 100 $T bench-step --device cuda --config full --contexts 1024 --prefill 8192 --batches 1 \
  --steps 3 --warmup 1 --profile --profile-batches 1 --profile-top 30 > $L/prefill8k.log 2>&1; echo "rc $?"
  grep -A60 "profile of the prefill of 8192" $L/prefill8k.log | cut -c1-150 | head -50; }
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
