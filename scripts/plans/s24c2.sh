#!/usr/bin/env bash
# Session 24's second call (s24c1 ran on an H200: the in-lane Sinkhorn was ~17 us slower a call, reverted in ca1b3ad;
# the cluster split stored its partials to the absent workspace, mended). Packs: base-5d0ac2d (session 23's code) and
# s24 (the HEAD); carry [".plans"].
#   0. the split-K products' tests (the cluster's bits against the workspace's first), mHC, PDL, graphs;
#   1. the dense products alone: base, new, new with TERN_X8_CLUSTER=1;
#   2. bench-step base / new / base / new at 1 / 16 / 64; the first new run with the A/B arms TERN_X8_CLUSTER=1 (predicted
#      -1 to -1.5 us a split product: -3 to -5% at batch 1), the MoE staged quantisation and early down;
#   3. the model tests with TERN_X8_CLUSTER=1 (batch invariance, step tables, greedy decode);
#   4. the kernels' own times at batches 1 and 16 on this card (PDL and side stream off).
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s24.tar.xz}
source scripts/plans/env.sh
unpack .plans/packs/base-5d0ac2d.tar.xz build-base
echo "base commit $(cat build-base/commit.txt)"
stamp "0. the cluster split's bits against the workspace's"
timeout 60 $G/tern_gpu_tests --gtest_filter='*GpuActFp8Linear.ClusterSplit*' > $OUT/ops-cluster.log 2>&1; crc=$?
echo "rc $crc"; pf $OUT/ops-cluster.log 8
carm="--ab TERN_X8_CLUSTER=1"; [[ $crc == 0 ]] || carm=""  # a failing cluster would end the process
stamp "2. bench-step base / new / base / new"
n=0
for b in base cuda base cuda; do
  n=$((n + 1)); (( $(date +%s) - T0 > 430 )) && { echo "skipped: time"; break; }
  ab=""; [[ $n == 2 ]] && ab="$carm --ab TERN_X8_QUANT_MAX_N=16 --ab TERN_MOE_STAGE_QUANT=1 --ab TERN_MOE_EARLY_DOWN=1 --ab-rounds 2"
  timeout 150 build-$b/tools/tern bench-step --device cuda --config full --contexts 1024 --prefill 1024 --batches 1,16,64 \
    --steps 12 --warmup 3 $ab > $OUT/bs-$n-$b.log 2>&1; echo "rc $? ($b)"
  grep -hE "^(decode|prefill|ab) |error" $OUT/bs-$n-$b.log | cut -c1-150 | head -18
done
stamp "2b. split-K products' tests"
timeout 150 $G/tern_gpu_tests --gtest_filter='*GpuBasic.Linear*:*GpuBasic.GroupedLinear*:*GpuBasic.StackedLinear*:*GpuBasic.ExactOnTensorCores*:*GpuActFp8Linear.*:GpuPdl.*:*GpuGraphs*:*GpuV4.Mhc*:GpuExactTc.*' \
  > $OUT/ops0.log 2>&1; echo "rc $?"; pf $OUT/ops0.log 20; grep -c "^\[       OK" $OUT/ops0.log
stamp "1. dense products: base, new, new + cluster"
# quant16: tiles of 16 quantise x themselves (TERN_X8_QUANT_MAX_N=16, the same bits): which products gain at 16 tokens
for b in base cuda $([[ $crc == 0 ]] && echo cluster) quant16; do
  d=cuda; [[ $b == base ]] && d=base
  TERN_X8_CLUSTER=$([[ $b == cluster ]] && echo 1 || echo 0) TERN_X8_QUANT_MAX_N=$([[ $b == quant16 ]] && echo 16 || echo 8) \
    timeout 60 build-$d/tests/gpu/tern_gpu_bench --only linear > $OUT/linear-$b.log 2>&1; echo "rc $? ($b)"
  grep -E "act-fp8 x8.*T=(1|16|64) " $OUT/linear-$b.log | sed -E 's/ +/ /g' | cut -c1-130 | head -30
done
stamp "3. model tests with the cluster split"
(( $(date +%s) - T0 < 470 )) && [[ $crc == 0 ]] && { TERN_X8_CLUSTER=1 timeout 100 $G/tern_gpu_model_tests \
  --gtest_filter='*BatchInvariance*:*StepTables*:*MixedSteps*:*GreedyDecode*' > $OUT/model-tests.log 2>&1; echo "rc $?";
  pf $OUT/model-tests.log; }
stamp "4. kernels' own times at batches 1 and 16 (PDL and side stream off)"
for bt in 1 16; do
  (( $(date +%s) - T0 > 500 )) && { echo "skipped: time"; break; }
  TERN_PDL=0 TERN_SIDE_STREAM=0 timeout 60 $T bench-step --device cuda --config full --contexts 1024 --prefill 1024 \
    --batches $bt --steps 10 --warmup 3 --profile --profile-batches $bt --profile-top 40 > $OUT/profile-b$bt.log 2>&1
  echo "rc $?"; grep -A45 "profile at batch $bt," $OUT/profile-b$bt.log | cut -c1-150 | head -47
done
stamp "5. H200: the FP4 decode probe (the e4m3 MoE decode question, docs/cuda-backend.md) and the MoE kernels at 1 / 16"
if (( $(date +%s) - T0 < 520 )); then
  timeout 45 $G/tern_gpu_bench --only decode_probe > $OUT/decode-probe.log 2>&1; echo "rc $?"; grep "^|" $OUT/decode-probe.log | head -12
  timeout 30 $G/tern_gpu_bench --only moe --quick > $OUT/moe.log 2>&1; echo "rc $?"; grep -E "T=(1|16) " $OUT/moe.log | sed -E 's/ +/ /g' | cut -c1-140 | head -12
fi
stamp done
