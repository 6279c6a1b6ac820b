#!/usr/bin/env bash
# Session 26, call 4: hc_pre_finish's norm weights staged before its PDL wait (pack s26d) against the base (650fe6a,
# pack s26; the act_quant and all-short-kernel signal-first changes are reverted in s26d). Carry [".plans"].
#   1. the mHC op tests (bf16 and f32 norm weights, batch invariance) and the graph / greedy model tests;
#   2. tern_gpu_bench --only mhc, base and new (the new binary adds a row with one Sinkhorn iteration: what the 20
#      iterations' serial chain costs a call);
#   3. bench-step base / new alternating, three rounds, batch 1 / 16 / 64.
# Predicted: hc_pre + rms_norm -0.5 to -1 us a call at T = 1 in the graph chain; bench-step batch 1 -0.3 to -0.8%,
# 16 and 64 within noise.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s26d.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s26.tar.xz build-base
L=$OUT/logs; mkdir -p $L
stamp "1. tests (new)"
timeout 100 $G/tern_gpu_tests --gtest_filter='*GpuV4.Mhc*:*GpuLibrary.MhcAgainstCpu*:*GpuPdl*' > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 8
timeout 200 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*BatchInvariance*:*Greedy*' > $L/model.log 2>&1
echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. tern_gpu_bench --only mhc, base and new"
for b in base cuda; do
  timeout 60 build-$b/tests/gpu/tern_gpu_bench --only mhc > $L/mhc-$b.log 2>&1; echo "rc $? ($b)"
  grep -E "hc_pre|hc_post" $L/mhc-$b.log | sed -E 's/ +/ /g' | cut -c1-130 | head -14
done
stamp "3. bench-step base / new, three rounds"
for r in 1 2 3; do
  for b in base cuda; do
    timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
      --steps 12 --warmup 3 > $L/bs-$r-$b.log 2>&1; echo "rc $? ($r $b)"
    grep -hE "^decode |error" $L/bs-$r-$b.log | cut -c1-110
  done
done
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
