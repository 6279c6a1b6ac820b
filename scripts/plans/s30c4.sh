#!/usr/bin/env bash
# Session 30, call 4 (packs s29c = 34ba730, the base, and s30e: call 3's code with the q-norm fold removed again (it
# cost the attention kernel ~1.66 ms a layer at 8K with its sines once a query too: not the sines); the prefill
# chunk's heads rotated back and quantised for wo_a in the wgmma kernels' epilogue stay; carry [".plans"]).
#   1. tests on s30e: the prefill attention and wo_a from FP8 rows; the model tests;
#   2. prefill base / new, two rounds at 1K and 8K (predicted from call 3's profiles: 8K -25 to -30 ms of ~776:
#      act_quant -21.5, rope -5, the heads' f32 writes; 1K -2 to -4 ms);
#   3. the new 8K prefill's profile (the attention kernel back at ~3.37 ms a layer, act_quant ~14 ms).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s30e.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s29c.tar.xz build-base
L=$OUT
P=$(mktemp -d)
stamp "1. tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*:*GroupedFromFp8Rows*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 8; grep -c "^\[       OK" $L/ops.log
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.ReplayEqualsEager*:-*Speed*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 8; grep -c "^\[       OK" $L/model.log
stamp "2. prefill base / new"
for r in 1 2; do
  for b in base cuda; do
    for p in 1024 8192; do
      timeout 100 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill $p --batches 1 \
        --steps 2 --warmup 1 > $P/pf-$r-$b-$p.log 2>&1; echo "rc $? ($p $r $b)"
      grep -hE "^prefill \||error" $P/pf-$r-$b-$p.log | cut -c1-100
    done
  done
done
stamp "3. 8K prefill profile (new)"
timeout 120 $T bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
  --profile-top 40 > $L/pf8k-profile.log 2>&1; echo "rc $?"
grep -E "^prefill \||attention_prefill|act_quant|act_dequant|rope_kernel|norm_rope" $L/pf8k-profile.log | sort -u | head -12 | cut -c1-150
stamp done
