#!/usr/bin/env bash
# Session 31, call 2: pack s31b = cd1c701 (the prefill attention's epilogue rotating only warpgroup 1's last chunk,
# one sincosf a pair of dims; call 1 found session 30's epilogue at 5.10 against 3.48 ms a layer at 8K, H100) against
# s29c = 34ba730 (base); carry [".plans"].
#   1. tests: the prefill attention (the epilogue's FP8 bytes and scales against the f32 op + rope + act_quant) and
#      wo_a from FP8 rows; the model tests;
#   2. prefill base / new, two rounds at 1K and 8K (predicted at 8K on the H100: 0.826 -> ~0.80 s: act_quant -23,
#      rope -5.5 ms, the attention kernel ~3.5-3.6 ms a layer: ~+1 us of epilogue a block);
#   3. the new 8K prefill's profile.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s31b.tar.xz
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
