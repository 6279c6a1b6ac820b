#!/usr/bin/env bash
# Session 25's fifth call (pack s25d = 203e4e8; base s24 = ce72b33). New since s25c4: moe_front_kernel (the scored
# routing, x's fake quantisation and the MoE plan in one launch at up to 32 tokens, TERN_MOE_FRONT; predicted -1.5
# to -2.5% at batch 1, -0.5% at 16, nothing at 64) and issue #17 part (b) (the step graphs through the context, no
# arena hook in the device memory: the graphs' capture path, first GPU run).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s25d.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/s24.tar.xz build-base
echo "base commit $(cat build-base/commit.txt)"
L=$OUT/logs; mkdir -p $L
stamp "0. the front kernel's test"
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuMoeFront*:*GpuV4.Routing*:*GpuV4.MoeExperts*' > $L/ops-front.log 2>&1
echo "rc $?"; pf $L/ops-front.log 12; grep -c "^\[       OK" $L/ops-front.log
stamp "1. bench-step base / new / base / new at 1 / 16 / 64 (A/B: TERN_MOE_FRONT=0)"
n=0
for b in base cuda base cuda; do
  n=$((n + 1))
  ab=""; [[ $n == 2 ]] && ab="--ab TERN_MOE_FRONT=0 --ab-rounds 3"
  timeout 150 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $L/bs-$n-$b.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |error" $L/bs-$n-$b.log | cut -c1-150 | head -14
done
stamp "2. every model test (graphs, batch invariance, fixtures, MTP: part b's capture path)"
timeout 150 $G/tern_gpu_model_tests > $L/model-tests.log 2>&1; echo "rc $?"; pf $L/model-tests.log 16
stamp "3. every op test (time-capped)"
left=$(( 520 - ($(date +%s) - T0) )); (( left < 30 )) && left=30
timeout $left $G/tern_gpu_tests > $L/ops-all.log 2>&1; echo "rc $? (limit $left s)"; pf $L/ops-all.log 20
grep -c "^\[       OK" $L/ops-all.log; grep "^\[ RUN" $L/ops-all.log | tail -1
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
