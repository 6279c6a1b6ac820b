#!/usr/bin/env bash
# Session 28, call 2 (pack s28b: the bulk MoE timeline instrument + the resident windows and claimed items,
# TERN_MOE_RESIDENT / TERN_MOE_CLAIMS, on by default; carry [".plans"]).
#   1. tests: the MoE / routing op tests (GpuActFp8Linear.MoeResidentWindowsBitIdentical: resident windows and claims
#      give the fixed ranges' bits at 1-4 tokens, bf16 and FP8 activations; GpuV4.MoeVariantsBitIdentical: variant 0,
#      resident at one token, against the others), session 27's unrun review fixes (routing over 256 experts, linear,
#      exact, PDL), and the graph / greedy / batch invariance / step table model tests;
#   2. tern_gpu_bench --only moe_timeline: block timelines, resident and fixed ranges at 1 and 4 tokens, 16 tokens;
#      one cold read of the same bytes by the read probes;
#   3. bench-step 1 / 16 / 64, in-process A/B, two rounds: TERN_MOE_RESIDENT=0 and TERN_MOE_CLAIMS=0 against the
#      new defaults (predicted: the defaults 3-5% faster at batch 1, nothing at 16 / 64 (past 4 tokens the same code)).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s28b.tar.xz
source scripts/plans/env.sh
L=$OUT/logs; mkdir -p $L
stamp "1. tests"
timeout 170 $G/tern_gpu_tests --gtest_filter='*GpuV4.Routing*:*GpuV4.Moe*:*ActFp8*Moe*:*GpuBasic.Linear*:*GpuExactTc*:*GpuPdl*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 120 $G/tern_gpu_model_tests --gtest_filter='*GpuGraphs_*:*Greedy*:*BatchInvariance*:*MixedSteps*:*StepTables*' \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. moe_timeline"
timeout 100 $G/tern_gpu_bench --only moe_timeline > $L/timeline.log 2>&1; echo "rc $?"
grep -vE "^\s*$" $L/timeline.log | tail -24
stamp "3. bench-step A/B"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 \
  --warmup 3 --ab TERN_MOE_RESIDENT=0 --ab TERN_MOE_CLAIMS=0 --ab-rounds 2 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab|copy) |error|GB/s" $L/ab.log | cut -c1-160 | head -20
tar -C $OUT -czf $OUT/logs.tar.gz logs && rm -rf $L
stamp done
