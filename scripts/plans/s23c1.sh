#!/usr/bin/env bash
# Session 23's first call. Build the pack from the HEAD first: ninja -C build-cuda, scripts/gpu-pack build-cuda,
# cp build-cuda/gpu-pack.tar.xz .plans/packs/s23.tar.xz; carry [".plans", ".whl"].
#   0. the three GPU tests session 22 mended without a GPU (GpuModel_.BatchInvariance, GpuActFp8Linear.BatchInvariant
#      and MoeAgainstCpu under the new defaults), and the tests of this session's changes: the scored routing's
#      register kernel (GpuV4.Routing: both kernels at 1 / 37 / 64 tokens, ties), moe_plan counting only the warps
#      that hold picks (the MoE op tests, the PDL chain, graphs);
#   1. A/B in one process at batches 1 / 16 / 64: TERN_ROUTE_REGS=0 (route_scored_kernel; predicted +4 to +6 us a
#      layer at batch 1, i.e. the register kernel -2 to -3% of a step); the L2 prefetches (Model::L2Prefetch) against
#      none: wo_a after wq_b (1), the next layer's wq_a|wkv and wq_b after the MoE (4), all (7). TERN_FUSED_ROPE=0:
#      the attention output's inverse RoPE as a rope op, not in the decode attention's merge (predicted +1.5 to +3 us a
#      layer at batch 1).
#      Predicted at batch 1: a 32 MB product from L2 ~6-9 us instead of ~15.7: 1 -> -0.3 ms, 7 -> -0.6 to -0.9 ms
#      (if L2 keeps 64 MB of the 50: less for 3); less than half that share at 16 / 64. TERN_HC_EARLY_FN=0: hc_mix
#      stages its fn columns after its PDL wait, not before (predicted +1 to +1.5 us a call at batch 1, 85 calls).
#      TERN_TOPK_FAST=0: the indexer's top-k without the short ways (at 1K context every key is taken: no radix
#      select; sorts in registers): predicted +4 to +8 us a call, 21 calls at batch 1.
#   (PART=b, its own call:)
#   2. the dense products alone at 1 / 16 / 64 tokens (--only linear) and batch 16's kernels at their own durations
#      (PDL and side stream off): the next item's size at batch 16.
set -u
cd "$(dirname "$0")/../.."
export TERN_PACK=${TERN_PACK:-.plans/packs/s23.tar.xz}
source scripts/plans/env.sh
BS="$T bench-step --device cuda --config full --contexts 1024"
pf() { grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$1" | head -${2:-10}; }
if [[ ${PART:-a} == a ]]; then
stamp "0. model tests; mended op tests; routing, MoE, PDL, graph tests"
timeout 100 $G/tern_gpu_model_tests --gtest_filter='*BatchInvariance*:*L2Prefetch*:*StepTables*:*MixedSteps*:*GreedyDecode*' > $OUT/model-tests.log 2>&1; echo "rc $?"; pf $OUT/model-tests.log
timeout 120 $G/tern_gpu_tests --gtest_filter='Shapes/GpuActFp8Linear.BatchInvariant/*:Shapes/GpuActFp8Linear.MoeAgainstCpu/*:Shapes/GpuV4.Routing/*:Shapes/GpuV4.Mhc/*:GpuErrors.*:GpuStepOps.IndexerTopk:Shapes/GpuV4.Indexer/*:Shapes/GpuV4.MoeExperts/*:Shapes/GpuV4.MoeVariantsBitIdentical/*:Shapes/GpuV4.MoeSharedAddedInTheCombine/*:GpuPdl.*:*GpuGraphs*' > $OUT/op-tests.log 2>&1
echo "rc $?"; pf $OUT/op-tests.log 16
stamp "1. A/B: route_scored_kernel (B1), the L2 prefetches 1 / 4 / 7 (B2-B4), the inverse RoPE as an op (B5), hc_mix's fn after its wait (B6), the indexer top-k without its short ways (B7), against A"
timeout 180 $BS --prefill 1024 --batches 1,16,64 --steps 12 --warmup 3 --ab TERN_ROUTE_REGS=0 --ab TERN_L2_PREFETCH=1 \
  --ab TERN_L2_PREFETCH=4 --ab TERN_L2_PREFETCH=7 --ab TERN_FUSED_ROPE=0 --ab TERN_HC_EARLY_FN=0 --ab TERN_TOPK_FAST=0 --ab-rounds 2 > $OUT/ab-route.log 2>&1
echo "rc $?"; grep -E "^(decode|ab) |^A/B|error|\|" $OUT/ab-route.log | cut -c1-200 | head -30
fi
if [[ ${PART:-a} == b ]]; then
stamp "2. dense products at 1 / 16 / 64 tokens; batch 16's kernels (PDL, side stream off)"
timeout 45 $G/tern_gpu_bench --only linear > $OUT/linear.log 2>&1; echo "rc $?"
grep -E "T=(1|16|64) " $OUT/linear.log | sed -E 's/ +/ /g' | cut -c1-170 | head -40
for v in 1 0; do
  TERN_TOPK_FAST=$v timeout 30 $G/tern_gpu_bench --only indexer --quick > $OUT/indexer$v.log 2>&1; echo "rc $? (TERN_TOPK_FAST=$v)"
  grep -E "indexer" $OUT/indexer$v.log | sed -E 's/ +/ /g' | cut -c1-160 | head -8
done
TERN_PDL=0 TERN_SIDE_STREAM=0 timeout 50 $BS --prefill 1024 --batches 16 --steps 10 --warmup 3 --profile \
  --profile-batches 16 --profile-top 45 > $OUT/profile-b16.log 2>&1; echo "rc $?"
grep -A70 'profile at batch 16,' $OUT/profile-b16.log | head -72
fi
stamp done
