#!/usr/bin/env bash
# Session 29, call 3 (packs s29a = 2acba52, the base, and s29b = the session's last code: linear_x8's scale tables
# sized by the block's K range (wo_b at 64 tokens: two blocks an SM where it ran one), the split adder's float4 form
# from 16 tokens (finish_split_k<4>: 4 rounds of loads at 64 tokens where it took 16), tern_gpu_bench's act_quant
# rows on the capture stream; carry [".plans"]). Logs straight to $OUT.
#   1. tests on s29b: every act-fp8 / linear op test but the MoE's (bits and the CPU reference at fixture and
#      V4-Flash shapes, batch invariance, the cluster and workspace splits), GpuBasic.Linear*; the model tests
#      (graphs, greedy, batch invariance, step tables; with MODEL_FILTER the helper's branch's list);
#   2. the dense products alone on s29b (--only linear: T = 1 .. 256; predicted wo_b at 64 tokens 34.8 -> ~20 us,
#      the split products at 64 tokens -1 to -3 us from the adder, nothing at 1);
#   3. bench-step base / new, two rounds at batch 1, 16, 64 (predicted: 1 and 16 unchanged, 64 -1.5 to -2.5%);
#   4. in-process on s29b: TERN_X8_QUANT_MAX_N=16 at batch 16 (session 22: +3.05%; every product at 16 tokens pays an
#      act_quant launch);
#   5. the batch-16 profile on s29b (exposed times by kernel: where batch 16's step goes after the MoE).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=.plans/packs/s29b.tar.xz
source scripts/plans/env.sh
unpack .plans/packs/s29a.tar.xz build-base
L=$OUT
stamp "1. tests"
timeout 120 $G/tern_gpu_tests --gtest_filter='*GpuActFp8Linear*-*Moe*:*GpuActFp8.*:*GpuBasic.Linear*' > $L/ops.log 2>&1
echo "rc $?"; pf $L/ops.log 12; grep -c "^\[       OK" $L/ops.log
timeout 130 $G/tern_gpu_model_tests --gtest_filter="${MODEL_FILTER:-*GpuGraphs_.ReplayEqualsEager*:*Greedy*:*BatchInvariance*:*StepTables*}" \
  > $L/model.log 2>&1; echo "rc $?"; pf $L/model.log 6; grep -c "^\[       OK" $L/model.log
stamp "2. dense products"
timeout 120 $G/tern_gpu_bench --only linear > $L/linear.log 2>&1; echo "rc $?"
grep -E "act-fp8 x8" $L/linear.log | grep -E "T=(1|16|64) " | cut -c1-150
stamp "3. base / new"
ab_bench 2 1,16,64
stamp "4. x8 quantising at 16"
timeout 70 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 16 --steps 12 --warmup 3 \
  --ab TERN_X8_QUANT_MAX_N=16 --ab-rounds 2 > $L/ab16.log 2>&1; echo "rc $?"
grep -hE "^(decode|ab) |error" $L/ab16.log | grep -v prefill | cut -c1-160
stamp "5. batch-16 profile"
timeout 80 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 16 --steps 6 --warmup 3 \
  --profile --profile-batches 16 --profile-top 30 > $L/b16-profile.log 2>&1; echo "rc $?"
grep -E "^\| (attention|indexer|compressor|moe experts|dense gemm|mhc|other|total) " $L/b16-profile.log | head -12
stamp done
