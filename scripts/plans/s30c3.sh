#!/usr/bin/env bash
# Session 30, call 3 (packs s29c = 34ba730, the base; s30c = eb07d55: the prefill chunk's attention output rotated
# back and quantised for wo_a in the wgmma prefill kernels' epilogue (ops::Fp8Rows; wo_a's product straight from
# those rows on cuBLASLt: act_quant's pass over 1 GiB of f32 heads a layer at 8K and the rope pass gone), and
# TERN_BRANCH_PRIORITY as one switch; s30d = s30c + the q norm folded into the prefill kernels' q load again, its
# sines and cosines once a query (call 1's fold took them a head: +3%); carry [".plans"]; call 2's plan, never
# started, folded in). Logs to $OUT. (Call 4 on the warm machine: scripts/gpu-check --model-only --server --no-bench
# --no-sanitizers.)
#   1. tests on s30d: the prefill attention (the FP8 rows against the f32 op + rope + act_quant, bytes and scales,
#      versions 1-3 and a short chunk; the CPU), wo_a from FP8 rows (bits of grouped_linear, library and own kernels,
#      padding rows), the MoE routing in the plan kernel; the model tests (greedy against PyTorch, batch invariance,
#      graphs with the priorities on);
#   2. prefill base / s30d, two rounds at 1K and 8K (predicted at 8K, of ~795 ms on an H200: -20 to -28 ms from the
#      FP8 heads (act_quant on wo_a's x ~22, the rope pass ~3, the f32 heads' writes; the epilogue ~1 us a block) and
#      -20 to -28 from the fold (norm_rope's ~31 ms pass less ~1-2 us a block of q load)); the pack s30c did not fit
#      the carry, so the two are told apart by the profiles of step 4 (base and s30d);
#   3. in-process on s30d at batch 1, 16, 64, three rounds: TERN_BRANCH_PRIORITY=1 (predicted: 16 -1% as in call 1,
#      1 at nothing now that the shared expert keeps the main lane's priority);
#   4. the 8K prefill's profile on s30d (act_quant's calls, the attention kernel a layer);
#   (ncu on the 1K prefill's grouped MoE kernels dropped: the session's device time ran short after refused starts.)
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s30d.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s29c.tar.xz build-base
L=$OUT
P=$(mktemp -d)  # the logs not worth fetching (the device tool fetches ~8 files)
stamp "1. tests"
timeout 200 $G/tern_gpu_tests --gtest_filter='*GpuAttentionPrefill*:*GpuBasic.NormRope*:*GroupedFromFp8Rows*:*GroupedAgainstCpu*:*MoeRoutingInThePlanKernel*' \
  > $L/ops.log 2>&1; echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
grep -E "FP8 rows vs cpu|from FP8 rows" $L/ops.log | head -8
timeout 150 $G/tern_gpu_model_tests --gtest_filter='*GpuModel_.*:*GpuGraphs_.*:*GpuSpeculative.*:-*Speed*' \
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
stamp "3. priorities in-process"
timeout 200 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 \
  --ab TERN_BRANCH_PRIORITY=1 --ab-rounds 3 > $L/ab.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab.log | grep -v prefill | cut -c1-170
stamp "4. 8K prefill profiles (base, s30d)"
for b in base cuda; do
  timeout 120 build-$b/tools/tern bench-step --device cuda --config full --batches 1 --contexts 1024 --prefill 8192 --profile \
    --profile-top 40 > $L/pf8k-profile-$b.log 2>&1; echo "rc $? ($b)"
  grep -E "^prefill \||attention_prefill|act_quant|act_dequant|rope_kernel|norm_rope" $L/pf8k-profile-$b.log | sort -u | head -12 | cut -c1-150
done
stamp done
